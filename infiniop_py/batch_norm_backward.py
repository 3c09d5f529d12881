"""BatchNorm backward: grad_input, grad_weight, grad_bias from input, grad_output, weight and the statistics
(design.md section 2), with the Ex options: epsilon, saved statistics, eval mode, no weight (no affine),
gradients not wanted, F32 parameters for F16/BF16 data, F64, ranks 2..5 and channels-last layouts."""

import numpy as np

from . import _functional, _layout
from ._operator import Operator
from .tensors import as_tensor

_TENSORS = ("grad_input", "grad_weight", "grad_bias", "input", "grad_output", "weight", "running_mean",
            "running_var", "save_mean", "save_invstd")


class BatchNormBackward(Operator):
    """Stateful BatchNorm backward for one layout.

    Each tensor argument is a TensorDesc, an array, a (shape, dtype[, strides]) tuple, or None where optional:
    grad_input, input, grad_output of shape (N, C, *spatial) of rank 2..5, all channels-first packed
    (row-major) or all channels-last packed (e.g. NHWC); every other tensor of shape (C,), any stride.
    grad_weight / grad_bias None: not computed. weight None: all ones. training: mean and invstd are
    save_mean / save_invstd (F32, or F64 for F64 data) when given, else running_mean and
    1/sqrt(running_var + eps) (the batch statistics); training=False (eval): running_mean and
    1/sqrt(running_var + eps) are constants, and save_mean / save_invstd must be None. F16/BF16 data may take
    F32 parameters (weight, gradients, running statistics). Strided layouts are refused, never copied.
    """

    _c_name = "BatchNormBackward"
    _outputs = ("grad_input", "grad_weight", "grad_bias")
    _in_place = ("grad_input", "grad_output")
    _check_layout = staticmethod(_layout.check_batch_norm_backward)
    _check_layout_ex = staticmethod(_layout.check_batch_norm_backward_ex)
    _seed_count = 8
    _has_ex_run = True

    def __init__(self, handle, grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean,
                 running_var, save_mean=None, save_invstd=None, *, eps=0.0, training=True):
        arguments = (grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean, running_var,
                     save_mean, save_invstd)
        super().__init__(handle, dict(zip(_TENSORS, arguments)),
                         options={"epsilon": float(eps), "training": int(bool(training))},
                         seed_options={"epsilon": 0.0, "training": 1})

    def __call__(self, grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean, running_var,
                 save_mean=None, save_invstd=None, *, workspace=None, stream=None):
        """Write grad_input, grad_weight and grad_bias (those the object was created with); pass None for every
        tensor it was created without. ``workspace``: >= workspace_size bytes, or None."""
        arguments = (grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean, running_var,
                     save_mean, save_invstd)
        self._call(arguments, workspace, stream)


def _output_specs(refs):
    channels = refs["input"].shape[1:2]
    return (refs["input"].shape, "input"), (channels, _parameter_like(refs)), (channels, _parameter_like(refs))


_SIGNATURE = _functional.Signature(
    BatchNormBackward,
    inputs=("input", "grad_output", "weight", "running_mean", "running_var", "save_mean", "save_invstd"),
    outputs=("grad_input", "grad_weight", "grad_bias"), output_specs=_output_specs, options=("eps", "training"),
    optional=("weight", "running_mean", "running_var", "save_mean", "save_invstd"))


def batch_norm_backward(input, grad_output, weight, running_mean, running_var, *, eps=0.0, save_mean=None,
                        save_invstd=None, training=True, need_grad_weight=True, need_grad_bias=True, out=None):
    """(grad_input, grad_weight, grad_bias) of BatchNorm over (N, C, *spatial) arrays of rank 2..5.

    Training (default): mean and invstd are ``save_mean`` / ``save_invstd`` when given (as PyTorch's forward
    saves them; running_mean / running_var may then be None), else running_mean and
    1/sqrt(running_var + eps), the batch statistics. ``training=False``: the running statistics are
    constants, grad_input = grad_output * weight / sqrt(running_var + eps). ``weight`` None: no affine (all
    ones). A gradient not wanted is returned as None. ``out``: preallocated outputs in that order (None for
    those not wanted), else fresh C-contiguous ones (grad_weight / grad_bias in weight's dtype, else the
    running statistics', else input's).

    Channels-first and channels-last (NHWC) arrays run in place. Any other layout the native op refuses (a
    padded or mixed layout) runs on C-contiguous copies: one extra read and write of each such array, and of
    each such output, which is computed into a packed temporary and copied back.
    """
    wanted = (True, bool(need_grad_weight), bool(need_grad_bias))
    if out is None:
        out = _outputs_like_channels_last(input, {"weight": weight, "running_mean": running_mean,
                                                  "running_var": running_var}, wanted)
    return _SIGNATURE.run((input, grad_output, weight, running_mean, running_var, save_mean, save_invstd),
                           out, (float(eps), bool(training)), wanted)


def _parameter_like(refs):
    """The tensor whose dtype fresh grad_weight / grad_bias take: the first parameter given, else input."""
    return next((name for name in ("weight", "running_mean", "running_var") if refs.get(name) is not None), "input")


def _outputs_like_channels_last(input, parameters, wanted):
    """Fresh outputs with grad_input laid out like a channels-last ``input`` (a C-contiguous one would not
    share its layout and so cost copies); None for any other input, which takes the default outputs."""
    if type(input) is np.ndarray and input.flags.c_contiguous:  # channels-first (or too few dims to tell)
        return None
    ref = as_tensor(input, "input")
    spec = _layout.TensorSpec(ref.shape, ref.dtype, ref.strides)
    if len(ref.shape) < 3 or _layout.batch_norm_layout([spec]) != "channels_last":
        return None
    owner = ref.owner
    if isinstance(owner, np.ndarray):
        grad_input = np.empty_like(owner)  # order "K": the same packed layout
    elif hasattr(owner, "new_empty_strided"):  # torch
        grad_input = owner.new_empty_strided(owner.shape, owner.stride())
    else:
        return None
    refs = {name: None if array is None else as_tensor(array, name) for name, array in parameters.items()}
    like = _parameter_like(refs)
    like_ref = ref if like == "input" else refs[like]
    vectors = [_functional.new_output(like_ref, ref.shape[1:2], like) if want else None for want in wanted[1:]]
    return (grad_input, *vectors)
