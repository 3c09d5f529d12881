"""Operator objects run plain numpy arrays of their created layouts without converting or checking them again
(Operator._run_plain): the fast path is really taken, gives the bits of the checked path, and every misuse the
checks refuse is still refused with the checked path's error, naming the tensor."""

import ml_dtypes
import numpy as np
import pytest

import infiniop_py as ip
from infiniop_py import _operator, reference
from infiniop_py.errors import (BadParamError, BadTensorDtypeError, BadTensorShapeError, BadTensorStridesError,
                                ClosedError, InsufficientWorkspaceError)


def _rms(seed, dtype=np.float32, grad_w=True, rstd=False):
    inputs = reference.make_rms_norm_inputs((6, 40), dtype, np.random.default_rng(seed))
    saved = None
    if rstd:
        x64 = inputs["x"].astype(np.float64)
        saved = (1 / np.sqrt((x64 ** 2).mean(-1) + 1e-5)).astype(np.float32)
    outputs = [np.empty_like(inputs["grad_y"]), np.empty_like(inputs["w"]) if grad_w else None]
    return ip.RMSNormBackward, [*outputs, *inputs.values(), saved]


def _layer(seed, dtype=np.float32):
    inputs = reference.make_layer_norm_inputs((3, 4, 16), dtype, np.random.default_rng(seed))
    grad_output, weight = inputs["grad_output"], inputs["weight"]
    return ip.LayerNormBackward, [np.empty_like(grad_output), np.empty_like(weight), np.empty_like(weight),
                                  *inputs.values()]


def _batch(seed, dtype=np.float32, saved=False):
    inputs = reference.make_batch_norm_inputs((4, 3, 10), dtype, np.random.default_rng(seed))
    save_mean = save_invstd = None
    if saved:
        save_mean = inputs["running_mean"]
        save_invstd = (1 / np.sqrt(inputs["running_var"].astype(np.float64) + 1e-5)).astype(np.float32)
        inputs["running_mean"] = inputs["running_var"] = None
    weight = inputs["weight"]
    return ip.BatchNormBackward, [np.empty_like(inputs["input"]), np.empty_like(weight), np.empty_like(weight),
                                  *inputs.values(), save_mean, save_invstd]


CASES = {  # id -> seed -> (operator class, its arrays in call order, None where absent)
    "rms": _rms,
    "rms-bf16": lambda seed: _rms(seed, ml_dtypes.bfloat16),
    "rms-no-grad-w-rstd": lambda seed: _rms(seed, grad_w=False, rstd=True),
    "layer": _layer,
    "layer-f16": lambda seed: _layer(seed, np.float16),
    "batch": _batch,
    "batch-saved": lambda seed: _batch(seed, saved=True),
}


def _checked_view(array):
    # A numpy subclass: same memory, but not a plain np.ndarray, so the object takes its checked path.
    return None if array is None else array.view(np.memmap)


def _refuse_the_checked_path(monkeypatch):
    def checked_path(*args, **kwargs):
        raise AssertionError("a call on plain numpy arrays of the created layout took the checked path")

    monkeypatch.setattr(_operator, "as_tensor", checked_path)


@pytest.mark.parametrize("with_workspace", [False, True], ids=["own-workspace", "workspace"])
@pytest.mark.parametrize("case", CASES)
def test_plain_arrays_skip_the_checked_path_and_match_it(case, with_workspace, monkeypatch):
    operator_class, arrays = CASES[case](seed=1)
    _, other = CASES[case](seed=2)
    outputs = len(operator_class._outputs)  # the leading arrays
    with ip.Handle("cpu") as handle, operator_class(handle, *arrays) as operator:
        workspace = np.empty(operator.workspace_size, np.uint8) if with_workspace else None
        operator(*map(_checked_view, other), workspace=workspace)  # checked: the expected bits
        expected = [None if array is None else array.copy() for array in other[:outputs]]
        operator(*arrays, workspace=workspace)  # other data: results that must all be overwritten below
        first = [None if array is None else array.copy() for array in arrays[:outputs]]
        _refuse_the_checked_path(monkeypatch)
        operator(*other, workspace=workspace)
    for got, want, old in zip(other[:outputs], expected, first):
        if got is not None:
            assert np.array_equal(got, want, equal_nan=True)
            if got.dtype.kind == "f" and got.size > 8:  # an output of the data, not a constant
                assert not np.array_equal(got, old)


def test_in_place_run_takes_the_fast_path(monkeypatch):
    _, (grad_x, grad_w, grad_y, x, w, _) = _rms(seed=3)
    out_of_place = [np.empty_like(grad_y), np.empty_like(w)]
    with ip.Handle("cpu") as handle, ip.RMSNormBackward(handle, grad_x, grad_w, grad_y, x, w) as operator:
        _refuse_the_checked_path(monkeypatch)
        operator(*out_of_place, grad_y, x, w)
        operator(grad_y, grad_w, grad_y, x, w)  # grad_x is grad_y: the one pair allowed to share memory
    assert np.array_equal(grad_y, out_of_place[0]) and np.array_equal(grad_w, out_of_place[1])


def _read_only(arrays):
    arrays[0].flags.writeable = False
    return arrays


def _retyped(arrays):
    arrays[2] = arrays[2].astype(np.float64)
    return arrays


def _reshaped(arrays):
    arrays[3] = arrays[3].reshape(40, 6).copy()
    return arrays


def _overlapping(arrays):
    arrays[0] = arrays[3]  # grad_x is x: outputs must not share memory with another tensor
    return arrays


def _strided(arrays):
    padded = np.zeros((6, 48), np.float32)
    padded[:, :40] = arrays[2]
    arrays[2] = padded[:, :40]  # the created shape and dtype, not its strides
    return arrays


def _unexpected(arrays):
    arrays[5] = np.ones(6, np.float32)  # rstd, which the object was created without
    return arrays


MISUSES = {  # id -> (change to the RMSNorm call's arrays, error, message)
    "read-only-output": (_read_only, ValueError, "grad_x"),
    "dtype": (_retyped, BadTensorDtypeError, "grad_y: dtype F64, but the operator was created for F32"),
    "shape": (_reshaped, BadTensorShapeError, r"x: shape \(40, 6\)"),
    "overlap": (_overlapping, BadParamError, "grad_x: overlaps x"),
    "strides": (_strided, BadTensorStridesError, "grad_y: strides"),
    "absent-tensor-given": (_unexpected, ValueError, "rstd: the operator was created without it"),
}


@pytest.mark.parametrize("misuse", MISUSES)
def test_misuse_of_a_plain_layout_gets_the_checked_error(misuse):
    change, error, message = MISUSES[misuse]
    _, arrays = _rms(seed=4)
    with ip.Handle("cpu") as handle, ip.RMSNormBackward(handle, *arrays[:5]) as operator:
        operator(*arrays[:5])  # the plain arrays run
        with pytest.raises(error, match=message):
            operator(*change(list(arrays)))


@pytest.mark.parametrize("workspace_of", [
    lambda size, x: (np.empty(size - 1, np.uint8), InsufficientWorkspaceError, "workspace_size"),
    lambda size, x: (x.base.view(np.uint8), BadParamError, "workspace: overlaps x"),
    lambda size, x: (np.empty(2 * size, np.uint8)[::2], BadTensorStridesError, "workspace: must be contiguous"),
], ids=["too-small", "overlapping", "strided"])
def test_bad_workspace_gets_the_checked_error(workspace_of):
    _, arrays = _rms(seed=5)
    with ip.Handle("cpu") as handle, ip.RMSNormBackward(handle, *arrays[:5]) as operator:
        room = np.empty(operator.workspace_size + arrays[3].size, np.float32)
        room[:arrays[3].size] = arrays[3].reshape(-1)
        arrays[3] = room[:arrays[3].size].reshape(arrays[3].shape)  # x at the start of a workspace-sized buffer
        workspace, error, message = workspace_of(operator.workspace_size, arrays[3])
        with pytest.raises(error, match=message):
            operator(*arrays[:5], workspace=workspace)


def test_closed_object_refuses_plain_arrays():
    _, arrays = _rms(seed=6)
    with ip.Handle("cpu") as handle:
        operator = ip.RMSNormBackward(handle, *arrays[:5])
        operator.close()
        with pytest.raises(ClosedError):
            operator(*arrays[:5])


def test_object_made_for_a_strided_layout_checks_every_call(monkeypatch):
    _, arrays = _rms(seed=7)
    padded = np.zeros((6, 48), np.float32)
    padded[:, :40] = arrays[2]
    arrays[2] = padded[:, :40]
    expected = ip.rms_norm_backward(np.ascontiguousarray(arrays[2]), arrays[3], arrays[4])
    checked, as_tensor = [], _operator.as_tensor

    def counted_as_tensor(*args, **kwargs):
        checked.append(args[1])
        return as_tensor(*args, **kwargs)

    monkeypatch.setattr(_operator, "as_tensor", counted_as_tensor)
    with ip.Handle("cpu") as handle, ip.RMSNormBackward(handle, *arrays[:5]) as operator:
        operator(*arrays[:5])
    assert "grad_y" in checked
    assert np.array_equal(arrays[0], expected[0]) and np.array_equal(arrays[1], expected[1])


def _torch_of(array):
    """A torch CPU tensor on the array's memory (numpy cannot hand bfloat16 over, so its bits go as int16)."""
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    if array is None:
        return None
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


@pytest.mark.parametrize("case", ["rms", "rms-bf16", "rms-no-grad-w-rstd", "layer-f16", "batch-saved"])
def test_torch_tensors_skip_the_checked_path_and_match_it(case, monkeypatch):
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    operator_class, arrays = CASES[case](seed=1)
    _, other = CASES[case](seed=2)
    outputs = len(operator_class._outputs)  # the leading arrays
    with ip.Handle("cpu") as handle, operator_class(handle, *arrays) as operator:
        operator(*map(_checked_view, other))  # numpy, checked: the expected bits
        expected = [None if array is None else array.copy() for array in other[:outputs]]
        tensors = [_torch_of(array) for array in arrays]
        operator(*tensors)  # other data, in the memory the call below must overwrite
        first = [None if array is None else array.copy() for array in arrays[:outputs]]
        for index, tensor in enumerate(tensors):  # the same memory, now holding `other`'s inputs
            if tensor is not None and index >= outputs:
                tensor.copy_(_torch_of(other[index]))
        if case == "rms":
            tensors[4] = torch.nn.Parameter(tensors[4], requires_grad=False)  # a weight as a model holds it
        _refuse_the_checked_path(monkeypatch)
        operator(*tensors)
    for got, want, old in zip(arrays[:outputs], expected, first):
        if got is not None:
            assert np.array_equal(got, want, equal_nan=True)
            if got.size > 8:
                assert not np.array_equal(got, old)


def _transposed(tensors):
    tensors[3] = tensors[3].t().contiguous().t()  # x's shape and dtype, column-major
    return tensors


def _mixed(tensors):
    tensors[2] = tensors[2].numpy()  # a numpy grad_y among torch tensors: checked, and fine
    return tensors


TORCH_MISUSES = {  # id -> (change to the RMSNorm call's tensors, error or None, message)
    "strides": (_transposed, BadTensorStridesError, "x: strides"),
    "dtype": (lambda tensors: [*tensors[:2], tensors[2].double(), *tensors[3:]], BadTensorDtypeError,
              "grad_y: dtype F64"),
    "overlap": (lambda tensors: [tensors[3], *tensors[1:]], BadParamError, "grad_x: overlaps x"),
    "mixed-with-numpy": (_mixed, None, None),
}


@pytest.mark.parametrize("misuse", TORCH_MISUSES)
def test_torch_tensors_off_the_plain_layout_take_the_checked_path(misuse):
    change, error, message = TORCH_MISUSES[misuse]
    _, arrays = _rms(seed=8)
    expected = ip.rms_norm_backward(*arrays[2:5])
    tensors = [_torch_of(array) for array in arrays[:5]]
    with ip.Handle("cpu") as handle, ip.RMSNormBackward(handle, *arrays[:5]) as operator:
        if error is None:
            operator(*change(tensors))
            assert np.array_equal(arrays[0], expected[0]) and np.array_equal(arrays[1], expected[1])
        else:
            with pytest.raises(error, match=message):
                operator(*change(tensors))
