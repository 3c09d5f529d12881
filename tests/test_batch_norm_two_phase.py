"""BatchNorm backward in two phases (issue 24): infiniopBatchNormBackwardReduceEx and ...ElementwiseEx, the
batch_norm_backward_reduce / _elementwise functional forms and BatchNormBackward.reduce / .elementwise.

With one process, reduce then elementwise must give the single call's bits; with the batch split over several
"processes" (uneven slices, an empty one included) and the sums added up, the concatenated grad_input must match
the float64 reference of the whole batch. Then the statuses and Python errors of bad calls."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import infiniop_py
from _devices import DEVICES, call_on
from _helpers import (BAD_PARAM, BATCH_NORM_EX_TENSORS, BF16, F16, F32, F64, NULL_POINTER, SUCCESS,
                      CTensorDescriptors, assert_close_on_scale, batch_norm_backward_reference, batch_norm_inputs,
                      batch_norm_summed_terms, data_pointer, element_strides, f64, native, rounded,
                      with_batch_layout)


def statistic_dtype(dtype):
    return np.dtype(F64) if np.dtype(dtype) == F64 else np.dtype(F32)


def bits(array):
    return np.ascontiguousarray(array).view(np.uint8)


def elementwise(*arrays, out=None, **keywords):
    """batch_norm_backward_elementwise with call_on's tuple convention."""
    return (infiniop_py.batch_norm_backward_elementwise(*arrays, out=None if out is None else out[0], **keywords),)


class SplitProblem:
    """A training BatchNorm backward over a whole batch, with the forward's saved statistics (or, running=True,
    the batch statistics passed as running_mean / running_var)."""

    def __init__(self, seed, shape, dtype, *, parameter_dtype=None, layout="channels_first", running=False,
                 eps=1e-5, affine=True, grad_weight=True, grad_bias=True):
        rng = np.random.default_rng(seed)
        self.dtype, self.layout, self.eps = np.dtype(dtype), layout, eps
        self.parameter_dtype = np.dtype(parameter_dtype or dtype)
        self.x, self.grad_output, weight, mean, var = batch_norm_inputs(rng, shape, dtype, False, self.parameter_dtype)
        self.weight = weight if affine else None
        if running:
            self.running_mean, self.running_var, self.save_mean, self.save_invstd = mean, var, None, None
        else:
            self.running_mean = self.running_var = None
            self.save_mean = rounded(mean, statistic_dtype(dtype))
            self.save_invstd = rounded(1.0 / np.sqrt(f64(var) + eps), statistic_dtype(dtype))
        self.wanted = (grad_weight, grad_bias)

    def statistics(self):
        return dict(eps=self.eps, save_mean=self.save_mean, save_invstd=self.save_invstd)

    def slices(self, cuts):
        """The batch cut at ``cuts`` (sorted batch indices, repeats give empty slices), in this layout."""
        bounds = [0, *cuts, self.x.shape[0]]
        return [(with_batch_layout(self.x[a:b], self.layout), with_batch_layout(self.grad_output[a:b], self.layout))
                for a, b in zip(bounds, bounds[1:])]

    def whole(self, device):
        x, grad_output = self.slices([])[0]
        return call_on(device, infiniop_py.batch_norm_backward, x, grad_output, self.weight, self.running_mean,
                       self.running_var, need_grad_weight=self.wanted[0], need_grad_bias=self.wanted[1],
                       **self.statistics())

    def reduce(self, device, x, grad_output):
        """Fresh gradients take running_mean's dtype, else input's (reduce has no weight to follow), so they are
        passed in the parameters' dtype, as the single call makes them."""
        given = (self.weight, self.running_mean, self.running_var)  # the single call's rule for fresh gradients
        channels = x.shape[1]
        parameter_dtype = self.parameter_dtype if any(p is not None for p in given) else self.dtype
        out = (np.empty(channels, statistic_dtype(self.dtype)), np.empty(channels, statistic_dtype(self.dtype)),
               *(np.empty(channels, parameter_dtype) if want else None for want in self.wanted))
        return call_on(device, infiniop_py.batch_norm_backward_reduce, x, grad_output, self.running_mean,
                       self.running_var, need_grad_weight=self.wanted[0], need_grad_bias=self.wanted[1], out=out,
                       **self.statistics())

    def elementwise(self, device, x, grad_output, sums, count):
        return call_on(device, elementwise, x, grad_output, self.weight, self.running_mean, self.running_var,
                       sums[0], sums[1], count, **self.statistics())[0]


@st.composite
def split_problems(draw):
    rank = draw(st.integers(2, 5))
    spatial = tuple(draw(st.lists(st.integers(1, 5), min_size=rank - 2, max_size=rank - 2)))
    batch = draw(st.integers(2, 9))
    shape = (batch, draw(st.integers(1, 40))) + spatial
    dtype = draw(st.sampled_from((F32, F16, BF16, F64)))
    parameter_dtype = draw(st.sampled_from((dtype, F32))) if dtype in (F16, BF16) else dtype
    problem = SplitProblem(draw(st.integers(0, 2**32 - 1)), shape, dtype, parameter_dtype=parameter_dtype,
                           layout=draw(st.sampled_from(("channels_first", "channels_last"))),
                           running=draw(st.booleans()), affine=draw(st.booleans()),
                           grad_weight=draw(st.booleans()), grad_bias=draw(st.booleans()))
    cuts = sorted(draw(st.lists(st.integers(0, batch), min_size=1, max_size=3)))
    return problem, cuts


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60, deadline=None)
@given(case=split_problems())
def test_one_process_is_the_single_call_bit_for_bit(device, case):
    problem, _ = case
    grad_input, grad_weight, grad_bias = problem.whole(device)
    x, grad_output = problem.slices([])[0]
    sum_grad, sum_centered, reduce_weight, reduce_bias = problem.reduce(device, x, grad_output)
    assert sum_grad.dtype == statistic_dtype(problem.dtype) and sum_grad.shape == (x.shape[1],)
    for name, single, phased in (("grad_weight", grad_weight, reduce_weight), ("grad_bias", grad_bias, reduce_bias)):
        assert (single is None) == (phased is None), name
        if single is not None:
            np.testing.assert_array_equal(bits(phased), bits(single), err_msg=name)
    count = x.shape[0] * math.prod(x.shape[2:])
    phased_input = problem.elementwise(device, x, grad_output, (sum_grad, sum_centered), count)
    assert phased_input.strides == grad_input.strides  # laid out like input
    np.testing.assert_array_equal(bits(phased_input), bits(grad_input))


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60, deadline=None)
@given(case=split_problems())
def test_split_batch_matches_the_whole_batch_reference(device, case):
    """Each "process" reduces its slice; the sums are added up (in their dtype, as an all_reduce does) and each
    process's elementwise phase, with the total count, gives its slice of the whole batch's grad_input."""
    problem, cuts = case
    reference = batch_norm_backward_reference(problem.x, problem.grad_output, problem.weight, problem.running_mean,
                                              problem.running_var, problem.eps, problem.save_mean,
                                              problem.save_invstd, True)
    mean = f64(problem.save_mean if problem.save_mean is not None else problem.running_mean)
    invstd = (f64(problem.save_invstd) if problem.save_invstd is not None
              else 1.0 / np.sqrt(f64(problem.running_var) + problem.eps))
    assume(np.all(np.isfinite(invstd)))
    slices = problem.slices(cuts)
    reduced = [problem.reduce(device, x, grad_output) for x, grad_output in slices]
    totals = [sum((r[k] for r in reduced[1:]), reduced[0][k].copy()) for k in (0, 1)]
    exact = batch_norm_summed_terms(problem.x, problem.grad_output, mean, invstd)  # grad_bias, grad_weight terms
    for total, terms, name in ((totals[0], exact[1], "sum_grad_output"), (totals[1], exact[0], "sum_grad_centered")):
        summed = f64(terms).sum(axis=0) / (invstd if name == "sum_grad_centered" else 1.0)
        scale = max(float(np.max(np.abs(summed), initial=0.0)),
                    float(np.max(np.sqrt(np.sum(f64(terms) ** 2, axis=0)), initial=0.0)), 1e-300)
        if name == "sum_grad_centered":
            scale = max(scale, float(np.max(np.sqrt(np.sum(f64(terms) ** 2, axis=0)) / invstd, initial=0.0)))
        assert_close_on_scale(total, summed, problem.dtype, scale, name)
    count = problem.x.shape[0] * math.prod(problem.x.shape[2:])
    pieces = [problem.elementwise(device, x, grad_output, totals, count) for x, grad_output in slices]
    grad_input = np.concatenate(pieces, axis=0)
    per_channel = (1, -1) + (1,) * (problem.x.ndim - 2)
    weight = np.ones_like(invstd) if problem.weight is None else f64(problem.weight)
    first_term = (weight * invstd).reshape(per_channel) * f64(problem.grad_output)
    scale = max(float(np.max(np.abs(reference[0]), initial=0.0)), float(np.max(np.abs(first_term), initial=0.0)))
    if scale > 0:
        assert_close_on_scale(grad_input, reference[0], problem.dtype, scale, "grad_input")


@pytest.mark.parametrize("device", DEVICES)
def test_split_grad_weight_sums_to_the_whole(device):
    """Per-process grad_weight / grad_bias add up to the whole batch's (F64: exactly enough to compare at 1e-12)."""
    problem = SplitProblem(3, (7, 5, 6), F64)
    whole = problem.whole(device)
    reduced = [problem.reduce(device, x, grad_output) for x, grad_output in problem.slices([2, 2, 5])]
    np.testing.assert_allclose(sum(r[2] for r in reduced), whole[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sum(r[3] for r in reduced), whole[2], rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- errors, in C and in Python

def _c_descriptor(c_handle, arrays, training=1):
    ffi, op, _ = native()
    specs = {name: (a.shape, a.dtype, element_strides(a)) for name, a in arrays.items()}
    with CTensorDescriptors([specs.get(name) for name in BATCH_NORM_EX_TENSORS]) as descriptors:
        pointer = ffi.new("infiniopDescriptor_t *")
        assert op.infiniopCreateBatchNormBackwardDescriptorEx(c_handle, pointer, *descriptors, 1e-5,
                                                              training) == SUCCESS
    size = ffi.new("size_t *")
    assert op.infiniopGetBatchNormBackwardWorkspaceSize(pointer[0], size) == SUCCESS
    return pointer[0], np.empty(max(size[0], 1), np.uint8), size[0]


def _phase_arrays():
    problem = SplitProblem(0, (4, 3, 5), F32)
    x, grad_output = problem.slices([])[0]
    return {"grad_input": np.empty_like(x), "grad_weight": np.empty(3, F32), "input": x, "grad_output": grad_output,
            "weight": problem.weight, "save_mean": problem.save_mean, "save_invstd": problem.save_invstd}


def _reduce_status(descriptor, workspace, size, arrays, sums):
    ffi, op, _ = native()
    pointer = lambda a: ffi.NULL if a is None else data_pointer(a)
    return op.infiniopBatchNormBackwardReduceEx(
        descriptor, pointer(workspace), size, pointer(sums[0]), pointer(sums[1]), pointer(arrays["grad_weight"]),
        ffi.NULL, pointer(arrays["input"]), pointer(arrays["grad_output"]), ffi.NULL, ffi.NULL,
        pointer(arrays["save_mean"]), pointer(arrays["save_invstd"]), ffi.NULL)


def _elementwise_status(descriptor, workspace, size, arrays, sums, count, grad_input=None):
    ffi, op, _ = native()
    pointer = lambda a: ffi.NULL if a is None else data_pointer(a)
    return op.infiniopBatchNormBackwardElementwiseEx(
        descriptor, pointer(workspace), size, pointer(arrays["grad_input"] if grad_input is None else grad_input),
        pointer(arrays["input"]), pointer(arrays["grad_output"]), pointer(arrays["weight"]), ffi.NULL, ffi.NULL,
        pointer(arrays["save_mean"]), pointer(arrays["save_invstd"]), pointer(sums[0]), pointer(sums[1]), count,
        ffi.NULL)


def test_c_statuses(c_handle):
    ffi, op, _ = native()
    arrays = _phase_arrays()
    sums = (np.zeros(3, F32), np.zeros(3, F32))
    descriptor, workspace, size = _c_descriptor(c_handle, arrays)
    try:
        assert _reduce_status(descriptor, workspace, size, arrays, sums) == SUCCESS
        assert _elementwise_status(descriptor, workspace, size, arrays, sums, 20) == SUCCESS
        assert _elementwise_status(descriptor, workspace, size, arrays, sums, 2**40) == SUCCESS
        # the total count covers at least this process's 4 * 5 elements per channel
        assert _elementwise_status(descriptor, workspace, size, arrays, sums, 19) == BAD_PARAM
        assert _elementwise_status(descriptor, workspace, size, arrays, sums, -1) == BAD_PARAM
        assert _reduce_status(descriptor, workspace, size, arrays, (None, sums[1])) == NULL_POINTER
        assert _elementwise_status(descriptor, workspace, size, arrays, (sums[0], None), 20) == NULL_POINTER
        # outputs must not overlap another argument: a sum over grad_weight, or over the other sum
        assert _reduce_status(descriptor, workspace, size, arrays, (arrays["grad_weight"], sums[1])) == BAD_PARAM
        assert _reduce_status(descriptor, workspace, size, arrays, (sums[0], sums[0])) == BAD_PARAM
        # in place (grad_input is grad_output) is allowed, grad_input over a sum is not
        in_place = arrays["grad_output"].copy()
        assert _elementwise_status(descriptor, workspace, size, dict(arrays, grad_output=in_place), sums, 20,
                                   grad_input=in_place) == SUCCESS
        wide = np.zeros(60, F32)
        assert _elementwise_status(descriptor, workspace, size, arrays, (wide, sums[1]), 20,
                                   grad_input=wide.reshape(4, 3, 5)) == BAD_PARAM
    finally:
        assert op.infiniopDestroyBatchNormBackwardDescriptor(descriptor) == SUCCESS
    eval_arrays = _phase_arrays()
    eval_arrays.pop("save_mean"), eval_arrays.pop("save_invstd")
    eval_arrays.update(running_mean=np.zeros(3, F32), running_var=np.ones(3, F32))
    descriptor, workspace, size = _c_descriptor(c_handle, eval_arrays, training=0)
    try:  # eval mode has nothing to add up
        assert _reduce_status(descriptor, workspace, size, dict(eval_arrays, save_mean=None, save_invstd=None),
                              sums) == BAD_PARAM
    finally:
        assert op.infiniopDestroyBatchNormBackwardDescriptor(descriptor) == SUCCESS


def test_python_errors_name_the_argument():
    problem = SplitProblem(1, (4, 3, 5), F32)
    x, grad_output = problem.slices([])[0]
    keywords = problem.statistics()
    good = (np.zeros(3, F32), np.zeros(3, F32))
    with pytest.raises(infiniop_py.BadTensorDtypeError, match="sum_grad_output.*F64.*F32"):
        infiniop_py.batch_norm_backward_elementwise(x, grad_output, problem.weight, None, None, good[0].astype(F64),
                                                    good[1], 20, **keywords)
    with pytest.raises(infiniop_py.BadTensorShapeError, match=r"sum_grad_centered.*\(3,\)"):
        infiniop_py.batch_norm_backward_elementwise(x, grad_output, problem.weight, None, None, good[0],
                                                    np.zeros(4, F32), 20, **keywords)
    with pytest.raises(infiniop_py.BadTensorStridesError, match="sum_grad_output.*contiguous"):
        infiniop_py.batch_norm_backward_elementwise(x, grad_output, problem.weight, None, None,
                                                    np.zeros(6, F32)[::2], good[1], 20, **keywords)
    with pytest.raises(infiniop_py.BadParamError):
        infiniop_py.batch_norm_backward_elementwise(x, grad_output, problem.weight, None, None, *good, 19, **keywords)
    with pytest.raises(ValueError, match="total_count"):
        infiniop_py.batch_norm_backward_elementwise(x, grad_output, problem.weight, None, None, *good, -5, **keywords)
    read_only = np.zeros(3, F32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="sum_grad_output"):
        infiniop_py.batch_norm_backward_reduce(x, grad_output, **keywords,
                                               out=(read_only, good[1], np.empty(3, F32), np.empty(3, F32)))
    with infiniop_py.Handle("cpu") as handle:
        with infiniop_py.BatchNormBackward(handle, x, None, None, x, grad_output, problem.weight,
                                           np.zeros(3, F32), np.ones(3, F32), training=False) as eval_op:
            with pytest.raises(infiniop_py.BadParamError, match="training=True"):
                eval_op.reduce(*good, None, None, x, grad_output, np.zeros(3, F32), np.ones(3, F32))
