// The CUDA features scripts/gpu_variants/row_backward_variants.cu uses, emulated on the CPU, so that its kernels and
// checks run without a GPU (tests/test_gpu_variants_script.py). Not a CUDA implementation: only what that program
// needs, with the kernels' logic (indices, tails, barriers, shuffles, clusters) as on a GPU and nothing about speed.
// - Each CTA runs on one OS thread, one fiber per CUDA thread. `__shared__` becomes static thread_local: the fibers
//   of a CTA share it, the CTAs of a cluster (one OS thread each) do not, and DSMEM maps an address to the same
//   offset in another CTA's thread-local block.
// - The scheduler is adversarial: warps in a random order, each run as far as its barriers let it before the next,
//   so a warp runs ahead of the others wherever the code allows it (a missing barrier or double buffer shows).
// - Device memory is host memory, every stream is synchronous, a graph records launches and replays them.
// - The library's C API is a float64 RMSNorm backward, enqueued like a kernel.
// The test rewrites the .cu for it: launches `k<<<g, b, s, st>>>(a)` become `emu::launch(k, g, b, s, st, a)`,
// `__shared__` becomes `static thread_local`, and the dynamic shared array a call of emu::dynamicShared.
#pragma once
#undef _FORTIFY_SOURCE // its longjmp check refuses a jump to another stack (fiber to scheduler)
#include "infiniop.h"
#include "infinirt.h"

#include <setjmp.h>
#include <ucontext.h>

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint4 {
    unsigned x, y, z, w;
};
struct float2 {
    float x, y;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
template <typename A, typename B>
inline auto min(A a, B b) {
    return a < b ? a : b;
}
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim; // a CTA per OS thread; threadIdx set per fiber

namespace emu {
struct Copy {
    void *to;
    const void *from;
    size_t bytes;
};
struct Fiber {
    jmp_buf at;
    ucontext_t start;
    dim3 thread;
    bool started = false, done = false;
    const void *waiting = nullptr;          // the barrier it waits at
    std::vector<Copy> open;                 // cp.async copies not yet committed
    std::vector<std::vector<Copy>> pending; // committed groups, oldest first, done only when waited for
};
struct Cluster {
    std::barrier<> *barrier;
    std::vector<char *> anchors; // per rank: that CTA's thread-local `anchor`
};
struct Cta {
    std::vector<Fiber> fibers;
    jmp_buf scheduler;
    int current = 0, cta_barrier = 0, cluster_barrier = 0;
    std::vector<int> warp_barriers;
    std::vector<float> exchange; // a value per thread, for shuffles
    unsigned rank = 0, ranks = 1;
    Cluster *cluster = nullptr;
};
inline thread_local Cta *cta = nullptr;
inline thread_local char anchor;
inline thread_local std::vector<char> dynamic_shared;
inline thread_local std::vector<std::unique_ptr<char[]>> stacks; // reused by the CTAs of this OS thread
constexpr size_t kStack = 64 * 1024;

inline Fiber &self() { return cta->fibers[cta->current]; }
inline void yield() {
    if (!_setjmp(self().at)) _longjmp(cta->scheduler, 1);
}
inline void wait(const void *barrier) {
    self().waiting = barrier;
    yield();
}
template <typename T>
T *dynamicShared() {
    return reinterpret_cast<T *>(dynamic_shared.data());
}
} // namespace emu

inline void __syncthreads() { emu::wait(&emu::cta->cta_barrier); }
inline float __shfl_xor_sync(unsigned, float v, int mask) {
    const int t = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
    emu::cta->exchange[t] = v;
    emu::wait(&emu::cta->warp_barriers[t / 32]);
    const float other = emu::cta->exchange[t ^ mask];
    emu::wait(&emu::cta->warp_barriers[t / 32]); // nobody overwrites before all have read
    return other;
}
// cp.async: a copy lands only when a wait retires its group, so a read before the right wait sees old data.
inline void __pipeline_memcpy_async(void *to, const void *from, size_t bytes, size_t = 0) {
    emu::self().open.push_back({to, from, bytes});
}
inline void __pipeline_commit() {
    emu::self().pending.push_back(std::move(emu::self().open));
    emu::self().open.clear();
}
inline void __pipeline_wait_prior(size_t newest_pending) {
    auto &pending = emu::self().pending;
    while (pending.size() > newest_pending) {
        for (const emu::Copy &c : pending.front()) std::memcpy(c.to, c.from, c.bytes);
        pending.erase(pending.begin());
    }
}
inline uint4 __ldg(const uint4 *p) { return *p; }
inline void __stwb(uint4 *p, uint4 v) { *p = v; }
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
struct emu_bf16 {
    unsigned short bits;
};
inline emu_bf16 __float2bfloat16_rn(float f) { // round to nearest even; NaN stays NaN
    unsigned u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<unsigned short>((u >> 16) | 0x40)};
    return {static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1)) >> 16)};
}
inline unsigned short __bfloat16_as_ushort(emu_bf16 b) { return b.bits; }
inline _Float16 __ushort_as_half(unsigned short b) {
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return h;
}
inline float __half2float(_Float16 h) { return static_cast<float>(h); }
inline _Float16 __float2half_rn(float f) { return static_cast<_Float16>(f); }
inline unsigned short __half_as_ushort(_Float16 h) {
    unsigned short b;
    std::memcpy(&b, &h, 2);
    return b;
}

namespace cooperative_groups {
struct cluster_group {
    unsigned num_blocks() const { return emu::cta->ranks; }
    unsigned block_rank() const { return emu::cta->rank; }
    void sync() const { emu::wait(&emu::cta->cluster_barrier); }
    template <typename T>
    T *map_shared_rank(T *p, unsigned rank) const {
        return reinterpret_cast<T *>(emu::cta->cluster->anchors.at(rank) +
                                     (reinterpret_cast<char *>(p) - &emu::anchor));
    }
};
inline cluster_group this_cluster() { return {}; }
} // namespace cooperative_groups

// ---------------------------------------------------------------------------------------------------------------
// The runtime.
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
using cudaStream_t = struct EmuStream *;
using cudaEvent_t = struct EmuEvent *;
struct EmuGraph {
    std::vector<std::function<void()>> work;
};
using cudaGraph_t = EmuGraph *;
using cudaGraphExec_t = EmuGraph *;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal };
constexpr unsigned cudaStreamNonBlocking = 1;
enum cudaLaunchAttributeID { cudaLaunchAttributeClusterDimension = 4 };
struct cudaLaunchAttribute {
    cudaLaunchAttributeID id;
    union {
        struct {
            unsigned x, y, z;
        } clusterDim;
        char bytes[64];
    } val;
};
struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned numAttrs;
};
struct cudaDeviceProp {
    char name[256];
    int multiProcessorCount, l2CacheSize;
};

namespace emu {
inline EmuGraph *capturing = nullptr;
constexpr int kSms = 4, kResidentPerSm = 2, kResidentClusters = 3; // few, so that a grid loops over rows

inline void enqueue(std::function<void()> work) {
    if (capturing)
        capturing->work.push_back(std::move(work));
    else
        work();
}

inline thread_local std::function<void()> body; // the kernel call of the CTA on this OS thread

// A fiber's start: the CTA's kernel call on its own stack, then back to the scheduler for good.
inline void prepare(ucontext_t *start, char *stack) {
    getcontext(start);
    start->uc_stack.ss_sp = stack;
    start->uc_stack.ss_size = kStack;
    start->uc_link = nullptr;
    makecontext(
        start,
        +[] {
            body();
            self().done = true;
            _longjmp(cta->scheduler, 1); // never returns: the scheduler's frame is alive
        },
        0);
}

// Runs the current fiber until it waits at a barrier or ends.
inline void enter() {
    if (_setjmp(cta->scheduler)) return;
    Fiber &f = self();
    if (f.started) _longjmp(f.at, 1);
    f.started = true;
    ucontext_t here;
    swapcontext(&here, &f.start); // comes back by _longjmp to the _setjmp above
}

inline void runCta(const std::function<void()> &kernel, dim3 grid, dim3 block, dim3 index, size_t smem, unsigned rank,
                   unsigned ranks, Cluster *cluster) {
    Cta c;
    c.rank = rank;
    c.ranks = ranks;
    c.cluster = cluster;
    gridDim = grid;
    blockDim = block;
    blockIdx = index;
    const int n = static_cast<int>(block.x * block.y * block.z), warps = (n + 31) / 32;
    c.fibers.resize(n);
    c.warp_barriers.resize(warps);
    c.exchange.assign(n, 0.f);
    dynamic_shared.assign(smem + 16, static_cast<char>(0xAB)); // garbage, as on a GPU
    while (stacks.size() < static_cast<size_t>(n)) stacks.emplace_back(new char[kStack]);
    body = kernel;
    cta = &c;
    for (int t = 0; t < n; ++t) {
        c.fibers[t].thread = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
        prepare(&c.fibers[t].start, stacks[t].get());
    }
    if (cluster) {
        cluster->anchors[rank] = &anchor;
        cluster->barrier->arrive_and_wait(); // every rank's anchor is known
    }
    auto resume = [&](int t) {
        c.current = t;
        threadIdx = c.fibers[t].thread;
        enter();
    };
    unsigned seed = 12345u + index.x;
    std::vector<int> order(warps);
    for (;;) {
        bool progress = false;
        for (int w = 0; w < warps; ++w) order[w] = w;
        for (int w = warps - 1; w > 0; --w) std::swap(order[w], order[(seed = seed * 1103515245u + 12345u) % (w + 1)]);
        for (int w : order) { // this warp as far as it gets: its shuffles released as soon as its lanes arrive
            const int first = w * 32, last = std::min(n, first + 32);
            for (bool ran = true; ran; progress |= ran) {
                ran = false;
                for (int t = first; t < last; ++t) {
                    if (!c.fibers[t].done && !c.fibers[t].waiting) resume(t), ran = true;
                }
                int at_shuffle = 0;
                for (int t = first; t < last; ++t) at_shuffle += c.fibers[t].waiting == &c.warp_barriers[w];
                if (at_shuffle == last - first) {
                    for (int t = first; t < last; ++t) c.fibers[t].waiting = nullptr;
                    ran = true;
                }
            }
        }
        int alive = 0, at_cta = 0, at_cluster = 0;
        for (const Fiber &f : c.fibers) {
            alive += !f.done;
            at_cta += !f.done && f.waiting == &c.cta_barrier;
            at_cluster += !f.done && f.waiting == &c.cluster_barrier;
        }
        if (alive == 0) {
            for (const Fiber &f : c.fibers) {
                if (!f.pending.empty() || !f.open.empty())
                    std::fprintf(stderr, "emu: a cp.async outlives its CTA\n"), std::abort();
            }
            break;
        }
        if (at_cta == alive || at_cluster == alive) {
            if (at_cluster == alive) cluster->barrier->arrive_and_wait();
            for (Fiber &f : c.fibers) f.waiting = nullptr;
            progress = true;
        }
        if (!progress) {
            std::fprintf(stderr,
                         "emu: deadlock in CTA %u: %d threads alive, %d at the CTA barrier, %d at the cluster's\n",
                         index.x, alive, at_cta, at_cluster);
            std::abort();
        }
    }
    cta = nullptr;
}

template <typename... Args, typename... Actual>
void launchWith(unsigned ranks, void (*kernel)(Args...), dim3 grid, dim3 block, size_t smem, Actual &&...actual) {
    std::tuple<Args...> args(std::forward<Actual>(actual)...);
    enqueue([=] {
        if (grid.y != 1 || grid.z != 1 || grid.x % ranks != 0) std::abort();
        const std::function<void()> call = [=] { std::apply(kernel, args); };
        for (unsigned first = 0; first < grid.x; first += ranks) {
            if (ranks == 1) {
                runCta(call, grid, block, dim3(first), smem, 0, 1, nullptr);
                continue;
            }
            std::barrier<> barrier(ranks);
            Cluster cluster{&barrier, std::vector<char *>(ranks)};
            std::vector<std::thread> threads;
            for (unsigned r = 0; r < ranks; ++r) {
                threads.emplace_back([&, r] { runCta(call, grid, block, dim3(first + r), smem, r, ranks, &cluster); });
            }
            for (auto &t : threads) t.join();
        }
    });
}

template <typename... Args, typename... Actual>
void launch(void (*kernel)(Args...), dim3 grid, dim3 block, size_t smem, cudaStream_t, Actual &&...actual) {
    launchWith(1, kernel, grid, block, smem, std::forward<Actual>(actual)...);
}
} // namespace emu

inline const char *cudaGetErrorString(cudaError_t) { return "emulated error"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDeviceCount(int *n) { return *n = 1, cudaSuccess; }
inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    std::snprintf(p->name, sizeof p->name, "CPU emulation");
    p->multiProcessorCount = emu::kSms;
    p->l2CacheSize = 1 << 20;
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { return *s = nullptr, cudaSuccess; }
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (*p) std::memset(*p, 0xCD, bytes); // garbage, never zeros
    return *p ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaFree(void *p) { return std::free(p), cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind, cudaStream_t) {
    emu::enqueue([=] { std::memcpy(dst, src, n); });
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) {
    emu::enqueue([=] { std::memset(p, v, n); });
    return cudaSuccess;
}
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <typename K>
cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, int) {
    return cudaSuccess;
}
template <typename K>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, K, int, size_t) {
    return *n = emu::kResidentPerSm, cudaSuccess;
}
template <typename K>
cudaError_t cudaOccupancyMaxActiveClusters(int *n, K, const cudaLaunchConfig_t *) {
    return *n = emu::kResidentClusters, cudaSuccess;
}
template <typename... Args, typename... Actual>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *config, void (*kernel)(Args...), Actual &&...actual) {
    unsigned ranks = 1;
    for (unsigned i = 0; i < config->numAttrs; ++i) {
        if (config->attrs[i].id == cudaLaunchAttributeClusterDimension) ranks = config->attrs[i].val.clusterDim.x;
    }
    emu::launchWith(ranks, kernel, config->gridDim, config->blockDim, config->dynamicSmemBytes,
                    std::forward<Actual>(actual)...);
    return cudaSuccess;
}
inline cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    emu::capturing = new EmuGraph;
    return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) {
    *g = emu::capturing;
    emu::capturing = nullptr;
    return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    return *e = new EmuGraph(*g), cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) { return delete g, cudaSuccess; }
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { return delete e, cudaSuccess; }
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
    for (auto &work : e->work) work();
    return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t *e) { return *e = nullptr, cudaSuccess; }
inline cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) { return *ms = 1.0f, cudaSuccess; }

// ---------------------------------------------------------------------------------------------------------------
// The library's C API: the seed RMSNorm backward in float64, rounded to the data's 16 bits.
struct InfiniopTensorDescriptor {
    size_t rows, dim;
    infiniDtype_t dtype;
};
struct InfiniopDescriptor {
    size_t rows, dim;
    infiniDtype_t dtype;
};
struct InfiniopHandle {};

namespace emu {
inline double value(infiniDtype_t t, uint16_t b) {
    return t == INFINI_DTYPE_BF16 ? __uint_as_float(uint32_t(b) << 16) : __half2float(__ushort_as_half(b));
}
inline uint16_t bits(infiniDtype_t t, double v) {
    return t == INFINI_DTYPE_BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(float(v)))
                                  : __half_as_ushort(__float2half_rn(float(v)));
}
} // namespace emu

extern "C" {
inline infiniStatus_t infinirtSetDevice(infiniDevice_t, int) { return INFINI_STATUS_SUCCESS; }
inline infiniStatus_t infiniopCreateHandle(infiniopHandle_t *h) {
    return *h = new InfiniopHandle, INFINI_STATUS_SUCCESS;
}
inline infiniStatus_t infiniopDestroyHandle(infiniopHandle_t h) { return delete h, INFINI_STATUS_SUCCESS; }
inline infiniStatus_t infiniopCreateTensorDescriptor(infiniopTensorDescriptor_t *d, size_t ndim, const size_t *shape,
                                                     const ptrdiff_t *, infiniDtype_t dtype) {
    return *d = new InfiniopTensorDescriptor{ndim == 2 ? shape[0] : 1, shape[ndim - 1], dtype}, INFINI_STATUS_SUCCESS;
}
inline infiniStatus_t infiniopDestroyTensorDescriptor(infiniopTensorDescriptor_t d) {
    return delete d, INFINI_STATUS_SUCCESS;
}
inline infiniStatus_t infiniopCreateRMSNormBackwardDescriptor(infiniopHandle_t,
                                                              infiniopRMSNormBackwardDescriptor_t *desc,
                                                              infiniopTensorDescriptor_t grad_x,
                                                              infiniopTensorDescriptor_t, infiniopTensorDescriptor_t,
                                                              infiniopTensorDescriptor_t, infiniopTensorDescriptor_t) {
    return *desc = new InfiniopDescriptor{grad_x->rows, grad_x->dim, grad_x->dtype}, INFINI_STATUS_SUCCESS;
}
inline infiniStatus_t infiniopGetRMSNormBackwardWorkspaceSize(infiniopRMSNormBackwardDescriptor_t, size_t *size) {
    return *size = 4096, INFINI_STATUS_SUCCESS;
}
inline infiniStatus_t infiniopRMSNormBackward(infiniopRMSNormBackwardDescriptor_t d, void *, size_t, void *grad_x,
                                              void *grad_w, const void *grad_y, const void *x, const void *w, void *) {
    const InfiniopDescriptor k = *d;
    emu::enqueue([=] {
        auto *gx = static_cast<uint16_t *>(grad_x), *gw = static_cast<uint16_t *>(grad_w);
        auto *gy = static_cast<const uint16_t *>(grad_y), *xs = static_cast<const uint16_t *>(x);
        auto *ws = static_cast<const uint16_t *>(w);
        auto v = [&](uint16_t b) { return emu::value(k.dtype, b); };
        std::vector<double> acc(k.dim, 0.0);
        for (size_t r = 0; r < k.rows; ++r) {
            const size_t o = r * k.dim;
            double s1 = 0, s2 = 0;
            for (size_t j = 0; j < k.dim; ++j)
                s1 += v(xs[o + j]) * v(xs[o + j]), s2 += v(gy[o + j]) * v(ws[j]) * v(xs[o + j]);
            const double rs = 1 / std::sqrt(s1 / k.dim), c = rs * rs * rs * s2 / k.dim;
            for (size_t j = 0; j < k.dim; ++j) {
                gx[o + j] = emu::bits(k.dtype, rs * v(gy[o + j]) * v(ws[j]) - c * v(xs[o + j]));
                acc[j] += v(gy[o + j]) * v(xs[o + j]) * rs;
            }
        }
        for (size_t j = 0; j < k.dim; ++j) gw[j] = emu::bits(k.dtype, acc[j]);
    });
    return INFINI_STATUS_SUCCESS;
}
}
