// The eager autograd nodes of infiniop_py.torch, in C++ (issue 52): the backward of each norm runs this library's
// kernel without Python, as PyTorch's own norms do. A Python Function's backward needs the GIL, and on CUDA runs
// on autograd's device thread (33-87 us to start on an H200, 47-102 inside, where torch's whole backward takes
// 100-150); a C++ node's does not.
//
// The forward stays in Python (ops.FORWARDS: its checks and its choice of kernel are made there once); then
// torch.ops.infiniop_nodes.<op>(output, statistics..., input, parameters..., options) makes `output` the node's
// output: it is marked dirty (written by the node), so autograd gives it this node as grad_fn in place, not a view
// of it (a view could not be modified in place afterwards: `relu_` after a norm). The node saves what the
// backward needs and, in the backward, allocates the gradients and runs the kernel through the C API from a
// descriptor cached per layout. Built on first use against the installed torch (autograd_nodes.py).
#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/library.h>

#include "infiniop.h"
#include "infinirt.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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

// The statistics' dtype of the kernels: F64 for F64 data, else F32 (PyTorch's forwards save the same, but
// BatchNorm with 16-bit parameters, whose 16-bit ones are widened here).
Tensor statistics(const Tensor &tensor, const Tensor &input) {
    const auto dtype = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    return tensor.scalar_type() == dtype ? tensor : tensor.to(dtype);
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

// torch's current stream on the tensor's device (NULL on the CPU): the device-generic getter, so that this file
// needs no CUDA headers.
void *streamOf(const Tensor &tensor) {
    if (!tensor.is_cuda()) return nullptr;
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(tensor.device()).native_handle();
}

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

// The kernels of known layouts, create() making a missing one; emptied when full, as the functional API's table (a
// workload has few layouts).
template <typename Create>
std::shared_ptr<const Kernel> kernelFor(const Key &key, Create &&create) {
    static std::mutex mutex;
    static std::map<Key, std::shared_ptr<const Kernel>> kernels;
    constexpr size_t kCapacity = 64;
    {
        std::lock_guard<std::mutex> lock(mutex);
        auto found = kernels.find(key);
        if (found != kernels.end()) return found->second;
    }
    auto kernel = std::make_shared<const Kernel>(create());
    std::lock_guard<std::mutex> lock(mutex);
    if (kernels.size() >= kCapacity) kernels.clear();
    kernels.emplace(key, kernel);
    return kernel;
}

// The workspace of one run. On the CPU each thread reuses one block, grown as needed (the run is synchronous, and
// nothing else runs on this thread while it does): its partial sums stay in cache, where a fresh block from the
// allocator cost a LayerNorm backward of 1M elements 14 us. On CUDA, torch's caching allocator on the current stream.
Tensor workspaceFor(const Kernel &kernel, const Tensor &like) {
    const auto size = static_cast<int64_t>(kernel.workspace_size);
    if (size == 0) return Tensor();
    if (like.is_cpu()) {
        thread_local Tensor spare;
        if (!spare.defined() || spare.numel() < size) spare = at::empty({size}, like.options().dtype(at::kByte));
        return spare;
    }
    return at::empty({size}, like.options().dtype(at::kByte));
}

void *data(const Tensor &tensor) { return tensor.defined() ? tensor.data_ptr() : nullptr; }

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

// The backward's gradients as autograd takes them. Where the engine records the backward (create_graph=True) and
// an incoming gradient requires grad, each is given an error node, as Python's once_differentiable does: the
// kernels compute nothing autograd could differentiate, so differentiating them again raises.
variable_list onceDifferentiable(const variable_list &incoming, variable_list gradients) {
    if (!at::GradMode::is_enabled()) return gradients;
    bool requires_grad = false;
    for (const Tensor &grad : incoming) requires_grad = requires_grad || (grad.defined() && grad.requires_grad());
    if (!requires_grad) return gradients;
    variable_list aliases;
    for (const Tensor &gradient : gradients) {
        if (!gradient.defined()) continue;
        Tensor alias = gradient.detach();
        alias.set_requires_grad(true);
        aliases.push_back(alias);
    }
    const auto count = static_cast<int64_t>(aliases.size());
    variable_list wrapped = torch::autograd::DelayedError(
        "trying to differentiate twice a function that was marked with @once_differentiable", count)
                                .apply(std::move(aliases));
    size_t next = 0;
    for (Tensor &gradient : gradients) {
        if (gradient.defined()) gradient = wrapped[next++];
    }
    return gradients;
}

// ------------------------------------------------------------------------------------------------------ RMSNorm

struct RMSNormNode : public torch::autograd::Function<RMSNormNode> {
    // (output, rstd, input, weight): output and rstd from the forward; weight of the data's dtype or F32 (16-bit
    // data), as the kernel takes it. rstd: input.shape[:-normalized_dims] + (1,) * normalized_dims, or that
    // without the ones.
    static Tensor forward(AutogradContext *ctx, Tensor output, const Tensor &rstd, const Tensor &input,
                          const Tensor &weight) {
        ctx->mark_dirty({output});
        ctx->save_for_backward({input, weight, rstd});
        return output;
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        const Tensor &grad_output = grads[0];
        if (!grad_output.defined()) return {Tensor(), Tensor(), Tensor(), Tensor()};
        const variable_list saved = ctx->get_saved_variables();
        const Tensor input = saved[0].contiguous(), &weight = saved[1];
        const auto leading = input.sizes().slice(0, input.dim() - weight.dim());
        const Tensor rstd = statistics(saved[2], input).reshape(leading);
        const Tensor grad = grad_output.contiguous();
        const bool want_input = ctx->needs_input_grad(2), want_weight = ctx->needs_input_grad(3);
        Tensor grad_input = at::empty_like(input, at::MemoryFormat::Contiguous);
        Tensor grad_weight = gradientLike(weight, want_weight);
        Key key{0};
        for (const Tensor *tensor : std::initializer_list<const Tensor *>{&grad_input, &grad_weight, &grad, &input, &weight, &rstd}) addLayout(key, *tensor);
        const auto kernel = kernelFor(key, [&] {
            TensorDescriptor gx(grad_input), gw(grad_weight), gy(grad), x(input), w(weight), r(rstd);
            infiniopRMSNormBackwardDescriptor_t descriptor = nullptr;
            check(infiniopCreateRMSNormBackwardDescriptorEx(handleFor(input.device()), &descriptor, gx, gw, gy, x, w,
                                                             r, 0.0),
                  "infiniopCreateRMSNormBackwardDescriptorEx");
            return owned(descriptor, infiniopDestroyRMSNormBackwardDescriptor, infiniopGetRMSNormBackwardWorkspaceSize);
        });
        Tensor workspace = workspaceFor(*kernel, input);
        check(infiniopRMSNormBackwardEx(kernel->as<infiniopRMSNormBackwardDescriptor_t>(),
                                        data(workspace), kernel->workspace_size, data(grad_input), data(grad_weight),
                                        grad.data_ptr(), input.data_ptr(), weight.data_ptr(), rstd.data_ptr(),
                                        streamOf(input)),
              "infiniopRMSNormBackwardEx");
        ++backward_calls[0];
        return onceDifferentiable(grads, {Tensor(), Tensor(), want_input ? grad_input : Tensor(), grad_weight});
    }
};

Tensor rmsNorm(Tensor output, const Tensor &rstd, const Tensor &input, const Tensor &weight) {
    return RMSNormNode::apply(output, rstd, input, weight);
}

// ---------------------------------------------------------------------------------------------------- LayerNorm

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
        const Tensor &grad_output = grads[0];
        if (!grad_output.defined()) return variable_list(7);
        const variable_list saved = ctx->get_saved_variables();
        const Tensor input = saved[0].contiguous(), &weight = saved[1], &bias = saved[2];
        const int64_t normalized_dims = ctx->saved_data["normalized_dims"].toInt();
        const auto leading = input.sizes().slice(0, input.dim() - normalized_dims);
        const Tensor mean = statistics(saved[3], input).reshape(leading);
        const Tensor rstd = statistics(saved[4], input).reshape(leading);
        const Tensor grad = grad_output.contiguous();
        const Tensor &parameter = weight.defined() ? weight : bias; // both gradients take its dtype
        // needs_input_grad counts the inputs that are tensors: an absent weight takes no place.
        const bool want_input = ctx->needs_input_grad(3);
        const size_t bias_edge = weight.defined() ? 5 : 4;
        Tensor grad_input = at::empty_like(input, at::MemoryFormat::Contiguous);
        Tensor grad_weight = weight.defined() ? gradientLike(parameter, ctx->needs_input_grad(4)) : Tensor();
        Tensor grad_bias = bias.defined() ? gradientLike(parameter, ctx->needs_input_grad(bias_edge)) : Tensor();
        Key key{1};
        for (const Tensor *tensor : std::initializer_list<const Tensor *>{&grad_input, &grad_weight, &grad_bias, &grad, &weight, &input, &mean, &rstd}) {
            addLayout(key, *tensor);
        }
        const auto kernel = kernelFor(key, [&] {
            TensorDescriptor gx(grad_input), gw(grad_weight), gb(grad_bias), gy(grad), w(weight), x(input), m(mean),
                r(rstd);
            infiniopLayerNormBackwardDescriptor_t descriptor = nullptr;
            check(infiniopCreateLayerNormBackwardFromInputDescriptorEx(handleFor(input.device()), &descriptor, gx, gw,
                                                                       gb, gy, w, x, m, r),
                  "infiniopCreateLayerNormBackwardFromInputDescriptorEx");
            return owned(descriptor, infiniopDestroyLayerNormBackwardDescriptor,
                         infiniopGetLayerNormBackwardWorkspaceSize);
        });
        Tensor workspace = workspaceFor(*kernel, input);
        check(infiniopLayerNormBackwardFromInputEx(
                  kernel->as<infiniopLayerNormBackwardDescriptor_t>(), data(workspace),
                  kernel->workspace_size, data(grad_input), data(grad_weight), data(grad_bias), grad.data_ptr(),
                  data(weight), input.data_ptr(), mean.data_ptr(), rstd.data_ptr(), streamOf(input)),
              "infiniopLayerNormBackwardFromInputEx");
        ++backward_calls[1];
        return onceDifferentiable(grads, {Tensor(), Tensor(), Tensor(), want_input ? grad_input : Tensor(), grad_weight,
                                   grad_bias, Tensor()});
    }
};

Tensor layerNorm(Tensor output, const Tensor &mean, const Tensor &rstd, const Tensor &input,
                 const std::optional<Tensor> &weight, const std::optional<Tensor> &bias, int64_t normalized_dims) {
    return LayerNormNode::apply(output, mean, rstd, input, weight, bias, normalized_dims);
}

// ---------------------------------------------------------------------------------------------------- BatchNorm

// Channels-first or channels-last packed (C innermost, then the spatial dims, then N): the kernel's layouts.
bool batchPacked(const Tensor &input) { return input.is_contiguous() || input.movedim(1, -1).is_contiguous(); }

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
        const Tensor &grad_output = grads[0];
        if (!grad_output.defined()) return variable_list(10);
        const variable_list saved = ctx->get_saved_variables();
        Tensor input = saved[0];
        if (!batchPacked(input)) input = input.contiguous();
        const Tensor &weight = saved[1], &running_mean = saved[2], &running_var = saved[3];
        const bool training = ctx->saved_data["training"].toBool();
        const double eps = ctx->saved_data["eps"].toDouble();
        const Tensor save_mean = training ? statistics(saved[4], input) : Tensor();
        const Tensor save_invstd = training ? statistics(saved[5], input) : Tensor();
        // grad_output in input's layout, copied only where its strides differ.
        Tensor grad = grad_output;
        if (grad.strides() != input.strides()) grad = at::empty_like(input).copy_(grad_output);
        // needs_input_grad counts the inputs that are tensors: an absent weight takes no place.
        const bool want_input = ctx->needs_input_grad(3);
        const bool want_weight = weight.defined() && ctx->needs_input_grad(4);
        const bool want_bias = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(weight.defined() ? 5 : 4);
        // The gradients of the parameters: (C,) in their dtype (the weight's, else the running statistics', else the
        // data's).
        const Tensor &parameter = weight.defined() ? weight : running_mean;
        const auto options = parameter.defined() ? parameter.options() : input.options();
        Tensor grad_input = at::empty_like(input);
        Tensor grad_weight = want_weight ? at::empty({input.size(1)}, options) : Tensor();
        Tensor grad_bias = want_bias ? at::empty({input.size(1)}, options) : Tensor();
        int64_t eps_bits = 0; // eps exactly, as the descriptor keeps it
        std::memcpy(&eps_bits, &eps, sizeof eps);
        Key key{2, training, eps_bits};
        for (const Tensor *tensor : std::initializer_list<const Tensor *>{&grad_input, &grad_weight, &grad_bias, &input, &grad, &weight, &running_mean,
                                     &running_var, &save_mean, &save_invstd}) {
            addLayout(key, *tensor);
        }
        const auto kernel = kernelFor(key, [&] {
            TensorDescriptor gx(grad_input), gw(grad_weight), gb(grad_bias), x(input), gy(grad), w(weight),
                rm(running_mean), rv(running_var), sm(save_mean), si(save_invstd);
            infiniopBatchNormBackwardDescriptor_t descriptor = nullptr;
            check(infiniopCreateBatchNormBackwardDescriptorEx(handleFor(input.device()), &descriptor, gx, gw, gb, x, gy,
                                                              w, rm, rv, sm, si, eps, training ? 1 : 0),
                  "infiniopCreateBatchNormBackwardDescriptorEx");
            return owned(descriptor, infiniopDestroyBatchNormBackwardDescriptor,
                         infiniopGetBatchNormBackwardWorkspaceSize);
        });
        Tensor workspace = workspaceFor(*kernel, input);
        check(infiniopBatchNormBackwardEx(kernel->as<infiniopBatchNormBackwardDescriptor_t>(),
                                          data(workspace), kernel->workspace_size, data(grad_input), data(grad_weight),
                                          data(grad_bias), input.data_ptr(), grad.data_ptr(), data(weight),
                                          data(running_mean), data(running_var), data(save_mean), data(save_invstd),
                                          streamOf(input)),
              "infiniopBatchNormBackwardEx");
        ++backward_calls[2];
        return onceDifferentiable(grads, {Tensor(), Tensor(), Tensor(), want_input ? grad_input : Tensor(), grad_weight,
                                   grad_bias, Tensor(), Tensor(), Tensor(), Tensor()});
    }
};

Tensor batchNorm(Tensor output, const Tensor &save_mean, const Tensor &save_invstd, const Tensor &input,
                 const std::optional<Tensor> &weight, const std::optional<Tensor> &bias,
                 const std::optional<Tensor> &running_mean, const std::optional<Tensor> &running_var, bool training,
                 double eps) {
    return BatchNormNode::apply(output, save_mean, save_invstd, input, weight, bias, running_mean, running_var,
                                training, eps);
}

} // namespace

TORCH_LIBRARY(infiniop_nodes, m) {
    m.def("rms_norm(Tensor(a!) output, Tensor rstd, Tensor input, Tensor weight) -> Tensor(a!)");
    m.def("layer_norm(Tensor(a!) output, Tensor mean, Tensor rstd, Tensor input, Tensor? weight, Tensor? bias, "
          "int normalized_dims) -> Tensor(a!)");
    m.def("batch_norm(Tensor(a!) output, Tensor save_mean, Tensor save_invstd, Tensor input, Tensor? weight, "
          "Tensor? bias, Tensor? running_mean, Tensor? running_var, bool training, float eps) -> Tensor(a!)");
    m.def("backward_calls() -> int[]", TORCH_FN(backwardCalls));
    m.impl("rms_norm", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(rmsNorm));
    m.impl("layer_norm", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(layerNorm));
    m.impl("batch_norm", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(batchNorm));
}
