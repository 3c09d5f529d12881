"""Host arrays the functional API allocates as outputs.

numpy's large arrays start 16 bytes into a page, so every 64-byte vector store of the CPU kernels would split
across two cache lines. Large outputs therefore start on a 64-byte boundary, as torch's do: an output at
numpy's offset measured 5-20% slower for F32 RMSNorm and BatchNorm outputs of 32-64 MiB (docs/performance.md).
Small ones stay plain numpy arrays: there the kernel runs from cache and the extra steps would cost more than
they save.
"""

import functools
import math

import numpy as np

ALIGNMENT = 64  # bytes: one cache line, one AVX-512 vector
ALIGNED_FROM_BYTES = 1 << 20


def allocator(shape, dtype):
    """A function of no arguments that returns a new C-contiguous, writeable, uninitialized array of this shape
    and dtype, ALIGNMENT-aligned from ALIGNED_FROM_BYTES up. Made once per layout by the functional fast path,
    so that a small output costs one np.empty call."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < ALIGNED_FROM_BYTES:
        return functools.partial(np.empty, shape, dtype)
    return functools.partial(_aligned_empty, shape, dtype, nbytes)


def aligned_empty(shape, dtype):
    """A new C-contiguous, uninitialized array starting on an ALIGNMENT-byte boundary, whatever its size."""
    dtype = np.dtype(dtype)
    return _aligned_empty(shape, dtype, math.prod(shape) * dtype.itemsize)


def empty(shape, dtype):
    """One array as allocator(shape, dtype) makes it."""
    return allocator(shape, dtype)()


def _aligned_empty(shape, dtype, nbytes):
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)
