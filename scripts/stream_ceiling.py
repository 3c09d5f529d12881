#!/usr/bin/env python3
"""What the benchmark's copy reference is worth: torch's copy_ against plain streaming loops, in the same rounds.

The benchmark sets each operator against a torch copy_ of 256 MiB. This times, in interleaved rounds, that copy
and three OpenMP loops over the same amount of memory: a copy with ordinary stores (each store first reads the
line it writes), a copy with non-temporal stores (no such read), and the operators' own traffic, two streams
read and one written with non-temporal stores. Bandwidth counts the bytes read and written once, as the
benchmark does. x86-64 only (SSE2 streaming stores); compiles its loops with $CC (default cc) and OpenMP.

    python scripts/stream_ceiling.py [--rounds 30] [--mib 256]
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from infiniop_py.bench.timing import machine_description

C_SOURCE = r"""
#include <emmintrin.h>
#include <stddef.h>
// n: floats, a multiple of 4; arrays 16-byte aligned.
void copy_cached(const float *in, float *out, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += 4) _mm_store_ps(out + i, _mm_load_ps(in + i));
}
void copy_streamed(const float *in, float *out, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += 4) _mm_stream_ps(out + i, _mm_load_ps(in + i));
    _mm_sfence();
}
void two_in_one_out_streamed(const float *a, const float *b, float *out, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += 4) _mm_stream_ps(out + i, _mm_sub_ps(_mm_load_ps(a + i), _mm_load_ps(b + i)));
    _mm_sfence();
}
"""
C_DECLARATIONS = """
void copy_cached(const float *in, float *out, size_t n);
void copy_streamed(const float *in, float *out, size_t n);
void two_in_one_out_streamed(const float *a, const float *b, float *out, size_t n);
"""


def build_loops(directory):
    """(ffi, library) of the loops, compiled with $CC (default cc) into a shared library in directory."""
    import cffi

    source, library = os.path.join(directory, "stream_loops.c"), os.path.join(directory, "libstream_loops.so")
    with open(source, "w") as file:
        file.write(C_SOURCE)
    compiler = os.environ.get("CC", "cc")
    subprocess.run([compiler, "-O2", "-fopenmp", "-shared", "-fPIC", source, "-o", library], check=True)
    ffi = cffi.FFI()
    ffi.cdef(C_DECLARATIONS)
    return ffi, ffi.dlopen(library)


def seconds(call):
    call()  # untimed first: the timed call finds the same cache state as every other one
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--mib", type=int, default=256, help="bytes copied per copy (the benchmark's: 256)")
    args = parser.parse_args(argv)
    if platform.machine() not in ("x86_64", "AMD64"):
        print("stream_ceiling: x86-64 only (SSE2 streaming stores)", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    floats = args.mib << 18  # a copy moves mib MiB in and mib MiB out
    source, target = torch.ones(floats), torch.empty(floats)
    per_stream = 2 * floats // 3 // 4 * 4  # two in, one out: the bytes the copy moves, as three streams
    a, b, out = torch.ones(per_stream), torch.ones(per_stream), torch.empty(per_stream)
    with tempfile.TemporaryDirectory() as directory:
        ffi, lib = build_loops(directory)
        pointer = lambda tensor: ffi.cast("float *", tensor.data_ptr())  # noqa: E731
        copy_bytes, three_bytes = 2 * floats * 4, 3 * a.numel() * 4
        loops = {
            "torch copy_": (lambda: target.copy_(source), copy_bytes),
            "copy, cached stores": (lambda: lib.copy_cached(pointer(source), pointer(target), floats), copy_bytes),
            "copy, streamed stores": (lambda: lib.copy_streamed(pointer(source), pointer(target), floats), copy_bytes),
            "2 in + 1 out, streamed": (lambda: lib.two_in_one_out_streamed(pointer(a), pointer(b), pointer(out),
                                                                           a.numel()), three_bytes),
        }
        rates = {name: [] for name in loops}
        for _ in range(args.rounds):
            for name, (call, moved) in loops.items():
                rates[name].append(moved / seconds(call) / 1e9)
    print(f"machine: {machine_description()}; threads: {torch.get_num_threads()}; {args.rounds} interleaved rounds")
    print("GB/s counts the bytes read and written once, as the benchmark does")
    print(f"{'loop':<24} {'median':>7} {'min':>6} {'max':>6} {'/ torch copy_ (median of rounds)':>34}")
    for name, values in rates.items():
        ratio = statistics.median(v / c for v, c in zip(values, rates["torch copy_"]))
        print(f"{name:<24} {statistics.median(values):7.1f} {min(values):6.1f} {max(values):6.1f} {ratio:34.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
