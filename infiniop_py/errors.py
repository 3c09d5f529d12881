"""Exceptions: one class per infiniStatus_t code, and check() turning a status into one."""

from ._ffi import ffi

_STATUS_NAMES = ffi.typeof("infiniStatus_t").elements  # code -> "INFINI_STATUS_..."
_STATUS_CODES = ffi.typeof("infiniStatus_t").relements  # "INFINI_STATUS_..." -> code


def status_name(code):
    return _STATUS_NAMES.get(code, "UNKNOWN_STATUS")


class InfiniopError(Exception):
    """A call failed; ``status`` is the infiniStatus_t code, ``status_name`` its C name."""

    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status

    @property
    def status_name(self):
        return status_name(self.status)


class InternalError(InfiniopError):
    status = _STATUS_CODES["INFINI_STATUS_INTERNAL_ERROR"]


class NotImplementedStatusError(InfiniopError):
    status = _STATUS_CODES["INFINI_STATUS_NOT_IMPLEMENTED"]


class BadParamError(InfiniopError, ValueError):
    status = _STATUS_CODES["INFINI_STATUS_BAD_PARAM"]


class NullPointerError(InfiniopError):
    status = _STATUS_CODES["INFINI_STATUS_NULL_POINTER"]


class DeviceTypeNotSupportedError(InfiniopError):
    status = _STATUS_CODES["INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED"]


class DeviceNotFoundError(InfiniopError):
    status = _STATUS_CODES["INFINI_STATUS_DEVICE_NOT_FOUND"]


class DeviceNotInitializedError(InfiniopError):
    status = _STATUS_CODES["INFINI_STATUS_DEVICE_NOT_INITIALIZED"]


class DeviceArchitectureNotSupportedError(InfiniopError):
    status = _STATUS_CODES["INFINI_STATUS_DEVICE_ARCHITECTURE_NOT_SUPPORTED"]


class BadTensorDtypeError(InfiniopError, ValueError):
    status = _STATUS_CODES["INFINI_STATUS_BAD_TENSOR_DTYPE"]


class BadTensorShapeError(InfiniopError, ValueError):
    status = _STATUS_CODES["INFINI_STATUS_BAD_TENSOR_SHAPE"]


class BadTensorStridesError(InfiniopError, ValueError):
    status = _STATUS_CODES["INFINI_STATUS_BAD_TENSOR_STRIDES"]


class InsufficientWorkspaceError(InfiniopError, ValueError):
    status = _STATUS_CODES["INFINI_STATUS_INSUFFICIENT_WORKSPACE"]


class ClosedError(RuntimeError):
    """The object was closed; its native resource is gone."""


_ERROR_BY_STATUS = {cls.status: cls for cls in InfiniopError.__subclasses__()}


def error_for_status(code):
    """The exception class for a status code (InfiniopError for a code with no subclass)."""
    return _ERROR_BY_STATUS.get(code, InfiniopError)


def check(status, what):
    """Raise the matching error, "<what> failed: <STATUS_NAME> (<code>)", unless status is SUCCESS."""
    status = int(status)
    if status != _STATUS_CODES["INFINI_STATUS_SUCCESS"]:
        raise error_for_status(status)(f"{what} failed: {status_name(status)} ({status})", status=status)
