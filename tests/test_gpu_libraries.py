"""The package with the GPU array libraries users bring, on a real GPU: cupy (``__cuda_array_interface__``, cupy
outputs on cupy's stream) and JAX (DLPack in, DeviceArray out and back into JAX without a copy). The paths are
checked without a GPU through fakes (test_gpu_arrays_without_gpu.py, test_dlpack_device.py); these need the
libraries and a GPU, and skip, saying so, elsewhere (the CUDA emulation's memory is not theirs)."""

import os

import numpy as np
import pytest

import infiniop_py
from infiniop_py import reference
from _devices import EMULATED_CUDA
from _helpers import BATCH_NORM, F32, RMS_NORM

pytestmark = pytest.mark.nvidia


@pytest.fixture(autouse=True)
def _real_gpu_only():
    if EMULATED_CUDA:
        pytest.skip("cupy and JAX allocate real GPU memory; the CUDA emulation has none")


def _close(got, want):
    assert reference.relative_error(got, want) < 5e-5  # the CPU's result: both sum in F32 or wider


def test_cupy_arrays_in_cupy_arrays_out():
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    rng = np.random.default_rng(1)
    inputs = RMS_NORM.make_inputs(rng, (256, 1024), F32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:  # the package runs on cupy's current stream
        outputs = infiniop_py.rms_norm_backward(*[cupy.asarray(a) for a in inputs])
    stream.synchronize()
    assert all(isinstance(o, cupy.ndarray) for o in outputs)
    for got, want in zip(outputs, infiniop_py.rms_norm_backward(*inputs)):
        _close(cupy.asnumpy(got), want)


def test_cupy_channels_last_batch_norm_gets_its_layout_back():
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    rng = np.random.default_rng(2)
    shape = (8, 16, 6, 5)
    x, grad_output, weight, mean, var = BATCH_NORM.make_inputs(rng, shape, F32)
    channels_last = [cupy.asarray(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)
                     for a in (x, grad_output)]
    grad_input, grad_weight, grad_bias = infiniop_py.batch_norm_backward(
        *channels_last, *(cupy.asarray(v) for v in (weight, mean, var)))
    cupy.cuda.get_current_stream().synchronize()
    assert isinstance(grad_input, cupy.ndarray) and grad_input.strides == channels_last[0].strides
    for got, want in zip((grad_input, grad_weight, grad_bias), infiniop_py.batch_norm_backward(x, grad_output,
                                                                                                weight, mean, var)):
        _close(cupy.asnumpy(got), want)


def test_jax_arrays_in_and_the_outputs_back_into_jax():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to the others
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    if not any(device.platform == "gpu" for device in jax.devices()):
        pytest.skip("JAX has no GPU backend here")
    jnp = jax.numpy
    rng = np.random.default_rng(3)
    inputs = RMS_NORM.make_inputs(rng, (256, 1024), F32)
    outputs = infiniop_py.rms_norm_backward(*[jnp.asarray(a) for a in inputs])  # DLPack in
    assert all(isinstance(o, infiniop_py.DeviceArray) for o in outputs)
    back = [jnp.from_dlpack(o) for o in outputs]  # DLPack out, ordered after the package's stream by an event
    del outputs  # JAX holds the memory now
    for got, want in zip(back, infiniop_py.rms_norm_backward(*inputs)):
        _close(np.asarray(got), want)
