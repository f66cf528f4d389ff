"""Model-level accuracy: measured at the model's outputs, and controlled by choosing a scheme per layer.

Per-layer SQNR does not predict the model's output (a layer at 40 dB can cost the model 15 dB, another at 25 dB
nothing), so qconv measures the quantized model as a whole:

* :func:`measure_model` -- the SQNR and max abs error of every output of a quantized model (run by a qconv
  :class:`~qconv.onnx.InferenceSession`) against the float model (run by onnxruntime) on the same feeds. It is the
  one measurement ``quantize_model``, ``python -m qconv quantize / inspect`` and ``benchmarks/bench_models.py`` use.
* :class:`WeightProxy` -- the float model with its layers' weights and biases turned into inputs, so that one
  onnxruntime session evaluates any assignment of dequantized weights in one run (no model rebuilt, no session
  made per trial). With float activations a qconv node computes ``conv(x, dequantize(q))`` in float32, so the proxy
  measures what the qconv session gives, up to float32 summation order (checked by ``tests/test_onnx_accuracy.py``).
* :func:`search_plan` -- accuracy control: per-layer schemes with the fewest weight bytes whose model output reaches
  a target SQNR on the calibration feeds (see its docstring for the search).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .._progress import bar
from ..model_report import Scheme
from .kernels import INT8_ACT_QUANT as _INT8

#: The per-channel int8 scheme the searches start from and the guard returns layers to; ``quantize_model``'s
#: default, chosen by measurement on the zoo (``qconv/onnx/README.md``, "The default scheme").
DEFAULT_SCHEME = "int8-ch-zp-bc"
#: Output SQNR (dB) below which ``quantize_model`` warns (CLI: exit status 3).
MIN_SQNR_DB = 15.0


def _float_outputs(outputs) -> list[int]:
    return [i for i, y in enumerate(outputs) if np.asarray(y).dtype.kind == "f"]


def pooled_sqnr(ys: list[list], refs: list[list]) -> dict:
    """Per output index: SQNR over every feed pooled (sum of signal over sum of noise) and max abs error.

    ``ys`` / ``refs``: one list of outputs per feed. Returns ``{index: (sqnr dB, max abs error)}`` for the float
    outputs."""
    out = {}
    for i in _float_outputs(refs[0]):
        sig = noise = 0.0
        err = 0.0
        for y, r in zip(ys, refs):
            r64 = np.asarray(r[i], np.float64)
            d = np.asarray(y[i], np.float64) - r64
            sig += float((r64 ** 2).sum())
            noise += float((d ** 2).sum())
            err = max(err, float(np.abs(d).max()) if d.size else 0.0)
        db = math.inf if noise == 0 else (-math.inf if sig == 0 else 10.0 * math.log10(sig / noise))
        out[i] = (db, err)
    return out


def measure_model(float_model, quantized_model, feeds, *, threads: int | None = None, device: str = "cpu",
                  source: str = "", **session_options) -> dict:
    """Accuracy of ``quantized_model`` at its outputs against ``float_model`` on ``feeds``.

    ``float_model``: path, bytes or ``onnx.ModelProto``, run by onnxruntime (CPU). ``quantized_model``: the same
    forms, run by a qconv :class:`~qconv.onnx.InferenceSession` on ``device`` with ``session_options`` (its
    default activations unless given: the modes the model records, int8 wherever ``act_allowed`` lists it; a
    session elsewhere may run float activations on a narrow node where they are faster on its CPU, which
    :data:`~qconv.onnx.kernels.ACT_TIMED_PRODUCTS` describes, and is then at least as accurate there). ``feeds``:
    a feed dict or a list of them (every feed counts: the SQNR of an output pools the signal and noise of all
    feeds). ``source``: a label saying where the feeds come from.

    Returns ``{"outputs": {name: {"sqnr_db", "max_abs_err"}}, "sqnr_db": the lowest output SQNR, "feeds": n,
    "source": source}`` (float outputs only; SQNR inf when equal)."""
    import onnxruntime as ort

    from .kernels import recorded_act_modes
    from .session import InferenceSession

    feeds = [feeds] if isinstance(feeds, dict) else list(feeds)
    if not feeds:
        raise ValueError("measure_model needs at least one feed")
    with recorded_act_modes():   # the recorded modes, not this CPU's timed choice
        sess = InferenceSession(quantized_model, device=device, threads=threads, **session_options)
    so = ort.SessionOptions()
    so.intra_op_num_threads = sess.threads
    so.log_severity_level = 3
    ref_sess = ort.InferenceSession(_bytes(float_model), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ref_names = {o.name for o in ref_sess.get_outputs()}
    missing = [n for n in names if n not in ref_names]
    if missing:
        raise ValueError(f"the float model has no output(s) {missing}: is it the model that was quantized?")
    ys = [sess.run(names, f) for f in feeds]
    refs = [ref_sess.run(names, f) for f in feeds]
    sess.close()
    per = pooled_sqnr(ys, refs)
    outputs = {names[i]: dict(sqnr_db=db, max_abs_err=err) for i, (db, err) in per.items()}
    return dict(outputs=outputs, sqnr_db=min((o["sqnr_db"] for o in outputs.values()), default=math.inf),
                feeds=len(feeds), source=source)


def _bytes(model) -> bytes:
    if hasattr(model, "SerializeToString"):
        return model.SerializeToString()
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    with open(model, "rb") as fh:
        return fh.read()


@dataclass
class _Slot:
    """Where one layer's weight (and bias) enter the proxy: input names and the node form of the weight."""

    weight_input: str
    bias_input: str | None   # a Conv's bias; for MatMul / Gemm the input of an Add after the node
    op: str
    trans_b: bool = False
    alpha: float = 1.0
    w0: np.ndarray = field(default=None, repr=False)   # the float weight in node form
    b0: np.ndarray | None = field(default=None, repr=False)


class WeightProxy:
    """The float model with every layer's weight and bias as model inputs: one onnxruntime session
    evaluates any assignment of dequantized weights (see the module docstring).

    ``model``: ``onnx.ModelProto``; ``layers``: its :class:`~qconv.onnx_model.ModelLayer` list; ``feeds``: the
    feeds every evaluation runs. :meth:`sqnr` compares with the float model's outputs computed by the same session
    with the float weights."""

    def __init__(self, model, layers, feeds, threads: int = 2):
        import onnx
        import onnxruntime as ort

        from ..onnx_model import _attrs, _constants

        m = onnx.ModelProto()
        m.CopyFrom(model)
        consts = _constants(m)
        self.layers = {la.name: la for la in layers}
        self.slots: dict[str, _Slot] = {}
        adds = {}   # node index -> the Add after a linear layer
        for la in layers:
            node = m.graph.node[la.node_index]
            w_in = f"qconv.proxy/{la.name}/w"
            w0 = np.asarray(consts[node.input[1]], np.float32)
            attrs = _attrs(node)
            slot = _Slot(w_in, None, la.op, bool(attrs.get("transB", 0)), float(attrs.get("alpha", 1.0)), w0)
            node.input[1] = w_in
            m.graph.input.append(onnx.helper.make_tensor_value_info(w_in, onnx.TensorProto.FLOAT, w0.shape))
            slot.bias_input = f"qconv.proxy/{la.name}/b"
            n_out = la.weight.shape[0]
            slot.b0 = np.zeros(n_out, np.float32) if la.bias is None else np.asarray(la.bias, np.float32)
            if la.op == "Conv":
                if len(node.input) > 2:
                    node.input[2] = slot.bias_input
                else:
                    node.input.append(slot.bias_input)
            else:   # MatMul / Gemm: an Add of the bias's change after the node (its own bias, if any, stays)
                y = node.output[0]
                node.output[0] = f"qconv.proxy/{la.name}/y"
                adds[la.node_index] = onnx.helper.make_node("Add", [node.output[0], slot.bias_input], [y],
                                                            name=f"qconv.proxy/{la.name}/add")
            m.graph.input.append(onnx.helper.make_tensor_value_info(slot.bias_input, onnx.TensorProto.FLOAT, (n_out,)))
            self.slots[la.name] = slot
        if adds:
            nodes = [x for i, node in enumerate(m.graph.node) for x in ([node, adds[i]] if i in adds else [node])]
            del m.graph.node[:]
            m.graph.node.extend(nodes)
        used = {n for node in m.graph.node for n in node.input}
        keep = [t for t in m.graph.initializer if t.name in used]
        del m.graph.initializer[:]
        m.graph.initializer.extend(keep)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        self.session = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.feeds = [dict(f) for f in feeds]
        self.names = [o.name for o in self.session.get_outputs()]
        self.evaluations = 0
        self.refs = self.outputs({})

    def node_weight(self, name: str, w: np.ndarray) -> np.ndarray:
        """A qconv-form weight ``(O, I/groups, kh, kw)`` of layer ``name`` in its node's form (a MatMul's ``(K, N)``,
        a Gemm's ``B`` with ``transB`` and ``alpha`` undone)."""
        slot = self.slots[name]
        if slot.op == "Conv":
            return np.ascontiguousarray(w, np.float32)
        w2 = w[:, :, 0, 0] / np.float32(slot.alpha) if slot.op == "Gemm" else w[:, :, 0, 0]
        return np.ascontiguousarray(w2 if slot.op == "Gemm" and slot.trans_b else w2.T, np.float32)

    def outputs(self, assign: dict) -> list[list]:
        """Outputs per feed with ``assign`` = ``{layer name: (node-form weight, bias (O,) or None)}``; the other layers
        keep their float weights."""
        base = {}
        for name, slot in self.slots.items():
            w, b = assign.get(name, (None, None))
            base[slot.weight_input] = slot.w0 if w is None else w
            if slot.op == "Conv":
                base[slot.bias_input] = slot.b0 if b is None else b
            else:
                base[slot.bias_input] = np.zeros_like(slot.b0) if b is None else (b - slot.b0).astype(np.float32)
        self.evaluations += 1
        return [self.session.run(self.names, {**f, **base}) for f in self.feeds]

    def sqnr(self, assign: dict) -> float:
        """The lowest output SQNR (dB) of ``assign`` against the float weights, pooled over all feeds and, with two
        feeds or more, over each half of them (even / odd): a plan must hold on both halves, which keeps a search
        from fitting the few feeds it sees (on held-out inputs its SQNR falls less)."""
        ys = self.outputs(assign)
        subsets = [slice(None)] + ([slice(0, None, 2), slice(1, None, 2)] if len(ys) > 1 else [])
        return min((db for sub in subsets for db, _ in pooled_sqnr(ys[sub], self.refs[sub]).values()),
                   default=math.inf)


class Candidates:
    """Quantized forms of every layer under each scheme, made once: ``get(layer, scheme)`` ->
    ``(node-form dequantized weight, bias, stored bytes)``; float -> ``(None, None, 4 * weights)``.

    ``gptq_fit``: the calibration feeds GPTQ fits the weights on (the others then measure a fitted plan on inputs
    its rounding never saw: see :meth:`WeightProxy.sqnr`'s halves). Calibrated schemes (``-bc``, ``gptq``) use the
    layers' inputs captured on the calibration feeds (``calib``:
    ``{layer name: [NCHW input per feed]}``)."""

    def __init__(self, proxy: WeightProxy, calib: dict | None = None, gptq_fit: slice = slice(None)):
        self.proxy, self.calib, self.cache, self.gptq_fit = proxy, calib or {}, {}, gptq_fit
        self.measured: dict = {}

    def get(self, name: str, scheme: Scheme):
        key = (name, scheme.label)
        if key not in self.cache:
            la = self.proxy.layers[name]
            if scheme.bits is None:
                self.cache[key] = (None, None, 4 * la.weight.size)
            else:
                kw = dict(stride=la.stride, padding=la.padding, dilation=la.dilation)
                calib = self.calib.get(name)
                fit = calib[self.gptq_fit] if calib is not None and scheme.method == "gptq" else calib
                qw = scheme.quantize(la.weight, la.groups, fit, **kw)
                bias = scheme.corrected_bias(la.weight, qw, la.bias, calib, **kw)
                self.cache[key] = (self.proxy.node_weight(name, qw.dequantize()),
                                   None if bias is None else np.asarray(bias, np.float32), qw.nbytes)
        return self.cache[key]

    def assign(self, plan: dict) -> dict:
        """``{layer: scheme}`` -> the proxy's ``{layer: (weight, bias)}``."""
        return {n: self.get(n, s)[:2] for n, s in plan.items()}

    def sqnr(self, plan: dict) -> float:
        """:meth:`WeightProxy.sqnr` of ``plan``, measured once per distinct plan (searches repeat many)."""
        key = tuple(sorted((n, s.label) for n, s in plan.items()))
        if key not in self.measured:
            self.measured[key] = self.proxy.sqnr(self.assign(plan))
        return self.measured[key]

    def nbytes(self, plan: dict) -> int:
        return sum(self.get(n, s)[2] for n, s in plan.items())


@dataclass
class SearchResult:
    """What :func:`search_plan` chose: ``schemes`` ``{layer: Scheme}``, the SQNR it measured on the calibration
    feeds, the bytes, the all-int8 reference (``base_*``), evaluations and seconds."""

    schemes: dict
    sqnr_db: float
    nbytes: int
    base_sqnr_db: float
    base_nbytes: int
    evaluations: int
    seconds: float
    log: list


def search_plan(cands: Candidates, target_db: float, ladder: list, base: Scheme, *, progress: bool = False,
                max_failures: int | None = None, margins=(0.0, 1.0, 2.0, 3.0)) -> SearchResult:
    """Per-layer schemes from ``ladder`` (schemes in increasing bytes per weight, ``base`` among them, e.g.
    ``[int4-b32-asym-bc, int8-ch-zp-bc, int8-b16-zp-bc, float]``) whose model output reaches ``target_db`` on the
    proxy's feeds with the fewest weight bytes found.

    The search (sensitivity-ordered, the whole model re-measured at every step, like NNCF's
    ``quantize_with_accuracy_control``, which ranks layers by what reverting each alone gives, then reverts them
    in that order until the metric holds):

    1. every layer at ``base`` (all-int8): SQNR ``s0``, bytes ``b0``;
    2. below ``target_db + margin``: for every layer and every rung above its own, the gain of moving that layer
       alone is measured; the (layer, rung) moves are tried in the order of gain per extra byte (a layer once a
       pass), re-measured, kept only when the SQNR rises, until ``target_db + margin`` is reached; a pass per rung
       above ``base`` (a layer moved to ``int8-b16`` can move on to float);
    3. at or above target: each ``base`` layer's loss at the rung below ``base`` alone is measured; layers are
       demoted in the order of loss per saved byte, each re-measured and kept only when ``target_db`` still holds
       (every layer is tried, unless a run of ``max_failures`` refusals ends it first);
    4. steps 2-3 run once per ``margin`` of ``margins`` (when all-int8 is below the target: overshooting it by a
       margin can leave room for demotions that pay for more than the margin's promotions); the plan reaching the
       target with the fewest bytes is kept, else the most accurate one;
    5. the plan is never dominated by all-int8: if its bytes are >= ``b0`` and its SQNR < ``s0``, all-int8 wins.

    Demotions from step 3 can pay for the promotions of step 2, so a plan can be more accurate than all-int8 at
    fewer bytes. Each step is one proxy evaluation (one model run per feed)."""
    t0 = time.perf_counter()
    proxy = cands.proxy
    names = list(proxy.layers)
    k = ladder.index(base)
    upper, cheap = ladder[k + 1:], (ladder[k - 1] if k > 0 else None)
    pbar = bar(total=len(names) * (2 * len(upper) + 2) + 2, desc="accuracy control", unit="eval", enabled=progress)
    log = []

    def measure(plan):
        pbar.update(1)
        return cands.sqnr(plan)

    all_base = {n: base for n in names}
    s0 = measure(all_base)
    b0 = cands.nbytes(all_base)
    log.append(f"all {base.label}: {s0:.2f} dB, {b0:,} bytes")
    losses = None   # each base layer's loss at the cheap rung alone (measured once, for every margin)

    def promote(plan, current, goal):
        for _ in range(len(upper)):   # a pass per rung above base: a layer moved up may move up again
            if current >= goal:
                break
            moves, start = [], current
            for n in names:
                for rung in ladder[ladder.index(plan[n]) + 1:]:
                    extra = cands.get(n, rung)[2] - cands.get(n, plan[n])[2]
                    moves.append(((measure({**plan, n: rung}) - start) / max(extra, 1), n, rung))
            moved: set = set()
            for ratio, n, rung in sorted(moves, key=lambda m: m[0], reverse=True):
                if current >= goal or ratio <= 0:
                    break
                if n in moved:
                    continue
                trial = {**plan, n: rung}
                db = measure(trial)
                if db > current:
                    plan, current = trial, db
                    moved.add(n)
                    log.append(f"{n} -> {rung.label}: {db:.2f} dB")
            if not moved:
                break
        return plan, current

    def demote(plan, current):
        nonlocal losses
        if current < target_db or cheap is None:
            return plan, current
        if losses is None:
            losses = []
            for n in names:
                saved = cands.get(n, base)[2] - cands.get(n, cheap)[2]
                if saved > 0:
                    losses.append(((s0 - measure({**all_base, n: cheap})) / saved, n))
        failures = 0
        for _, n in sorted(losses):
            if plan[n] != base:
                continue
            trial = {**plan, n: cheap}
            db = measure(trial)
            if db >= target_db:
                plan, current, failures = trial, db, 0
                log.append(f"{n} -> {cheap.label}: {db:.2f} dB")
            else:
                failures += 1
                if max_failures is not None and failures >= max_failures:
                    break
        return plan, current

    best = None
    for margin in (margins if s0 < target_db else margins[:1]):
        log.append(f"margin {margin:g} dB")
        plan, current = demote(*promote(dict(all_base), s0, target_db + margin))
        nbytes = cands.nbytes(plan)
        key = (current < target_db, nbytes if current >= target_db else -current)
        if best is None or key < best[0]:
            best = (key, plan, current, nbytes)
    _, plan, current, nbytes = best
    if nbytes >= b0 and current < s0:
        plan, current, nbytes = all_base, s0, b0
        log.append("all-int8 is better at no more bytes: kept")
    pbar.close()
    return SearchResult(plan, current, nbytes, s0, b0, proxy.evaluations, time.perf_counter() - t0, log)


def restore_ranking(cands: Candidates, plan: dict, base: Scheme, top: int = 3) -> list[tuple[str, float]]:
    """The ``top`` layers whose return to ``base`` (or, for layers already there, to float) raises the proxy's SQNR
    most, each re-measured alone against ``plan``: ``[(layer, SQNR dB with it returned)]``, best first."""
    rows = []
    for n, s in plan.items():
        if s.bits is None:
            continue
        to = Scheme(None) if s == base else base
        rows.append((cands.proxy.sqnr(cands.assign({**plan, n: to})), n))
    rows.sort(reverse=True)
    return [(n, db) for db, n in rows[:top]]


#: How much output SQNR (dB, on the calibration inputs) int8 activations may cost against float activations of the
#: same weights: :func:`search_act_modes`' budget, ``quantize_model(act_budget=...)``'s default.
ACT_BUDGET_DB = 3.0
#: An output SQNR (dB, calibration inputs) that int8 activations need not exceed, however far above it float
#: activations are: the median the trusted-quantization issue asks of the default across the zoo.
ACT_ENOUGH_DB = 35.0


@dataclass
class ActSearch:
    """Result of :func:`search_act_modes`: ``allowed`` ``{node name: [modes]}`` (``"float"`` first, then the
    integer mode where it holds), the output SQNR with float activations and with the allowed modes (calibration
    feeds), the goal, the candidates refused (kept float: int8 there broke the goal), the number of candidates
    (one-group convs), and the cost."""

    allowed: dict
    float_sqnr_db: float
    sqnr_db: float
    goal_db: float
    refused: list
    candidates: int
    evaluations: int
    seconds: float

    def record(self) -> dict:
        """The JSON form ``qconv.summary["act_search"]`` keeps."""
        r = lambda v: None if v is None or not math.isfinite(v) else round(float(v), 2)   # noqa: E731
        int8 = sorted(n for n, a in self.allowed.items() if len(a) > 1)
        return dict(mode=_INT8, float_sqnr_db=r(self.float_sqnr_db),
                    goal_db=r(self.goal_db), sqnr_db=r(self.sqnr_db), int8_nodes=len(int8),
                    candidates=self.candidates, refused=list(self.refused),
                    evaluations=self.evaluations, seconds=round(self.seconds, 1))



def search_act_modes(float_model, quantized_model, feeds, *, budget_db: float = ACT_BUDGET_DB,
                     enough_db: float = ACT_ENOUGH_DB, threads: int | None = None,
                     progress: bool = False) -> ActSearch:
    """Which qconv conv nodes of ``quantized_model`` may run with per-tensor int8 activations (``"tensor"``, the
    direct int8 conv on AMX / VNNI CPUs) while the model's output SQNR against ``float_model`` on ``feeds`` stays
    within ``budget_db`` of float activations for the convs (the same weights; QMatMul nodes in their default,
    per-row int8, throughout), and never lower than needed: the goal is ``min(float SQNR - budget_db,
    enough_db)``.

    Candidates: ``QConv`` nodes with one group (depthwise and grouped convs run float under ``act_quant="auto"``,
    :func:`qconv.onnx.kernels.auto_act_quant`). The search, like :func:`search_plan`'s demotions: the output noise
    each candidate adds int8 alone is measured; then, in decreasing order of multiply-adds per added noise (the
    last feed's), each candidate is made int8, the whole model re-measured, and kept int8 only when the goal still
    holds (``2 * candidates + 1`` model runs per
    feed). One session serves every step (nodes switch modes between runs). QMatMul nodes keep their own default
    (per-row int8) and are not listed.

    ``feeds``: a feed dict or a list (calibration inputs: the search must not see the inputs the result is judged
    on). Returns an :class:`ActSearch`."""
    import onnxruntime as ort

    from .kernels import ConvKernel
    from .session import InferenceSession

    t0 = time.perf_counter()
    feeds = [feeds] if isinstance(feeds, dict) else list(feeds)
    if not feeds:
        raise ValueError("search_act_modes needs at least one feed")
    if not budget_db >= 0:
        raise ValueError(f"budget_db must be >= 0, got {budget_db!r}")
    from .quantize import model_summary

    recorded = model_summary(_bytes(quantized_model))
    if "act_search" in recorded or recorded.get("act_quant"):
        raise ValueError("search_act_modes: the model already records activation modes (act_search or act_quant in "
                         "qconv.summary); search on the model before they are recorded")
    # "auto" over a model without a finished search: convs float, QMatMul nodes their own default (per-row int8)
    sess = InferenceSession(quantized_model, threads=threads, act_quant="auto")
    try:
        so = ort.SessionOptions()
        so.intra_op_num_threads = sess.threads
        so.log_severity_level = 3
        ref_sess = ort.InferenceSession(_bytes(float_model), so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        refs = [ref_sess.run(names, f) for f in feeds]
        del ref_sess
        nodes = {k.name: k for k in sess.kernels}
        cands = [k.name for k in sess.kernels if isinstance(k, ConvKernel) and k.layer.spec.groups == 1]
        evaluations = 0

        def measure() -> float:
            nonlocal evaluations
            evaluations += 1
            ys = [sess.run(names, f) for f in feeds]
            return min((db for db, _ in pooled_sqnr(ys, refs).values()), default=math.inf)

        pbar = bar(total=2 * len(cands) + 1, desc="activation search", unit="eval", enabled=progress)
        s_float = measure()
        goal = min(s_float - budget_db, enough_db)
        pbar.update(1)
        noise = {}   # the output noise each candidate adds int8 alone, relative to the float signal
        base = 10.0 ** (-s_float / 10.0)
        for n in cands:
            nodes[n].set_act_quant(_INT8)
            noise[n] = max(10.0 ** (-measure() / 10.0) - base, 1e-30)
            nodes[n].set_act_quant(None)
            pbar.update(1)
        int8, rejected, s = [], [], s_float
        # most multiply-adds per unit of added noise first (a knapsack's greedy order: the int8 work kept is what
        # makes the session fast)
        for n in sorted(cands, key=lambda n: -nodes[n].macs() / noise[n]):
            nodes[n].set_act_quant(_INT8)
            s_n = measure()
            pbar.update(1)
            if s_n >= goal:
                int8.append(n)
                s = s_n
            else:
                nodes[n].set_act_quant(None)
                rejected.append(n)
        pbar.close()
        allowed = {n: ["float"] for n in nodes}
        for n in int8:
            allowed[n] = ["float", _INT8]
        return ActSearch(allowed, s_float, s, goal, rejected, len(cands), evaluations, time.perf_counter() - t0)
    finally:
        sess.close()
