"""NaN and Inf propagate as IEEE arithmetic on the seed formulas does: exactly the output elements the float64
reference makes non-finite are non-finite, with the same class (NaN, +Inf, -Inf), and every other element is
right. Divisors of zero (an RMSNorm row of zeros, with no epsilon in the seed; a LayerNorm std or a BatchNorm
variance of 0) give inf/nan the same way, without a crash. See docs/guarantees.md."""

import numpy as np
import pytest

from _helpers import F32, OPS, SUPPORTED_DTYPES, TOLERANCE, f64

SHAPE = (3, 50, 131)  # several row blocks, vector bodies and tails
SPECIALS = {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf}
# BatchNorm computes grad_input as (weight*inv)*go - (a per-channel constant) - (a coefficient)*xhat: the seed
# formula multiplied out. Where weight*inv is infinite (an infinite weight, a zero variance) that meets
# inf - inf (NaN) where the seed's factored form gives +-inf. Exactly the same elements are non-finite.


def classes(array):
    """0 finite, 1 NaN, 2 +Inf, 3 -Inf, per element."""
    values = f64(array)
    result = np.zeros(values.shape, np.int8)
    result[np.isnan(values)] = 1
    result[values == np.inf] = 2
    result[values == -np.inf] = 3
    return result


def reference(case, inputs):
    with np.errstate(all="ignore"):
        return case.reference(*inputs)


def assert_propagates_like_reference(case, outputs, inputs, dtype, same_class=True):
    for name, actual, expected in zip(case.output_names, outputs, reference(case, inputs)):
        got, want = classes(actual), classes(expected)
        assert np.array_equal(got != 0, want != 0), (
            f"{name}: {np.count_nonzero(got)} non-finite elements where the reference has {np.count_nonzero(want)}")
        if same_class:
            assert np.array_equal(got, want), f"{name}: NaN/Inf classes differ from the reference"
        finite = want == 0
        if finite.any():
            scale = np.max(np.abs(f64(expected)[finite]))
            err = np.max(np.abs(f64(actual)[finite] - f64(expected)[finite]))
            assert err <= TOLERANCE[np.dtype(dtype)] * max(scale, 1e-30), f"{name}: finite elements off by {err}"


def injection_cases():
    for case in OPS:
        for input_name in case.input_names:
            for special in SPECIALS:
                yield pytest.param(case, input_name, special, id=f"{case.name}: {special} in {input_name}")


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("case, input_name, special", list(injection_cases()))
def test_special_value_in_one_input_propagates_like_ieee(case, input_name, special, dtype):
    inputs = list(case.make_inputs(np.random.default_rng(0), SHAPE, dtype))
    index = case.input_names.index(input_name)
    poisoned = inputs[index].copy()
    flat = poisoned.reshape(-1)
    flat[[0, flat.size // 2, flat.size - 1]] = SPECIALS[special]  # first, a vector body, a tail
    inputs[index] = poisoned

    outputs = case.function()(*inputs)

    infinite_scale = case.name == "batch_norm_backward" and input_name == "weight" and special != "nan"
    assert_propagates_like_reference(case, outputs, inputs, dtype, same_class=not infinite_scale)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("case", OPS, ids=str)
def test_zero_divisor_gives_inf_or_nan_without_a_crash(case, dtype):
    """RMSNorm: a row of x all zero (no epsilon: r = 1/0). LayerNorm: a std of 0. BatchNorm: a variance of 0."""
    inputs = list(case.make_inputs(np.random.default_rng(1), SHAPE, dtype))
    if case.name == "rms_norm_backward":
        inputs[1][1, 7] = 0
    elif case.name == "layer_norm_backward":
        inputs[3][1, 7] = 0
    else:
        inputs[4][5] = 0

    outputs = case.function()(*inputs)

    assert any((classes(o) != 0).any() for o in outputs), "a zero divisor must show as inf/nan"
    assert_propagates_like_reference(case, outputs, inputs, dtype, same_class=case.name != "batch_norm_backward")


def test_rms_norm_zero_row_gives_nan_weight_gradient():
    """grad_w sums grad_y * x * r over rows; the zero row adds 0 * inf = NaN to every column (as the seed does)."""
    case = OPS[0]
    grad_y, x, w = case.make_inputs(np.random.default_rng(2), (4, 16), F32)
    x[3] = 0
    grad_x, grad_w = case.function()(grad_y, x, w)
    assert np.isnan(grad_w).all() and not np.isfinite(grad_x[3]).any() and np.isfinite(grad_x[:3]).all()
