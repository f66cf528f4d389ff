"""The CPU engine's scratch arena: one set of work buffers per Python thread, shared by every layer.

A call of :class:`~qconv.cpu.CpuEngine` needs scratch (the quantized input, per-pixel sums, indirection tables,
per-thread output tiles, ...) sized by the layer and the input size. Layers run one after the other on a thread,
so instead of scratch per layer and shape (a whole model would keep the sum of all its layers' scratch), each
thread has one :class:`Arena`: named flat buffers, each grown to the largest request it has seen (no copy: the
contents never outlive a call). The engine binds views of them for one call and releases them after, so an
arena's buffers are the only scratch a thread keeps -- about the largest layer's, whatever the model.

:meth:`Arena.take_all` hands a call its set of views, and the same views again to the next call of the same sizes
until a buffer is replaced (a small layer's set-up: 64->64 ``Linear`` 53 -> 38 us a call).

:func:`arena` is the calling thread's arena; :func:`release` frees it (the next call allocates again).
Every buffer starts on a 64-byte boundary, as do the weight copies :func:`aligned` makes: a kernel's 64-byte rows
then never straddle two cache lines (AMX weight tiles 16 bytes off a boundary measured 1.9x slower).
"""
from __future__ import annotations

import threading

import numpy as np

_LOCAL = threading.local()
ALIGN = 64


def empty_aligned(nbytes: int, align: int = ALIGN) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` whose data starts on an ``align``-byte boundary."""
    buf = np.empty(int(nbytes) + align, np.uint8)
    off = (-buf.ctypes.data) % align
    return buf[off:off + int(nbytes)]


def aligned(a: np.ndarray, align: int = ALIGN) -> np.ndarray:
    """A C-contiguous copy of ``a`` (same shape and dtype) whose data starts on an ``align``-byte boundary."""
    a = np.asarray(a)
    out = empty_aligned(a.nbytes, align).view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


class Arena:
    """Named flat scratch buffers, grown on demand (one per Python thread, see the module docstring)."""

    def __init__(self):
        self._bufs: dict = {}
        self._views: dict = {}   # take_all's results, valid until a buffer is replaced

    def take(self, name: str, count: int, dtype) -> np.ndarray:
        """A 1-D ``dtype`` view of ``count`` elements (>= 1) of buffer ``name``, uninitialised. The buffer is
        replaced by a larger one when it is too small; views taken earlier keep the old one alive, so take views
        per call and drop them after."""
        dtype = np.dtype(dtype)
        nbytes = max(1, int(count)) * dtype.itemsize
        buf = self._bufs.get(name)
        if buf is None or buf.nbytes < nbytes:
            self._views.clear()
            self._bufs[name] = buf = None   # free the old buffer before the new one is allocated
            buf = self._bufs[name] = empty_aligned(nbytes)
        return buf[:nbytes].view(dtype)

    def take_all(self, sizes: tuple) -> dict:
        """``{name: view}`` for ``sizes``, a tuple of ``(name, count, dtype)`` (as :meth:`take` each); the same
        views again, without taking them anew, until one of this arena's buffers is replaced (a layer's per-call
        set-up on small inputs). The caller owns the returned dict (a copy)."""
        views = self._views.get(sizes)
        if views is None:
            views = {name: self.take(name, count, dtype) for name, count, dtype in sizes}
            if len(self._views) >= 64:
                self._views.clear()
            self._views[sizes] = views
        return dict(views)

    @property
    def nbytes(self) -> int:
        """Bytes held by this arena."""
        return int(sum(b.nbytes for b in self._bufs.values()))

    def clear(self) -> None:
        """Drop every buffer."""
        self._views.clear()
        self._bufs.clear()


def arena() -> Arena:
    """The calling thread's arena."""
    a = getattr(_LOCAL, "arena", None)
    if a is None:
        a = _LOCAL.arena = Arena()
    return a


def release() -> None:
    """Free the calling thread's scratch (e.g. after a model's last run; the next call allocates it again)."""
    arena().clear()
