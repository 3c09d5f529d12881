"""LayerNorm backward: grad_input, grad_weight, grad_bias from grad_output, weight, xhat, std (design.md
section 2), with the Ex options: no weight (no affine), gradients not wanted, F32 parameters for F16/BF16
data, F64, and normalized shapes of several trailing dims."""

from . import _functional, _layout
from ._operator import Operator


class LayerNormBackward(Operator):
    """Stateful LayerNorm backward for one layout.

    Each tensor argument is a TensorDesc, an array, a (shape, dtype[, strides]) tuple, or None where optional:
    grad_input, grad_output, input_standardization of any rank 1..8; input_std_deviation of shape
    grad_input.shape[:s], whose rank s leaves the trailing dims normalized; weight, grad_weight, grad_bias of
    shape grad_input.shape[s:]; weight None: all ones; grad_weight / grad_bias None: not computed.
    """

    _c_name = "LayerNormBackward"
    _outputs = ("grad_input", "grad_weight", "grad_bias")
    _in_place = ("grad_input", "grad_output")
    _check_layout = staticmethod(_layout.check_layer_norm_backward)
    _check_layout_ex = staticmethod(_layout.check_layer_norm_backward_ex)
    _seed_count = 7

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
        self._call((grad_input, grad_weight, grad_bias, grad_output, weight, input_standardization,
                    input_std_deviation), workspace, stream)


def _output_specs(refs):
    normalized = refs["grad_output"].shape[len(refs["input_std_deviation"].shape):]
    parameter = "weight" if refs["weight"] is not None else "input_std_deviation"
    return (refs["grad_output"].shape, "grad_output"), (normalized, parameter), (normalized, parameter)


_SIGNATURE = _functional.Signature(
    LayerNormBackward, inputs=("grad_output", "weight", "input_standardization", "input_std_deviation"),
    outputs=("grad_input", "grad_weight", "grad_bias"), output_specs=_output_specs, optional=("weight",))


def layer_norm_backward(grad_output, weight, input_standardization, input_std_deviation, *, need_grad_weight=True,
                        need_grad_bias=True, out=None):
    """(grad_input, grad_weight, grad_bias) of LayerNorm, normalized over the dims after input_std_deviation's.
    ``weight`` None: no affine (all ones). A gradient not wanted is returned as None. ``out``: preallocated
    outputs in that order (None for those not wanted). Layouts the native op refuses (e.g. a non-unit last
    stride) run on packed copies, at one extra copy each."""
    return _SIGNATURE.run((grad_output, weight, input_standardization, input_std_deviation), out, (),
                           (True, bool(need_grad_weight), bool(need_grad_bias)))
