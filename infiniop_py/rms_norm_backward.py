"""RMSNorm backward: grad_x, grad_w from grad_y, x, w (design.md section 2)."""

from . import _functional, _layout
from ._operator import Operator


class RMSNormBackward(Operator):
    """Stateful RMSNorm backward for one layout.

    Each tensor argument is a TensorDesc, an array, or a (shape, dtype[, strides]) tuple:
    grad_x, grad_y, x of shape (N, D) or (N1, N2, D); grad_w, w of shape (D,).
    """

    _c_name = "RMSNormBackward"
    _outputs = ("grad_x", "grad_w")
    _in_place = ("grad_x", "grad_y")
    _check_layout = staticmethod(_layout.check_rms_norm_backward)

    def __init__(self, handle, grad_x, grad_w, grad_y, x, w):
        super().__init__(handle, {"grad_x": grad_x, "grad_w": grad_w, "grad_y": grad_y, "x": x, "w": w})

    def __call__(self, grad_x, grad_w, grad_y, x, w, *, workspace=None, stream=None):
        """Write grad_x and grad_w. ``workspace``: an array of >= workspace_size bytes, or None."""
        self._call({"grad_x": grad_x, "grad_w": grad_w, "grad_y": grad_y, "x": x, "w": w}, workspace, stream)


def rms_norm_backward(grad_y, x, w, *, out=None):
    """(grad_x, grad_w) of RMSNorm; ``out``: preallocated (grad_x, grad_w), else fresh C-contiguous ones."""
    return _functional.run(
        RMSNormBackward, {"grad_y": grad_y, "x": x, "w": w}, ("grad_x", "grad_w"),
        lambda refs: (refs["x"].shape, refs["x"].shape[-1:]), out,
    )
