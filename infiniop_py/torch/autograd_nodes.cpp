// The eager autograd nodes of infiniop_py.torch, in C++ (issue 52): the backward of each norm runs this library's
// kernel without Python, as PyTorch's own norms do. A Python Function's backward needs the GIL, and on CUDA runs
// on autograd's device thread (33-87 us to start on an H200, 47-102 inside, where torch's whole backward takes
// 100-150); a C++ node's does not.
//
// For ordinary operands the whole forward runs here (the <op>_forward functions, at the end: one call from Python,
// through pybind11 where Python's headers were found, else through torch.ops): the kernel ops.py would choose,
// then, where autograd records, a Node of its own (RMSNormBackward, ...) as the output's grad_fn. Otherwise the
// forward runs in Python (ops.FORWARDS: its checks, torch's errors, the rarer kernels); then
// torch.ops.infiniop_nodes.<op>(output, statistics..., input, parameters..., options) makes `output` the output of
// a torch::autograd::Function (RMSNormNode, ...): it is marked dirty (written by the node), so autograd gives it
// this node as grad_fn in place, not a view of it (a view could not be modified in place afterwards: `relu_` after
// a norm). Either node saves what the backward needs and, in the backward, allocates the gradients and runs the
// kernel through the C API from a descriptor cached per layout (rmsNormGradients, ...). Built on first use against
// the installed torch (autograd_nodes.py).
#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include "infiniop.h"
#include "infinirt.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;

void check(infiniStatus_t status, const char *what) {
    TORCH_CHECK(status == INFINI_STATUS_SUCCESS, "infiniop_py: ", what, " failed (infiniStatus_t ",
                static_cast<int>(status), ")");
}

infiniDtype_t dtypeOf(const Tensor &tensor) {
    switch (tensor.scalar_type()) {
    case at::kHalf: return INFINI_DTYPE_F16;
    case at::kBFloat16: return INFINI_DTYPE_BF16;
    case at::kFloat: return INFINI_DTYPE_F32;
    case at::kDouble: return INFINI_DTYPE_F64;
    default: TORCH_CHECK(false, "infiniop_py: no kernel for dtype ", tensor.scalar_type());
    }
}

bool isHalf(at::ScalarType dtype) { return dtype == at::kHalf || dtype == at::kBFloat16; }

// The statistics' dtype of the kernels: F64 for F64 data, else F32.
at::ScalarType statisticsDtype(const Tensor &input) {
    return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Saved statistics in that dtype (PyTorch's forwards save the same, but BatchNorm with 16-bit parameters, whose
// 16-bit ones are widened here).
Tensor statistics(const Tensor &tensor, const Tensor &input) {
    const auto dtype = statisticsDtype(input);
    return tensor.scalar_type() == dtype ? tensor : tensor.to(dtype);
}

// The shape of statistics with the normalized dims kept (ones), as PyTorch's forwards return them.
std::vector<int64_t> keptDims(at::IntArrayRef leading, size_t normalized_dims) {
    std::vector<int64_t> shape(leading.begin(), leading.end());
    shape.insert(shape.end(), normalized_dims, 1);
    return shape;
}

// A tensor descriptor for the life of one descriptor creation (NULL for an absent tensor).
class TensorDescriptor {
  public:
    explicit TensorDescriptor(const Tensor &tensor) {
        if (!tensor.defined()) return;
        std::vector<size_t> shape(tensor.sizes().begin(), tensor.sizes().end());
        std::vector<ptrdiff_t> strides(tensor.strides().begin(), tensor.strides().end());
        check(infiniopCreateTensorDescriptor(&descriptor_, shape.size(), shape.data(), strides.data(), dtypeOf(tensor)),
              "infiniopCreateTensorDescriptor");
    }
    ~TensorDescriptor() {
        if (descriptor_ != nullptr) infiniopDestroyTensorDescriptor(descriptor_);
    }
    TensorDescriptor(const TensorDescriptor &) = delete;
    TensorDescriptor &operator=(const TensorDescriptor &) = delete;
    operator infiniopTensorDescriptor_t() const { return descriptor_; }

  private:
    infiniopTensorDescriptor_t descriptor_ = nullptr;
};

// The library's handle for a device, made once (a descriptor copies the device from it at creation).
infiniopHandle_t handleFor(const at::Device &device) {
    static std::mutex mutex;
    static std::map<std::pair<int, int>, infiniopHandle_t> handles;
    const bool cuda = device.is_cuda();
    TORCH_CHECK(cuda || device.is_cpu(), "infiniop_py: no backend for device ", device);
    const auto key = std::make_pair(cuda ? 1 : 0, cuda ? static_cast<int>(device.index()) : 0);
    std::lock_guard<std::mutex> lock(mutex);
    auto found = handles.find(key);
    if (found != handles.end()) return found->second;
    infiniDevice_t previous_device = INFINI_DEVICE_CPU;
    int previous_id = 0;
    check(infinirtGetDevice(&previous_device, &previous_id), "infinirtGetDevice");
    check(infinirtSetDevice(cuda ? INFINI_DEVICE_NVIDIA : INFINI_DEVICE_CPU, key.second), "infinirtSetDevice");
    infiniopHandle_t handle = nullptr;
    const infiniStatus_t status = infiniopCreateHandle(&handle);
    infinirtSetDevice(previous_device, previous_id);
    check(status, "infiniopCreateHandle");
    return handles[key] = handle;
}

// torch's current stream on the device (NULL on the CPU): the device-generic getter, so that this file needs no
// CUDA headers.
void *streamOn(const at::Device &device) {
    if (!device.is_cuda()) return nullptr;
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
}

void *streamOf(const Tensor &tensor) { return streamOn(tensor.device()); }

// An operator descriptor of one layout and its workspace size; the descriptor is destroyed with its last user (the
// cache may drop it while a backward on another thread still runs it).
struct Kernel {
    std::shared_ptr<void> descriptor;
    size_t workspace_size = 0;

    template <typename Descriptor>
    Descriptor as() const {
        return static_cast<Descriptor>(descriptor.get());
    }
};

// A Kernel owning a created descriptor: destroyed by `destroy`, its workspace size from `workspace_size`.
template <typename Descriptor>
Kernel owned(Descriptor descriptor, infiniStatus_t (*destroy)(Descriptor),
             infiniStatus_t (*workspace_size)(Descriptor, size_t *)) {
    Kernel kernel;
    kernel.descriptor = std::shared_ptr<void>(descriptor, [destroy](void *d) { destroy(static_cast<Descriptor>(d)); });
    check(workspace_size(descriptor, &kernel.workspace_size), "the workspace size query");
    return kernel;
}

// What may differ between two calls that one descriptor serves: the op, its options, and per tensor its dtype,
// device, shape and strides (-1 for an absent one).
using Key = std::vector<int64_t>;

// A key starting with `head`, with room for the layouts: growing it push_back by push_back cost five allocations.
Key newKey(std::initializer_list<int64_t> head) {
    Key key;
    key.reserve(96);
    key.insert(key.end(), head);
    return key;
}

void addLayout(Key &key, const Tensor &tensor) {
    if (!tensor.defined()) {
        key.push_back(-1);
        return;
    }
    key.push_back(static_cast<int64_t>(tensor.scalar_type()));
    key.push_back(static_cast<int64_t>(tensor.device().type()) * 1024 + tensor.device().index());
    key.push_back(tensor.dim());
    for (int64_t size : tensor.sizes()) key.push_back(size);
    for (int64_t stride : tensor.strides()) key.push_back(stride);
}

void addLayouts(Key &key, std::initializer_list<const Tensor *> tensors) {
    for (const Tensor *tensor : tensors) addLayout(key, *tensor);
}

// Layouts a cache here keeps; it is emptied when full, as the functional API's Python tables (a workload has few).
constexpr size_t kKnownLayoutsCapacity = 64;

// The kernels of known layouts, create() making a missing one.
template <typename Create>
std::shared_ptr<const Kernel> kernelFor(const Key &key, Create &&create) {
    static std::mutex mutex;
    static std::map<Key, std::shared_ptr<const Kernel>> kernels;
    {
        std::lock_guard<std::mutex> lock(mutex);
        auto found = kernels.find(key);
        if (found != kernels.end()) return found->second;
    }
    auto kernel = std::make_shared<const Kernel>(create());
    std::lock_guard<std::mutex> lock(mutex);
    if (kernels.size() >= kKnownLayoutsCapacity) kernels.clear();
    kernels.emplace(key, kernel);
    return kernel;
}

// The workspace of one run. On the CPU each thread reuses one block, grown as needed (the run is synchronous, and
// nothing else runs on this thread while it does): its partial sums stay in cache, where a fresh block from the
// allocator cost a LayerNorm backward of 1M elements 14 us. On CUDA, torch's caching allocator on the current stream.
Tensor workspaceOf(size_t workspace_size, const at::TensorOptions &like) {
    const auto size = static_cast<int64_t>(workspace_size);
    if (size == 0) return Tensor();
    if (like.device().is_cpu()) {
        thread_local Tensor spare;
        if (!spare.defined() || spare.numel() < size) spare = at::empty({size}, like.dtype(at::kByte));
        return spare;
    }
    return at::empty({size}, like.dtype(at::kByte));
}

Tensor workspaceFor(const Kernel &kernel, const Tensor &like) {
    return workspaceOf(kernel.workspace_size, like.options());
}

void *data(const Tensor &tensor) { return tensor.defined() ? tensor.data_ptr() : nullptr; }

// A double's bits, for cache keys that must tell every value apart.
int64_t bitsOf(double value) {
    int64_t bits = 0;
    std::memcpy(&bits, &value, sizeof value);
    return bits;
}

// Backwards run since the library was loaded, per op (RMSNorm, LayerNorm, BatchNorm): what a caller sees of which
// path its backwards took (torch.ops.infiniop_nodes.backward_calls()).
std::atomic<int64_t> backward_calls[3];

std::vector<int64_t> backwardCalls() {
    return {backward_calls[0].load(), backward_calls[1].load(), backward_calls[2].load()};
}

// A fresh contiguous tensor like `parameter` where its gradient is wanted (else undefined).
Tensor gradientLike(const Tensor &parameter, bool wanted) {
    return wanted && parameter.defined() ? at::empty_like(parameter, at::MemoryFormat::Contiguous) : Tensor();
}

// Where the engine records the backward (create_graph=True: a gradient penalty, a Hessian-vector product), the
// gradients come from PyTorch's differentiable formulas instead of the kernels, so that they can be differentiated
// again, as stock's are (the <op>RecordedGradients functions). Error nodes in their place, as Python's
// once_differentiable makes, refused a .backward() through them, but torch.autograd.grad(penalty, parameters) does not
// run a node that leads to none of its inputs: such a penalty's gradient silently lacked the norm's second-order
// terms.
// Also where the incoming gradient is batched (torch.autograd.grad(..., is_grads_batched=True) runs the backward
// under vmap) or functorch's: the kernels read plain memory, which such tensors do not have; PyTorch's ops batch.
bool recordsBackward(const Tensor &grad_output) {
    static const c10::DispatchKeySet batched(
        {c10::DispatchKey::Batched, c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper});
    return at::GradMode::is_enabled() || grad_output.key_set().has_any(batched);
}

// `tensor` in F32 where it is 16-bit (the formulas take F32 and F64, with statistics of the same dtype), else itself.
Tensor wide(const Tensor &tensor) {
    return tensor.defined() && isHalf(tensor.scalar_type()) ? tensor.to(at::kFloat) : tensor;
}

// `tensor` in the dtype of `like` (undefined stays so).
Tensor asDtypeOf(const Tensor &tensor, const Tensor &like) {
    return tensor.defined() && tensor.scalar_type() != like.scalar_type() ? tensor.to(like.scalar_type()) : tensor;
}

// A gradient in its operand's dtype (undefined where not wanted).
Tensor gradientOf(const Tensor &gradient, const Tensor &operand, bool wanted) {
    return wanted ? asDtypeOf(gradient, operand) : Tensor();
}

// ------------------------------------------------------------------------------------------------------ RMSNorm

// RMSNorm's (grad_input, grad_weight), each where wanted (else undefined), from the forward's input, weight (of the
// data's dtype or F32 with 16-bit data) and rstd (input.shape[:-normalized_dims], ones after them or not).
variable_list rmsNormGradients(const Tensor &grad_output, const Tensor &saved_input, const Tensor &weight,
                               const Tensor &saved_rstd, bool want_input, bool want_weight) {
    const Tensor input = saved_input.contiguous();
    const auto leading = input.sizes().slice(0, input.dim() - weight.dim());
    const Tensor rstd = statistics(saved_rstd, input).reshape(leading);
    const Tensor grad = grad_output.contiguous();
    Tensor grad_input = at::empty_like(input, at::MemoryFormat::Contiguous);
    Tensor grad_weight = gradientLike(weight, want_weight);
    Key key = newKey({0});
    addLayouts(key, {&grad_input, &grad_weight, &grad, &input, &weight, &rstd});
    const auto kernel = kernelFor(key, [&] {
        TensorDescriptor gx(grad_input), gw(grad_weight), gy(grad), x(input), w(weight), r(rstd);
        infiniopRMSNormBackwardDescriptor_t descriptor = nullptr;
        check(infiniopCreateRMSNormBackwardDescriptorEx(handleFor(input.device()), &descriptor, gx, gw, gy, x, w, r,
                                                         0.0),
              "infiniopCreateRMSNormBackwardDescriptorEx");
        return owned(descriptor, infiniopDestroyRMSNormBackwardDescriptor, infiniopGetRMSNormBackwardWorkspaceSize);
    });
    Tensor workspace = workspaceFor(*kernel, input);
    check(infiniopRMSNormBackwardEx(kernel->as<infiniopRMSNormBackwardDescriptor_t>(), data(workspace),
                                    kernel->workspace_size, data(grad_input), data(grad_weight), grad.data_ptr(),
                                    input.data_ptr(), weight.data_ptr(), rstd.data_ptr(), streamOf(input)),
          "infiniopRMSNormBackwardEx");
    ++backward_calls[0];
    return {want_input ? grad_input : Tensor(), grad_weight};
}

// RMSNorm's gradients by PyTorch's differentiable ops (recordsBackward), in F32 or F64: rstd formed again from the
// input, so that its own derivative is recorded; eps as the forward took it (none: PyTorch's default, the compute
// type's epsilon).
variable_list rmsNormRecordedGradients(const Tensor &grad_output, const Tensor &input, const Tensor &weight,
                                       std::optional<double> eps, bool want_input, bool want_weight) {
    const Tensor x = wide(input), w = asDtypeOf(weight, x), grad = asDtypeOf(grad_output, x);
    const int64_t leading_dims = input.dim() - weight.dim();
    std::vector<int64_t> normalized, leading;
    for (int64_t d = 0; d < input.dim(); ++d) (d < leading_dims ? leading : normalized).push_back(d);
    const double epsilon = eps ? *eps
                               : x.scalar_type() == at::kDouble ? std::numeric_limits<double>::epsilon()
                                                                : std::numeric_limits<float>::epsilon();
    const Tensor rstd = at::rsqrt(x.square().mean(normalized, /*keepdim=*/true) + epsilon);
    const Tensor xhat = x * rstd, grad_xhat = grad * w;
    Tensor grad_input, grad_weight;
    if (want_input) grad_input = rstd * (grad_xhat - xhat * (grad_xhat * xhat).mean(normalized, true));
    if (want_weight) grad_weight = leading.empty() ? grad * xhat : (grad * xhat).sum(leading);
    return {gradientOf(grad_input, input, want_input), gradientOf(grad_weight, weight, want_weight)};
}

variable_list rmsNormBackward(const Tensor &grad_output, const Tensor &input, const Tensor &weight,
                              const Tensor &rstd, std::optional<double> eps, bool want_input, bool want_weight) {
    return recordsBackward(grad_output)
               ? rmsNormRecordedGradients(grad_output, input, weight, eps, want_input, want_weight)
               : rmsNormGradients(grad_output, input, weight, rstd, want_input, want_weight);
}

// RMSNorm's input as its nodes save it. An inference-mode tensor cannot be saved, and torch's CPU RMSNorm (a
// composite: it saves a product of the input) takes one where weight requires grad: a copy is saved instead, the
// memory torch's own save takes (2026-12-08). LayerNorm and BatchNorm refuse it, as torch's do.
Tensor savableInput(const Tensor &input) { return input.is_inference() ? input.clone() : input; }

struct RMSNormNode : public torch::autograd::Function<RMSNormNode> {
    // (output, rstd, input, weight, eps): output and rstd from the forward; weight of the data's dtype or F32
    // (16-bit data), as the kernel takes it. rstd: input.shape[:-normalized_dims] + (1,) * normalized_dims, or
    // that without the ones. eps: the forward's (for recordsBackward).
    static Tensor forward(AutogradContext *ctx, Tensor output, const Tensor &rstd, const Tensor &input,
                          const Tensor &weight, std::optional<double> eps) {
        ctx->mark_dirty({output});
        ctx->save_for_backward({savableInput(input), weight, rstd});
        if (eps) ctx->saved_data["eps"] = *eps;
        return output;
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        if (!grads[0].defined()) return variable_list(5);
        const variable_list saved = ctx->get_saved_variables();
        const auto eps = ctx->saved_data.find("eps");
        variable_list gradients = rmsNormBackward(
            grads[0], saved[0], saved[1], saved[2],
            eps == ctx->saved_data.end() ? std::nullopt : std::optional<double>(eps->second.toDouble()),
            ctx->needs_input_grad(2), ctx->needs_input_grad(3));
        return {Tensor(), Tensor(), gradients[0], gradients[1], Tensor()};
    }
};

Tensor rmsNorm(Tensor output, const Tensor &rstd, const Tensor &input, const Tensor &weight,
               std::optional<double> eps) {
    return RMSNormNode::apply(output, rstd, input, weight, eps);
}

// ---------------------------------------------------------------------------------------------------- LayerNorm

// LayerNorm's (grad_input, grad_weight, grad_bias), each where wanted (else undefined), from the forward's input,
// parameters (either may be undefined; both in their dtype, the data's or F32 with 16-bit data), mean and rstd.
variable_list layerNormGradients(const Tensor &grad_output, const Tensor &saved_input, const Tensor &weight,
                                 const Tensor &bias, const Tensor &saved_mean, const Tensor &saved_rstd,
                                 int64_t normalized_dims, bool want_input, bool want_weight, bool want_bias) {
    const Tensor input = saved_input.contiguous();
    const auto leading = input.sizes().slice(0, input.dim() - normalized_dims);
    const Tensor mean = statistics(saved_mean, input).reshape(leading);
    const Tensor rstd = statistics(saved_rstd, input).reshape(leading);
    const Tensor grad = grad_output.contiguous();
    const Tensor &parameter = weight.defined() ? weight : bias; // both gradients take its dtype
    Tensor grad_input = at::empty_like(input, at::MemoryFormat::Contiguous);
    Tensor grad_weight = weight.defined() ? gradientLike(parameter, want_weight) : Tensor();
    Tensor grad_bias = bias.defined() ? gradientLike(parameter, want_bias) : Tensor();
    Key key = newKey({1});
    addLayouts(key, {&grad_input, &grad_weight, &grad_bias, &grad, &weight, &input, &mean, &rstd});
    const auto kernel = kernelFor(key, [&] {
        TensorDescriptor gx(grad_input), gw(grad_weight), gb(grad_bias), gy(grad), w(weight), x(input), m(mean),
            r(rstd);
        infiniopLayerNormBackwardDescriptor_t descriptor = nullptr;
        check(infiniopCreateLayerNormBackwardFromInputDescriptorEx(handleFor(input.device()), &descriptor, gx, gw, gb,
                                                                   gy, w, x, m, r),
              "infiniopCreateLayerNormBackwardFromInputDescriptorEx");
        return owned(descriptor, infiniopDestroyLayerNormBackwardDescriptor, infiniopGetLayerNormBackwardWorkspaceSize);
    });
    Tensor workspace = workspaceFor(*kernel, input);
    check(infiniopLayerNormBackwardFromInputEx(kernel->as<infiniopLayerNormBackwardDescriptor_t>(), data(workspace),
                                               kernel->workspace_size, data(grad_input), data(grad_weight),
                                               data(grad_bias), grad.data_ptr(), data(weight), input.data_ptr(),
                                               mean.data_ptr(), rstd.data_ptr(), streamOf(input)),
          "infiniopLayerNormBackwardFromInputEx");
    ++backward_calls[1];
    return {want_input ? grad_input : Tensor(), grad_weight, grad_bias};
}

// LayerNorm's gradients by PyTorch's differentiable native_layer_norm_backward (recordsBackward), in F32 or F64,
// from the forward's mean and rstd, as PyTorch's own LayerNorm differentiates its backward.
variable_list layerNormRecordedGradients(const Tensor &grad_output, const Tensor &input, const Tensor &weight,
                                         const Tensor &bias, const Tensor &saved_mean, const Tensor &saved_rstd,
                                         int64_t normalized_dims, bool want_input, bool want_weight,
                                         bool want_bias) {
    const Tensor x = wide(input);
    const auto leading = input.sizes().slice(0, input.dim() - normalized_dims);
    const auto kept = keptDims(leading, static_cast<size_t>(normalized_dims));
    const Tensor mean = asDtypeOf(saved_mean, x).reshape(kept), rstd = asDtypeOf(saved_rstd, x).reshape(kept);
    const auto gradients = at::native_layer_norm_backward(
        asDtypeOf(grad_output, x), x, input.sizes().slice(input.dim() - normalized_dims), mean, rstd,
        asDtypeOf(weight, x), asDtypeOf(bias, x), {want_input, want_weight, want_bias});
    return {gradientOf(std::get<0>(gradients), input, want_input),
            gradientOf(std::get<1>(gradients), weight, want_weight),
            gradientOf(std::get<2>(gradients), bias, want_bias)};
}

variable_list layerNormBackward(const Tensor &grad_output, const Tensor &input, const Tensor &weight,
                                const Tensor &bias, const Tensor &mean, const Tensor &rstd, int64_t normalized_dims,
                                bool want_input, bool want_weight, bool want_bias) {
    return (recordsBackward(grad_output) ? layerNormRecordedGradients : layerNormGradients)(
        grad_output, input, weight, bias, mean, rstd, normalized_dims, want_input, want_weight, want_bias);
}

struct LayerNormNode : public torch::autograd::Function<LayerNormNode> {
    // (output, mean, rstd, input, weight, bias, normalized_dims): the kernel's from-input form; weight and bias
    // (either may be undefined) share a dtype, the data's or F32 (16-bit data).
    static Tensor forward(AutogradContext *ctx, Tensor output, const Tensor &mean, const Tensor &rstd,
                          const Tensor &input, const std::optional<Tensor> &weight, const std::optional<Tensor> &bias,
                          int64_t normalized_dims) {
        ctx->mark_dirty({output});
        ctx->save_for_backward({input, weight.value_or(Tensor()), bias.value_or(Tensor()), mean, rstd});
        ctx->saved_data["normalized_dims"] = normalized_dims;
        return output;
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        if (!grads[0].defined()) return variable_list(7);
        const variable_list saved = ctx->get_saved_variables();
        const Tensor &weight = saved[1], &bias = saved[2];
        // needs_input_grad counts the inputs that are tensors: an absent weight takes no place.
        const bool want_weight = weight.defined() && ctx->needs_input_grad(4);
        const bool want_bias = bias.defined() && ctx->needs_input_grad(weight.defined() ? 5 : 4);
        variable_list gradients =
            layerNormBackward(grads[0], saved[0], weight, bias, saved[3], saved[4],
                              ctx->saved_data["normalized_dims"].toInt(), ctx->needs_input_grad(3), want_weight,
                              want_bias);
        return {Tensor(), Tensor(), Tensor(), gradients[0], gradients[1], gradients[2], Tensor()};
    }
};

Tensor layerNorm(Tensor output, const Tensor &mean, const Tensor &rstd, const Tensor &input,
                 const std::optional<Tensor> &weight, const std::optional<Tensor> &bias, int64_t normalized_dims) {
    return LayerNormNode::apply(output, mean, rstd, input, weight, bias, normalized_dims);
}

// ---------------------------------------------------------------------------------------------------- BatchNorm

// Channels-first or channels-last packed (C innermost, then the spatial dims, then N): the kernel's layouts. As
// ops._batch_packed: torch's own channels-last checks for ranks 4 and 5 (no movedim view to make).
bool batchPacked(const Tensor &input) {
    if (input.is_contiguous()) return true;
    if (input.dim() == 4) return input.is_contiguous(at::MemoryFormat::ChannelsLast);
    if (input.dim() == 5) return input.is_contiguous(at::MemoryFormat::ChannelsLast3d);
    return input.movedim(1, -1).is_contiguous();
}

// BatchNorm's (grad_input, grad_weight, grad_bias), each where wanted (else undefined): training from the forward's
// save_mean and save_invstd, eval from the running statistics and eps; weight and the running statistics of shape
// (C,), either may be undefined.
variable_list batchNormGradients(const Tensor &grad_output, const Tensor &saved_input, const Tensor &weight,
                                 const Tensor &running_mean, const Tensor &running_var, const Tensor &saved_mean,
                                 const Tensor &saved_invstd, bool training, double eps, bool want_input,
                                 bool want_weight, bool want_bias) {
    Tensor input = saved_input;
    if (!batchPacked(input)) input = input.contiguous();
    const Tensor save_mean = training ? statistics(saved_mean, input) : Tensor();
    const Tensor save_invstd = training ? statistics(saved_invstd, input) : Tensor();
    // grad_output in input's layout, copied only where its strides differ.
    Tensor grad = grad_output;
    if (grad.strides() != input.strides()) grad = at::empty_like(input).copy_(grad_output);
    // The gradients of the parameters: (C,) in their dtype (the weight's, else the running statistics', else the
    // data's).
    const Tensor &parameter = weight.defined() ? weight : running_mean;
    const auto options = parameter.defined() ? parameter.options() : input.options();
    Tensor grad_input = at::empty_like(input);
    Tensor grad_weight = want_weight ? at::empty({input.size(1)}, options) : Tensor();
    Tensor grad_bias = want_bias ? at::empty({input.size(1)}, options) : Tensor();
    Key key = newKey({2, training, bitsOf(eps)}); // eps exactly, as the descriptor keeps it
    addLayouts(key, {&grad_input, &grad_weight, &grad_bias, &input, &grad, &weight, &running_mean, &running_var,
                     &save_mean, &save_invstd});
    const auto kernel = kernelFor(key, [&] {
        TensorDescriptor gx(grad_input), gw(grad_weight), gb(grad_bias), x(input), gy(grad), w(weight),
            rm(running_mean), rv(running_var), sm(save_mean), si(save_invstd);
        infiniopBatchNormBackwardDescriptor_t descriptor = nullptr;
        check(infiniopCreateBatchNormBackwardDescriptorEx(handleFor(input.device()), &descriptor, gx, gw, gb, x, gy, w,
                                                          rm, rv, sm, si, eps, training ? 1 : 0),
              "infiniopCreateBatchNormBackwardDescriptorEx");
        return owned(descriptor, infiniopDestroyBatchNormBackwardDescriptor, infiniopGetBatchNormBackwardWorkspaceSize);
    });
    Tensor workspace = workspaceFor(*kernel, input);
    check(infiniopBatchNormBackwardEx(kernel->as<infiniopBatchNormBackwardDescriptor_t>(), data(workspace),
                                      kernel->workspace_size, data(grad_input), data(grad_weight), data(grad_bias),
                                      input.data_ptr(), grad.data_ptr(), data(weight), data(running_mean),
                                      data(running_var), data(save_mean), data(save_invstd), streamOf(input)),
          "infiniopBatchNormBackwardEx");
    ++backward_calls[2];
    return {want_input ? grad_input : Tensor(), grad_weight, grad_bias};
}

// BatchNorm's gradients by PyTorch's differentiable native_batch_norm_backward (recordsBackward), in F32 or F64,
// from the statistics the kernel would take, as PyTorch's own BatchNorm differentiates its backward. grad_bias in
// the dtype the kernel's would have (the weight's, else the running statistics', else the data's).
variable_list batchNormRecordedGradients(const Tensor &grad_output, const Tensor &input, const Tensor &weight,
                                         const Tensor &running_mean, const Tensor &running_var,
                                         const Tensor &saved_mean, const Tensor &saved_invstd, bool training,
                                         double eps, bool want_input, bool want_weight, bool want_bias) {
    const Tensor x = wide(input);
    const auto gradients = at::native_batch_norm_backward(
        asDtypeOf(grad_output, x), x, asDtypeOf(weight, x), asDtypeOf(running_mean, x), asDtypeOf(running_var, x),
        training ? asDtypeOf(saved_mean, x) : Tensor(), training ? asDtypeOf(saved_invstd, x) : Tensor(), training,
        eps, {want_input, want_weight, want_bias});
    const Tensor &parameter = weight.defined() ? weight : running_mean.defined() ? running_mean : input;
    return {gradientOf(std::get<0>(gradients), input, want_input),
            gradientOf(std::get<1>(gradients), weight, want_weight),
            gradientOf(std::get<2>(gradients), parameter, want_bias)};
}

variable_list batchNormBackward(const Tensor &grad_output, const Tensor &input, const Tensor &weight,
                                const Tensor &running_mean, const Tensor &running_var, const Tensor &saved_mean,
                                const Tensor &saved_invstd, bool training, double eps, bool want_input,
                                bool want_weight, bool want_bias) {
    return (recordsBackward(grad_output) ? batchNormRecordedGradients : batchNormGradients)(
        grad_output, input, weight, running_mean, running_var, saved_mean, saved_invstd, training, eps, want_input,
        want_weight, want_bias);
}

struct BatchNormNode : public torch::autograd::Function<BatchNormNode> {
    // (output, save_mean, save_invstd, input, weight, bias, running_mean, running_var, training, eps): training
    // takes the saved statistics, eval the running ones (constants there); weight and the running statistics of
    // shape (C,). bias only takes its gradient.
    static Tensor forward(AutogradContext *ctx, Tensor output, const Tensor &save_mean, const Tensor &save_invstd,
                          const Tensor &input, const std::optional<Tensor> &weight, const std::optional<Tensor> &bias,
                          const std::optional<Tensor> &running_mean, const std::optional<Tensor> &running_var,
                          bool training, double eps) {
        ctx->mark_dirty({output});
        if (training) { // the running statistics are not needed, and may be overwritten before the backward
            ctx->save_for_backward({input, weight.value_or(Tensor()), Tensor(), Tensor(), save_mean, save_invstd});
        } else {
            ctx->save_for_backward({input, weight.value_or(Tensor()), running_mean.value_or(Tensor()),
                                    running_var.value_or(Tensor()), Tensor(), Tensor()});
        }
        ctx->saved_data["training"] = training;
        ctx->saved_data["eps"] = eps;
        ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
        return output;
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        if (!grads[0].defined()) return variable_list(10);
        const variable_list saved = ctx->get_saved_variables();
        const Tensor &weight = saved[1];
        // needs_input_grad counts the inputs that are tensors: an absent weight takes no place.
        const bool want_weight = weight.defined() && ctx->needs_input_grad(4);
        const bool want_bias = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(weight.defined() ? 5 : 4);
        variable_list gradients = batchNormBackward(
            grads[0], saved[0], weight, saved[2], saved[3], saved[4], saved[5], ctx->saved_data["training"].toBool(),
            ctx->saved_data["eps"].toDouble(), ctx->needs_input_grad(3), want_weight, want_bias);
        return {Tensor(), Tensor(), Tensor(), gradients[0], gradients[1], gradients[2],
                Tensor(), Tensor(), Tensor(), Tensor()};
    }
};

Tensor batchNorm(Tensor output, const Tensor &save_mean, const Tensor &save_invstd, const Tensor &input,
                 const std::optional<Tensor> &weight, const std::optional<Tensor> &bias,
                 const std::optional<Tensor> &running_mean, const std::optional<Tensor> &running_var, bool training,
                 double eps) {
    return BatchNormNode::apply(output, save_mean, save_invstd, input, weight, bias, running_mean, running_var,
                                training, eps);
}

// ------------------------------------------------------------------------------------------- the forwards' nodes
// The grad_fn of a forward run here is autograd's Node itself, as PyTorch's generated ones: a
// torch::autograd::Function's apply cost about 2 us more a forward (its context, its saved-data map, the dirty
// output's bookkeeping). The same functions as the Functions' backwards compute the gradients.

using torch::autograd::SavedVariable;
// std::shared_ptr<Node> before torch 2.13, c10::intrusive_ptr<Node> from it on.
using NodePointer = decltype(torch::autograd::Edge::function);

template <typename T>
NodePointer newNode(T *&node) {
    if constexpr (std::is_same_v<NodePointer, std::shared_ptr<torch::autograd::Node>>) {
        std::shared_ptr<T> made(new T());
        node = made.get();
        return made;
    } else {
        auto made = c10::make_intrusive<T>();
        node = made.get();
        return made;
    }
}

// `output` gets `node` as grad_fn, whose inputs' gradients flow to `operands` (undefined ones take no edge's place
// but keep their index).
template <typename... Operands>
void record(const Tensor &output, const NodePointer &node, const Operands &...operands) {
    node->set_next_edges(torch::autograd::collect_next_edges(operands...));
    torch::autograd::set_history(output, node);
}

struct RMSNormBackward : public torch::autograd::Node {
    SavedVariable input, weight, rstd; // edges: input, weight
    std::optional<double> eps;         // the forward's (for recordsBackward)

    variable_list apply(variable_list &&grads) override {
        if (!grads[0].defined()) return variable_list(2);
        return rmsNormBackward(grads[0], input.unpack(), weight.unpack(), rstd.unpack(), eps,
                               task_should_compute_output(0), task_should_compute_output(1));
    }
    void release_variables() override {
        input.reset_data();
        weight.reset_data();
        rstd.reset_data();
    }
    std::string name() const override { return "InfiniopRMSNormBackward"; }
};

struct LayerNormBackward : public torch::autograd::Node {
    SavedVariable input, weight, bias, mean, rstd; // edges: input, weight, bias
    int64_t normalized_dims = 1;

    variable_list apply(variable_list &&grads) override {
        if (!grads[0].defined()) return variable_list(3);
        return layerNormBackward(grads[0], input.unpack(), weight.unpack(), bias.unpack(), mean.unpack(),
                                 rstd.unpack(), normalized_dims, task_should_compute_output(0),
                                 task_should_compute_output(1), task_should_compute_output(2));
    }
    void release_variables() override {
        input.reset_data();
        weight.reset_data();
        bias.reset_data();
        mean.reset_data();
        rstd.reset_data();
    }
    std::string name() const override { return "InfiniopLayerNormBackward"; }
};

struct BatchNormBackward : public torch::autograd::Node {
    // training: save_mean and save_invstd; eval: the running statistics (constants there). Edges: input, weight,
    // bias.
    SavedVariable input, weight, running_mean, running_var, save_mean, save_invstd;
    bool training = true;
    double eps = 0;

    variable_list apply(variable_list &&grads) override {
        if (!grads[0].defined()) return variable_list(3);
        return batchNormBackward(grads[0], input.unpack(), weight.unpack(), running_mean.unpack(),
                                 running_var.unpack(), save_mean.unpack(), save_invstd.unpack(), training, eps,
                                 task_should_compute_output(0), task_should_compute_output(1),
                                 task_should_compute_output(2));
    }
    void release_variables() override {
        for (SavedVariable *saved : {&input, &weight, &running_mean, &running_var, &save_mean, &save_invstd}) {
            saved->reset_data();
        }
    }
    std::string name() const override { return "InfiniopBatchNormBackward"; }
};

// ------------------------------------------------------------------------------------------------------ forwards
// The eager forwards whole, in C++ (issue 52): where the operands are ordinary (on the CPU or CUDA, of the shapes,
// devices and dtypes torch.nn.functional takes and a node serves), the forward's kernel runs here, this library's or
// PyTorch's as ops.py chooses, and the node becomes the output's grad_fn where autograd records; a forward through
// Python took ten frames and 7-19 us more than stock's one op. Anything else returns no tensors, and the Python
// forward (its checks, torch's own errors, the rarer kernels) takes the call as before.

// The sizes from which LayerNorm's CPU forward is this library's, as ops.py sets them (configure), per data dtype
// (F32, BF16, F16; none for F64). BatchNorm's is wherever it takes the operands (ops._library_batch_norm_serves).
std::atomic<int64_t> layer_norm_minimums[3] = {-1, -1, -1};

void configure(at::IntArrayRef layer_norm) {
    TORCH_CHECK(layer_norm.size() == 3, "infiniop_py: three LayerNorm sizes (F32, BF16, F16)");
    for (size_t i = 0; i < 3; ++i) layer_norm_minimums[i] = layer_norm[i];
}

// Forwards run here since the library was loaded, per op (RMSNorm, LayerNorm, BatchNorm), then those of them that
// ran this library's kernel (torch.ops.infiniop_nodes.forward_calls()).
std::atomic<int64_t> forward_calls[6];

std::vector<int64_t> forwardCalls() {
    std::vector<int64_t> calls;
    for (const auto &count : forward_calls) calls.push_back(count.load());
    return calls;
}

// Data a node serves: of a kernel dtype, on the CPU or CUDA.
bool servedInput(const Tensor &input) {
    const auto dtype = input.scalar_type();
    return (input.is_cpu() || input.is_cuda()) &&
           (isHalf(dtype) || dtype == at::kFloat || dtype == at::kDouble);
}

// The dtype the defined ones of `parameters` share, on input's device (nullopt: none given); false where they
// differ in dtype or device, or share one a node does not take with this data (autograd_nodes._served).
bool commonParameters(const Tensor &input, std::initializer_list<const Tensor *> parameters,
                      std::optional<at::ScalarType> &dtype) {
    for (const Tensor *parameter : parameters) {
        if (!parameter->defined()) continue;
        if (parameter->device() != input.device() || (dtype && *dtype != parameter->scalar_type())) return false;
        dtype = parameter->scalar_type();
    }
    return !dtype || *dtype == input.scalar_type() || (*dtype == at::kFloat && isHalf(input.scalar_type()));
}

bool usableEps(double eps) { return std::isfinite(eps) && eps >= 0; }

// Whether autograd records this call: grad mode on and a differentiable operand requiring grad.
bool recorded(std::initializer_list<const Tensor *> operands) {
    if (!at::GradMode::is_enabled()) return false;
    for (const Tensor *operand : operands) {
        if (operand->defined() && operand->requires_grad()) return true;
    }
    return false;
}

// input's trailing dims are normalized_shape, as are the given parameters'.
bool rowShapes(const Tensor &input, at::IntArrayRef normalized_shape,
               std::initializer_list<const Tensor *> parameters) {
    const auto k = static_cast<int64_t>(normalized_shape.size());
    if (k == 0 || input.dim() < k || input.sizes().slice(input.dim() - k) != normalized_shape) return false;
    for (const Tensor *parameter : parameters) {
        if (parameter->defined() && parameter->sizes() != normalized_shape) return false;
    }
    return true;
}

Tensor defined(const std::optional<Tensor> &tensor) { return tensor.has_value() ? *tensor : Tensor(); }

std::vector<Tensor> rmsNormForward(const Tensor &input, at::IntArrayRef normalized_shape,
                                   const std::optional<Tensor> &weight_or_none, std::optional<double> eps) {
    const Tensor weight = defined(weight_or_none);
    std::optional<at::ScalarType> dtype;
    // The node takes a weight; CUDA's fused kernel takes it in the data's dtype only (ops._torch_rms_norm).
    if (!weight.defined() || !servedInput(input) || !commonParameters(input, {&weight}, dtype) ||
        !rowShapes(input, normalized_shape, {&weight}) || (eps && !usableEps(*eps)) ||
        (input.is_cuda() && weight.scalar_type() != input.scalar_type())) {
        return {};
    }
    const bool recording = recorded({&input, &weight});
    Tensor output, rstd;
    {
        at::AutoGradMode no_grad(false);
        if (input.is_cpu() && input.numel() > 0 && input.is_contiguous() && weight.is_contiguous()) {
            const auto statistics_dtype = statisticsDtype(input);
            const double epsilon = eps ? *eps
                                       : statistics_dtype == at::kDouble ? std::numeric_limits<double>::epsilon()
                                                                         : std::numeric_limits<float>::epsilon();
            const auto leading = input.sizes().slice(0, input.dim() - weight.dim());
            output = at::empty_like(input);
            // Made with the normalized dims kept (size 1), as PyTorch returns it: a view made after the run would
            // cost more than the run itself on small inputs. The descriptor takes it without them.
            rstd = at::empty(keptDims(leading, normalized_shape.size()), input.options().dtype(statistics_dtype));
            Key key = newKey({3, bitsOf(epsilon)});
            addLayouts(key, {&output, &rstd, &input, &weight});
            const auto kernel = kernelFor(key, [&] {
                TensorDescriptor y(output), r(rstd.view(leading)), x(input), w(weight);
                infiniopRMSNormDescriptor_t descriptor = nullptr;
                check(infiniopCreateRMSNormDescriptorEx(handleFor(input.device()), &descriptor, y, r, x, w, epsilon),
                      "infiniopCreateRMSNormDescriptorEx");
                return owned(descriptor, infiniopDestroyRMSNormDescriptor, infiniopGetRMSNormWorkspaceSize);
            });
            Tensor workspace = workspaceFor(*kernel, input);
            check(infiniopRMSNormEx(kernel->as<infiniopRMSNormDescriptor_t>(), data(workspace),
                                    kernel->workspace_size, output.data_ptr(), rstd.data_ptr(), input.data_ptr(),
                                    weight.data_ptr(), streamOf(input)),
                  "infiniopRMSNormEx");
            ++forward_calls[3];
        } else {
            std::tie(output, rstd) = at::_fused_rms_norm(input, normalized_shape, weight, eps);
        }
    }
    ++forward_calls[0];
    if (recording) {
        RMSNormBackward *node = nullptr;
        const NodePointer pointer = newNode(node);
        node->input = SavedVariable(savableInput(input), false);
        node->weight = SavedVariable(weight, false);
        node->rstd = SavedVariable(rstd, false);
        node->eps = eps;
        record(output, pointer, input, weight);
    }
    return {output, rstd};
}

std::vector<Tensor> layerNormForward(const Tensor &input, at::IntArrayRef normalized_shape,
                                     const std::optional<Tensor> &weight_or_none,
                                     const std::optional<Tensor> &bias_or_none, double eps) {
    const Tensor weight = defined(weight_or_none), bias = defined(bias_or_none);
    std::optional<at::ScalarType> dtype;
    // 16-bit CUDA data with F32 parameters: torch 2.11's kernel refuses them, and ops.py runs ours on packed copies.
    if (!servedInput(input) || !commonParameters(input, {&weight, &bias}, dtype) ||
        !rowShapes(input, normalized_shape, {&weight, &bias}) || !usableEps(eps) ||
        (input.is_cuda() && dtype && *dtype != input.scalar_type())) {
        return {};
    }
    const bool recording = recorded({&input, &weight, &bias});
    const auto data_dtype = input.scalar_type();
    const int64_t minimum = data_dtype == at::kFloat      ? layer_norm_minimums[0].load()
                            : data_dtype == at::kBFloat16 ? layer_norm_minimums[1].load()
                            : data_dtype == at::kHalf     ? layer_norm_minimums[2].load()
                                                          : -1;
    const size_t normalized_dims = normalized_shape.size();
    Tensor output, mean, rstd;
    {
        at::AutoGradMode no_grad(false);
        if (input.is_cpu() && minimum >= 0 && input.numel() >= minimum && input.numel() > 0 &&
            input.is_contiguous() && (!weight.defined() || weight.is_contiguous()) &&
            (!bias.defined() || bias.is_contiguous()) && (dtype || normalized_dims == 1)) {
            const auto leading = input.sizes().slice(0, input.dim() - normalized_dims);
            const auto options = input.options().dtype(statisticsDtype(input));
            const auto kept = keptDims(leading, normalized_dims); // as for RMSNorm's rstd
            output = at::empty_like(input);
            mean = at::empty(kept, options);
            rstd = at::empty(kept, options);
            Key key = newKey({4, bitsOf(eps)});
            addLayouts(key, {&output, &mean, &rstd, &input, &weight, &bias});
            const auto kernel = kernelFor(key, [&] {
                TensorDescriptor y(output), m(mean.view(leading)), r(rstd.view(leading)), x(input), w(weight),
                    b(bias);
                infiniopLayerNormDescriptor_t descriptor = nullptr;
                check(infiniopCreateLayerNormDescriptorEx(handleFor(input.device()), &descriptor, y, m, r, x, w, b,
                                                          eps),
                      "infiniopCreateLayerNormDescriptorEx");
                return owned(descriptor, infiniopDestroyLayerNormDescriptor, infiniopGetLayerNormWorkspaceSize);
            });
            Tensor workspace = workspaceFor(*kernel, input);
            check(infiniopLayerNormEx(kernel->as<infiniopLayerNormDescriptor_t>(), data(workspace),
                                      kernel->workspace_size, output.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
                                      input.data_ptr(), data(weight), data(bias), streamOf(input)),
                  "infiniopLayerNormEx");
            ++forward_calls[4];
        } else {
            // The CPU kernel saves 16-bit statistics unless a parameter is F32: 16-bit parameters widened (exact),
            // and without any the statistics converted (ops._torch_layer_norm).
            Tensor kernel_weight = weight, kernel_bias = bias;
            if (input.is_cpu() && dtype && *dtype == data_dtype && isHalf(data_dtype)) {
                if (weight.defined()) kernel_weight = weight.to(at::kFloat);
                if (bias.defined()) kernel_bias = bias.to(at::kFloat);
            }
            std::tie(output, mean, rstd) =
                at::native_layer_norm(input, normalized_shape, kernel_weight, kernel_bias, eps);
            const auto statistics_dtype = statisticsDtype(input);
            if (mean.scalar_type() != statistics_dtype) {
                mean = mean.to(statistics_dtype);
                rstd = rstd.to(statistics_dtype);
            }
        }
    }
    ++forward_calls[1];
    if (recording) {
        LayerNormBackward *node = nullptr;
        const NodePointer pointer = newNode(node);
        node->input = SavedVariable(input, false);
        node->weight = SavedVariable(weight, false);
        node->bias = SavedVariable(bias, false);
        node->mean = SavedVariable(mean, false);
        node->rstd = SavedVariable(rstd, false);
        node->normalized_dims = static_cast<int64_t>(normalized_dims);
        record(output, pointer, input, weight, bias);
    }
    return {output, mean, rstd};
}

std::vector<Tensor> batchNormForward(const Tensor &input, const std::optional<Tensor> &weight_or_none,
                                     const std::optional<Tensor> &bias_or_none,
                                     const std::optional<Tensor> &running_mean_or_none,
                                     const std::optional<Tensor> &running_var_or_none, bool training,
                                     std::optional<double> momentum, double eps) {
    const Tensor weight = defined(weight_or_none), bias = defined(bias_or_none);
    const Tensor running_mean = defined(running_mean_or_none), running_var = defined(running_var_or_none);
    if (!servedInput(input) || input.dim() < 2 || input.dim() > 5 || input.numel() == 0 || !momentum ||
        !std::isfinite(*momentum) || !usableEps(eps) || running_mean.defined() != running_var.defined() ||
        (!training && !running_mean.defined())) {
        return {};
    }
    const int64_t channels = input.size(1);
    if (training && input.numel() == channels) return {}; // one value per channel: torch's error
    for (const Tensor *tensor : {&weight, &bias, &running_mean, &running_var}) {
        if (tensor->defined() && (tensor->dim() != 1 || tensor->size(0) != channels)) return {};
    }
    std::optional<at::ScalarType> dtype;
    if (!commonParameters(input, {&weight, &bias, &running_mean, &running_var}, dtype)) return {};
    // Running statistics written in place must not share memory with each other or the input (the functional API
    // refuses that; torch's kernel takes it).
    if (running_mean.defined() &&
        (running_mean.is_alias_of(running_var) || running_mean.is_alias_of(input) || running_var.is_alias_of(input))) {
        return {};
    }
    const bool recording = recorded({&input, &weight, &bias});
    // ops._library_batch_norm_serves: 16-bit data with F32 parameters only (PyTorch saves 16-bit statistics else).
    const bool library = input.is_cpu() && input.numel() > 0 &&
                         (!isHalf(input.scalar_type()) || dtype == at::kFloat) && batchPacked(input);
    Tensor output, save_mean, save_invstd;
    {
        at::AutoGradMode no_grad(false);
        if (library) {
            const auto options = input.options().dtype(statisticsDtype(input));
            output = at::empty_like(input);
            save_mean = training ? at::empty({channels}, options) : Tensor();
            save_invstd = training ? at::empty({channels}, options) : Tensor();
            Key key = newKey({5, training, bitsOf(*momentum), bitsOf(eps)});
            addLayouts(key, {&output, &save_mean, &save_invstd, &running_mean, &running_var, &input, &weight, &bias});
            const auto kernel = kernelFor(key, [&] {
                TensorDescriptor y(output), sm(save_mean), si(save_invstd), rm(running_mean), rv(running_var),
                    x(input), w(weight), b(bias);
                infiniopBatchNormDescriptor_t descriptor = nullptr;
                check(infiniopCreateBatchNormDescriptorEx(handleFor(input.device()), &descriptor, y, sm, si, rm, rv,
                                                          x, w, b, training ? 1 : 0, *momentum, eps),
                      "infiniopCreateBatchNormDescriptorEx");
                return owned(descriptor, infiniopDestroyBatchNormDescriptor, infiniopGetBatchNormWorkspaceSize);
            });
            Tensor workspace = workspaceFor(*kernel, input);
            check(infiniopBatchNormEx(kernel->as<infiniopBatchNormDescriptor_t>(), data(workspace),
                                      kernel->workspace_size, output.data_ptr(), data(save_mean), data(save_invstd),
                                      data(running_mean), data(running_var), input.data_ptr(), data(weight),
                                      data(bias), streamOf(input)),
                  "infiniopBatchNormEx");
            if (!training) { // PyTorch's CPU forward saves two empty statistics in eval
                save_mean = at::empty({0}, options);
                save_invstd = at::empty({0}, options);
            }
            ++forward_calls[5];
        } else {
            std::tie(output, save_mean, save_invstd) =
                at::native_batch_norm(input, weight, bias, running_mean, running_var, training, *momentum, eps);
        }
    }
    ++forward_calls[2];
    if (recording) {
        BatchNormBackward *node = nullptr;
        const NodePointer pointer = newNode(node);
        node->input = SavedVariable(input, false);
        node->weight = SavedVariable(weight, false);
        if (training) { // the running statistics are not needed, and may be overwritten before the backward
            node->save_mean = SavedVariable(save_mean, false);
            node->save_invstd = SavedVariable(save_invstd, false);
        } else {
            node->running_mean = SavedVariable(running_mean, false);
            node->running_var = SavedVariable(running_var, false);
        }
        node->training = training;
        node->eps = eps;
        record(output, pointer, input, weight, bias);
    }
    return {output, save_mean, save_invstd};
}

} // namespace

TORCH_LIBRARY(infiniop_nodes, m) {
    m.def("rms_norm(Tensor(a!) output, Tensor rstd, Tensor input, Tensor weight, float? eps) -> Tensor(a!)");
    m.def("layer_norm(Tensor(a!) output, Tensor mean, Tensor rstd, Tensor input, Tensor? weight, Tensor? bias, "
          "int normalized_dims) -> Tensor(a!)");
    m.def("batch_norm(Tensor(a!) output, Tensor save_mean, Tensor save_invstd, Tensor input, Tensor? weight, "
          "Tensor? bias, Tensor? running_mean, Tensor? running_var, bool training, float eps) -> Tensor(a!)");
    m.def("backward_calls() -> int[]", TORCH_FN(backwardCalls));
    m.def("rms_norm_forward(Tensor input, int[] normalized_shape, Tensor? weight, float? eps) -> Tensor[]");
    m.def("layer_norm_forward(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps) "
          "-> Tensor[]");
    m.def("batch_norm_forward(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, "
          "Tensor? running_var, bool training, float? momentum, float eps) -> Tensor[]");
    m.def("forward_calls() -> int[]", TORCH_FN(forwardCalls));
    m.def("configure(int[] layer_norm_minimums) -> ()", TORCH_FN(configure));
    m.impl("rms_norm", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(rmsNorm));
    m.impl("layer_norm", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(layerNorm));
    m.impl("batch_norm", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(batchNorm));
    m.impl("rms_norm_forward", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(rmsNormForward));
    m.impl("layer_norm_forward", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(layerNormForward));
    m.impl("batch_norm_forward", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(batchNormForward));
}

// The forwards as a Python module too, where Python's headers were found: a call through pybind11 costs about 2 us
// less than one through torch.ops (which boxes the arguments against the schema and looks for __torch_function__
// overrides), on a forward whose whole host time stock takes 8-20 us. Without them the forwards are the
// torch.ops.infiniop_nodes ops above (autograd_nodes.py tells the two builds apart).
#if __has_include(<Python.h>)
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

namespace {

// ------------------------------------------------------------------ the functional API's known layouts, in C++

// The C API's run of an operator with `count` tensors: (descriptor, workspace, workspace size, the tensors' data...,
// stream), called through its address as cffi calls it (every argument after the size a pointer).
template <size_t>
using Pointer = void *;

template <size_t... Index>
infiniStatus_t runWith(uintptr_t run, void *descriptor, void *workspace, size_t workspace_size, void *const *data,
                       void *stream, std::index_sequence<Index...>) {
    using Run = infiniStatus_t (*)(void *, void *, size_t, Pointer<Index>..., void *);
    return reinterpret_cast<Run>(run)(descriptor, workspace, workspace_size, data[Index]..., stream);
}

constexpr size_t kMaxRunTensors = 16;

template <size_t... Count>
infiniStatus_t runNative(uintptr_t run, void *descriptor, void *workspace, size_t workspace_size, void *const *data,
                         size_t count, void *stream, std::index_sequence<Count...>) {
    infiniStatus_t status = INFINI_STATUS_BAD_PARAM;
    (void)((count == Count && (status = runWith(run, descriptor, workspace, workspace_size, data, stream,
                                                std::make_index_sequence<Count>()),
                               true)) ||
           ...);
    return status;
}

// One functional op's known layouts of torch tensors, for one set of option values and wanted outputs: what
// infiniop_py._known_layouts does in Python for torch tensors without out=, here in one call (issue 52). In Python
// the key (five attribute reads a tensor) and the fresh outputs (torch.empty_strided) took 8-9 us of a 13.6 us
// BatchNorm2d backward; here the lookup reads the tensors' C++ fields and the outputs come from at::empty_strided.
// An entry is made by _known_layouts.remember after a checked run, from that run's tensors, under the key that run()
// builds from its inputs: per input its dtype, device, shape and strides (absent: -1). Tensors run() does not look
// up (not torch.Tensor or nn.Parameter: a subclass may mean anything by its data; the negative bit; more tensors
// than kMaxRunTensors) and a failing run give None: the caller then takes the checked path, which decides and
// raises the precise error.
class KnownTorchCalls {
  public:
    // Make the entry of this checked call: its inputs, its outputs (fresh ones take their layout; None where not
    // wanted), the operator object that keeps `descriptor` open, the address of its C run and its tensor count.
    void remember(pybind11::sequence inputs, pybind11::sequence outputs, pybind11::object owner, uintptr_t descriptor,
                  uintptr_t run, size_t workspace_size, size_t tensor_count) {
        Key key;
        std::vector<PyObject *> objects;
        for (pybind11::handle input : inputs) objects.push_back(input.ptr());
        const Tensor *first = inputKey(objects.data(), objects.size(), key);
        if (first == nullptr || tensor_count > kMaxRunTensors || outputs.size() > kMaxRunTensors ||
            outputs.size() + inputs.size() < tensor_count) {
            return;
        }
        auto entry = std::make_shared<Entry>();
        entry->owner = std::move(owner);
        entry->descriptor = reinterpret_cast<void *>(descriptor);
        entry->run = run;
        entry->workspace_size = workspace_size;
        entry->tensor_count = tensor_count;
        entry->device = first->device();
        for (pybind11::handle output : outputs) {
            if (output.is_none()) {
                entry->outputs.emplace_back();
                continue;
            }
            if (!THPVariable_CheckExact(output.ptr())) return;
            const Tensor &tensor = THPVariable_Unpack(output.ptr());
            entry->outputs.push_back(OutputLayout{tensor.sizes().vec(), tensor.strides().vec(), tensor.options()});
        }
        Entries dropped;  // destroyed after the lock: dropping an operator may run Python code, even a call here
        std::lock_guard<std::mutex> lock(mutex_);
        if (entries_.size() >= kKnownLayoutsCapacity) dropped.swap(entries_);
        std::shared_ptr<const Entry> &slot = entries_[key];
        if (slot) dropped.emplace(key, std::move(slot));
        slot = std::move(entry);
    }

    // The outputs of a call on these inputs (a tuple or list) through its known layout, or None.
    pybind11::object run(pybind11::handle inputs) {
        PyObject *sequence = inputs.ptr();
        if (!PyTuple_Check(sequence) && !PyList_Check(sequence)) return pybind11::none();
        const size_t count = static_cast<size_t>(PySequence_Fast_GET_SIZE(sequence));
        PyObject **objects = PySequence_Fast_ITEMS(sequence);
        Key key;
        key.reserve(16 * count);
        if (count > kMaxRunTensors || inputKey(objects, count, key) == nullptr) return pybind11::none();
        std::shared_ptr<const Entry> entry;  // released with the GIL held: it holds a Python object
        {
            std::lock_guard<std::mutex> lock(mutex_);
            auto found = entries_.find(key);
            if (found == entries_.end()) return pybind11::none();
            entry = found->second;
        }
        std::vector<Tensor> outputs;
        outputs.reserve(entry->outputs.size());
        void *data[kMaxRunTensors + kMaxRunTensors];
        size_t next = 0;
        for (const auto &layout : entry->outputs) {
            outputs.push_back(layout ? at::empty_strided(layout->sizes, layout->strides, layout->options) : Tensor());
            data[next++] = outputs.back().defined() ? outputs.back().data_ptr() : nullptr;
        }
        for (size_t index = 0; index < count; ++index) {
            data[next++] = objects[index] == Py_None ? nullptr : THPVariable_Unpack(objects[index]).data_ptr();
        }
        infiniStatus_t status;
        {
            pybind11::gil_scoped_release without_gil;  // a CPU kernel may run for milliseconds
            const Tensor workspace = workspaceOf(entry->workspace_size, at::TensorOptions().device(entry->device));
            status = runNative(entry->run, entry->descriptor, workspace.defined() ? workspace.data_ptr() : nullptr,
                               entry->workspace_size, data, entry->tensor_count, streamOn(entry->device),
                               std::make_index_sequence<kMaxRunTensors + 1>());
        }
        if (status != INFINI_STATUS_SUCCESS) return pybind11::none();  // the checked path raises its error
        calls_.fetch_add(1, std::memory_order_relaxed);
        pybind11::tuple result(outputs.size());
        for (size_t index = 0; index < outputs.size(); ++index) {
            result[index] = outputs[index].defined()
                                ? pybind11::reinterpret_steal<pybind11::object>(THPVariable_Wrap(std::move(outputs[index])))
                                : pybind11::none();
        }
        return std::move(result);
    }

    size_t size() {
        std::lock_guard<std::mutex> lock(mutex_);
        return entries_.size();
    }

    int64_t calls() const { return calls_.load(); }  // runs served: what tests see of which path a call took

  private:
    struct OutputLayout {
        std::vector<int64_t> sizes, strides;
        at::TensorOptions options;
    };
    struct Entry {
        pybind11::object owner;
        void *descriptor = nullptr;
        uintptr_t run = 0;
        size_t workspace_size = 0, tensor_count = 0;
        at::Device device = at::kCPU;
        std::vector<std::optional<OutputLayout>> outputs;
    };
    using Entries = std::map<Key, std::shared_ptr<const Entry>>;

    // Appends the inputs' layouts to `key`; the first input tensor, or nullptr where the call is not looked up (see
    // the class) or has no tensor.
    static const Tensor *inputKey(PyObject *const *objects, size_t count, Key &key) {
        const Tensor *first = nullptr;
        for (size_t index = 0; index < count; ++index) {
            if (objects[index] == Py_None) {
                key.push_back(-1);
                continue;
            }
            if (!THPVariable_CheckExact(objects[index])) return nullptr;
            const Tensor &tensor = THPVariable_Unpack(objects[index]);
            if (tensor.is_neg() || !(tensor.is_cpu() || tensor.is_cuda())) return nullptr;
            addLayout(key, tensor);
            if (first == nullptr) first = &tensor;
        }
        return first;
    }

    std::mutex mutex_;
    Entries entries_;
    std::atomic<int64_t> calls_{0};
};

} // namespace

PYBIND11_MODULE(_infiniop_nodes, module) {
    pybind11::class_<KnownTorchCalls>(module, "KnownTorchCalls")
        .def(pybind11::init<>())
        .def("remember", &KnownTorchCalls::remember)
        .def("run", &KnownTorchCalls::run)
        .def("__len__", &KnownTorchCalls::size)
        .def_property_readonly("calls", &KnownTorchCalls::calls);
    // Released as torch's own bindings release it: a CPU kernel here may run for milliseconds.
    const auto without_gil = pybind11::call_guard<pybind11::gil_scoped_release>();
    module.def(
        "rms_norm",
        [](const Tensor &input, const std::vector<int64_t> &normalized_shape, const std::optional<Tensor> &weight,
           std::optional<double> eps) { return rmsNormForward(input, normalized_shape, weight, eps); },
        without_gil);
    module.def(
        "layer_norm",
        [](const Tensor &input, const std::vector<int64_t> &normalized_shape, const std::optional<Tensor> &weight,
           const std::optional<Tensor> &bias, double eps) {
            return layerNormForward(input, normalized_shape, weight, bias, eps);
        },
        without_gil);
    module.def("batch_norm", &batchNormForward, without_gil);
}
#endif
