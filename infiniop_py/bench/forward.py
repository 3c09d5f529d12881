"""`bench --forward`: the cases of the forward benchmark (RMSNorm, BatchNorm), each our training forward (saving
what our backward takes) against torch's training forward and oneDNN's forward_training on the same arrays. The
timing, table and plot are the backward benchmark's (cpu.py); only what a case moves differs: one row-sized read and
one write (BatchNorm's kernel reads x twice; the count stays the minimal one)"""

import numpy as np

from . import onednn
from .cpu import Case, _numpy_dtype, _to_torch, _torch, aligned, operator_call

OPS = ("rms_norm", "layer_norm", "batch_norm")


def bytes_moved(dtype, shape):
    """The traffic the effective bandwidth counts: x read, y written (the O(rows) statistics left out)."""
    return 2 * int(np.prod(shape)) * np.dtype(_numpy_dtype(dtype)).itemsize


def build_case(op, dtype, shape, handle, rng, with_onednn=False):
    """(case, operator, run_ours, run_torch or None, oneDNN's ForwardReference or the reason there is none), as
    cpu.build_case returns for the backward."""
    if op not in _BUILDERS:
        raise ValueError(f"op: no forward benchmark of {op!r} (forwards: {', '.join(OPS)})")
    case = Case(op, dtype, shape, rng)
    operator, arrays, torch_run, reference = _BUILDERS[op](case, handle, _torch(), with_onednn)
    case.outputs = tuple(a for a in arrays[:3] if a is not None)
    return case, operator, operator_call(case, operator, arrays), torch_run, reference


def _rms_norm(case, handle, torch, with_onednn):
    import infiniop_py as ip

    shape = case.shape
    x, w = case.random(shape), case.random(shape[-1:])
    y, rstd = aligned(np.empty_like(x)), np.empty(shape[:-1], np.float32)
    operator = ip.RMSNorm(handle, y, rstd, x, w, eps=1e-6)
    torch_run = None
    if torch is not None:  # torch's training forward: its output, without saving (torch's CPU rms_norm is a
        tx, tw = _to_torch(torch, x), _to_torch(torch, w)  # composite that autograd keeps the pieces of)
        torch_run = lambda: torch.nn.functional.rms_norm(tx, shape[-1:], tw, eps=1e-6)  # noqa: E731
    return operator, (y, rstd, x, w), torch_run, "oneDNN 3.2 has no RMSNorm"


def _layer_norm(case, handle, torch, with_onednn):
    import infiniop_py as ip

    shape = case.shape
    x, w, b = case.random(shape), case.random(shape[-1:]), case.random(shape[-1:])
    statistics = np.float64 if x.dtype == np.float64 else np.float32
    y, mean, rstd = aligned(np.empty_like(x)), np.empty(shape[:-1], statistics), np.empty(shape[:-1], statistics)
    operator = ip.LayerNorm(handle, y, mean, rstd, x, w, b, eps=1e-5)
    torch_run = None
    if torch is not None:  # torch's training forward: output, mean and rstd, as autograd saves them
        tx, tw, tb = _to_torch(torch, x), _to_torch(torch, w), _to_torch(torch, b)
        torch_run = lambda: torch.native_layer_norm(tx, list(shape[-1:]), tw, tb, 1e-5)  # noqa: E731
    reference = _onednn_forward(with_onednn, "layer_norm", case.dtype, shape, 1e-5, x, w, b)
    return operator, (y, mean, rstd, x, w, b), torch_run, reference


def _batch_norm(case, handle, torch, with_onednn):
    """(N, C, L), channels-first; parameters and running statistics in F32 (what infiniop_py.torch serves with
    16-bit data), updated on every run by both sides."""
    import infiniop_py as ip

    shape = case.shape
    x = case.random(shape)
    channels = shape[1]
    weight, bias = case.random((channels,)).astype(np.float32), case.random((channels,)).astype(np.float32)
    running_mean, running_var = np.zeros(channels, np.float32), np.ones(channels, np.float32)
    y = aligned(np.empty_like(x))
    save_mean, save_invstd = np.empty(channels, np.float32), np.empty(channels, np.float32)
    operator = ip.BatchNorm(handle, y, save_mean, save_invstd, running_mean, running_var, x, weight, bias)
    torch_run = None
    if torch is not None:  # torch's training forward on the same buffers, saving its statistics too
        tx, tw, tb = _to_torch(torch, x), _to_torch(torch, weight), _to_torch(torch, bias)
        tmean, tvar = _to_torch(torch, running_mean.copy()), _to_torch(torch, running_var.copy())
        torch_run = lambda: torch.native_batch_norm(tx, tw, tb, tmean, tvar, True, 0.1, 1e-5)  # noqa: E731
    reference = _onednn_forward(with_onednn, "batch_norm", case.dtype, shape, 1e-5, x, weight, bias)
    return operator, (y, save_mean, save_invstd, running_mean, running_var, x, weight, bias), torch_run, reference


def _onednn_forward(with_onednn, kind, dtype, shape, eps, src, weight, bias):
    """oneDNN's training forward on src (its parameters as F32 copies, outputs fresh), or why not."""
    if not with_onednn:
        return "not asked for"
    as_f32 = lambda values: np.ascontiguousarray(np.asarray(values, dtype=np.float32))  # noqa: E731
    statistics = shape[1] if kind == "batch_norm" else int(np.prod(shape[:-1]))
    dims = shape if kind == "batch_norm" else (statistics, shape[-1])
    try:
        return onednn.ForwardReference(kind, dtype, dims, eps, src, aligned(np.empty_like(src)),
                                       np.empty(statistics, np.float32), np.empty(statistics, np.float32),
                                       as_f32(weight), as_f32(bias))
    except onednn.Unavailable as why:
        return str(why)


_BUILDERS = {"rms_norm": _rms_norm, "layer_norm": _layer_norm, "batch_norm": _batch_norm}
assert set(_BUILDERS) == set(OPS)
