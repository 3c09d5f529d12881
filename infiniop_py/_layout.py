"""The C validation rules of infiniopCreate*Descriptor, mirrored in Python in the same order.

Each ``check_*`` function takes tensor specs by the C parameter name (anything with ``shape``,
``dtype`` (an infiniDtype_t code) and ``strides`` (elements, or None for contiguous)) and raises
the error whose status C would return, with a message naming the tensor and the rule.
"""

import ctypes
import math
from typing import NamedTuple, Optional, Tuple

from . import dtypes
from .errors import BadParamError, BadTensorDtypeError, BadTensorShapeError, BadTensorStridesError, NullPointerError


class TensorSpec(NamedTuple):
    shape: Tuple[int, ...]
    dtype: int
    strides: Optional[Tuple[int, ...]] = None


def contiguous_strides(shape):
    """Row-major element strides: stride[i] = product(shape[i+1:])."""
    strides = []
    step = 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


def element_strides(byte_strides, shape, itemsize, name):
    """Byte strides (numpy's, __cuda_array_interface__'s; None: C-contiguous) as element strides, or
    BadTensorStridesError naming ``name`` where one is not a whole number of elements."""
    # An array with no elements has no layout to keep (numpy reports zero strides for it).
    if byte_strides is None or 0 in shape:
        return contiguous_strides(shape)
    strides = []
    for dim, (stride, extent) in enumerate(zip(byte_strides, shape)):
        if stride % itemsize and extent > 1:
            raise BadTensorStridesError(
                f"{name}: byte stride {stride} of dim {dim} is not a multiple of the item size {itemsize}"
            )
        strides.append(stride // itemsize)  # a dim of size <= 1 is never stepped
    return tuple(strides)


def strides_of(spec):
    return tuple(spec.strides) if spec.strides is not None else contiguous_strides(spec.shape)


def _require_present(specs, optional=()):
    for name, spec in specs.items():
        if spec is None and name not in optional:
            raise NullPointerError(f"{name}: tensor descriptor is NULL")


def _require_one_supported_dtype(specs):
    first_name, first = next(iter(specs.items()))
    for name, spec in specs.items():
        if spec is None:  # an absent optional tensor (the seed's grad_bias)
            continue
        if spec.dtype not in dtypes.SUPPORTED:
            raise BadTensorDtypeError(f"{name}: dtype {dtypes.name(spec.dtype)} must be one of F16, F32, BF16")
        if spec.dtype != first.dtype:
            raise BadTensorDtypeError(
                f"{name}: dtype {dtypes.name(spec.dtype)} must equal {first_name}'s dtype "
                f"{dtypes.name(first.dtype)} (all tensors of the call share one dtype)"
            )


def _require_ndim(name, spec, allowed):
    if len(spec.shape) not in allowed:
        wanted = " or ".join(str(n) for n in allowed)
        raise BadTensorShapeError(f"{name}: shape {tuple(spec.shape)} has {len(spec.shape)} dims, must have {wanted}")


def _require_shape(name, spec, expected, expected_text):
    if tuple(spec.shape) != tuple(expected):
        raise BadTensorShapeError(f"{name}: shape {tuple(spec.shape)} must be {expected_text} = {tuple(expected)}")


def _require_vector(name, spec, length, length_name, length_source):
    if tuple(spec.shape) != (length,):
        raise BadTensorShapeError(
            f"{name}: shape {tuple(spec.shape)} must be ({length_name},) = ({length},) "
            f"where {length_name} is {length_source}"
        )


def _require_last_dim_contiguous(name, spec):
    shape, strides = tuple(spec.shape), strides_of(spec)
    if shape and 0 not in shape and shape[-1] > 1 and strides[-1] != 1:
        raise BadTensorStridesError(
            f"{name}: stride[-1] is {strides[-1]}, must be 1 (the last dim must be contiguous)"
        )


def _require_fully_contiguous(name, spec):
    shape, strides = tuple(spec.shape), strides_of(spec)
    if 0 in shape:
        return
    expected = contiguous_strides(shape)
    for extent, stride, wanted in zip(shape, strides, expected):
        if extent > 1 and stride != wanted:
            raise BadTensorStridesError(
                f"{name}: strides {strides} must be the contiguous {expected} "
                f"(only dims of size 1 may differ): the tensor must be fully contiguous"
            )


def non_overlapping(spec):
    """No two elements share an address."""
    try:
        _require_no_self_overlap("tensor", spec)
    except BadTensorStridesError:
        return False
    return True


def _require_no_self_overlap(name, spec):
    shape, strides = tuple(spec.shape), strides_of(spec)
    if math.prod(shape) == 0:
        return
    reach = 0  # furthest offset reachable by the dims with smaller strides
    for stride, extent in sorted((abs(s), n) for n, s in zip(shape, strides) if n > 1):
        if stride < 1 + reach:
            raise BadTensorStridesError(
                f"{name}: strides {strides} with shape {shape} map two elements to one address; "
                f"an output must not overlap itself"
            )
        reach += stride * (extent - 1)


def check_rms_norm_backward(grad_x, grad_w, grad_y, x, w):
    specs = {"grad_x": grad_x, "grad_w": grad_w, "grad_y": grad_y, "x": x, "w": w}
    _require_present(specs)
    _require_one_supported_dtype(specs)
    _require_ndim("grad_x", grad_x, (2, 3))
    _require_shape("grad_y", grad_y, grad_x.shape, "grad_x.shape")
    _require_shape("x", x, grad_x.shape, "grad_x.shape")
    d = grad_x.shape[-1]
    _require_vector("grad_w", grad_w, d, "D", "grad_x.shape[-1]")
    _require_vector("w", w, d, "D", "grad_x.shape[-1]")
    for name in ("grad_x", "grad_y", "x"):
        _require_last_dim_contiguous(name, specs[name])
    for name in ("grad_x", "grad_w"):
        _require_no_self_overlap(name, specs[name])


def check_layer_norm_backward(grad_input, grad_weight, grad_bias, grad_output, weight,
                              input_standardization, input_std_deviation):
    specs = {
        "grad_input": grad_input, "grad_weight": grad_weight, "grad_bias": grad_bias,
        "grad_output": grad_output, "weight": weight, "input_standardization": input_standardization,
        "input_std_deviation": input_std_deviation,
    }
    _require_present(specs, optional=("grad_bias",))  # a layer without bias: not computed
    _require_one_supported_dtype(specs)
    _require_ndim("grad_input", grad_input, (2, 3))
    _require_shape("grad_output", grad_output, grad_input.shape, "grad_input.shape")
    _require_shape("input_standardization", input_standardization, grad_input.shape, "grad_input.shape")
    length = grad_input.shape[-1]
    for name in ("grad_weight", "grad_bias", "weight"):
        if specs[name] is not None:
            _require_vector(name, specs[name], length, "L", "grad_input.shape[-1]")
    _require_shape("input_std_deviation", input_std_deviation, tuple(grad_input.shape)[:-1],
                   "grad_input.shape[:-1]")
    for name in ("grad_input", "grad_output", "input_standardization"):
        _require_last_dim_contiguous(name, specs[name])
    for name in ("grad_input", "grad_weight", "grad_bias"):
        if specs[name] is not None:
            _require_no_self_overlap(name, specs[name])


def check_batch_norm_backward(grad_input, grad_weight, grad_bias, input, grad_output, weight,
                              running_mean, running_var):
    specs = {
        "grad_input": grad_input, "grad_weight": grad_weight, "grad_bias": grad_bias, "input": input,
        "grad_output": grad_output, "weight": weight, "running_mean": running_mean,
        "running_var": running_var,
    }
    _require_present(specs, optional=("grad_bias",))  # a layer without bias: not computed
    _require_one_supported_dtype(specs)
    _require_ndim("grad_input", grad_input, (3,))
    _require_shape("input", input, grad_input.shape, "grad_input.shape")
    _require_shape("grad_output", grad_output, grad_input.shape, "grad_input.shape")
    channels = grad_input.shape[1]
    for name in ("grad_weight", "grad_bias", "weight", "running_mean", "running_var"):
        if specs[name] is not None:
            _require_vector(name, specs[name], channels, "C", "grad_input.shape[1]")
    for name in ("grad_input", "grad_output", "input"):
        _require_fully_contiguous(name, specs[name])
    for name in ("grad_input", "grad_weight", "grad_bias"):
        if specs[name] is not None:
            _require_no_self_overlap(name, specs[name])


# ---------------------------------------------------------------- the ...Ex rules (common/layout.h, info.h createEx)

def _require_ex_dtypes(activations, parameters, statistics):
    """checkNormDtypesEx: absent (None) tensors are skipped."""
    first_name, first = next(iter(activations.items()))
    if first.dtype not in dtypes.EX_SUPPORTED:
        raise BadTensorDtypeError(f"{first_name}: dtype {dtypes.name(first.dtype)} must be one of F16, BF16, F32, F64")
    for name, spec in activations.items():
        if spec is not None and spec.dtype != first.dtype:
            raise BadTensorDtypeError(f"{name}: dtype {dtypes.name(spec.dtype)} must equal {first_name}'s dtype "
                                      f"{dtypes.name(first.dtype)}")
    present = [(name, spec) for name, spec in parameters.items() if spec is not None]
    if present:
        parameter_name, parameter = present[0]
        allowed = (first.dtype, dtypes.F32) if first.dtype in (dtypes.F16, dtypes.BF16) else (first.dtype,)
        if parameter.dtype not in allowed:
            raise BadTensorDtypeError(
                f"{parameter_name}: dtype {dtypes.name(parameter.dtype)} must be "
                f"{' or '.join(dtypes.name(code) for code in allowed)} for {dtypes.name(first.dtype)} data")
        for name, spec in present:
            if spec.dtype != parameter.dtype:
                raise BadTensorDtypeError(f"{name}: dtype {dtypes.name(spec.dtype)} must equal {parameter_name}'s "
                                          f"dtype {dtypes.name(parameter.dtype)} (parameters share one dtype)")
    statistic_dtype = dtypes.F64 if first.dtype == dtypes.F64 else dtypes.F32
    for name, spec in statistics.items():
        if spec is not None and spec.dtype != statistic_dtype:
            raise BadTensorDtypeError(f"{name}: dtype {dtypes.name(spec.dtype)} must be "
                                      f"{dtypes.name(statistic_dtype)} for {dtypes.name(first.dtype)} data")


def _c_float(value):
    """``value`` as a C float parameter receives it: rounded to nearest, infinite beyond float's range (1e39), zero
    (of its sign) below its least subnormal (-1e-50 is -0.0, which ``>= 0`` accepts). The seed creates take their
    scalars as float; the Ex creates take double, as Python's float is."""
    return ctypes.c_float(value).value


def _require_epsilon(epsilon, name="epsilon"):
    if not (math.isfinite(epsilon) and epsilon >= 0.0):
        raise BadParamError(f"{name}: {epsilon!r} must be finite and >= 0")


def _require_trailing_packed(name, spec, count):
    """The last ``count`` dims row-major packed with unit innermost stride (dims of size <= 1 ignored)."""
    shape, strides = tuple(spec.shape), strides_of(spec)
    if 0 in shape:
        return
    expected = 1
    for extent, stride in zip(reversed(shape[len(shape) - count:]), reversed(strides[len(shape) - count:])):
        if extent > 1 and stride != expected:
            raise BadTensorStridesError(
                f"{name}: strides {strides} must keep the last {count} (normalized) dims packed, "
                f"stride 1 innermost"
            )
        expected *= extent


def _require_collapses_to_vector(name, spec):
    """Elements on one arithmetic progression in index order (a packed or uniformly strided vector)."""
    shape, strides = tuple(spec.shape), strides_of(spec)
    expected = None
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent <= 1:
            continue
        if expected is not None and stride != expected:
            raise BadTensorStridesError(f"{name}: strides {strides} with shape {shape} must step through memory "
                                        f"as one vector")
        expected = stride * extent


def _require_normalized_ranks(name, spec, normalized, what):
    ndim = len(spec.shape)
    if not 1 <= ndim <= 8 or not 1 <= normalized <= ndim:
        raise BadTensorShapeError(f"{name}: rank {ndim} with {normalized} normalized dims ({what}); the rank must "
                                  f"be 1..8 and the normalized dims 1..rank")


def _check_rms_norm_rows(rows, w, grad_w=None, rstd=None, rstd_written=False):
    """The shape and stride rules both RMSNorm Ex forms share (ops/rms_norm_layout.h). ``rows``: {name: spec} of
    the row tensors, the first one written; w's rank names the normalized dims; ``grad_w``: None or written;
    ``rstd``: None, or one per row, written where ``rstd_written``."""
    first_name, first = next(iter(rows.items()))
    normalized = len(w.shape)
    _require_normalized_ranks(first_name, first, normalized, "w's rank")
    leading = len(first.shape) - normalized
    for name, spec in list(rows.items())[1:]:
        _require_shape(name, spec, first.shape, f"{first_name}.shape")
    _require_shape("w", w, tuple(first.shape)[leading:], f"{first_name}.shape[{leading}:]")
    if grad_w is not None:
        _require_shape("grad_w", grad_w, w.shape, "w.shape")
    if rstd is not None:
        _require_shape("rstd", rstd, tuple(first.shape)[:leading], f"{first_name}.shape[:{leading}]")
    for name, spec in rows.items():
        _require_trailing_packed(name, spec, normalized)
    _require_no_self_overlap(first_name, first)
    _require_collapses_to_vector("w", w)
    if grad_w is not None:
        _require_no_self_overlap("grad_w", grad_w)
        _require_collapses_to_vector("grad_w", grad_w)
    if rstd is not None and rstd_written:
        _require_no_self_overlap("rstd", rstd)


def check_rms_norm_backward_ex(grad_x, grad_w, grad_y, x, w, rstd=None, epsilon=0.0):
    _require_present({"grad_x": grad_x, "grad_y": grad_y, "x": x, "w": w})
    _require_epsilon(epsilon)
    _require_ex_dtypes({"grad_x": grad_x, "grad_y": grad_y, "x": x}, {"w": w, "grad_w": grad_w}, {"rstd": rstd})
    _check_rms_norm_rows({"grad_x": grad_x, "grad_y": grad_y, "x": x}, w, grad_w, rstd)


def check_rms_norm(y, x, w, epsilon=0.0):
    """infiniopCreateRMSNormDescriptor (rms_norm/info.h create): upstream's ranks, then the Ex rules."""
    _require_present({"y": y, "x": x, "w": w})
    _require_ex_dtypes({"y": y, "x": x}, {"w": w}, {})
    _require_ndim("y", y, (2, 3))
    _require_ndim("w", w, (1,))
    check_rms_norm_ex(y, None, x, w, _c_float(epsilon))


def check_rms_norm_ex(y, rstd, x, w, epsilon=0.0):
    _require_present({"y": y, "x": x, "w": w})
    _require_epsilon(epsilon)
    _require_ex_dtypes({"y": y, "x": x}, {"w": w}, {"rstd": rstd})
    _check_rms_norm_rows({"y": y, "x": x}, w, rstd=rstd, rstd_written=True)


def check_layer_norm_backward_ex(grad_input, grad_weight, grad_bias, grad_output, weight, input_standardization,
                                 input_std_deviation):
    _require_present({"grad_input": grad_input, "grad_output": grad_output,
                      "input_standardization": input_standardization, "input_std_deviation": input_std_deviation})
    _require_ex_dtypes({"grad_input": grad_input, "grad_output": grad_output,
                        "input_standardization": input_standardization},
                       {"weight": weight, "grad_weight": grad_weight, "grad_bias": grad_bias,
                        "input_std_deviation": input_std_deviation}, {})
    _check_layer_norm_rows(grad_input, grad_weight, grad_bias, grad_output, weight,
                           {"input_standardization": input_standardization},
                           {"input_std_deviation": input_std_deviation})


def check_layer_norm_backward_from_input_ex(grad_input, grad_weight, grad_bias, grad_output, weight, input, mean,
                                            rstd):
    _require_present({"grad_input": grad_input, "grad_output": grad_output, "input": input, "mean": mean,
                      "rstd": rstd})
    _require_ex_dtypes({"grad_input": grad_input, "grad_output": grad_output, "input": input},
                       {"weight": weight, "grad_weight": grad_weight, "grad_bias": grad_bias},
                       {"mean": mean, "rstd": rstd})
    _check_layer_norm_rows(grad_input, grad_weight, grad_bias, grad_output, weight, {"input": input},
                           {"mean": mean, "rstd": rstd})


def _check_layer_norm_rows(grad_input, grad_weight, grad_bias, grad_output, weight, row_input, per_row):
    """The shape and stride rules both LayerNorm backward Ex forms share (info.h createRows). ``row_input``: {name:
    spec} of xhat or the input; ``per_row``: {name: spec} of the one-per-row tensors, the first of which names the
    leading dims by its rank."""
    first_per_row = next(iter(per_row))
    leading = len(per_row[first_per_row].shape)
    _check_layer_norm_layout(leading, f"grad_input's rank minus {first_per_row}'s",
                             {"grad_input": (grad_input, True), "grad_output": (grad_output, False),
                              **{name: (spec, False) for name, spec in row_input.items()}},
                             {"weight": (weight, False), "grad_weight": (grad_weight, True),
                              "grad_bias": (grad_bias, True)},
                             {name: (spec, False) for name, spec in per_row.items()})


def _check_layer_norm_layout(leading, leading_source, rows, vectors, per_row):
    """The shape and stride rules LayerNorm's forward and backward creates share (ops/layer_norm_layout.h). Each
    group: {name: (spec or None, written)}; the first row tensor is present and gives the shape; the dims after
    the first ``leading`` are normalized (``leading_source`` says what named them)."""
    first_name, (first, _) = next(iter(rows.items()))
    _require_normalized_ranks(first_name, first, len(first.shape) - leading, leading_source)
    for name, (spec, _) in list(rows.items())[1:]:
        if spec is not None:
            _require_shape(name, spec, first.shape, f"{first_name}.shape")
    for name, (spec, _) in vectors.items():
        if spec is not None:
            _require_shape(name, spec, tuple(first.shape)[leading:], f"{first_name}.shape[{leading}:]")
    for name, (spec, _) in per_row.items():
        if spec is not None:
            _require_shape(name, spec, tuple(first.shape)[:leading], f"{first_name}.shape[:{leading}]")
    normalized = len(first.shape) - leading
    for name, (spec, written) in rows.items():
        if spec is not None:
            _require_trailing_packed(name, spec, normalized)
            if written:
                _require_no_self_overlap(name, spec)
    for name, (spec, written) in vectors.items():
        if spec is not None:
            if written:
                _require_no_self_overlap(name, spec)
            _require_collapses_to_vector(name, spec)
    for name, (spec, written) in per_row.items():
        if spec is not None and written:
            _require_no_self_overlap(name, spec)


def _check_layer_norm_forward(y_name, y, xhat, x_name, x, w_name, w, b_name, b, statistics, epsilon):
    """The rules both LayerNorm forward creates share (layer_norm/info.h createForm), after their NULL and dtype
    checks. ``xhat``: None or the seed's input_standardization spec; ``statistics``: {name: spec or None} of the
    per-row outputs."""
    _require_epsilon(epsilon, "eps")
    ndim = len(y.shape)
    parameter_name, parameter = (w_name, w) if w is not None else (b_name, b)
    present_statistics = [(name, spec) for name, spec in statistics.items() if spec is not None]
    if parameter is not None:
        if not 1 <= len(parameter.shape) <= ndim:
            raise BadTensorShapeError(f"{parameter_name}: rank {len(parameter.shape)} must be 1..{ndim} "
                                      f"({y_name}'s rank): it names the normalized trailing dims")
        leading, source = ndim - len(parameter.shape), f"{parameter_name}'s rank"
    elif present_statistics:
        leading, source = len(present_statistics[0][1].shape), f"{y_name}'s rank minus {present_statistics[0][0]}'s"
    else:
        leading, source = ndim - 1, "the last dim alone, with no parameter or statistic to name them"
    _check_layer_norm_layout(leading, source,
                             {y_name: (y, True), "input_standardization": (xhat, True), x_name: (x, False)},
                             {w_name: (w, False), b_name: (b, False)},
                             {name: (spec, True) for name, spec in statistics.items()})


def check_layer_norm(output, input_standardization, input_std_deviation, input, weight, bias, eps=0.0):
    """infiniopCreateLayerNormDescriptor (layer_norm/info.h create): upstream's ranks, then the shared rules."""
    _require_present({"output": output, "input": input, "weight": weight})
    _require_ex_dtypes({"output": output, "input_standardization": input_standardization, "input": input},
                       {"weight": weight, "bias": bias, "input_std_deviation": input_std_deviation}, {})
    _require_ndim("output", output, (2, 3))
    _require_ndim("weight", weight, (1,))
    _check_layer_norm_forward("output", output, input_standardization, "input", input, "weight", weight, "bias",
                              bias, {"input_std_deviation": input_std_deviation}, _c_float(eps))


def check_layer_norm_ex(y, mean, rstd, x, w, b, eps=0.0):
    _require_present({"y": y, "x": x})
    _require_ex_dtypes({"y": y, "x": x}, {"w": w, "b": b}, {"mean": mean, "rstd": rstd})
    _check_layer_norm_forward("y", y, None, "x", x, "w", w, "b", b, {"mean": mean, "rstd": rstd}, eps)


def _packed_in_order(spec, innermost_first):
    """Packed with the dims visited innermost first (dims of size <= 1 never step; an empty tensor passes)."""
    shape, strides = tuple(spec.shape), strides_of(spec)
    if 0 in shape:
        return True
    expected = 1
    for dim in innermost_first:
        if shape[dim] > 1 and strides[dim] != expected:
            return False
        expected *= shape[dim]
    return True


def packed(shape, strides):
    """Whether element ``strides`` lay ``shape`` out packed in some order of its dims (C order, channels-last, ...):
    each dim, innermost first, stepping over exactly the elements of the dims inside it."""
    innermost_first = sorted(range(len(shape)), key=lambda dim: strides[dim])
    return _packed_in_order(TensorSpec(tuple(shape), 0, tuple(strides)), innermost_first)


def batch_norm_layout(specs):
    """'channels_first' or 'channels_last': the packed layout every (N, C, *spatial) spec of ``specs`` has
    (channels-first where both fit), or None."""
    ndim = len(next(iter(specs)).shape)
    first = tuple(range(ndim - 1, -1, -1))
    last = (1,) + tuple(range(ndim - 1, 1, -1)) + (0,)
    for name, order in (("channels_first", first), ("channels_last", last)):
        if all(_packed_in_order(spec, order) for spec in specs):
            return name
    return None


def check_batch_norm_backward_ex(grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean,
                                 running_var, save_mean=None, save_invstd=None, epsilon=0.0, training=1):
    _require_present({"grad_input": grad_input, "input": input, "grad_output": grad_output})
    _require_epsilon(epsilon)
    if (save_mean is None) != (save_invstd is None):
        raise BadParamError("save_mean, save_invstd: give both or neither")
    if not training and save_mean is not None:
        raise BadParamError("save_mean, save_invstd: eval mode (training=False) uses the running statistics; "
                            "pass None")
    if (not training or save_mean is None) and (running_mean is None or running_var is None):
        raise NullPointerError("running_mean, running_var: needed in eval mode and in training without "
                               "save_mean/save_invstd")
    _require_ex_dtypes({"grad_input": grad_input, "input": input, "grad_output": grad_output},
                       {"weight": weight, "grad_weight": grad_weight, "grad_bias": grad_bias,
                        "running_mean": running_mean, "running_var": running_var},
                       {"save_mean": save_mean, "save_invstd": save_invstd})
    _require_ndim("grad_input", grad_input, (2, 3, 4, 5))
    _require_shape("input", input, grad_input.shape, "grad_input.shape")
    _require_shape("grad_output", grad_output, grad_input.shape, "grad_input.shape")
    channels = grad_input.shape[1]
    for name, spec in (("grad_weight", grad_weight), ("grad_bias", grad_bias), ("weight", weight),
                       ("running_mean", running_mean), ("running_var", running_var), ("save_mean", save_mean),
                       ("save_invstd", save_invstd)):
        if spec is not None:
            _require_vector(name, spec, channels, "C", "grad_input.shape[1]")
    if batch_norm_layout((grad_input, input, grad_output)) is None:
        raise BadTensorStridesError(
            f"grad_input, input, grad_output: strides {strides_of(grad_input)}, {strides_of(input)}, "
            f"{strides_of(grad_output)} must all be channels-first packed (row-major) or all channels-last packed "
            f"(C innermost, then the spatial dims, then N)")
    for name, spec in (("grad_weight", grad_weight), ("grad_bias", grad_bias)):
        if spec is not None:
            _require_no_self_overlap(name, spec)


def check_batch_norm(y, running_mean, running_var, x, weight, bias, momentum=0.1, epsilon=1e-5):
    """infiniopCreateBatchNormDescriptor (batch_norm/info.h create): the documentation's rules, then the Ex ones."""
    specs = {"y": y, "running_mean": running_mean, "running_var": running_var, "x": x, "weight": weight,
             "bias": bias}
    _require_present(specs)
    _require_one_supported_dtype(specs)
    _require_ndim("y", y, (3,))
    check_batch_norm_ex(y, None, None, running_mean, running_var, x, weight, bias, 1, _c_float(momentum),
                        _c_float(epsilon))
    for name in ("y", "x"):
        _require_fully_contiguous(name, specs[name])


def check_batch_norm_ex(y, save_mean, save_invstd, running_mean, running_var, x, weight, bias, training=1,
                        momentum=0.1, epsilon=1e-5):
    _require_present({"y": y, "x": x})
    _require_epsilon(epsilon)
    if not math.isfinite(momentum):
        raise BadParamError(f"momentum: {momentum!r} must be finite")
    if (running_mean is None) != (running_var is None):
        raise NullPointerError("running_mean, running_var: give both or neither")
    if not training and running_mean is None:
        raise NullPointerError("running_mean, running_var: eval mode (training=False) normalizes with them")
    if not training and (save_mean is not None or save_invstd is not None):
        raise BadParamError("save_mean, save_invstd: eval mode (training=False) has no batch statistics; pass None")
    _require_ex_dtypes({"y": y, "x": x},
                       {"weight": weight, "bias": bias, "running_mean": running_mean, "running_var": running_var},
                       {"save_mean": save_mean, "save_invstd": save_invstd})
    _require_ndim("y", y, (2, 3, 4, 5))
    _require_shape("x", x, y.shape, "y.shape")
    channels = y.shape[1]
    vectors = {"save_mean": save_mean, "save_invstd": save_invstd, "running_mean": running_mean,
               "running_var": running_var, "weight": weight, "bias": bias}
    for name, spec in vectors.items():
        if spec is not None:
            _require_vector(name, spec, channels, "C", "y.shape[1]")
    if training and running_mean is not None and math.prod(y.shape[:1] + y.shape[2:]) == 1:
        raise BadTensorShapeError(f"x: shape {x.shape} has one value per channel; training with running statistics "
                                  f"needs more (their unbiased variance divides by N * L - 1)")
    if batch_norm_layout((y, x)) is None:
        raise BadTensorStridesError(
            f"y, x: strides {strides_of(y)}, {strides_of(x)} must both be channels-first packed (row-major) or both "
            f"channels-last packed (C innermost, then the spatial dims, then N)")
    written = ("save_mean", "save_invstd") + (("running_mean", "running_var") if training else ())
    for name in written:
        if vectors[name] is not None:
            _require_no_self_overlap(name, vectors[name])


def status_of(check, **specs):
    """The status C would return for these specs: 0, or the status of the error ``check`` raises."""
    try:
        check(**specs)
    except (NullPointerError, BadParamError, BadTensorDtypeError, BadTensorShapeError,
            BadTensorStridesError) as error:
        return error.status
    return 0


def significant_strides(shape, strides):
    """Strides with those of dims of size <= 1 set to 0: such a dim is never stepped."""
    return tuple(stride if extent > 1 else 0 for extent, stride in zip(shape, strides))
