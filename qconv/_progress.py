"""Progress bars of the command-line tools and long library calls: one tqdm on stderr, off when not asked."""
from __future__ import annotations

import sys


def bar(iterable=None, *, total: int | None = None, desc: str = "", unit: str = "it", enabled: bool = True,
        leave: bool = False):
    """A tqdm bar on stderr over ``iterable`` (or one driven by ``update``, with ``total``); ``enabled=False`` gives
    a silent pass-through (tqdm's ``disable``), so callers never branch on it."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr, leave=leave)
