"""Auto-tuning: pick the fastest (kernel variant, local size) with profiling events, and remember it.

For each candidate variant the tuner times a set of local sizes (median of a few profiled launches after
a warm-up) and keeps the fastest. The pick must not depend on noise, so the :data:`FINALISTS` fastest
candidates are timed again, in :data:`ROUNDS` interleaved rounds (a slow spell of the device hits them all
alike), each candidate's time is the median of its timings, and :func:`decide` picks the earliest-listed
candidate within :data:`TIE` of the fastest (the engine lists its heuristic favourite first): a kernel must
be clearly faster to displace an earlier one. Results are cached in memory and on disk, one JSON file per
device, keyed by

    device name, vendor, driver version (+ platform),     -> the file (``opencl-tune-<hash>.json``)
    the kernel sources' digest
    kernel program, variant, build options, global size,   -> the entry key
    scalar kernel arguments

and the entry holds ``{"lws": [...] or null, "ns": median ns, "level": "fast" | "full"}``. The decision for a
problem (the list of candidate keys) is stored too (``{"variant": ..., "lws": ..., ...}``), so a later
process, or a later layer of the same shape, reuses it without timing anything.

* ``QCONV_TUNE=none|fast|full`` (default ``fast``): ``none`` times nothing and touches no cache (the
  engine's heuristic choice); ``fast`` times a few variants x a few local sizes within a budget of 2 s of
  timed launches per problem; ``full`` times every variant x every power-of-two local size within 60 s of
  them. The budgets count timed launches only, not the compiles (one per variant and local size) nor the
  warm-up launches: how fast the machine compiles (a driver's binary cache warm or cold) changes neither which
  local sizes are timed nor the pick. Past the budget every remaining candidate is still timed at its first
  (best-guess) local size. A ``full`` entry satisfies a
  ``fast`` lookup, not the reverse.
* Location: ``QCONV_CACHE_DIR``, else ``platformdirs.user_cache_dir("qconv")``.
* A corrupt, unreadable or read-only cache gives a :class:`TuningCacheWarning` and tuning goes on in
  memory. Entries are checked before use: a malformed one, a decision naming a variant that is not a
  candidate, or a local size the candidate does not offer (the tuner only writes offered ones; a tampered
  file could launch a size a kernel's compiled-in reduction does not handle) is ignored with a warning and
  tuned again. A ``full`` entry whose local size the engine does not offer at the ``fast`` level is tuned
  again too. Writes are atomic (temporary file + ``os.replace``) and merge what other processes wrote.
* Tuning only chooses among variants that compute the same outputs; it never changes results beyond
  float rounding order (each variant is checked against the oracle by the tests).
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .context import device_identity, import_pyopencl
from .programs import kernels_digest

LEVELS = ("none", "fast", "full")
_RANK = {"none": 0, "fast": 1, "full": 2}
ENV_TUNE = "QCONV_TUNE"
ENV_CACHE = "QCONV_CACHE_DIR"
BUDGET_S = {"fast": 2.0, "full": 60.0}
REPEATS = {"fast": 5, "full": 9}
"""Profiled launches per timing (their median), after one warm-up launch."""
FINALISTS = 3
"""Candidates timed again before the decision."""
ROUNDS = 2
"""Interleaved re-timing rounds of the finalists."""
TIE = 0.03
"""Relative margin within which the earlier-listed candidate wins (:func:`decide`)."""
FORMAT = 1

stats = {"measured": 0, "cache_hits": 0, "selections": 0}
"""Counters of this process: local sizes timed, cache hits, tuned selections (for tests and benchmarks)."""


class TuningCacheWarning(UserWarning):
    """The on-disk tuning cache could not be read or written; tuning goes on in memory."""


def tune_level(override: str | None = None) -> str:
    """The tuning level: ``override`` if given, else ``$QCONV_TUNE``, else ``"fast"``."""
    value = override if override is not None else os.environ.get(ENV_TUNE, "fast")
    value = str(value).strip().lower() or "fast"
    if value not in LEVELS:
        raise ValueError(f"tuning level must be one of {LEVELS} (QCONV_TUNE or tune=), got {value!r}")
    return value


def cache_dir() -> Path:
    """``$QCONV_CACHE_DIR``, else the platform's user cache directory for qconv."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env)
    import platformdirs
    return Path(platformdirs.user_cache_dir("qconv"))


# {{{ cache

class TuningCache:
    """Tuning results of one device: a dict in memory backed by one JSON file."""

    def __init__(self, identity: dict, directory: Path):
        self.identity = dict(identity)
        digest = hashlib.sha1(json.dumps(self.identity, sort_keys=True).encode()).hexdigest()[:16]
        self.path = Path(directory) / f"opencl-tune-{digest}.json"
        self._lock = threading.Lock()
        self._entries: dict | None = None
        self._warned_write = False

    def _warn(self, msg: str):
        warnings.warn(f"qconv tuning cache {self.path}: {msg}; tuning results stay in memory",
                      TuningCacheWarning, stacklevel=4)

    def reject(self, key: str, why: str):
        """Forget the entry ``key`` (read from the file, but not usable here) with a warning."""
        with self._lock:
            if self._entries is not None:
                self._entries.pop(key, None)
        warnings.warn(f"qconv tuning cache {self.path}: entry ignored ({why}); tuning again",
                      TuningCacheWarning, stacklevel=4)

    def _read_disk(self, warn: bool) -> dict:
        try:
            text = self.path.read_text()
        except (FileNotFoundError, NotADirectoryError):  # nothing cached yet (or cannot be: warned at write)
            return {}
        except OSError as exc:
            if warn:
                self._warn(f"unreadable ({exc})")
            return {}
        try:
            data = json.loads(text)
            entries = data["entries"]
            if data.get("format") != FORMAT or not isinstance(entries, dict):
                raise ValueError("unknown format")
            valid = {k: v for k, v in entries.items() if isinstance(k, str) and _valid_entry(v)}
            if warn and len(valid) < len(entries):
                self._warn(f"{len(entries) - len(valid)} malformed entr{'y' if len(entries) - len(valid) == 1 else 'ies'} "
                           f"ignored (tuned again when needed)")
            return valid
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if warn:
                self._warn(f"corrupt ({type(exc).__name__}: {exc}); it will be rewritten")
            return {}

    def _ensure(self):
        if self._entries is None:
            self._entries = self._read_disk(warn=True)

    def get(self, key: str):
        with self._lock:
            self._ensure()
            return self._entries.get(key)

    def put(self, key: str, entry: dict):
        with self._lock:
            self._ensure()
            self._entries[key] = entry
            self._write()

    def _write(self):
        merged = self._read_disk(warn=False)
        merged.update(self._entries)
        self._entries = merged
        data = {"format": FORMAT, "device": self.identity, "entries": merged}
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, indent=0, sort_keys=True)
            os.replace(tmp, self.path)
            tmp = None
        except OSError as exc:
            if not self._warned_write:
                self._warned_write = True
                self._warn(f"not writable ({exc})")
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


def _valid_entry(v) -> bool:
    """The shape of an entry: a known level, a finite positive time, no local size or a list of positive ints."""
    if not isinstance(v, dict) or v.get("level") not in _RANK:
        return False
    ns = v.get("ns")
    if isinstance(ns, bool) or not isinstance(ns, (int, float)) or not (0 < ns < float("inf")):
        return False
    lws = v.get("lws")
    return lws is None or (isinstance(lws, list) and 1 <= len(lws) <= 3
                           and all(isinstance(i, int) and not isinstance(i, bool) and i >= 1 for i in lws))


def _fits(cand: "Candidate", lws) -> bool:
    """Whether ``lws`` (from the cache: a list or None) is a local size ``cand`` offers. Entries the tuner
    wrote always are (it times only those); anything else was edited or written by other code, and running
    it could fail to launch or break a kernel's reduction (local sizes are compiled in)."""
    want = None if lws is None else tuple(lws)
    return any((s is None and want is None) or (s is not None and want is not None and tuple(s) == want)
               for s in cand.local_sizes)


_caches: dict = {}
_caches_lock = threading.Lock()


def cache_for(device) -> TuningCache:
    """The (process-wide) :class:`TuningCache` of a ``pyopencl.Device`` in the current cache directory."""
    ident = {**device_identity(device), "kernels": kernels_digest()}  # new kernels: a new file
    directory = cache_dir()
    key = (json.dumps(ident, sort_keys=True), str(directory))
    with _caches_lock:
        c = _caches.get(key)
        if c is None:
            c = _caches[key] = TuningCache(ident, directory)
        return c


def clear_memory():
    """Forget the in-memory caches (the files stay): the next lookup reads the disk again."""
    with _caches_lock:
        _caches.clear()

# }}}


# {{{ selection

@dataclass
class Candidate:
    """One kernel variant to time.

    ``launch(queue, lws)`` enqueues the kernel once with local size ``lws`` (a tuple, or None for the
    driver's choice) and returns its event; a launch of several kernels returns the last one's and leaves
    (first event, last event) in ``info["state"]["events"]`` (timed from the first's start, see
    :func:`launch_span`). ``signature``: the global size and scalar arguments, so that a
    cache entry is only reused for the same problem. ``local_sizes``: the sizes to try, best guess first.
    ``programs(lws)`` (optional, with ``ctx``): the ``(program, options)`` pairs a launch with ``lws`` builds,
    so that :func:`select` builds every candidate's at once (:func:`~qconv.gpu.programs.build_many`).
    """

    variant: str
    program: str
    options: tuple
    signature: tuple
    local_sizes: list
    launch: Callable
    ctx: object = None
    programs: Callable | None = None
    info: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return json.dumps([self.program, self.variant, list(self.options), list(self.signature)])


def launch_span(cand: Candidate, queue, lws, *args, **kwargs):
    """Enqueues ``cand`` once; returns (first kernel's event, last kernel's event)."""
    last = cand.launch(queue, lws, *args, **kwargs)
    events = cand.info.get("state", {}).get("events")
    return (events[0], last) if events else (last, last)


def launch_times(queue, cand: Candidate, lws, repeats: int) -> list | None:
    """Device times (ns) of ``repeats`` launches of ``cand`` with local size ``lws`` after a warm-up launch, or
    None when the device refuses it (e.g. INVALID_WORK_GROUP_SIZE, OUT_OF_RESOURCES: not a candidate there).
    The only function of the tuner that touches the device (tests replace it with a fake timer)."""
    cl = import_pyopencl()
    try:
        cand.launch(queue, lws).wait()  # warm-up (and, on PoCL, the per-local-size compile)
        t0 = time.perf_counter()
        # all launches queued behind a user event before any runs: a candidate of several kernels is timed
        # on the device, without the host's submit time between its kernels
        gate = cl.UserEvent(queue.context)
        try:
            spans = [launch_span(cand, queue, lws, wait_for=[gate] if i == 0 else None) for i in range(repeats)]
        finally:
            gate.set_status(cl.command_execution_status.COMPLETE)
        queue.finish()
        _TIMED.s = getattr(_TIMED, "s", 0.0) + time.perf_counter() - t0
        return [b.profile.end - a.profile.start for a, b in spans]
    except cl.Error:
        return None


_TIMED = threading.local()   # seconds this thread spent in timed launches (warm-ups and compiles excluded)


def _timed_s() -> float:
    return getattr(_TIMED, "s", 0.0)


def _median_ns(queue, cand: Candidate, lws, repeats: int):
    times = launch_times(queue, cand, lws, repeats)
    if not times:
        return None
    stats["measured"] += 1
    return float(statistics.median(times))


def decide(times: list) -> int:
    """Index of the winner among ``times`` (ns per candidate in the engine's order; None: not timed): the
    earliest-listed candidate within :data:`TIE` of the fastest."""
    best = min(t for t in times if t is not None)
    return next(i for i, t in enumerate(times) if t is not None and t <= best * (1 + TIE))


def _final(queue, results: list, repeats: int) -> list:
    """``results`` (``(ns, idx, cand, lws)``) with the :data:`FINALISTS` fastest timed again in :data:`ROUNDS`
    interleaved rounds, each one's ns the median of all its timings; the others dropped."""
    finalists = sorted(results, key=lambda r: (r[0], r[1]))[:FINALISTS]
    if len(finalists) < 2:
        return finalists
    timings = [[r[0]] for r in finalists]
    for _ in range(ROUNDS):
        for t, (_, _, cand, lws) in zip(timings, finalists):
            ns = _median_ns(queue, cand, lws, repeats)
            if ns is not None:
                t.append(ns)
    return [(float(statistics.median(t)), *r[1:]) for t, r in zip(timings, finalists)]


def _build_untimed(cache, candidates: list, level: str) -> None:
    """Builds the programs of every candidate that :func:`select` will time (no usable cache entry), at once."""
    from .programs import build_many

    by_ctx: dict = {}
    for cand in candidates:
        entry = cache.get(cand.key)
        if cand.programs is None or (entry is not None and _RANK[entry["level"]] >= _RANK[level]):
            continue
        pairs = by_ctx.setdefault(id(cand.ctx), (cand.ctx, set()))[1]
        for lws in cand.local_sizes:
            pairs |= cand.programs(lws)
    for ctx, pairs in by_ctx.values():
        build_many(ctx, pairs)


def select(device, queue, candidates: list, level: str):
    """Fastest ``(candidate, lws, ns)`` among ``candidates`` (``ns`` None when nothing was timed).

    ``level == "none"`` returns the first candidate with its first local size, untimed. ``queue`` must have
    profiling enabled.
    """
    if not candidates:
        raise ValueError("no kernel candidates to select from")
    if level == "none":
        c = candidates[0]
        return c, c.local_sizes[0], None
    cache = cache_for(device)
    skey = json.dumps(["select", [c.key for c in candidates]])
    entry = cache.get(skey)
    if entry is not None and _RANK[entry["level"]] >= _RANK[level]:
        cand = next((c for c in candidates if c.variant == entry.get("variant")), None)
        if cand is None:
            cache.reject(skey, f"variant {entry.get('variant')!r} is none of {[c.variant for c in candidates]}")
        elif not _fits(cand, entry["lws"]):
            cache.reject(skey, f"local size {entry['lws']} is none of {cand.variant}'s {cand.local_sizes}")
        else:
            stats["cache_hits"] += 1
            return cand, (None if entry["lws"] is None else tuple(entry["lws"])), entry["ns"]
    stats["selections"] += 1
    budget, repeats = BUDGET_S[level], REPEATS[level]
    start = _timed_s()   # the budget counts timed launches only: compile speed (a driver's binary cache is
    #                      warm or cold) must not change which local sizes are timed, so neither the pick
    _build_untimed(cache, candidates, level)
    results = []
    for idx, cand in enumerate(candidates):
        entry = cache.get(cand.key)
        if entry is not None and not _fits(cand, entry["lws"]):
            cache.reject(cand.key, f"local size {entry['lws']} is none of {cand.variant}'s {cand.local_sizes}")
            entry = None
        if entry is not None and _RANK[entry["level"]] >= _RANK[level]:
            stats["cache_hits"] += 1
            lws = None if entry["lws"] is None else tuple(entry["lws"])
            results.append((entry["ns"], idx, cand, lws))
            continue
        best = None  # past the budget a candidate is still timed at its first (best-guess) local size
        complete = True
        for lws in cand.local_sizes:
            if best is not None and _timed_s() - start >= budget:
                complete = False
                break
            ns = _median_ns(queue, cand, lws, repeats)
            if ns is not None and (best is None or ns < best[0]):
                best = (ns, lws)
        if best is None:
            continue
        if complete:
            cache.put(cand.key, {"lws": None if best[1] is None else list(best[1]), "ns": best[0], "level": level})
        results.append((best[0], idx, cand, best[1]))
    if not results:
        c = candidates[0]
        return c, c.local_sizes[0], None
    results = sorted(_final(queue, results, repeats), key=lambda r: r[1])
    ns, _, cand, lws = results[decide([r[0] for r in results])]
    cache.put(skey, {"variant": cand.variant, "lws": None if lws is None else list(lws), "ns": ns, "level": level})
    return cand, lws, ns

# }}}

# vim: foldmethod=marker
