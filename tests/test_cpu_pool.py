"""The CPU engine's one parallel-for (``qconv/_ext/qconv_pool.h``): every item once, thread indices below the
count, a part of the items per thread, nested calls inline, a stalled worker's chunks taken by the others (through the pool's testing hook), the
same bits on 1, 2 and 3 threads on every path (GEMM int8, float GEMM, GEMV channel split, block mode, direct
float, Winograd, depthwise), and the default thread count. No timing is asserted: the stalled worker waits until
every chunk of the call is claimed (with a cap only a broken split reaches)."""
import numpy as np
import pytest

import qconv
from qconv._ext import _cpu_testing as T
from qconv.cpu import CpuEngine, default_threads, select_kernel
from qconv.geometry import ConvSpec

pytestmark = pytest.mark.usefixtures("threaded_paths")

# a stalled worker waits at most this long (ms) for the others to claim every chunk: only reached when they cannot
STALL_CAP_MS = 20000


@pytest.fixture
def pool_hook():
    """Arms the testing hook through ``T._test_pool_hook`` in the test; always disarmed after."""
    yield T._test_pool_hook
    T._test_pool_hook(-1, 0, False)


@pytest.mark.parametrize("n, chunk, threads", [(1, 1, 2), (5, 1, 3), (100, 1, 2), (100, 7, 3), (1000, 3, 2),
                                               (64, 64, 2), (37, 5, 8), (10, 1, 1)])
def test_parallel_for_runs_every_item_once(n, chunk, threads):
    tid_of, runs, total = T._test_parallel_for(n, chunk, threads, work=2000)
    assert (runs == 1).all()
    assert ((tid_of >= 0) & (tid_of < threads)).all()
    assert total == -(-n // chunk)   # each chunk returns 1: the returned sum counts the chunks
    # a chunk is chunk consecutive items on one thread
    for b in range(0, n, chunk):
        assert len(set(tid_of[b:b + chunk])) == 1


def test_parallel_for_nested_runs_inline():
    """A parallel-for issued from inside a body runs on its caller (no deadlock), every item counted."""
    tid_of, runs, total = T._test_parallel_for(60, 1, 2, nested=9, work=2000)
    assert (runs == 1).all() and total == 60


def test_parallel_for_back_to_back_calls():
    """Many short calls with changing thread counts (workers late for a call, a call with fewer threads than
    workers): each runs every item once, on thread indices below its own count."""
    rng = np.random.default_rng(5)
    for _ in range(600):
        n, chunk, threads = int(rng.integers(1, 40)), int(rng.integers(1, 4)), int(rng.integers(1, 5))
        tid_of, runs, total = T._test_parallel_for(n, chunk, threads, work=int(rng.integers(0, 3000)))
        assert (runs == 1).all() and total == -(-n // chunk)
        assert ((tid_of >= 0) & (tid_of < threads)).all()


def test_a_worker_late_for_a_call_never_claims_an_item_of_the_next():
    """Small and larger calls back to back in native code, thousands of times: every item of every call runs once
    and every call returns its chunk count (a worker still holding a finished call's ticket once claimed items
    past its end against the next call's n: a double run, a hang or a crash, in ~1 of 15 PP-OCRv4 det sessions)."""
    ns = np.array([2, 64, 1, 37, 3, 128], np.int64)
    for work in (100, 200, 300, 500):   # (a race: without the fix this caught it -- a hang -- in 1 of 4 runs)
        runs, wrong = T._test_parallel_for_burst(ns, 2, 5000, work)
        assert wrong == 0, work
        np.testing.assert_array_equal(runs, [5000 * int((ns > i).sum()) for i in range(ns.max())])


def test_parallel_for_from_two_python_threads():
    """Calls from two Python threads at once (the GIL released): one of them runs inline, both complete."""
    import threading

    errors = []

    def calls():
        for _ in range(150):
            tid_of, runs, total = T._test_parallel_for(64, 1, 2, work=3000)
            if not ((runs == 1).all() and total == 64 and ((tid_of >= 0) & (tid_of < 2)).all()):
                errors.append((runs, total))

    th = [threading.Thread(target=calls) for _ in range(2)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not errors


@pytest.mark.parametrize("n, chunk", [(100, 1), (101, 3), (8, 1)])
def test_each_thread_starts_with_its_own_part(n, chunk):
    """The items are cut into one contiguous part a thread (in whole chunks), and thread t claims from part t
    before the others': so with two threads, the worker's first item lies in the second part (whenever it
    joins, the caller only reaches that part once the first is all claimed). That is what keeps a layer's share of the data on the core that wrote it in the layer before."""
    nchunks = -(-n // chunk)
    lo1 = nchunks // 2 * chunk
    for _ in range(200):
        tid_of, runs, total, when = T._test_parallel_for(n, chunk, 2, work=3000, order=True)
        assert (runs == 1).all() and total == nchunks
        mine = np.flatnonzero(tid_of == 1)
        if mine.size:
            assert mine[np.argmin(when[mine])] >= lo1


@pytest.mark.parametrize("threads, stalled", [(2, 1), (3, 1), (3, 2)])
def test_stalled_worker_chunks_taken_by_others(pool_hook, threads, stalled):
    pool_hook(stalled, STALL_CAP_MS, True)
    tid_of, runs, total = T._test_parallel_for(300, 1, threads, work=20000)
    chunks = T._test_pool_chunks(threads)
    assert (runs == 1).all() and total == 300
    assert chunks[stalled] == 0 and sum(chunks) == 300
    assert not (tid_of == stalled).any()


def _layers():
    """Representative layers of every path: name -> (spec, x, path, split)."""
    rng = np.random.default_rng(37)

    def w(o, c, k, bits=8, groups=1, bs=0):
        return qconv.quantize_weight(rng.standard_normal((o, c // groups, k, k)).astype(np.float32) * 0.1,
                                     bits=bits, block_size=bs, symmetric=bits == 8, groups=groups)

    def x(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    b = rng.standard_normal(48).astype(np.float32)
    return {
        "gemm int8": (ConvSpec(w(40, 24, 3), b[:40], 1, 1, 1, "relu", "row"), x(2, 24, 21, 19), "gemm", "columns"),
        # per-tensor: the direct int8 conv where the default kernel is "amx", else the tiled GEMM
        "amx conv": (ConvSpec(w(40, 70, 3), b[:40], 1, 1, 1, "relu", "tensor"), x(2, 70, 21, 19), "gemm",
                     "direct-int8" if select_kernel() in ("amx", "avx512vnni") else "columns"),
        "gemm int4 row": (ConvSpec(w(33, 32, 1, bits=4, bs=32), b[:33], act_quant="row"), x(1, 32, 30, 30), "gemm",
                          "columns"),
        "gemm block": (ConvSpec(w(40, 64, 3, bits=4, bs=32), None, 2, 1, 1, None, "block"), x(1, 64, 20, 20),
                       "gemm", "columns"),
        "gemm float grouped": (ConvSpec(w(42, 32, 3, groups=2), b[:42], 1, 1, 1, "hardswish", None),
                               x(1, 32, 17, 17), "gemm", "columns"),
        "direct grouped": (ConvSpec(w(48, 32, 3, groups=2), b, 2, 1, 1, "hardswish", None), x(1, 32, 17, 17),
                           "direct", "strips"),
        "gemv": (ConvSpec(w(200, 128, 1), b[:1].repeat(200), act_quant="row"), x(1, 128, 1, 1), "gemm", "channels"),
        "direct": (ConvSpec(w(21, 19, 3), None, 2, 1, 1, "relu6", None), x(2, 19, 41, 37), "direct", "strips"),
        "winograd": (ConvSpec(w(24, 16, 3), b[:24], 1, 1, 1, None, None), x(1, 16, 64, 64), "direct", "strips"),
        "depthwise int8": (ConvSpec(w(24, 24, 3, groups=24), b[:24], 1, 1, 1, "relu", "tensor"), x(2, 24, 33, 29),
                           "depthwise", "planes"),
        "depthwise float": (ConvSpec(w(24, 24, 5, groups=24), b[:24], 2, 2, 1, None, None), x(1, 24, 48, 48),
                            "depthwise", "planes"),
    }


LAYERS = _layers()


@pytest.mark.parametrize("name", list(LAYERS))
def test_layers_same_bits_on_1_2_3_threads(name):
    spec, x, path, split = LAYERS[name]
    one = CpuEngine(spec, threads=1)
    assert one.path == path
    y1 = one.forward(x)
    assert one.last_call["split"] == ("columns" if split == "channels" else split)   # one thread: never channels
    if name == "winograd" and one.kernel != "scalar":   # Winograd runs on AVX2
        assert one.last_call["winograd"]
    for threads in (2, 3):
        eng = CpuEngine(spec, threads=threads)
        y = eng.forward(x)
        assert eng.last_call["gemm_threads"] == threads and eng.last_call["split"] == split
        assert np.array_equal(y.view(np.uint32), y1.view(np.uint32)), (name, threads)


@pytest.mark.parametrize("name", ["gemm int8", "amx conv", "gemv", "direct", "winograd", "depthwise int8"])
@pytest.mark.parametrize("threads, stalled", [(2, 1), (3, 2)])
def test_layer_stalled_worker(pool_hook, name, threads, stalled):
    """One worker stalled before its first chunk of every parallel-for of the call: the other threads run all the
    chunks (its count stays 0), and the result is the 1-thread result's bits."""
    spec, x, _, _ = LAYERS[name]
    y1 = CpuEngine(spec, threads=1).forward(x)
    eng = CpuEngine(spec, threads=threads)
    eng.forward(x)   # prepared (lazy tables, scratch) before counting
    pool_hook(stalled, STALL_CAP_MS, True)
    y = eng.forward(x)
    chunks = T._test_pool_chunks(threads)
    pool_hook(-1, 0, False)
    assert chunks[stalled] == 0 and sum(chunks) > 0
    assert np.array_equal(y.view(np.uint32), y1.view(np.uint32))


def test_default_threads(monkeypatch):
    import os

    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert default_threads() == cores
    for value, want in [("1", 1), (str(cores + 5), cores), ("0", cores), ("-2", cores), ("two", cores), ("", cores),
                        (" 1 ", 1)]:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert default_threads() == want, value
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    spec = LAYERS["gemm int8"][0]
    assert CpuEngine(spec).threads == 1
    eng = CpuEngine(spec, threads=2)
    eng.threads = None
    assert eng.threads == 1
