"""The ...Ex entry points of RMSNorm and LayerNorm backward (issue 6): epsilon, saved rstd, optional outputs,
LayerNorm without affine, F32 parameters with F16/BF16 data, F64, and normalized shapes of several trailing
dims, against float64 references (and torch where it has the same operation), on every device (_devices.DEVICES);
plus their statuses."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import infiniop_py
from infiniop_py import _layout, _operator, errors
from _devices import DEVICES, DeviceData, call_on
from _helpers import (BAD_PARAM, BAD_TENSOR_DTYPE, BAD_TENSOR_SHAPE, BAD_TENSOR_STRIDES, BF16, F16, F32,
                      NULL_POINTER, SUCCESS, TOLERANCE, CTensorDescriptors, assert_close, assert_close_on_scale, f64,
                      layer_norm_reference, native, rms_reference, rounded)

F64 = np.dtype(np.float64)
EX_TOLERANCE = {**TOLERANCE, F64: 1e-12}
HALVES = (F16, BF16)


def assert_close_ex(actual, reference, dtype, what):
    if np.dtype(dtype) == F64:
        scale = float(np.max(np.abs(reference))) if reference.size else 0.0
        err = float(np.max(np.abs(f64(actual) - reference))) if reference.size else 0.0
        assert err <= EX_TOLERANCE[F64] * max(scale, 1.0), f"{what} (float64): max|err| = {err:.3g}"
    else:
        assert_close(actual, reference, dtype, what)


def assert_sum_close(actual, reference, terms, dtype, what):
    """A vector gradient, the sum over rows of ``terms`` (float64, (rows, vector size)), within the dtype's bound of
    its reference on the larger of max|ref| and the terms' root-sum-square, as _helpers.assert_matches_reference
    judges such sums: where terms of random signs cancel, max|ref| shrinks below what any order of summation rounds
    to (RMSNorm over 46875 rows of one element summed to 0.95 from terms near 1: F32 blocks erred by 1.2e-4 of that,
    6e-7 of the terms' root-sum-square, and failed a bound on max|ref|)."""
    reference = np.asarray(reference, np.float64)
    rss = float(np.max(np.sqrt(np.sum(terms * terms, axis=0)), initial=0.0))
    scale = max(float(np.max(np.abs(reference), initial=0.0)), rss)
    if np.dtype(dtype) == F64:
        scale = max(scale, 1.0)  # as assert_close_ex
    err = float(np.max(np.abs(f64(actual) - reference), initial=0.0))
    bound = EX_TOLERANCE[np.dtype(dtype)]
    assert err <= bound * scale, f"{what} ({np.dtype(dtype).name}): max|err| = {err:.3g} > {bound:g} * {scale:.3g}"


def rms_inputs(rng, shape, k, dtype, weight_dtype=None):
    weight_dtype = weight_dtype or dtype
    return (rounded(rng.standard_normal(shape), dtype), rounded(rng.standard_normal(shape), dtype),
            rounded(rng.normal(1.0, 0.5, shape[len(shape) - k:]), weight_dtype))


def layer_norm_inputs(rng, shape, k, dtype, parameter_dtype=None):
    """(grad_output, weight, xhat, std) from a random x normalized over its last k dims with eps 1e-5."""
    parameter_dtype = parameter_dtype or dtype
    axes = tuple(range(len(shape) - k, len(shape)))
    x = rng.standard_normal(shape) * 2 + 0.5
    mean = x.mean(axes, keepdims=True)
    std = np.sqrt(x.var(axes, keepdims=True) + 1e-5)
    xhat = (x - mean) / std
    return (rounded(rng.standard_normal(shape), dtype), rounded(rng.normal(1.0, 0.5, shape[len(shape) - k:]),
            parameter_dtype), rounded(xhat, dtype), rounded(std.reshape(shape[:len(shape) - k]), parameter_dtype))


# ---------------------------------------------------------------- RMSNorm

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", (F32, F16, BF16, F64), ids=str)
@pytest.mark.parametrize("eps", (1e-6, 0.5))
def test_rms_epsilon(device, dtype, eps):
    grad_y, x, w = rms_inputs(np.random.default_rng(1), (6, 40), 1, dtype)
    x[0] = 0  # a zero row: finite only through eps
    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w, eps=eps)
    expected_x, expected_w, _ = rms_reference(grad_y, x, w, eps)
    assert np.isfinite(f64(grad_x)).all()
    assert_close_ex(grad_x, expected_x, dtype, "grad_x")
    assert_close_ex(grad_w, expected_w, dtype, "grad_w")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", (F32, F64), ids=str)
def test_rms_epsilon_matches_torch_autograd(device, dtype):
    grad_y, x, w = rms_inputs(np.random.default_rng(2), (5, 33), 1, dtype)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    torch.nn.functional.rms_norm(xt, (33,), wt, eps=0.25).backward(torch.tensor(grad_y))
    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w, eps=0.25)
    assert_close_ex(grad_x, xt.grad.double().numpy(), dtype, "grad_x")
    assert_close_ex(grad_w, wt.grad.double().numpy(), dtype, "grad_w")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", (F32, BF16, F64), ids=str)
def test_rms_saved_rstd_is_used_as_r(device, dtype):
    grad_y, x, w = rms_inputs(np.random.default_rng(3), (2, 3, 24), 1, dtype)
    stat = F64 if dtype == F64 else F32
    # Not the rstd of x: proves the saved value is the one used.
    rstd = rounded(np.random.default_rng(4).uniform(0.5, 2.0, (2, 3)), stat)
    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w, rstd=rstd, eps=123.0)
    expected_x, expected_w, _ = rms_reference(grad_y, x, w, rstd=rstd)
    assert_close_ex(grad_x, expected_x, dtype, "grad_x")
    assert_close_ex(grad_w, expected_w, dtype, "grad_w")


@pytest.mark.parametrize("device", DEVICES)
def test_rms_without_grad_w_leaves_it_alone_and_returns_none(device, device_handle):
    grad_y, x, w = rms_inputs(np.random.default_rng(5), (64, 48), 1, F32)
    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w, need_grad_weight=False)
    assert grad_w is None
    assert_close(grad_x, rms_reference(grad_y, x, w)[0], F32, "grad_x")
    out = np.empty_like(grad_x)
    data = DeviceData(device)
    on_device = [data.put(array) for array in (grad_x, w, grad_y, x)]
    device_grad_x, device_w, device_grad_y, device_x = on_device
    with infiniop_py.RMSNormBackward(device_handle, device_grad_x, device_w, device_grad_y, device_x,
                                     device_w) as with_grad_w, \
            infiniop_py.RMSNormBackward(device_handle, device_grad_x, None, device_grad_y, device_x,
                                        device_w) as without:
        assert without.workspace_size < with_grad_w.workspace_size  # no per-block partials
        without(data.put(out, output=True), None, device_grad_y, device_x, device_w)
        data.write_back()
        assert np.array_equal(out, grad_x)
        with pytest.raises(ValueError, match="grad_w"):
            without(data.put(out, output=True), data.put(np.empty_like(w)), device_grad_y, device_x, device_w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_rms_f32_weights_with_half_data(device, dtype):
    grad_y, x, w = rms_inputs(np.random.default_rng(6), (33, 70), 1, dtype, F32)
    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w)
    assert grad_x.dtype == dtype and grad_w.dtype == F32
    expected_x, expected_w, _ = rms_reference(grad_y, x, w)
    assert_close(grad_x, expected_x, dtype, "grad_x")
    # grad_w is stored in F32: held to the F32 bound on the F32 rounding of a sum over F16/BF16 terms.
    assert_close(grad_w, expected_w, F32, "grad_w")


@pytest.mark.parametrize("device", DEVICES)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=8).map(tuple), data=st.data(),
       dtype=st.sampled_from((F32, F64)))
def test_rms_any_rank_and_normalized_dims(device, shape, data, dtype):
    check_rms_any_rank(device, shape, data.draw(st.integers(1, len(shape))), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_many_rows_of_one_element(device):
    """Hypothesis' thorough profile found it: grad_w's terms cancel to 0.95 over 46875 rows."""
    check_rms_any_rank(device, (3, 5, 5, 5, 5, 5, 5, 1), 1, F32)


def check_rms_any_rank(device, shape, k, dtype):
    grad_y, x, w = rms_inputs(np.random.default_rng(len(shape) * 10 + k), shape, k, dtype)
    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w, eps=1e-3)
    expected_x, expected_w, r = rms_reference(grad_y, x, w, 1e-3)
    assert grad_w.shape == w.shape
    # With few normalized elements grad_x's two terms cancel: judge it on the size of the first.
    scale = max(float(np.max(np.abs(expected_x))), float(np.max(np.abs(r * f64(grad_y) * f64(w)))))
    if dtype == F64:
        assert_close_ex(grad_x, expected_x, dtype, "grad_x")
    else:
        assert_close_on_scale(grad_x, expected_x, dtype, scale, "grad_x")
    assert_sum_close(grad_w, expected_w, (f64(grad_y) * f64(x) * r).reshape(-1, w.size), dtype, "grad_w")


@pytest.mark.parametrize("device", DEVICES)
def test_rms_strided_leading_dims_of_rank_5(device):
    """Five leading dims that do not merge: the row offsets walk every one."""
    grad_y, x, w = rms_inputs(np.random.default_rng(7), (2, 3, 2, 2, 3, 16), 1, F32)
    big = np.zeros((4, 3, 4, 2, 6, 16), F32)
    view = big[::2, :, ::2, :, ::2]
    view[...] = x
    out = call_on(device, infiniop_py.rms_norm_backward, grad_y, view, w)
    expected_x, expected_w, _ = rms_reference(grad_y, x, w)
    assert_close(out[0], expected_x, F32, "grad_x")
    assert_close(out[1], expected_w, F32, "grad_w")


# ---------------------------------------------------------------- LayerNorm

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", (F32, BF16, F64), ids=str)
@pytest.mark.parametrize("with_weight", (True, False))
@pytest.mark.parametrize("wanted", ((True, True), (True, False), (False, True), (False, False)))
def test_layer_norm_optional_weight_and_outputs(device, dtype, with_weight, wanted):
    grad_output, weight, xhat, std = layer_norm_inputs(np.random.default_rng(8), (5, 7, 40), 1, dtype)
    weight = weight if with_weight else None
    outputs = call_on(device, infiniop_py.layer_norm_backward, grad_output, weight, xhat, std,
                      need_grad_weight=wanted[0], need_grad_bias=wanted[1])
    expected = layer_norm_reference(grad_output, weight, xhat, std)
    assert_close_ex(outputs[0], expected[0], dtype, "grad_input")
    for name, want, actual, reference in zip(("grad_weight", "grad_bias"), wanted, outputs[1:], expected[1:]):
        if want:
            assert_close_ex(actual, reference, dtype, name)
        else:
            assert actual is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_layer_norm_f32_parameters_with_half_data(device, dtype):
    grad_output, weight, xhat, std = layer_norm_inputs(np.random.default_rng(9), (16, 96), 1, dtype, F32)
    grad_input, grad_weight, grad_bias = call_on(device, infiniop_py.layer_norm_backward, grad_output, weight, xhat,
                                                 std)
    assert grad_input.dtype == dtype and grad_weight.dtype == F32 and grad_bias.dtype == F32
    expected = layer_norm_reference(grad_output, weight, xhat, std)
    assert_close(grad_input, expected[0], dtype, "grad_input")
    assert_close(grad_weight, expected[1], F32, "grad_weight")
    assert_close(grad_bias, expected[2], F32, "grad_bias")


@pytest.mark.parametrize("device", DEVICES)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=8).map(tuple), data=st.data())
def test_layer_norm_any_rank_and_normalized_dims(device, shape, data):
    k = data.draw(st.integers(1, len(shape)))
    grad_output, weight, xhat, std = layer_norm_inputs(np.random.default_rng(k), shape, k, F64)
    outputs = call_on(device, infiniop_py.layer_norm_backward, grad_output, weight, xhat, std)
    expected = layer_norm_reference(grad_output, weight, xhat, std)
    for actual, reference in zip(outputs, expected):
        assert actual.shape == reference.shape
    assert_close_ex(outputs[0], expected[0], F64, "grad_input")
    for name, actual, reference, terms in (("grad_weight", outputs[1], expected[1], grad_output * xhat),
                                           ("grad_bias", outputs[2], expected[2], grad_output)):
        assert_sum_close(actual, reference, terms.reshape(-1, weight.size), F64, name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_weight", (True, False))
def test_layer_norm_matches_torch_native_layer_norm_backward(device, with_weight):
    """torch takes (input, mean, rstd); ours takes xhat = (input - mean) * rstd and std = 1 / rstd."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((4, 3, 5, 6)) * 3
    mean = x.mean((2, 3), keepdims=True)
    rstd = 1.0 / np.sqrt(x.var((2, 3), keepdims=True) + 1e-5)
    grad_output, weight = rng.standard_normal(x.shape), rng.normal(1.0, 0.5, (5, 6))
    torch_weight = torch.tensor(weight) if with_weight else None
    expected = torch.ops.aten.native_layer_norm_backward(
        torch.tensor(grad_output), torch.tensor(x), [5, 6], torch.tensor(mean), torch.tensor(rstd), torch_weight,
        torch.zeros(5, 6, dtype=torch.float64) if with_weight else None, [True, with_weight, with_weight])
    ours = call_on(device, infiniop_py.layer_norm_backward, grad_output, weight if with_weight else None,
                   (x - mean) * rstd, (1.0 / rstd)[..., 0, 0], need_grad_weight=with_weight,
                   need_grad_bias=with_weight)
    assert_close_ex(ours[0], expected[0].numpy(), F64, "grad_input")
    if with_weight:
        assert_close_ex(ours[1], expected[1].numpy(), F64, "grad_weight")
        assert_close_ex(ours[2], expected[2].numpy(), F64, "grad_bias")


# ---------------------------------------------------------------- statuses through C, and the Python mirror

def _ex_create_status(c_handle, name, specs, *scalars):
    ffi, op, _ = native()
    with CTensorDescriptors(specs) as descriptors:
        desc_ptr = ffi.new("infiniopDescriptor_t *")
        status = getattr(op, f"infiniopCreate{name}DescriptorEx")(c_handle, desc_ptr, *descriptors, *scalars)
        if status == SUCCESS:
            assert getattr(op, f"infiniopDestroy{name}Descriptor")(desc_ptr[0]) == SUCCESS
    return status


def _rms_specs(shape=(4, 8), k=1, dtype=F32, weight_dtype=None, rstd="absent", grad_w=True):
    weight_dtype = weight_dtype or dtype
    normalized = shape[len(shape) - k:]
    stat = F64 if dtype == F64 else F32
    return [(shape, dtype, None), (normalized, weight_dtype, None) if grad_w else None, (shape, dtype, None),
            (shape, dtype, None), (normalized, weight_dtype, None),
            None if rstd == "absent" else (shape[:len(shape) - k], rstd or stat, None)]


RMS_STATUS_CASES = [
    ("seed layout", _rms_specs(), 0.0, SUCCESS),
    ("rank 1", _rms_specs((8,)), 0.0, SUCCESS),
    ("rank 8, 3 normalized", _rms_specs((1, 2, 1, 2, 1, 2, 3, 4), 3), 0.0, SUCCESS),
    ("no grad_w, rstd", _rms_specs(rstd=None, grad_w=False), 1e-5, SUCCESS),
    ("F16 data, F32 weights", _rms_specs(dtype=F16, weight_dtype=F32), 0.0, SUCCESS),
    ("F64", _rms_specs(dtype=F64, rstd=None), 0.0, SUCCESS),
    ("negative eps", _rms_specs(), -1e-6, BAD_PARAM),
    ("NaN eps", _rms_specs(), float("nan"), BAD_PARAM),
    ("infinite eps", _rms_specs(), float("inf"), BAD_PARAM),
    ("F32 data, F16 weights", _rms_specs(weight_dtype=F16), 0.0, BAD_TENSOR_DTYPE),
    ("BF16 data, F16 weights", _rms_specs(dtype=BF16, weight_dtype=F16), 0.0, BAD_TENSOR_DTYPE),
    ("F16 rstd", _rms_specs(rstd=F16), 0.0, BAD_TENSOR_DTYPE),
    ("F32 rstd for F64 data", _rms_specs(dtype=F64, rstd=F32), 0.0, BAD_TENSOR_DTYPE),
    ("int8 data", _rms_specs(dtype=np.dtype(np.int8)), 0.0, BAD_TENSOR_DTYPE),
    ("rank 9", _rms_specs((1,) * 8 + (4,)), 0.0, BAD_TENSOR_SHAPE),
    ("weights of rank above x's", [(s if i != 4 else ((2, 4, 8), F32, None)) for i, s in enumerate(_rms_specs())],
     0.0, BAD_TENSOR_SHAPE),
    ("rstd of the wrong shape", _rms_specs(rstd=None)[:5] + [((8,), F32, None)], 0.0, BAD_TENSOR_SHAPE),
    ("normalized dims not packed", [((2, 3, 4), F32, (12, 1, 3))] + _rms_specs((2, 3, 4), 2)[1:], 0.0,
     BAD_TENSOR_STRIDES),
    ("weights not one vector", _rms_specs((2, 3, 4), 2)[:4] + [((3, 4), F32, (8, 1))] + [None], 0.0,
     BAD_TENSOR_STRIDES),
]


@pytest.mark.parametrize("description, specs, eps, expected", RMS_STATUS_CASES, ids=[c[0] for c in RMS_STATUS_CASES])
def test_rms_ex_statuses_in_c_and_python(c_handle, description, specs, eps, expected):
    assert _ex_create_status(c_handle, "RMSNormBackward", specs, eps) == expected
    names = ("grad_x", "grad_w", "grad_y", "x", "w", "rstd")
    python_specs = {name: None if s is None else _layout.TensorSpec(s[0], infiniop_py.dtypes.code_of(s[1]), s[2])
                    for name, s in zip(names, specs)}
    assert _layout.status_of(_layout.check_rms_norm_backward_ex, **python_specs, epsilon=eps) == expected


@pytest.mark.parametrize("position", (0, 2, 3, 4))
def test_rms_ex_null_required_descriptor(c_handle, position):
    specs = _rms_specs()
    specs[position] = None
    assert _ex_create_status(c_handle, "RMSNormBackward", specs, 0.0) == NULL_POINTER


def test_layer_norm_ex_statuses(c_handle):
    shape, normalized = (3, 4, 8), (4, 8)

    def specs(**changes):
        base = {"grad_input": (shape, F32, None), "grad_weight": (normalized, F32, None),
                "grad_bias": (normalized, F32, None), "grad_output": (shape, F32, None),
                "weight": (normalized, F32, None), "input_standardization": (shape, F32, None),
                "input_std_deviation": ((3,), F32, None)}
        base.update(changes)
        return list(base.values())

    assert _ex_create_status(c_handle, "LayerNormBackward", specs()) == SUCCESS
    assert _ex_create_status(c_handle, "LayerNormBackward",
                             specs(grad_weight=None, grad_bias=None, weight=None)) == SUCCESS
    assert _ex_create_status(c_handle, "LayerNormBackward", specs(grad_input=None)) == NULL_POINTER
    assert _ex_create_status(c_handle, "LayerNormBackward", specs(input_std_deviation=None)) == NULL_POINTER
    assert _ex_create_status(c_handle, "LayerNormBackward",
                             specs(input_std_deviation=((3,), F16, None))) == BAD_TENSOR_DTYPE
    assert _ex_create_status(c_handle, "LayerNormBackward",
                             specs(input_std_deviation=(shape, F32, None))) == BAD_TENSOR_SHAPE
    assert _ex_create_status(c_handle, "LayerNormBackward", specs(weight=((8,), F32, None))) == BAD_TENSOR_SHAPE
    assert _ex_create_status(c_handle, "LayerNormBackward",
                             specs(grad_bias=(normalized, F32, (0, 1)))) == BAD_TENSOR_STRIDES


# ---------------------------------------------------------------- the Python mirror agrees with C (random layouts)

@st.composite
def rms_layouts(draw):
    shape = tuple(draw(st.lists(st.integers(0, 3), min_size=1, max_size=5)))
    k = draw(st.integers(0, len(shape) + 1))
    dtype = draw(st.sampled_from((F32, F16, BF16, F64, np.dtype(np.int32))))
    weight_dtype = draw(st.sampled_from((dtype, F32, F16)))
    rstd_kind = draw(st.sampled_from(("absent", F32, F64, F16)))
    normalized = shape[len(shape) - k:] if k <= len(shape) else (2,) + shape

    def strides(shape):
        kind = draw(st.sampled_from(("none", "none", "random")))
        if kind == "none" or not shape:
            return None
        return tuple(draw(st.lists(st.integers(-6, 6), min_size=len(shape), max_size=len(shape))))

    specs = [(shape, dtype, strides(shape)), (normalized, weight_dtype, strides(normalized)),
             (shape, dtype, strides(shape)), (shape, dtype, strides(shape)),
             (normalized, weight_dtype, strides(normalized)),
             None if rstd_kind == "absent" else (shape[:max(len(shape) - k, 0)], rstd_kind, None)]
    if draw(st.booleans()):
        specs[1] = None
    eps = draw(st.sampled_from((0.0, 1e-5, -1.0)))
    return specs, eps


@given(layout=rms_layouts())
def test_rms_ex_python_mirror_agrees_with_c(c_handle, layout):
    specs, eps = layout
    names = ("grad_x", "grad_w", "grad_y", "x", "w", "rstd")
    python_specs = {name: None if s is None else _layout.TensorSpec(s[0], infiniop_py.dtypes.code_of(s[1]), s[2])
                    for name, s in zip(names, specs)}
    python_status = _layout.status_of(_layout.check_rms_norm_backward_ex, **python_specs, epsilon=eps)
    assert python_status == _ex_create_status(c_handle, "RMSNormBackward", specs, eps)


# ---------------------------------------------------------------- a library without the Ex entry points

def test_without_ex_entry_points_seed_calls_run_and_ex_calls_name_what_is_missing(monkeypatch):
    real = _operator._native_function
    monkeypatch.setattr(_operator, "_native_function",
                        lambda library, name: None if name.endswith("Ex") else real(library, name))
    grad_y, x, w = rms_inputs(np.random.default_rng(11), (8, 16), 1, F32)
    with infiniop_py.Handle("cpu") as handle:
        grad_x, grad_w = np.empty_like(x), np.empty_like(w)
        with infiniop_py.RMSNormBackward(handle, grad_x, grad_w, grad_y, x, w) as seed_operator:
            seed_operator(grad_x, grad_w, grad_y, x, w)
        expected_x, expected_w, _ = rms_reference(grad_y, x, w)
        assert_close(grad_x, expected_x, F32, "grad_x")
        assert_close(grad_w, expected_w, F32, "grad_w")
        with pytest.raises(errors.NotImplementedStatusError, match="epsilon=1e-05.*DescriptorEx"):
            infiniop_py.RMSNormBackward(handle, grad_x, grad_w, grad_y, x, w, eps=1e-5)
        with pytest.raises(errors.NotImplementedStatusError, match="grad_w=None"):
            infiniop_py.RMSNormBackward(handle, grad_x, None, grad_y, x, w)
        with pytest.raises(errors.BadTensorDtypeError):  # the seed's own rule, mirrored
            infiniop_py.RMSNormBackward(handle, grad_x.astype(F64), grad_w.astype(F64), grad_y.astype(F64),
                                        x.astype(F64), w.astype(F64))


def test_without_ex_entry_points_the_address_typed_run_passes_the_seed_tensors(monkeypatch):
    """The torch fast path's run (_operator.Operator._run_native_by_address: data as integer addresses) takes the
    tensors in the Ex order and passes the seed run its own, as the cdata run does: RMSNorm's seed run takes y, x, w
    where the Ex order is y, rstd, x, w. The same bits."""
    real = _operator._native_function
    monkeypatch.setattr(_operator, "_native_function",
                        lambda library, name: None if name.endswith("Ex") else real(library, name))
    _, x, w = rms_inputs(np.random.default_rng(12), (8, 16), 1, F32)
    with infiniop_py.Handle("cpu") as handle:
        y = np.empty_like(x)
        with infiniop_py.RMSNorm(handle, y, None, x, w, eps=1e-3) as operator:
            assert operator._seed_order == ["y", "rstd", "x", "w"]
            operator(y, None, x, w)
            by_address = np.full_like(x, np.nan)
            arrays = {"y": by_address, "x": x, "w": w}
            addresses = [arrays[name].ctypes.data if name in arrays else 0 for name in operator.layouts]
            workspace = np.empty(operator.workspace_size + 64, np.uint8)
            status = operator._run_native_by_address()(operator._pointer, infiniop_py._ffi.ffi.from_buffer(workspace),
                                                       operator.workspace_size, *addresses, 0)
    assert status == 0
    np.testing.assert_array_equal(by_address, y)


# ---------------------------------------------------------------- determinism of the Ex paths across thread counts

EX_DETERMINISM_SCRIPT = """
import sys
import numpy as np
import infiniop_py

data = np.load(sys.argv[1])
rms = infiniop_py.rms_norm_backward(data["rms_grad_y"], data["rms_x"], data["rms_w"], eps=1e-5)
rms_no_w = infiniop_py.rms_norm_backward(data["rms_grad_y"], data["rms_x"], data["rms_w"], need_grad_weight=False)
ln = infiniop_py.layer_norm_backward(data["ln_grad_output"], None, data["ln_xhat"], data["ln_std"])
mixed = infiniop_py.rms_norm_backward(data["mixed_grad_y"].view(np.float16), data["mixed_x"].view(np.float16),
                                      data["mixed_w"])
outputs = [o for o in (*rms, *rms_no_w, *ln, *mixed) if o is not None]
sys.stdout.buffer.write(b"".join(np.ascontiguousarray(o).tobytes() for o in outputs))
"""


def test_ex_paths_give_identical_bits_with_one_and_two_threads(tmp_path):
    import os
    import subprocess
    import sys

    rng = np.random.default_rng(13)
    rms_grad_y, rms_x, rms_w = rms_inputs(rng, (3, 700, 96), 1, F64)
    ln_grad_output, _, ln_xhat, ln_std = layer_norm_inputs(rng, (2100, 96), 1, F64)
    mixed_grad_y, mixed_x, mixed_w = rms_inputs(rng, (2100, 96), 1, F16, F32)
    path = tmp_path / "inputs.npz"
    np.savez(path, rms_grad_y=rms_grad_y, rms_x=rms_x, rms_w=rms_w, ln_grad_output=ln_grad_output, ln_xhat=ln_xhat,
             ln_std=ln_std, mixed_grad_y=mixed_grad_y.view(np.uint16), mixed_x=mixed_x.view(np.uint16),
             mixed_w=mixed_w)
    results = [subprocess.run([sys.executable, "-c", EX_DETERMINISM_SCRIPT, str(path)], check=True, timeout=300,
                              capture_output=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads))).stdout
               for threads in (1, 2)]
    assert len(results[0]) > 0 and results[0] == results[1]
