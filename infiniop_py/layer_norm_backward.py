"""LayerNorm backward: grad_input, grad_weight, grad_bias from grad_output, weight, xhat, std
(design.md section 2)."""

from . import _functional, _layout
from ._operator import Operator


class LayerNormBackward(Operator):
    """Stateful LayerNorm backward for one layout.

    Each tensor argument is a TensorDesc, an array, or a (shape, dtype[, strides]) tuple:
    grad_input, grad_output, input_standardization of shape (N, L) or (N1, N2, L);
    grad_weight, grad_bias, weight of shape (L,); input_std_deviation of shape grad_input.shape[:-1].
    """

    _c_name = "LayerNormBackward"
    _outputs = ("grad_input", "grad_weight", "grad_bias")
    _in_place = ("grad_input", "grad_output")
    _check_layout = staticmethod(_layout.check_layer_norm_backward)

    def __init__(self, handle, grad_input, grad_weight, grad_bias, grad_output, weight, input_standardization,
                 input_std_deviation):
        super().__init__(handle, {
            "grad_input": grad_input, "grad_weight": grad_weight, "grad_bias": grad_bias,
            "grad_output": grad_output, "weight": weight, "input_standardization": input_standardization,
            "input_std_deviation": input_std_deviation,
        })

    def __call__(self, grad_input, grad_weight, grad_bias, grad_output, weight, input_standardization,
                 input_std_deviation, *, workspace=None, stream=None):
        """Write grad_input, grad_weight and grad_bias. ``workspace``: >= workspace_size bytes, or None."""
        self._call({
            "grad_input": grad_input, "grad_weight": grad_weight, "grad_bias": grad_bias,
            "grad_output": grad_output, "weight": weight, "input_standardization": input_standardization,
            "input_std_deviation": input_std_deviation,
        }, workspace, stream)


def layer_norm_backward(grad_output, weight, input_standardization, input_std_deviation, *, out=None):
    """(grad_input, grad_weight, grad_bias) of LayerNorm; ``out``: preallocated outputs in that order."""
    return _functional.run(
        LayerNormBackward,
        {"grad_output": grad_output, "weight": weight, "input_standardization": input_standardization,
         "input_std_deviation": input_std_deviation},
        ("grad_input", "grad_weight", "grad_bias"),
        lambda refs: (refs["grad_output"].shape, refs["grad_output"].shape[-1:], refs["grad_output"].shape[-1:]),
        out,
    )
