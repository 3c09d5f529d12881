"""The functional API's known torch layouts in C++ (KnownTorchCalls of infiniop_py.torch's extension, which
_known_layouts uses once the extension is loaded): a call on torch tensors without out= whose layout passed the
checked path once runs through it (its counter says so), with the checked path's bits and output layouts, for every
functional op; what its entry does not hold (another dtype, layout or device, a tensor subclass, the negative bit)
misses it and goes on as before. The Python path's own rules: tests/test_functional_fast_path.py."""

import gc
import sys
import threading

import numpy as np
import pytest

from _helpers import negative_views
from _torch_helpers import torch

import infiniop_py as ip
from infiniop_py import _functional, _known_layouts, reference
from infiniop_py.torch import autograd_nodes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the extension is built on Linux only")


@pytest.fixture
def checked_runs(monkeypatch):
    """The names of the tensors the checked path converted; the known layouts start empty, the C++ tables in use."""
    built, why = autograd_nodes.status()
    if not built:
        pytest.skip(f"the extension is not built here ({why}): the Python path serves, tested on its own")
    if _known_layouts._native_torch_table is None:
        pytest.skip("the extension was built without Python's headers: no KnownTorchCalls, the Python path serves")
    _known_layouts.forget()
    names, as_tensor = [], _functional.as_tensor
    monkeypatch.setattr(_functional, "as_tensor", lambda *a, **k: names.append(a[1]) or as_tensor(*a, **k))
    return names


def _served():
    """Calls the C++ tables have run."""
    return sum(table.calls for table in _known_layouts._native_torch_tables.values())


def _tensors(arrays, dtype=torch.float32, device="cpu"):
    return [None if array is None else torch.from_numpy(np.asarray(array)).to(device, dtype) for array in arrays]


def _rms(seed, dtype=torch.float32, **options):
    inputs = reference.make_rms_norm_inputs((5, 24), np.float32, np.random.default_rng(seed))
    return ip.rms_norm_backward, _tensors(inputs.values(), dtype), options


def _rms_with_rstd(seed):
    function, tensors, _ = _rms(seed)
    rstd = torch.rsqrt(tensors[1].double().square().mean(-1) + 1e-5).float()
    return function, tensors, {"rstd": rstd}


def _layer(seed, weight=True, **options):
    inputs = list(reference.make_layer_norm_inputs((3, 4, 16), np.float32, np.random.default_rng(seed)).values())
    if not weight:
        inputs[1] = None  # absent in the middle of the inputs
    return ip.layer_norm_backward, _tensors(inputs), options


def _batch(seed, channels_last=True, saved=False, dtype=torch.float32, **options):
    inputs = reference.make_batch_norm_inputs((4, 3, 30), np.float32, np.random.default_rng(seed))
    inputs["input"], inputs["grad_output"] = (inputs[name].reshape(4, 3, 5, 6) for name in ("input", "grad_output"))
    if saved:
        options["save_mean"] = torch.from_numpy(inputs["running_mean"]).to(dtype)
        options["save_invstd"] = torch.rsqrt(torch.from_numpy(inputs["running_var"]).double() + 1e-5).float()
        inputs["running_mean"] = inputs["running_var"] = None
    tensors = _tensors(inputs.values(), dtype)
    if channels_last:
        tensors[:2] = [tensor.contiguous(memory_format=torch.channels_last) for tensor in tensors[:2]]
    return ip.batch_norm_backward, tensors, options


CALLS = {  # id -> seed -> (functional, positional tensors, keyword arguments)
    "rms": _rms,
    "rms-bf16-no-grad-w": lambda seed: _rms(seed, torch.bfloat16, need_grad_weight=False, eps=1e-3),
    "rms-rstd": _rms_with_rstd,
    "layer": _layer,
    "layer-no-weight": lambda seed: _layer(seed, weight=False, need_grad_bias=False),
    "batch-channels-last": _batch,
    "batch-channels-first": lambda seed: _batch(seed, channels_last=False),
    "batch-saved": lambda seed: _batch(seed, saved=True, need_grad_weight=False),
    "batch-eval-f64": lambda seed: _batch(seed, dtype=torch.float64, training=False, eps=1e-5),
}


def _call(case, seed):
    function, tensors, options = CALLS[case](seed)
    return function(*tensors, **options)


def _assert_same_bits(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            assert type(a) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            assert torch.equal(a, b)


@pytest.mark.parametrize("case", CALLS)
def test_a_known_layout_runs_in_cpp_with_the_checked_paths_bits(case, checked_runs):
    expected = _call(case, seed=2)  # checked
    _known_layouts.forget()
    first = _call(case, seed=1)  # checked; known from now on
    assert checked_runs
    checked_runs.clear()
    served = _served()
    second = _call(case, seed=2)  # other data, same layout
    assert checked_runs == [] and _served() == served + 1
    _assert_same_bits(second, expected)
    assert not torch.equal(second[0], first[0])  # really computed from the new data


def _strided_rows(tensor):
    padded = torch.zeros(tensor.shape[0], tensor.shape[1] + 16, dtype=tensor.dtype)
    padded[:, :tensor.shape[1]] = tensor
    return padded[:, :tensor.shape[1]]


class _Subclass(torch.Tensor):
    pass


def test_what_an_entry_does_not_hold_misses_it(checked_runs):
    """After channels-last F32 BatchNorm and contiguous RMSNorm calls are known, each variant's first call is
    checked, not served by a wrong entry, and gives what its contiguous copy gives; a tensor subclass and the
    negative bit are never served in C++."""
    function, tensors, _ = _batch(seed=3)
    rms, rms_tensors, _ = _rms(seed=3)
    plain, negative = negative_views(torch, tensors[2])
    for _ in range(2):
        function(*tensors)
        function(*tensors[:2], plain, *tensors[3:])  # the negative view's layout, without the bit
        rms(*rms_tensors)
    variants = {"channels-first": (function, [t.contiguous() for t in tensors]),
                "float64": (function, [t.double() for t in tensors]),
                "strided rows": (rms, [_strided_rows(rms_tensors[0]), *rms_tensors[1:]]),
                "subclass": (function, [tensors[0].as_subclass(_Subclass), *tensors[1:]]),
                "negative weight": (function, [*tensors[:2], negative, *tensors[3:]])}
    for name, (call, variant) in variants.items():
        checked_runs.clear()
        served = _served()
        got = call(*variant)
        assert checked_runs, f"{name}: its first call took a known layout's entry"
        assert _served() == served, name
        packed = [t.as_subclass(torch.Tensor).clone().contiguous() for t in variant]  # no subclass, no negative bit
        want = call(*packed)
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, want)), name
    served = _served()
    for name in ("subclass", "negative weight"):
        call, variant = variants[name]
        call(*variant)
    assert _served() == served  # never remembered in C++


def test_an_entry_keeps_its_operator_open(checked_runs):
    """The functional API's operator cache may drop the operator; the entry holding its descriptor keeps it."""
    expected = _call("layer", seed=4)
    _call("layer", seed=5)  # known
    with _functional._lock:
        _functional._operators.clear()
    gc.collect()
    served = _served()
    _assert_same_bits(_call("layer", seed=4), expected)
    assert _served() == served + 1


def test_a_full_table_starts_again_and_keeps_serving(checked_runs):
    """More layouts than a table keeps (64): it is emptied and refilled, each call still right."""
    generator = torch.Generator().manual_seed(6)
    for rows in range(1, 80):
        grad_y, x = (torch.randn(rows, 16, generator=generator) for _ in range(2))
        weight = torch.randn(16, generator=generator)
        checked = ip.rms_norm_backward(grad_y, x, weight)
        served = _served()
        _assert_same_bits(ip.rms_norm_backward(grad_y, x, weight), checked)
        assert _served() == served + 1
    (table,) = _known_layouts._native_torch_tables.values()
    assert 0 < len(table) <= 64


def test_threads_calling_at_once_get_their_own_outputs(checked_runs):
    cases = [CALLS["batch-channels-last"](seed) for seed in range(4)]
    expected = [function(*tensors) for function, tensors, _ in cases]
    errors = []

    def work(index):
        function, tensors, _ = cases[index]
        for _ in range(50):
            got = function(*tensors)
            if not all(torch.equal(a, b) for a, b in zip(got, expected[index])):
                errors.append(index)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(4)]
    served = _served()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads) and errors == []
    assert _served() == served + 200


@pytest.mark.nvidia
@pytest.mark.torch_cuda
def test_cuda_tensors_run_in_cpp_on_each_callers_stream(checked_runs):
    """CUDA calls of a known layout on two side streams run in C++ on the stream current at each call: inputs written
    on that stream after a long sleep there are the ones read."""
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    cases = [_batch(seed) for seed in (7, 8)]
    expected = [function(*[tensor.to("cuda") for tensor in tensors]) for function, tensors, _ in cases]
    known = [tensor.to("cuda") for tensor in _batch(seed=9)[1]]
    ip.batch_norm_backward(*known)  # checked; known from now on
    served = _served()
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    results = []
    for stream, (_, values, _) in zip(streams, cases):
        target = [tensor.clone() for tensor in known]
        new = [tensor.to("cuda") for tensor in values]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch.cuda._sleep(20_000_000)  # on another stream the run would read target before the copies
            for tensor, value in zip(target, new):
                tensor.copy_(value)
            results.append(ip.batch_norm_backward(*target))
        for tensor in (*target, *new):
            tensor.record_stream(stream)
    torch.cuda.synchronize()
    assert _served() == served + 2
    for got, want in zip(results, expected):
        _assert_same_bits(got, want)
