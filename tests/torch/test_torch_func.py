"""torch.func's transforms over the drop-ins: grad, vmap of grad (per-sample gradients), jacrev and jvp give what
they give over torch's own functions and modules, where plain autograd.Functions without setup_context raise."""

import copy

import pytest

from _torch_helpers import TORCH_ERRORS_CRASH, TORCH_ERRORS_CRASH_REASON, LoggedTensor, torch

import infiniop_py.torch as ipt

F64 = torch.float64


def _functions():
    """(name, ours, torch's) as functions of one input (N, C, L) and one parameter vector of C or L values."""
    def batch_norm(fn):
        return lambda x, w: fn(x, None, None, w, None, True, 0.1, 1e-5)
    return [
        ("rms_norm", lambda x, w: ipt.rms_norm(x, [x.shape[-1]], w, 1e-6),
         lambda x, w: torch.nn.functional.rms_norm(x, [x.shape[-1]], w, 1e-6)),
        ("layer_norm", lambda x, w: ipt.layer_norm(x, [x.shape[-1]], w, w * 0.5, 1e-5),
         lambda x, w: torch.nn.functional.layer_norm(x, [x.shape[-1]], w, w * 0.5, 1e-5)),
        ("batch_norm", batch_norm(ipt.batch_norm), batch_norm(torch.nn.functional.batch_norm)),
    ]


def _inputs(generator):
    x = torch.randn(5, 4, 4, generator=generator, dtype=F64) * 1.5 + 0.3
    w = torch.randn(4, generator=generator, dtype=F64) * 0.5 + 1.0
    weights = torch.randn(x.shape, generator=generator, dtype=F64)  # makes the loss depend on every output
    return x, w, weights


@pytest.mark.parametrize("name, ours, theirs", _functions(), ids=[f[0] for f in _functions()])
def test_grad_jacrev_and_jvp(name, ours, theirs):
    x, w, weights = _inputs(torch.Generator().manual_seed(1))
    def loss(fn):
        return lambda x, w: (fn(x, w) * weights).sum()
    for transform in (lambda fn: torch.func.grad(loss(fn), argnums=(0, 1)),
                      lambda fn: torch.func.jacrev(fn, argnums=(0, 1)),
                      lambda fn: lambda x, w: torch.func.jvp(fn, (x, w), (weights, w))):
        expected = transform(theirs)(x, w)
        actual = transform(ours)(x, w)
        for a, e in zip(actual, expected):
            assert torch.equal(a, e), name
    # And outside the transforms the same functions still run this library's backward, to rounding.
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    (ours(xg, wg) * weights).sum().backward()
    torch.testing.assert_close((xg.grad, wg.grad), torch.func.grad(loss(theirs), argnums=(0, 1))(x, w),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("module", ["RMSNorm", "LayerNorm", "BatchNorm1d"])
def test_per_sample_gradients_of_a_module(module):
    """vmap(grad(...)) over torch.func.functional_call: the per-sample gradients recipe of torch.func's docs."""
    size = 6
    make = {"RMSNorm": lambda ns: ns.RMSNorm(size), "LayerNorm": lambda ns: ns.LayerNorm(size),
            "BatchNorm1d": lambda ns: ns.BatchNorm1d(size, track_running_stats=False)}[module]
    torch.manual_seed(2)
    ours, theirs = make(ipt).double(), make(torch.nn).double()
    with torch.no_grad():
        for p in ours.parameters():
            p.uniform_(0.5, 1.5)
    theirs.load_state_dict(ours.state_dict())
    # Each sample is a batch of 3 rows (BatchNorm needs more than one value per channel).
    x = torch.randn(4, 3, size, dtype=F64)
    target = torch.randn(4, 3, size, dtype=F64)

    def per_sample(model):
        params = {name: p.detach() for name, p in model.named_parameters()}
        def loss(params, sample, goal):
            return ((torch.func.functional_call(model, params, (sample,)) - goal) ** 2).sum()
        return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, target)

    expected, actual = per_sample(theirs), per_sample(ours)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert actual[name].shape == (4, size) and torch.equal(actual[name], expected[name]), name


def _module_pairs():
    """(name, ours, theirs, input) of the replaced modules, a foreign RMSNorm (transformers' Llama) among them:
    replace_norms on a copy of torch's, with non-trivial parameters."""
    from _foreign_norms import LlamaStyleRMSNorm
    generator = torch.Generator().manual_seed(3)
    # LayerNorm F32 of at least 16384 elements: the C++ forward runs our kernel there (else PyTorch's, from C++)
    rows, images = torch.randn(1100, 16, generator=generator), torch.randn(4, 8, 3, 3, generator=generator)
    pairs = []
    for name, make, x, classes in (("RMSNorm", lambda: torch.nn.RMSNorm(16), rows, ()),
                                   ("LayerNorm", lambda: torch.nn.LayerNorm(16), rows, ()),
                                   ("BatchNorm2d", lambda: torch.nn.BatchNorm2d(8), images, ()),
                                   ("LlamaRMSNorm", lambda: LlamaStyleRMSNorm(16), rows, (LlamaStyleRMSNorm,))):
        theirs = make()
        with torch.no_grad():
            for parameter in theirs.parameters():
                parameter.copy_(torch.rand(parameter.shape, generator=generator) + 0.5)
        replaced = torch.nn.Sequential(copy.deepcopy(theirs))
        assert ipt.replace_norms(replaced, rms_norms=list(classes)) == 1
        pairs.append((name, replaced[0], theirs, x))
    return pairs


@pytest.mark.parametrize("name", [p[0] for p in _module_pairs()])
def test_jit_trace_records_torchs_own_norms(name):
    """torch.jit.trace (and the TorchScript ONNX export, which traces) records torch's ops: through our kernels the
    traced module returned its output unwritten (noise; 2026-12-07). While tracing the drop-ins are torch's."""
    if TORCH_ERRORS_CRASH:  # torch.jit's pybind11 iterators end by throwing, as its errors do
        pytest.skip(TORCH_ERRORS_CRASH_REASON)
    _, ours, theirs, x = next(p for p in _module_pairs() if p[0] == name)
    other = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
    traced = torch.jit.trace(ours.train(False), x)
    torch.testing.assert_close(traced(other), theirs.train(False)(other))


@pytest.mark.parametrize("name", [p[0] for p in _module_pairs()])
def test_forward_mode_ad_gives_torchs_tangents(name):
    """Inside a forward-mode AD level our nodes, which have no forward derivative, gave outputs without a tangent
    (None), silently; there the drop-ins are torch's, and the tangent its."""
    import torch.autograd.forward_ad as forward_ad
    _, ours, theirs, x = next(p for p in _module_pairs() if p[0] == name)
    direction = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    tangents = []
    for module in (ours, theirs):
        with forward_ad.dual_level():
            tangents.append(forward_ad.unpack_dual(module(forward_ad.make_dual(x, direction))).tangent)
    assert tangents[0] is not None
    torch.testing.assert_close(*tangents)


def test_a_replaced_foreign_rms_norm_under_vmap_and_grad_is_its_class():
    """A replaced foreign RMSNorm under torch.func runs its own class's forward (our kernels cannot read
    functorch's tensors: 'Cannot access data pointer of Tensor that doesn't have storage', 2026-12-07)."""
    _, ours, theirs, x = next(p for p in _module_pairs() if p[0] == "LlamaRMSNorm")
    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(6))
    for module in (ours, theirs):
        module.zero_grad()
    results = [(torch.func.vmap(module)(x), torch.func.grad(lambda z: (module(z) * weights).sum())(x))
               for module in (ours, theirs)]
    for actual, expected in zip(*results):
        assert torch.equal(actual, expected)


def _subclass_pairs():
    """(name, ours, theirs, input) as _module_pairs, on inputs where our kernels serve the replaced modules eagerly
    (above functional._TORCH_BELOW's sizes: LayerNorm F32 from 65536 elements, BatchNorm F32 from 4096)."""
    generator = torch.Generator().manual_seed(7)
    rows, images = torch.randn(4200, 16, generator=generator), torch.randn(8, 8, 9, 9, generator=generator)
    return [(name, ours, theirs, images if name.startswith("Batch") else rows)
            for name, ours, theirs, _ in _module_pairs()]


@pytest.mark.parametrize("name", [p[0] for p in _module_pairs()])
def test_tensor_subclasses_get_torchs_own_norms(name):
    """A tensor subclass is handed to torch's own function, as torch.nn's modules hand it: a __torch_function__
    subclass sees the norm itself and keeps its type; a wrapper without memory of its own (TwoTensor, standing for
    DTensor) and FakeTensorMode's tensors work. Ours raised on them ('INFINI_STATUS_NULL_POINTER', a view modified
    in place, a numpy array in place of a tensor; 2026-12-07)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.two_tensor import TwoTensor
    _, ours, theirs, x = next(p for p in _subclass_pairs() if p[0] == name)
    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(8))
    results = []
    for module in (ours, theirs):
        module.zero_grad()
        LoggedTensor.seen.clear()
        logged = module(x.as_subclass(LoggedTensor))
        seen = list(LoggedTensor.seen)
        pair = TwoTensor(x.clone(), x.clone()).requires_grad_()
        (module(pair) * weights).sum().backward()
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = module(mode.from_tensor(x))
        results.append({"types": (type(logged), type(pair.grad), type(fake)), "seen": seen,
                        "fake": (fake.shape, fake.dtype),
                        "values": [logged.as_subclass(torch.Tensor), pair.grad.a, pair.grad.b,
                                   *(p.grad for p in module.parameters())]})
    ours_result, theirs_result = results
    assert ours_result["types"] == theirs_result["types"] == (LoggedTensor, TwoTensor, type(fake))
    assert ours_result["seen"] == theirs_result["seen"] and ours_result["fake"] == theirs_result["fake"]
    assert all(map(torch.equal, ours_result["values"], theirs_result["values"]))


@pytest.mark.parametrize("name", [p[0] for p in _module_pairs() if not p[0].startswith("Batch")])
def test_nested_tensors_get_torchs_own_row_norms(name):
    """A jagged nested tensor (torch.nested, layout=torch.jagged) of rows goes through torch's own row norms, forward
    and backward. Our RMSNorm raised 'SymIntArrayRef expected to contain only concrete integers' (2026-12-07)."""
    _, ours, theirs, x = next(p for p in _subclass_pairs() if p[0] == name)
    results = []
    for module in (ours, theirs):
        module.zero_grad()
        nested = torch.nested.nested_tensor([x[:1000], x[1000:3500], x[3500:]], layout=torch.jagged,
                                            requires_grad=True)
        output = module(nested)
        (output.values() * output.values().detach().sin()).sum().backward()
        results.append([output.values(), nested.grad.values()] + [p.grad for p in module.parameters()])
    assert all(map(torch.equal, *results))


def test_fx_symbolic_trace_keeps_the_norms_as_modules():
    """torch.fx.symbolic_trace records torch.nn's norms as leaf modules (call_module): the replaced ones too, so the
    traced model runs them as in eager mode, kernels and running statistics, and tracing changes no buffer. Traced
    through, BatchNorm's forward raised ('symbolically traced variables cannot be used as inputs to control flow')
    and the row norms became torch's functions (2026-12-07)."""
    from _foreign_norms import LlamaStyleRMSNorm
    generator = torch.Generator().manual_seed(9)
    stock = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(1),
                                torch.nn.LayerNorm(288), torch.nn.RMSNorm(288), LlamaStyleRMSNorm(288))
    ours = copy.deepcopy(stock)
    assert ipt.replace_norms(ours, rms_norms=[LlamaStyleRMSNorm]) == 4
    eager = copy.deepcopy(ours)
    traced = torch.fx.symbolic_trace(ours)
    assert ours[1].num_batches_tracked.item() == 0
    modules = [node.target for node in traced.graph.nodes if node.op == "call_module"]
    assert modules == [str(i) for i in range(7)]
    assert [node.op for node in torch.fx.symbolic_trace(stock).graph.nodes][:7] == [node.op for node in
                                                                                     traced.graph.nodes][:7]
    x = torch.randn(70, 3, 8, 8, generator=generator)
    weights = torch.randn(70, 288, generator=generator)
    results = []
    for model in (traced, eager):
        inputs = x.clone().requires_grad_()
        output = model(inputs)
        (output * weights).sum().backward()
        results.append([output, inputs.grad, *(p.grad for p in model.parameters()), *model.buffers()])
    assert len(results[0]) == len(results[1]) and all(map(torch.equal, *results))


@pytest.mark.parametrize("name", [p[0] for p in _module_pairs()])
def test_make_fx_and_dispatch_modes_see_torchs_norms(name):
    """Under a TorchDispatchMode the drop-ins are torch's: the mode sees torch's ops, and make_fx's graph (a mode)
    computes the norm. Through our kernels that graph recorded the outputs' allocation, not the kernels' writes, and
    returned noise (2026-12-07)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))
    _, ours, theirs, x = next(p for p in _subclass_pairs() if p[0] == name)
    other = torch.randn(x.shape, generator=torch.Generator().manual_seed(10))
    results = []
    for module in (ours, theirs):
        module.train(False)
        with Seen() as seen:
            output = module(x)
        results.append((seen.ops, output, make_fx(module)(x)(other)))
    assert results[0][0] == results[1][0]
    assert torch.equal(results[0][1], results[1][1]) and torch.equal(results[0][2], results[1][2])


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_torch_export_records_torchs_norms(training):
    """torch.export (strict: its tracing is torch.compile's) records torch's norms, as its non-strict tracing (a
    dispatch mode) does: an exported program is for runtimes without this package. Strict export recorded
    torch.ops.infiniop's ops, which only this package runs (2026-12-08)."""
    from _foreign_norms import LlamaStyleRMSNorm
    stock = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.Flatten(2),
                                torch.nn.LayerNorm(64), torch.nn.RMSNorm(64), LlamaStyleRMSNorm(64))
    ours = copy.deepcopy(stock)
    assert ipt.replace_norms(ours, rms_norms=[LlamaStyleRMSNorm]) == 4
    x = torch.randn(40, 3, 8, 8, generator=torch.Generator().manual_seed(11))
    results = []
    for model in (ours, stock):
        program = torch.export.export(model.train(training), (x,), strict=True)
        targets = sorted({str(node.target) for node in program.graph.nodes if node.op == "call_function"})
        runnable = program.module()
        results.append((targets, runnable(x), *runnable.buffers()))
    assert not any(target.startswith("infiniop") for target in results[0][0])
    assert results[0][0] == results[1][0]
    assert all(map(torch.equal, results[0][1:], results[1][1:]))
