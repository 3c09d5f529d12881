"""RMSNorm backward: grad_x, grad_w from grad_y, x, w (design.md section 2), with the Ex options: epsilon, a
saved rstd, no grad_w, F32 weights for F16/BF16 data, F64, and normalized shapes of several trailing dims."""

from . import _functional, _layout
from ._operator import Operator


class RMSNormBackward(Operator):
    """Stateful RMSNorm backward for one layout.

    Each tensor argument is a TensorDesc, an array, a (shape, dtype[, strides]) tuple, or None where optional:
    grad_x, grad_y, x of any rank 1..8; w (and grad_w) of shape x.shape[-k:] for the k normalized dims;
    grad_w None: not computed; rstd (F32, or F64 for F64 data) of shape x.shape[:-k]: the forward's
    1/sqrt(mean(x^2) + eps), used instead of recomputing it (eps is then unused).
    """

    _c_name = "RMSNormBackward"
    _outputs = ("grad_x", "grad_w")
    _in_place = ("grad_x", "grad_y")
    _check_layout = staticmethod(_layout.check_rms_norm_backward)
    _check_layout_ex = staticmethod(_layout.check_rms_norm_backward_ex)
    _seed_count = 5
    _has_ex_run = True

    def __init__(self, handle, grad_x, grad_w, grad_y, x, w, rstd=None, *, eps=0.0):
        super().__init__(handle, {"grad_x": grad_x, "grad_w": grad_w, "grad_y": grad_y, "x": x, "w": w,
                                  "rstd": rstd},
                         options={"epsilon": float(eps)}, seed_options={"epsilon": 0.0})

    def __call__(self, grad_x, grad_w, grad_y, x, w, rstd=None, *, workspace=None, stream=None):
        """Write grad_x and grad_w. ``workspace``: an array of >= workspace_size bytes, or None."""
        self._call((grad_x, grad_w, grad_y, x, w, rstd), workspace, stream)


def _output_specs(refs):
    return (refs["grad_y"].shape, "grad_y"), (refs["w"].shape, "w")


_SIGNATURE = _functional.Signature(RMSNormBackward, inputs=("grad_y", "x", "w", "rstd"),
                                   outputs=("grad_x", "grad_w"), output_specs=_output_specs, options=("eps",),
                                   optional=("rstd",))


def rms_norm_backward(grad_y, x, w, *, eps=0.0, rstd=None, need_grad_weight=True, out=None):
    """(grad_x, grad_w) of RMSNorm y = x * w / sqrt(mean(x^2) + eps), normalized over w's dims (the last w.ndim
    of x). ``rstd``: the forward's saved 1/sqrt(mean(x^2) + eps) (then eps is unused). grad_w is None when
    ``need_grad_weight`` is False. ``out``: preallocated (grad_x, grad_w or None), else fresh C-contiguous ones.
    Layouts the native op refuses (e.g. a non-unit last stride) run on packed copies, at one extra copy each."""
    return _SIGNATURE.run((grad_y, x, w, rstd), out, (float(eps),), (True, bool(need_grad_weight)))
