"""clattn's exceptions: one class per C status (clattn_status), all subclasses of clattn.Error, each
also a subclass of the built-in exception a Python caller would catch for it (ValueError for bad
arguments and shapes, MemoryError for sizes the device or host cannot hold, ...)."""
from __future__ import annotations

from . import _lib


class Error(Exception):
    """A clattn failure.

    status       the C status (int: clattn's -3001 .. -3010, or an OpenCL / CLBlast code passed through)
    status_name  "CLATTN_STATUS_SHAPE_MISMATCH", "CL_OUT_OF_RESOURCES", ...
    message      what was wrong, in the terms of the Python call when Python found it, else the library's
    build_log    the OpenCL build log when a kernel build failed, else ""
    """

    status: int
    status_name: str
    message: str
    build_log: str

    def __init__(self, status: int, message: str, build_log: str = ""):
        self.status = int(status)
        self.status_name = _lib.STATUS_NAMES.get(self.status) or (_lib.status_string(self.status) or b"").decode()
        self.message = message
        self.build_log = build_log
        super().__init__(f"{self.status_name}: {message}" + (f"\n{build_log}" if build_log else ""))


class InvalidArgumentError(Error, ValueError):
    """CLATTN_STATUS_INVALID_ARGUMENT: a value, type or flag clattn does not take."""


class ShapeMismatchError(Error, ValueError):
    """CLATTN_STATUS_SHAPE_MISMATCH: arrays whose shapes do not fit the module or each other."""


class SizeOverflowError(Error, OverflowError):
    """CLATTN_STATUS_SIZE_OVERFLOW: a size beyond size_t or the kernels' index range."""


class TooLargeForDeviceError(Error, MemoryError):
    """CLATTN_STATUS_TOO_LARGE_FOR_DEVICE: more than the device's largest allocation or its memory."""


class OutOfHostMemoryError(Error, MemoryError):
    """CLATTN_STATUS_OUT_OF_HOST_MEMORY."""


class DeviceAllocationError(Error, MemoryError):
    """CLATTN_STATUS_DEVICE_ALLOCATION: the OpenCL driver could not allocate a buffer."""


class BuildFailureError(Error, RuntimeError):
    """CLATTN_STATUS_BUILD_FAILURE: a kernel did not compile; build_log says why."""


class UnsupportedError(Error, NotImplementedError):
    """CLATTN_STATUS_UNSUPPORTED: a feature this device or algorithm does not have."""


class NoDeviceError(Error, RuntimeError):
    """CLATTN_STATUS_NO_DEVICE: no device matches the spec."""


class InvalidDeviceSpecError(Error, ValueError):
    """CLATTN_STATUS_INVALID_DEVICE_SPEC: a device spec that cannot be parsed."""


class OpenCLError(Error, RuntimeError):
    """An OpenCL or CLBlast status that the library passed through (status_name names it)."""


_BY_STATUS = {
    -3001: InvalidArgumentError, -3002: ShapeMismatchError, -3003: SizeOverflowError, -3004: TooLargeForDeviceError,
    -3005: OutOfHostMemoryError, -3006: DeviceAllocationError, -3007: BuildFailureError, -3008: UnsupportedError,
    -3009: NoDeviceError, -3010: InvalidDeviceSpecError,
}


def error(status: int, message: str, build_log: str = "") -> Error:
    """The exception for a C status."""
    return _BY_STATUS.get(int(status), OpenCLError)(status, message, build_log)


def check(status: int, what: str) -> None:
    """Raise the exception for a failed C call, with the library's detail and build log."""
    if status != 0:
        msg = (_lib.last_error() or b"").decode(errors="replace")
        log = (_lib.last_build_log() or b"").decode(errors="replace") if status == _lib.BUILD_FAILURE else ""
        raise error(status, f"{what}: {msg}" if msg else what, log)


def invalid(message: str):
    raise InvalidArgumentError(_lib.INVALID_ARGUMENT, message)


def shape(message: str):
    raise ShapeMismatchError(_lib.SHAPE_MISMATCH, message)
