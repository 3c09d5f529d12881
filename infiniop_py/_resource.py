"""Lifetime of one native object: close() (idempotent), with-statement, weakref.finalize fallback, and the calls in
flight that close() waits for.

Thread rules (docs/guarantees.md): an object may be shared by threads; close() refuses new calls at once,
waits for those already running, then destroys the native object; at interpreter exit nothing is destroyed
(finalizers do not run at exit: a daemon thread may still be inside a native call, and the process's end frees
the memory anyway).
"""

import threading
import weakref

from .errors import ClosedError, check


def _destroy_quietly(destroy, pointer):
    # Runs from the garbage collector, where an exception could only be printed: the status is dropped on
    # purpose. An object being collected has no call in flight (a call holds a reference to it).
    destroy(pointer)


class NativeResource:
    """Owns one native pointer and the C function that destroys it."""

    _finalizer = None
    _closing = False  # class defaults: an object whose __init__ failed before _own still answers `closed`
    _drained = None  # set by the last call to end once closing; made by close() only when calls are running

    def _own(self, pointer, destroy, destroy_name):
        """Take ``pointer``, destroyed by ``destroy`` on close() or, failing that, by a weakref.finalize when the
        object is collected (not at exit)."""
        self._pointer = pointer
        self._destroy = destroy
        self._destroy_name = destroy_name
        self._calls = 0  # native calls in flight on this object
        self._closing = False
        # Guards the two above and _drained; a bare Lock: a call pays two acquire/release pairs. The Event is made
        # on demand: it costs more than the rest of an object (1.6 us).
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _destroy_quietly, destroy, pointer)
        self._finalizer.atexit = False

    @property
    def closed(self):
        return self._closing or self._finalizer is None or not self._finalizer.alive

    def _open_pointer(self):
        """The native pointer; ClosedError once closed. For a use that ends before close() can run (creating
        another object from it); a native call on it goes through _begin_call / _end_call."""
        if self.closed:
            raise ClosedError(f"{type(self).__name__} is closed")
        return self._pointer

    def _begin_call(self):
        """The native pointer for a native call, which close() then waits for: pair with _end_call (try/finally).
        ClosedError once closed (or closing)."""
        lock = self._lock
        lock.acquire()
        if self._closing:
            lock.release()
            raise ClosedError(f"{type(self).__name__} is closed")
        self._calls += 1
        lock.release()
        return self._pointer

    def _end_call(self):
        lock = self._lock
        lock.acquire()
        self._calls -= 1
        drained = self._drained if self._closing and self._calls == 0 else None  # close() made it: it waits
        lock.release()
        if drained is not None:
            drained.set()

    def close(self):
        """Destroy the native object now, after the calls already running on it (new ones raise ClosedError).
        Calling it again does nothing."""
        if self._finalizer is None:
            return
        with self._lock:
            self._closing = True
            running = self._calls
            if running and self._drained is None:  # a second close() waits on the same Event
                self._drained = threading.Event()
            drained = self._drained
        if running:
            drained.wait()
        if self._finalizer.detach() is not None:
            check(self._destroy(self._pointer), self._destroy_name)

    def __enter__(self):
        self._open_pointer()
        return self

    def __exit__(self, *exc_info):
        self.close()
