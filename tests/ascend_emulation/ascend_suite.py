"""Drives the Ascend backend through the C API against the emulated CANN libraries, in its own process
(the native loader resolves CANN once per process). Prints one JSON object: case name -> result.

Run by tests/test_ascend_emulated.py with ASCEND_TOOLKIT_HOME pointing at the built emulation.
Device memory of the emulation is host memory, so numpy buffers serve as device buffers.
"""

import functools
import json
import os
import sys
import threading
import warnings

import cffi
import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for the references
from _helpers import (batch_norm_backward_reference, batch_norm_forward_reference, batch_norm_inputs,  # noqa: E402
                      f64, layer_norm_forward_reference, layer_norm_reference, rms_norm_forward_reference,
                      rms_reference, rounded)

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
infiniStatus_t infinirtMemcpyAsync(void *dst, const void *src, size_t size, int kind, void *stream);
infiniStatus_t infinirtMemset(void *p, int value, size_t size);
infiniStatus_t infinirtStreamCreate(void **stream);
infiniStatus_t infinirtStreamSynchronize(void *stream);
infiniStatus_t infinirtStreamDestroy(void *stream);
infiniStatus_t infinirtDeviceSynchronize(void);
typedef enum { INFINIRT_EVENT_COMPLETE = 0, INFINIRT_EVENT_NOT_READY = 1 } infinirtEventStatus_t;
infiniStatus_t infinirtStreamWaitEvent(void *stream, void *event);
infiniStatus_t infinirtEventCreate(void **event);
infiniStatus_t infinirtEventRecord(void *event, void *stream);
infiniStatus_t infinirtEventQuery(void *event, infinirtEventStatus_t *status);
infiniStatus_t infinirtEventSynchronize(void *event);
infiniStatus_t infinirtEventDestroy(void *event);
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
infiniStatus_t infiniopRMSNormBackwardEx(D, void*, size_t, void*, void*, const void*, const void*, const void*,
    const void*, void*);
infiniStatus_t infiniopCreateLayerNormBackwardDescriptorEx(infiniopHandle_t, D*, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t);
infiniStatus_t infiniopCreateBatchNormBackwardDescriptorEx(infiniopHandle_t, D*, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, double, int);
infiniStatus_t infiniopBatchNormBackwardEx(D, void*, size_t, void*, void*, void*, const void*, const void*,
    const void*, const void*, const void*, const void*, const void*, void*);
infiniStatus_t infiniopCreateLayerNormBackwardFromInputDescriptorEx(infiniopHandle_t, D*, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t,
    infiniopTensorDescriptor_t, infiniopTensorDescriptor_t, infiniopTensorDescriptor_t);
infiniStatus_t infiniopLayerNormBackwardFromInputEx(D, void*, size_t, void*, void*, void*, const void*, const void*,
    const void*, const void*, const void*, void*);
infiniStatus_t infiniopBatchNormBackwardReduceEx(D, void*, size_t, void*, void*, void*, void*, const void*,
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
typedef infiniopTensorDescriptor_t T;
infiniStatus_t infiniopCreateRMSNormDescriptor(infiniopHandle_t, D*, T, T, T, float);
infiniStatus_t infiniopCreateRMSNormDescriptorEx(infiniopHandle_t, D*, T, T, T, T, double);
infiniStatus_t infiniopGetRMSNormWorkspaceSize(D, size_t*);
infiniStatus_t infiniopRMSNorm(D, void*, size_t, void*, const void*, const void*, void*);
infiniStatus_t infiniopRMSNormEx(D, void*, size_t, void*, void*, const void*, const void*, void*);
infiniStatus_t infiniopDestroyRMSNormDescriptor(D);
infiniStatus_t infiniopCreateLayerNormDescriptor(infiniopHandle_t, D*, T, T, T, T, T, T, float);
infiniStatus_t infiniopCreateLayerNormDescriptorEx(infiniopHandle_t, D*, T, T, T, T, T, T, double);
infiniStatus_t infiniopGetLayerNormWorkspaceSize(D, size_t*);
infiniStatus_t infiniopLayerNorm(D, void*, size_t, void*, void*, void*, const void*, const void*, const void*, void*);
infiniStatus_t infiniopLayerNormEx(D, void*, size_t, void*, void*, void*, const void*, const void*, const void*, void*);
infiniStatus_t infiniopDestroyLayerNormDescriptor(D);
infiniStatus_t infiniopCreateBatchNormDescriptor(infiniopHandle_t, D*, T, T, T, T, T, T, float, float);
infiniStatus_t infiniopCreateBatchNormDescriptorEx(infiniopHandle_t, D*, T, T, T, T, T, T, T, T, int, double, double);
infiniStatus_t infiniopGetBatchNormWorkspaceSize(D, size_t*);
infiniStatus_t infiniopBatchNorm(D, void*, size_t, void*, void*, void*, const void*, const void*, const void*, void*);
infiniStatus_t infiniopBatchNormEx(D, void*, size_t, void*, void*, void*, void*, void*, const void*, const void*,
    const void*, void*);
infiniStatus_t infiniopDestroyBatchNormDescriptor(D);
int aclrtGetDevice(int32_t *device_id);  /* the emulated libascendcl's: which device this thread has */
"""
ASCEND = 3
DTYPES = {"F16": (np.float16, 12), "F32": (np.float32, 13), "BF16": (ml_dtypes.bfloat16, 19)}
TOLERANCE = {"F32": 5e-5, "F16": 2e-3, "BF16": 1.6e-2}
DTYPE_CODES = {np.dtype(np.float16): 12, np.dtype(np.float32): 13, np.dtype(np.float64): 14,
               np.dtype(ml_dtypes.bfloat16): 19}
NOT_IMPLEMENTED = 2
BAD_TENSOR_STRIDES = 12

ffi = cffi.FFI()
ffi.cdef(CDEF)


def load(library_dir):
    ffi.dlopen(os.path.join(library_dir, "libinfinirt.so"), ffi.RTLD_GLOBAL)
    return ffi.dlopen(os.path.join(library_dir, "libinfiniop.so"))


@functools.lru_cache(maxsize=None)
def emulated_acl():
    return ffi.dlopen(os.path.join(os.environ["ASCEND_TOOLKIT_HOME"], "lib64", "libascendcl.so"))


def acl_device():
    """The device CANN has current on this thread (-1: none), asked of the emulation the backend loaded."""
    device = ffi.new("int32_t*")
    return device[0] if emulated_acl().aclrtGetDevice(device) == 0 else -1


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
    """Creates, runs and destroys op descriptors on an Ascend handle, as a client on a real device would:

    stream     the stream the runs are queued on (NULL: the device's default stream); the results are read after
               synchronizing it, which comes after the descriptor's destruction (destroying must wait for its work)
    device_id  the handle's device; `current` is the device the calling thread has selected meanwhile
    threaded   create, run and destroy on a new thread, where no device was ever selected
    staged     pass device buffers from infinirtMalloc on the handle's device instead of host arrays
    """

    def __init__(self, lib, stream=ffi.NULL, device_id=0, current=0, threaded=False, staged=False):
        self.lib, self.stream, self.device_id, self.current = lib, stream, device_id, current
        self.threaded, self.staged = threaded, staged
        self.devices_seen = set()  # CANN's current device after each create / run / destroy
        self.in_use = []  # workspaces of queued runs: a client keeps them until it has synchronized
        handle = ffi.new("infiniopHandle_t*")
        assert lib.infinirtSetDevice(ASCEND, device_id) == 0
        assert lib.infiniopCreateHandle(handle) == 0
        assert lib.infinirtSetDevice(ASCEND, current) == 0
        self.handle = handle[0]

    def descriptor(self, array):
        d = ffi.new("infiniopTensorDescriptor_t*")
        strides = [st // array.itemsize for st in array.strides]
        status = self.lib.infiniopCreateTensorDescriptor(d, array.ndim, list(array.shape), strides,
                                                         DTYPE_CODES[array.dtype])
        assert status == 0, status
        return d[0]

    def run(self, name, outputs, inputs):
        """The seed create and run of backward `name` on outputs + inputs (see run_arrays)."""
        return self.run_arrays(f"{name}Backward", f"infiniopCreate{name}BackwardDescriptor",
                               f"infiniop{name}Backward", outputs + inputs)

    def run_arrays(self, name, create, run, arrays, scalars=()):
        """Status of create (then of the runs, then of synchronizing) with `arrays` in C order, None for a NULL
        descriptor and pointer; each descriptor takes its array's dtype. The tensor descriptors are destroyed right
        after create, the op descriptor (of op `name`: RMSNormBackward, BatchNorm, ...) right after its last run."""
        buffers = self.stage(arrays) if self.staged else arrays
        if self.threaded:
            outcome = []
            worker = threading.Thread(target=lambda: outcome.append(self.create_and_run(name, create, run, arrays,
                                                                                     buffers, scalars)))
            worker.start()
            worker.join()
            status = outcome[0]
        else:
            status = self.create_and_run(name, create, run, arrays, buffers, scalars)
        assert self.lib.infinirtSetDevice(ASCEND, self.device_id) == 0
        synchronized = self.lib.infinirtStreamSynchronize(self.stream)
        self.in_use.clear()
        if self.staged:
            self.unstage(arrays, buffers)
        assert self.lib.infinirtSetDevice(ASCEND, self.current) == 0
        return status or synchronized

    def create_and_run(self, name, create, run, arrays, buffers, scalars):
        lib, null = self.lib, ffi.NULL
        tensors = [null if a is None else self.descriptor(a) for a in arrays]
        desc = ffi.new("D*")
        status = getattr(lib, create)(self.handle, desc, *tensors, *scalars)
        self.devices_seen.add(acl_device())
        for t in tensors:
            if t != null:
                lib.infiniopDestroyTensorDescriptor(t)
        if status != 0:
            return status
        device_type = ffi.new("int*")
        lib.infiniopGetDescriptorDeviceType(desc[0], device_type)
        assert device_type[0] == ASCEND
        size = ffi.new("size_t*")
        assert getattr(lib, f"infiniopGet{name}WorkspaceSize")(desc[0], size) == 0
        pointers = [null if b is None else ffi.cast("void*", b if isinstance(b, int) else b.ctypes.data)
                    for b in buffers]
        too_small = aligned_empty((max(size[0], 1) - 1,), np.uint8)
        if size[0] > 0:
            status = getattr(lib, run)(desc[0], ffi.cast("void*", too_small.ctypes.data), size[0] - 1, *pointers,
                                       self.stream)
            assert status == 13, f"short workspace gave {status}"
        workspace = aligned_empty((size[0],), np.uint8)
        self.in_use.append(workspace)
        # Twice: a reused (repeatable) executor must give the same answer as a fresh one.
        for _ in range(2):
            status = getattr(lib, run)(desc[0], ffi.cast("void*", workspace.ctypes.data), size[0], *pointers,
                                       self.stream)
            self.devices_seen.add(acl_device())
            if status != 0:
                break
        getattr(lib, f"infiniopDestroy{name}Descriptor")(desc[0])
        self.devices_seen.add(acl_device())
        return status

    def stage(self, arrays):
        """Device copies (addresses) of the arrays, which must be packed, on the handle's device."""
        assert self.lib.infinirtSetDevice(ASCEND, self.device_id) == 0
        buffers = []
        for a in arrays:
            if a is None:
                buffers.append(None)
                continue
            assert a.flags.c_contiguous
            pointer = ffi.new("void**")
            assert self.lib.infinirtMalloc(pointer, a.nbytes) == 0
            assert self.lib.infinirtMemcpy(pointer[0], ffi.cast("void*", a.ctypes.data), a.nbytes, 1) == 0
            buffers.append(int(ffi.cast("uintptr_t", pointer[0])))
        assert self.lib.infinirtSetDevice(ASCEND, self.current) == 0
        return buffers

    def unstage(self, arrays, buffers):
        """Copies every device buffer back over its array (outputs included), then frees it."""
        for a, b in zip(arrays, buffers):
            if b is not None:
                assert self.lib.infinirtMemcpy(ffi.cast("void*", a.ctypes.data), ffi.cast("void*", b), a.nbytes,
                                               2) == 0
                assert self.lib.infinirtFree(ffi.cast("void*", b)) == 0


def rel_err(got, ref):
    got = np.asarray(got, dtype=np.float64)
    scale = np.abs(ref).max()
    return float(np.abs(got - ref).max() / (scale if scale > 0 else 1.0))


def rms_case(runner, dtype_name, shape, rng, misalign=0, pad=0):
    dt = DTYPES[dtype_name][0]
    gy, x = (rng.standard_normal(shape) for _ in range(2))
    w = rng.standard_normal(shape[-1])
    gy, x, w = (np.asarray(a.astype(dt), np.float64) for a in (gy, x, w))
    r = 1 / np.sqrt(np.mean(x * x, -1, keepdims=True))
    ref_gx = r * gy * w - r ** 3 * x * np.sum(gy * w * x, -1, keepdims=True) / shape[-1]
    ref_gw = np.sum((gy * x * r).reshape(-1, shape[-1]), 0)
    make = (lambda v: strided(v, dt, pad)) if pad else (lambda v: device_copy(v, dt, misalign))
    gx, gyd, xd = make(np.zeros(shape)), make(gy), make(x)
    gw, wd = device_copy(np.zeros(shape[-1]), dt), device_copy(w, dt, misalign)
    status = runner.run("RMSNorm", [gx, gw], [gyd, xd, wd])
    if status != 0:
        return {"status": status}
    return {"status": 0, "err": max(rel_err(gx, ref_gx), rel_err(gw, ref_gw))}


def ln_case(runner, dtype_name, shape, rng, pad=0, step=1, misalign=0):
    dt = DTYPES[dtype_name][0]
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
    status = runner.run("LayerNorm", [gi, gw, gb], [god, wd, xd, stdd])
    if status != 0:
        return {"status": status}
    return {"status": 0, "err": max(rel_err(gi, ref_gi), rel_err(gw, ref_gw), rel_err(gb, ref_gb))}


def bn_case(runner, dtype_name, shape, rng, step=1, misalign=0):
    dt = DTYPES[dtype_name][0]
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
    status = runner.run("BatchNorm", [gi, gw, gb], [xd, god, wd, md, vd])
    if status != 0:
        return {"status": status}
    return {"status": 0, "err": max(rel_err(gi, ref_gi), rel_err(gw, sum_gx), rel_err(gb, sum_go))}


def empty_case(runner, op, dtype_name, shape, step=1):
    """No samples to reduce (zero rows / zero batch): the weight and bias gradients are zeros, written over a
    sentinel; strided gradient vectors cannot be zeroed directly and are refused."""
    dt = DTYPES[dtype_name][0]
    length = shape[-1] if op == "LayerNorm" else shape[1]
    big = [device_copy(np.zeros(shape), dt) for _ in range(3)]
    gw, gb = spaced_vector(np.full(length, 7.0), dt, step), spaced_vector(np.full(length, 7.0), dt, step)
    vectors = [device_copy(np.ones(length), dt) for _ in range(1 if op == "LayerNorm" else 3)]
    if op == "LayerNorm":
        inputs = [big[1], vectors[0], big[2], device_copy(np.ones(shape[:-1]), dt)]
    else:
        inputs = [big[1], big[2], *vectors]
    status = runner.run(op, [big[0], gw, gb], inputs)
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
    # infinirtFree while a queued copy still reads the block: it must wait, as cudaFree does (aclrtFree does not).
    source, target = ffi.new("void**"), ffi.new("void**")
    out["malloc_source"], out["malloc_target"] = lib.infinirtMalloc(source, 256), lib.infinirtMalloc(target, 256)
    lib.infinirtMemcpy(source[0], ffi.cast("void*", host.ctypes.data), 256, 1)
    out["copy_async"] = lib.infinirtMemcpyAsync(target[0], source[0], 256, 3, stream[0])
    out["free_while_queued"] = lib.infinirtFree(source[0])
    out["sync_after_free"] = lib.infinirtStreamSynchronize(stream[0])
    lib.infinirtMemcpy(ffi.cast("void*", back.ctypes.data), target[0], 256, 2)
    out["copied"] = bool((back == host).all())
    # infinirtStreamDestroy with a copy still queued: it must synchronize first, as CANN asks.
    fives = np.full(64, 5.0, np.float32)
    out["copy_async_again"] = lib.infinirtMemcpyAsync(target[0], ffi.cast("void*", fives.ctypes.data), 256, 1,
                                                      stream[0])
    out["stream_destroy"] = lib.infinirtStreamDestroy(stream[0])
    lib.infinirtMemcpy(ffi.cast("void*", back.ctypes.data), target[0], 256, 2)
    out["copied_before_destroy"] = bool((back == fives).all())
    out["free_target"] = lib.infinirtFree(target[0])
    out.update(event_case(lib))
    out["device_sync"] = lib.infinirtDeviceSynchronize()
    return out


def event_case(lib):
    """infinirt events: a copy queued on stream b after infinirtStreamWaitEvent(b, an event recorded on stream a
    after a's copy) reads what a's copy wrote. (The emulated streams run their work only when something waits for
    it, so without the wait b's copy would read the block first.)"""
    out = {}
    streams, event, blocks = ffi.new("void*[2]"), ffi.new("void**"), ffi.new("void*[2]")
    out["streams"] = lib.infinirtStreamCreate(streams) | lib.infinirtStreamCreate(streams + 1)
    out["blocks"] = lib.infinirtMalloc(blocks, 256) | lib.infinirtMalloc(blocks + 1, 256)
    out["zero_blocks"] = lib.infinirtMemset(blocks[0], 0, 256) | lib.infinirtMemset(blocks[1], 0, 256)
    out["event_create"] = lib.infinirtEventCreate(event)
    state = ffi.new("infinirtEventStatus_t *", 1)
    out["query_unrecorded"] = lib.infinirtEventQuery(event[0], state)
    unrecorded_complete = state[0] == lib.INFINIRT_EVENT_COMPLETE
    fours, back = np.full(64, 4.0, np.float32), np.zeros(64, np.float32)
    out["copy_on_a"] = lib.infinirtMemcpyAsync(blocks[0], ffi.cast("void*", fours.ctypes.data), 256, 1, streams[0])
    out["record_on_a"] = lib.infinirtEventRecord(event[0], streams[0])
    out["b_waits"] = lib.infinirtStreamWaitEvent(streams[1], event[0])
    out["copy_on_b"] = lib.infinirtMemcpyAsync(blocks[1], blocks[0], 256, 3, streams[1])
    out["sync_b"] = lib.infinirtStreamSynchronize(streams[1])
    lib.infinirtMemcpy(ffi.cast("void*", back.ctypes.data), blocks[1], 256, 2)
    out["event_sync"] = lib.infinirtEventSynchronize(event[0])
    out["query_done"] = lib.infinirtEventQuery(event[0], state)
    out["event_ordered"] = bool((back == fours).all()) and unrecorded_complete and state[0] == 0
    out["event_destroy"] = lib.infinirtEventDestroy(event[0])
    out["destroy_streams"] = lib.infinirtStreamDestroy(streams[0]) | lib.infinirtStreamDestroy(streams[1])
    out["free_blocks"] = lib.infinirtFree(blocks[0]) | lib.infinirtFree(blocks[1])
    return out


# ---------------------------------------------------------------- the Ex entry points (issue 6)

SENTINEL = 7.0  # outputs start as this, so an output left unwritten (an empty sum not zeroed) is seen


def statistic_dtype(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def output_like(shape, dtype, layout=None):
    out = device_copy(np.full(shape, SENTINEL), dtype)
    return out if layout is None else layout(out)


def worst_error(pairs):
    """max rel_err over (got, ref) pairs, the empty ones left out; None entries (outputs not asked for) too."""
    return max([rel_err(got, ref) for got, ref in pairs if got is not None and np.size(ref) > 0] + [0.0])


def ex_result(status, pairs):
    return {"status": status} if status != 0 else {"status": 0, "err": worst_error(pairs)}


def rms_ex_case(runner, dtype, shape, k, rng, eps=0.0, rstd_eps=None, grad_w=True, weight_dtype=None):
    """RMSNorm Ex: w of the last k dims, `eps`; rstd_eps: a saved rstd made with that epsilon is passed (the
    descriptor's own epsilon must then be unused)."""
    weight_dtype = weight_dtype or dtype
    grad_y, x = (rounded(rng.standard_normal(shape), dtype) for _ in range(2))
    w = rounded(rng.normal(1.0, 0.5, shape[len(shape) - k:]), weight_dtype)
    rstd = None
    if rstd_eps is not None:
        axes = tuple(range(len(shape) - k, len(shape)))
        rstd = rounded(1 / np.sqrt(np.mean(f64(x) ** 2, axis=axes) + rstd_eps), statistic_dtype(dtype))
    ref_gx, ref_gw, _ = rms_reference(grad_y, x, w, eps, rstd)
    gx = output_like(shape, dtype)
    gw = output_like(w.shape, weight_dtype) if grad_w else None
    arrays = [gx, gw, device_copy(grad_y, dtype), device_copy(x, dtype), device_copy(w, weight_dtype),
              None if rstd is None else device_copy(rstd, rstd.dtype)]
    status = runner.run_arrays("RMSNormBackward", "infiniopCreateRMSNormBackwardDescriptorEx",
                               "infiniopRMSNormBackwardEx", arrays, (eps,))
    return ex_result(status, [(gx, ref_gx), (gw, ref_gw)])


def leading_strided(values, dtype, leading):
    """values with their leading dims 1 .. leading-1 padded by 2 (so no two leading dims merge); the trailing
    (normalized) dims stay packed."""
    padded = tuple(n + 2 if 0 < i < leading else n for i, n in enumerate(values.shape))
    base = device_copy(np.full(padded, SENTINEL), dtype)
    view = base[tuple(slice(0, n) for n in values.shape)]
    view[...] = values.astype(dtype)
    return view


def ln_ex_case(runner, dtype, shape, k, rng, parameter_dtype=None, affine=True, grad_weight=True, grad_bias=True,
               strided=()):
    """LayerNorm Ex normalized over the last k dims; the big tensors named in `strided` ("grad_input",
    "grad_output", "xhat") get leading dims that do not merge, the others are packed."""
    parameter_dtype = parameter_dtype or dtype
    leading = len(shape) - k
    axes = tuple(range(leading, len(shape)))
    x = rng.standard_normal(shape) * 2 + 0.5
    std = np.sqrt(x.var(axes, keepdims=True) + 1e-5) if x.size else np.ones(shape[:leading] + (1,) * k)
    xhat = rounded((x - x.mean(axes, keepdims=True)) / std if x.size else x, dtype)
    std = rounded(std.reshape(shape[:leading]), parameter_dtype)
    grad_output = rounded(rng.standard_normal(shape), dtype)
    weight = rounded(rng.normal(1.0, 0.5, shape[leading:]), parameter_dtype) if affine else None
    return run_ln(runner, "infiniopCreateLayerNormBackwardDescriptorEx", "infiniopLayerNormBackward", dtype,
                  parameter_dtype, leading, strided, (grad_weight, grad_bias), grad_output, weight, ("xhat", xhat),
                  [device_copy(std, parameter_dtype)], layer_norm_reference(grad_output, weight, xhat, std))


def run_ln(runner, create, run, dtype, parameter_dtype, leading, strided, wanted, grad_output, weight, row_input,
           statistics, references):
    """A LayerNorm Ex case of either form: sentinel-filled outputs (those `wanted` of grad_weight, grad_bias), the
    big tensors laid out with leading dims that do not merge where named in `strided`, then create and run;
    ``row_input``: (name, values) of xhat or input; ``statistics``: the device arrays after it."""
    shape = grad_output.shape

    def big(values, name):
        return leading_strided(values, dtype, leading) if name in strided else device_copy(values, dtype)

    gi = big(np.full(shape, SENTINEL), "grad_input")
    gw, gb = (output_like(shape[leading:], parameter_dtype) if want else None for want in wanted)
    arrays = [gi, gw, gb, big(grad_output, "grad_output"),
              None if weight is None else device_copy(weight, parameter_dtype), big(row_input[1], row_input[0]),
              *statistics]
    status = runner.run_arrays("LayerNormBackward", create, run, arrays)
    return ex_result(status, list(zip((gi, gw, gb), references)))


def ln_from_input_case(runner, dtype, shape, k, rng, parameter_dtype=None, affine=True, grad_weight=True,
                       grad_bias=True, strided=()):
    """LayerNorm from the forward's input, mean and rstd (F32; F64 for F64 data), as PyTorch saves them: aclnnLayerNormBackward takes
    them as they are. The reference forms xhat from the exact rounded input and statistics."""
    parameter_dtype = parameter_dtype or dtype
    leading = len(shape) - k
    axes = tuple(range(leading, len(shape)))
    x = rounded(rng.standard_normal(shape) * 2 + 0.5, dtype)
    mean = f64(x).mean(axes) if x.size else np.zeros(shape[:leading])
    rstd = 1 / np.sqrt(f64(x).var(axes) + 1e-5) if x.size else np.ones(shape[:leading])
    statistics = statistic_dtype(dtype)
    mean, rstd = rounded(mean, statistics), rounded(rstd, statistics)
    per_row = shape[:leading] + (1,) * k
    xhat = (f64(x) - f64(mean).reshape(per_row)) * f64(rstd).reshape(per_row)
    grad_output = rounded(rng.standard_normal(shape), dtype)
    weight = rounded(rng.normal(1.0, 0.5, shape[leading:]), parameter_dtype) if affine else None
    return run_ln(runner, "infiniopCreateLayerNormBackwardFromInputDescriptorEx", "infiniopLayerNormBackwardFromInputEx",
                  dtype, parameter_dtype, leading, strided, (grad_weight, grad_bias), grad_output, weight, ("input", x),
                  [device_copy(mean, statistics), device_copy(rstd, statistics)],
                  layer_norm_reference(grad_output, weight, xhat, 1 / f64(rstd)))


def bn_phase_case(runner, dtype, shape, rng):
    """BatchNorm's reduce phase on an Ascend descriptor: NOT_IMPLEMENTED (docs/ascend.md says why)."""
    x, grad_output, weight, mean, var = batch_norm_inputs(rng, shape, dtype)
    lib, null = runner.lib, ffi.NULL
    arrays = [device_copy(np.zeros(shape), dtype), None, None, device_copy(x, dtype), device_copy(grad_output, dtype),
              device_copy(weight, dtype), device_copy(mean, dtype), device_copy(var, dtype), None, None]
    tensors = [null if a is None else runner.descriptor(a) for a in arrays]
    desc = ffi.new("D*")
    status = lib.infiniopCreateBatchNormBackwardDescriptorEx(runner.handle, desc, *tensors, 1e-5, 1)
    for t in tensors:
        if t != null:
            lib.infiniopDestroyTensorDescriptor(t)
    if status != 0:
        return {"status": status}
    size = ffi.new("size_t*")
    assert lib.infiniopGetBatchNormBackwardWorkspaceSize(desc[0], size) == 0
    workspace = aligned_empty((max(size[0], 1),), np.uint8)
    sums = [device_copy(np.zeros(shape[1]), np.float32) for _ in range(2)]
    pointer = lambda a: null if a is None else ffi.cast("void*", a.ctypes.data)  # noqa: E731
    status = lib.infiniopBatchNormBackwardReduceEx(desc[0], pointer(workspace), size[0], pointer(sums[0]),
                                                   pointer(sums[1]), null, null, pointer(arrays[3]),
                                                   pointer(arrays[4]), pointer(arrays[6]), pointer(arrays[7]), null,
                                                   null, null)
    lib.infiniopDestroyBatchNormBackwardDescriptor(desc[0])
    return {"status": status}


def channels_last_copy(values, dtype):
    """An aligned array equal to values (N, C, *spatial), laid out with C innermost, then spatial, then N."""
    order = (0,) + tuple(range(2, values.ndim)) + (1,)
    return device_copy(np.ascontiguousarray(values.transpose(order)), dtype).transpose(np.argsort(order))


def bn_ex_case(runner, dtype, shape, rng, parameter_dtype=None, eps=0.0, training=True, saved=False, affine=True,
               grad_weight=True, grad_bias=True, channels_last=False):
    """BatchNorm Ex on (N, C, *spatial). saved: save_mean / save_invstd (made with eps + 0.2, so the descriptor's
    eps must not be added again) and NULL running statistics. Eval: running statistics that are not the batch's."""
    parameter_dtype = parameter_dtype or dtype
    x, grad_output, weight, mean, var = batch_norm_inputs(rng, shape, dtype, parameter_dtype=parameter_dtype)
    channels = shape[1]
    if not training:
        mean = rounded(f64(mean) + rng.normal(0.0, 0.5, channels), parameter_dtype)
        var = rounded(f64(var) * rng.uniform(0.5, 2.0, channels), parameter_dtype)
    weight = weight if affine else None
    save_mean = save_invstd = None
    if saved:
        save_mean = rounded(mean, statistic_dtype(dtype))
        save_invstd = rounded(1 / np.sqrt(f64(var) + eps + 0.2), statistic_dtype(dtype))
        mean = var = None
    ref_gi, ref_gw, ref_gb = batch_norm_backward_reference(x, grad_output, weight, mean, var, eps, save_mean,
                                                           save_invstd, training)
    big = (lambda v: channels_last_copy(v, dtype)) if channels_last else (lambda v: device_copy(v, dtype))
    vector = lambda v: None if v is None else device_copy(v, v.dtype)  # noqa: E731
    gi = big(np.full(shape, SENTINEL))
    gw = output_like((channels,), parameter_dtype) if grad_weight else None
    gb = output_like((channels,), parameter_dtype) if grad_bias else None
    arrays = [gi, gw, gb, big(x), big(grad_output), vector(weight), vector(mean), vector(var), vector(save_mean),
              vector(save_invstd)]
    status = runner.run_arrays("BatchNormBackward", "infiniopCreateBatchNormBackwardDescriptorEx",
                               "infiniopBatchNormBackwardEx", arrays, (eps, int(training)))
    return ex_result(status, [(gi, ref_gi), (gw, ref_gw), (gb, ref_gb)])


# ---------------------------------------------------------------- the forwards (issue 54)

def quiet(reference, *args):
    """reference(*args) without numpy's warnings for rows or channels of no elements (their statistics are NaN)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return reference(*args)


def forward_result(status, pairs):
    """ex_result, but an all-NaN reference (the statistics of rows of zero length) wants all NaN."""
    if status != 0:
        return {"status": status}
    pairs = [(got, ref) for got, ref in pairs if got is not None and np.size(ref) > 0]
    errors = [rel_err(got, ref) for got, ref in pairs if not np.isnan(ref).all()]
    errors += [0.0 if np.isnan(f64(got)).all() else 1.0 for got, ref in pairs if np.isnan(ref).all()]
    return {"status": 0, "err": max(errors + [0.0])}


def row_outputs(dtype, shape, leading, strided):
    """Sentinel-filled outputs of `shape`: leading dims that do not merge where `strided`, else packed."""
    values = np.full(shape, SENTINEL)
    return leading_strided(values, dtype, leading) if strided else device_copy(values, dtype)


def rms_forward_case(runner, dtype, shape, k, rng, seed=False, rstd=True, weight_dtype=None, strided=False,
                     in_place=False, eps=1e-6):
    """RMSNorm forward over the last k dims: the seed create (rank 2 or 3, no rstd) or the Ex one (rstd unless
    `rstd` is False); `strided`: leading dims that do not merge; `in_place`: y is x, so the second of the two runs
    normalizes the first's y."""
    weight_dtype = weight_dtype or dtype
    leading = len(shape) - k
    x = rounded(rng.standard_normal(shape) * 1.5 + 0.3, dtype)
    w = rounded(rng.normal(1.0, 0.5, shape[leading:]), weight_dtype)
    ref_y, ref_rstd = quiet(rms_norm_forward_reference, x, w, eps)
    if in_place:
        ref_y, ref_rstd = rms_norm_forward_reference(rounded(ref_y, dtype), w, eps)
    xd = row_outputs(dtype, shape, leading, strided)
    xd[...] = x
    y = xd if in_place else row_outputs(dtype, shape, leading, strided)
    r = row_outputs(statistic_dtype(dtype), shape[:leading], leading, strided) if rstd and not seed else None
    wd = device_copy(w, weight_dtype)
    if seed:
        status = runner.run_arrays("RMSNorm", "infiniopCreateRMSNormDescriptor", "infiniopRMSNorm", [y, xd, wd], (eps,))
    else:
        status = runner.run_arrays("RMSNorm", "infiniopCreateRMSNormDescriptorEx", "infiniopRMSNormEx",
                                   [y, r, xd, wd], (eps,))
    return forward_result(status, [(y, ref_y), (r, ref_rstd)])


def ln_forward_case(runner, dtype, shape, k, rng, seed=False, weight=True, bias=True, statistics=True,
                    parameter_dtype=None, strided=False, in_place=False, eps=1e-5):
    """LayerNorm forward over the last k dims: the seed create (rank 2 or 3, k = 1, a weight) writing xhat and std,
    or the Ex one writing mean and rstd, those only when `statistics`; `strided` and `in_place` as for RMSNorm."""
    parameter_dtype = parameter_dtype or dtype
    leading = len(shape) - k
    x = rounded(rng.standard_normal(shape) * 2 + 0.5, dtype)
    w = rounded(rng.normal(1.0, 0.5, shape[leading:]), parameter_dtype) if weight else None
    b = rounded(rng.normal(0.0, 0.5, shape[leading:]), parameter_dtype) if bias else None
    refs = quiet(layer_norm_forward_reference, x, w, b, k, eps)
    if in_place:
        refs = layer_norm_forward_reference(rounded(refs[0], dtype), w, b, k, eps)
    ref_y, ref_mean, ref_rstd, ref_xhat, ref_std = refs
    xd = row_outputs(dtype, shape, leading, strided)
    xd[...] = x
    y = xd if in_place else row_outputs(dtype, shape, leading, strided)
    vectors = [None if v is None else device_copy(v, parameter_dtype) for v in (w, b)]

    def per_row(statistic):
        return row_outputs(statistic, shape[:leading], leading, strided) if statistics else None

    if seed:
        xhat, std = (row_outputs(dtype, shape, leading, strided) if statistics else None), per_row(parameter_dtype)
        status = runner.run_arrays("LayerNorm", "infiniopCreateLayerNormDescriptor", "infiniopLayerNorm",
                                   [y, xhat, std, xd, *vectors], (eps,))
        return forward_result(status, [(y, ref_y), (xhat, ref_xhat), (std, ref_std)])
    mean, rstd = per_row(statistic_dtype(dtype)), per_row(statistic_dtype(dtype))
    status = runner.run_arrays("LayerNorm", "infiniopCreateLayerNormDescriptorEx", "infiniopLayerNormEx",
                               [y, mean, rstd, xd, *vectors], (eps,))
    return forward_result(status, [(y, ref_y), (mean, ref_mean), (rstd, ref_rstd)])


def bn_forward_reference(x, vectors, training, momentum, eps, dtype, parameter_dtype, in_place):
    """(y, save_mean, save_invstd, running_mean, running_var) after two runs: the running statistics (when given)
    are updated by each run in training (rounded to their dtype in between); `in_place`: the second run reads the
    first's y. No samples: y empty, save_mean 0, save_invstd 1/sqrt(eps), the running statistics as they were."""
    weight, bias, running_mean, running_var = vectors
    if x.size == 0:
        channels = x.shape[1]
        return x, np.zeros(channels), np.full(channels, 1 / np.sqrt(eps)), running_mean, running_var
    first = batch_norm_forward_reference(x, weight, bias, running_mean, running_var, training, momentum, eps)
    if training and running_mean is not None:
        running_mean, running_var = rounded(first[3], parameter_dtype), rounded(first[4], parameter_dtype)
    source = rounded(first[0], dtype) if in_place else x
    second = batch_norm_forward_reference(source, weight, bias, running_mean, running_var, training, momentum, eps)
    updated = training and running_mean is not None
    return second[:3] + ((second[3], second[4]) if updated else (running_mean, running_var))


def bn_forward_case(runner, dtype, shape, rng, seed=False, training=True, running=True, saves=True, affine=True,
                    parameter_dtype=None, channels_last=False, step=1, in_place=False, momentum=0.1, eps=1e-5):
    """BatchNorm forward on (N, C, *spatial), run twice: the seed create (training, every tensor) or the Ex one
    (save_mean / save_invstd when `saves` in training; running statistics when `running`). `step`: per-channel
    vectors spaced that far apart; `in_place` (training without running statistics): y is x."""
    parameter_dtype = parameter_dtype or dtype
    channels = shape[1]
    x = rounded(rng.standard_normal(shape) * 1.5 + 0.3, dtype)
    vectors = [rounded(rng.standard_normal(channels), parameter_dtype) if affine else None,
               rounded(rng.standard_normal(channels), parameter_dtype) if affine else None,
               rounded(rng.normal(0.0, 0.5, channels), parameter_dtype) if running else None,
               rounded(rng.uniform(0.5, 2.0, channels), parameter_dtype) if running else None]
    refs = quiet(bn_forward_reference, x, vectors, training, momentum, eps, dtype, parameter_dtype, in_place)
    big = (lambda v: channels_last_copy(v, dtype)) if channels_last else (lambda v: device_copy(v, dtype))
    xd = big(x)
    y = xd if in_place else big(np.full(shape, SENTINEL))
    weight, bias, running_mean, running_var = (None if v is None else spaced_vector(v, v.dtype, step) for v in vectors)
    statistics = training and saves and not seed
    save_mean, save_invstd = (spaced_vector(np.full(channels, SENTINEL), statistic_dtype(dtype), step)
                              if statistics else None for _ in range(2))
    if seed:
        status = runner.run_arrays("BatchNorm", "infiniopCreateBatchNormDescriptor", "infiniopBatchNorm",
                                   [y, running_mean, running_var, xd, weight, bias], (momentum, eps))
    else:
        status = runner.run_arrays("BatchNorm", "infiniopCreateBatchNormDescriptorEx", "infiniopBatchNormEx",
                                   [y, save_mean, save_invstd, running_mean, running_var, xd, weight, bias],
                                   (int(training), momentum, eps))
    return forward_result(status, list(zip((y, save_mean, save_invstd, running_mean, running_var), refs)))


def case_adder(out, kind):
    """add(op, dtype_name, feature, run, expected=0), appending to `out` the case op-KIND/DTYPE/feature that runs
    run(runner, dtype, rng)."""
    def add(op, dtype_name, feature, run, expected=0):
        dtype = np.float64 if dtype_name == "F64" else DTYPES[dtype_name][0]
        out.append((f"{op}-{kind}/{dtype_name}/{feature}", lambda r, g, run=run, dtype=dtype: run(r, dtype, g),
                    expected))
    return add


def forward_cases():
    """(name, run, expected status) of the forwards on Ascend; names are op-fwd/DTYPE/feature."""
    out = []
    add = case_adder(out, "fwd")

    for name in DTYPES:
        add("rms", name, "seed-rank2", lambda r, d, g: rms_forward_case(r, d, (4, 40), 1, g, seed=True))
        add("rms", name, "seed-rank3", lambda r, d, g: rms_forward_case(r, d, (2, 3, 24), 1, g, seed=True))
        add("rms", name, "rstd", lambda r, d, g: rms_forward_case(r, d, (3, 5, 32), 1, g, eps=1e-3))
        add("rms", name, "no-rstd", lambda r, d, g: rms_forward_case(r, d, (4, 24), 1, g, rstd=False))
        add("rms", name, "rank1", lambda r, d, g: rms_forward_case(r, d, (48,), 1, g))
        add("rms", name, "rank4-k2", lambda r, d, g: rms_forward_case(r, d, (2, 3, 4, 8), 2, g, eps=0.0))
        add("rms", name, "rank4-strided", lambda r, d, g: rms_forward_case(r, d, (2, 3, 4, 16), 1, g, strided=True))
        add("rms", name, "in-place", lambda r, d, g: rms_forward_case(r, d, (3, 32), 1, g, in_place=True))
        add("rms", name, "no-rows", lambda r, d, g: rms_forward_case(r, d, (0, 16), 1, g))
        # Rows of zero length: rstd = NaN (0/0), written without aclnn (which refuses empty tensors): packed only.
        add("rms", name, "empty-rows", lambda r, d, g: rms_forward_case(r, d, (3, 0), 1, g))
        add("rms", name, "empty-rows-strided",
            lambda r, d, g: rms_forward_case(r, d, (2, 3, 0), 1, g, strided=True), BAD_TENSOR_STRIDES)

        add("ln", name, "seed", lambda r, d, g: ln_forward_case(r, d, (3, 5, 24), 1, g, seed=True))
        add("ln", name, "seed-rank2-no-bias", lambda r, d, g: ln_forward_case(r, d, (4, 40), 1, g, seed=True,
                                                                               bias=False))
        add("ln", name, "seed-no-statistics", lambda r, d, g: ln_forward_case(r, d, (4, 24), 1, g, seed=True,
                                                                               statistics=False))
        add("ln", name, "seed-in-place", lambda r, d, g: ln_forward_case(r, d, (2, 3, 24), 1, g, seed=True,
                                                                          in_place=True))
        add("ln", name, "seed-empty-rows", lambda r, d, g: ln_forward_case(r, d, (3, 0), 1, g, seed=True))
        add("ln", name, "ex", lambda r, d, g: ln_forward_case(r, d, (3, 5, 24), 1, g))
        add("ln", name, "ex-no-affine-no-statistics",
            lambda r, d, g: ln_forward_case(r, d, (4, 24), 1, g, weight=False, bias=False, statistics=False))
        add("ln", name, "ex-bias-only", lambda r, d, g: ln_forward_case(r, d, (4, 24), 1, g, weight=False))
        add("ln", name, "ex-rank1", lambda r, d, g: ln_forward_case(r, d, (40,), 1, g))
        add("ln", name, "ex-rank4-k2", lambda r, d, g: ln_forward_case(r, d, (2, 3, 4, 8), 2, g, eps=0.0))
        add("ln", name, "ex-rank5-strided", lambda r, d, g: ln_forward_case(r, d, (2, 3, 4, 2, 8), 2, g,
                                                                             strided=True))
        add("ln", name, "ex-in-place", lambda r, d, g: ln_forward_case(r, d, (3, 32), 1, g, in_place=True))
        add("ln", name, "ex-no-rows", lambda r, d, g: ln_forward_case(r, d, (0, 16), 1, g))
        add("ln", name, "ex-empty-rows", lambda r, d, g: ln_forward_case(r, d, (3, 0), 1, g))

        add("bn", name, "seed", lambda r, d, g: bn_forward_case(r, d, (4, 3, 10), g, seed=True))
        add("bn", name, "training", lambda r, d, g: bn_forward_case(r, d, (4, 3, 10), g, eps=1e-3))
        add("bn", name, "training-no-running", lambda r, d, g: bn_forward_case(r, d, (4, 3, 10), g, running=False))
        add("bn", name, "training-no-saves", lambda r, d, g: bn_forward_case(r, d, (4, 3, 10), g, saves=False))
        add("bn", name, "eval", lambda r, d, g: bn_forward_case(r, d, (4, 3, 10), g, training=False, eps=1e-3))
        add("bn", name, "no-affine", lambda r, d, g: bn_forward_case(r, d, (4, 3, 10), g, affine=False, eps=0.0))
        add("bn", name, "rank2", lambda r, d, g: bn_forward_case(r, d, (16, 5), g, momentum=0.3))
        add("bn", name, "rank4", lambda r, d, g: bn_forward_case(r, d, (2, 3, 4, 5), g))
        add("bn", name, "rank5", lambda r, d, g: bn_forward_case(r, d, (2, 3, 2, 3, 4), g))
        add("bn", name, "channels-last", lambda r, d, g: bn_forward_case(r, d, (2, 6, 3, 5), g, channels_last=True))
        add("bn", name, "channels-last-rank5-eval-no-affine",
            lambda r, d, g: bn_forward_case(r, d, (2, 4, 2, 3, 2), g, training=False, affine=False,
                                            channels_last=True))
        add("bn", name, "strided-vectors", lambda r, d, g: bn_forward_case(r, d, (3, 4, 5), g, step=3))
        add("bn", name, "in-place", lambda r, d, g: bn_forward_case(r, d, (4, 3, 10), g, running=False, in_place=True))
        # No samples: save_mean 0 and save_invstd 1/sqrt(eps) are written without aclnn: packed only.
        add("bn", name, "no-batch", lambda r, d, g: bn_forward_case(r, d, (0, 4, 5), g))
        add("bn", name, "no-batch-strided", lambda r, d, g: bn_forward_case(r, d, (0, 4, 5), g, step=2),
            BAD_TENSOR_STRIDES)

    for name in ("F16", "BF16"):  # F32 parameters with F16/BF16 data: in every table CANN documents
        add("rms", name, "f32-weight", lambda r, d, g: rms_forward_case(r, d, (3, 5, 32), 1, g,
                                                                       weight_dtype=np.float32))
        add("rms", name, "seed-f32-weight", lambda r, d, g: rms_forward_case(r, d, (4, 32), 1, g, seed=True,
                                                                            weight_dtype=np.float32))
        add("ln", name, "seed-f32-parameters", lambda r, d, g: ln_forward_case(r, d, (3, 5, 24), 1, g, seed=True,
                                                                              parameter_dtype=np.float32))
        add("ln", name, "ex-f32-parameters", lambda r, d, g: ln_forward_case(r, d, (3, 24), 1, g,
                                                                            parameter_dtype=np.float32))
        add("ln", name, "ex-f32-weight-only", lambda r, d, g: ln_forward_case(r, d, (3, 24), 1, g, bias=False,
                                                                             parameter_dtype=np.float32))
        add("bn", name, "f32-parameters", lambda r, d, g: bn_forward_case(r, d, (4, 3, 10), g,
                                                                         parameter_dtype=np.float32))
        add("bn", name, "f32-parameters-eval", lambda r, d, g: bn_forward_case(r, d, (4, 3, 10), g, training=False,
                                                                              parameter_dtype=np.float32))

    # CANN's norm kernels take no DOUBLE: F64 descriptors are NOT_IMPLEMENTED on Ascend (and only there).
    add("rms", "F64", "not-implemented", lambda r, d, g: rms_forward_case(r, d, (3, 16), 1, g), NOT_IMPLEMENTED)
    add("rms", "F64", "seed-not-implemented", lambda r, d, g: rms_forward_case(r, d, (3, 16), 1, g, seed=True),
        NOT_IMPLEMENTED)
    add("ln", "F64", "not-implemented", lambda r, d, g: ln_forward_case(r, d, (3, 16), 1, g), NOT_IMPLEMENTED)
    add("ln", "F64", "seed-not-implemented", lambda r, d, g: ln_forward_case(r, d, (3, 16), 1, g, seed=True),
        NOT_IMPLEMENTED)
    add("bn", "F64", "not-implemented", lambda r, d, g: bn_forward_case(r, d, (2, 3, 4), g), NOT_IMPLEMENTED)
    return out


def ex_cases():
    """(name, run, expected status) of the Ex features on Ascend; names are op-ex/DTYPE/feature."""
    out = []
    add = case_adder(out, "ex")

    for name in DTYPES:
        add("rms", name, "eps", lambda r, d, g: rms_ex_case(r, d, (3, 40), 1, g, eps=0.5))
        add("rms", name, "rstd", lambda r, d, g: rms_ex_case(r, d, (2, 3, 24), 1, g, rstd_eps=0.25))
        add("rms", name, "no-grad-w", lambda r, d, g: rms_ex_case(r, d, (4, 32), 1, g, grad_w=False))
        add("rms", name, "rank1", lambda r, d, g: rms_ex_case(r, d, (48,), 1, g, eps=1e-3))
        add("rms", name, "rank4-k2", lambda r, d, g: rms_ex_case(r, d, (2, 3, 4, 8), 2, g))
        add("rms", name, "no-rows", lambda r, d, g: rms_ex_case(r, d, (0, 16), 1, g))

        add("ln", name, "no-weight", lambda r, d, g: ln_ex_case(r, d, (3, 5, 24), 1, g, affine=False))
        add("ln", name, "no-grad-weight", lambda r, d, g: ln_ex_case(r, d, (4, 24), 1, g, grad_weight=False))
        add("ln", name, "no-grad-bias", lambda r, d, g: ln_ex_case(r, d, (4, 24), 1, g, grad_bias=False))
        add("ln", name, "grad-input-only", lambda r, d, g: ln_ex_case(r, d, (4, 24), 1, g, affine=False,
                                                                      grad_weight=False, grad_bias=False))
        add("ln", name, "rank1", lambda r, d, g: ln_ex_case(r, d, (40,), 1, g))
        add("ln", name, "rank4-k2", lambda r, d, g: ln_ex_case(r, d, (2, 3, 4, 8), 2, g))
        # Three leading dims that do not merge: an aclTensor view of rank 4.
        add("ln", name, "rank5-depth3", lambda r, d, g: ln_ex_case(r, d, (2, 3, 4, 2, 8), 2, g,
                                                                   strided=("grad_input", "grad_output", "xhat")))
        # Tensors whose leading dims merge differently (and std packed) must still be viewed with one shape.
        add("ln", name, "mixed-layouts", lambda r, d, g: ln_ex_case(r, d, (3, 4, 24), 1, g, strided=("grad_output",)))
        add("ln", name, "no-rows-no-grad-bias", lambda r, d, g: ln_ex_case(r, d, (0, 16), 1, g, grad_bias=False))

        add("ln", name, "from-input", lambda r, d, g: ln_from_input_case(r, d, (3, 5, 24), 1, g))
        add("ln", name, "from-input-rank4-k2-no-weight",
            lambda r, d, g: ln_from_input_case(r, d, (2, 3, 4, 8), 2, g, affine=False, grad_bias=False))
        add("ln", name, "from-input-strided",
            lambda r, d, g: ln_from_input_case(r, d, (2, 3, 4, 2, 8), 2, g, strided=("grad_input", "input")))
        add("ln", name, "from-input-no-rows", lambda r, d, g: ln_from_input_case(r, d, (0, 16), 1, g))
        add("bn", name, "reduce-phase", lambda r, d, g: bn_phase_case(r, d, (4, 3, 10), g), NOT_IMPLEMENTED)

        add("bn", name, "eps", lambda r, d, g: bn_ex_case(r, d, (4, 3, 10), g, eps=0.3))
        add("bn", name, "saved", lambda r, d, g: bn_ex_case(r, d, (4, 3, 10), g, eps=1e-3, saved=True))
        add("bn", name, "saved-eps", lambda r, d, g: bn_ex_case(r, d, (2, 5, 3, 4), g, eps=0.3, saved=True))
        add("bn", name, "eval", lambda r, d, g: bn_ex_case(r, d, (4, 3, 10), g, eps=1e-3, training=False))
        add("bn", name, "no-weight", lambda r, d, g: bn_ex_case(r, d, (4, 3, 10), g, affine=False))
        add("bn", name, "no-grad-weight", lambda r, d, g: bn_ex_case(r, d, (4, 3, 10), g, grad_weight=False))
        add("bn", name, "no-grad-bias", lambda r, d, g: bn_ex_case(r, d, (4, 3, 10), g, grad_bias=False))
        add("bn", name, "rank2", lambda r, d, g: bn_ex_case(r, d, (16, 5), g, eps=1e-2))
        add("bn", name, "rank4", lambda r, d, g: bn_ex_case(r, d, (2, 3, 4, 5), g))
        add("bn", name, "rank5", lambda r, d, g: bn_ex_case(r, d, (2, 3, 2, 3, 4), g))
        add("bn", name, "channels-last", lambda r, d, g: bn_ex_case(r, d, (2, 6, 3, 5), g, channels_last=True))
        add("bn", name, "channels-last-rank5-eval-no-weight",
            lambda r, d, g: bn_ex_case(r, d, (2, 4, 2, 3, 2), g, eps=1e-3, training=False, affine=False,
                                       grad_bias=False, channels_last=True))
        add("bn", name, "no-batch-no-grad-weight", lambda r, d, g: bn_ex_case(r, d, (0, 4, 5), g, grad_weight=False))

    for name in ("F16", "BF16"):  # F32 parameters with F16/BF16 data: in every table CANN documents
        add("rms", name, "f32-weight", lambda r, d, g: rms_ex_case(r, d, (3, 5, 32), 1, g, weight_dtype=np.float32))
        add("rms", name, "f32-weight-no-grad-w",
            lambda r, d, g: rms_ex_case(r, d, (3, 32), 1, g, weight_dtype=np.float32, grad_w=False))
        add("rms", name, "f32-weight-no-rows",
            lambda r, d, g: rms_ex_case(r, d, (0, 16), 1, g, weight_dtype=np.float32))
        add("ln", name, "f32-parameters", lambda r, d, g: ln_ex_case(r, d, (3, 5, 24), 1, g,
                                                                     parameter_dtype=np.float32))
        # No weight: CANN's gradients take weightOptional's dtype, so an F32 ones constant is passed.
        add("ln", name, "f32-parameters-no-weight",
            lambda r, d, g: ln_ex_case(r, d, (3, 24), 1, g, parameter_dtype=np.float32, affine=False))
        add("ln", name, "from-input-f32-parameters",
            lambda r, d, g: ln_from_input_case(r, d, (3, 5, 24), 1, g, parameter_dtype=np.float32))
        add("ln", name, "f32-parameters-no-rows",
            lambda r, d, g: ln_ex_case(r, d, (0, 16), 1, g, parameter_dtype=np.float32))
        add("bn", name, "f32-parameters", lambda r, d, g: bn_ex_case(r, d, (4, 3, 10), g, eps=0.3,
                                                                     parameter_dtype=np.float32))
        add("bn", name, "f32-parameters-eval",
            lambda r, d, g: bn_ex_case(r, d, (4, 3, 10), g, eps=1e-3, training=False, parameter_dtype=np.float32))
        add("bn", name, "f32-parameters-no-batch",
            lambda r, d, g: bn_ex_case(r, d, (0, 3, 10), g, parameter_dtype=np.float32))

    # CANN's norm kernels take no DOUBLE: F64 descriptors are NOT_IMPLEMENTED on Ascend (and only there).
    add("rms", "F64", "not-implemented", lambda r, d, g: rms_ex_case(r, d, (3, 16), 1, g, rstd_eps=0.0),
        NOT_IMPLEMENTED)
    add("ln", "F64", "not-implemented", lambda r, d, g: ln_ex_case(r, d, (3, 16), 1, g), NOT_IMPLEMENTED)
    add("ln", "F64", "from-input-not-implemented", lambda r, d, g: ln_from_input_case(r, d, (3, 16), 1, g),
        NOT_IMPLEMENTED)
    add("bn", "F64", "not-implemented", lambda r, d, g: bn_ex_case(r, d, (2, 3, 4), g, saved=True), NOT_IMPLEMENTED)
    return out


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
    return out + ex_cases() + forward_cases()


# A few cases of each operator, run again in the client situations of context_results.
CONTEXT_CASES = ("rms/F32/(3, 5, 64)", "ln/F16/(3, 5, 64)", "bn/BF16/(4, 6, 9)", "ln-ex/F32/from-input",
                 "ln-ex/BF16/f32-parameters-no-weight", "bn-ex/F16/f32-parameters", "rms-ex/BF16/f32-weight",
                 "rms-fwd/F32/rstd", "ln-fwd/F16/seed", "ln-fwd/BF16/ex-f32-parameters", "bn-fwd/BF16/training",
                 "bn-fwd/F16/f32-parameters")


def context_results(lib, rng, devices):
    """CONTEXT_CASES on the default stream, from a thread that never selected a device, and (with two devices)
    on device 1's buffers while the calling thread has device 0 selected; names are situation:case. Also which
    devices CANN had current after each call of the last (only the caller's own, 0)."""
    table = {name: run for name, run, _ in cases()}
    situations = {"default-stream": Runner(lib), "new-thread": Runner(lib, threaded=True)}
    if devices > 1:
        situations["other-device"] = Runner(lib, device_id=1, current=0, staged=True)
    out = {}
    for situation, runner in situations.items():
        for name in CONTEXT_CASES:
            out[f"{situation}:{name}"] = table[name](runner, rng)
    if devices > 1:
        out["other-device:devices-seen"] = sorted(situations["other-device"].devices_seen)
    return out


def tiling_results(runner, rng):
    """Statuses of descriptors whose reduced length the emulated kernels' tiling refuses (561002)."""
    os.environ["ASCEND_EMULATION_TILING_MAX_COLS"] = "32"  # read by the emulation at each first phase
    try:
        return {"tiling:rms": rms_case(runner, "F32", (2, 37), rng)["status"],
                "tiling:ln": ln_case(runner, "F32", (3, 5, 64), rng)["status"],
                "tiling:bn": bn_case(runner, "F32", (4, 6, 9), rng)["status"],
                "tiling:rms-fwd": rms_forward_case(runner, np.float32, (2, 37), 1, rng)["status"],
                "tiling:ln-fwd": ln_forward_case(runner, np.float32, (3, 64), 1, rng)["status"],
                "tiling:bn-fwd": bn_forward_case(runner, np.float32, (4, 6, 9), rng)["status"]}
    finally:
        del os.environ["ASCEND_EMULATION_TILING_MAX_COLS"]


def main():
    """argv: the directory of libinfiniop / libinfinirt, then optionally the case names to run (default all)."""
    lib = load(sys.argv[1])
    wanted = set(sys.argv[2:])
    results = {}
    count = ffi.new("int*")
    results["device_count"] = [lib.infinirtGetDeviceCount(ASCEND, count), count[0]]
    results["set_device_out_of_range"] = lib.infinirtSetDevice(ASCEND, count[0]) if count[0] > 0 else None
    results["set_device"] = lib.infinirtSetDevice(ASCEND, 0)
    if results["set_device"] == 0:
        results["runtime"] = runtime_case(lib)
        stream = ffi.new("void**")
        assert lib.infinirtStreamCreate(stream) == 0
        runner = Runner(lib, stream[0])
        rng = np.random.default_rng(0)
        for name, run, _ in cases():
            if not wanted or name in wanted:
                results[name] = run(runner, rng)
        if not wanted:
            results.update(context_results(lib, rng, count[0]))
            results.update(tiling_results(runner, rng))
        assert lib.infinirtStreamDestroy(stream[0]) == 0
    print(json.dumps(results))


if __name__ == "__main__":
    main()
