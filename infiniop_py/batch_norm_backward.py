"""BatchNorm backward (training mode): grad_input, grad_weight, grad_bias from input, grad_output,
weight and the batch statistics running_mean, running_var (design.md section 2)."""

from . import _functional, _layout
from ._operator import Operator


class BatchNormBackward(Operator):
    """Stateful BatchNorm backward for one layout.

    Each tensor argument is a TensorDesc, an array, or a (shape, dtype[, strides]) tuple:
    grad_input, input, grad_output of shape (N, C, L), fully contiguous;
    grad_weight, grad_bias, weight, running_mean, running_var of shape (C,).
    """

    _c_name = "BatchNormBackward"
    _outputs = ("grad_input", "grad_weight", "grad_bias")
    _in_place = ("grad_input", "grad_output")
    _check_layout = staticmethod(_layout.check_batch_norm_backward)

    def __init__(self, handle, grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean,
                 running_var):
        super().__init__(handle, {
            "grad_input": grad_input, "grad_weight": grad_weight, "grad_bias": grad_bias, "input": input,
            "grad_output": grad_output, "weight": weight, "running_mean": running_mean,
            "running_var": running_var,
        })

    def __call__(self, grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean, running_var,
                 *, workspace=None, stream=None):
        """Write grad_input, grad_weight and grad_bias. ``workspace``: >= workspace_size bytes, or None."""
        self._call({
            "grad_input": grad_input, "grad_weight": grad_weight, "grad_bias": grad_bias, "input": input,
            "grad_output": grad_output, "weight": weight, "running_mean": running_mean,
            "running_var": running_var,
        }, workspace, stream)


def batch_norm_backward(input, grad_output, weight, running_mean, running_var, *, out=None):
    """(grad_input, grad_weight, grad_bias) of training-mode BatchNorm; ``out``: preallocated outputs."""
    return _functional.run(
        BatchNormBackward,
        {"input": input, "grad_output": grad_output, "weight": weight, "running_mean": running_mean,
         "running_var": running_var},
        ("grad_input", "grad_weight", "grad_bias"),
        lambda refs: (refs["input"].shape, refs["input"].shape[1:2], refs["input"].shape[1:2]),
        out,
    )
