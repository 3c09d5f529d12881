"""Drives the Ascend backend through the C API against the emulated CANN libraries, in its own process
(the native loader resolves CANN once per process). Prints one JSON object: case name -> result.

Run by tests/test_ascend_emulated.py with ASCEND_TOOLKIT_HOME pointing at the built emulation.
Device memory of the emulation is host memory, so numpy buffers serve as device buffers.
"""

import json
import os
import sys

import cffi
import ml_dtypes
import numpy as np

CDEF = """
typedef int infiniStatus_t;
typedef struct InfiniopHandle *infiniopHandle_t;
typedef struct InfiniopTensorDescriptor *infiniopTensorDescriptor_t;
typedef struct InfiniopDescriptor *D;
infiniStatus_t infinirtGetDeviceCount(int device, int *count);
infiniStatus_t infinirtSetDevice(int device, int device_id);
infiniStatus_t infinirtMalloc(void **p, size_t size);
infiniStatus_t infinirtFree(void *p);
infiniStatus_t infinirtMemcpy(void *dst, const void *src, size_t size, int kind);
infiniStatus_t infinirtMemset(void *p, int value, size_t size);
infiniStatus_t infinirtStreamCreate(void **stream);
infiniStatus_t infinirtStreamSynchronize(void *stream);
infiniStatus_t infinirtStreamDestroy(void *stream);
infiniStatus_t infinirtDeviceSynchronize(void);
infiniStatus_t infiniopCreateHandle(infiniopHandle_t *h);
infiniStatus_t infiniopDestroyHandle(infiniopHandle_t h);
infiniStatus_t infiniopCreateTensorDescriptor(infiniopTensorDescriptor_t *d, size_t ndim, const size_t *shape,
                                              const ptrdiff_t *strides, int dtype);
infiniStatus_t infiniopDestroyTensorDescriptor(infiniopTensorDescriptor_t d);
infiniStatus_t infiniopGetDescriptorDeviceType(D desc, int *device_type);
infiniStatus_t infiniopCreateRMSNormBackwardDescriptor(infiniopHandle_t, D*, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t);
infiniStatus_t infiniopGetRMSNormBackwardWorkspaceSize(D, size_t*);
infiniStatus_t infiniopRMSNormBackward(D, void*, size_t, void*, void*, const void*, const void*, const void*, void*);
infiniStatus_t infiniopDestroyRMSNormBackwardDescriptor(D);
infiniStatus_t infiniopCreateRMSNormBackwardDescriptorEx(infiniopHandle_t, D*, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, double);
infiniStatus_t infiniopCreateLayerNormBackwardDescriptorEx(infiniopHandle_t, D*, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t);
infiniStatus_t infiniopCreateBatchNormBackwardDescriptorEx(infiniopHandle_t, D*, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, double, int);
infiniStatus_t infiniopBatchNormBackwardEx(D, void*, size_t, void*, void*, void*, const void*, const void*,
    const void*, const void*, const void*, const void*, const void*, void*);
infiniStatus_t infiniopCreateLayerNormBackwardDescriptor(infiniopHandle_t, D*, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t);
infiniStatus_t infiniopGetLayerNormBackwardWorkspaceSize(D, size_t*);
infiniStatus_t infiniopLayerNormBackward(D, void*, size_t, void*, void*, void*, const void*, const void*,
    const void*, const void*, void*);
infiniStatus_t infiniopDestroyLayerNormBackwardDescriptor(D);
infiniStatus_t infiniopCreateBatchNormBackwardDescriptor(infiniopHandle_t, D*, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t);
infiniStatus_t infiniopGetBatchNormBackwardWorkspaceSize(D, size_t*);
infiniStatus_t infiniopBatchNormBackward(D, void*, size_t, void*, void*, void*, const void*, const void*,
    const void*, const void*, const void*, void*);
infiniStatus_t infiniopDestroyBatchNormBackwardDescriptor(D);
"""
ASCEND = 3
DTYPES = {"F16": (np.float16, 12), "F32": (np.float32, 13), "BF16": (ml_dtypes.bfloat16, 19)}
TOLERANCE = {"F32": 5e-5, "F16": 2e-3, "BF16": 1.6e-2}

ffi = cffi.FFI()
ffi.cdef(CDEF)


def load(library_dir):
    ffi.dlopen(os.path.join(library_dir, "libinfinirt.so"), ffi.RTLD_GLOBAL)
    return ffi.dlopen(os.path.join(library_dir, "libinfiniop.so"))


def aligned_empty(shape, dtype, misalign=0):
    """A C-contiguous array whose data starts `misalign` bytes past a 64-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + misalign
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def device_copy(values, dtype, misalign=0):
    out = aligned_empty(values.shape, dtype, misalign)
    out[...] = values.astype(dtype)
    return out


def strided(values, dtype, pad):
    """values in a wider buffer: the last dim stays contiguous, each row is followed by `pad` unused elements."""
    wide = aligned_empty(values.shape[:-1] + (values.shape[-1] + pad,), dtype)
    wide[...] = 7  # the padding must never be read as data nor written
    view = wide[..., : values.shape[-1]]
    view[...] = values.astype(dtype)
    return view


def spaced_vector(values, dtype, step):
    base = aligned_empty((values.shape[0] * step,), dtype)
    base[...] = 7
    view = base[::step]
    view[...] = values.astype(dtype)
    return view


class Runner:
    def __init__(self, lib):
        self.lib = lib
        handle = ffi.new("infiniopHandle_t*")
        assert lib.infiniopCreateHandle(handle) == 0
        self.handle = handle[0]

    def descriptor(self, array, code):
        d = ffi.new("infiniopTensorDescriptor_t*")
        strides = [s // array.itemsize for s in array.strides]
        status = self.lib.infiniopCreateTensorDescriptor(d, array.ndim, list(array.shape), strides, code)
        assert status == 0, status
        return d[0]

    def run(self, name, code, outputs, inputs, stream=ffi.NULL, workspace_misalign=0):
        """Status of create (then of the run); the tensor descriptors are destroyed right after create."""
        lib = self.lib
        tensors = [self.descriptor(a, code) for a in outputs + inputs]
        desc = ffi.new("D*")
        status = getattr(lib, f"infiniopCreate{name}BackwardDescriptor")(self.handle, desc, *tensors)
        for t in tensors:
            lib.infiniopDestroyTensorDescriptor(t)
        if status != 0:
            return status
        device_type = ffi.new("int*")
        lib.infiniopGetDescriptorDeviceType(desc[0], device_type)
        assert device_type[0] == ASCEND
        size = ffi.new("size_t*")
        assert getattr(lib, f"infiniopGet{name}BackwardWorkspaceSize")(desc[0], size) == 0
        pointers = [ffi.cast("void*", a.ctypes.data) for a in outputs + inputs]
        too_small = aligned_empty((max(size[0], 1) - 1,), np.uint8)
        if size[0] > 0:
            status = getattr(lib, f"infiniop{name}Backward")(desc[0], ffi.cast("void*", too_small.ctypes.data),
                                                             size[0] - 1, *pointers, stream)
            assert status == 13, f"short workspace gave {status}"
        workspace = aligned_empty((size[0],), np.uint8, workspace_misalign)
        # Twice: a reused (repeatable) executor must give the same answer as a fresh one.
        for _ in range(2):
            status = getattr(lib, f"infiniop{name}Backward")(desc[0], ffi.cast("void*", workspace.ctypes.data),
                                                             size[0], *pointers, stream)
            if status != 0:
                break
        getattr(lib, f"infiniopDestroy{name}BackwardDescriptor")(desc[0])
        return status


def rel_err(got, ref):
    got = np.asarray(got, dtype=np.float64)
    scale = np.abs(ref).max()
    return float(np.abs(got - ref).max() / (scale if scale > 0 else 1.0))


def rms_case(runner, dtype_name, shape, rng, misalign=0, pad=0):
    dt, code = DTYPES[dtype_name]
    gy, x = (rng.standard_normal(shape) for _ in range(2))
    w = rng.standard_normal(shape[-1])
    gy, x, w = (np.asarray(a.astype(dt), np.float64) for a in (gy, x, w))
    r = 1 / np.sqrt(np.mean(x * x, -1, keepdims=True))
    ref_gx = r * gy * w - r ** 3 * x * np.sum(gy * w * x, -1, keepdims=True) / shape[-1]
    ref_gw = np.sum((gy * x * r).reshape(-1, shape[-1]), 0)
    make = (lambda v: strided(v, dt, pad)) if pad else (lambda v: device_copy(v, dt, misalign))
    gx, gyd, xd = make(np.zeros(shape)), make(gy), make(x)
    gw, wd = device_copy(np.zeros(shape[-1]), dt), device_copy(w, dt, misalign)
    status = runner.run("RMSNorm", code, [gx, gw], [gyd, xd, wd])
    if status != 0:
        return {"status": status}
    return {"status": 0, "err": max(rel_err(gx, ref_gx), rel_err(gw, ref_gw))}


def ln_case(runner, dtype_name, shape, rng, pad=0, step=1, misalign=0):
    dt, code = DTYPES[dtype_name]
    go = np.asarray(rng.standard_normal(shape).astype(dt), np.float64)
    x = rng.standard_normal(shape) * 2 + 0.5
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    std = np.asarray(np.sqrt(var + 1e-5).astype(dt), np.float64)
    xhat = np.asarray(((x - mean) / std).astype(dt), np.float64)
    w = np.asarray(rng.standard_normal(shape[-1]).astype(dt), np.float64)
    g = go * w
    ref_gi = (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True)) / std
    ref_gw = (go * xhat).reshape(-1, shape[-1]).sum(0)
    ref_gb = go.reshape(-1, shape[-1]).sum(0)
    rows = (lambda v: strided(v, dt, pad)) if pad else (lambda v: device_copy(v, dt, misalign))
    vec = (lambda v: spaced_vector(v, dt, step)) if step > 1 else (lambda v: device_copy(v, dt, misalign))
    gi, god, xd = rows(np.zeros(shape)), rows(go), rows(xhat)
    gw, gb, wd = vec(np.zeros(shape[-1])), vec(np.zeros(shape[-1])), vec(w)
    stdd = device_copy(std[..., 0], dt, misalign)
    status = runner.run("LayerNorm", code, [gi, gw, gb], [god, wd, xd, stdd])
    if status != 0:
        return {"status": status}
    return {"status": 0, "err": max(rel_err(gi, ref_gi), rel_err(gw, ref_gw), rel_err(gb, ref_gb))}


def bn_case(runner, dtype_name, shape, rng, step=1, misalign=0):
    dt, code = DTYPES[dtype_name]
    x = np.asarray((rng.standard_normal(shape) * 1.5 + 0.3).astype(dt), np.float64)
    go = np.asarray(rng.standard_normal(shape).astype(dt), np.float64)
    w = np.asarray(rng.standard_normal(shape[1]).astype(dt), np.float64)
    mean = np.asarray(x.mean((0, 2)).astype(dt), np.float64)
    var = np.asarray(x.var((0, 2)).astype(dt), np.float64)
    inv = 1 / np.sqrt(var)[None, :, None]
    xhat = (x - mean[None, :, None]) * inv
    m = shape[0] * shape[2]
    sum_go = go.sum((0, 2))
    sum_gx = (go * xhat).sum((0, 2))
    ref_gi = w[None, :, None] * inv * (go - sum_go[None, :, None] / m - xhat * sum_gx[None, :, None] / m)
    vec = (lambda v: spaced_vector(v, dt, step)) if step > 1 else (lambda v: device_copy(v, dt, misalign))
    gi, xd, god = (device_copy(v, dt, misalign) for v in (np.zeros(shape), x, go))
    gw, gb, wd, md, vd = (vec(v) for v in (np.zeros(shape[1]), np.zeros(shape[1]), w, mean, var))
    status = runner.run("BatchNorm", code, [gi, gw, gb], [xd, god, wd, md, vd])
    if status != 0:
        return {"status": status}
    return {"status": 0, "err": max(rel_err(gi, ref_gi), rel_err(gw, sum_gx), rel_err(gb, sum_go))}


def empty_case(runner, op, dtype_name, shape, step=1):
    """No samples to reduce (zero rows / zero batch): the weight and bias gradients are zeros, written over a
    sentinel; strided gradient vectors cannot be zeroed directly and are refused."""
    dt, code = DTYPES[dtype_name]
    length = shape[-1] if op == "LayerNorm" else shape[1]
    big = [device_copy(np.zeros(shape), dt) for _ in range(3)]
    gw, gb = spaced_vector(np.full(length, 7.0), dt, step), spaced_vector(np.full(length, 7.0), dt, step)
    vectors = [device_copy(np.ones(length), dt) for _ in range(1 if op == "LayerNorm" else 3)]
    if op == "LayerNorm":
        inputs = [big[1], vectors[0], big[2], device_copy(np.ones(shape[:-1]), dt)]
    else:
        inputs = [big[1], big[2], *vectors]
    status = runner.run(op, code, [big[0], gw, gb], inputs)
    if status != 0:
        return {"status": status}
    return {"status": 0, "err": float(max(np.abs(np.asarray(gw, np.float64)).max(),
                                          np.abs(np.asarray(gb, np.float64)).max()))}


def runtime_case(lib):
    """infinirt on the Ascend device: malloc/free, H2D/D2H copies, memset, streams, synchronize."""
    out = {}
    pointer = ffi.new("void**")
    out["malloc"] = lib.infinirtMalloc(pointer, 256)
    host = np.arange(64, dtype=np.float32)
    back = np.zeros(64, np.float32)
    out["h2d"] = lib.infinirtMemcpy(pointer[0], ffi.cast("void*", host.ctypes.data), 256, 1)
    out["d2h"] = lib.infinirtMemcpy(ffi.cast("void*", back.ctypes.data), pointer[0], 256, 2)
    out["roundtrip"] = bool((back == host).all())
    out["memset"] = lib.infinirtMemset(pointer[0], 0, 256)
    lib.infinirtMemcpy(ffi.cast("void*", back.ctypes.data), pointer[0], 256, 2)
    out["zeroed"] = bool((back == 0).all())
    out["free"] = lib.infinirtFree(pointer[0])
    stream = ffi.new("void**")
    out["stream_create"] = lib.infinirtStreamCreate(stream)
    out["stream_sync"] = lib.infinirtStreamSynchronize(stream[0])
    out["stream_destroy"] = lib.infinirtStreamDestroy(stream[0])
    out["device_sync"] = lib.infinirtDeviceSynchronize()
    return out


def ex_statuses(runner):
    """Create statuses of the Ex functions on Ascend: seed features build, the others are NOT_IMPLEMENTED (2)."""
    lib, null = runner.lib, ffi.NULL
    matrix, vector, rows = np.zeros((4, 8), np.float32), np.zeros(8, np.float32), np.zeros(4, np.float32)

    def create(op, arrays, *scalars):
        function = getattr(lib, f"infiniopCreate{op}BackwardDescriptorEx")
        tensors = [null if a is None else runner.descriptor(a, 13) for a in arrays]
        desc = ffi.new("D*")
        status = function(runner.handle, desc, *tensors, *scalars)
        for t in tensors:
            if t != null:
                lib.infiniopDestroyTensorDescriptor(t)
        if status == 0:
            getattr(lib, f"infiniopDestroy{op}BackwardDescriptor")(desc[0])
        return status

    rms, ln, bn = "RMSNorm", "LayerNorm", "BatchNorm"
    images = np.zeros((2, 8, 3, 5), np.float32)
    nhwc = np.zeros((2, 3, 5, 8), np.float32).transpose(0, 3, 1, 2)
    parameters = [vector] * 3  # weight, running_mean, running_var
    return {
        "bn_seed_features_rank4": create(bn, [images, vector, vector, images, images, *parameters, None, None],
                                         0.0, 1),
        "bn_epsilon": create(bn, [images, vector, vector, images, images, *parameters, None, None], 1e-5, 1),
        "bn_eval": create(bn, [images, vector, vector, images, images, *parameters, None, None], 0.0, 0),
        "bn_channels_last": create(bn, [nhwc, vector, vector, nhwc, nhwc, *parameters, None, None], 0.0, 1),
        "bn_saved_statistics": create(bn, [images, vector, vector, images, images, vector, None, None, vector,
                                           vector], 0.0, 1),
        "bn_no_grad_bias": create(bn, [images, vector, None, images, images, *parameters, None, None], 0.0, 1),
        "rms_seed_features": create(rms, [matrix, vector, matrix, matrix, vector, None], 0.0),
        "rms_epsilon": create(rms, [matrix, vector, matrix, matrix, vector, None], 1e-5),
        "rms_rstd": create(rms, [matrix, vector, matrix, matrix, vector, rows], 0.0),
        "ln_seed_features": create(ln, [matrix, vector, vector, matrix, vector, matrix, rows]),
        "ln_no_weight": create(ln, [matrix, vector, vector, matrix, None, matrix, rows]),
    }


def cases():
    """(name, run(runner, rng) -> {"status", "err"}, expected status) for every operator case."""
    out = []
    for name in DTYPES:
        itemsize = np.dtype(DTYPES[name][0]).itemsize
        for shape in [(3, 5, 64), (2, 37), (1, 1, 8)]:
            out.append((f"rms/{name}/{shape}", lambda r, g, n=name, s=shape: rms_case(r, n, s, g), 0))
            out.append((f"ln/{name}/{shape}", lambda r, g, n=name, s=shape: ln_case(r, n, s, g), 0))
        for shape in [(4, 6, 9), (3, 3, 1), (1, 5, 33)]:
            out.append((f"bn/{name}/{shape}", lambda r, g, n=name, s=shape: bn_case(r, n, s, g), 0))
        out += [
            (f"ln-strided/{name}", lambda r, g, n=name: ln_case(r, n, (3, 4, 40), g, pad=8, step=2), 0),
            (f"bn-strided/{name}", lambda r, g, n=name: bn_case(r, n, (3, 4, 10), g, step=3), 0),
            # Off 32-byte alignment a reused executor cannot be re-pointed: the backend plans those calls anew.
            (f"rms-unaligned/{name}", lambda r, g, n=name, m=itemsize: rms_case(r, n, (4, 24), g, misalign=m), 0),
            (f"ln-unaligned/{name}", lambda r, g, n=name: ln_case(r, n, (4, 24), g, misalign=4), 0),
            (f"bn-unaligned/{name}", lambda r, g, n=name: bn_case(r, n, (2, 3, 8), g, misalign=4), 0),
            # aclnnRmsNormGrad takes no strided input: the backend refuses it at create time (BAD_TENSOR_STRIDES).
            (f"rms-strided/{name}", lambda r, g, n=name: rms_case(r, n, (3, 16), g, pad=4), 12),
            (f"ln-no-rows/{name}", lambda r, g, n=name: empty_case(r, "LayerNorm", n, (0, 3, 16)), 0),
            (f"bn-no-batch/{name}", lambda r, g, n=name: empty_case(r, "BatchNorm", n, (0, 4, 5)), 0),
            # Empty sums are zeroed directly, which needs packed gradient vectors.
            (f"ln-no-rows-strided/{name}", lambda r, g, n=name: empty_case(r, "LayerNorm", n, (0, 16), step=2), 12),
            (f"bn-no-batch-strided/{name}", lambda r, g, n=name: empty_case(r, "BatchNorm", n, (0, 4, 5), step=2), 12),
        ]
    return out


def main():
    lib = load(sys.argv[1])
    results = {}
    count = ffi.new("int*")
    results["device_count"] = [lib.infinirtGetDeviceCount(ASCEND, count), count[0]]
    results["set_device_out_of_range"] = lib.infinirtSetDevice(ASCEND, count[0]) if count[0] > 0 else None
    results["set_device"] = lib.infinirtSetDevice(ASCEND, 0)
    if results["set_device"] == 0:
        results["runtime"] = runtime_case(lib)
        runner = Runner(lib)
        rng = np.random.default_rng(0)
        for name, run, _ in cases():
            results[name] = run(runner, rng)
        results["ex_statuses"] = ex_statuses(runner)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
