// Issue 53's A/B experiment: RMSNorm backward on 16-bit rows, the library's kernels (through the public C API)
// against candidate kernel designs and an eager device-to-device copy, on one GPU in about a minute. Not part of
// the library and not a product flag: it measures which design the library's row kernel should take.
//
// Run `bash scripts/gpu_variants.sh [DIR]` (also the `variants` step of scripts/verify_gpu.sh). By hand, from the
// repository root, once the libraries are built in place with CUDA (INFINIOP_PY_CUDA=1 python3 setup.py
// build_ext --inplace), and L=$PWD/infiniop_py/lib:
//   nvcc -std=c++17 -O3 -arch=sm_90 -Inative/include -Xptxas -v -o /tmp/rbv
//        scripts/gpu_variants/row_backward_variants.cu -L$L -linfiniop -linfinirt -Xlinker -rpath,$L
//   /tmp/rbv DIR [--shapes 8192x8192,...] [--impls library,cta8,...] [--dtypes bf16,f16] [--rounds 20]
// (--impls: name prefixes, the copy always runs; --rounds 0: the checks alone, no timing.)
//
// One row per (shape, implementation): ms per call (median over graph replays of 10 calls; the implementations of a
// shape alternate, so drift hits all alike), the fraction of copy bandwidth (bytes = 3*rows*D*2 over the eager
// copy's GB/s), the largest errors against a float64 host reference, and whether a second run (a graph replay)
// gave the same bits. Phase 1 runs every shape with the plain variants, phase 2 again with those using cp.async or
// clusters, so that a fault there cannot cost the rest; the library runs in both (their difference is the noise).
// DIR/variants.csv gets the rows after each shape; a summary ends the output. Exit status 0: every check passed.
// Seed semantics (docs: design.md), epsilon 0 as the seed API has none:
//   r = 1/sqrt(mean(x^2) + eps); grad_x = r*w*gy - x*r^3*mean(gy*w*x); grad_w = sum over rows of gy*x*r.
//
// The variants (sums in F32; persistent grids of one wave, each CTA or cluster owning a contiguous range of rows;
// grad_w partials per thread in registers, written once per CTA and summed in a fixed order by sumPartialsKernel:
// no atomics, so the bits do not depend on timing):
//   warpE   a warp per row (D <= 32*E), no CTA barrier per row; E elements per lane kept as packed 16-bit values.
//   ctaE    a CTA per row, E = 8 or 16 elements per thread; the two row sums meet in one barrier per row (their
//           shared slots alternate between rows, so the next row needs no second barrier). ctaEp: the next row's
//           raw values are loaded before this row's barrier (register double buffering). ctaEaS: a ring of S rows in
//           shared memory filled by cp.async, S-1 rows ahead (more bytes in flight per SM, no registers for them).
//   cluCxN  a cluster of C CTAs of N threads per row (sm_90), 8 elements per thread, prefetching; the C CTAs' row
//           sums meet through distributed shared memory in one cluster barrier per row.
#include "infiniop.h"
#include "infinirt.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace cg = cooperative_groups;

// Every CUDA and library call is checked; a failure names the call and its line.
static void check(cudaError_t code, const char *call, int line) {
    if (code != cudaSuccess)
        throw std::runtime_error("line " + std::to_string(line) + ": " + call + ": " + cudaGetErrorString(code));
}
static void check(infiniStatus_t code, const char *call, int line) {
    if (code != INFINI_STATUS_SUCCESS)
        throw std::runtime_error("line " + std::to_string(line) + ": " + call + ": status " + std::to_string(code));
}
#define CHECK(call) check((call), #call, __LINE__)

// ---------------------------------------------------------------------------------------------------------------
// 16-bit storage as raw uint16_t bits, the dtype a tag; two elements per 32-bit word, the lower address low.
struct Bf16 {
    static constexpr const char *kName = "bf16";
    static constexpr infiniDtype_t kDtype = INFINI_DTYPE_BF16;
    static constexpr double kUlp = 0x1p-7; // spacing of the values at 1: the error unit below
};
struct F16 {
    static constexpr const char *kName = "f16";
    static constexpr infiniDtype_t kDtype = INFINI_DTYPE_F16;
    static constexpr double kUlp = 0x1p-10;
};
constexpr float kEpsilon = 0.0f; // the seed API has none

__device__ __forceinline__ float2 unpack(Bf16, uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 unpack(F16, uint32_t w) {
    return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu))),
                       __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16))));
}
__device__ __forceinline__ uint32_t narrow(Bf16, float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
__device__ __forceinline__ uint32_t narrow(F16, float v) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ uint32_t word(uint4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// Elements [col, col + 8) of a row of `dim`, zero past its end: one 16-byte load where the row allows it (`vec`:
// every row starts 16-byte aligned), else element by element.
__device__ __forceinline__ uint4 load8(const uint16_t *row, size_t col, size_t dim, bool vec) {
    if (vec && col + 8 <= dim) return __ldg(reinterpret_cast<const uint4 *>(row + col));
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const size_t c = col + 2 * i;
        w[i] = (c < dim ? row[c] : 0u) | (c + 1 < dim ? static_cast<uint32_t>(row[c + 1]) << 16 : 0u);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void store8(uint16_t *row, size_t col, size_t dim, bool vec, uint4 v) {
    if (vec && col + 8 <= dim) {
        __stwb(reinterpret_cast<uint4 *>(row + col), v); // one 16-byte store (a plain one was split in four)
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const size_t c = col + 2 * i;
        if (c < dim) row[c] = static_cast<uint16_t>(word(v, i) & 0xffffu);
        if (c + 1 < dim) row[c + 1] = static_cast<uint16_t>(word(v, i) >> 16);
    }
}

// This thread's share of sum(x^2) and sum(gy*w*x) over 8 elements (zero padding adds zero).
template <typename T>
__device__ __forceinline__ void addSums(uint4 g, uint4 x, uint4 w, float &s1, float &s2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 gg = unpack(T{}, word(g, i)), xx = unpack(T{}, word(x, i)), ww = unpack(T{}, word(w, i));
        s1 = fmaf(xx.y, xx.y, fmaf(xx.x, xx.x, s1));
        s2 = fmaf(gg.y * ww.y, xx.y, fmaf(gg.x * ww.x, xx.x, s2));
    }
}

// grad_x of 8 elements, packed; adds their gy*x*r into acc[0..8).
template <typename T>
__device__ __forceinline__ uint4 outputs(uint4 g, uint4 x, uint4 w, float r, float c, float *acc) {
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 gg = unpack(T{}, word(g, i)), xx = unpack(T{}, word(x, i)), ww = unpack(T{}, word(w, i));
        out[i] = narrow(T{}, r * gg.x * ww.x - c * xx.x) | narrow(T{}, r * gg.y * ww.y - c * xx.y) << 16;
        acc[2 * i] = fmaf(gg.x * xx.x, r, acc[2 * i]);
        acc[2 * i + 1] = fmaf(gg.y * xx.y, r, acc[2 * i + 1]);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

// Sum over the warp by a xor butterfly: every lane ends with the same bits (IEEE addition commutes).
__device__ __forceinline__ float2 warpAllSum(float2 v) {
#pragma unroll
    for (int mask = 16; mask > 0; mask /= 2) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, mask);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, mask);
    }
    return v;
}

struct Problem {
    const uint16_t *gy, *x, *w;
    uint16_t *gx;
    float *partials; // [groups][dim]: a row of grad_w partials per CTA (warpE, ctaE) or cluster
    size_t rows, dim;
    float eps;
    bool vec; // every row 16-byte aligned: dim % 8 == 0 and aligned bases
};

// ---------------------------------------------------------------------------------------------------------------
// warpE: 8 warps per CTA, each a whole row at a time. Lane l holds vectors l, l+32, ... of 8 elements: E/2 registers
// each of packed gy and x, 4*E bytes in flight per lane. w sits in shared memory; E grad_w partials per lane in
// registers, added over the CTA's warps in warp order at the end.
constexpr int kWarpCtaThreads = 256, kWarpsPerCta = kWarpCtaThreads / 32;

template <typename T, int E>
__global__ void __launch_bounds__(kWarpCtaThreads, 64 / E) warpRowsKernel(Problem p, size_t rows_per_cta) {
    constexpr int K = E / 8; // vectors per lane
    __shared__ __align__(16) uint16_t w_s[32 * E];
    __shared__ float acc_s[kWarpsPerCta - 1][E][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const size_t first = blockIdx.x * rows_per_cta, last = min(first + rows_per_cta, p.rows);
    for (int i = threadIdx.x; i < 32 * E; i += blockDim.x) w_s[i] = size_t(i) < p.dim ? p.w[i] : 0;
    __syncthreads();
    const uint4 *w4 = reinterpret_cast<const uint4 *>(w_s);

    float acc[E] = {};
    for (size_t row = first + warp; row < last; row += kWarpsPerCta) {
        uint4 g[K], xv[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            g[k] = load8(p.gy + row * p.dim, (k * 32 + lane) * 8, p.dim, p.vec);
            xv[k] = load8(p.x + row * p.dim, (k * 32 + lane) * 8, p.dim, p.vec);
        }
        float s1 = 0.f, s2 = 0.f;
#pragma unroll
        for (int k = 0; k < K; ++k) addSums<T>(g[k], xv[k], w4[k * 32 + lane], s1, s2);
        const float2 total = warpAllSum(make_float2(s1, s2));
        const float r = 1.0f / sqrtf(total.x / p.dim + p.eps), c = r * r * r * (total.y / p.dim);
#pragma unroll
        for (int k = 0; k < K; ++k) {
            store8(p.gx + row * p.dim, (k * 32 + lane) * 8, p.dim, p.vec,
                   outputs<T>(g[k], xv[k], w4[k * 32 + lane], r, c, acc + 8 * k));
        }
    }
    if (warp > 0) {
#pragma unroll
        for (int e = 0; e < E; ++e) acc_s[warp - 1][e][lane] = acc[e];
    }
    __syncthreads();
    if (warp != 0) return;
    for (int w = 0; w < kWarpsPerCta - 1; ++w) {
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] += acc_s[w][e][lane];
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const size_t col = ((e / 8) * 32 + lane) * 8 + e % 8;
        if (col < p.dim) p.partials[blockIdx.x * p.dim + col] = acc[e];
    }
}

// ---------------------------------------------------------------------------------------------------------------
// ctaE, cluCxN: a group of `ranks` CTAs (one, or a cluster) per row; thread t of rank q holds vectors
// q*N*E/8 + k*N + t (k < E/8) of the row: E/2 registers each of packed gy and x, 4*E bytes in flight per thread;
// this CTA's columns of w in shared memory, E grad_w partials in registers. How the next rows come in (kAhead):
//   0: loaded at the top of their iteration;
//   1: the next row's packed values loaded into a second set of registers before this row's barrier;
//   S >= 2: a ring of S row buffers in shared memory filled by cp.async, S-1 rows ahead (no registers held; each
//      thread copies and later reads only its own vectors, so the ring needs no barrier).
// Per row: thread sums -> warp butterfly -> lane 0 writes slots[row parity][warp] -> ONE barrier (CTA or cluster)
// -> every warp adds all slots in one fixed order (over DSMEM for a cluster). A slot is rewritten two rows later,
// after the next barrier, which every reader of it has passed: one barrier per row is enough.
__host__ __device__ constexpr int maxThreadsOf(int e, int ahead) { return e == 8 || ahead != 1 ? 1024 : 512; }
// Dynamic shared memory of a CTA: w's columns, then the ring.
__host__ __device__ constexpr size_t sharedBytesOf(int threads, int e, int ahead) {
    return size_t(threads) * e * 2 * (1 + (ahead >= 2 ? 2 * ahead : 0));
}

template <typename T, int E, int kAhead, bool kCluster>
__global__ void __launch_bounds__(maxThreadsOf(E, kAhead), 1) rowsKernel(Problem p, size_t rows_per_group) {
    constexpr int K = E / 8;
    extern __shared__ __align__(16) uint16_t w_s[]; // blockDim.x * E: this CTA's columns of w; then the ring
    __shared__ float2 slots[2][32];
    const int t = threadIdx.x, nt = blockDim.x, lane = t % 32, warp = t / 32, warps = nt / 32;
    unsigned ranks = 1, rank = 0;
    if constexpr (kCluster) {
        ranks = cg::this_cluster().num_blocks();
        rank = cg::this_cluster().block_rank();
    }
    const size_t group = blockIdx.x / ranks, base = static_cast<size_t>(rank) * nt * E;
    const size_t first = group * rows_per_group, last = min(first + rows_per_group, p.rows);
    for (int i = t; i < nt * E; i += nt) w_s[i] = base + i < p.dim ? p.w[base + i] : 0;
    __syncthreads();
    const uint4 *w4 = reinterpret_cast<const uint4 *>(w_s);
    auto colOf = [&](int k) { return base + static_cast<size_t>(k * nt + t) * 8; };
    auto load = [&](size_t row, uint4 *gd, uint4 *xd) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            gd[k] = load8(p.gy + row * p.dim, colOf(k), p.dim, p.vec);
            xd[k] = load8(p.x + row * p.dim, colOf(k), p.dim, p.vec);
        }
    };
    // Ring buffer `stage` of gy (q 0) or x (q 1), as vectors; this thread's are k * nt + t.
    auto ring = [&](int stage, int q) { return reinterpret_cast<uint4 *>(w_s) + (1 + 2 * stage + q) * nt * K; };
    auto fetch = [&](size_t row, int stage) { // starts this thread's copies of `row`; one commit group per row
        for (int k = 0; k < K && row < last; ++k) {
            const size_t col = colOf(k);
            uint4 *dg = ring(stage, 0) + k * nt + t, *dx = ring(stage, 1) + k * nt + t;
            if (p.vec && col + 8 <= p.dim) {
                __pipeline_memcpy_async(dg, p.gy + row * p.dim + col, 16);
                __pipeline_memcpy_async(dx, p.x + row * p.dim + col, 16);
            } else { // a tail or unaligned rows: plain loads, read back by this thread alone
                *dg = load8(p.gy + row * p.dim, col, p.dim, p.vec);
                *dx = load8(p.x + row * p.dim, col, p.dim, p.vec);
            }
        }
        __pipeline_commit(); // also past the end: the count of groups stays a count of rows
    };

    float acc[E] = {};
    uint4 g[K], xv[K];
    if constexpr (kAhead == 1) {
        if (first < last) load(first, g, xv);
    } else if constexpr (kAhead >= 2) {
        for (int s = 0; s < kAhead - 1; ++s) fetch(first + s, s);
    }
    for (size_t row = first; row < last; ++row) {
        const int parity = static_cast<int>((row - first) & 1);
        [[maybe_unused]] uint4 g_next[K], x_next[K];
        if constexpr (kAhead == 0) {
            load(row, g, xv);
        } else if constexpr (kAhead == 1) {
#pragma unroll
            for (int k = 0; k < K; ++k) g_next[k] = x_next[k] = make_uint4(0, 0, 0, 0);
            if (row + 1 < last) load(row + 1, g_next, x_next); // in flight across this row's barrier
        } else {
            const int stage = static_cast<int>((row - first) % kAhead);
            fetch(row + kAhead - 1, static_cast<int>((row - first + kAhead - 1) % kAhead));
            __pipeline_wait_prior(kAhead - 1); // this row's group is complete
#pragma unroll
            for (int k = 0; k < K; ++k) g[k] = ring(stage, 0)[k * nt + t], xv[k] = ring(stage, 1)[k * nt + t];
        }
        float s1 = 0.f, s2 = 0.f;
#pragma unroll
        for (int k = 0; k < K; ++k) addSums<T>(g[k], xv[k], w4[k * nt + t], s1, s2);
        const float2 part = warpAllSum(make_float2(s1, s2));
        if (lane == 0) slots[parity][warp] = part;
        float2 total = make_float2(0.f, 0.f);
        if constexpr (kCluster) {
            cg::this_cluster().sync();
            for (int i = lane; i < static_cast<int>(ranks) * warps; i += 32) { // fixed order: rank, then warp
                const float2 s = cg::this_cluster().map_shared_rank(&slots[parity][0], i / warps)[i % warps];
                total.x += s.x;
                total.y += s.y;
            }
        } else {
            __syncthreads();
            if (lane < warps) total = slots[parity][lane];
        }
        total = warpAllSum(total);
        const float r = 1.0f / sqrtf(total.x / p.dim + p.eps), c = r * r * r * (total.y / p.dim);
#pragma unroll
        for (int k = 0; k < K; ++k) {
            store8(p.gx + row * p.dim, colOf(k), p.dim, p.vec,
                   outputs<T>(g[k], xv[k], w4[k * nt + t], r, c, acc + 8 * k));
        }
        if constexpr (kAhead == 1) {
#pragma unroll
            for (int k = 0; k < K; ++k) g[k] = g_next[k], xv[k] = x_next[k];
        }
    }
    if constexpr (kAhead >= 2) __pipeline_wait_prior(0); // no copy outlives the CTA
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const size_t col = colOf(e / 8) + e % 8;
        if (col < p.dim) p.partials[group * p.dim + col] = acc[e];
    }
    if constexpr (kCluster) cg::this_cluster().sync(); // no CTA leaves while another may still read its slots
}

// grad_w[j] = the sum over q of partials[q][j]: q = ty, ty+32, ... per thread, then the 32 threads in ty order.
// Also kept in F32 (grad_w32), so that the check sees the sum before it is rounded to 16 bits.
template <typename T>
__global__ void __launch_bounds__(1024)
    sumPartialsKernel(const float *partials, size_t count, size_t dim, uint16_t *grad_w, float *grad_w32) {
    __shared__ float lanes[32][33];
    const size_t col = static_cast<size_t>(blockIdx.x) * 32 + threadIdx.x;
    float sum = 0.f;
    for (size_t q = threadIdx.y; col < dim && q < count; q += 32) sum += partials[q * dim + col];
    lanes[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || col >= dim) return;
    float total = 0.f;
    for (int y = 0; y < 32; ++y) total += lanes[y][threadIdx.x];
    grad_w32[col] = total;
    grad_w[col] = static_cast<uint16_t>(narrow(T{}, total));
}

// Test data from a counter hash: uniform in [lo, hi) times 2^((row % period) - period/2) (period 0: unscaled), so
// rows differ in scale by powers of two (exact in 16 bits) and a row mixed up with another shows.
template <typename T>
__global__ void fillKernel(uint16_t *out, size_t count, size_t dim, uint64_t seed, float lo, float hi, int period) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
        uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull; // splitmix64
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        const float u = static_cast<float>((z ^ (z >> 31)) >> 40) * 0x1p-24f;
        const int exponent = period > 0 ? static_cast<int>((i / dim) % period) - period / 2 : 0;
        out[i] = static_cast<uint16_t>(narrow(T{}, ldexpf(lo + (hi - lo) * u, exponent)));
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Host: the case (device buffers, host copy of the inputs, float64 reference) and the checks.

static double valueOf(Bf16, uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static double valueOf(F16, uint16_t b) {
    const int exponent = (b >> 10) & 0x1f, mantissa = b & 0x3ff;
    const double magnitude = exponent == 0    ? std::ldexp(mantissa, -24)
                             : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                              : std::ldexp(mantissa | 0x400, exponent - 25);
    return (b & 0x8000) ? -magnitude : magnitude;
}

static unsigned workerCount() { return std::max(1u, std::min(32u, std::thread::hardware_concurrency())); }

template <typename F>
static void parallelFor(size_t n, F body) { // body(begin, end, worker)
    const unsigned workers = workerCount();
    std::vector<std::thread> threads;
    for (unsigned i = 0; i < workers; ++i)
        threads.emplace_back([=] { body(n * i / workers, n * (i + 1) / workers, i); });
    for (auto &thread : threads) thread.join();
}

static size_t ceilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// Device memory freed with its owner.
struct DeviceMemory {
    std::vector<void *> owned;
    DeviceMemory() = default;
    DeviceMemory(const DeviceMemory &) = delete;
    DeviceMemory &operator=(const DeviceMemory &) = delete;
    ~DeviceMemory() {
        for (void *p : owned) cudaFree(p);
    }
    template <typename P>
    P *alloc(size_t count) {
        void *p = nullptr;
        CHECK(cudaMalloc(&p, count * sizeof(P)));
        owned.push_back(p);
        return static_cast<P *>(p);
    }
};

struct Case : DeviceMemory {
    size_t rows = 0, dim = 0;
    std::vector<double> value;      // 16-bit pattern -> its value
    std::vector<uint16_t> gy, x, w; // the inputs, as on the device
    std::vector<double> r, c, rms;  // per row: rstd, x coefficient, RMS of the reference grad_x
    std::vector<double> grad_w;     // reference
    double grad_w_rms = 0;
    uint16_t *d_inputs = nullptr, *d_gy = nullptr, *d_x = nullptr, *d_w = nullptr, *d_gx = nullptr, *d_gw = nullptr;
    float *d_gw32 = nullptr;
};

template <typename T>
static void makeCase(Case &k, size_t rows, size_t dim, uint64_t seed, cudaStream_t stream) {
    k.rows = rows;
    k.dim = dim;
    const size_t n = rows * dim, x_offset = (n + 127) / 128 * 128; // x 256-byte aligned after gy
    k.d_inputs = k.alloc<uint16_t>(x_offset + n);                  // the copy rows read this region
    k.d_gy = k.d_inputs;
    k.d_x = k.d_inputs + x_offset;
    k.d_w = k.alloc<uint16_t>(dim);
    k.d_gx = k.alloc<uint16_t>(n);
    k.d_gw = k.alloc<uint16_t>(dim);
    k.d_gw32 = k.alloc<float>(dim);
    fillKernel<T><<<1024, 256, 0, stream>>>(k.d_gy, n, dim, seed, -1.f, 1.f, 5);
    fillKernel<T><<<1024, 256, 0, stream>>>(k.d_x, n, dim, seed + 1, -2.f, 2.f, 7);
    fillKernel<T><<<64, 256, 0, stream>>>(k.d_w, dim, dim, seed + 2, 0.5f, 1.5f, 0);
    CHECK(cudaGetLastError());
    k.gy.resize(n);
    k.x.resize(n);
    k.w.resize(dim);
    CHECK(cudaMemcpyAsync(k.gy.data(), k.d_gy, n * 2, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyAsync(k.x.data(), k.d_x, n * 2, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyAsync(k.w.data(), k.d_w, dim * 2, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));

    k.value.resize(65536);
    for (uint32_t b = 0; b < 65536; ++b) k.value[b] = valueOf(T{}, static_cast<uint16_t>(b));
    const double *v = k.value.data();
    k.r.resize(rows);
    k.c.resize(rows);
    k.rms.resize(rows);
    std::vector<std::vector<double>> grad_w(workerCount(), std::vector<double>(dim, 0.0));
    parallelFor(rows, [&](size_t begin, size_t end, unsigned worker) {
        for (size_t row = begin; row < end; ++row) {
            const uint16_t *gy = &k.gy[row * dim], *x = &k.x[row * dim];
            double s1 = 0, s2 = 0, squares = 0;
            for (size_t j = 0; j < dim; ++j) {
                s1 += v[x[j]] * v[x[j]];
                s2 += v[gy[j]] * v[k.w[j]] * v[x[j]];
            }
            const double r = 1.0 / std::sqrt(s1 / dim + kEpsilon), c = r * r * r * s2 / dim;
            for (size_t j = 0; j < dim; ++j) {
                const double out = r * v[gy[j]] * v[k.w[j]] - c * v[x[j]];
                squares += out * out;
                grad_w[worker][j] += v[gy[j]] * v[x[j]] * r;
            }
            k.r[row] = r;
            k.c[row] = c;
            k.rms[row] = std::sqrt(squares / dim);
        }
    });
    k.grad_w.assign(dim, 0.0);
    double squares = 0;
    for (size_t j = 0; j < dim; ++j) {
        for (const auto &partial : grad_w) k.grad_w[j] += partial[j];
        squares += k.grad_w[j] * k.grad_w[j];
    }
    k.grad_w_rms = std::sqrt(squares / dim);
}

// |got - ref| in units of ulp * max(|ref|, scale): about ulps of the larger of the value and its row's (or the
// vector's) RMS, so rounding to 16 bits alone gives <= 0.5. NaN counts as infinite.
static double ulpError(double got, double ref, double scale, double ulp) {
    const double unit = ulp * std::max(std::fabs(ref), scale);
    const double e = unit > 0 ? std::fabs(got - ref) / unit : (got == ref ? 0.0 : INFINITY);
    return std::isnan(e) ? INFINITY : e;
}

// Bounds: rounding to 16 bits is 0.5 ulp and F32 sums add far less; 2 leaves room for a rounding on each side.
// The F32 grad_w sum is held to 1e-4 of max(|ref|, RMS): a lost or doubled row among 8192 moves it by about 1e-2.
constexpr double kUlpTolerance = 2.0, kGradW32Tolerance = 1e-4;

struct Outputs {
    std::vector<uint16_t> gx, gw;
    std::vector<float> gw32; // empty for the library
    bool operator==(const Outputs &o) const { return gx == o.gx && gw == o.gw && gw32 == o.gw32; }
};

struct Result {
    std::string shape, dtype, impl, config, note;
    double ms = NAN, of_copy = NAN, gbs = NAN;
    double grad_x = NAN, grad_w = NAN, grad_w32 = NAN; // largest errors (see ulpError)
    bool checked = false, deterministic = false, ok = false;
};

template <typename T>
static void compare(const Case &k, const Outputs &o, Result &result) {
    const double *v = k.value.data();
    std::vector<double> worst(workerCount(), 0.0);
    parallelFor(k.rows, [&](size_t begin, size_t end, unsigned worker) {
        for (size_t row = begin; row < end; ++row) {
            for (size_t j = 0, i = row * k.dim; j < k.dim; ++j, ++i) {
                const double ref = k.r[row] * v[k.gy[i]] * v[k.w[j]] - k.c[row] * v[k.x[i]];
                worst[worker] = std::max(worst[worker], ulpError(v[o.gx[i]], ref, k.rms[row], T::kUlp));
            }
        }
    });
    result.grad_x = *std::max_element(worst.begin(), worst.end());
    result.grad_w = 0;
    for (size_t j = 0; j < k.dim; ++j) {
        result.grad_w = std::max(result.grad_w, ulpError(v[o.gw[j]], k.grad_w[j], k.grad_w_rms, T::kUlp));
        if (!o.gw32.empty()) {
            result.grad_w32 = std::max(std::isnan(result.grad_w32) ? 0.0 : result.grad_w32,
                                       ulpError(o.gw32[j], k.grad_w[j], k.grad_w_rms, 1.0));
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Implementations: each enqueues one backward of the case on a stream.

struct Impl {
    Impl(std::string name, std::string config, bool eager = false, bool variant = false)
        : name(std::move(name)), config(std::move(config)), eager(eager), variant(variant) {}
    std::string name, config;
    bool eager;   // the copy: timed as 10 eager calls, not checked
    bool variant; // writes grad_w32 too
    std::function<void(cudaStream_t)> run;
    cudaGraphExec_t graph = nullptr;
};

struct Device {
    int sms = 0;
    infiniopHandle_t handle = nullptr;
    void *copy_dst = nullptr; // as large as the largest case's 1.5 * rows * D * 2 bytes
};

// Persistent grid: at most one wave of `resident` groups, each a contiguous range of rows.
static void splitRows(size_t rows, size_t resident, size_t *groups, size_t *rows_per_group) {
    *rows_per_group = ceilDiv(rows, std::max<size_t>(1, std::min(rows, resident)));
    *groups = ceilDiv(rows, *rows_per_group);
}

template <typename T>
static void launchSum(const Case &k, const float *partials, size_t groups, cudaStream_t stream) {
    sumPartialsKernel<T>
        <<<unsigned(ceilDiv(k.dim, 32)), dim3(32, 32), 0, stream>>>(partials, groups, k.dim, k.d_gw, k.d_gw32);
    CHECK(cudaGetLastError());
}

static Problem problemOf(const Case &k, float *partials) {
    return Problem{k.d_gy, k.d_x, k.d_w, k.d_gx, partials, k.rows, k.dim, kEpsilon, k.dim % 8 == 0};
}

template <typename T, int E>
static Impl warpImpl(Case &k, const Device &dev) {
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, warpRowsKernel<T, E>, kWarpCtaThreads, 0));
    size_t ctas, rows_per_cta; // at most one wave, and at least a row for each warp
    splitRows(k.rows, std::min(size_t(per_sm) * dev.sms, ceilDiv(k.rows, kWarpsPerCta)), &ctas, &rows_per_cta);
    const Problem p = problemOf(k, k.alloc<float>(ctas * k.dim));
    Impl impl{"warp" + std::to_string(E),
              "256 thr, " + std::to_string(ctas) + " ctas x " + std::to_string(rows_per_cta) + " rows, " +
                  std::to_string(per_sm) + "/SM",
              false, true};
    impl.run = [p, ctas, rows_per_cta, &k](cudaStream_t stream) {
        warpRowsKernel<T, E><<<unsigned(ctas), kWarpCtaThreads, 0, stream>>>(p, rows_per_cta);
        CHECK(cudaGetLastError());
        launchSum<T>(k, p.partials, ctas, stream);
    };
    return impl;
}

template <typename T, int E, int kAhead, bool kCluster>
static Impl rowsImpl(Case &k, const Device &dev, int threads, unsigned ranks) {
    const auto kernel = rowsKernel<T, E, kAhead, kCluster>;
    const size_t smem = sharedBytesOf(threads, E, kAhead);
    if (smem > 48 * 1024) CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim = {ranks, 1, 1};
    cudaLaunchConfig_t config{dim3(ranks), dim3(threads), smem, nullptr, &cluster, 1};
    int resident = 0;
    if constexpr (kCluster) {
        CHECK(cudaOccupancyMaxActiveClusters(&resident, kernel, &config));
    } else {
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, smem));
        resident *= dev.sms;
    }
    if (resident == 0) throw std::runtime_error("no CTA of " + std::to_string(threads) + " threads is resident");
    size_t groups, rows_per_group;
    splitRows(k.rows, resident, &groups, &rows_per_group);
    const Problem p = problemOf(k, k.alloc<float>(groups * k.dim));
    Impl impl{kCluster ? "clu" + std::to_string(ranks) + "x" + std::to_string(threads)
                       : "cta" + std::to_string(E) +
                             (kAhead == 1 ? "p"
                              : kAhead    ? "a" + std::to_string(kAhead)
                                          : ""),
              std::to_string(threads) + " thr x " + std::to_string(ranks) + ", E=" + std::to_string(E) + ", " +
                  std::to_string(groups) + " groups x " + std::to_string(rows_per_group) + " rows, " +
                  std::to_string(resident) + (kCluster ? " clusters" : " ctas") + " resident",
              false, true};
    config.gridDim = dim3(unsigned(groups * ranks));
    impl.run = [=, &k](cudaStream_t stream) mutable {
        if constexpr (kCluster) {
            config.stream = stream;
            config.attrs = &cluster; // this lambda's own copy
            CHECK(cudaLaunchKernelEx(&config, kernel, p, rows_per_group));
        } else {
            kernel<<<unsigned(groups), threads, smem, stream>>>(p, rows_per_group);
            CHECK(cudaGetLastError());
        }
        launchSum<T>(k, p.partials, groups, stream);
    };
    return impl;
}

// The library through its public C API (seed descriptor: one 16-bit dtype, no epsilon), as a user calls it.
template <typename T>
static Impl libraryImpl(Case &k, const Device &dev) {
    if (!dev.handle) throw std::runtime_error("no library handle");
    const size_t matrix_shape[2] = {k.rows, k.dim}, vector_shape[1] = {k.dim};
    infiniopTensorDescriptor_t matrix = nullptr, vector = nullptr;
    CHECK(infiniopCreateTensorDescriptor(&matrix, 2, matrix_shape, nullptr, T::kDtype));
    CHECK(infiniopCreateTensorDescriptor(&vector, 1, vector_shape, nullptr, T::kDtype));
    infiniopRMSNormBackwardDescriptor_t desc = nullptr; // lives until the process ends: a few hundred bytes
    CHECK(infiniopCreateRMSNormBackwardDescriptor(dev.handle, &desc, matrix, vector, matrix, matrix, vector));
    CHECK(infiniopDestroyTensorDescriptor(matrix)); // the op descriptor copied what it needs
    CHECK(infiniopDestroyTensorDescriptor(vector));
    size_t bytes = 0;
    CHECK(infiniopGetRMSNormBackwardWorkspaceSize(desc, &bytes));
    void *workspace = bytes > 0 ? k.alloc<char>(bytes) : nullptr;
    Impl impl{"library", "seed API, its own plan; workspace " + std::to_string(bytes >> 10) + " KiB"};
    impl.run = [desc, workspace, bytes, &k](cudaStream_t stream) {
        CHECK(infiniopRMSNormBackward(desc, workspace, bytes, k.d_gx, k.d_gw, k.d_gy, k.d_x, k.d_w, stream));
    };
    return impl;
}

// The bytes the backward moves (read 2N, write N; N = rows*D*2) as one device-to-device copy of 1.5N bytes.
static Impl copyImpl(Case &k, const Device &dev) {
    const size_t bytes = k.rows * k.dim * 3;
    Impl impl{"copy", "eager cudaMemcpyAsync of " + std::to_string(bytes >> 20) + " MiB", true};
    impl.run = [bytes, dst = dev.copy_dst, &k](cudaStream_t stream) {
        CHECK(cudaMemcpyAsync(dst, k.d_inputs, bytes, cudaMemcpyDeviceToDevice, stream));
    };
    return impl;
}

// The rule for which variants a shape gets (each row's config says what it chose). Phase 1 has the plain kernels,
// phase 2 those with cp.async or clusters, each beside the library and the copy: every shape's plain rows are
// measured before anything that could end the run (a hang, an illegal address) is tried.
template <typename T>
static std::vector<Impl> implsFor(Case &k, const Device &dev, int phase, const std::vector<std::string> &wanted,
                                  std::vector<std::string> &refused) {
    std::vector<std::pair<std::string, std::function<Impl()>>> makers, second; // (name, maker) of each phase
    const size_t dim = k.dim;
    const int nt8 = int(ceilDiv(ceilDiv(dim, 8), 32) * 32), nt16 = int(ceilDiv(ceilDiv(dim, 16), 32) * 32);
    if (dim <= 512)
        makers.push_back({"warp16", [&] { return warpImpl<T, 16>(k, dev); }});
    else if (dim <= 1024)
        makers.push_back({"warp32", [&] { return warpImpl<T, 32>(k, dev); }});
    if (nt8 <= 1024) {
        makers.push_back({"cta8", [&, nt8] { return rowsImpl<T, 8, 0, false>(k, dev, nt8, 1); }});
        makers.push_back({"cta8p", [&, nt8] { return rowsImpl<T, 8, 1, false>(k, dev, nt8, 1); }});
        second.push_back({"cta8a2", [&, nt8] { return rowsImpl<T, 8, 2, false>(k, dev, nt8, 1); }});
        second.push_back({"cta8a4", [&, nt8] { return rowsImpl<T, 8, 4, false>(k, dev, nt8, 1); }});
    }
    if (dim > 512 && nt16 <= 1024)
        makers.push_back({"cta16", [&, nt16] { return rowsImpl<T, 16, 0, false>(k, dev, nt16, 1); }});
    if (dim > 512 && nt16 <= 512)
        makers.push_back({"cta16p", [&, nt16] { return rowsImpl<T, 16, 1, false>(k, dev, nt16, 1); }});
    for (int threads : {512, 1024}) { // the fewest CTAs of 8 elements a thread that cover the row: 2, 4 or 8
        unsigned ranks = 2;
        while (ranks < 8 && ranks * 8 * threads < dim) ranks *= 2;
        if (dim >= 8192 && ranks * 8 * threads >= dim && (ranks / 2) * 8 * threads < dim) {
            second.push_back({"clu" + std::to_string(ranks) + "x" + std::to_string(threads),
                              [&, threads, ranks] { return rowsImpl<T, 8, 1, true>(k, dev, threads, ranks); }});
        }
    }
    if (phase == 2) makers = second;
    if (makers.empty()) return {};
    makers.insert(makers.begin(),
                  {{"copy", [&] { return copyImpl(k, dev); }}, {"library", [&] { return libraryImpl<T>(k, dev); }}});
    std::vector<Impl> impls;
    for (auto &maker : makers) {
        const std::string &name = maker.first;
        const bool keep =
            name == "copy" || wanted.empty() ||
            std::any_of(wanted.begin(), wanted.end(), [&](const std::string &w) { return name.rfind(w, 0) == 0; });
        if (!keep) continue;
        try {
            impls.push_back(maker.second());
        } catch (const std::exception &error) { // a configuration the device refuses: reported, not fatal
            refused.push_back(name + ": " + error.what());
            cudaGetLastError();
        }
    }
    return impls;
}

// ---------------------------------------------------------------------------------------------------------------
// Checking, capturing and timing.

constexpr int kCallsPerGraph = 10, kWarmupRounds = 3;

static Outputs runOnce(const Case &k, const Impl &impl, cudaStream_t stream, bool replay) {
    CHECK(cudaMemsetAsync(k.d_gx, 0xff, k.rows * k.dim * 2, stream)); // NaN everywhere: an unwritten output shows
    CHECK(cudaMemsetAsync(k.d_gw, 0xff, k.dim * 2, stream));
    CHECK(cudaMemsetAsync(k.d_gw32, 0xff, k.dim * 4, stream));
    if (replay)
        CHECK(cudaGraphLaunch(impl.graph, stream));
    else
        impl.run(stream);
    Outputs o{std::vector<uint16_t>(k.rows * k.dim), std::vector<uint16_t>(k.dim), {}};
    CHECK(cudaMemcpyAsync(o.gx.data(), k.d_gx, o.gx.size() * 2, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyAsync(o.gw.data(), k.d_gw, o.gw.size() * 2, cudaMemcpyDeviceToHost, stream));
    if (impl.variant) {
        o.gw32.resize(k.dim);
        CHECK(cudaMemcpyAsync(o.gw32.data(), k.d_gw32, k.dim * 4, cudaMemcpyDeviceToHost, stream));
    }
    CHECK(cudaStreamSynchronize(stream));
    return o;
}

// One eager call, checked against the reference; then the graph of 10 calls, captured and replayed once: its
// outputs must have the same bits (determinism, and nothing in the call that a graph cannot replay).
template <typename T>
static void checkAndCapture(const Case &k, Impl &impl, Result &result, cudaStream_t stream) {
    const Outputs first = runOnce(k, impl, stream, false);
    compare<T>(k, first, result);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    try {
        for (int i = 0; i < kCallsPerGraph; ++i) impl.run(stream);
    } catch (...) {
        cudaStreamEndCapture(stream, &graph); // ends the broken capture; the first error is the one reported
        if (graph) cudaGraphDestroy(graph);
        throw;
    }
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&impl.graph, graph, 0));
    CHECK(cudaGraphDestroy(graph));
    result.deterministic = runOnce(k, impl, stream, true) == first;
    result.checked = true;
    result.ok = result.deterministic && result.grad_x <= kUlpTolerance && result.grad_w <= kUlpTolerance &&
                (!impl.variant || result.grad_w32 <= kGradW32Tolerance);
}

static double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? NAN : (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2.0;
}

// Rounds of every usable implementation in turn, the order rotating each round; ms per call, median over rounds.
static std::vector<double> timeAll(const std::vector<Impl> &impls, const std::vector<bool> &usable, int rounds,
                                   cudaStream_t stream) {
    const size_t n = impls.size();
    if (rounds == 0) return std::vector<double>(n, NAN); // --rounds 0: checks only
    std::vector<cudaEvent_t> events(2 * n * rounds);
    for (auto &e : events) CHECK(cudaEventCreate(&e));
    for (int round = 0; round < kWarmupRounds + rounds; ++round) {
        for (size_t j = 0; j < n; ++j) {
            const size_t i = (j + round) % n, slot = 2 * (i * rounds + std::max(0, round - kWarmupRounds));
            if (!usable[i]) continue;
            if (round >= kWarmupRounds) CHECK(cudaEventRecord(events[slot], stream));
            if (impls[i].eager) {
                for (int c = 0; c < kCallsPerGraph; ++c) impls[i].run(stream);
            } else {
                CHECK(cudaGraphLaunch(impls[i].graph, stream));
            }
            if (round >= kWarmupRounds) CHECK(cudaEventRecord(events[slot + 1], stream));
        }
    }
    CHECK(cudaStreamSynchronize(stream));
    std::vector<double> ms(n, NAN);
    for (size_t i = 0; i < n; ++i) {
        std::vector<float> samples(rounds);
        for (int r = 0; usable[i] && r < rounds; ++r) {
            CHECK(cudaEventElapsedTime(&samples[r], events[2 * (i * rounds + r)], events[2 * (i * rounds + r) + 1]));
        }
        if (usable[i]) ms[i] = median(samples) / kCallsPerGraph;
    }
    for (auto &e : events) CHECK(cudaEventDestroy(e));
    return ms;
}

// Copy bandwidth, read + write counted: a 512 MiB eager device-to-device copy, median of 20 (as bench does).
static double copyGbs(cudaStream_t stream) {
    const size_t bytes = size_t(512) << 20;
    DeviceMemory scratch;
    char *src = scratch.alloc<char>(bytes), *dst = scratch.alloc<char>(bytes);
    CHECK(cudaMemsetAsync(src, 1, bytes, stream));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    std::vector<float> samples(23);
    for (float &ms : samples) {
        CHECK(cudaEventRecord(start, stream));
        CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
        CHECK(cudaEventRecord(stop, stream));
        CHECK(cudaEventSynchronize(stop));
        CHECK(cudaEventElapsedTime(&ms, start, stop));
    }
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    return 2.0 * bytes / (median(std::vector<float>(samples.begin() + 3, samples.end())) * 1e-3) / 1e9;
}

// ---------------------------------------------------------------------------------------------------------------
// Reporting and the main loop.

static std::string fixed(double v, int digits) {
    if (std::isnan(v)) return "-";
    if (std::isinf(v)) return "inf";
    char text[32];
    std::snprintf(text, sizeof text, "%.*f", digits, v);
    return text;
}

static void printRow(const Result &r) {
    const char *det = !r.checked ? "-" : (r.deterministic ? "yes" : "NO"),
               *ok = !r.checked ? "-" : (r.ok ? "ok" : "FAIL");
    std::printf("%-11s %-4s %-9s %8s %6s %6s %6s %6s %7s %-3s %-4s %s%s%s\n", r.shape.c_str(), r.dtype.c_str(),
                r.impl.c_str(), fixed(r.ms, 4).c_str(), fixed(r.of_copy, 2).c_str(), fixed(r.gbs, 0).c_str(),
                fixed(r.grad_x, 2).c_str(), fixed(r.grad_w, 2).c_str(), fixed(r.grad_w32 * 1e6, 2).c_str(), det, ok,
                r.config.c_str(), r.note.empty() ? "" : "; ", r.note.c_str());
    std::fflush(stdout);
}

static void writeCsv(const std::string &path, const std::vector<Result> &results) {
    std::ofstream csv(path);
    csv << "shape,dtype,impl,ms,of_copy,gbs,grad_x_ulps,grad_w_ulps,grad_w32_rel,deterministic,ok,config,note\n";
    for (const Result &r : results) {
        csv << r.shape << ',' << r.dtype << ',' << r.impl << ',' << fixed(r.ms, 5) << ',' << fixed(r.of_copy, 3) << ','
            << fixed(r.gbs, 1) << ',' << fixed(r.grad_x, 3) << ',' << fixed(r.grad_w, 3) << ',' << fixed(r.grad_w32, 9)
            << ',' << (r.checked ? (r.deterministic ? "yes" : "no") : "") << ','
            << (r.checked ? (r.ok ? "ok" : "fail") : "") << ",\"" << r.config << "\",\"" << r.note << "\"\n";
    }
}

template <typename T>
static void runShape(size_t rows, size_t dim, uint64_t seed, int phase, const Device &dev,
                     const std::vector<std::string> &wanted, int rounds, double copy_gbs, cudaStream_t stream,
                     std::vector<Result> &results) {
    Case k;
    makeCase<T>(k, rows, dim, seed, stream);
    std::vector<std::string> refused;
    std::vector<Impl> impls = implsFor<T>(k, dev, phase, wanted, refused);
    std::vector<Result> rows_out(impls.size());
    std::vector<bool> usable(impls.size(), true);
    for (size_t i = 0; i < impls.size(); ++i) {
        Result &r = rows_out[i];
        r.shape = std::to_string(rows) + "x" + std::to_string(dim);
        r.dtype = T::kName;
        r.impl = impls[i].name;
        r.config = impls[i].config;
        if (impls[i].eager) continue;
        try {
            checkAndCapture<T>(k, impls[i], r, stream);
        } catch (const std::exception &error) { // this one is out; a sticky error ends the run at the next check
            r.note = error.what();
            usable[i] = false;
            cudaGetLastError();
            CHECK(cudaStreamSynchronize(stream));
        }
    }
    const std::vector<double> ms = timeAll(impls, usable, rounds, stream);
    for (size_t i = 0; i < impls.size(); ++i) {
        Result &r = rows_out[i];
        r.ms = ms[i];
        r.gbs = 3.0 * rows * dim * 2 / (ms[i] * 1e-3) / 1e9;
        r.of_copy = r.gbs / copy_gbs;
        printRow(r);
        results.push_back(r);
        if (impls[i].graph) CHECK(cudaGraphExecDestroy(impls[i].graph));
    }
    for (const std::string &why : refused) std::printf("%zux%zu %s refused %s\n", rows, dim, T::kName, why.c_str());
}

static std::vector<std::string> splitList(const std::string &text) {
    std::vector<std::string> items;
    for (size_t start = 0, end; start <= text.size(); start = end + 1) {
        end = std::min(text.find(',', start), text.size());
        if (end > start) items.push_back(text.substr(start, end - start));
    }
    return items;
}

int main(int argc, char **argv) {
    // The shapes of issue 53, the worst first; two odd ones for correctness (a tail of the CTA's columns and an odd
    // row count; D % 8 != 0, so element-wise loads and stores).
    std::string dir,
        shapes = "8192x8192,4096x4096,2048x16384,16384x4096,65536x1024,32768x512,1024x32768,4097x3000,"
                 "1025x1001",
        f16_shapes = "4096x4096,8192x8192,65536x1024", impls, dtypes = "bf16,f16";
    int rounds = 20;
    bool usage = argc < 2;
    for (int i = 1; i < argc && !usage; ++i) {
        const std::string a = argv[i];
        const bool valued = i + 1 < argc;
        if (a == "--shapes" && valued)
            shapes = f16_shapes = argv[++i];
        else if (a == "--impls" && valued)
            impls = argv[++i];
        else if (a == "--dtypes" && valued)
            dtypes = argv[++i];
        else if (a == "--rounds" && valued)
            rounds = std::max(0, std::atoi(argv[++i]));
        else if (a[0] != '-' && dir.empty())
            dir = a;
        else
            usage = true;
    }
    if (usage || dir.empty()) {
        std::fprintf(stderr,
                     "usage: %s DIR [--shapes RxD,...] [--impls NAME-PREFIX,...] [--dtypes bf16,f16] "
                     "[--rounds N]  (see the header of row_backward_variants.cu)\n",
                     argv[0]);
        return 2;
    }
    int count = 0;
    const cudaError_t counted = cudaGetDeviceCount(&count);
    if (counted != cudaSuccess || count == 0) {
        std::fprintf(stderr, "no CUDA device: %s\n", counted != cudaSuccess ? cudaGetErrorString(counted) : "count 0");
        return 2;
    }
    std::vector<Result> results;
    int status = 0;
    try {
        std::filesystem::create_directories(dir);
        CHECK(cudaSetDevice(0));
        cudaDeviceProp props{};
        CHECK(cudaGetDeviceProperties(&props, 0));
        Device dev;
        dev.sms = props.multiProcessorCount;
        // Without the library's CUDA backend the variants still run; each library row then says why it is missing.
        const infiniStatus_t library = infinirtSetDevice(INFINI_DEVICE_NVIDIA, 0);
        if (library != INFINI_STATUS_SUCCESS || infiniopCreateHandle(&dev.handle) != INFINI_STATUS_SUCCESS) {
            std::printf("the library has no usable NVIDIA device (infinirtSetDevice: status %d): variants only\n",
                        library);
            dev.handle = nullptr;
        }
        cudaStream_t stream;
        CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        std::vector<std::tuple<bool, size_t, size_t>> cases; // (f16, rows, dim)
        size_t largest = 0;
        for (const std::string &dtype : splitList(dtypes)) {
            for (const std::string &s : splitList(dtype == "f16" ? f16_shapes : shapes)) {
                const size_t x = s.find('x');
                const size_t rows = x == std::string::npos ? 0 : std::strtoul(s.c_str(), nullptr, 10);
                const size_t dim = x == std::string::npos ? 0 : std::strtoul(s.c_str() + x + 1, nullptr, 10);
                if (rows == 0 || dim == 0) throw std::runtime_error("shape " + s + ": want ROWSxD");
                if (dtype != "f16" && dtype != "bf16")
                    throw std::runtime_error("dtype " + dtype + ": want bf16 or f16");
                cases.emplace_back(dtype == "f16", rows, dim);
                largest = std::max(largest, rows * dim * 3);
            }
        }
        DeviceMemory scratch;
        dev.copy_dst = scratch.alloc<char>(largest);
        const double copy_gbs = copyGbs(stream);
        std::printf("%s, %d SMs, L2 %d MiB; eager copy %.0f GB/s (read + write); median of %d rounds of %d calls\n",
                    props.name, props.multiProcessorCount, props.l2CacheSize >> 20, copy_gbs, rounds, kCallsPerGraph);
        std::printf(
            "dx/dw: largest error in ulps of max(|ref|, RMS), pass <= %.0f; w32e-6: the F32 grad_w's, relative, "
            "in 1e-6, pass <= %.0f\n",
            kUlpTolerance, kGradW32Tolerance * 1e6);
        std::printf("%-11s %-4s %-9s %8s %6s %6s %6s %6s %7s %-3s %-4s %s\n", "shape", "type", "impl", "ms", "ofcopy",
                    "GB/s", "dx", "dw", "w32e-6", "det", "ok", "config");
        for (int phase : {1, 2}) {
            for (size_t i = 0; i < cases.size(); ++i) {
                const auto [f16, rows, dim] = cases[i];
                const uint64_t seed = 12345 + 1000 * i; // other data for every case, the same in both phases
                if (f16)
                    runShape<F16>(rows, dim, seed, phase, dev, splitList(impls), rounds, copy_gbs, stream, results);
                else
                    runShape<Bf16>(rows, dim, seed, phase, dev, splitList(impls), rounds, copy_gbs, stream, results);
                writeCsv(dir + "/variants.csv", results);
            }
        }
        std::printf("eager copy at the end: %.0f GB/s (start %.0f)\n", copyGbs(stream), copy_gbs);
        if (dev.handle) CHECK(infiniopDestroyHandle(dev.handle));
        CHECK(cudaStreamDestroy(stream));
    } catch (const std::exception &error) {
        std::fprintf(stderr, "FAILED: %s\n", error.what());
        status = 1;
    }
    // The summary, last, for a reply that shows only the end: per shape the library (both phases: their difference
    // is the noise) against the fastest variant that passed its checks.
    std::printf(
        "\nshape       type library ms, of copy (phases 1, 2) | variants passing | fastest: ms, of copy, speed-up\n");
    for (size_t i = 0; i < results.size(); ++i) {
        const Result &head = results[i];
        auto same = [&](const Result &r) { return r.shape == head.shape && r.dtype == head.dtype; };
        if (std::any_of(results.begin(), results.begin() + i, same)) continue; // one line per shape
        const Result *best = nullptr, *lib = nullptr;
        std::string library;
        int variants = 0, passing = 0;
        for (const Result &r : results) {
            if (!same(r) || r.impl == "copy") continue;
            if (r.impl == "library") {
                library += (lib ? " | " : "") + fixed(r.ms, 4) + (lib ? "" : ", " + fixed(r.of_copy, 2)) +
                           (r.ok ? "" : " FAILED");
                lib = lib ? lib : &r;
                continue;
            }
            ++variants;
            passing += r.ok;
            if (r.ok && !std::isnan(r.ms) && (!best || r.ms < best->ms)) best = &r;
        }
        const std::string fastest = best ? best->impl + " " + fixed(best->ms, 4) + ", " + fixed(best->of_copy, 2) +
                                               ", " + fixed(lib ? lib->ms / best->ms : NAN, 2) + "x"
                                         : "-";
        std::printf("%-11s %-4s %s | %d of %d | %s\n", head.shape.c_str(), head.dtype.c_str(),
                    library.empty() ? "-" : library.c_str(), passing, variants, fastest.c_str());
    }
    for (const Result &r : results) status |= (r.impl != "copy" && !r.ok) ? 1 : 0;
    std::printf("%s\n", status == 0 ? "every check passed" : "SOME CHECKS FAILED: see ok, det and the notes above");
    return status;
}
