import os

import pytest
from hypothesis import HealthCheck, settings

# Modest example counts: the whole suite has to finish in a few minutes on 2 cores.
settings.register_profile(
    "suite",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# HYPOTHESIS_PROFILE=thorough for an occasional deeper search.
settings.register_profile("thorough", settings.get_profile("suite"), max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


def pytest_configure(config):
    config.addinivalue_line("markers", "nvidia: runs on an NVIDIA GPU (skipped, saying why, where none is usable)")
    config.addinivalue_line("markers", "torch_cuda: an nvidia test that needs torch.cuda itself (skipped, saying "
                                       "why, under the CPU emulation of CUDA); tests/torch/ is all such")


def pytest_runtest_setup(item):
    if item.get_closest_marker("nvidia"):
        from _devices import nvidia_unusable_reason

        reason = nvidia_unusable_reason()
        if reason:
            pytest.skip(reason)
        from _devices import EMULATED_CUDA, EMULATED_CUDA_NO_TORCH

        if EMULATED_CUDA and (item.get_closest_marker("torch_cuda") or "torch" in item.path.parent.name):
            pytest.skip(EMULATED_CUDA_NO_TORCH)


@pytest.fixture(scope="module")
def cpu_handle():
    import infiniop_py

    with infiniop_py.Handle("cpu") as handle:
        yield handle


@pytest.fixture(scope="module")
def c_handle():
    """An infiniopHandle_t made directly through C on the CPU."""
    from _helpers import native

    ffi, op, rt = native()
    pointer = ffi.new("infiniopHandle_t *")
    assert rt.infinirtSetDevice(0, 0) == 0 and op.infiniopCreateHandle(pointer) == 0
    yield pointer[0]
    assert op.infiniopDestroyHandle(pointer[0]) == 0


@pytest.fixture
def device_handle(device):
    """A Handle on the test's `device` parameter (see _devices.DEVICES)."""
    import infiniop_py

    with infiniop_py.Handle(device) as handle:
        yield handle
