"""torch.nn.functional's argument checks, made before this package's forwards run PyTorch's unchecked kernels.

The forwards call torch.native_batch_norm and aten._fused_rms_norm, which trust their caller: a weight or running
statistic of the wrong length is read (and, for running statistics, written) out of bounds, and an input whose
trailing dims are not normalized_shape is normalized over the wrong dims. torch.nn.functional checks first, and so
must we, in the forward, before any kernel runs; the backward kernels then read only memory of the right size on
the right device.

On a mismatch the torch.nn.functional function itself is called with the same arguments, so the exception is
torch's own, type and message, for whichever torch is installed (its checks run before its kernels, so nothing is
written). Should torch take what these checks refuse, a RuntimeError naming the argument is raised instead.

Each check costs a few attribute reads on the hot path (host time per call matters on GPUs).
"""

import math

import torch

_functional = torch.nn.functional


def _refuse(function, arguments, problem):
    with torch.no_grad():
        function(*arguments)
    raise RuntimeError(problem)


def _device_problem(input, tensors):
    """What is wrong with the first of ``tensors`` ((name, tensor or None) pairs) not on input's device, or None.
    Where input is on the CPU or CUDA this asks is_cpu / is_cuda and the CUDA index first: reading .device builds an
    object, and comparing two costs about 0.17 us a tensor, on every forward."""
    cpu, cuda, index = input.is_cpu, input.is_cuda, input.get_device()
    for name, tensor in tensors:
        if tensor is None or (cpu and tensor.is_cpu) or (cuda and tensor.is_cuda and tensor.get_device() == index):
            continue
        if tensor.device != input.device:
            return f"{name} is on {tensor.device}, but input is on {input.device}"
    return None


def rms_norm(input, normalized_shape, weight, eps):
    """What torch.nn.functional.rms_norm refuses: an empty normalized_shape, a weight not of that shape, an input
    whose trailing dims are not it, and (before our backward reads it) a weight on another device."""
    count = len(normalized_shape)
    shape = input.shape
    problem = None
    if count == 0:
        problem = "normalized_shape must have at least one dim"
    elif weight is not None and tuple(weight.shape) != tuple(normalized_shape):
        problem = f"weight: shape {tuple(weight.shape)} must be normalized_shape {tuple(normalized_shape)}"
    elif len(shape) < count or tuple(shape[len(shape) - count:]) != tuple(normalized_shape):
        problem = f"input: shape {tuple(shape)} must end in normalized_shape {tuple(normalized_shape)}"
    else:
        problem = _device_problem(input, (("weight", weight),))
    if problem is not None:
        _refuse(_functional.rms_norm, (input, list(normalized_shape), weight, eps), problem)


def layer_norm(input, normalized_shape, weight, bias, eps):
    """torch.native_layer_norm checks shapes and dtypes itself; this adds the devices of weight and bias."""
    problem = _device_problem(input, (("weight", weight), ("bias", bias)))
    if problem is not None:
        _refuse(_functional.layer_norm, (input, list(normalized_shape), weight, bias, eps), problem)


def batch_size(input, running_mean, running_var, weight, bias, momentum, eps):
    """torch.nn.functional.batch_norm's first check in training: a channel of one value has no variance."""
    shape = input.shape
    if len(shape) >= 2 and shape[0] * math.prod(shape[2:]) == 1:
        _refuse(_functional.batch_norm, (input, _copy(running_mean), _copy(running_var), weight, bias, True,
                                         momentum, eps), "Expected more than 1 value per channel when training")


def batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """What torch.nn.functional.batch_norm refuses past its batch-size check: an input of fewer than 2 dims,
    weight, bias or running statistics without one element per channel (input.shape[1]), running statistics missing
    in eval, and (before our backward reads them) any of them on another device. torch takes an empty input with
    any of those (functional.batch_norm gives it to torch), so it is checked only where it has elements."""
    problem = None
    if input.dim() < 2:
        problem = f"input: {input.dim()} dims, must have at least 2 (N, C, ...)"
    else:
        channels = input.shape[1]
        named = (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias))
        for name, tensor in named:
            if tensor is None:
                if not training and name.startswith("running"):
                    problem = f"{name} must be given in evaluation mode"
                    break
            elif tensor.numel() != channels:
                problem = f"{name}: {tensor.numel()} elements, must be one per channel ({channels})"
                break
        if problem is None:
            problem = _device_problem(input, named)
    if problem is not None:  # on copies of the running statistics: torch must not update them, should it run
        _refuse(_functional.batch_norm, (input, _copy(running_mean), _copy(running_var), weight, bias, training,
                                         momentum, eps), problem)


def _copy(tensor):
    return None if tensor is None else tensor.clone()
