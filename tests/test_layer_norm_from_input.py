"""LayerNorm backward from the forward's input, mean and rstd (issue 23: infiniopCreateLayerNormBackwardFromInput-
DescriptorEx, LayerNormBackwardFromInput, layer_norm_backward(..., input=, mean=, rstd=)) against float64 references
of the exact rounded inputs and against torch's native_layer_norm_backward, on every device; its statuses, and its
refusal of the xhat form's descriptors (and theirs of its)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import infiniop_py
from infiniop_py import _layout, _operator, errors
from _devices import DEVICES, call_on
from _helpers import (BAD_PARAM, BAD_TENSOR_DTYPE, BAD_TENSOR_SHAPE, BAD_TENSOR_STRIDES, BF16, F16, F32, F64,
                      FREE_LAYOUTS, INPUT_ROW_LAYOUTS, LAYER_NORM_EPS, NULL_POINTER, ROW_LAYOUTS, SUCCESS,
                      CTensorDescriptors, assert_close, assert_close_on_scale, f64, layer_norm_reference, native,
                      rounded, with_free_layout, with_row_layout)

ALL_DTYPES = (F32, F16, BF16, F64)


def statistic_dtype(dtype):
    return F64 if np.dtype(dtype) == F64 else F32


def from_input_inputs(rng, shape, k, dtype, parameter_dtype=None):
    """(grad_output, weight, input, mean, rstd): input with a per-row offset and scale (so that a missing mean
    subtraction shows), its statistics over the last k dims (eps 1e-5) rounded to the statistics dtype."""
    leading = len(shape) - k
    axes = tuple(range(leading, len(shape)))
    per_row = shape[:leading] + (1,) * k
    x = rounded(rng.standard_normal(shape) * rng.uniform(0.5, 3.0, per_row) + rng.uniform(-4, 4, per_row), dtype)
    if x.size:
        mean, rstd = f64(x).mean(axes), 1.0 / np.sqrt(f64(x).var(axes) + LAYER_NORM_EPS)
    else:
        mean, rstd = np.zeros(shape[:leading]), np.ones(shape[:leading])
    return (rounded(rng.standard_normal(shape), dtype),
            rounded(rng.normal(1.0, 0.5, shape[leading:]), parameter_dtype or dtype), x,
            rounded(mean, statistic_dtype(dtype)), rounded(rstd, statistic_dtype(dtype)))


def from_input_reference(grad_output, weight, input, mean, rstd):
    """The xhat form's float64 reference at xhat = (input - mean) * rstd and std = 1 / rstd."""
    mean, rstd = f64(mean), f64(rstd)
    expand = (...,) + (None,) * (np.ndim(input) - mean.ndim)
    return layer_norm_reference(grad_output, weight, (f64(input) - mean[expand]) * rstd[expand], 1.0 / rstd)


def assert_matches(outputs, inputs, dtype, parameter_dtype=None, wanted=(True, True, True)):
    """Each wanted output within its dtype's bound; grad_input judged on the size of g, which cancels in it."""
    expected = from_input_reference(*inputs)
    grad_output, weight = f64(inputs[0]), inputs[1]
    g = grad_output if weight is None else grad_output * f64(weight)
    scale = float(np.max(np.abs(g * f64(inputs[4]).reshape(inputs[4].shape + (1,) * (g.ndim - inputs[4].ndim)))))
    kinds = (dtype, parameter_dtype or dtype, parameter_dtype or dtype)
    for name, want, actual, reference, kind in zip(("grad_input", "grad_weight", "grad_bias"), wanted, outputs,
                                                   expected, kinds):
        if not want:
            assert actual is None, name
            continue
        assert actual.shape == reference.shape and actual.dtype == kind, (name, actual.shape, actual.dtype)
        if name == "grad_input" and reference.size:
            assert_close_on_scale(actual, reference, dtype, max(float(np.max(np.abs(reference))), scale), name)
        else:
            assert_close(actual, reference, kind, name)


def run_from_input(device, grad_output, weight, input, mean, rstd, **keywords):
    return call_on(device, infiniop_py.layer_norm_backward, grad_output, weight, input=input, mean=mean, rstd=rstd,
                   **keywords)


# ---------------------------------------------------------------- numerics

@pytest.mark.parametrize("device", DEVICES)
@given(lead=st.one_of(st.tuples(st.integers(1, 9)), st.tuples(st.integers(1, 4), st.integers(1, 5))),
       length=st.sampled_from([3, 8, 31, 129, 1000]), dtype=st.sampled_from(ALL_DTYPES),
       seed=st.integers(0, 2**32 - 1), grad_output_layout=st.sampled_from(INPUT_ROW_LAYOUTS),
       input_layout=st.sampled_from(INPUT_ROW_LAYOUTS), weight_layout=st.sampled_from(FREE_LAYOUTS),
       mean_layout=st.sampled_from(FREE_LAYOUTS), rstd_layout=st.sampled_from(FREE_LAYOUTS))
@example(lead=(3, 2), length=31, dtype=F16, seed=0, grad_output_layout="reversed", input_layout="padded",
         weight_layout="reversed", mean_layout="reversed", rstd_layout="stride2")
# Row 0's statistics broadcast to every row: exact F16 grad_input values up to 1.2e5, which round to -inf.
@example(lead=(8,), length=3, dtype=F16, seed=8, grad_output_layout="contiguous", input_layout="contiguous",
         weight_layout="broadcast", mean_layout="broadcast", rstd_layout="broadcast")
def test_strided_inputs_match_reference(device, lead, length, dtype, seed, grad_output_layout, input_layout,
                                        weight_layout, mean_layout, rstd_layout):
    grad_output, weight, x, mean, rstd = from_input_inputs(np.random.default_rng(seed), lead + (length,), 1, dtype)
    inputs = (with_row_layout(grad_output, grad_output_layout), with_free_layout(weight, weight_layout),
              with_row_layout(x, input_layout), with_free_layout(mean, mean_layout),
              with_free_layout(rstd, rstd_layout))
    assert_matches(run_from_input(device, *inputs), inputs, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", (F32, BF16, F64), ids=str)
@pytest.mark.parametrize("with_weight", (True, False))
@pytest.mark.parametrize("wanted", ((True, True), (True, False), (False, True), (False, False)))
def test_optional_weight_and_outputs(device, dtype, with_weight, wanted):
    grad_output, weight, x, mean, rstd = from_input_inputs(np.random.default_rng(1), (5, 7, 40), 1, dtype)
    inputs = (grad_output, weight if with_weight else None, x, mean, rstd)
    outputs = run_from_input(device, *inputs, need_grad_weight=wanted[0], need_grad_bias=wanted[1])
    assert_matches(outputs, inputs, dtype, wanted=(True,) + wanted)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", (F16, BF16), ids=str)
def test_f32_parameters_with_half_data(device, dtype):
    inputs = from_input_inputs(np.random.default_rng(2), (16, 96), 1, dtype, F32)
    assert_matches(run_from_input(device, *inputs), inputs, dtype, F32)


@pytest.mark.parametrize("device", DEVICES)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=8).map(tuple), data=st.data())
def test_any_rank_and_normalized_dims(device, shape, data):
    k = data.draw(st.integers(1, len(shape)))
    dtype = data.draw(st.sampled_from((F64, F32)))
    inputs = from_input_inputs(np.random.default_rng(k), shape, k, dtype)
    assert_matches(run_from_input(device, *inputs), inputs, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", (F32, F16, BF16), ids=str)
@pytest.mark.parametrize("shape", ((4, 8192), (2, 70001), (600, 4096 + 5)), ids=str)
def test_long_rows(device, dtype, shape):
    """On the CPU: rows of several chunks, rows split among threads by chunks, and (inputs over 8 MiB) rows reduced
    alongside the previous one's pass, whose partials take two rows' terms."""
    inputs = from_input_inputs(np.random.default_rng(3), shape, 1, dtype)
    assert_matches(run_from_input(device, *inputs), inputs, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", (F32, BF16), ids=str)
@pytest.mark.parametrize("layout", ROW_LAYOUTS)
def test_in_place_grad_input_is_grad_output(device, dtype, layout):
    grad_output, weight, x, mean, rstd = from_input_inputs(np.random.default_rng(4), (5, 6, 80), 1, dtype)
    grad_output = with_row_layout(grad_output, layout)
    original = grad_output.copy()
    grad_weight, grad_bias = np.empty(80, dtype), np.empty(80, dtype)
    run_from_input(device, grad_output, weight, x, mean, rstd, out=(grad_output, grad_weight, grad_bias))
    assert_matches((grad_output, grad_weight, grad_bias), (original, weight, x, mean, rstd), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", ((0, 16), (3, 0)), ids=str)
def test_empty(device, shape):
    grad_weight, grad_bias = np.full(shape[1], -1.0, F32), np.full(shape[1], -1.0, F32)
    inputs = from_input_inputs(np.random.default_rng(5), shape, 1, F32)
    grad_input, _, _ = run_from_input(device, *inputs, out=(np.empty(shape, F32), grad_weight, grad_bias))
    assert grad_input.shape == shape and not grad_weight.any() and not grad_bias.any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_weight", (True, False))
@pytest.mark.parametrize("k", (1, 2))
def test_matches_torch_native_layer_norm_backward(device, with_weight, k):
    """The call the PyTorch integration makes: torch tensors, mean/rstd float32 of shape x.shape[:s]."""
    rng = np.random.default_rng(6)
    shape = (4, 3, 5, 64)
    normalized = list(shape[len(shape) - k:])
    grad_output, weight, x, mean, rstd = (torch.from_numpy(a) for a in from_input_inputs(rng, shape, k, F32))
    keep = (1,) * k
    expected = torch.ops.aten.native_layer_norm_backward(
        grad_output, x, normalized, mean.reshape(mean.shape + keep), rstd.reshape(rstd.shape + keep),
        weight if with_weight else None, torch.zeros(normalized) if with_weight else None,
        [True, with_weight, with_weight])
    if device == "cpu":
        ours = infiniop_py.layer_norm_backward(grad_output, weight if with_weight else None, input=x, mean=mean,
                                               rstd=rstd, need_grad_weight=with_weight, need_grad_bias=with_weight)
        assert all(isinstance(o, torch.Tensor) for o in ours if o is not None)
        ours = [None if o is None else o.numpy() for o in ours]
    else:
        ours = run_from_input(device, grad_output.numpy(), weight.numpy() if with_weight else None, x.numpy(),
                              mean.numpy(), rstd.numpy(), need_grad_weight=with_weight, need_grad_bias=with_weight)
    for name, actual, reference in zip(("grad_input", "grad_weight", "grad_bias"), ours, expected):
        if reference is None:
            assert actual is None
        else:
            assert_close(actual, reference.numpy(), F32, name)


def test_operator_object_and_its_fast_path():
    inputs = from_input_inputs(np.random.default_rng(7), (6, 48), 1, F32)
    grad_output, weight, x, mean, rstd = inputs
    outputs = [np.empty_like(grad_output), np.empty_like(weight), np.empty_like(weight)]
    with infiniop_py.Handle("cpu") as handle, \
            infiniop_py.LayerNormBackwardFromInput(handle, *outputs, grad_output, weight, x, mean, rstd) as op:
        assert op._plain_key is not None and list(op.layouts) == ["grad_input", "grad_weight", "grad_bias",
                                                                  "grad_output", "weight", "input", "mean", "rstd"]
        for _ in range(2):  # the checked call, then the plain one
            op(*outputs, grad_output, weight, x, mean, rstd)
            assert_matches(outputs, inputs, F32)
        with pytest.raises(errors.BadTensorShapeError, match="mean"):
            op(*outputs, grad_output, weight, x, mean[:3], rstd)
    with pytest.raises(errors.ClosedError):
        op(*outputs, grad_output, weight, x, mean, rstd)


# ---------------------------------------------------------------- determinism across thread counts

DETERMINISM_SCRIPT = """
import sys
import numpy as np, ml_dtypes
import infiniop_py

data = np.load(sys.argv[1])
outputs = []
for name in ("blocks", "long", "columns"):
    arrays = [data[f"{name}_{i}"] for i in range(5)]
    if name == "long":
        arrays = [a.view(ml_dtypes.bfloat16) if a.dtype == np.uint16 else a for a in arrays]
    outputs += infiniop_py.layer_norm_backward(arrays[0], arrays[1], input=arrays[2], mean=arrays[3], rstd=arrays[4])
sys.stdout.buffer.write(b"".join(np.ascontiguousarray(o).tobytes() for o in outputs))
"""


def test_identical_bits_on_one_two_and_three_threads(tmp_path):
    rng = np.random.default_rng(8)
    cases = {"blocks": from_input_inputs(rng, (2100, 96), 1, F32),       # whole row blocks per thread
             "long": from_input_inputs(rng, (3, 1 << 20), 1, BF16, F32),  # split by chunks, reduced alongside
             "columns": from_input_inputs(rng, (48, 520), 1, F64)}      # cached: threads over column slices
    arrays = {f"{name}_{i}": a.view(np.uint16) if a.dtype == BF16 else a
              for name, inputs in cases.items() for i, a in enumerate(inputs)}
    path = tmp_path / "inputs.npz"
    np.savez(path, **arrays)
    script = tmp_path / "run.py"
    script.write_text(DETERMINISM_SCRIPT)
    results = {threads: subprocess.run([sys.executable, str(script), str(path)], check=True, capture_output=True,
                                       env={**os.environ, "OMP_NUM_THREADS": str(threads)}).stdout
               for threads in (1, 2, 3)}
    assert results[1] and results[1] == results[2] == results[3]


# ---------------------------------------------------------------- statuses, in C and in the Python mirror

SHAPE, NORMALIZED = (3, 4, 8), (4, 8)
NAMES = ("grad_input", "grad_weight", "grad_bias", "grad_output", "weight", "input", "mean", "rstd")


def specs(dtype=F32, **changes):
    parameter = dtype
    base = {"grad_input": (SHAPE, dtype, None), "grad_weight": (NORMALIZED, parameter, None),
            "grad_bias": (NORMALIZED, parameter, None), "grad_output": (SHAPE, dtype, None),
            "weight": (NORMALIZED, parameter, None), "input": (SHAPE, dtype, None),
            "mean": ((3,), statistic_dtype(dtype), None), "rstd": ((3,), statistic_dtype(dtype), None)}
    base.update(changes)
    return list(base.values())


STATUS_CASES = [
    ("layout of the xhat form", specs(), SUCCESS),
    ("no weight nor gradients", specs(grad_weight=None, grad_bias=None, weight=None), SUCCESS),
    ("F16 data, F32 parameters and statistics",
     specs(F16, grad_weight=(NORMALIZED, F32, None), grad_bias=(NORMALIZED, F32, None), weight=(NORMALIZED, F32, None)),
     SUCCESS),
    ("F64", specs(F64), SUCCESS),
    ("rank 1", specs(grad_input=((8,), F32, None), grad_output=((8,), F32, None), input=((8,), F32, None),
                     mean=((), F32, None), rstd=((), F32, None), grad_weight=((8,), F32, None),
                     grad_bias=((8,), F32, None), weight=((8,), F32, None)), SUCCESS),
    ("strided leading dims and statistics", specs(input=(SHAPE, F32, (-64, 8, 1)), mean=((3,), F32, (-2,)),
                                                  rstd=((3,), F32, (0,))), SUCCESS),
    ("NULL input", specs(input=None), NULL_POINTER),
    ("NULL mean", specs(mean=None), NULL_POINTER),
    ("NULL rstd", specs(rstd=None), NULL_POINTER),
    ("F16 mean", specs(mean=((3,), F16, None)), BAD_TENSOR_DTYPE),
    ("F64 rstd for F32 data", specs(rstd=((3,), F64, None)), BAD_TENSOR_DTYPE),
    ("F32 mean for F64 data", specs(F64, mean=((3,), F32, None)), BAD_TENSOR_DTYPE),
    ("BF16 statistics for BF16 data", specs(BF16, mean=((3,), BF16, None), rstd=((3,), BF16, None)),
     BAD_TENSOR_DTYPE),
    ("F16 input with F32 data", specs(input=(SHAPE, F16, None)), BAD_TENSOR_DTYPE),
    ("mean of the wrong shape", specs(mean=((4,), F32, None)), BAD_TENSOR_SHAPE),
    ("rstd of another rank", specs(rstd=((3, 4), F32, None)), BAD_TENSOR_SHAPE),
    ("mean of grad_input's rank", specs(mean=(SHAPE, F32, None), rstd=(SHAPE, F32, None)), BAD_TENSOR_SHAPE),
    ("input of another shape", specs(input=((3, 4, 9), F32, None)), BAD_TENSOR_SHAPE),
    ("input's normalized dims not packed", specs(input=(SHAPE, F32, (32, 1, 4))), BAD_TENSOR_STRIDES),
    ("input's last stride 2", specs(input=(SHAPE, F32, (64, 16, 2))), BAD_TENSOR_STRIDES),
    ("grad_bias overlapping itself", specs(grad_bias=(NORMALIZED, F32, (0, 1))), BAD_TENSOR_STRIDES),
]


def c_create(c_handle, specs_in_order, name="LayerNormBackwardFromInput"):
    """(status, descriptor or None) of infiniopCreate<name>DescriptorEx."""
    ffi, op, _ = native()
    with CTensorDescriptors(specs_in_order) as descriptors:
        desc_ptr = ffi.new("infiniopDescriptor_t *")
        status = getattr(op, f"infiniopCreate{name}DescriptorEx")(c_handle, desc_ptr, *descriptors)
    return status, desc_ptr[0] if status == SUCCESS else None


def python_status(specs_in_order):
    python_specs = {name: None if s is None else _layout.TensorSpec(s[0], infiniop_py.dtypes.code_of(s[1]), s[2])
                    for name, s in zip(NAMES, specs_in_order)}
    return _layout.status_of(_layout.check_layer_norm_backward_from_input_ex, **python_specs)


@pytest.mark.parametrize("description, specs_in_order, expected", STATUS_CASES, ids=[c[0] for c in STATUS_CASES])
def test_statuses_in_c_and_python(c_handle, description, specs_in_order, expected):
    status, desc = c_create(c_handle, specs_in_order)
    if desc is not None:
        assert native()[1].infiniopDestroyLayerNormBackwardDescriptor(desc) == SUCCESS
    assert status == expected
    assert python_status(specs_in_order) == expected


@pytest.mark.parametrize("name, value, error", [
    ("mean", np.zeros(6, np.float16), errors.BadTensorDtypeError),
    ("rstd", np.ones(6, np.float64), errors.BadTensorDtypeError),
    ("mean", np.zeros(5, np.float32), errors.BadTensorShapeError),
    ("rstd", np.ones((6, 1), np.float32), errors.BadTensorShapeError),
    ("input", np.zeros((6, 16), np.float16), errors.BadTensorDtypeError),
    ("input", np.zeros((6, 15), np.float32), errors.BadTensorShapeError),
])
def test_python_errors_name_the_argument(name, value, error):
    arguments = dict(zip(("grad_output", "weight", "input", "mean", "rstd"),
                         from_input_inputs(np.random.default_rng(9), (6, 16), 1, F32)))
    arguments[name] = value
    with pytest.raises(error, match=rf"^{name}: "):
        infiniop_py.layer_norm_backward(arguments.pop("grad_output"), arguments.pop("weight"), **arguments)


def test_operator_object_refuses_strides_naming_the_argument():
    grad_output, weight, x, mean, rstd = from_input_inputs(np.random.default_rng(10), (6, 16), 1, F32)
    with infiniop_py.Handle("cpu") as handle:
        with pytest.raises(errors.BadTensorStridesError, match="^input: "):
            infiniop_py.LayerNormBackwardFromInput(handle, np.empty_like(x), None, None, grad_output, weight,
                                                   np.asfortranarray(x), mean, rstd)


@pytest.mark.parametrize("given_names", [
    ("input_standardization", "input", "mean", "rstd"), ("input", "mean"), ("mean", "rstd"),
    ("input_standardization",), ("input_std_deviation", "rstd"), (),
])
def test_functional_form_must_be_one_whole_form(given_names):
    grad_output, weight, x, mean, rstd = from_input_inputs(np.random.default_rng(11), (6, 16), 1, F32)
    values = {"input_standardization": x, "input_std_deviation": rstd, "input": x, "mean": mean, "rstd": rstd}
    with pytest.raises(TypeError, match="input_standardization and input_std_deviation .* input=, mean= and rstd="
                                        + "".join(f".*{name}" for name in given_names)):
        infiniop_py.layer_norm_backward(grad_output, weight, **{name: values[name] for name in given_names})


def test_each_run_refuses_the_other_forms_descriptor(c_handle):
    """BAD_PARAM with nothing written, whichever way round; the same arguments then run with the right pair."""
    ffi, op, _ = native()
    grad_output, weight, x, mean, rstd = from_input_inputs(np.random.default_rng(12), SHAPE, 2, F32)
    outputs = [np.full(SHAPE, 7.0, F32), np.full(NORMALIZED, 7.0, F32), np.full(NORMALIZED, 7.0, F32)]
    out, inputs = [ffi.from_buffer(a) for a in outputs], [ffi.from_buffer(a) for a in (grad_output, weight, x)]
    mean_pointer, rstd_pointer = ffi.from_buffer(mean), ffi.from_buffer(rstd)
    from_input = c_create(c_handle, specs())[1]
    xhat = c_create(c_handle, specs()[:6] + [((3,), F32, None)], "LayerNormBackward")[1]

    def workspace_of(desc):
        size = ffi.new("size_t *")
        assert op.infiniopGetLayerNormBackwardWorkspaceSize(desc, size) == SUCCESS
        return ffi.new("char[]", max(int(size[0]), 1)), int(size[0])

    try:
        assert op.infiniopLayerNormBackward(from_input, *workspace_of(from_input), *out, *inputs, rstd_pointer,
                                            ffi.NULL) == BAD_PARAM
        assert op.infiniopLayerNormBackwardFromInputEx(xhat, *workspace_of(xhat), *out, *inputs, mean_pointer,
                                                       rstd_pointer, ffi.NULL) == BAD_PARAM
        assert all((a == 7.0).all() for a in outputs)
        assert op.infiniopLayerNormBackwardFromInputEx(from_input, *workspace_of(from_input), *out, *inputs,
                                                       mean_pointer, rstd_pointer, ffi.NULL) == SUCCESS
        assert_matches(outputs, (grad_output, weight, x, mean, rstd), F32)
    finally:
        assert op.infiniopDestroyLayerNormBackwardDescriptor(from_input) == SUCCESS
        assert op.infiniopDestroyLayerNormBackwardDescriptor(xhat) == SUCCESS


def test_without_the_entry_point_the_error_names_it(monkeypatch):
    real = _operator._native_function
    monkeypatch.setattr(_operator, "_native_function",
                        lambda library, name: None if name.endswith("Ex") else real(library, name))
    grad_output, weight, x, mean, rstd = from_input_inputs(np.random.default_rng(13), (4, 8), 1, F32)
    with infiniop_py.Handle("cpu") as handle:
        with pytest.raises(errors.NotImplementedStatusError, match="infiniopCreateLayerNormBackwardFromInputDescriptorEx"):
            infiniop_py.LayerNormBackwardFromInput(handle, np.empty_like(x), np.empty_like(weight),
                                                   np.empty_like(weight), grad_output, weight, x, mean, rstd)
