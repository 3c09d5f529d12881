"""torch float64 autograd of the forward definitions validates the float64 references (ours and the
package's), and our F32 outputs."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the autograd cross-check needs it")

import infiniop_py  # noqa: E402
from infiniop_py import reference as package_reference  # noqa: E402
from _helpers import (  # noqa: E402
    F32, LAYER_NORM_EPS, batch_norm_backward_reference, layer_norm_backward_reference,
    rms_norm_backward_reference,
)

REFERENCE_AGREEMENT = 1e-12  # design.md: autograd matches the formulas to ~1e-15
SMALLEST_DOUBLE = float(np.nextafter(0.0, 1.0))


def torch_gradients(forward, grad_of_output, *inputs):
    leaves = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in inputs]
    forward(*leaves).backward(torch.tensor(grad_of_output, dtype=torch.float64))
    return [leaf.grad.numpy() for leaf in leaves]


def assert_all_agree(expected, candidates):
    """Every candidate (who, outputs, bound): max|err| / max|torch| <= bound on each output."""
    for who, outputs, bound in candidates:
        for index, (actual, wanted) in enumerate(zip(outputs, expected)):
            actual = np.asarray(actual, dtype=np.float64)
            error = np.max(np.abs(actual - wanted)) / np.max(np.abs(wanted))
            assert error <= bound, f"{who} output {index}: {error:.3g} > {bound:g}"


def f32_values(rng, shape):
    """float64 values that are exactly float32, so torch and our F32 run see the same numbers."""
    return rng.standard_normal(shape).astype(np.float32).astype(np.float64)


def test_rms_norm_backward_matches_autograd():
    rng = np.random.default_rng(21)
    x, grad_y, w = f32_values(rng, (4, 5, 64)), f32_values(rng, (4, 5, 64)), f32_values(rng, 64)

    def rms_norm(x, w):  # eps = 0, as the seed defines it
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True)) * w

    grad_x, grad_w = torch_gradients(rms_norm, grad_y, x, w)
    f32 = [a.astype(F32) for a in (grad_y, x, w)]
    assert_all_agree((grad_x, grad_w), [
        ("tests reference", rms_norm_backward_reference(grad_y, x, w), REFERENCE_AGREEMENT),
        ("package reference", package_reference.rms_norm_backward(grad_y, x, w), REFERENCE_AGREEMENT),
        ("library F32", infiniop_py.rms_norm_backward(*f32), 5e-5),
    ])


def test_layer_norm_backward_matches_autograd():
    rng = np.random.default_rng(22)
    x = f32_values(rng, (4, 5, 64)) * 3 + 1
    grad_output, weight, bias = f32_values(rng, (4, 5, 64)), f32_values(rng, 64), f32_values(rng, 64)

    def layer_norm(x, weight, bias):
        return torch.nn.functional.layer_norm(x, (64,), weight, bias, LAYER_NORM_EPS)

    grad_x, grad_weight, grad_bias = torch_gradients(layer_norm, grad_output, x, weight, bias)
    std = np.sqrt(x.var(-1) + LAYER_NORM_EPS)  # the same eps made xhat and std
    xhat = (x - x.mean(-1, keepdims=True)) / std[..., None]
    f32 = [a.astype(F32) for a in (grad_output, weight, xhat, std)]
    assert_all_agree((grad_x, grad_weight, grad_bias), [
        ("tests reference", layer_norm_backward_reference(grad_output, weight, xhat, std), REFERENCE_AGREEMENT),
        ("package reference", package_reference.layer_norm_backward(grad_output, weight, xhat, std),
         REFERENCE_AGREEMENT),
        ("library F32", infiniop_py.layer_norm_backward(*f32), 5e-5),
    ])


def test_batch_norm_backward_matches_autograd():
    rng = np.random.default_rng(23)
    x = f32_values(rng, (4, 6, 50)) * 2 - 0.5
    grad_output, weight, bias = f32_values(rng, (4, 6, 50)), f32_values(rng, 6), f32_values(rng, 6)

    def batch_norm(x, weight, bias):
        # training=True normalizes with the batch's biased variance. The seed has no eps; torch refuses
        # eps = 0 in training, and the smallest positive double leaves var + eps == var bit for bit.
        return torch.nn.functional.batch_norm(x, None, None, weight, bias, training=True, eps=SMALLEST_DOUBLE)

    grad_x, grad_weight, grad_bias = torch_gradients(batch_norm, grad_output, x, weight, bias)
    mean, var = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    f32 = [a.astype(F32) for a in (x, grad_output, weight, mean, var)]
    assert_all_agree((grad_x, grad_weight, grad_bias), [
        ("tests reference", batch_norm_backward_reference(x, grad_output, weight, mean, var), REFERENCE_AGREEMENT),
        ("package reference", package_reference.batch_norm_backward(x, grad_output, weight, mean, var),
         REFERENCE_AGREEMENT),
        ("library F32", infiniop_py.batch_norm_backward(*f32), 5e-5),
    ])


def test_torch_tensors_in_torch_tensors_out():
    """CPU torch tensors (bfloat16 too) go in as they are; the functional API allocates torch outputs."""
    rng = np.random.default_rng(24)
    for dtype in (torch.float32, torch.bfloat16):
        grad_y, x = (torch.tensor(rng.standard_normal((3, 4, 40))).to(dtype) for _ in range(2))
        w = torch.tensor(rng.standard_normal(80)).to(dtype)[::2]  # strided weight
        grad_x, grad_w = infiniop_py.rms_norm_backward(grad_y, x, w)
        assert isinstance(grad_x, torch.Tensor) and grad_x.dtype == dtype and grad_w.shape == (40,)
        expected = rms_norm_backward_reference(*(t.double().numpy() for t in (grad_y, x, w)))
        bound = 5e-5 if dtype == torch.float32 else 1.6e-2
        assert_all_agree(expected, [(f"torch {dtype}", [grad_x.double().numpy(), grad_w.double().numpy()], bound)])
