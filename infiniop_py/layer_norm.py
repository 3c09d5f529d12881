"""LayerNorm forward: y = (x - mean) * rstd * w + b over the normalized trailing dims, rstd = 1/sqrt(var + eps)
(biased variance), and on request the per-row statistics the backward takes: mean and rstd (LayerNorm, and
layer_norm(need_stats=True)), which layer_norm_backward(input=, mean=, rstd=) takes, or, as upstream InfiniCore
writes them, xhat and std (LayerNormXhat), which layer_norm_backward's xhat form takes."""

from . import _functional, _layout, dtypes
from ._operator import Operator


class LayerNorm(Operator):
    """Stateful LayerNorm forward for one layout, saving mean and rstd (infiniopCreateLayerNormDescriptorEx).

    Each tensor argument is a TensorDesc, an array, a (shape, dtype[, strides]) tuple, or None where optional:
    y, x of any rank 1..8 (y may be x, in place); w, b of shape x.shape[-k:] for the k normalized dims (None:
    ones, zeros); mean, rstd None: not written, else (F32, or F64 for F64 data) of shape x.shape[:-k]: what
    LayerNormBackwardFromInput and layer_norm_backward(input=, mean=, rstd=) take. With neither w nor b, the
    rank of mean (or rstd) names the leading dims; with none of them, the last dim alone is normalized.
    """

    _c_name = "LayerNorm"
    _outputs = ("y", "mean", "rstd")
    _in_place = ("y", "x")
    _check_layout_ex = staticmethod(_layout.check_layer_norm_ex)
    _seed_count = 0  # the seed create takes the xhat form (LayerNormXhat)
    _has_ex_run = True

    def __init__(self, handle, y, mean, rstd, x, w, b, *, eps=1e-5):
        super().__init__(handle, {"y": y, "mean": mean, "rstd": rstd, "x": x, "w": w, "b": b},
                         options={"eps": float(eps)})

    def __call__(self, y, mean, rstd, x, w, b, *, workspace=None, stream=None):
        """Write y, and mean and rstd where the operator was created with them. ``workspace``: an array of >=
        workspace_size bytes, or None."""
        self._call((y, mean, rstd, x, w, b), workspace, stream)


class LayerNormXhat(Operator):
    """Stateful LayerNorm forward for one layout as upstream InfiniCore runs it (infiniopCreateLayerNormDescriptor):
    over the last dim, writing output, input_standardization (xhat) and input_std_deviation (std = sqrt(var +
    eps), per row), which LayerNormBackward takes.

    output, input_standardization, input: rank 2 or 3 (output may be input, in place); input_std_deviation:
    input.shape[:-1], of the parameters' dtype; weight, bias: (L,). input_standardization, input_std_deviation
    and bias may be None (not written; no bias).
    """

    _c_name = "LayerNorm"
    _outputs = ("output", "input_standardization", "input_std_deviation")
    _in_place = ("output", "input")
    _check_layout = staticmethod(_layout.check_layer_norm)
    _seed_count = 6
    _seed_optional = ("input_standardization", "input_std_deviation", "bias")
    _seed_scalars = ("eps",)
    _seed_form_only = True

    def __init__(self, handle, output, input_standardization, input_std_deviation, input, weight, bias, *,
                 eps=1e-5):
        super().__init__(handle, {
            "output": output, "input_standardization": input_standardization,
            "input_std_deviation": input_std_deviation, "input": input, "weight": weight, "bias": bias,
        }, options={"eps": float(eps)})

    def __call__(self, output, input_standardization, input_std_deviation, input, weight, bias, *, workspace=None,
                 stream=None):
        """Write output, and xhat and std where the operator was created with them."""
        self._call((output, input_standardization, input_std_deviation, input, weight, bias), workspace, stream)


def _output_specs(refs):
    x = refs["x"]
    parameter = refs["w"] if refs["w"] is not None else refs["b"]
    statistics = dtypes.F64 if x.dtype == dtypes.F64 else dtypes.F32
    leading = len(x.shape) - (len(parameter.shape) if parameter is not None else 1)
    leading_shape = tuple(x.shape)[:max(leading, 0)]
    return (x.shape, "x"), (leading_shape, "x", statistics), (leading_shape, "x", statistics)


_SIGNATURE = _functional.Signature(LayerNorm, inputs=("x", "w", "b"), outputs=("y", "mean", "rstd"),
                                   output_specs=_output_specs, options=("eps",), optional=("w", "b"))


def layer_norm(x, w=None, b=None, *, eps=1e-5, need_stats=False, out=None):
    """y = (x - mean) * rstd * w + b, normalized over w's dims (the last w.ndim of x; b's where w is None; the last
    dim where both are None); rstd = 1/sqrt(var + eps), biased variance. With ``need_stats``, (y, mean, rstd),
    mean and rstd of shape x.shape[:-k] (F32, or F64 for F64 data), which layer_norm_backward(input=x, mean=,
    rstd=) takes. ``out``: preallocated (y, mean, rstd), None for the statistics not wanted, else fresh
    C-contiguous ones. Layouts the native op refuses (e.g. a non-unit last stride) run on packed copies, at one
    extra copy each."""
    wanted = (True, bool(need_stats), bool(need_stats))
    y, mean, rstd = _SIGNATURE.run((x, w, b), out, (float(eps),), wanted)
    return (y, mean, rstd) if need_stats else y
