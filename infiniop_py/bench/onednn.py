"""oneDNN as a second reference for `infiniop-py bench`: its layer_normalization and batch_normalization,
backward and (with --forward) training forward, on the same buffers and threads as ours (oneDNN has no RMSNorm
in the release on PyPI). onednn_timer.cpp is compiled on first use against an installed oneDNN (`pip install
'infiniop-py[onednn]'`, or $DNNLROOT) and cached; where that cannot be done, `available()` says why and the
benchmark leaves the column empty."""

import functools
import hashlib
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from .._compiled_helpers import cache_dir, compile_to

SOURCE = Path(__file__).with_name("onednn_timer.cpp")
DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
CDEF = """
void *onednn_create(int kind, int dtype, int64_t a, int64_t b, int64_t c, float eps, void *src, void *diff_dst,
                    float *mean, float *variance, float *scale, void *diff_src, float *diff_scale, float *diff_shift,
                    char *error, size_t error_size);
void *onednn_create_forward(int kind, int dtype, int64_t a, int64_t b, int64_t c, float eps, void *src, void *dst,
                            float *mean, float *variance, float *scale, float *shift, char *error,
                            size_t error_size);
int onednn_run(void *handle, char *error, size_t error_size);
void onednn_destroy(void *handle);
void onednn_version(int *major, int *minor, int *patch);
"""


class Unavailable(Exception):
    """oneDNN cannot be used here; the message says why and how to get it."""


def _roots():
    """Where an installed oneDNN may lie: $DNNLROOT, then this environment's prefix (the PyPI wheels put
    lib/libdnnl.so and include/oneapi/dnnl/ there)."""
    configured = os.environ.get("DNNLROOT")
    return ([Path(configured)] if configured else []) + [Path(sys.prefix)]


def _find_root():
    for root in _roots():
        if (root / "include" / "oneapi" / "dnnl" / "dnnl.hpp").is_file() and any((root / "lib").glob("libdnnl.so*")):
            return root
    tried = ", ".join(str(r) for r in _roots())
    raise Unavailable(f"oneDNN not found (looked in {tried}): pip install 'infiniop-py[onednn]' "
                      "(onednn-cpu-gomp and onednn-devel-cpu-gomp) or set DNNLROOT")


@functools.lru_cache(maxsize=None)
def library():
    """The compiled helper loaded with cffi (compiled once per oneDNN install and helper source); Unavailable if
    oneDNN or a C++ compiler is missing or the build fails."""
    import cffi

    root = _find_root()
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise Unavailable(f"no C++ compiler ({compiler}) to build the oneDNN timing helper")
    key = hashlib.sha256(SOURCE.read_bytes() + str(root.resolve()).encode()).hexdigest()[:16]
    target = cache_dir() / f"onednn_timer-{key}.so"
    if not target.is_file():
        command = [compiler, "-std=c++17", "-O2", "-shared", "-fPIC", str(SOURCE), f"-I{root / 'include'}",
                   f"-L{root / 'lib'}", "-ldnnl", f"-Wl,-rpath,{root / 'lib'}"]
        try:
            compile_to(target, command)
        except RuntimeError as why:
            raise Unavailable(f"building the oneDNN timing helper failed: {why}") from None
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return ffi, ffi.dlopen(str(target))


def available():
    """(True, "oneDNN X.Y.Z") or (False, why not)."""
    try:
        ffi, lib = library()
    except Unavailable as why:
        return False, str(why)
    parts = ffi.new("int[3]")
    lib.onednn_version(parts, parts + 1, parts + 2)
    return True, f"oneDNN {parts[0]}.{parts[1]}.{parts[2]}"


class _Primitive:
    """A created oneDNN primitive bound to arrays that it keeps alive; call() runs it, close() frees it."""

    def __init__(self, create, arrays, what):
        ffi, lib = library()
        self._ffi, self._lib, self._arrays, self._error = ffi, lib, arrays, ffi.new("char[512]")
        error = ffi.new("char[512]")
        self._handle = create(ffi, lib, error)
        if self._handle == ffi.NULL:
            raise Unavailable(f"oneDNN {what}: {ffi.string(error).decode()}")

    def __call__(self):
        if self._lib.onednn_run(self._handle, self._error, 512) != 0:
            raise RuntimeError(f"oneDNN execute failed: {self._ffi.string(self._error).decode()}")

    def close(self):
        if getattr(self, "_handle", None) is not None:
            self._lib.onednn_destroy(self._handle)
            self._handle = None

    def __del__(self):
        self.close()


_KINDS = {"layer_norm": 0, "batch_norm": 1}


def _pointers(ffi, dims, **f32_arrays):
    """(padded dims, a void* maker, a float* maker), after checking that the F32 arrays are contiguous F32."""
    for name, array in f32_arrays.items():
        if array.dtype != np.float32 or not array.flags.c_contiguous:
            raise ValueError(f"{name} must be a contiguous float32 array")
    pointer = lambda array: ffi.cast("void *", array.ctypes.data)  # noqa: E731
    floats = lambda array: ffi.cast("float *", array.ctypes.data)  # noqa: E731
    return (list(dims) + [1])[:3], pointer, floats


class Reference(_Primitive):
    """One oneDNN backward primitive bound to the given arrays; call() runs it. Arrays: src, diff_dst (the
    case's dtype), mean, variance, scale (F32), outputs diff_src (dtype), diff_scale, diff_shift (F32). They must
    outlive the reference (it keeps them). Unavailable if oneDNN has no kernel for this dtype here."""

    def __init__(self, kind, dtype, dims, eps, src, diff_dst, mean, variance, scale, diff_src, diff_scale,
                 diff_shift):
        def create(ffi, lib, error):
            padded, pointer, floats = _pointers(ffi, dims, mean=mean, variance=variance, scale=scale,
                                                diff_scale=diff_scale, diff_shift=diff_shift)
            return lib.onednn_create(_KINDS[kind], DTYPE_CODES[dtype], *padded, eps, pointer(src), pointer(diff_dst),
                                     floats(mean), floats(variance), floats(scale), pointer(diff_src),
                                     floats(diff_scale), floats(diff_shift), error, 512)
        super().__init__(create, (src, diff_dst, mean, variance, scale, diff_src, diff_scale, diff_shift),
                         f"{kind} backward {dtype}")


class ForwardReference(_Primitive):
    """One oneDNN training-forward primitive: dst (the case's dtype) from src (dtype), scale and shift (F32),
    writing mean and variance (F32, biased: oneDNN's training forward's statistics). The arrays must outlive the
    reference. Unavailable if oneDNN has no kernel for this dtype here."""

    def __init__(self, kind, dtype, dims, eps, src, dst, mean, variance, scale, shift):
        def create(ffi, lib, error):
            padded, pointer, floats = _pointers(ffi, dims, mean=mean, variance=variance, scale=scale, shift=shift)
            return lib.onednn_create_forward(_KINDS[kind], DTYPE_CODES[dtype], *padded, eps, pointer(src),
                                             pointer(dst), floats(mean), floats(variance), floats(scale),
                                             floats(shift), error, 512)
        super().__init__(create, (src, dst, mean, variance, scale, shift), f"{kind} forward {dtype}")
