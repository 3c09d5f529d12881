"""Handle: an infiniopHandle_t bound to one device."""

import contextlib
import operator

from ._ffi import ffi, libraries
from ._resource import NativeResource
from .errors import DeviceNotFoundError, DeviceTypeNotSupportedError, check, status_name

_DEVICE_PREFIX = "INFINI_DEVICE_"
DEVICE_NAMES = tuple(
    name[len(_DEVICE_PREFIX):].lower()
    for code, name in sorted(ffi.typeof("infiniDevice_t").elements.items())
    if name != "INFINI_DEVICE_TYPE_COUNT"
)

DEVICE_ALIASES = {"cuda": "nvidia"}  # other names a device goes by (torch's, for NVIDIA GPUs), never given back


def resolve_alias(device):
    """A device name in lower case, an alias (such as "cuda") replaced by its device's name; not checked further:
    for command lines, whose choices then name what is wrong."""
    name = device.lower()
    return DEVICE_ALIASES.get(name, name)


def device_name(device):
    """The package's name of a device given as "cpu", "nvidia", "CUDA" (an alias of nvidia), ...: lower case,
    never an alias. TypeError / ValueError for what names no device."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a name such as 'cpu', got {type(device).__name__}")
    name = resolve_alias(device)
    if name not in DEVICE_NAMES:
        aliases = ", ".join(f"{alias} for {target}" for alias, target in DEVICE_ALIASES.items())
        raise ValueError(f"device {device!r} is unknown; use one of {', '.join(DEVICE_NAMES)} (or {aliases})")
    return name


def device_code(device):
    """infiniDevice_t value of a device name such as "cpu" or "nvidia" (or an alias: "cuda")."""
    return ffi.typeof("infiniDevice_t").relements[_DEVICE_PREFIX + device_name(device).upper()]


_INT_MIN, _INT_MAX = -2**31, 2**31 - 1


@contextlib.contextmanager
def selected_device(device, device_id):
    """Make (device, device_id) current on this thread, and restore the previous one after."""
    rt = libraries().rt
    previous_device = ffi.new("infiniDevice_t *")
    previous_id = ffi.new("int *")
    check(rt.infinirtGetDevice(previous_device, previous_id), "infinirtGetDevice")
    # An id beyond C's int is no device (cffi raised OverflowError).
    status = (rt.infinirtSetDevice(device_code(device), device_id) if _INT_MIN <= device_id <= _INT_MAX
              else DeviceNotFoundError.status)
    if status != 0:
        check(status, f"infinirtSetDevice({device}, {device_id}) ({_why_not_selectable(device)})")
    try:
        yield
    finally:
        rt.infinirtSetDevice(previous_device[0], previous_id[0])


def _why_not_selectable(device):
    """Why a device of this type could not be selected, for error messages."""
    count = ffi.new("int *")
    status = libraries().rt.infinirtGetDeviceCount(device_code(device), count)
    if status == DeviceTypeNotSupportedError.status:
        return f"this library was built without the {device} backend"
    if status != 0:
        return f"infinirtGetDeviceCount: {status_name(status)}"
    if count[0] == 0 and device == "ascend":
        from ._ascend import missing_cann_reason  # names the CANN library that could not be loaded
        reason = missing_cann_reason()
        if reason:
            return reason
    if count[0] == 0:
        return f"no {device} device found"
    return f"{device} has devices 0..{count[0] - 1}"


class Handle(NativeResource):
    """The library handle for one device: Handle("cpu"), Handle("nvidia", 1) (or "cuda", whose ``device`` is then
    "nvidia"; names are case-insensitive). close() stops it making operators; those made before keep working (a
    descriptor copies the device at create and never reads the handle again)."""

    def __init__(self, device="cpu", device_id=0):
        self.device = device_name(device)
        try:
            self.device_id = operator.index(device_id)
        except TypeError:
            raise TypeError(f"device_id must be an int, got {type(device_id).__name__}") from None
        op = libraries().op
        pointer = ffi.new("infiniopHandle_t *")
        with selected_device(self.device, self.device_id):
            check(op.infiniopCreateHandle(pointer), "infiniopCreateHandle")
        self._own(pointer[0], op.infiniopDestroyHandle, "infiniopDestroyHandle")

    @property
    def native(self):
        """The infiniopHandle_t (ClosedError once closed)."""
        return self._open_pointer()

    def __repr__(self):
        state = ", closed" if self.closed else ""
        return f"Handle({self.device!r}, {self.device_id}{state})"
