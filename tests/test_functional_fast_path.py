"""The functional API's numpy fast path (a layout seen before skips straight to the native run, _known_layouts)
is really taken for a known layout, gives the same results as the first, fully checked call, and still refuses
what the checks refuse."""

import numpy as np
import pytest

import infiniop_py as ip
from infiniop_py import _functional, _known_layouts, reference


def random_rms_inputs(rows, dim, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, dim)).astype(np.float32), rng.standard_normal((rows, dim)).astype(np.float32),
            rng.standard_normal(dim).astype(np.float32))


def _rms(seed, **options):
    inputs = reference.make_rms_norm_inputs((5, 24), np.float32, np.random.default_rng(seed))
    return ip.rms_norm_backward, list(inputs.values()), options


def _rms_with_rstd(seed):
    function, (grad_y, x, w), _ = _rms(seed)
    rstd = (1 / np.sqrt((x.astype(np.float64) ** 2).mean(-1) + 1e-5)).astype(np.float32)
    return function, [grad_y, x, w], {"rstd": rstd}


def _layer(seed, weight=True, **options):
    inputs = list(reference.make_layer_norm_inputs((3, 4, 16), np.float32, np.random.default_rng(seed)).values())
    if not weight:
        inputs[1] = None  # absent in the middle of the inputs
    return ip.layer_norm_backward, inputs, options


def _batch(seed, saved=False, **options):
    inputs = reference.make_batch_norm_inputs((4, 3, 10), np.float32, np.random.default_rng(seed))
    if saved:
        options["save_mean"] = inputs["running_mean"]
        options["save_invstd"] = (1 / np.sqrt(inputs["running_var"].astype(np.float64) + 1e-5)).astype(np.float32)
        inputs["running_mean"] = inputs["running_var"] = None
    return ip.batch_norm_backward, list(inputs.values()), options


CALLS = {  # id -> seed -> (functional, positional arrays, keyword arguments)
    "rms": _rms,
    "rms-no-grad-w": lambda seed: _rms(seed, need_grad_weight=False, eps=1e-3),
    "rms-rstd": _rms_with_rstd,
    "layer": _layer,
    "layer-no-weight": lambda seed: _layer(seed, weight=False, need_grad_bias=False),
    "batch": _batch,
    "batch-saved": lambda seed: _batch(seed, saved=True, need_grad_weight=False),
    "batch-eval": lambda seed: _batch(seed, training=False, eps=1e-5),
}


def _numpy(array):
    return array


def _torch(array):
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    return None if array is None else torch.from_numpy(array)


def _call(case, seed, out_given, kind=_numpy):
    function, arrays, options = CALLS[case](seed)
    arrays = [None if array is None else kind(array) for array in arrays]
    options = {name: kind(value) if isinstance(value, np.ndarray) else value for name, value in options.items()}
    if out_given:
        shapes = [None if result is None else result.shape for result in function(*arrays, **options)]
        options["out"] = tuple(None if shape is None else kind(np.full(shape, np.nan, np.float32)) for shape in shapes)
    return function(*arrays, **options)


def _as_numpy(array):
    return array if isinstance(array, np.ndarray) else array.numpy()


def _forget_known_layouts():
    _known_layouts._runners.clear()
    _known_layouts._torch_runners.clear()


@pytest.mark.parametrize("kind", [_numpy, _torch], ids=["numpy", "torch"])
@pytest.mark.parametrize("out_given", [False, True], ids=["fresh-out", "out"])
@pytest.mark.parametrize("case", CALLS)
def test_known_layout_skips_the_checked_path_and_matches_it(case, out_given, kind, monkeypatch):
    _forget_known_layouts()
    expected = _call(case, seed=2, out_given=out_given, kind=kind)  # checked
    _forget_known_layouts()
    first = _call(case, seed=1, out_given=out_given, kind=kind)  # checked; the layout is known from now on

    def checked_path(*args, **kwargs):
        raise AssertionError("a call on a known layout took the checked path")

    monkeypatch.setattr(_functional, "as_tensor", checked_path)
    second = _call(case, seed=2, out_given=out_given, kind=kind)  # other data, same layout: the fast path
    for got, want, old in zip(second, expected, first):
        assert (got is None) == (want is None)
        if got is not None:
            assert type(got) is type(want) and got.dtype == want.dtype  # a torch tensor for torch inputs
            got, want, old = _as_numpy(got), _as_numpy(want), _as_numpy(old)
            assert got.flags.c_contiguous
            assert np.array_equal(got, want)
            assert not np.array_equal(got, old)  # really computed from the new data


def test_the_key_remember_makes_is_the_one_the_fast_path_looks_up():
    grad_y, x, w = random_rms_inputs(6, 40, seed=1)
    _known_layouts._runners.clear()
    ip.rms_norm_backward(grad_y, x, w)
    signature = ip.rms_norm_backward.__globals__["_SIGNATURE"]
    key = _known_layouts.key(signature, (0.0,), (True, True), None, (grad_y, x, w, None))
    assert list(_known_layouts._runners) == [key]


def test_repeated_layout_matches_an_operator_object_outside_every_cache():
    grad_y, x, w = random_rms_inputs(6, 40, seed=1)
    first = ip.rms_norm_backward(grad_y, x, w)
    other_grad_y, other_x, other_w = random_rms_inputs(6, 40, seed=2)
    second = ip.rms_norm_backward(other_grad_y, other_x, other_w)  # same layout: fast path
    grad_x, grad_w = np.empty_like(second[0]), np.empty_like(second[1])
    with ip.Handle("cpu") as handle, ip.RMSNormBackward(handle, grad_x, grad_w, other_grad_y, other_x, other_w) as op:
        op(grad_x, grad_w, other_grad_y, other_x, other_w)
    assert np.array_equal(second[0], grad_x) and np.array_equal(second[1], grad_w)
    assert not np.array_equal(first[0], second[0])  # really computed from the new data


def test_read_only_output_is_refused_even_for_a_known_layout():
    grad_y, x, w = random_rms_inputs(3, 16, seed=3)
    out = (np.empty_like(grad_y), np.empty_like(w))
    ip.rms_norm_backward(grad_y, x, w, out=out)
    out[0].flags.writeable = False
    with pytest.raises(ValueError, match="grad_x"):
        ip.rms_norm_backward(grad_y, x, w, out=out)


def test_strided_array_of_a_known_shape_takes_the_checked_path():
    grad_y, x, w = random_rms_inputs(8, 32, seed=4)
    contiguous = ip.rms_norm_backward(grad_y, x, w)  # the C-contiguous layout of this shape is known
    padded = np.zeros((8, 48), np.float32)
    padded[:, :32] = grad_y
    strided = padded[:, :32]  # same shape and dtype, not C-contiguous: no direct buffer, so the checked path
    results = [ip.rms_norm_backward(strided, x, w) for _ in range(2)]
    for grad_x, grad_w in results:
        assert np.array_equal(grad_x, contiguous[0]) and np.array_equal(grad_w, contiguous[1])


def test_array_subclass_of_a_known_layout_takes_the_checked_path(monkeypatch):
    grad_y, x, w = random_rms_inputs(4, 8, seed=5)
    ip.rms_norm_backward(grad_y, x, w)
    checked, as_tensor = [], _functional.as_tensor

    def counted_as_tensor(*args, **kwargs):
        checked.append(args[1])
        return as_tensor(*args, **kwargs)

    monkeypatch.setattr(_functional, "as_tensor", counted_as_tensor)
    ip.rms_norm_backward(grad_y.view(np.memmap), x, w)
    assert "grad_y" in checked


def test_wrong_out_of_a_known_layout_is_refused_as_before():
    grad_y, x, w = random_rms_inputs(4, 8, seed=6)
    out = (np.empty_like(grad_y), np.empty_like(w))
    ip.rms_norm_backward(grad_y, x, w, out=out)
    with pytest.raises(TypeError, match="out: expected a tuple of 2 arrays"):
        ip.rms_norm_backward(grad_y, x, w, out=out[:1])
    with pytest.raises(TypeError, match="out: expected a tuple of 2 arrays"):
        ip.rms_norm_backward(grad_y, x, w, out=out[0])
    assert ip.rms_norm_backward(grad_y, x, w, out=list(out))[0] is out[0]  # a list is fine, a tuple comes back


def _known_torch_rms(seed):
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    tensors = [torch.from_numpy(array) for array in random_rms_inputs(8, 32, seed)]
    ip.rms_norm_backward(*tensors)  # the layout is known from now on
    return torch, tensors


def test_non_contiguous_tensor_of_a_known_torch_layout_takes_the_checked_path():
    torch, (grad_y, x, w) = _known_torch_rms(seed=7)
    expected = ip.rms_norm_backward(grad_y, x, w)
    column_major = x.t().contiguous().t()  # same shape, dtype and values; the key holds no strides
    for got, want in zip(ip.rms_norm_backward(grad_y, column_major, w), expected):
        assert torch.equal(got, want)


def test_tensor_of_a_known_torch_layout_on_another_device_is_refused_as_before():
    torch, (grad_y, x, w) = _known_torch_rms(seed=8)
    with pytest.raises(ValueError, match="x: the torch tensor is on meta"):
        ip.rms_norm_backward(grad_y, x.to("meta"), w)  # the key holds no device: no pointer taken from it


def test_overlapping_out_of_a_known_torch_layout_is_refused_naming_both():
    torch, (grad_y, x, w) = _known_torch_rms(seed=9)
    out = (torch.empty_like(grad_y), torch.empty_like(w))
    ip.rms_norm_backward(grad_y, x, w, out=out)
    with pytest.raises(ip.BadParamError, match="grad_x: overlaps x"):
        ip.rms_norm_backward(grad_y, x, w, out=(x, out[1]))
