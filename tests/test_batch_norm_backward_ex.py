"""The ...Ex entry points of BatchNorm backward (issue 6): epsilon, saved statistics, optional outputs, no
weight, F32 parameters with F16/BF16 data, F64, ranks 2..5, channels-last layouts and eval mode, against the
float64 reference of the exact rounded inputs (and torch's native_batch_norm_backward), on every device
(_devices.DEVICES); their statuses in C and in the Python mirror; the seed and Ex functions on each other's
descriptors; determinism across threads."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import infiniop_py
from infiniop_py import _layout, _operator, errors
from infiniop_py.tensors import as_tensor
from _devices import DEVICES, EMULATED_CUDA, DeviceData, call_on
from _helpers import (
    BAD_PARAM, BAD_TENSOR_DTYPE, BAD_TENSOR_SHAPE, BAD_TENSOR_STRIDES, BATCH_NORM_EX_TENSORS, BF16, F16, F32, F64,
    NULL_POINTER, SUCCESS, TOLERANCE, CTensorDescriptors, GuardedOutput, element_strides, assert_close, assert_close_on_scale, batch_norm_backward_reference,
    batch_norm_ex_create_status, batch_norm_ex_workspace_size, batch_norm_inputs, batch_norm_statistics, batch_norm_summed_terms, channels_last,
    data_pointer, f64, native, rounded, run_batch_norm_ex, untouched, with_batch_layout,
)

HALVES = (F16, BF16)
NAN = float("nan")


def statistic_dtype(dtype):
    return F64 if np.dtype(dtype) == F64 else F32


class Problem:
    """Inputs of one call (exact, already rounded) and what the call asks for."""

    def __init__(self, rng, shape, dtype, *, parameter_dtype=None, layout="channels_first", training=True,
                 saved=False, running=True, eps=0.0, affine=True, grad_weight=True, grad_bias=True,
                 positive=False):
        self.dtype, self.layout = np.dtype(dtype), layout
        self.parameter_dtype = np.dtype(parameter_dtype or dtype)
        self.training, self.eps = training, eps
        self.x, self.grad_output, weight, mean, var = batch_norm_inputs(rng, shape, dtype, positive,
                                                                        self.parameter_dtype)
        channels = shape[1]
        if not training:  # running statistics that are not the batch's: eval must use them as given
            mean = rounded(f64(mean) + rng.normal(0.0, 0.5, channels), self.parameter_dtype)
            var = rounded(f64(var) * rng.uniform(0.5, 2.0, channels), self.parameter_dtype)
        self.weight = weight if affine else None
        self.running_mean, self.running_var = (mean, var) if running else (None, None)
        self.save_mean = self.save_invstd = None
        if saved:  # as the forward saves them: the batch statistics, in F32 (F64 for F64 data)
            self.save_mean = rounded(mean, statistic_dtype(dtype))
            self.save_invstd = rounded(1.0 / np.sqrt(f64(var) + eps), statistic_dtype(dtype))
        self.wanted = (True, grad_weight, grad_bias)

    def __repr__(self):
        saved = "saved" if self.save_mean is not None else "running" if self.running_mean is not None else "none"
        return (f"Problem({self.x.shape}, {self.dtype}, parameters {self.parameter_dtype}, {self.layout}, "
                f"{'training' if self.training else 'eval'}, statistics {saved}, eps={self.eps}, "
                f"affine={self.weight is not None}, wanted={self.wanted})")

    def keywords(self):
        """The functional API's keyword arguments for this problem."""
        return dict(eps=self.eps, save_mean=self.save_mean, save_invstd=self.save_invstd, training=self.training,
                    need_grad_weight=self.wanted[1], need_grad_bias=self.wanted[2])

    def arrays(self):
        """The functional API's positional arrays, big ones in this problem's layout."""
        return (with_batch_layout(self.x, self.layout), with_batch_layout(self.grad_output, self.layout),
                self.weight, self.running_mean, self.running_var)

    def reference(self):
        return batch_norm_backward_reference(self.x, self.grad_output, self.weight, self.running_mean,
                                             self.running_var, self.eps, self.save_mean, self.save_invstd,
                                             self.training)

    def run_on(self, device):
        """The functional API's outputs for this problem, computed on `device`, as numpy arrays."""
        return call_on(device, infiniop_py.batch_norm_backward, *self.arrays(), **self.keywords())

    def check(self, outputs, fresh=True):
        """Every output within its bound of the float64 reference; those not wanted are None. fresh: the
        functional API allocated the outputs (so their dtypes follow its rule)."""
        expected = self.reference()
        assert outputs[0].dtype == self.dtype and outputs[0].shape == self.x.shape
        mean, invstd = batch_norm_statistics(self.running_mean, self.running_var, self.eps, self.save_mean,
                                             self.save_invstd, self.training)
        # grad_input's three terms cancel exactly when a channel has two samples (and nearly with few): judge it
        # on the size of its first term, weight * invstd * grad_output, where that is larger.
        per_channel = (1, -1) + (1,) * (self.x.ndim - 2)
        weight = np.ones_like(invstd) if self.weight is None else f64(self.weight)
        first_term = (weight * invstd).reshape(per_channel) * f64(self.grad_output)
        scale = max(float(np.max(np.abs(expected[0]), initial=0.0)), float(np.max(np.abs(first_term), initial=0.0)))
        if scale > 0:
            assert_close_on_scale(outputs[0], expected[0], self.dtype, scale, "grad_input")
        terms = batch_norm_summed_terms(self.x, self.grad_output, mean, invstd)
        for name, want, actual, reference, summed in zip(("grad_weight", "grad_bias"), self.wanted[1:],
                                                         outputs[1:], expected[1:], terms):
            if not want:
                assert actual is None, name
                continue
            assert actual.shape == reference.shape, name
            if reference.size == 0:
                continue
            # A sum whose terms cancel is judged on their root-sum-square (see assert_matches_reference).
            scale = max(float(np.max(np.abs(reference))), float(np.max(np.sqrt(np.sum(summed**2, axis=0)))))
            given = (self.weight, self.running_mean, self.running_var)
            # Fresh gradients take the parameters' dtype, else the data's; F32 ones hold F32 sums of F16/BF16
            # terms, so each is held to the bound of its own dtype.
            if fresh:
                assert actual.dtype == (self.parameter_dtype if any(p is not None for p in given) else self.dtype)
            assert_close_on_scale(actual, reference, actual.dtype, max(scale, 1e-300), name)


# ---------------------------------------------------------------- every item against the float64 reference

@st.composite
def problems(draw):
    rank = draw(st.integers(2, 5))
    spatial = tuple(draw(st.lists(st.integers(1, 6), min_size=rank - 2, max_size=rank - 2)))
    batch = draw(st.integers(1, 5))
    if batch * math.prod(spatial) < 2:
        batch = 2  # one sample per channel has no variance: invstd would be infinite
    shape = (batch, draw(st.integers(1, 20))) + spatial
    dtype = draw(st.sampled_from((F32, F16, BF16, F64)))
    parameter_dtype = draw(st.sampled_from((dtype, F32))) if dtype in HALVES else dtype
    training = draw(st.booleans())
    saved = training and draw(st.booleans())
    return Problem(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), shape, dtype,
                   parameter_dtype=parameter_dtype, layout=draw(st.sampled_from(("channels_first", "channels_last"))),
                   training=training, saved=saved, running=not saved or draw(st.booleans()),
                   eps=draw(st.sampled_from((0.0, 1e-5, 0.5))), affine=draw(st.booleans()),
                   grad_weight=draw(st.booleans()), grad_bias=draw(st.booleans()))


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=200)
@given(problem=problems())
def test_matches_float64_reference(device, problem):
    # A channel of equal values (two BF16 samples can round alike) with eps 0 has an infinite invstd; such
    # non-finite results are test_non_finite.py's subject, compared by their NaN/Inf pattern.
    _, invstd = batch_norm_statistics(problem.running_mean, problem.running_var, problem.eps, problem.save_mean,
                                      problem.save_invstd, problem.training)
    assume(np.all(np.isfinite(invstd)))
    problem.check(problem.run_on(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels", (1, 3, 16, 24, 100, 1001, 5000))
@pytest.mark.parametrize("dtype", (F32, BF16, F16), ids=str)
@pytest.mark.parametrize("training", (True, False), ids=("training", "eval"))
def test_channels_last_many_rows(device, channels, dtype, training):
    """Enough rows for several tiles, and channel counts whose period is short, long, or C itself; all-positive
    data, so sums grow with the row count (an accumulator narrower than F32 would fail the bound)."""
    shape = (max(2, 60000 // (32 * channels)), channels, 4, 8)
    problem = Problem(np.random.default_rng(channels), shape, dtype, layout="channels_last", training=training,
                      eps=1e-5, positive=True)
    outputs = problem.run_on(device)
    assert outputs[0].strides == channels_last(problem.x).strides  # computed in place, not via a copy
    problem.check(outputs)


# Channels-first (N, C, L) around the CPU's choice of path: runs shorter than a vector (L < 16) are periodic rows
# of C * L, at any C * L; longer runs keep the channels-first tiles, with or without a partial vector. Runs of
# exactly one vector take loops of their own, by pairs of channels (an odd C leaves one over).
SHORT_RUN_SHAPES = {"periodic, C*L not a multiple of 16": (2500, 7, 3), "periodic, L = 15": (400, 64, 15),
                    "one vector per run": (400, 64, 16), "one vector per run, odd C": (300, 33, 16),
                    "a partial vector per run": (300, 33, 24),
                    "periodic, rows too long for whole-vector periods": (40, 2049, 8)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHORT_RUN_SHAPES.values(), ids=SHORT_RUN_SHAPES.keys())
@pytest.mark.parametrize("dtype", (F32, BF16, F16), ids=str)
@pytest.mark.parametrize("training", (True, False), ids=("training", "eval"))
def test_channels_first_short_runs_many_rows(device, shape, dtype, training):
    """Enough rows for several tiles; all-positive data, so the sums grow with the row count."""
    problem = Problem(np.random.default_rng(shape[2]), shape, dtype, training=training, eps=1e-5, positive=True)
    problem.check(problem.run_on(device))


# Channels-first runs of a vector or more with few elements per channel (N * L): the CPU groups batches so that a
# channel has 1024 elements per group where it can and splits a group's channels among tiles (even, uneven, and
# 64 blocks of 32 channels here); each tile's sums pass keeps 48 floats per channel of its own.
CHANNEL_BLOCK_SHAPES = {"8 even blocks": (8, 512, 32), "7 uneven blocks": (3, 1000, 40), "64 blocks": (64, 2048, 16)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", CHANNEL_BLOCK_SHAPES.values(), ids=CHANNEL_BLOCK_SHAPES.keys())
@pytest.mark.parametrize("dtype", (F32, BF16), ids=str)
def test_channels_first_few_elements_per_channel(device, shape, dtype):
    problem = Problem(np.random.default_rng(shape[1]), shape, dtype, training=True, eps=1e-5, positive=True)
    problem.check(problem.run_on(device))


# Short runs (periodic rows: a few rows of floats per position), and runs of a vector or more with few elements
# per channel, where channels-first tiles of one batch each once kept 48 floats per channel per tile: 3.25x the
# data at (64, 16384, 16) F32.
@pytest.mark.parametrize("shape, bound", (((4, 16384, 8), 3), ((64, 2304, 9), 3), ((8, 65536, 4), 3),
                                          ((64, 16384, 16), 0.1), ((8, 512, 32), 0.5)), ids=str)
def test_channels_first_many_channels_take_a_workspace_on_the_scale_of_the_data(cpu_handle, shape, bound):
    x = np.ones(shape, F32)
    channel = np.ones(shape[1], F32)
    with infiniop_py.BatchNormBackward(cpu_handle, np.empty_like(x), channel.copy(), channel.copy(), x, x.copy(),
                                       channel, channel.copy(), channel.copy()) as operator:
        assert operator.workspace_size < bound * x.nbytes


# Rows of channels on an NVIDIA GPU as wide as an H200 (on the emulation: 528 multiprocessors of its 2 resident
# CTAs, 132 of 8): late ResNet layers (7x7, 14x14) and BatchNorm1d batches have few rows per channel. Row tiles of
# a few rows each once gave F64 partials of 0.67x the input's bytes at (128, 2048, 7, 7), written and read again.
@pytest.mark.nvidia
@pytest.mark.parametrize("shape", ((128, 2048, 7, 7), (128, 512, 7, 7), (128, 1024, 14, 14), (32, 4096)), ids=str)
@pytest.mark.parametrize("dtype", (F32, BF16), ids=str)
def test_rows_of_channels_take_a_fraction_of_the_data_as_workspace_on_nvidia(monkeypatch, shape, dtype):
    if EMULATED_CUDA:
        monkeypatch.setenv("INFINIOP_EMULATED_CUDA_SMS", "528")
    channels = shape[1]
    strides = element_strides(channels_last(np.empty(shape, np.uint8))) if len(shape) == 4 else None
    specs = base_specs(dtype, F32, shape, strides)
    with infiniop_py.Handle("nvidia") as handle:
        workspace = batch_norm_ex_workspace_size(handle.native, specs, 1e-5, True)
    # At most a quarter of the input for the partials (a tile covers >= 64 bytes of each channel, 16 per partial),
    # then each channel's coefficients and alignment.
    assert workspace <= math.prod(shape) * np.dtype(dtype).itemsize / 4 + 32 * channels + 1024


# The same plan run: several channel blocks (the last one partial) times row tiles of the minimum length.
@pytest.mark.nvidia
@pytest.mark.parametrize("shape, dtype", (((64, 600, 3, 3), BF16), ((40, 1001, 3), F32), ((96, 2000), F16)), ids=str)
def test_rows_of_channels_planned_for_a_wide_gpu(monkeypatch, shape, dtype):
    if EMULATED_CUDA:
        monkeypatch.setenv("INFINIOP_EMULATED_CUDA_SMS", "528")
    problem = Problem(np.random.default_rng(shape[1]), shape, dtype, parameter_dtype=F32, layout="channels_last",
                      eps=1e-5, positive=True)
    problem.check(problem.run_on("nvidia"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", ((6000, 24), (5000, 3, 1), (16, 8, 3000), (3, 5, 7, 9, 11)), ids=str)
@pytest.mark.parametrize("dtype, parameter_dtype", ((F32, F32), (F16, F32), (BF16, F32), (BF16, BF16), (F64, F64)),
                         ids=str)
def test_channels_first_ranks_mixed_precision_and_saved_statistics(device, shape, dtype, parameter_dtype):
    problem = Problem(np.random.default_rng(len(shape)), shape, dtype, parameter_dtype=parameter_dtype, saved=True,
                      running=False, eps=1e-3)
    problem.check(problem.run_on(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ("channels_first", "channels_last"))
@pytest.mark.parametrize("shape", ((0, 3, 4, 5), (2, 3, 0, 5), (2, 0, 4, 5)), ids=str)
@pytest.mark.parametrize("training", (True, False), ids=("training", "eval"))
def test_empty_tensors(device, layout, shape, training):
    problem = Problem(np.random.default_rng(0), shape, F32, layout=layout, training=training, eps=1e-5)
    outputs = problem.run_on(device)
    assert outputs[0].shape == shape
    for vector in outputs[1:]:
        assert vector.shape == (shape[1],) and not vector.any()  # empty sums


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", (F32, BF16, F64), ids=str)
@pytest.mark.parametrize("eps", (1e-5, 0.5))
def test_epsilon_keeps_a_constant_channel_finite(device, dtype, eps):
    problem = Problem(np.random.default_rng(1), (4, 3, 10), dtype, eps=eps)
    problem.x[:, 1] = 2  # zero variance: invstd = 1/sqrt(eps)
    problem.running_mean[1], problem.running_var[1] = 2, 0
    outputs = problem.run_on(device)
    assert all(np.isfinite(f64(o)).all() for o in outputs)
    problem.check(outputs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ("channels_first", "channels_last"))
def test_eval_without_weight_gradients_reads_neither_input_nor_statistics_sums(device, layout):
    """grad_input = grad_output * weight * invstd needs no x: a NaN input changes nothing."""
    problem = Problem(np.random.default_rng(2), (3, 5, 6, 7), F32, layout=layout, training=False, eps=1e-5,
                      grad_weight=False, grad_bias=False)
    x, grad_output, weight, mean, var = problem.arrays()
    x = with_batch_layout(np.full(x.shape, np.nan, F32), layout)
    grad_input, grad_weight, grad_bias = call_on(device, infiniop_py.batch_norm_backward, x, grad_output, weight,
                                                 mean, var, **problem.keywords())
    assert grad_weight is None and grad_bias is None
    assert_close(grad_input, problem.reference()[0], F32, "grad_input")


@pytest.mark.parametrize("device", DEVICES)
def test_saved_statistics_replace_the_running_ones(device):
    """Saved statistics that are not the running ones (nor the batch's): the saved ones are what is used."""
    rng = np.random.default_rng(3)
    problem = Problem(rng, (4, 6, 9), F32, saved=True, eps=7.0)
    problem.save_mean = rounded(rng.normal(0, 1, 6), F32)
    problem.save_invstd = rounded(rng.uniform(0.5, 2, 6), F32)
    problem.check(problem.run_on(device))


@pytest.mark.parametrize("device", DEVICES)
def test_absent_tensors_pointers_are_ignored(device, device_handle):
    """A NULL descriptor makes its run pointer irrelevant: outputs given as pointers are not written, inputs
    given as pointers to NaNs are not read."""
    problem = Problem(np.random.default_rng(4), (8, 5, 40), F32, saved=True)
    grad_input = np.empty_like(problem.x)
    sentinels = {name: np.full(5, GuardedOutput.SENTINEL, F32) for name in ("grad_weight", "grad_bias")}
    nans = {name: np.full(5, np.nan, F32) for name in ("weight", "running_mean", "running_var")}
    arrays = {"grad_input": grad_input, "input": problem.x, "grad_output": problem.grad_output,
              "save_mean": problem.save_mean, "save_invstd": problem.save_invstd}
    data = DeviceData(device)

    def pointer(array):  # every array comes back after the run, so a stray write to any of them shows
        return data_pointer(array) if device == "cpu" else \
            native()[0].cast("void *", as_tensor(data.put(array, output=True), "array").data)

    status = run_batch_norm_ex(device_handle.native, arrays, ignored={**sentinels, **nans}, pointer=pointer)
    data.write_back()
    assert status == SUCCESS
    assert all(untouched(array) for array in sentinels.values())
    problem.weight = problem.running_mean = problem.running_var = None
    problem.wanted = (True, False, False)
    problem.check((grad_input, None, None), fresh=False)


@pytest.mark.parametrize("device", DEVICES)
def test_skipped_gradients_need_less_workspace_and_refuse_an_array(device, device_handle):
    problem = Problem(np.random.default_rng(5), (32, 6, 700), F32, training=False)
    data = DeviceData(device)
    grad_input = np.empty_like(problem.x)
    device_grad_input = data.put(grad_input, output=True)
    vector = data.put(np.empty_like(problem.weight), output=True)
    x, grad_output, weight, mean, var = (data.put(array) for array in problem.arrays())
    with infiniop_py.BatchNormBackward(device_handle, device_grad_input, vector, vector, x, grad_output, weight, mean,
                                       var, training=False) as full, \
            infiniop_py.BatchNormBackward(device_handle, device_grad_input, None, None, x, grad_output, weight, mean,
                                          var, training=False) as bare:
        assert bare.workspace_size < full.workspace_size  # no per-tile sums in eval without weight gradients
        bare(device_grad_input, None, None, x, grad_output, weight, mean, var)
        data.write_back()
        assert_close(grad_input, problem.reference()[0], F32, "grad_input")
        with pytest.raises(ValueError, match="grad_weight"):
            bare(device_grad_input, vector, None, x, grad_output, weight, mean, var)


# ---------------------------------------------------------------- torch's native_batch_norm_backward

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", (F32, F64, BF16), ids=str)
@pytest.mark.parametrize("layout", ("channels_first", "channels_last"))
@pytest.mark.parametrize("rank", (2, 4, 5))
@pytest.mark.parametrize("training", (True, False), ids=("training", "eval"))
@pytest.mark.parametrize("affine, mask", ((True, (True, True, True)), (True, (True, False, True)),
                                          (False, (True, False, False))), ids=("all", "no-grad-weight", "no-affine"))
def test_matches_torch(device, dtype, layout, rank, training, affine, mask):
    shape = (6, 5, 7, 4, 3)[:rank]
    problem = Problem(np.random.default_rng(rank), shape, dtype, parameter_dtype=F32 if dtype in HALVES else dtype,
                      layout=layout, training=training, saved=training, running=not training, eps=1e-3,
                      affine=affine, grad_weight=mask[1], grad_bias=mask[2])
    x, grad_output, weight, mean, var = problem.arrays()

    def tensor(array):
        if array is None:
            return None
        return torch.from_numpy(f64(array)).to(torch.bfloat16 if array.dtype == BF16 else torch.from_numpy(
            np.empty(0, array.dtype)).dtype)

    expected = torch.ops.aten.native_batch_norm_backward(
        tensor(grad_output), tensor(x), tensor(weight), tensor(mean), tensor(var), tensor(problem.save_mean),
        tensor(problem.save_invstd), training, problem.eps, list(mask))
    ours = call_on(device, infiniop_py.batch_norm_backward, x, grad_output, weight, mean, var, **problem.keywords())
    for name, actual, reference, want in zip(("grad_input", "grad_weight", "grad_bias"), ours, expected, mask):
        if not want:
            assert actual is None and reference is None
            continue
        reference = reference.double().numpy()
        bound = TOLERANCE[np.dtype(dtype)] * (10 if dtype == F64 else 1)  # torch's F64 sums are not exact either
        scale = float(np.max(np.abs(reference)))
        assert np.max(np.abs(f64(actual) - reference)) <= bound * max(scale, 1.0), name


# ---------------------------------------------------------------- statuses: C, and the Python mirror agrees

SHAPE = (2, 3, 4)


def base_specs(dtype=F32, parameter_dtype=None, shape=SHAPE, strides=None):
    parameter_dtype = parameter_dtype or dtype
    vector = ((shape[1] if len(shape) > 1 else 3,), parameter_dtype, None)
    big = (shape, dtype, strides)
    return {"grad_input": big, "grad_weight": vector, "grad_bias": vector, "input": big, "grad_output": big,
            "weight": vector, "running_mean": vector, "running_var": vector}


def changed(specs, **changes):
    return {**specs, **changes}


NHWC = (2, 3, 4, 5)
NHWC_STRIDES = (60, 1, 15, 3)
STATISTIC = ((3,), F32, None)

STATUS_CASES = [
    # (description, specs, epsilon, training, expected)
    ("seed features", base_specs(), 0.0, 1, SUCCESS),
    ("eps and eval", base_specs(), 1e-5, 0, SUCCESS),
    ("saved statistics, no running ones", changed(base_specs(), running_mean=None, running_var=None,
                                                  save_mean=STATISTIC, save_invstd=STATISTIC), 0.0, 1, SUCCESS),
    ("no weight, no gradients", changed(base_specs(), weight=None, grad_weight=None, grad_bias=None), 0.0, 1,
     SUCCESS),
    ("rank 2", base_specs(shape=(5, 3)), 0.0, 1, SUCCESS),
    ("rank 5", base_specs(shape=(2, 3, 2, 2, 2)), 0.0, 1, SUCCESS),
    ("channels-last rank 4", base_specs(shape=NHWC, strides=NHWC_STRIDES), 0.0, 1, SUCCESS),
    ("channels-last rank 3", base_specs(strides=(12, 1, 3)), 0.0, 1, SUCCESS),
    ("F16 data, F32 parameters", base_specs(F16, F32), 0.0, 1, SUCCESS),
    ("F64 throughout", changed(base_specs(F64), save_mean=((3,), F64, None), save_invstd=((3,), F64, None)), 0.0, 1,
     SUCCESS),
    ("broadcast weight", changed(base_specs(), weight=((3,), F32, (0,))), 0.0, 1, SUCCESS),
    ("reversed grad_bias", changed(base_specs(), grad_bias=((3,), F32, (-1,))), 0.0, 1, SUCCESS),
    # ---- BAD_PARAM
    ("negative eps", base_specs(), -1e-5, 1, BAD_PARAM),
    ("NaN eps", base_specs(), NAN, 1, BAD_PARAM),
    ("infinite eps", base_specs(), math.inf, 1, BAD_PARAM),
    ("save_mean alone", changed(base_specs(), save_mean=STATISTIC), 0.0, 1, BAD_PARAM),
    ("save_invstd alone", changed(base_specs(), save_invstd=STATISTIC), 0.0, 1, BAD_PARAM),
    ("saved statistics in eval", changed(base_specs(), save_mean=STATISTIC, save_invstd=STATISTIC), 0.0, 0,
     BAD_PARAM),
    ("bad eps before bad dtype", base_specs(np.dtype(np.int32)), -1.0, 1, BAD_PARAM),
    # ---- NULL_POINTER
    ("no grad_input", changed(base_specs(), grad_input=None), 0.0, 1, NULL_POINTER),
    ("no input", changed(base_specs(), input=None), 0.0, 1, NULL_POINTER),
    ("no grad_output", changed(base_specs(), grad_output=None), 0.0, 1, NULL_POINTER),
    ("no running_mean in eval", changed(base_specs(), running_mean=None), 0.0, 0, NULL_POINTER),
    ("no running_var without saved statistics", changed(base_specs(), running_var=None), 0.0, 1, NULL_POINTER),
    ("no running_var in eval", changed(base_specs(), running_var=None), 1e-5, 0, NULL_POINTER),
    # ---- BAD_TENSOR_DTYPE
    ("F32 data, F16 parameters", base_specs(F32, F16), 0.0, 1, BAD_TENSOR_DTYPE),
    ("F32 data, F64 parameters", base_specs(F32, F64), 0.0, 1, BAD_TENSOR_DTYPE),
    ("F64 data, F32 parameters", base_specs(F64, F32), 0.0, 1, BAD_TENSOR_DTYPE),
    ("F16 data, F32 weight, F16 running_mean", changed(base_specs(F16, F32), running_mean=((3,), F16, None)), 0.0, 1,
     BAD_TENSOR_DTYPE),
    ("BF16 data, F16 parameters", base_specs(BF16, F16), 0.0, 1, BAD_TENSOR_DTYPE),
    ("F16 save_mean", changed(base_specs(F16), save_mean=((3,), F16, None), save_invstd=STATISTIC), 0.0, 1,
     BAD_TENSOR_DTYPE),
    ("F32 saved statistics for F64 data", changed(base_specs(F64), save_mean=STATISTIC, save_invstd=STATISTIC), 0.0,
     1, BAD_TENSOR_DTYPE),
    ("grad_output F16, input F32", changed(base_specs(), grad_output=(SHAPE, F16, None)), 0.0, 1, BAD_TENSOR_DTYPE),
    ("int32 data", base_specs(np.dtype(np.int32)), 0.0, 1, BAD_TENSOR_DTYPE),
    ("bad dtype before bad shape", changed(base_specs(F32, F16), input=((2, 3, 5), F32, None)), 0.0, 1,
     BAD_TENSOR_DTYPE),
    # ---- BAD_TENSOR_SHAPE
    ("rank 1", base_specs(shape=(3,)), 0.0, 1, BAD_TENSOR_SHAPE),
    ("rank 6", base_specs(shape=(2, 3, 1, 1, 1, 2)), 0.0, 1, BAD_TENSOR_SHAPE),
    ("weight of length C+1", changed(base_specs(), weight=((4,), F32, None)), 0.0, 1, BAD_TENSOR_SHAPE),
    ("save_invstd of shape (C, 1)", changed(base_specs(), save_mean=STATISTIC, save_invstd=((3, 1), F32, None)), 0.0,
     1, BAD_TENSOR_SHAPE),
    ("grad_output of another shape", changed(base_specs(), grad_output=((2, 3, 5), F32, None)), 0.0, 1,
     BAD_TENSOR_SHAPE),
    ("bad shape before bad strides", changed(base_specs(), input=((2, 3, 5), F32, (30, 1, 3))), 0.0, 1,
     BAD_TENSOR_SHAPE),
    # ---- BAD_TENSOR_STRIDES
    ("input channels-last, the others channels-first",
     changed(base_specs(shape=NHWC), input=(NHWC, F32, NHWC_STRIDES)), 0.0, 1, BAD_TENSOR_STRIDES),
    ("padded input", changed(base_specs(), input=(SHAPE, F32, (24, 8, 1))), 0.0, 1, BAD_TENSOR_STRIDES),
    ("spatial dims swapped", base_specs(shape=NHWC, strides=(60, 20, 1, 4)), 0.0, 1, BAD_TENSOR_STRIDES),
    ("grad_weight of stride 0", changed(base_specs(), grad_weight=((3,), F32, (0,))), 0.0, 1, BAD_TENSOR_STRIDES),
]


def python_status(specs, epsilon, training):
    tensors = {name: None if spec is None else
               _layout.TensorSpec(spec[0], infiniop_py.dtypes.code_of(spec[1]), spec[2])
               for name, spec in specs.items()}
    return _layout.status_of(_layout.check_batch_norm_backward_ex, **tensors, epsilon=epsilon, training=training)


@pytest.mark.parametrize("description, specs, epsilon, training, expected", STATUS_CASES,
                         ids=[case[0] for case in STATUS_CASES])
def test_ex_statuses_in_c_and_python(c_handle, description, specs, epsilon, training, expected):
    assert batch_norm_ex_create_status(c_handle, specs, epsilon, training) == expected
    assert python_status(specs, epsilon, training) == expected


@pytest.mark.parametrize("description, specs, expected", [
    ("rank 4", base_specs(shape=NHWC), BAD_TENSOR_SHAPE),
    ("channels-last rank 3", base_specs(strides=(12, 1, 3)), BAD_TENSOR_STRIDES),
    ("F16 data, F32 parameters", base_specs(F16, F32), BAD_TENSOR_DTYPE),
])
def test_seed_create_keeps_its_own_rules(c_handle, description, specs, expected):
    ffi, op, _ = native()
    with CTensorDescriptors(list(specs.values())) as descriptors:
        desc_ptr = ffi.new("infiniopDescriptor_t *")
        assert op.infiniopCreateBatchNormBackwardDescriptor(c_handle, desc_ptr, *descriptors) == expected


def packed_strides(shape, order):
    """Element strides of `shape` packed with its dims in `order` (outermost first)."""
    strides, step = [0] * len(shape), 1
    for dim in reversed(order):
        strides[dim] = step
        step *= shape[dim]
    return tuple(strides)


@st.composite
def ex_layouts(draw):
    """(specs, epsilon, training) for the Ex create: mostly valid layouts of every kind (ranks, channels-last,
    absent tensors, mixed dtypes, saved statistics, eval) with now and then one fault of each kind, so that all
    the rules and every verdict come up."""
    rank = draw(st.integers(2, 5))
    shape = tuple(draw(st.lists(st.integers(1 if draw(st.integers(0, 4)) else 0, 4), min_size=rank, max_size=rank)))
    dtype = draw(st.sampled_from((F32, F16, BF16, F64)))
    parameter_dtype = draw(st.sampled_from((dtype, F32))) if dtype in HALVES else dtype
    order = draw(st.sampled_from((tuple(range(rank)), (0,) + tuple(range(2, rank)) + (1,))))
    big = (shape, dtype, draw(st.sampled_from((None, packed_strides(shape, order)))))
    vector = lambda: ((shape[1],), parameter_dtype, draw(st.sampled_from((None, (1,), (2,), (-1,)))))
    specs = {"grad_input": big, "grad_weight": vector(), "grad_bias": vector(), "input": big, "grad_output": big,
             "weight": vector(), "running_mean": vector(), "running_var": vector()}
    training, epsilon = draw(st.sampled_from((1, 1, 0))), draw(st.sampled_from((0.0, 1e-5)))
    if training and draw(st.booleans()):
        statistic = ((shape[1],), statistic_dtype(dtype), None)
        specs["save_mean"] = specs["save_invstd"] = statistic
        if draw(st.booleans()):
            specs["running_mean"] = specs["running_var"] = None
    for name in draw(st.lists(st.sampled_from(("grad_weight", "grad_bias", "weight")), max_size=3)):
        specs[name] = None

    fault = draw(st.sampled_from(("none",) * 3 + ("null", "param", "dtype", "shape", "strides", "strides")))
    name = draw(st.sampled_from(sorted(specs)))
    if fault == "null":
        specs[name] = None
    elif fault == "param":
        epsilon, training = draw(st.sampled_from(((-1.0, 1), (NAN, 1), (0.0, 0), (0.0, 1))))
        specs[draw(st.sampled_from(("save_mean", "save_invstd")))] = ((shape[1],), F32, None)
    elif fault == "dtype" and specs[name] is not None:
        specs[name] = (specs[name][0], draw(st.sampled_from((F16, F32, F64, np.dtype(np.int32)))), specs[name][2])
    elif fault == "shape" and specs[name] is not None:
        wrong = draw(st.sampled_from((specs[name][0][1:], specs[name][0] + (2,), (shape[0] + 1,) + shape[1:])))
        specs[name] = (wrong, specs[name][1], None)
    elif fault == "strides":  # random strides on a big tensor, or an output vector that overlaps itself
        name = draw(st.sampled_from(("grad_input", "input", "grad_output", "grad_weight", "grad_bias")))
        if specs[name] is not None:
            extents = specs[name][0]
            strides = (0,) if len(extents) == 1 else \
                tuple(draw(st.lists(st.integers(-6, 6), min_size=len(extents), max_size=len(extents))))
            specs[name] = (extents, specs[name][1], strides)
    return specs, epsilon, training


@settings(max_examples=300)
@given(layout=ex_layouts())
def test_python_mirror_agrees_with_c_on_random_layouts(c_handle, layout):
    specs, epsilon, training = layout
    assert python_status(specs, epsilon, training) == batch_norm_ex_create_status(c_handle, specs, epsilon, training)


def test_random_layouts_reach_every_verdict():
    """The agreement test above is only a check if its strategy produces each verdict (a fixed seed: a sample
    that happens to miss one must not fail a run)."""
    seen = set()

    @settings(max_examples=300, database=None, derandomize=True)
    @given(layout=ex_layouts())
    def sample(layout):
        seen.add(python_status(*layout))

    sample()
    assert seen >= {SUCCESS, BAD_PARAM, NULL_POINTER, BAD_TENSOR_DTYPE, BAD_TENSOR_SHAPE, BAD_TENSOR_STRIDES}, seen


# ---------------------------------------------------------------- seed and Ex functions on each other's descriptors

def _descriptor(c_handle, arrays, seed, epsilon=0.0, training=1):
    ffi, op, _ = native()
    names = BATCH_NORM_EX_TENSORS[:8] if seed else BATCH_NORM_EX_TENSORS
    specs = [None if arrays.get(n) is None else (arrays[n].shape, arrays[n].dtype, element_strides(arrays[n]))
             for n in names]
    with CTensorDescriptors(specs) as descriptors:
        pointer = ffi.new("infiniopDescriptor_t *")
        if seed:
            assert op.infiniopCreateBatchNormBackwardDescriptor(c_handle, pointer, *descriptors) == SUCCESS
        else:
            assert op.infiniopCreateBatchNormBackwardDescriptorEx(c_handle, pointer, *descriptors, epsilon,
                                                                  training) == SUCCESS
    size = ffi.new("size_t *")
    assert op.infiniopGetBatchNormBackwardWorkspaceSize(pointer[0], size) == SUCCESS
    return pointer[0], np.empty(max(size[0], 1), np.uint8), size[0]


def _run(descriptor, workspace, size, arrays, seed):
    ffi, op, _ = native()
    names = BATCH_NORM_EX_TENSORS[:8] if seed else BATCH_NORM_EX_TENSORS
    pointers = [ffi.NULL if arrays.get(n) is None else data_pointer(arrays[n]) for n in names]
    run = op.infiniopBatchNormBackward if seed else op.infiniopBatchNormBackwardEx
    return run(descriptor, data_pointer(workspace), size, *pointers, ffi.NULL)


def _seed_arrays(shape=(6, 4, 50)):
    x, grad_output, weight, mean, var = batch_norm_inputs(np.random.default_rng(6), shape, F32)
    return {"grad_input": np.empty_like(x), "grad_weight": np.empty_like(weight), "grad_bias": np.empty_like(weight),
            "input": x, "grad_output": grad_output, "weight": weight, "running_mean": mean, "running_var": var}


def _outputs(arrays):
    return b"".join(arrays[name].tobytes() for name in ("grad_input", "grad_weight", "grad_bias"))


def test_seed_and_ex_run_each_others_descriptors_with_identical_bits(c_handle):
    ffi, op, _ = native()
    arrays = _seed_arrays()
    results = []
    for create_seed in (True, False):
        for run_seed in (True, False):
            descriptor, workspace, size = _descriptor(c_handle, arrays, create_seed)
            for name in ("grad_input", "grad_weight", "grad_bias"):
                arrays[name][...] = np.nan
            assert _run(descriptor, workspace, size, arrays, run_seed) == SUCCESS
            results.append(_outputs(arrays))
            assert op.infiniopDestroyBatchNormBackwardDescriptor(descriptor) == SUCCESS
    assert all(result == results[0] for result in results)


def test_seed_run_of_a_descriptor_with_saved_statistics_is_a_null_pointer(c_handle):
    ffi, op, _ = native()
    arrays = _seed_arrays()
    arrays["save_mean"] = arrays["running_mean"].copy()
    arrays["save_invstd"] = (1 / np.sqrt(arrays["running_var"])).astype(F32)
    descriptor, workspace, size = _descriptor(c_handle, arrays, seed=False)
    try:
        assert _run(descriptor, workspace, size, arrays, seed=True) == NULL_POINTER
        assert _run(descriptor, workspace, size, {**arrays, "save_invstd": None}, seed=False) == NULL_POINTER
        assert _run(descriptor, workspace, size, {**arrays, "running_mean": None, "running_var": None},
                    seed=False) == SUCCESS  # not used when the saved statistics are
        assert _run(descriptor, workspace, size, {**arrays, "weight": None}, seed=False) == NULL_POINTER
    finally:
        assert op.infiniopDestroyBatchNormBackwardDescriptor(descriptor) == SUCCESS


def test_rank_4_channels_first_is_the_seed_on_flattened_spatial_dims():
    x, grad_output, weight, mean, var = batch_norm_inputs(np.random.default_rng(7), (5, 3, 6, 20), F32)
    ours = infiniop_py.batch_norm_backward(x, grad_output, weight, mean, var)
    seed = infiniop_py.batch_norm_backward(x.reshape(5, 3, 120), grad_output.reshape(5, 3, 120), weight, mean, var)
    assert ours[0].tobytes() == seed[0].tobytes() and ours[1].tobytes() == seed[1].tobytes()


# ---------------------------------------------------------------- Python: copies, options, seed-only libraries

def test_functional_copies_refused_layouts_and_the_operator_does_not(cpu_handle):
    problem = Problem(np.random.default_rng(8), (4, 3, 5, 6), F32, eps=1e-5)
    x, grad_output, weight, mean, var = problem.arrays()
    padded = np.full((4, 3, 5, 8), np.nan, F32)[..., 1:7]
    padded[...] = x
    mixed_grad_output = channels_last(grad_output)  # channels-last next to a channels-first grad_input
    grad_input = np.full((4, 3, 5, 12), 7.0, F32)[..., ::2]  # a strided output: computed packed, copied back
    outputs = infiniop_py.batch_norm_backward(padded, mixed_grad_output, weight, mean, var, eps=1e-5,
                                              out=(grad_input, np.empty(3, F32), np.empty(3, F32)))
    problem.check(outputs)
    with pytest.raises(errors.BadTensorStridesError, match="channels-last"):
        infiniop_py.BatchNormBackward(cpu_handle, grad_input, weight, weight, padded, grad_output, weight, mean, var)


def test_operator_class_options(cpu_handle):
    problem = Problem(np.random.default_rng(9), (3, 4, 5, 6), BF16, parameter_dtype=F32, layout="channels_last",
                      saved=True, running=False, affine=False, grad_bias=False)
    x, grad_output, _, _, _ = problem.arrays()
    grad_input, grad_weight = np.empty_like(x), np.empty(4, F32)
    with infiniop_py.BatchNormBackward(cpu_handle, grad_input, grad_weight, None, x, grad_output, None, None, None,
                                       problem.save_mean, problem.save_invstd) as operator:
        operator(grad_input, grad_weight, None, x, grad_output, None, None, None, problem.save_mean,
                 problem.save_invstd)
    problem.check((grad_input, grad_weight, None), fresh=False)


def test_without_ex_entry_points_only_seed_calls_run(monkeypatch, cpu_handle):
    real = _operator._native_function
    monkeypatch.setattr(_operator, "_native_function",
                        lambda library, name: None if name.endswith("Ex") else real(library, name))
    arrays = _seed_arrays()
    seed_arguments = list(arrays.values())
    with infiniop_py.BatchNormBackward(cpu_handle, *seed_arguments) as operator:
        operator(*seed_arguments)
    expected = batch_norm_backward_reference(*(arrays[n] for n in ("input", "grad_output", "weight", "running_mean",
                                                                   "running_var")))
    for name, reference in zip(("grad_input", "grad_weight", "grad_bias"), expected):
        assert_close(arrays[name], reference, F32, name)
    with pytest.raises(errors.NotImplementedStatusError, match="training=0.*DescriptorEx"):
        infiniop_py.BatchNormBackward(cpu_handle, *seed_arguments, training=False)
    with pytest.raises(errors.NotImplementedStatusError, match="weight=None"):
        infiniop_py.BatchNormBackward(cpu_handle, *seed_arguments[:5], None, *seed_arguments[6:])


# ---------------------------------------------------------------- determinism across thread counts

DETERMINISM_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import infiniop_py
from test_batch_norm_backward_ex import determinism_problems

outputs = []
for problem in determinism_problems():
    outputs += [o for o in infiniop_py.batch_norm_backward(*problem.arrays(), **problem.keywords()) if o is not None]
sys.stdout.buffer.write(b"".join(np.ascontiguousarray(o).tobytes() for o in outputs))
"""


def determinism_problems():
    """Shapes that split into many tiles, on each new path."""
    rng = np.random.default_rng
    return [
        Problem(rng(1), (64, 24, 16, 8), F32, layout="channels_last", eps=1e-5),
        Problem(rng(2), (64, 3, 16, 16), BF16, parameter_dtype=F32, layout="channels_last", saved=True),
        Problem(rng(3), (40, 1001, 3), F32, layout="channels_last", training=False),
        Problem(rng(4), (20000, 24), F16, parameter_dtype=F32),
        Problem(rng(5), (48, 6, 700), F16, parameter_dtype=F32, saved=True, affine=False),
        Problem(rng(6), (48, 6, 700), F64, eps=1e-3),
        Problem(rng(7), (16, 12, 20, 20), F64, layout="channels_last", training=False),
        Problem(rng(8), (3000, 7, 9), BF16, parameter_dtype=F32),  # channels-first runs shorter than a vector
    ]


def test_new_paths_give_identical_bits_with_one_and_two_threads():
    tests = os.path.dirname(os.path.abspath(__file__))
    results = [subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT, tests], check=True, capture_output=True,
                              env=dict(os.environ, OMP_NUM_THREADS=str(threads)), timeout=300).stdout
               for threads in (1, 2)]
    assert len(results[0]) > 0
    assert results[0] == results[1]
