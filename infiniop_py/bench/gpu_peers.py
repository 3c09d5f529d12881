"""The GPU implementations `bench --device nvidia` times beside torch's native kernels: Liger-Kernel's RMSNorm and
LayerNorm backward and forward (Triton kernels; where the liger_kernel package imports) and cuDNN's BatchNorm
backward and forward (ATen's cudnn_batch_norm_backward and cudnn_batch_norm, the calls torch's BatchNorm makes when
cuDNN takes it).

Each backward builder takes the case's tensors, runs the peer's own forward once for the statistics it saves, and
returns (call, gradient): call() launches the backward on torch's current stream (so a CUDA graph captures it) and
gradient() is the grad_input of the last call. Each forward builder returns (call, output), output() being y of a
fresh call. Where a peer cannot run it raises Unavailable with the reason.
"""

import importlib
import importlib.metadata


class Unavailable(Exception):
    """This peer cannot run this case; the message says why."""


def liger_modules():
    """(liger_kernel.ops.rms_norm, liger_kernel.ops.layer_norm, version), or Unavailable saying how to get them."""
    try:
        rms_norm = importlib.import_module("liger_kernel.ops.rms_norm")
        layer_norm = importlib.import_module("liger_kernel.ops.layer_norm")
    except Exception as error:  # ImportError, or a Triton/torch mismatch failing at import
        raise Unavailable(f"liger_kernel does not import ({type(error).__name__}: {error}); "
                          "pip install liger-kernel") from None
    try:
        version = importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        version = "(version unknown)"
    return rms_norm, layer_norm, f"Liger-Kernel {version}"


def _cuda_only(tensor, peer):
    if tensor.device.type != "cuda":
        raise Unavailable(f"{peer} runs on CUDA tensors only")


def liger_rms_norm_backward(modules, grad_y, x, weight):
    """Liger's RMSNorm backward as its autograd Function runs it: "llama" casting (F32 rstd), in place (grad_x
    overwrites its own copy of grad_y, Liger's default), the rstd from its forward with eps = 0 as the seed's."""
    _cuda_only(x, "Liger-Kernel")
    rms_norm = modules[0]
    grad = grad_y.clone()  # in place: grad_y itself stays the other implementations' input
    try:
        _, saved_x, rstd, block, warps, casting = rms_norm.rms_norm_forward(x, weight, 0.0, 0.0, "llama", None)
    except RuntimeError as error:  # rows beyond its block size (64K elements)
        raise Unavailable(f"Liger-Kernel refuses it: {error}") from None

    def call():
        rms_norm.rms_norm_backward(grad, saved_x, weight, rstd, 0.0, casting, block, warps, True, None)

    def gradient():
        grad.copy_(grad_y)  # replays left grad_x of grad_x of ... there
        call()
        return grad
    return call, gradient


def liger_layer_norm_backward(modules, grad_output, x, weight, eps):
    """Liger's LayerNorm backward from the forward's input and its saved F32 mean and rstd (grad_input,
    grad_weight and grad_bias, the latter two summed from per-SM partials)."""
    _cuda_only(x, "Liger-Kernel")
    layer_norm = modules[1]
    bias = weight.clone()
    try:
        _, saved_x, mean, rstd, _, _ = layer_norm.layer_norm_forward(x, weight, bias, eps)
    except RuntimeError as error:
        raise Unavailable(f"Liger-Kernel refuses it: {error}") from None
    result = []

    def call():
        result[:] = layer_norm.layer_norm_backward(grad_output, saved_x, weight, bias, mean, rstd)

    def gradient():
        call()
        return result[0]
    return call, gradient


def liger_rms_norm_forward(modules, x, weight, eps):
    """Liger's RMSNorm forward as its autograd Function runs it ("llama" casting: F32 rstd saved)."""
    _cuda_only(x, "Liger-Kernel")
    rms_norm = modules[0]

    def call():
        return rms_norm.rms_norm_forward(x, weight, eps, 0.0, "llama", None)

    return _forward_peer(call, "Liger-Kernel")  # refused: rows beyond its block size (64K elements)


def liger_layer_norm_forward(modules, x, weight, bias, eps):
    """Liger's LayerNorm forward: y, and the F32 mean and rstd it saves."""
    _cuda_only(x, "Liger-Kernel")
    layer_norm = modules[1]
    return _forward_peer(lambda: layer_norm.layer_norm_forward(x, weight, bias, eps), "Liger-Kernel")


def _forward_peer(call, peer):
    """(call, output) of a peer's forward whose first result is y, once it has run here (a refusal: Unavailable,
    naming the peer)."""
    try:
        call()
    except RuntimeError as error:
        raise Unavailable(f"{peer} refuses it: {str(error).splitlines()[0]}") from None
    return call, (lambda: call()[0])


def cudnn_version(torch):
    """"cuDNN <version>", or Unavailable where torch has no usable cuDNN."""
    if not (torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled):
        raise Unavailable(f"torch {torch.__version__} has no usable cuDNN")
    return f"cuDNN {torch.backends.cudnn.version()}"


def cudnn_batch_norm_backward(torch, x, grad_output, weight, eps):
    """cuDNN's training BatchNorm backward from the statistics its own forward saved (weight F32 for 16-bit data,
    as cuDNN requires; eps at least cuDNN's minimum, 1e-5)."""
    _cuda_only(x, "cuDNN")
    aten = torch.ops.aten
    # Running statistics as a module has them (a momentum of 0 leaves them as they are): the calls torch makes.
    running_mean, running_var = torch.zeros_like(weight), torch.ones_like(weight)
    try:
        _, save_mean, save_invstd, reserve = aten.cudnn_batch_norm(x, weight, torch.zeros_like(weight), running_mean,
                                                                  running_var, True, 0.0, eps)
    except RuntimeError as error:
        raise Unavailable(f"cuDNN refuses it: {str(error).splitlines()[0]}") from None
    result = []

    def call():
        result[:] = aten.cudnn_batch_norm_backward(x, grad_output, weight, running_mean, running_var, save_mean,
                                                   save_invstd, eps, reserve)

    def gradient():
        call()
        return result[0]
    return call, gradient


def cudnn_batch_norm_forward(torch, x, weight, bias, momentum, eps):
    """cuDNN's training BatchNorm forward (weight and bias F32 for 16-bit data, as cuDNN requires), updating running
    statistics of its own as torch's module does."""
    _cuda_only(x, "cuDNN")
    aten = torch.ops.aten
    running_mean, running_var = torch.zeros_like(weight), torch.ones_like(weight)

    def call():
        return aten.cudnn_batch_norm(x, weight, bias, running_mean, running_var, True, momentum, eps)

    return _forward_peer(call, "cuDNN")
