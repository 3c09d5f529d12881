"""The functional API's fast path (a layout seen before skips straight to the native run, _known_layouts), for
numpy arrays and for torch tensors of any layout the native op takes, on the CPU or CUDA: it is really taken for a
known layout, gives the same results as the first, fully checked call, and still refuses what the checks refuse."""

import numpy as np
import pytest

from _helpers import negative_views

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


def _device_array(array):
    return None if array is None else ip.DeviceArray.from_numpy(array, "cpu")


def _nvidia_device_array(array):
    return None if array is None else ip.DeviceArray.from_numpy(array, "nvidia")


def _call(case, seed, out_given, kind=_numpy):
    function, arrays, options = CALLS[case](seed)
    arrays = [None if array is None else kind(array) for array in arrays]
    options = {name: kind(value) if isinstance(value, np.ndarray) else value for name, value in options.items()}
    if out_given:
        shapes = [None if result is None else result.shape for result in function(*arrays, **options)]
        options["out"] = tuple(None if shape is None else kind(np.full(shape, np.nan, np.float32)) for shape in shapes)
    return function(*arrays, **options)


def _as_numpy(array):
    if isinstance(array, ip.DeviceArray):
        return array.to_numpy()  # in the DeviceArray's layout
    return array if isinstance(array, np.ndarray) else array.numpy()


def _forget_known_layouts():
    _known_layouts.forget()


@pytest.fixture(autouse=True)
def _python_path_only(monkeypatch):
    """Torch calls here take the Python path, whether or not another test loaded infiniop_py.torch's extension (its
    C++ tables: tests/torch/test_torch_functional_native.py)."""
    monkeypatch.setattr(_known_layouts, "_native_torch_table", None)
    _known_layouts.forget()


KINDS = [pytest.param(_numpy, id="numpy"), pytest.param(_torch, id="torch"),
         pytest.param(_device_array, id="DeviceArray"),
         pytest.param(_nvidia_device_array, id="DeviceArray-nvidia", marks=pytest.mark.nvidia)]


@pytest.mark.parametrize("kind", KINDS)
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
    column_major = x.t().contiguous().t()  # same shape, dtype and values, other strides: not that entry
    for got, want in zip(ip.rms_norm_backward(grad_y, column_major, w), expected):
        assert torch.equal(got, want)


def test_tensor_of_a_known_torch_layout_on_another_device_is_refused_as_before():
    torch, (grad_y, x, w) = _known_torch_rms(seed=8)
    with pytest.raises(ValueError, match="x: the torch tensor is on meta"):
        ip.rms_norm_backward(grad_y, x.to("meta"), w)  # another device: not that entry, so the checked path


def test_overlapping_out_of_a_known_torch_layout_is_refused_naming_both():
    torch, (grad_y, x, w) = _known_torch_rms(seed=9)
    out = (torch.empty_like(grad_y), torch.empty_like(w))
    ip.rms_norm_backward(grad_y, x, w, out=out)
    with pytest.raises(ip.BadParamError, match="grad_x: overlaps x"):
        ip.rms_norm_backward(grad_y, x, w, out=(x, out[1]))


# ------------------------------------------------ torch tensors of any layout the native op takes, on any device

@pytest.fixture
def checked_runs(monkeypatch):
    """The names of the arrays the checked path converted (none: every call took the fast path); the known
    layouts start empty."""
    _forget_known_layouts()
    names, as_tensor = [], _functional.as_tensor

    def counted_as_tensor(*args, **kwargs):
        names.append(args[1])
        return as_tensor(*args, **kwargs)

    monkeypatch.setattr(_functional, "as_tensor", counted_as_tensor)
    return names


def _torch_batch(seed, channels_last=True, dtype="float32", device="cpu"):
    """(input, grad_output, weight, running_mean, running_var) torch tensors of an (N, C, H, W) BatchNorm, input
    and grad_output channels-last (torch's memory format) or channels-first."""
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 3, 5, 6)) * 1.5 + 0.25
    arrays = (x, rng.standard_normal(x.shape), rng.standard_normal(3), x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3)))
    tensors = [torch.from_numpy(array).to(device, getattr(torch, dtype)) for array in arrays]
    if channels_last:
        tensors[:2] = [tensor.contiguous(memory_format=torch.channels_last) for tensor in tensors[:2]]
    return tensors


def _batch_out(torch, tensors):
    """out= for _torch_batch's tensors: grad_input laid out like input (empty_like keeps the layout)."""
    return (torch.empty_like(tensors[0]), torch.empty_like(tensors[2]), torch.empty_like(tensors[2]))


def _assert_same_bits(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert a.cpu().numpy().tobytes() == b.cpu().numpy().tobytes()


@pytest.mark.parametrize("out_given", [False, True], ids=["fresh-out", "out"])
def test_channels_last_torch_batch_norm_takes_the_fast_path_and_gives_the_checked_bits(out_given, checked_runs):
    torch = pytest.importorskip("torch", reason="torch tensors need torch")

    def call(tensors):
        return ip.batch_norm_backward(*tensors, eps=1e-5, out=_batch_out(torch, tensors) if out_given else None)

    expected = call(_torch_batch(seed=2))  # checked
    _forget_known_layouts()
    first = call(_torch_batch(seed=1))  # checked; the layout is known from now on
    assert "input" in checked_runs
    checked_runs.clear()
    tensors = _torch_batch(seed=2)
    second = call(tensors)
    assert checked_runs == []
    _assert_same_bits(second, expected)
    assert second[0].stride() == tensors[0].stride()  # channels-last, as the input: computed in place, no copy
    assert not torch.equal(second[0], first[0])  # really computed from the new data


def test_the_torch_key_remember_makes_is_the_one_the_fast_path_looks_up(checked_runs):
    tensors = _torch_batch(seed=3)
    ip.batch_norm_backward(*tensors, eps=1e-5)
    signature = ip.batch_norm_backward.__globals__["_SIGNATURE"]
    key = _known_layouts.torch_key(signature, (1e-5, True), (True, True, True), None, (*tensors, None, None))
    assert list(_known_layouts._torch_runners) == [key]


def _strided_rows(torch, tensor):
    """``tensor`` (rows, width) with its rows 16 elements apart more than packed: a layout the row ops take."""
    padded = torch.zeros(tensor.shape[0], tensor.shape[1] + 16, dtype=tensor.dtype)
    padded[:, :tensor.shape[1]] = tensor
    return padded[:, :tensor.shape[1]]


def test_another_stride_or_dtype_of_a_known_torch_shape_makes_its_own_entry(checked_runs):
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    grad_y, x, w = (torch.from_numpy(array) for array in random_rms_inputs(8, 32, seed=10))
    ip.rms_norm_backward(grad_y, x, w)  # contiguous float32: known
    variants = {"strided rows": (_strided_rows(torch, grad_y), x, w),
                "float64": (grad_y.double(), x.double(), w.double()),
                "channels-first batch": _torch_batch(seed=4, channels_last=False),
                "channels-last batch": _torch_batch(seed=4)}  # after channels-first: its packed copies hit that one
    for name, tensors in variants.items():
        function = ip.batch_norm_backward if "batch" in name else ip.rms_norm_backward
        checked_runs.clear()
        first = function(*tensors)
        assert checked_runs, f"{name}: its first call took another layout's entry"
        checked_runs.clear()
        second = function(*tensors)
        assert checked_runs == [], f"{name}: its second call took the checked path"
        _assert_same_bits(second, first)
        packed = function(*[tensor.contiguous() for tensor in tensors])  # the same values, packed channels-first
        # (channels-last sums in another order: not the same bits)
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(second, packed)), name
    assert len(_known_layouts._torch_runners) == 1 + len(variants)


def test_the_torch_key_holds_the_device():
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    signature = ip.rms_norm_backward.__globals__["_SIGNATURE"]
    tensors = [torch.from_numpy(array) for array in random_rms_inputs(4, 8, seed=11)]
    on_meta = [tensor.to("meta") for tensor in tensors]  # same dtype, shape and strides
    keys = [_known_layouts.torch_key(signature, (0.0,), (True, True), None, (*group, None))
            for group in (tensors, on_meta)]
    assert keys[0] != keys[1]


def test_negative_bit_tensor_of_a_known_torch_layout_takes_the_checked_path(checked_runs):
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    tensors = _torch_batch(seed=5)
    plain, negative = negative_views(torch, tensors[2])  # BatchNorm takes a strided weight as it is
    expected = ip.batch_norm_backward(*tensors)
    ip.batch_norm_backward(tensors[0], tensors[1], plain, *tensors[3:])
    checked_runs.clear()
    _assert_same_bits(ip.batch_norm_backward(tensors[0], tensors[1], plain, *tensors[3:]), expected)
    assert checked_runs == []  # the plain view's layout is known
    for _ in range(2):  # never remembered: each call resolves the negative bit on the checked path
        checked_runs.clear()
        _assert_same_bits(ip.batch_norm_backward(tensors[0], tensors[1], negative, *tensors[3:]), expected)
        assert "weight" in checked_runs


def test_output_requiring_grad_of_a_known_torch_layout_takes_the_checked_path(checked_runs):
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    grad_y, x, w = (torch.from_numpy(array) for array in random_rms_inputs(8, 32, seed=12))
    out = (torch.empty_like(grad_y), torch.empty_like(w))
    expected = [tensor.clone() for tensor in ip.rms_norm_backward(grad_y, x, w, out=out)]
    ip.rms_norm_backward(grad_y, x, w, out=out)  # this out= layout is known
    out[0].requires_grad_()
    with pytest.raises(RuntimeError, match="grad_x: an output tensor that requires grad"):
        ip.rms_norm_backward(grad_y, x, w, out=out)
    with torch.no_grad():
        for _ in range(2):  # allowed here, and never remembered: grad mode may be on at the next call
            checked_runs.clear()
            out[0].zero_()
            ip.rms_norm_backward(grad_y, x, w, out=out)
            assert "grad_x" in checked_runs
    assert all(torch.equal(a, b) for a, b in zip(out, expected))


def test_overlapping_out_of_a_known_channels_last_layout_is_refused_naming_both(checked_runs):
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    tensors = _torch_batch(seed=6)
    out = _batch_out(torch, tensors)
    ip.batch_norm_backward(*tensors, out=out)
    ip.batch_norm_backward(*tensors, out=out)  # known
    with pytest.raises(ip.BadParamError, match="grad_input: overlaps input"):
        ip.batch_norm_backward(*tensors, out=(tensors[0], *out[1:]))  # same layout as out[0]


@pytest.mark.nvidia
def test_cuda_tensors_take_the_fast_path_on_each_callers_stream(checked_runs):
    """After one checked call, CUDA calls on two side streams skip the checked path and still run on the stream
    current at each call: inputs written on that stream after a long sleep there are the ones read."""
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    expected = []
    for seed in (7, 8):
        _forget_known_layouts()
        expected.append(ip.batch_norm_backward(*_torch_batch(seed, device="cuda"), eps=1e-5))  # checked
    _forget_known_layouts()
    ip.batch_norm_backward(*_torch_batch(seed=9, device="cuda"), eps=1e-5)  # checked; known from now on
    cpu = _torch_batch(seed=9)
    ip.batch_norm_backward(*cpu, eps=1e-5)  # the same layout on the CPU: its own entry
    ip.batch_norm_backward(*cpu, eps=1e-5)
    assert len(_known_layouts._torch_runners) == 2
    checked_runs.clear()
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    targets = [_torch_batch(seed=9, device="cuda") for _ in streams]
    results = []
    for stream, seed, target in zip(streams, (7, 8), targets):
        new = _torch_batch(seed, device="cuda")
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch.cuda._sleep(20_000_000)  # on another stream the run would read target before the copies
            for tensor, values in zip(target, new):
                tensor.copy_(values)
            results.append(ip.batch_norm_backward(*target, eps=1e-5))
        for tensor in (*target, *new):
            tensor.record_stream(stream)
    torch.cuda.synchronize()
    assert checked_runs == []
    for got, want in zip(results, expected):
        _assert_same_bits(got, want)
    assert results[0][0].device == torch.device("cuda", torch.cuda.current_device())


# ------------------------------------------------ DeviceArrays (any device, their dense layouts)

def _device_batch(seed, channels_last, device="cpu"):
    """(input, grad_output, weight, running_mean, running_var) DeviceArrays of an (N, C, H, W) BatchNorm, input and
    grad_output channels-last or channels-first."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((4, 3, 5, 6)) * 1.5 + 0.25).astype(np.float32)
    arrays = [x, rng.standard_normal(x.shape).astype(np.float32), rng.standard_normal(3).astype(np.float32),
              x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))]
    if channels_last:
        arrays[:2] = [np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) for a in arrays[:2]]
    result = []
    for array in arrays:
        device_array = ip.DeviceArray(array.shape, array.dtype, device,
                                      strides=[stride // array.itemsize for stride in array.strides])
        flat = np.ascontiguousarray(array.transpose(np.argsort(array.strides)[::-1]))  # memory order
        device_array.buffer._copy(device_array.buffer._open_pointer(), ip._ffi.ffi.from_buffer(flat),
                                  ip._ffi.libraries().rt.INFINIRT_MEMCPY_H2D)
        result.append(device_array)
    return result


@pytest.mark.parametrize("device", ["cpu", pytest.param("nvidia", marks=pytest.mark.nvidia)])
def test_device_arrays_of_each_layout_take_their_own_entries_and_give_the_checked_bits(device, checked_runs):
    results = {}
    for channels_last in (True, False):
        expected = ip.batch_norm_backward(*_device_batch(2, channels_last, device), eps=1e-5)  # checked
        _forget_known_layouts()
        checked_runs.clear()
        ip.batch_norm_backward(*_device_batch(1, channels_last, device), eps=1e-5)  # checked; known from now on
        assert "input" in checked_runs, "the other layout's entry served this one"
        checked_runs.clear()
        got = ip.batch_norm_backward(*_device_batch(2, channels_last, device), eps=1e-5)
        assert checked_runs == []
        assert got[0].strides == expected[0].strides  # channels-last grad_input for channels-last input
        for a, b in zip(got, expected):
            assert type(a) is ip.DeviceArray and a.device == device
            assert a.to_numpy().tobytes() == b.to_numpy().tobytes()
        results[channels_last] = got[0].to_numpy()
    # The same values in either layout (the data went in as laid out), up to the layouts' summation orders.
    np.testing.assert_allclose(results[True], results[False], rtol=1e-5, atol=1e-6)


def test_closed_device_array_of_a_known_layout_is_refused_as_before(checked_runs):
    grad_y, x, w = (ip.DeviceArray.from_numpy(a, "cpu") for a in random_rms_inputs(4, 32, seed=0))
    ip.rms_norm_backward(grad_y, x, w)
    ip.rms_norm_backward(grad_y, x, w)  # known
    checked_runs.clear()
    x.close()
    with pytest.raises(ip.ClosedError, match="^x: the DeviceArray is closed"):
        ip.rms_norm_backward(grad_y, x, w)
    assert "x" in checked_runs  # the checked path said so, not the native call on freed memory


def test_overlapping_out_of_a_known_device_array_layout_is_refused_naming_both(checked_runs):
    grad_y, x, w = (ip.DeviceArray.from_numpy(a, "cpu") for a in random_rms_inputs(4, 32, seed=0))
    out = (ip.DeviceArray((4, 32), np.float32, "cpu"), ip.DeviceArray((32,), np.float32, "cpu"))
    ip.rms_norm_backward(grad_y, x, w, out=out)
    ip.rms_norm_backward(grad_y, x, w, out=out)  # known
    with pytest.raises(ip.BadParamError, match="grad_x: overlaps x"):
        ip.rms_norm_backward(grad_y, x, w, out=(x, out[1]))
