"""LayerNorm backward: grad_input, grad_weight, grad_bias from grad_output, weight, xhat, std (design.md
section 2), with the Ex options: no weight (no affine), gradients not wanted, F32 parameters for F16/BF16
data, F64, and normalized shapes of several trailing dims. The same from the forward's input and its per-row
mean and rstd (PyTorch's and CANN's form): LayerNormBackwardFromInput, or the functional API's keywords."""

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
    _seed_optional = ("grad_bias",)  # a layer without bias, as InfiniCore passes it

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


class LayerNormBackwardFromInput(Operator):
    """Stateful LayerNorm backward for one layout, from the forward's input and per-row statistics: xhat =
    (input - mean) * rstd is formed in the kernels, never stored.

    As LayerNormBackward, with input in input_standardization's place and mean, rstd (shape
    grad_input.shape[:s], F32, or F64 for F64 data) in input_std_deviation's.
    """

    _c_name = "LayerNormBackwardFromInput"
    _descriptor_c_name = "LayerNormBackward"  # its workspace size and destroy functions serve both forms
    _outputs = ("grad_input", "grad_weight", "grad_bias")
    _in_place = ("grad_input", "grad_output")
    _check_layout_ex = staticmethod(_layout.check_layer_norm_backward_from_input_ex)
    _seed_count = 0  # no seed function takes this form
    _has_ex_run = True

    def __init__(self, handle, grad_input, grad_weight, grad_bias, grad_output, weight, input, mean, rstd):
        super().__init__(handle, {
            "grad_input": grad_input, "grad_weight": grad_weight, "grad_bias": grad_bias,
            "grad_output": grad_output, "weight": weight, "input": input, "mean": mean, "rstd": rstd,
        })

    def __call__(self, grad_input, grad_weight, grad_bias, grad_output, weight, input, mean, rstd, *,
                 workspace=None, stream=None):
        """Write grad_input, grad_weight and grad_bias. ``workspace``: >= workspace_size bytes, or None."""
        self._call((grad_input, grad_weight, grad_bias, grad_output, weight, input, mean, rstd), workspace, stream)


def _output_specs(refs):
    normalized = refs["grad_output"].shape[len(refs["input_std_deviation"].shape):]
    parameter = "weight" if refs["weight"] is not None else "input_std_deviation"
    return (refs["grad_output"].shape, "grad_output"), (normalized, parameter), (normalized, parameter)


def _from_input_output_specs(refs):
    normalized = refs["grad_output"].shape[len(refs["mean"].shape):]
    parameter = "weight" if refs["weight"] is not None else "grad_output"  # C's default parameter dtype is dT
    return (refs["grad_output"].shape, "grad_output"), (normalized, parameter), (normalized, parameter)


_SIGNATURE = _functional.Signature(
    LayerNormBackward, inputs=("grad_output", "weight", "input_standardization", "input_std_deviation"),
    outputs=("grad_input", "grad_weight", "grad_bias"), output_specs=_output_specs, optional=("weight",))
_FROM_INPUT_SIGNATURE = _functional.Signature(
    LayerNormBackwardFromInput, inputs=("grad_output", "weight", "input", "mean", "rstd"),
    outputs=("grad_input", "grad_weight", "grad_bias"), output_specs=_from_input_output_specs, optional=("weight",))


def layer_norm_backward(grad_output, weight, input_standardization=None, input_std_deviation=None, *, input=None,
                        mean=None, rstd=None, need_grad_weight=True, need_grad_bias=True, out=None):
    """(grad_input, grad_weight, grad_bias) of LayerNorm, normalized over the dims after the per-row tensors'.
    Give one form: input_standardization (xhat) and input_std_deviation (std, per row), or the keywords input,
    mean and rstd (per row; F32, F64 for F64 data), as PyTorch's native_layer_norm_backward takes them.
    ``weight`` None: no affine (all ones). ``need_grad_weight`` / ``need_grad_bias`` False: that gradient
    is not computed and comes back as None. ``out``: preallocated
    outputs in that order (None for those not wanted). Layouts the native op refuses (e.g. a non-unit last
    stride) run on packed copies, at one extra copy each."""
    wanted = (True, bool(need_grad_weight), bool(need_grad_bias))
    if input is None and mean is None and rstd is None:
        if input_standardization is None or input_std_deviation is None:
            _raise_form_error(input_standardization, input_std_deviation, input, mean, rstd)
        return _SIGNATURE.run((grad_output, weight, input_standardization, input_std_deviation), out, (), wanted)
    if input is None or mean is None or rstd is None or input_standardization is not None \
            or input_std_deviation is not None:
        _raise_form_error(input_standardization, input_std_deviation, input, mean, rstd)
    return _FROM_INPUT_SIGNATURE.run((grad_output, weight, input, mean, rstd), out, (), wanted)


def _raise_form_error(input_standardization, input_std_deviation, input, mean, rstd):
    given = {"input_standardization": input_standardization, "input_std_deviation": input_std_deviation,
             "input": input, "mean": mean, "rstd": rstd}
    named = ", ".join(name for name, value in given.items() if value is not None) or "none of them"
    raise TypeError(f"layer_norm_backward: give either input_standardization and input_std_deviation (the xhat "
                    f"form) or input=, mean= and rstd= (the from-input form), all of one form and none of the "
                    f"other; got {named}")
