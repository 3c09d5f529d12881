// The CUDA that this project's kernels use, emulated on the CPU, so that they and their checks run without a GPU:
// the library's NVIDIA backend (built with `xmake f --nv-emulation=y`, whose build rewrites each launch
// `k<<<grid, block, smem, stream>>>(args)` into `emu::launchCall([=] { k(args); }, grid, block, smem, stream)`)
// and the issue-53 variants program (tests/native/cuda_on_cpu.h). Not a CUDA implementation: the kernels' logic
// (indices, tails, barriers, shuffles, clusters) as on a GPU and nothing about speed.
// - Each CTA runs on one OS thread, one fiber per CUDA thread. `__shared__` is static thread_local: the fibers of a
//   CTA share it, the CTAs of a cluster (one OS thread each) do not, and DSMEM maps an address to the same offset in
//   another CTA's thread-local block.
// - The scheduler is adversarial: warps in a random order, each run as far as its barriers let it before the next,
//   so a warp runs ahead of the others wherever the code allows it (a missing barrier or double buffer shows).
// - Device memory is host memory that starts as garbage (0xCD), every stream is synchronous, a graph records
//   launches and replays them. A launch the hardware refuses (more than 1024 threads, an empty grid) is not run and
//   leaves cudaErrorInvalidConfiguration for cudaGetLastError, as on a GPU.
// The shim headers beside this one (cuda_runtime.h, cuda_fp16.h, ...) stand for the toolkit's.
#pragma once
#undef _FORTIFY_SOURCE // its longjmp check refuses a jump to another stack (fiber to scheduler)

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 { // 16-byte vectors are 16-byte aligned, as in CUDA (UBSan checks their accesses)
    unsigned x, y, z, w;
};
struct float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct double2 {
    double x, y;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }
template <typename A, typename B>
inline auto min(A a, B b) { // the device min() of the math API
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
// The CTAs of one cluster meet here (std::barrier is C++20; the library builds as C++17).
class Rendezvous {
  public:
    explicit Rendezvous(unsigned count) : count_(count) {}
    void arriveAndWait() {
        std::unique_lock<std::mutex> lock(mutex_);
        const unsigned generation = generation_;
        if (++arrived_ == count_) {
            arrived_ = 0;
            ++generation_;
            changed_.notify_all();
            return;
        }
        changed_.wait(lock, [&] { return generation != generation_; });
    }

  private:
    std::mutex mutex_;
    std::condition_variable changed_;
    unsigned count_, arrived_ = 0, generation_ = 0;
};
struct Cluster {
    Rendezvous *barrier;
    std::vector<char *> anchors; // per rank: that CTA's thread-local `anchor`
};
struct Cta {
    std::vector<Fiber> fibers;
    jmp_buf scheduler;
    int current = 0, cta_barrier = 0, cluster_barrier = 0;
    std::vector<int> warp_barriers;
    std::vector<uint64_t> exchange; // a value per thread (up to 8 bytes), for shuffles
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

inline int linearThread() {
    return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

// Every lane of the warp publishes `value`, then reads lane `source(lane)`'s (its own where that is outside the
// warp), then waits until all have read, so that nobody overwrites a value another lane still needs.
template <typename T, typename Source>
T shuffle(T value, Source source) {
    static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>, "a shuffle moves up to 8 bytes");
    const int t = linearThread(), lane = t % 32, warp = t / 32;
    std::memcpy(&cta->exchange[t], &value, sizeof(T));
    wait(&cta->warp_barriers[warp]);
    const int from = source(lane);
    T other = value;
    if (from >= 0 && from < 32 && warp * 32 + from < static_cast<int>(cta->fibers.size())) {
        std::memcpy(&other, &cta->exchange[warp * 32 + from], sizeof(T));
    }
    wait(&cta->warp_barriers[warp]);
    return other;
}
} // namespace emu

inline void __syncthreads() { emu::wait(&emu::cta->cta_barrier); }
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask) {
    return emu::shuffle(v, [&](int lane) { return lane ^ mask; });
}
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta) {
    return emu::shuffle(v, [&](int lane) { return lane + static_cast<int>(delta); });
}
template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned delta) {
    return emu::shuffle(v, [&](int lane) { return lane - static_cast<int>(delta); });
}
template <typename T>
T __shfl_sync(unsigned, T v, int source) {
    return emu::shuffle(v, [&](int) { return source & 31; });
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
inline double __longlong_as_double(long long bits) {
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
}

// F16 and BF16 as the toolkit's conversions give them: round to nearest even, NaN stays NaN.
struct __nv_bfloat16 {
    unsigned short bits;
};
using __half = _Float16;
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<unsigned short>((u >> 16) | 0x40)};
    return {static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1)) >> 16)};
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }
inline __half __ushort_as_half(unsigned short b) {
    __half h;
    std::memcpy(&h, &b, 2);
    return h;
}
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __float2half_rn(float f) { return static_cast<__half>(f); }
inline unsigned short __half_as_ushort(__half h) {
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
enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorInitializationError = 3,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorStubLibrary = 34,
    cudaErrorNoDevice = 100,
    cudaErrorDevicesUnavailable = 46,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorUnsupportedPtxVersion = 222,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
};
using cudaStream_t = struct EmuStream *;
using cudaEvent_t = struct EmuEvent *;
struct EmuGraph {
    std::vector<std::function<void()>> work;
};
using cudaGraph_t = EmuGraph *;
using cudaGraphExec_t = EmuGraph *;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal };
constexpr unsigned cudaStreamNonBlocking = 1;
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
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
// A positive integer from the environment, else `otherwise`: the knobs below, which let a test stand for a GPU
// other than the default one.
inline int envInt(const char *variable, int otherwise) {
    const char *value = std::getenv(variable);
    const int n = value != nullptr ? std::atoi(value) : 0;
    return n > 0 ? n : otherwise;
}
// INFINIOP_EMULATED_CUDA_SMS=N: report N multiprocessors instead of kSms, so that a test can see the grids and
// workspaces the library plans for a GPU of a real one's width (without running them there).
inline int sms() { return envInt("INFINIOP_EMULATED_CUDA_SMS", kSms); }
// The dynamic shared memory a CTA may be given (cudaDevAttrMaxSharedMemoryPerBlockOptin): an H100/H200's 227 KiB,
// or INFINIOP_EMULATED_CUDA_SHARED_BYTES=N (99 KiB: an RTX 30xx/40xx), so that a test can check that no plan
// asks for more than its device has. A launch asking for more fails, as on a GPU.
constexpr int kSharedOptin = 232448;
inline int sharedOptin() { return envInt("INFINIOP_EMULATED_CUDA_SHARED_BYTES", kSharedOptin); }
// INFINIOP_EMULATED_CUDA_DEVICES=N: N devices instead of one (all of them this process's memory), so that a test can
// call on a device other than the current one.
inline int devices() { return envInt("INFINIOP_EMULATED_CUDA_DEVICES", 1); }
inline thread_local cudaError_t last_error = cudaSuccess;
inline thread_local int current_device = 0;

// With INFINIOP_EMULATED_CUDA_TRACE=FILE in the environment, each runtime call and kernel launch appends its name
// as a line to FILE, so a test can see what the host does per library call (tests/test_emulated_cuda_calls.py).
inline void trace(const char *name) {
    const char *path = std::getenv("INFINIOP_EMULATED_CUDA_TRACE");
    if (path == nullptr || *path == '\0') return;
    if (FILE *file = std::fopen(path, "a")) {
        std::fprintf(file, "%s\n", name);
        std::fclose(file);
    }
}

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
    c.exchange.assign(n, 0);
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
        cluster->barrier->arriveAndWait(); // every rank's anchor is known
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
            if (at_cluster == alive) cluster->barrier->arriveAndWait();
            for (Fiber &f : c.fibers) f.waiting = nullptr;
            progress = true;
        }
        if (!progress) {
            std::fprintf(stderr,
                         "emu: deadlock in CTA %u: %d threads alive, %d at the CTA barrier, %d at the cluster's, "
                         "the rest at a warp's shuffle that not all its lanes reach\n",
                         index.x, alive, at_cta, at_cluster);
            std::abort();
        }
    }
    cta = nullptr;
}

// The hardware's launch limits (no y/z grids or clusters along y/z here: nothing uses them).
inline bool launchable(dim3 grid, dim3 block, unsigned ranks) {
    const unsigned long long threads = 1ull * block.x * block.y * block.z;
    return threads >= 1 && threads <= 1024 && block.z <= 64 && grid.x >= 1 && grid.y == 1 && grid.z == 1 &&
           grid.x <= 0x7fffffffu && ranks >= 1 && grid.x % ranks == 0;
}

// Runs `call` (the kernel call with its arguments) as a grid; enqueued on the (synchronous) stream.
inline void launchCallOnClusters(unsigned ranks, std::function<void()> call, dim3 grid, dim3 block, size_t smem) {
    trace("launch");
    if (!launchable(grid, block, ranks) || smem > static_cast<size_t>(sharedOptin())) {
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    enqueue([=] {
        for (unsigned first = 0; first < grid.x; first += ranks) {
            if (ranks == 1) {
                runCta(call, grid, block, dim3(first), smem, 0, 1, nullptr);
                continue;
            }
            Rendezvous barrier(ranks);
            Cluster cluster{&barrier, std::vector<char *>(ranks)};
            std::vector<std::thread> threads;
            for (unsigned r = 0; r < ranks; ++r) {
                threads.emplace_back([&, r] { runCta(call, grid, block, dim3(first + r), smem, r, ranks, &cluster); });
            }
            for (auto &t : threads) t.join();
        }
    });
}

// What a rewritten `kernel<<<grid, block, smem, stream>>>(args)` calls: call = [=] { kernel(args); }.
template <typename Call>
void launchCall(Call call, dim3 grid, dim3 block, size_t smem = 0, cudaStream_t = nullptr) {
    launchCallOnClusters(1, std::function<void()>(std::move(call)), grid, block, smem);
}

template <typename... Args, typename... Actual>
void launchWith(unsigned ranks, void (*kernel)(Args...), dim3 grid, dim3 block, size_t smem, Actual &&...actual) {
    std::tuple<Args...> args(std::forward<Actual>(actual)...);
    launchCallOnClusters(ranks, [=] { std::apply(kernel, args); }, grid, block, smem);
}

template <typename... Args, typename... Actual>
void launch(void (*kernel)(Args...), dim3 grid, dim3 block, size_t smem, cudaStream_t, Actual &&...actual) {
    launchWith(1, kernel, grid, block, smem, std::forward<Actual>(actual)...);
}
} // namespace emu

inline const char *cudaGetErrorString(cudaError_t) { return "emulated error"; }
inline cudaError_t cudaGetLastError() {
    emu::trace(__func__);
    const cudaError_t error = emu::last_error;
    emu::last_error = cudaSuccess;
    return error;
}
inline cudaError_t cudaGetDeviceCount(int *n) { emu::trace(__func__); return *n = emu::devices(), cudaSuccess; }
inline cudaError_t cudaSetDevice(int device) {
    char name[32]; // with the device, so that a test can follow the current one: cudaSetDevice:1
    std::snprintf(name, sizeof name, "%s:%d", __func__, device);
    emu::trace(name);
    if (device < 0 || device >= emu::devices()) return cudaErrorInvalidDevice;
    emu::current_device = device;
    return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int *device) {
    emu::trace(__func__);
    return *device = emu::current_device, cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() { emu::trace(__func__); return cudaSuccess; }
inline cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attribute, int device) {
    emu::trace(__func__);
    if (device < 0 || device >= emu::devices()) return cudaErrorInvalidDevice;
    if (attribute == cudaDevAttrMaxSharedMemoryPerBlockOptin) return *value = emu::sharedOptin(), cudaSuccess;
    if (attribute != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
    return *value = emu::sms(), cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    emu::trace(__func__);
    std::snprintf(p->name, sizeof p->name, "CPU emulation");
    p->multiProcessorCount = emu::sms();
    p->l2CacheSize = 1 << 20;
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t *s) {
    emu::trace(__func__);
    return *s = reinterpret_cast<cudaStream_t>(new char), cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    emu::trace(__func__);
    return cudaStreamCreate(s);
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    emu::trace(__func__);
    return delete reinterpret_cast<char *>(s), cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { emu::trace(__func__); return cudaSuccess; }
inline cudaError_t cudaMalloc(void **p, size_t bytes) {
    emu::trace(__func__);
    *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256 * (bytes == 0));
    if (*p) std::memset(*p, 0xCD, bytes); // garbage, never zeros
    return *p ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaMallocHost(void **p, size_t bytes) { emu::trace(__func__); return cudaMalloc(p, bytes); }
inline cudaError_t cudaFree(void *p) { emu::trace(__func__); return std::free(p), cudaSuccess; }
inline cudaError_t cudaFreeHost(void *p) { emu::trace(__func__); return std::free(p), cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind, cudaStream_t) {
    emu::trace(__func__);
    emu::enqueue([=] { std::memcpy(dst, src, n); });
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind) {
    emu::trace(__func__);
    std::memcpy(dst, src, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) {
    emu::trace(__func__);
    emu::enqueue([=] { std::memset(p, v, n); });
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void *p, int v, size_t n) {
    emu::trace(__func__);
    return std::memset(p, v, n), cudaSuccess;
}
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <typename K>
cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, int) {
    emu::trace(__func__);
    return cudaSuccess;
}
template <typename K>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, K, int, size_t) {
    emu::trace(__func__);
    return *n = emu::kResidentPerSm, cudaSuccess;
}
template <typename K>
cudaError_t cudaOccupancyMaxActiveClusters(int *n, K, const cudaLaunchConfig_t *) {
    emu::trace(__func__);
    return *n = emu::kResidentClusters, cudaSuccess;
}
template <typename... Args, typename... Actual>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *config, void (*kernel)(Args...), Actual &&...actual) {
    emu::trace(__func__);
    unsigned ranks = 1;
    for (unsigned i = 0; i < config->numAttrs; ++i) {
        if (config->attrs[i].id == cudaLaunchAttributeClusterDimension) ranks = config->attrs[i].val.clusterDim.x;
    }
    emu::launchWith(ranks, kernel, config->gridDim, config->blockDim, config->dynamicSmemBytes,
                    std::forward<Actual>(actual)...);
    return cudaGetLastError();
}
inline cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    emu::trace(__func__);
    emu::capturing = new EmuGraph;
    return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) {
    emu::trace(__func__);
    *g = emu::capturing;
    emu::capturing = nullptr;
    return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    emu::trace(__func__);
    return *e = new EmuGraph(*g), cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) { emu::trace(__func__); return delete g, cudaSuccess; }
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { emu::trace(__func__); return delete e, cudaSuccess; }
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
    emu::trace(__func__);
    for (auto &work : e->work) work();
    return cudaSuccess;
}
// Streams are synchronous, so a recorded event is always complete. Each event is a heap object: destroying one
// twice, or never, shows under ASan.
struct EmuEvent {};
constexpr unsigned cudaEventDisableTiming = 2;
inline cudaError_t cudaEventCreate(cudaEvent_t *e) { emu::trace(__func__); return *e = new EmuEvent, cudaSuccess; }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
    emu::trace(__func__);
    return *e = new EmuEvent, cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) { emu::trace(__func__); return delete e, cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { emu::trace(__func__); return cudaSuccess; }
inline cudaError_t cudaEventQuery(cudaEvent_t) { emu::trace(__func__); return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { emu::trace(__func__); return cudaSuccess; }
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) {
    emu::trace(__func__);
    return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) {
    emu::trace(__func__);
    return *ms = 1.0f, cudaSuccess;
}
