"""Device names (issue 55): "cuda" is an alias of "nvidia" wherever a device is named, names are case-insensitive,
and the package gives back its own name ("nvidia"), never the alias. With or without a GPU."""

import numpy as np
import pytest

import infiniop_py
from infiniop_py.handle import device_code, device_name


def test_the_alias_and_any_case_name_the_same_device():
    assert device_code("cuda") == device_code("CUDA") == device_code("nvidia") == device_code("NVIDIA")
    assert device_code("Cpu") == device_code("cpu") != device_code("cuda")
    assert device_name("CUDA") == device_name("cuda") == "nvidia"


def test_an_unknown_name_lists_the_names_and_the_alias():
    with pytest.raises(ValueError, match=r"'gpu' is unknown; use one of cpu, nvidia, .* \(or cuda for nvidia\)"):
        infiniop_py.Handle("gpu")
    with pytest.raises(TypeError, match="device must be a name"):
        infiniop_py.Handle(1)


def _handle_outcome(device):
    """What Handle(device) gives: (device, device_id) of the handle, or (error type, message)."""
    try:
        handle = infiniop_py.Handle(device)
    except infiniop_py.InfiniopError as error:
        return type(error), str(error)
    with handle:
        return handle.device, handle.device_id


@pytest.mark.parametrize("alias", ["cuda", "CUDA", "Nvidia"])
def test_handle_of_the_alias_is_a_handle_of_nvidia(alias):
    """Without a GPU the same error (its message names nvidia, not the alias); with one, a handle whose device is
    "nvidia"."""
    outcome = _handle_outcome(alias)
    assert outcome == _handle_outcome("nvidia")
    if outcome[0] != "nvidia":
        assert issubclass(outcome[0], infiniop_py.InfiniopError) and "nvidia" in outcome[1]
        assert alias not in outcome[1], outcome[1]


def _device_array_outcome(device):
    """What DeviceArray.from_numpy(..., device) gives: the array's device, or (error type, message)."""
    try:
        return infiniop_py.DeviceArray.from_numpy(np.ones(3, np.float32), device).device
    except infiniop_py.InfiniopError as error:
        return type(error), str(error)


def test_device_arrays_on_the_alias_are_on_nvidia():
    """Their device must be the Handle's name for it, or no operator on a Handle("cuda") would take them."""
    outcome = _device_array_outcome("cuda")
    assert outcome == _device_array_outcome("nvidia")
    assert outcome == "nvidia" or "nvidia" in outcome[1] and "cuda" not in outcome[1], outcome


def test_device_arrays_and_handles_name_the_cpu_alike_in_any_case():
    array = infiniop_py.DeviceArray.from_numpy(np.ones(3, np.float32), "CPU")
    assert array.device == "cpu"
    with infiniop_py.Handle("Cpu") as handle:
        assert handle.device == "cpu"
