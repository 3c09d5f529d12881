// oneDNN's LayerNorm and BatchNorm, backward and forward (training), on the benchmark's own buffers, for
// `infiniop-py bench` to time beside ours (bench/onednn.py compiles this on demand against an installed oneDNN; it is never part of the library).
// A C ABI so that cffi can load it without a compiler-specific name mangling.
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <unordered_map>

namespace {

// The benchmark's dtype codes (bench/onednn.py): 0 F32, 1 BF16, 2 F16.
dnnl::memory::data_type dataType(int code) {
    switch (code) {
    case 1: return dnnl::memory::data_type::bf16;
    case 2: return dnnl::memory::data_type::f16;
    default: return dnnl::memory::data_type::f32;
    }
}

struct Reference {
    dnnl::engine engine{dnnl::engine::kind::cpu, 0};
    dnnl::stream stream{engine};
    dnnl::primitive primitive;
    std::unordered_map<int, dnnl::memory> arguments;
};

struct Buffers {
    void *src, *diff_dst;
    float *mean, *variance, *scale;
    void *diff_src;
    float *diff_scale, *diff_shift;
};

const dnnl::normalization_flags kFlags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;

// src, diff_dst, diff_src of `data`; mean and variance of `stat`; scale, diff_scale, diff_shift of `channel`.
void bind(Reference &reference, const Buffers &buffers, const dnnl::memory::desc &data,
          const dnnl::memory::desc &stat, const dnnl::memory::desc &channel) {
    auto at = [&](const dnnl::memory::desc &desc, void *pointer) { return dnnl::memory(desc, reference.engine, pointer); };
    reference.arguments = {
        {DNNL_ARG_SRC, at(data, buffers.src)},           {DNNL_ARG_DIFF_DST, at(data, buffers.diff_dst)},
        {DNNL_ARG_MEAN, at(stat, buffers.mean)},         {DNNL_ARG_VARIANCE, at(stat, buffers.variance)},
        {DNNL_ARG_SCALE, at(channel, buffers.scale)},    {DNNL_ARG_DIFF_SRC, at(data, buffers.diff_src)},
        {DNNL_ARG_DIFF_SCALE, at(channel, buffers.diff_scale)}, {DNNL_ARG_DIFF_SHIFT, at(channel, buffers.diff_shift)},
    };
}

void layerNorm(Reference &reference, int dtype, int64_t rows, int64_t dim, float eps, const Buffers &buffers) {
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc data({rows, dim}, dataType(dtype), tag::ab);
    const dnnl::memory::desc stat({rows}, dnnl::memory::data_type::f32, tag::a);
    const dnnl::memory::desc channel({dim}, dnnl::memory::data_type::f32, tag::a);
    const dnnl::layer_normalization_forward::primitive_desc forward(
        reference.engine, dnnl::prop_kind::forward_training, data, data, stat, eps, kFlags);
    const dnnl::layer_normalization_backward::primitive_desc backward(
        reference.engine, dnnl::prop_kind::backward, data, data, data, stat, eps, kFlags, forward);
    reference.primitive = dnnl::layer_normalization_backward(backward);
    bind(reference, buffers, data, stat, channel);
    // With use_shift, oneDNN 3.2's LayerNorm backward counts a shift among its inputs (its BatchNorm does not),
    // though the gradients do not read it.
    reference.arguments.insert({DNNL_ARG_SHIFT, dnnl::memory(channel, reference.engine, buffers.scale)});
}

void batchNorm(Reference &reference, int dtype, int64_t batch, int64_t channels, int64_t spatial, float eps,
               const Buffers &buffers) {
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc data({batch, channels, spatial}, dataType(dtype), tag::abc);
    const dnnl::memory::desc channel({channels}, dnnl::memory::data_type::f32, tag::a);
    const dnnl::batch_normalization_forward::primitive_desc forward(
        reference.engine, dnnl::prop_kind::forward_training, data, data, eps, kFlags);
    const dnnl::batch_normalization_backward::primitive_desc backward(
        reference.engine, dnnl::prop_kind::backward, data, data, data, eps, kFlags, forward);
    reference.primitive = dnnl::batch_normalization_backward(backward);
    bind(reference, buffers, data, channel, channel);
}

// The training forwards: dst from src, scale and shift; mean and variance written (as oneDNN's training
// forward computes them: the row's or channel's statistics, biased variance).
struct ForwardBuffers {
    void *src, *dst;
    float *mean, *variance, *scale, *shift;
};

void bindForward(Reference &reference, const ForwardBuffers &buffers, const dnnl::memory::desc &data,
                 const dnnl::memory::desc &stat, const dnnl::memory::desc &channel) {
    auto at = [&](const dnnl::memory::desc &desc, void *pointer) { return dnnl::memory(desc, reference.engine, pointer); };
    reference.arguments = {
        {DNNL_ARG_SRC, at(data, buffers.src)},       {DNNL_ARG_DST, at(data, buffers.dst)},
        {DNNL_ARG_MEAN, at(stat, buffers.mean)},     {DNNL_ARG_VARIANCE, at(stat, buffers.variance)},
        {DNNL_ARG_SCALE, at(channel, buffers.scale)}, {DNNL_ARG_SHIFT, at(channel, buffers.shift)},
    };
}

void layerNormForward(Reference &reference, int dtype, int64_t rows, int64_t dim, float eps,
                      const ForwardBuffers &buffers) {
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc data({rows, dim}, dataType(dtype), tag::ab);
    const dnnl::memory::desc stat({rows}, dnnl::memory::data_type::f32, tag::a);
    const dnnl::memory::desc channel({dim}, dnnl::memory::data_type::f32, tag::a);
    const dnnl::layer_normalization_forward::primitive_desc forward(
        reference.engine, dnnl::prop_kind::forward_training, data, data, stat, eps, kFlags);
    reference.primitive = dnnl::layer_normalization_forward(forward);
    bindForward(reference, buffers, data, stat, channel);
}

void batchNormForward(Reference &reference, int dtype, int64_t batch, int64_t channels, int64_t spatial, float eps,
                      const ForwardBuffers &buffers) {
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc data({batch, channels, spatial}, dataType(dtype), tag::abc);
    const dnnl::memory::desc channel({channels}, dnnl::memory::data_type::f32, tag::a);
    const dnnl::batch_normalization_forward::primitive_desc forward(
        reference.engine, dnnl::prop_kind::forward_training, data, data, eps, kFlags);
    reference.primitive = dnnl::batch_normalization_forward(forward);
    bindForward(reference, buffers, data, channel, channel);
}

} // namespace

extern "C" {

// kind 0: LayerNorm over (a, b) rows; kind 1: BatchNorm over (a, b, c) = (N, C, L). NULL on failure, with the
// reason (oneDNN's, e.g. "could not create a primitive descriptor" where it has no kernel for the dtype) in error.
void *onednn_create(int kind, int dtype, int64_t a, int64_t b, int64_t c, float eps, void *src, void *diff_dst,
                    float *mean, float *variance, float *scale, void *diff_src, float *diff_scale, float *diff_shift,
                    char *error, size_t error_size) {
    try {
        auto reference = std::make_unique<Reference>();
        const Buffers buffers{src, diff_dst, mean, variance, scale, diff_src, diff_scale, diff_shift};
        if (kind == 0) {
            layerNorm(*reference, dtype, a, b, eps, buffers);
        } else {
            batchNorm(*reference, dtype, a, b, c, eps, buffers);
        }
        return reference.release();
    } catch (const std::exception &failure) {
        std::snprintf(error, error_size, "%s", failure.what());
        return nullptr;
    }
}

// The training forwards: kind 0: LayerNorm over (a, b) rows; kind 1: BatchNorm over (a, b, c) = (N, C, L). mean
// and variance are written. NULL on failure, with the reason in error.
void *onednn_create_forward(int kind, int dtype, int64_t a, int64_t b, int64_t c, float eps, void *src, void *dst,
                            float *mean, float *variance, float *scale, float *shift, char *error,
                            size_t error_size) {
    try {
        auto reference = std::make_unique<Reference>();
        const ForwardBuffers buffers{src, dst, mean, variance, scale, shift};
        if (kind == 0) {
            layerNormForward(*reference, dtype, a, b, eps, buffers);
        } else {
            batchNormForward(*reference, dtype, a, b, c, eps, buffers);
        }
        return reference.release();
    } catch (const std::exception &failure) {
        std::snprintf(error, error_size, "%s", failure.what());
        return nullptr;
    }
}

// 0, or 1 with oneDNN's reason in error.
int onednn_run(void *handle, char *error, size_t error_size) {
    auto *reference = static_cast<Reference *>(handle);
    try {
        reference->primitive.execute(reference->stream, reference->arguments);
        reference->stream.wait();
        return 0;
    } catch (const std::exception &failure) {
        std::snprintf(error, error_size, "%s", failure.what());
        return 1;
    }
}

void onednn_destroy(void *handle) { delete static_cast<Reference *>(handle); }

void onednn_version(int *major, int *minor, int *patch) {
    const dnnl_version_t *version = dnnl_version();
    *major = version->major;
    *minor = version->minor;
    *patch = version->patch;
}
}
