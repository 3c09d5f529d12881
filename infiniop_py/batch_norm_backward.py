"""BatchNorm backward: grad_input, grad_weight, grad_bias from input, grad_output, weight and the statistics
(design.md section 2), with the Ex options: epsilon, saved statistics, eval mode, no weight (no affine),
gradients not wanted, F32 parameters for F16/BF16 data, F64, ranks 2..5 and channels-last layouts."""

import operator

from . import _functional, _layout, dtypes
from ._ffi import ffi, libraries
from ._operator import Operator, _native_function
from .errors import (BadParamError, BadTensorDtypeError, BadTensorShapeError, BadTensorStridesError,
                     NotImplementedStatusError)
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
    _seed_optional = ("grad_bias",)  # a layer without bias, as InfiniCore passes it
    _has_ex_run = True

    def __init__(self, handle, grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean,
                 running_var, save_mean=None, save_invstd=None, *, eps=0.0, training=True):
        arguments = (grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean, running_var,
                     save_mean, save_invstd)
        super().__init__(handle, dict(zip(_TENSORS, arguments)),
                         options={"epsilon": float(eps), "training": int(bool(training))},
                         seed_options={"epsilon": 0.0, "training": 1})
        self.training = bool(training)

    def __call__(self, grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean, running_var,
                 save_mean=None, save_invstd=None, *, workspace=None, stream=None):
        """Write grad_input, grad_weight and grad_bias (those the object was created with); pass None for every
        tensor it was created without. ``workspace``: >= workspace_size bytes, or None."""
        arguments = (grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean, running_var,
                     save_mean, save_invstd)
        self._call(arguments, workspace, stream)

    # The two phases of a backward whose batch is split over processes (SyncBatchNorm): reduce on each process,
    # add up the sums of all of them (an all-reduce), then elementwise with the totals. A training operator only.
    # The sums are (C,) contiguous arrays of the statistics dtype (float32; float64 for float64 data): per
    # channel, sum(grad_output) and sum(grad_output * (input - mean)).

    def reduce(self, sum_grad_output, sum_grad_centered, grad_weight, grad_bias, input, grad_output, running_mean,
               running_var, save_mean=None, save_invstd=None, *, workspace=None, stream=None):
        """Write this process's sums and the grad_weight / grad_bias of its data (those the operator was created
        with; None for the others). grad_input is not written."""
        arguments = {"sum_grad_output": self._sums_ref(sum_grad_output, "sum_grad_output", writable=True),
                     "sum_grad_centered": self._sums_ref(sum_grad_centered, "sum_grad_centered", writable=True)}
        arguments.update(self._refs(grad_weight=grad_weight, grad_bias=grad_bias, input=input,
                                    grad_output=grad_output, running_mean=running_mean, running_var=running_var,
                                    save_mean=save_mean, save_invstd=save_invstd))
        self._launch_function(self._phase_function("Reduce"), "infiniopBatchNormBackwardReduceEx",
                              list(arguments.items()), ("sum_grad_output", "sum_grad_centered", "grad_weight",
                                                        "grad_bias"), (), workspace, stream)

    def elementwise(self, grad_input, input, grad_output, weight, running_mean, running_var, save_mean,
                    save_invstd, sum_grad_output, sum_grad_centered, total_count, *, workspace=None, stream=None):
        """Write grad_input from the sums of all processes, which cover ``total_count`` elements per channel (at
        least this process's N * L). grad_input may be grad_output itself."""
        count = operator.index(total_count)
        if not 0 <= count < 2 ** 63:
            raise ValueError(f"total_count: {count} is not an int64 >= 0")
        arguments = self._refs(grad_input=grad_input, input=input, grad_output=grad_output, weight=weight,
                               running_mean=running_mean, running_var=running_var, save_mean=save_mean,
                               save_invstd=save_invstd)
        arguments["sum_grad_output"] = self._sums_ref(sum_grad_output, "sum_grad_output")
        arguments["sum_grad_centered"] = self._sums_ref(sum_grad_centered, "sum_grad_centered")
        self._launch_function(self._phase_function("Elementwise"), "infiniopBatchNormBackwardElementwiseEx",
                              list(arguments.items()), ("grad_input",), ("grad_input", "grad_output"), workspace,
                              stream, (ffi.cast("int64_t", count),))

    @property
    def statistics_dtype(self):
        """The dtype code of the statistics and the two-phase sums: F64 for F64 data, else F32."""
        return _statistics_dtype(self.layouts["input"].dtype)

    def _phase_function(self, phase):
        if not self.training:
            raise BadParamError(f"{phase.lower()}: the two phases need an operator created with training=True "
                                f"(eval mode has no sums to add up over processes)")
        function = _native_function(libraries().op, f"infiniopBatchNormBackward{phase}Ex")
        if function is None or len(self.layouts) < len(_TENSORS):
            raise NotImplementedStatusError(f"{phase.lower()}: needs infiniopBatchNormBackward{phase}Ex and an Ex "
                                            f"descriptor, which the loaded library ({libraries().op_path}) lacks")
        return function

    def _refs(self, **arrays):
        return {name: None if array is None else as_tensor(array, name, writable=name in self._outputs)
                for name, array in arrays.items()}

    def _sums_ref(self, array, name, writable=False):
        """A two-phase sums array: (C,), contiguous, of the statistics dtype, on the operator's device."""
        ref = as_tensor(array, name, writable=writable)
        channels = self.layouts["input"].shape[1]
        if ref.dtype != self.statistics_dtype:
            raise BadTensorDtypeError(f"{name}: dtype {dtypes.name(ref.dtype)}, but the sums are "
                                      f"{dtypes.name(self.statistics_dtype)} (the statistics dtype of this input)")
        if ref.shape != (channels,):
            raise BadTensorShapeError(f"{name}: shape {ref.shape}, but the sums have shape ({channels},), one per "
                                      f"channel")
        if channels > 1 and ref.strides != (1,):
            raise BadTensorStridesError(f"{name}: strides {ref.strides}, but the sums must be contiguous")
        self._require_handle_device(name, ref)
        return ref


def _output_specs(refs):
    channels = refs["input"].shape[1:2]
    return (refs["input"].shape, "input"), (channels, _parameter_like(refs)), (channels, _parameter_like(refs))


def _parameter_like(refs):
    """The tensor whose dtype fresh grad_weight / grad_bias take: the first parameter given, else input."""
    return next((name for name in ("weight", "running_mean", "running_var") if refs.get(name) is not None), "input")


def _outputs_like_channels_last(refs, wanted):
    """Fresh outputs (the TensorRefs of a call's inputs, which outputs are ``wanted``) with grad_input laid out
    like a channels-last input (a C-contiguous one would not share its layout and so cost copies); None for
    any other input, which takes the default outputs."""
    ref = refs["input"]
    grad_input = _functional.empty_like_channels_last(ref)
    if grad_input is None:
        return None
    like = _parameter_like(refs)
    vectors = [_functional.new_output(refs[like], ref.shape[1:2], like) if want else None for want in wanted[1:]]
    return (grad_input, *vectors)


_SIGNATURE = _functional.Signature(
    BatchNormBackward,
    inputs=("input", "grad_output", "weight", "running_mean", "running_var", "save_mean", "save_invstd"),
    outputs=("grad_input", "grad_weight", "grad_bias"), output_specs=_output_specs, options=("eps", "training"),
    optional=("weight", "running_mean", "running_var", "save_mean", "save_invstd"),
    fresh_outputs=_outputs_like_channels_last)


def batch_norm_backward(input, grad_output, weight, running_mean, running_var, *, eps=0.0, save_mean=None,
                        save_invstd=None, training=True, need_grad_weight=True, need_grad_bias=True, out=None):
    """(grad_input, grad_weight, grad_bias) of BatchNorm over (N, C, *spatial) arrays of rank 2..5.

    Training (default): mean and invstd are ``save_mean`` / ``save_invstd`` when given (as PyTorch's forward
    saves them; running_mean / running_var may then be None), else running_mean and
    1/sqrt(running_var + eps), the batch statistics. ``training=False``: the running statistics are
    constants, grad_input = grad_output * weight / sqrt(running_var + eps). ``weight`` None: no affine (all
    ones). ``need_grad_weight`` / ``need_grad_bias`` False: that gradient is not computed and comes back as None. ``out``: preallocated outputs in that order (None for
    those not wanted), else fresh C-contiguous ones (grad_weight / grad_bias in weight's dtype, else the
    running statistics', else input's).

    Channels-first and channels-last (NHWC) arrays run in place. Any other layout the native op refuses (a
    padded or mixed layout) runs on C-contiguous copies: one extra read and write of each such array, and of
    each such output, which is computed into a packed temporary and copied back.
    """
    wanted = (True, bool(need_grad_weight), bool(need_grad_bias))
    return _SIGNATURE.run((input, grad_output, weight, running_mean, running_var, save_mean, save_invstd),
                           out, (float(eps), bool(training)), wanted)


def batch_norm_backward_reduce(input, grad_output, running_mean=None, running_var=None, *, eps=0.0, save_mean=None,
                               save_invstd=None, need_grad_weight=True, need_grad_bias=True, out=None):
    """The reduce phase of a BatchNorm backward split over processes: (sum_grad_output, sum_grad_centered,
    grad_weight, grad_bias) of this process's part of the batch.

    The sums are (C,) arrays of the statistics dtype (float32; float64 for float64 data): per channel,
    sum(grad_output) and sum(grad_output * (input - mean)), mean and invstd taken as in batch_norm_backward's
    training mode. Add them up over the processes (an all-reduce), then call batch_norm_backward_elementwise.
    grad_weight / grad_bias are those of this process's data (None where not wanted). ``out``: the four outputs
    in that order (None for a gradient not wanted), else fresh ones (the gradients in running_mean's dtype, else
    input's). input and grad_output: channels-first or channels-last packed, one layout.
    """
    refs = _phase_refs(input=input, grad_output=grad_output, running_mean=running_mean, running_var=running_var,
                       save_mean=save_mean, save_invstd=save_invstd)
    input_ref = refs["input"]
    channels = _channels_of(input_ref)
    statistics = _statistics_dtype(input_ref.dtype)
    wanted = (bool(need_grad_weight), bool(need_grad_bias))
    if out is None:
        like = "running_mean" if refs["running_mean"] is not None else "input"
        out = (_functional.new_output(input_ref, (channels,), "input", statistics),
               _functional.new_output(input_ref, (channels,), "input", statistics),
               *(_functional.new_output(refs[like], (channels,), like) if want else None for want in wanted))
    _functional.require_out(out, ("sum_grad_output", "sum_grad_centered", "grad_weight", "grad_bias"),
                            (True, True, *wanted))
    grad_weight, grad_bias = (None if array is None else as_tensor(array, name, writable=True)
                              for name, array in zip(("grad_weight", "grad_bias"), out[2:]))
    operator = _phase_operator(refs, grad_weight, grad_bias, None, eps)
    operator.reduce(out[0], out[1], out[2], out[3], input, grad_output, running_mean, running_var, save_mean,
                    save_invstd, stream=_functional.library_stream(input_ref))
    return tuple(out)


def batch_norm_backward_elementwise(input, grad_output, weight, running_mean, running_var, sum_grad_output,
                                    sum_grad_centered, total_count, *, eps=0.0, save_mean=None, save_invstd=None,
                                    out=None):
    """The elementwise phase of a BatchNorm backward split over processes: grad_input of this process's part of
    the batch, from the sums of batch_norm_backward_reduce added up over all processes, which cover
    ``total_count`` elements per channel (an int, at least this process's N * L). The other arguments are as in
    batch_norm_backward's training mode (``weight`` None: all ones). ``out``: grad_input (it may be grad_output
    itself), else a fresh array laid out like input.
    """
    refs = _phase_refs(input=input, grad_output=grad_output, running_mean=running_mean, running_var=running_var,
                       save_mean=save_mean, save_invstd=save_invstd)
    weight_ref = None if weight is None else as_tensor(weight, "weight")
    if out is None:
        out = _grad_input_like(refs["input"])
    operator = _phase_operator(refs, None, None, weight_ref, eps,
                               grad_input=as_tensor(out, "grad_input", writable=True))
    operator.elementwise(out, input, grad_output, weight, running_mean, running_var, save_mean, save_invstd,
                         sum_grad_output, sum_grad_centered, total_count,
                         stream=_functional.library_stream(refs["input"]))
    return out


def _statistics_dtype(data_dtype):
    return dtypes.F64 if data_dtype == dtypes.F64 else dtypes.F32


def _phase_refs(**arrays):
    for name in ("input", "grad_output"):
        if arrays[name] is None:
            raise TypeError(f"{name}: expected an array, got None")
    return {name: None if array is None else as_tensor(array, name) for name, array in arrays.items()}


def _channels_of(ref):
    if len(ref.shape) < 2:
        raise BadTensorShapeError(f"input: shape {ref.shape}, but BatchNorm takes (N, C, *spatial) of rank 2..5")
    return ref.shape[1]


def _phase_operator(refs, grad_weight, grad_bias, weight, eps, grad_input=None):
    """The cached training operator of these layouts (grad_input: input's layout unless given)."""
    all_refs = {"grad_input": grad_input or refs["input"], "grad_weight": grad_weight, "grad_bias": grad_bias,
                "input": refs["input"], "grad_output": refs["grad_output"], "weight": weight,
                "running_mean": refs["running_mean"], "running_var": refs["running_var"],
                "save_mean": refs["save_mean"], "save_invstd": refs["save_invstd"]}
    return _functional.cached_operator(BatchNormBackward, all_refs, {"eps": float(eps), "training": True})


def _grad_input_like(ref):
    """A fresh grad_input with input's packed layout (channels-first or channels-last)."""
    grad_input = _functional.empty_in_layout(ref)
    return _functional.new_output(ref, ref.shape, "input") if grad_input is None else grad_input
