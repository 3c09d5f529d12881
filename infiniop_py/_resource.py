"""Lifetime of one native object: close() (idempotent), with-statement, weakref.finalize fallback."""

import weakref

from .errors import ClosedError, check


def _destroy_quietly(destroy, pointer):
    # Runs from the garbage collector or at exit, where an exception could only be printed:
    # the status is dropped on purpose.
    destroy(pointer)


class NativeResource:
    """Owns one native pointer and the C function that destroys it."""

    _finalizer = None

    def _own(self, pointer, destroy, destroy_name):
        self._pointer = pointer
        self._destroy = destroy
        self._destroy_name = destroy_name
        self._finalizer = weakref.finalize(self, _destroy_quietly, destroy, pointer)

    @property
    def closed(self):
        return self._finalizer is None or not self._finalizer.alive

    def _open_pointer(self):
        """The native pointer; ClosedError once closed."""
        if self.closed:
            raise ClosedError(f"{type(self).__name__} is closed")
        return self._pointer

    def close(self):
        """Destroy the native object now. Calling it again does nothing."""
        if self._finalizer is not None and self._finalizer.detach() is not None:
            check(self._destroy(self._pointer), self._destroy_name)

    def __enter__(self):
        self._open_pointer()
        return self

    def __exit__(self, *exc_info):
        self.close()
