"""RMSNorm forward: y = x * w / sqrt(mean(x^2) + eps) over w's dims (the last w.ndim of x), and on request the
rstd = 1/sqrt(mean(x^2) + eps) per row that the backward takes as its saved statistic."""

from . import _functional, _layout, dtypes
from ._operator import Operator


class RMSNorm(Operator):
    """Stateful RMSNorm forward for one layout.

    Each tensor argument is a TensorDesc, an array, a (shape, dtype[, strides]) tuple, or None where optional:
    y, x of any rank 1..8 (y may be x, in place); w of shape x.shape[-k:] for the k normalized dims; rstd None:
    not written, else (F32, or F64 for F64 data) of shape x.shape[:-k]: 1/sqrt(mean(x^2) + eps) per row, which
    RMSNormBackward and rms_norm_backward take as their ``rstd``.
    """

    _c_name = "RMSNorm"
    _outputs = ("y", "rstd")
    _in_place = ("y", "x")
    _check_layout = staticmethod(_layout.check_rms_norm)
    _check_layout_ex = staticmethod(_layout.check_rms_norm_ex)
    _seed_count = 3
    _seed_names = ("y", "x", "w")  # the Ex forms put rstd among the outputs
    _seed_scalars = ("epsilon",)
    _has_ex_run = True

    def __init__(self, handle, y, rstd, x, w, *, eps=1e-6):
        super().__init__(handle, {"y": y, "rstd": rstd, "x": x, "w": w}, options={"epsilon": float(eps)})

    def __call__(self, y, rstd, x, w, *, workspace=None, stream=None):
        """Write y, and rstd where the operator was created with it. ``workspace``: an array of >=
        workspace_size bytes, or None."""
        self._call((y, rstd, x, w), workspace, stream)


def _output_specs(refs):
    x, w = refs["x"], refs["w"]
    statistics = dtypes.F64 if x.dtype == dtypes.F64 else dtypes.F32
    leading = max(len(x.shape) - len(w.shape), 0)
    return (x.shape, "x"), (tuple(x.shape)[:leading], "x", statistics)


_SIGNATURE = _functional.Signature(RMSNorm, inputs=("x", "w"), outputs=("y", "rstd"), output_specs=_output_specs,
                                   options=("eps",))


def rms_norm(x, w, *, eps=1e-6, need_rstd=False, out=None):
    """y = x * w / sqrt(mean(x^2) + eps), normalized over w's dims (the last w.ndim of x); with ``need_rstd``,
    (y, rstd), rstd = 1/sqrt(mean(x^2) + eps) of shape x.shape[:-w.ndim] (F32, or F64 for F64 data), which
    rms_norm_backward(..., rstd=rstd) takes. ``out``: preallocated (y, rstd or None), else fresh C-contiguous
    ones. Layouts the native op refuses (e.g. a non-unit last stride) run on packed copies, at one extra copy
    each."""
    y, rstd = _SIGNATURE.run((x, w), out, (float(eps),), (True, bool(need_rstd)))
    return (y, rstd) if need_rstd else y
