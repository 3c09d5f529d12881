"""The NVIDIA backend against a float64 reference, through the C ABI (the package's cdef and libraries; device
memory from our own infinirt), so it needs no torch: the kernel paths (rows long enough to split in chunks,
misaligned and strided buffers, determinism, a created stream). The whole package suite runs on the GPU too,
through its `device` parameter (_devices.py). Skips, saying why, unless the libraries report an NVIDIA device."""
import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

pytestmark = pytest.mark.nvidia  # in the GPU subset (`-m nvidia`) with the device parameter's cases

from infiniop_py._ffi import ffi, libraries  # noqa: E402  the package's libraries and cdef

NVIDIA = 1
H2D, D2H = 1, 2
DTYPES = {np.dtype(np.float32): 13, np.dtype(np.float16): 12, np.dtype(ml_dtypes.bfloat16): 19}
TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 2e-3, np.dtype(ml_dtypes.bfloat16): 1.6e-2}


def _load():
    rt, op = libraries().rt, libraries().op
    count = ffi.new("int*")
    status = rt.infinirtGetDeviceCount(NVIDIA, count)
    if status != 0 or count[0] < 1:
        pytest.skip(f"no NVIDIA device (infinirtGetDeviceCount status {status}, count {count[0]}); "
                    "build with --nv-gpu=y and run on a GPU machine", allow_module_level=True)
    assert rt.infinirtSetDevice(NVIDIA, 0) == 0
    return rt, op


rt, op = _load()
_handle = ffi.new("infiniopHandle_t*")
assert op.infiniopCreateHandle(_handle) == 0
HANDLE = _handle[0]
assert rt.infinirtSetDevice(0, 0) == 0  # collection must leave the CPU current for the other modules


@pytest.fixture(autouse=True)
def nvidia_current():
    """infinirtMalloc allocates on the current device: NVIDIA for these tests, the CPU again after each."""
    assert rt.infinirtSetDevice(NVIDIA, 0) == 0
    yield
    assert rt.infinirtSetDevice(0, 0) == 0


class DeviceArray:
    """A device copy of a host view: the whole base buffer is copied, so strides and offsets are kept."""

    def __init__(self, host, pad=0):
        self.host = host
        base = host if host.base is None else host.base
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        self.base = np.ascontiguousarray(base).view(np.uint8).reshape(-1)
        ptr = ffi.new("void**")
        assert rt.infinirtMalloc(ptr, self.base.nbytes + 64) == 0
        self.alloc = ptr[0]
        self.shift = pad  # bytes: lets a test misalign the whole buffer
        rt.infinirtMemcpy(self.device_base(), ffi.cast("void*", self.base.ctypes.data), self.base.nbytes, H2D)
        self.offset = host.__array_interface__["data"][0] - self.base.ctypes.data

    def device_base(self):
        return ffi.cast("char*", self.alloc) + self.shift

    def ptr(self):
        return ffi.cast("void*", self.device_base() + self.offset)

    def fetch(self):
        out = np.empty_like(self.base)
        rt.infinirtMemcpy(ffi.cast("void*", out.ctypes.data), self.device_base(), out.nbytes, D2H)
        view = np.lib.stride_tricks.as_strided(out[self.offset:].view(self.host.dtype), self.host.shape, self.host.strides)
        return view.copy()

    def free(self):
        rt.infinirtFree(self.alloc)


def descriptor(a):
    d = ffi.new("infiniopTensorDescriptor_t *")
    strides = [s // a.itemsize for s in a.strides]
    assert op.infiniopCreateTensorDescriptor(d, a.ndim, list(a.shape), strides, DTYPES[a.dtype]) == 0
    return d[0]


def run(name, outs, ins, pad=0, stream=ffi.NULL, repeat=1, aliases=None):
    """Runs op `name` on device copies; aliases maps an output index to an input index that shares it."""
    d = ffi.new("infiniopDescriptor_t *")
    tensors = [descriptor(a) for a in outs + ins]
    assert getattr(op, f"infiniopCreate{name}BackwardDescriptor")(HANDLE, d, *tensors) == 0
    for t in tensors:
        op.infiniopDestroyTensorDescriptor(t)  # the op descriptor keeps what it needs
    size = ffi.new("size_t*")
    getattr(op, f"infiniopGet{name}BackwardWorkspaceSize")(d[0], size)
    ws = ffi.new("void**")
    assert rt.infinirtMalloc(ws, max(size[0], 1)) == 0
    dev_in = [DeviceArray(a, pad) for a in ins]
    dev_out = [dev_in[aliases[i]] if aliases and i in aliases else DeviceArray(a, pad) for i, a in enumerate(outs)]
    results = []
    for _ in range(repeat):
        status = getattr(op, f"infiniop{name}Backward")(d[0], ws[0], size[0], *[x.ptr() for x in dev_out + dev_in], stream)
        assert status == 0, status
        if stream != ffi.NULL:
            assert rt.infinirtStreamSynchronize(stream) == 0
        results.append([x.fetch() for x in dev_out])
    for x in {id(x): x for x in dev_in + dev_out}.values():
        x.free()
    rt.infinirtFree(ws[0])
    getattr(op, f"infiniopDestroy{name}BackwardDescriptor")(d[0])
    return results if repeat > 1 else results[0]


def rel_err(a, ref, terms=0.0):
    """max|a - ref| over the scale: max|ref|, or ``terms``, the size of the terms that cancel in ref where that is
    larger (a row of one element: grad_x is exactly 0, and any F32 kernel leaves rounding noise of that size)."""
    scale = max(np.abs(ref).max(), terms, 1e-30)
    return np.abs(a.astype(np.float64) - ref).max() / scale


rng = np.random.default_rng(0)


def rms_case(dt, shape):
    gy, x = (rng.standard_normal(shape).astype(dt) for _ in range(2))
    w = rng.standard_normal(shape[-1]).astype(dt)
    G, X, W = (a.astype(np.float64) for a in (gy, x, w))
    r = 1 / np.sqrt((X * X).mean(-1, keepdims=True))
    ref_gx = r * G * W - r**3 * X * (G * W * X).sum(-1, keepdims=True) / shape[-1]
    ref_gw = (G * X * r).reshape(-1, shape[-1]).sum(0)
    gx_terms = np.abs(r * G * W).max()  # the size of the terms that cancel in grad_x (see rel_err)
    return (gy, x, w), (ref_gx, ref_gw, gx_terms)


@pytest.mark.parametrize("dt", list(DTYPES))
# (2, (3 << 16) + 8): rows split in 49 chunks, more than the 32 lanes of the warp that adds a row's chunk sums, the
# last chunk partial. 2^20 took 4.6x the time on the CUDA emulation (uninstrumented) and covered no other path.
@pytest.mark.parametrize("shape", [(2, 3, 1), (4, 33, 100), (300, 1000), (64, 4096), (3, 5, 8192), (4, 12289),
                                   (2, (3 << 16) + 8), (5000, 64)])
def test_rms_norm(dt, shape):
    (gy, x, w), (ref_gx, ref_gw, gx_terms) = rms_case(dt, shape)
    gx, gw = run("RMSNorm", [np.empty_like(gy), np.empty(shape[-1], dt)], [gy, x, w])
    assert rel_err(gx, ref_gx, gx_terms) < TOLERANCE[np.dtype(dt)]
    assert rel_err(gw, ref_gw) < TOLERANCE[np.dtype(dt)]


@pytest.mark.parametrize("pad", [0, 2, 4])  # misaligned buffers take the scalar path
def test_rms_norm_strided_inplace_misaligned(pad):
    dt = np.float16
    big = rng.standard_normal((6, 7, 520)).astype(dt)
    gy = big[::-2, :, 3:515]  # negative leading stride, row starts off the vector grid
    x = rng.standard_normal(gy.shape).astype(dt)
    w_big = rng.standard_normal(512 * 3).astype(dt)
    w = w_big[::3]
    G, X, W = (a.astype(np.float64) for a in (gy, x, w))
    r = 1 / np.sqrt((X * X).mean(-1, keepdims=True))
    ref_gx = r * G * W - r**3 * X * (G * W * X).sum(-1, keepdims=True) / 512
    ref_gw = (G * X * r).reshape(-1, 512).sum(0)
    gx_host = gy  # in place: grad_x is grad_y
    gx, gw = run("RMSNorm", [gx_host, np.empty(512, dt)], [gy, x, w], pad=pad, aliases={0: 0})
    assert rel_err(gx, ref_gx) < 2e-3 and rel_err(gw, ref_gw) < 2e-3


def test_rms_norm_deterministic_and_zero_rows():
    (gy, x, w), _ = rms_case(np.float32, (1024, 2048))  # a CTA's partial row for each of hundreds of CTAs on a GPU
    x[7] = 0  # a row of zeros: inf/nan in that row, nothing traps
    runs = run("RMSNorm", [np.empty_like(gy), np.empty(2048, np.float32)], [gy, x, w], repeat=3)
    for gx, gw in runs[1:]:
        assert np.array_equal(gx, runs[0][0], equal_nan=True) and np.array_equal(gw, runs[0][1], equal_nan=True)
    assert not np.isfinite(runs[0][0][7]).all() and np.isfinite(runs[0][0][8]).all()


@pytest.mark.parametrize("dt", list(DTYPES))
# (300, 8192): dozens of rows a CTA in the emulation (8 resident CTAs), in a third of the time (1024, 8192) took.
@pytest.mark.parametrize("shape", [(4, 75, 1000), (2, 7), (16, 12289), (300, 8192)])
def test_layer_norm(dt, shape):
    L = shape[-1]
    x0 = rng.standard_normal(shape)
    mu = x0.mean(-1, keepdims=True)
    sd = np.sqrt(x0.var(-1, keepdims=True) + 1e-5)
    xh, std = ((x0 - mu) / sd).astype(dt), sd[..., 0].astype(dt)
    go, wt = rng.standard_normal(shape).astype(dt), rng.standard_normal(L).astype(dt)
    gi, gw, gb = run("LayerNorm", [np.empty_like(go), np.empty(L, dt), np.empty(L, dt)], [go, wt, xh, std])
    GO, WT, XH, SD = (a.astype(np.float64) for a in (go, wt, xh, std))
    g = GO * WT
    ref = (g - g.mean(-1, keepdims=True) - XH * (g * XH).mean(-1, keepdims=True)) / SD[..., None]
    tol = TOLERANCE[np.dtype(dt)]
    assert rel_err(gi, ref) < tol
    assert rel_err(gw, (GO * XH).reshape(-1, L).sum(0)) < tol
    assert rel_err(gb, GO.reshape(-1, L).sum(0)) < tol


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("shape", [(16, 8, 3000), (4096, 64, 1), (2, 3, 7), (1, 4, 1 << 20)])
def test_batch_norm(dt, shape):
    N, C, L = shape
    xi, go = (rng.standard_normal(shape).astype(dt) for _ in range(2))
    wt = rng.standard_normal(C).astype(dt)
    XI = xi.astype(np.float64)
    mean, var = XI.mean((0, 2)).astype(dt), XI.var((0, 2)).astype(dt)
    gi, gw, gb = run("BatchNorm", [np.empty_like(go), np.empty(C, dt), np.empty(C, dt)], [xi, go, wt, mean, var])
    GO, WT = go.astype(np.float64), wt.astype(np.float64)[None, :, None]
    M, V = mean.astype(np.float64)[None, :, None], var.astype(np.float64)[None, :, None]
    inv = 1 / np.sqrt(V)
    xhat, cnt = (XI - M) * inv, N * L
    ref = WT * inv * (GO - GO.sum((0, 2), keepdims=True) / cnt - xhat * (GO * xhat).sum((0, 2), keepdims=True) / cnt)
    tol = TOLERANCE[np.dtype(dt)]
    assert rel_err(gi, ref) < tol
    assert rel_err(gw, (GO * xhat).sum((0, 2))) < tol
    assert rel_err(gb, GO.sum((0, 2))) < tol


def test_on_a_created_stream():
    s = ffi.new("void**")
    assert rt.infinirtStreamCreate(s) == 0
    (gy, x, w), (ref_gx, *_) = rms_case(np.float32, (128, 512))
    gx, _ = run("RMSNorm", [np.empty_like(gy), np.empty(512, np.float32)], [gy, x, w], stream=s[0])
    assert rel_err(gx, ref_gx) < 1e-5
    rt.infinirtStreamDestroy(s[0])
