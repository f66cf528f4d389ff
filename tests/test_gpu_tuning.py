"""Auto-tuning (qconv/gpu/tuning.py): picks a (variant, local size), never changes results, persists on disk
for the next process, survives corrupt / unreadable / unwritable caches."""
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from qconv import gpu
from qconv.gpu import tuning
from qconv.testing import assert_matches_reference

DEVICES = gpu.devices()
NO_DEVICE = "no OpenCL device is visible (install one, e.g. `apt-get install pocl-opencl-icd`)"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# one small problem per path, shared with the subprocess below
PROBLEM = """
import numpy as np, qconv
from qconv.geometry import ConvSpec
rng = np.random.default_rng(5)
w3 = qconv.quantize_weight(rng.standard_normal((6, 5, 3, 3)).astype(np.float32), bits=4, block_size=0,
                           symmetric=False)
w1 = qconv.quantize_weight(rng.standard_normal((7, 40)).astype(np.float32), bits=8, block_size=8)
x3 = rng.standard_normal((1, 5, 6, 6)).astype(np.float32)
x1 = rng.standard_normal((2, 40, 1, 1)).astype(np.float32)
specs = [(ConvSpec(w3, None, 1, 1, 1, "relu", None), x3), (ConvSpec(w1, None, 1, 0, 1, None, None), x1)]
"""


@pytest.fixture(scope="module", params=DEVICES or [None])
def cl_device(request):
    if request.param is None:
        pytest.skip(NO_DEVICE)
    return request.param


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning.ENV_CACHE, str(tmp_path / "cache"))
    tuning.clear_memory()
    yield tmp_path / "cache"
    tuning.clear_memory()


def _problems():
    ns = {}
    exec(PROBLEM, ns)
    return ns["specs"]


def _tuned_run(device):
    outs = []
    for spec, x in _problems():
        eng = gpu.OpenCLEngine(spec, device=device, tune="fast")
        outs.append((eng, x, eng.forward(x)))
    return outs


def test_tuning_chooses_caches_and_keeps_results(cl_device, cache_dir, monkeypatch):
    # a candidate is cached once all its local sizes are timed: on a loaded machine PoCL's compile per local size
    # can take the whole default budget before the first one is done
    monkeypatch.setitem(tuning.BUDGET_S, "fast", 30.0)
    before = dict(tuning.stats)
    for eng, x, y in _tuned_run(cl_device):
        s = eng.spec
        plan = next(iter(eng.plans.values()))
        assert plan.ns is not None and plan.ns > 0
        assert_matches_reference(y, x, s.weight, s.bias, s.stride, s.padding, s.dilation, s.activation,
                                 act_quant=None)
        untuned = gpu.OpenCLEngine(s, device=cl_device, tune="none").forward(x)
        scale = max(float(np.abs(untuned).max()), 1e-30)
        assert float(np.abs(y - untuned).max()) <= 1e-4 * scale  # tuning changes speed, not results
    assert tuning.stats["measured"] > before["measured"]
    files = list(cache_dir.glob("opencl-tune-*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    _, dev = gpu.resolve(cl_device)
    assert data["device"]["name"] == dev.name.strip() and data["device"]["driver"] == dev.driver_version.strip()
    assert data["entries"] and all(e["level"] == "fast" for e in data["entries"].values())
    key = json.loads(next(iter(data["entries"])))
    assert key[0] in ("conv_general", "conv_1x1") and any(o.startswith("-DQBITS") for o in key[2])
    # the same process asks again: memory hits, nothing timed
    measured = tuning.stats["measured"]
    _tuned_run(cl_device)
    assert tuning.stats["measured"] == measured


def test_second_process_reuses_the_first_ones_results(cl_device, cache_dir):
    script = PROBLEM + textwrap.dedent(f"""
        import json, qconv.gpu as g
        from qconv.gpu import tuning
        for spec, x in specs:
            g.OpenCLEngine(spec, device={cl_device!r}, tune="fast").forward(x)
        print(json.dumps(tuning.stats))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
           tuning.ENV_CACHE: str(cache_dir)}

    def run():
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=600)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first["measured"] > 0 and first["cache_hits"] == 0
    assert second["measured"] == 0 and second["cache_hits"] >= 2


def test_cache_file_follows_the_kernel_sources(cl_device, cache_dir, monkeypatch):
    """Results tuned for other kernel sources (another qconv version) live in another file."""
    _, dev = gpu.resolve(cl_device)
    before = tuning.cache_for(dev).path
    assert before == tuning.cache_for(dev).path
    monkeypatch.setattr(tuning, "kernels_digest", lambda: "0123456789abcdef")
    assert tuning.cache_for(dev).path != before


def test_corrupt_cache_warns_and_tuning_goes_on(cl_device, cache_dir):
    _, dev = gpu.resolve(cl_device)
    path = tuning.cache_for(dev).path
    path.parent.mkdir(parents=True)
    path.write_text("{ this is not json")
    tuning.clear_memory()
    with pytest.warns(tuning.TuningCacheWarning, match="corrupt"):
        outs = _tuned_run(cl_device)
    assert all(next(iter(e.plans.values())).ns for e, _, _ in outs)
    assert json.loads(path.read_text())["entries"]  # rewritten, valid


def test_unreadable_and_unwritable_cache(cl_device, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    monkeypatch.setenv(tuning.ENV_CACHE, str(blocker / "sub"))  # a directory under a file: cannot exist
    tuning.clear_memory()
    try:
        with pytest.warns(tuning.TuningCacheWarning, match="not writable"):
            outs = _tuned_run(cl_device)
        assert all(next(iter(e.plans.values())).ns for e, _, _ in outs)
        _, dev = gpu.resolve(cl_device)
        path = tuning.cache_for(dev).path
        monkeypatch.setenv(tuning.ENV_CACHE, str(tmp_path / "dir"))
        tuning.clear_memory()
        path = tuning.cache_for(dev).path
        path.mkdir(parents=True)  # the cache "file" is a directory: unreadable
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            _tuned_run(cl_device)
        msgs = " ".join(str(r.message) for r in rec if issubclass(r.category, tuning.TuningCacheWarning))
        assert "unreadable" in msgs
    finally:
        tuning.clear_memory()


def test_levels_and_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv(tuning.ENV_TUNE, raising=False)
    assert tuning.tune_level() == "fast"
    monkeypatch.setenv(tuning.ENV_TUNE, "NONE")
    assert tuning.tune_level() == "none"
    assert tuning.tune_level("full") == "full"
    monkeypatch.setenv(tuning.ENV_TUNE, "turbo")
    with pytest.raises(ValueError, match="QCONV_TUNE"):
        tuning.tune_level()
    monkeypatch.setenv(tuning.ENV_CACHE, str(tmp_path))
    assert tuning.cache_dir() == tmp_path
    monkeypatch.delenv(tuning.ENV_CACHE)
    assert "qconv" in str(tuning.cache_dir())


def test_tune_none_touches_no_cache(cl_device, cache_dir):
    spec, x = _problems()[0]
    before = dict(tuning.stats)
    gpu.OpenCLEngine(spec, device=cl_device, tune="none").forward(x)
    assert tuning.stats == before and not cache_dir.exists()


def _row_linear(device):
    """An act_quant="row" linear layer on one row (gemv_a8: local sizes compiled in, the fused variants'
    reduction needs a power of two) built through the layer API with tuning on."""
    import qconv
    rng = np.random.default_rng(11)
    w = qconv.quantize_weight(rng.standard_normal((24, 64)).astype(np.float32), bits=8, block_size=0)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    return w, x, lambda: qconv.Linear(w, device=device, act_quant="row", tune="fast")


def _tamper(path, fn):
    data = json.loads(path.read_text())
    for k in list(data["entries"]):
        fn(k, data["entries"])
    path.write_text(json.dumps(data))
    tuning.clear_memory()


@pytest.mark.parametrize("how", ["local_size", "variant", "garbage"])
def test_tampered_cache_entries_are_ignored_with_a_warning(cl_device, cache_dir, how):
    """Entries edited in the file (a local size the kernel does not take, a variant that is no candidate,
    malformed values): ignored with a TuningCacheWarning, tuned again, the layer's result unchanged."""
    from qconv.reference import conv2d
    w, x, make = _row_linear(cl_device)
    ref = conv2d(x[:, :, None, None], w, None, 1, 0, 1, None, "row")[:, :, 0, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tuning.TuningCacheWarning)
        make()(x)
    _, dev = gpu.resolve(cl_device)
    path = tuning.cache_for(dev).path

    def edit(k, entries):
        e = entries[k]
        if how == "local_size":
            e["lws"] = [3, 5, 1]
        elif how == "variant" and "variant" in e:
            e["variant"] = "gemv_a8f_c9"
        elif how == "garbage":
            entries[k] = {"lws": "big", "ns": -1, "level": "fast"} if "variant" not in e else {"variant": 7}
    _tamper(path, edit)
    with pytest.warns(tuning.TuningCacheWarning, match="ignored"):
        layer = make()
        y = layer(x)
    plan = next(iter(layer.engine.plans.values()))
    assert plan.lws is None or list(plan.lws) != [3, 5, 1]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    data = json.loads(path.read_text())  # rewritten with good entries
    assert data["entries"] and all(tuning._valid_entry(e) or "variant" in e for e in data["entries"].values())


# {{{ the decision rule: stable under timing noise

def _fake_candidates(true_us: list, tag: str) -> list:
    """Candidates the fake timer knows by ``variant`` (their true time: ``true_us``), one local size each; ``tag``
    keeps their cache keys apart from other trials'."""
    return [tuning.Candidate(f"v{i}", "fake", (tag,), (i,), [(1, 1)], lambda *a, **k: None)
            for i in range(len(true_us))]


def _noisy_timer(true_us: list, seed: int, spike_p: float, calls: list):
    """``launch_times`` of a device where every launch takes its true time plus <=1% jitter and, with
    probability ``spike_p``, is slowed 1.3-2x (another process's work): what noise looks like on a GPU."""
    rng = np.random.default_rng(seed)

    def launch_times(queue, cand, lws, repeats):
        calls.append(cand.variant)
        t = true_us[int(cand.variant[1:])] * 1e3
        jitter = 1 + 0.01 * rng.random(repeats)
        spikes = np.where(rng.random(repeats) < spike_p, rng.uniform(1.3, 2.0, repeats), 1.0)
        return list(t * jitter * spikes)

    return launch_times


def _select(cl_device, monkeypatch, true_us, seed, spike_p, tag, calls=None):
    calls = [] if calls is None else calls
    monkeypatch.setattr(tuning, "launch_times", _noisy_timer(true_us, seed, spike_p, calls))
    cand, _, _ = tuning.select(gpu.resolve(cl_device)[1], None, _fake_candidates(true_us, tag), "fast")
    return cand.variant


def test_noise_cannot_crown_a_slower_kernel(cl_device, cache_dir, monkeypatch):
    """The truly fastest candidate (v1, 15% ahead of the next) wins every one of 60 runs on a noisy device;
    the old rule (one median of 3 launches per candidate, fastest wins) lost 6 of these 60 runs."""
    picks = [_select(cl_device, monkeypatch, [100.0, 85.0, 98.0], seed, 0.15, f"noise{seed}") for seed in range(60)]
    assert picks == ["v1"] * 60


def test_near_ties_go_to_the_earlier_candidate(cl_device, cache_dir, monkeypatch):
    """Within TIE (3%) the engine's earlier-listed candidate wins, whatever the noise: deterministic picks."""
    picks = {_select(cl_device, monkeypatch, [100.0, 98.5, 130.0], seed, 0.05, f"tie{seed}") for seed in range(20)}
    assert picks == {"v0"}
    assert _select(cl_device, monkeypatch, [100.0, 95.0, 130.0], 0, 0.0, "clear") == "v1"  # 5%: not a tie


def test_budget_never_skips_a_candidate(cl_device, cache_dir, monkeypatch):
    """Past the time budget each remaining candidate is still timed at its first local size, so a slow compile
    cannot leave the fastest kernel out (the old tuner timed only the first candidate here and kept it)."""
    monkeypatch.setitem(tuning.BUDGET_S, "fast", 0.0)
    calls = []
    cands = _fake_candidates([100.0, 90.0, 60.0], "over budget")
    for c in cands:
        c.local_sizes = [(1, 1), (2, 2)]
    monkeypatch.setattr(tuning, "launch_times", _noisy_timer([100.0, 90.0, 60.0], 0, 0.0, calls))
    cand, lws, _ = tuning.select(gpu.resolve(cl_device)[1], None, cands, "fast")
    assert (cand.variant, lws) == ("v2", (1, 1))
    assert calls[:3] == ["v0", "v1", "v2"]


@pytest.mark.parametrize("compile_s", [0.0, 0.02])
def test_compile_time_does_not_change_what_is_timed(cl_device, cache_dir, monkeypatch, compile_s):
    """The budget counts timed launches only: with each warm-up taking compile_s (a cold or warm driver binary
    cache), the same (candidate, local size) pairs are timed and the same one is picked. Every timing here costs
    4 ms of timed launches against a budget of 13 ms: both sizes of v0 and v1, then v2's first (counting the
    compiles, 20 ms each, the old budget ended after v0's first size: v1's second was never timed)."""
    monkeypatch.setitem(tuning.BUDGET_S, "fast", 0.013)
    timed = []
    true_us = {("v0", 1): 100.0, ("v0", 2): 95.0, ("v1", 1): 90.0, ("v1", 2): 92.0, ("v2", 1): 80.0, ("v2", 2): 50.0}

    def launch_times(queue, cand, lws, repeats):
        import time
        time.sleep(compile_s)   # the warm-up launch and its compile
        timed.append((cand.variant, lws[0]))
        tuning._TIMED.s = tuning._timed_s() + 0.004
        return [true_us[(cand.variant, lws[0])] * 1e3] * repeats

    monkeypatch.setattr(tuning, "launch_times", launch_times)
    cands = _fake_candidates([0.0, 0.0, 0.0], f"compile {compile_s}")
    for c in cands:
        c.local_sizes = [(1, 1), (2, 2)]
    cand, lws, _ = tuning.select(gpu.resolve(cl_device)[1], None, cands, "fast")
    assert timed[:5] == [("v0", 1), ("v0", 2), ("v1", 1), ("v1", 2), ("v2", 1)]   # then past the budget
    assert (cand.variant, lws) == ("v2", (1, 1))


def test_final_timing_adds_a_few_timings(cl_device, cache_dir, monkeypatch):
    """The re-timing costs ROUNDS timings of at most FINALISTS candidates on top of one per (candidate, size)."""
    calls = []
    _select(cl_device, monkeypatch, [100.0, 90.0, 95.0, 120.0, 110.0], 0, 0.0, "budget", calls)
    assert len(calls) == 5 + tuning.ROUNDS * tuning.FINALISTS

# }}}


# {{{ building the candidates' programs at once

def test_every_timed_candidates_programs_are_built_before_timing(cl_device, cache_dir, monkeypatch):
    """select() hands build_many every (program, options) that the candidates it times will launch, before the
    first timing; a second engine of the same problem, answered from the cache, builds nothing more."""
    from qconv.gpu import programs

    events, built = [], []
    real_build, real_times = programs.build_many, tuning.launch_times

    def build_many(ctx, pairs):
        events.append("build")
        built.extend(pairs)
        real_build(ctx, pairs)

    def launch_times(queue, cand, lws, repeats):
        events.append("time")
        return real_times(queue, cand, lws, repeats)

    monkeypatch.setattr(programs, "build_many", build_many)
    monkeypatch.setattr(tuning, "launch_times", launch_times)
    seen = []
    real_select = tuning.select

    def select(device, queue, candidates, level):
        seen.extend(candidates)
        return real_select(device, queue, candidates, level)

    monkeypatch.setattr(tuning, "select", select)
    spec, x = _problems()[0]
    gpu.OpenCLEngine(spec, device=cl_device, tune="fast").forward(x)
    assert events and events[0] == "build" and "time" in events
    launched = {(s.program, tuple(s.options)) for c in seen for lws in c.local_sizes for s in c.info["steps"](lws)}
    assert launched and launched <= set(built)
    events.clear()
    gpu.OpenCLEngine(spec, device=cl_device, tune="fast").forward(x)
    assert "time" not in events and "build" not in events


def test_build_many_leaves_a_failing_build_to_get_program(cl_device):
    """A program that does not compile does not stop the others in build_many; get_program raises its error."""
    from qconv.gpu import programs
    from qconv.gpu.errors import OpenCLBuildError

    ctx = gpu.resolve(cl_device)[0]
    good, bad = ("graph_ops", ("-DQCONV_TEST_BUILD_MANY=1",)), ("conv_1x1", ("-DQCONV_TEST_BUILD_MANY=2",))
    programs.build_many(ctx, [good, bad])
    assert programs.get_program(ctx, *good) is programs.get_program(ctx, *good)
    with pytest.raises(OpenCLBuildError, match="QBITS"):
        programs.get_program(ctx, *bad)

# }}}


# {{{ compile worker processes

def test_build_processes_choice(cl_device, monkeypatch):
    from qconv.gpu import programs

    dev = gpu.resolve(cl_device)[1]
    monkeypatch.setenv(programs.ENV_BUILD_PROCESSES, "3")
    assert programs.build_processes(dev) == 3
    monkeypatch.setenv(programs.ENV_BUILD_PROCESSES, "many")
    with pytest.raises(ValueError, match="QCONV_BUILD_PROCESSES"):
        programs.build_processes(dev)
    monkeypatch.delenv(programs.ENV_BUILD_PROCESSES)
    nvidia = "NVIDIA" in dev.platform.name.upper()
    assert (programs.build_processes(dev) > 0) == nvidia
    monkeypatch.setenv("CUDA_CACHE_DISABLE", "1")
    assert programs.build_processes(dev) == 0


def test_compile_workers_build_and_report_failures(cl_device, monkeypatch):
    """Workers (forced on with QCONV_BUILD_PROCESSES) answer every request, good builds and a failing one alike,
    and the pool serves a second batch; the programs then build in this process as before."""
    from qconv.gpu import programs
    from qconv.gpu.errors import OpenCLBuildError

    monkeypatch.setenv(programs.ENV_BUILD_PROCESSES, "2")
    ctx = gpu.resolve(cl_device)[0]
    tag = f"{os.getpid()}_{id(ctx)}"
    good = [("graph_ops", (f"-DQCONV_WORKER_TEST_{tag}={i}",)) for i in range(3)]
    bad = ("conv_1x1", (f"-DQCONV_WORKER_BAD_{tag}=1",))
    pool = programs._Workers(ctx.devices[0], 2)
    try:
        assert pool.build(good + [bad])
        assert pool.build(good[:1])
        assert all(p.poll() is None for p in pool.procs)
    finally:
        pool.close()
    programs.build_many(ctx, good + [bad])
    for pair in good:
        programs.get_program(ctx, *pair)
    with pytest.raises(OpenCLBuildError):
        programs.get_program(ctx, *bad)


def test_a_dead_compile_worker_stops_the_pool_without_hanging(cl_device):
    from qconv.gpu import programs

    ctx = gpu.resolve(cl_device)[0]
    pool = programs._Workers(ctx.devices[0], 2)
    pool.procs[1].kill()
    pool.procs[1].wait()
    assert not pool.build([("graph_ops", (f"-DQCONV_WORKER_DEAD_{i}=1",)) for i in range(4)])
    assert pool.procs == []

# }}}
