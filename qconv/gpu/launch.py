"""Prepared launches: a launch sequence with every constant argument bound once.

A kernel family describes one launch of a layer as a list of :class:`Step` s (program, build options,
kernel name, arguments, global and local size). Arguments are constants (``numpy`` scalars,
``pyopencl.LocalMemory``, weight buffers) or placeholders:

* :data:`X` / :data:`Y`: the call's input / output buffer (a ``pyopencl`` memory object, whole buffer);
* :class:`Scratch` ``(nbytes, name)``: a device buffer the plan owns, one per command queue (launches on
  one in-order queue run in order, so successive calls never share one at the same time; two queues never
  share one at all).

:class:`LaunchPlan` builds its **own** kernel objects from the memoised programs (``cl.Kernel(program,
name)``: two plans never share a kernel object, so the arguments bound in one are never clobbered by
another layer), binds every constant once, and per call binds only the placeholders whose buffer changed
(identity test: the plan keeps a reference to the last bound buffers, so one input and one output buffer stay
allocated until the next call) and enqueues the steps: no build-option hashing, no memo lookups, no
``set_args`` of the whole list. A plan is safe to share between threads: binding and enqueueing happen under the plan's lock
(pyopencl kernels with set arguments are not thread-safe), so concurrent calls run the same kernels with
the same arguments (bitwise deterministic).

:func:`planned_candidate` wraps a family's ``steps(lws)`` as a :class:`~qconv.gpu.tuning.Candidate` for the
tuner, one plan per local size; the engine keeps the winner's plan, so the prepared path runs exactly the
kernels and arguments the tuner timed and the first call ran.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from .context import import_pyopencl
from .programs import get_program


def make_kernel(ctx, program: str, options: tuple, name: str):
    """A new kernel object ``name`` of the memoised program (never shared: a plan binds its arguments)."""
    cl = import_pyopencl()
    return cl.Kernel(get_program(ctx, program, options), name)


class _Slot:
    """A per-call buffer placeholder (:data:`X` or :data:`Y`)."""

    __slots__ = ("name", "index")

    def __init__(self, name: str, index: int):
        self.name, self.index = name, index

    def __repr__(self) -> str:
        return self.name.upper()


X = _Slot("x", 0)
"""Placeholder of the call's input buffer."""
Y = _Slot("y", 1)
"""Placeholder of the call's output buffer."""


class Scratch:
    """A device buffer of ``nbytes`` owned by a plan, one per command queue (``name`` for messages).

    The same object in several steps (or plans of one candidate) means the same buffer within a plan."""

    __slots__ = ("nbytes", "name")

    def __init__(self, nbytes: int, name: str = "scratch"):
        self.nbytes, self.name = max(4, int(nbytes)), name

    def __repr__(self) -> str:
        return f"Scratch({self.nbytes}, {self.name!r})"


@dataclass(frozen=True)
class Step:
    """One kernel launch: ``program``/``options`` as :func:`qconv.gpu.programs.get_program` takes them,
    ``kernel`` the kernel's name, ``args`` its arguments in order (constants or :data:`X`, :data:`Y`,
    :class:`Scratch`), ``gsize`` the global size and ``lsize`` the local size (None: the driver's)."""

    program: str
    options: tuple
    kernel: str
    args: tuple
    gsize: tuple
    lsize: tuple | None = None


class LaunchPlan:
    """A prepared launch sequence (see the module docstring).

    ``enqueue(queue, x, y, wait_for=None)`` -> ``(first event, last event)``: ``x``/``y`` are whole
    ``pyopencl`` memory objects (``Array.base_data``); ``wait_for`` (a list of events or None) gates the
    first launch; later launches wait for the previous one when ``queue`` is out-of-order (in order
    otherwise; there a call of a plan with scratch buffers also waits for the previous call's last launch). ``lock``: held while binding and enqueueing; ``enqueue_locked`` is ``enqueue`` for callers
    that hold it. ``scratch_registry``: an optional dict that receives ``queue.int_ptr -> (buffers, in the
    order of ``scratch``, then as their Scratch first appears)`` when a queue's scratch is allocated.
    """

    def __init__(self, ctx, steps, label: str = "", scratch_registry: dict | None = None, scratch: tuple = ()):
        cl = import_pyopencl()
        if not steps:
            raise ValueError("a launch plan needs at least one step")
        self.ctx, self.steps, self.label = ctx, tuple(steps), label
        self.lock = threading.Lock()
        self._scratch_specs: list = list(scratch)
        self._registry = scratch_registry
        self._launches = []   # (kernel, gsize, lsize)
        self._bindings = []   # (kernel, arg index, value index: 0 = x, 1 = y, 2 + i = scratch i)
        for step in self.steps:
            kernel = make_kernel(ctx, step.program, step.options, step.kernel)
            for i, a in enumerate(step.args):
                if isinstance(a, _Slot):
                    self._bindings.append((kernel, i, a.index))
                elif isinstance(a, Scratch):
                    if not any(a is s for s in self._scratch_specs):
                        self._scratch_specs.append(a)
                    k = next(j for j, s in enumerate(self._scratch_specs) if s is a)
                    self._bindings.append((kernel, i, 2 + k))
                else:
                    kernel.set_arg(i, a)
            self._launches.append((kernel, tuple(step.gsize), None if step.lsize is None else tuple(step.lsize)))
        self._bound = [None] * len(self._bindings)
        self._queues: dict = {}  # queue.int_ptr -> (scratch buffers, in_order)
        self._enqueue = cl.enqueue_nd_range_kernel
        self._ooo = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE

    def _queue_state(self, queue):
        cl = import_pyopencl()
        bufs = tuple(cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, s.nbytes) for s in self._scratch_specs)
        state = [bufs, not queue.properties & self._ooo, None]  # + an out-of-order queue's last event
        self._queues[queue.int_ptr] = state
        if self._registry is not None and bufs:
            self._registry[queue.int_ptr] = bufs
        return state

    def enqueue(self, queue, x, y, wait_for=None):
        with self.lock:
            return self.enqueue_locked(queue, x, y, wait_for)

    def enqueue_locked(self, queue, x, y, wait_for=None, events=None):
        """``enqueue`` for a caller holding ``lock``; ``events``: a list that receives every launch's event."""
        state = self._queues.get(queue.int_ptr)
        if state is None:
            state = self._queue_state(queue)
        scratch, in_order = state[0], state[1]
        bound = self._bound
        for j, (kernel, i, v) in enumerate(self._bindings):
            buf = x if v == 0 else y if v == 1 else scratch[v - 2]
            if bound[j] is not buf:
                kernel.set_arg(i, buf)
                bound[j] = buf
        enqueue = self._enqueue
        launches = self._launches
        if not in_order and state[2] is not None:  # the previous call's scratch use comes first
            wait_for = list(wait_for or ()) + [state[2]]
        kernel, g, l = launches[0]
        first = ev = enqueue(queue, kernel, g, l, wait_for=wait_for)
        if events is not None:
            events.append(ev)
        for kernel, g, l in launches[1:]:
            ev = enqueue(queue, kernel, g, l, wait_for=None if in_order else [ev])
            if events is not None:
                events.append(ev)
        if not in_order and scratch:
            state[2] = ev
        return first, ev

    def forget_buffers(self):
        """Drop the references to the last bound buffers (so a pool can reuse x / y) and every queue's scratch
        (after tuning: the tuner's queue never runs this plan again; a call's queue allocates its own)."""
        with self.lock:
            self._bound = [None] * len(self._bindings)
            if self._registry is not None:
                for key in self._queues:
                    self._registry.pop(key, None)
            self._queues.clear()

    def describe(self) -> str:
        return " + ".join(f"{s.program}:{s.kernel}" for s in self.steps) + (f" ({self.label})" if self.label else "")


def remap(steps, mapping: dict):
    """``steps`` with the placeholders in ``mapping`` (e.g. ``{X: scratch}``) replaced (identity keys)."""
    out = []
    for s in steps:
        args = tuple(next((v for k, v in mapping.items() if a is k), a) for a in s.args)
        out.append(Step(s.program, s.options, s.kernel, args, s.gsize, s.lsize))
    return out


def planned_candidate(ctx, variant: str, program: str, options: tuple, signature: tuple, local_sizes: list,
                      steps: Callable, label: str = "", scratch: tuple = ()):
    """A :class:`~qconv.gpu.tuning.Candidate` whose ``launch(queue, lws, bufs=None, wait_for=None)`` runs
    the :class:`LaunchPlan` of ``steps(lws)`` (built once per local size; ``bufs``: ``(x, y)`` buffers, else
    ``info["state"]["bufs"]``). ``info``: ``state`` (``bufs``, ``events`` = (first, last) of the last
    launch, ``scratch`` = queue -> scratch buffers), ``steps`` (the function) and ``plan(lws)`` (the
    :class:`LaunchPlan`), ``keep(lws)`` (drop the other local sizes' plans, after tuning), ``release()`` (drop
    every plan: a candidate the tuner did not pick). ``scratch``: Scratch objects in the order
    ``info["state"]["scratch"]`` lists their buffers. ``programs(lws)``: the ``(program, options)`` its plan
builds (the tuner builds all candidates' at once)."""
    from . import tuning

    state = {"bufs": None, "events": None, "scratch": {}}
    plans: dict = {}

    def plan(lws):
        key = None if lws is None else tuple(lws)
        p = plans.get(key)
        if p is None:
            p = plans[key] = LaunchPlan(ctx, steps(lws), f"{variant} lws={key}", state["scratch"], scratch)
        return p

    def launch(queue, lws, bufs=None, wait_for=None):
        xbuf, ybuf = bufs if bufs is not None else state["bufs"]
        first, last = plan(lws).enqueue(queue, xbuf, ybuf, wait_for)
        state["events"] = (first, last)
        return last

    def keep(lws):
        key = None if lws is None else tuple(lws)
        for k in [k for k in plans if k != key]:
            del plans[k]
        if key in plans:
            plans[key].forget_buffers()

    def release():
        plans.clear()

    def programs(lws):
        return {(s.program, tuple(s.options)) for s in steps(lws)}

    c = tuning.Candidate(variant, program, options, signature, local_sizes, launch, ctx=ctx, programs=programs)
    c.info.update(state=state, steps=steps, plan=plan, keep=keep, release=release, label=label,
                  scratch=tuple(scratch))
    return c
