"""BatchNorm forward: y = (x - mean) / sqrt(var + eps) * weight + bias per channel (dim 1), with the batch
statistics in training (the running ones updated in place with momentum, as PyTorch does) or the running ones in
eval; on request the save_mean / save_invstd that the backward's saved-statistics form takes."""

from . import _functional, _layout, dtypes
from ._operator import Operator

_TENSORS = ("y", "save_mean", "save_invstd", "running_mean", "running_var", "x", "weight", "bias")


class BatchNorm(Operator):
    """Stateful BatchNorm forward for one layout.

    Each tensor argument is a TensorDesc, an array, a (shape, dtype[, strides]) tuple, or None where optional:
    y, x of shape (N, C, *spatial) of rank 2..5, both channels-first packed (row-major) or both channels-last
    packed (e.g. NHWC); y may be x (in place). Every other tensor has shape (C,), any stride. training: the batch
    statistics normalize; save_mean / save_invstd (F32, or F64 for F64 data; None: not written) get the batch
    mean and 1/sqrt(var + eps), which BatchNormBackward takes; running_mean / running_var (both or neither) are
    updated in place: running = (1 - momentum) * running + momentum * batch statistic, the variance unbiased.
    training=False (eval): running_mean / running_var are required and only read, save_mean / save_invstd must
    be None. weight / bias None: ones / zeros. F16/BF16 data may take F32 parameters and running statistics.
    """

    _c_name = "BatchNorm"
    _outputs = ("y", "save_mean", "save_invstd", "running_mean", "running_var")  # the running ones: in/out
    _in_place = ("y", "x")
    _check_layout = staticmethod(_layout.check_batch_norm)
    _check_layout_ex = staticmethod(_layout.check_batch_norm_ex)
    _seed_count = 6
    _seed_names = ("y", "running_mean", "running_var", "x", "weight", "bias")  # the Ex forms add the saved ones
    _seed_scalars = ("momentum", "epsilon")
    _has_ex_run = True

    def __init__(self, handle, y, save_mean, save_invstd, running_mean, running_var, x, weight, bias, *,
                 training=True, momentum=0.1, eps=1e-5):
        arguments = (y, save_mean, save_invstd, running_mean, running_var, x, weight, bias)
        super().__init__(handle, dict(zip(_TENSORS, arguments)),
                         options={"training": int(bool(training)), "momentum": float(momentum),
                                  "epsilon": float(eps)},
                         seed_options={"training": 1})
        self.training = bool(training)

    def __call__(self, y, save_mean, save_invstd, running_mean, running_var, x, weight, bias, *, workspace=None,
                 stream=None):
        """Write y, the saved statistics the operator was created with, and (training) update the running ones;
        pass None for every tensor it was created without. ``workspace``: >= workspace_size bytes, or None."""
        self._call((y, save_mean, save_invstd, running_mean, running_var, x, weight, bias), workspace, stream)


def _output_specs(refs):
    x = refs["x"]
    statistics = dtypes.F64 if x.dtype == dtypes.F64 else dtypes.F32
    channels = tuple(x.shape[1:2])
    return (x.shape, "x"), (channels, "x", statistics), (channels, "x", statistics)


def _outputs_like_channels_last(refs, wanted):
    """Fresh outputs with y laid out like a channels-last x; None for any other x, which takes the default ones."""
    ref = refs["x"]
    y = _functional.empty_like_channels_last(ref)
    if y is None:
        return None
    statistics = dtypes.F64 if ref.dtype == dtypes.F64 else dtypes.F32
    saved = [_functional.new_output(ref, ref.shape[1:2], "x", statistics) if want else None for want in wanted[1:]]
    return (y, *saved)


_SIGNATURE = _functional.Signature(
    BatchNorm, inputs=("running_mean", "running_var", "x", "weight", "bias"),
    outputs=("y", "save_mean", "save_invstd"), output_specs=_output_specs, options=("training", "momentum", "eps"),
    optional=("running_mean", "running_var", "weight", "bias"), fresh_outputs=_outputs_like_channels_last)


def batch_norm(x, weight=None, bias=None, running_mean=None, running_var=None, *, training=True, momentum=0.1,
               eps=1e-5, need_stats=False, out=None):
    """BatchNorm over (N, C, *spatial) arrays of rank 2..5: y, or with ``need_stats`` (y, save_mean,
    save_invstd).

    Training (default): normalizes with the batch mean and biased variance per channel; running_mean and
    running_var (both or neither) are updated in place as PyTorch updates them (momentum, unbiased variance; a
    batch of one value per channel is refused, as PyTorch refuses it). save_mean and save_invstd = 1/sqrt(var +
    eps) (F32, or F64 for F64 data) are what batch_norm_backward(save_mean=, save_invstd=) takes.
    ``training=False``: y = (x - running_mean) / sqrt(running_var + eps) * weight + bias, the running
    statistics only read. ``weight`` / ``bias`` None: ones / zeros. ``out``: (y, save_mean or None, save_invstd
    or None), else fresh arrays, y laid out like x (channels-first or channels-last). Other layouts run on
    C-contiguous copies, at one extra copy each.
    """
    need_stats = bool(need_stats)
    if need_stats and not training:
        raise ValueError("need_stats: eval mode (training=False) has no batch statistics to save")
    y, save_mean, save_invstd = _SIGNATURE.run(
        (running_mean, running_var, x, weight, bias), out, (bool(training), float(momentum), float(eps)),
        (True, need_stats, need_stats))
    return (y, save_mean, save_invstd) if need_stats else y
