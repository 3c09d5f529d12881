"""torch.func's transforms over the drop-ins: grad, vmap of grad (per-sample gradients), jacrev and jvp give what
they give over torch's own functions and modules, where plain autograd.Functions without setup_context raise."""

import pytest

from _torch_helpers import torch

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
