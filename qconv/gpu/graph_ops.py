"""The operators of a device graph between qconv's layers (``kernels/graph_ops.cl``) on ``pyopencl.array.Array``
s: float32, C-contiguous, NCHW (the layout ONNX models use between nodes).

:class:`GraphOps` holds one command queue; each method enqueues its kernel (built once per context and options,
:func:`qconv.gpu.programs.get_kernel`) and returns the output Array, allocated from the queue's memory pool
unless ``out`` is given. Nothing waits for the device: the queue is in order, so a chain of calls runs in
order, and only reading a result back (``Array.get``) synchronizes.

Every index is a 32-bit int on the device: tensors of 2**31 elements or more are refused (``ValueError``).
"""
from __future__ import annotations

import numpy as np

from . import programs
from .context import import_pyopencl

PROGRAM = "graph_ops"
LOCAL = 256
MAXD = 6

#: ``UNARY`` codes of ``unary`` (the parameters p0, p1 each op reads)
UNARY = {"identity": 0, "relu": 1, "clip": 2, "sigmoid": 3, "hard_sigmoid": 4, "hard_swish": 5, "leaky_relu": 6,
         "tanh": 7, "silu": 8, "exp": 9, "sqrt": 10, "neg": 11, "abs": 12, "gelu": 13, "reciprocal": 14}
#: ``BINARY`` codes of ``binary``
BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3, "max": 4, "min": 5, "pow": 6}
#: ``ACT`` codes (common.cl) a binary op or an affine applies after itself
ACTS = {None: 0, "relu": 1, "relu6": 2, "hardswish": 3, "silu": 4}
#: ``COORD_MODE`` of ``resize2d`` by ONNX's ``coordinate_transformation_mode``
COORD_MODES = {"half_pixel": 0, "asymmetric": 1, "align_corners": 2, "pytorch_half_pixel": 3,
               "tf_half_pixel_for_nn": 4}
#: ``NEAREST_MODE`` of ``resize2d`` by ONNX's ``nearest_mode``
NEAREST_MODES = {"round_prefer_floor": 0, "round_prefer_ceil": 1, "floor": 2, "ceil": 3}


def _size(shape) -> int:
    n = int(np.prod(shape, dtype=np.int64))
    if n >= 2**31:
        raise ValueError(f"a device graph tensor takes fewer than 2**31 elements, got shape {tuple(shape)}")
    return n


def contiguous_strides(shape) -> tuple:
    """Element strides of a C-contiguous tensor of ``shape``."""
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= int(d)
    return tuple(reversed(st))


def _int8(values):
    cl = import_pyopencl()
    v = [int(x) for x in values]
    return cl.cltypes.make_int8(*(v + [0] * (8 - len(v))))


def _nd(shape, *strides):
    """``shape`` and ``strides`` padded in front to :data:`MAXD` dims (extent 1, stride 0), as int8 vectors."""
    if len(shape) > MAXD:
        raise ValueError(f"device graph kernels index at most {MAXD} dims, got shape {tuple(shape)}")
    pad = MAXD - len(shape)
    out = [_int8([1] * pad + [int(s) for s in shape])]
    for st in strides:
        out.append(_int8([0] * pad + [int(s) for s in st]))
    return out


class GraphOps:
    """The device graph's operators on ``queue`` (see the module docstring).

    Recording (:attr:`record` a list): every launch gets a kernel object of its own with its arguments bound
    once, and is appended to :attr:`record` as ``(kernel, global size, local size)``, so that
    ``pyopencl.enqueue_nd_range_kernel`` repeats it; :attr:`take` (a function of a shape), when set, gives
    the output Arrays instead of the pool (the device graph's arena of a recorded run)."""

    def __init__(self, ctx, queue, allocator=None):
        cla = __import__("pyopencl.array", fromlist=["Array"])
        self._cl = import_pyopencl()
        self.ctx, self.queue = ctx, queue
        if allocator is None:
            tools = __import__("pyopencl.tools", fromlist=["MemoryPool"])
            allocator = tools.MemoryPool(tools.ImmediateAllocator(queue))
        self.allocator = allocator
        self._empty = lambda shape: cla.empty(queue, tuple(int(s) for s in shape), np.float32, allocator=allocator)
        self.record: list | None = None
        self.take = None

    def empty(self, shape):
        """An uninitialised float32 Array of ``shape`` (from :attr:`take` when set, else the pool)."""
        _size(shape)
        return self._empty(shape) if self.take is None else self.take(tuple(int(s) for s in shape))

    def _launch(self, name, options, n, args, local=LOCAL):
        gsize = (max(-(-n // local), 1) * local,)
        if self.record is None:
            return programs.get_kernel(self.ctx, PROGRAM, tuple(options), name)(self.queue, gsize, (local,), *args)
        k = self._cl.Kernel(programs.get_program(self.ctx, PROGRAM, tuple(options)), name)
        k.set_args(*args)
        self.record.append((k, gsize, (local,)))
        return self._cl.enqueue_nd_range_kernel(self.queue, k, gsize, (local,))

    def _out(self, shape, out):
        if out is None:
            return self.empty(shape)
        if tuple(out.shape) != tuple(shape) or out.dtype != np.float32:
            raise ValueError(f"out must be float32 {tuple(shape)}, got {out.dtype} {tuple(out.shape)}")
        return out

    def unary(self, x, op: str, p0: float = 0.0, p1: float = 0.0, out=None):
        """``y = op(x)`` elementwise (:data:`UNARY`)."""
        y = self._out(x.shape, out)
        n = _size(x.shape)
        if n:
            self._launch("unary", (f"-DUNARY={UNARY[op]}",), n,
                         (x.base_data, y.base_data, np.int32(n), np.float32(p0), np.float32(p1)))
        return y

    def binary(self, a, b, op: str, activation=None, out=None, pre_a=None, pre_b=None):
        """``y = act(A(a) op B(b))`` with numpy broadcasting (:data:`BINARY`, :data:`ACTS`); ``pre_a`` / ``pre_b``:
        ``(unary op, p0, p1)`` applied to an operand first (a unary node fused into its one reader), or None."""
        shape = np.broadcast_shapes(a.shape, b.shape)
        y = self._out(shape, out)
        n = _size(shape)
        if n:
            sa, sb = (self._bstrides(t.shape, shape) for t in (a, b))
            sh, sa, sb = _nd(shape, sa, sb)
            (ua, a0, a1), (ub, b0, b1) = (p or ("identity", 0.0, 0.0) for p in (pre_a, pre_b))
            pre = self._cl.cltypes.make_float4(a0, a1, b0, b1)
            self._launch("binary", (f"-DBINARY={BINARY[op]}", f"-DACT={ACTS[activation]}", f"-DPRE_A={UNARY[ua]}",
                                    f"-DPRE_B={UNARY[ub]}"), n,
                         (a.base_data, b.base_data, y.base_data, np.int32(n), sh, sa, sb, pre))
        return y

    @staticmethod
    def _bstrides(shape, target):
        """Strides of a contiguous ``shape`` broadcast to ``target`` (0 on broadcast axes)."""
        shape = (1,) * (len(target) - len(shape)) + tuple(shape)
        st = contiguous_strides(shape)
        return tuple(0 if s == 1 and t != 1 else d for s, t, d in zip(shape, target, st))

    def affine(self, x, scale, shift, activation=None, out=None):
        """``y[n, c, ...] = act(x[n, c, ...] * scale[c] + shift[c])`` (``scale``, ``shift``: float32 Arrays (C,))."""
        y = self._out(x.shape, out)
        n = _size(x.shape)
        if n:
            c = int(x.shape[1]) if x.ndim > 1 else int(x.shape[0])
            s = n // (c * (int(x.shape[0]) if x.ndim > 1 else 1))
            self._launch("affine", (f"-DACT={ACTS[activation]}",), n,
                         (x.base_data, y.base_data, scale.base_data, shift.base_data, np.int32(n), np.int32(c),
                          np.int32(s)))
        return y

    def copy_nd(self, x, y, shape, x_strides, y_strides, x_offset=0, y_offset=0):
        """``y[y_offset + i . y_strides] = x[x_offset + i . x_strides]`` for every index ``i`` of ``shape``
        (element strides and offsets into the two buffers)."""
        n = _size(shape)
        if n:
            sh, xs, ys = _nd(shape, x_strides, y_strides)
            self._launch("copy_nd", (), n, (x.base_data, y.base_data, np.int32(n), sh, xs, ys, np.int32(x_offset),
                                            np.int32(y_offset)))
        return y

    def fill(self, y, value: float):
        n = _size(y.shape)
        if n:
            self._launch("fill", (), n, (y.base_data, np.int32(n), np.float32(value)))
        return y

    def pool2d(self, x, kernel, stride, pads, dilation, out_hw, kind: str, count_pad: bool = False):
        """Max (``kind="max"``) or average pooling of NCHW ``x`` to ``(N, C) + out_hw``; ``pads``: (top, left)."""
        n_, c, ih, iw = (int(s) for s in x.shape)
        oh, ow = out_hw
        y = self.empty((n_, c, oh, ow))
        total = _size(y.shape)
        if total:
            opts = ("-DPOOL_MAX",) if kind == "max" else (("-DCOUNT_PAD",) if count_pad else ())
            self._launch("pool2d", opts, total, (x.base_data, y.base_data, np.int32(n_ * c), np.int32(ih),
                                                 np.int32(iw), np.int32(oh), np.int32(ow),
                                                 *(np.int32(v) for v in (*kernel, *stride, *pads, *dilation))))
        return y

    def mean_rows(self, x, rows: int, length: int, out_shape):
        """``y[r] = mean(x[r, :length])`` over ``rows`` rows of contiguous ``x``; ``y`` of ``out_shape``."""
        y = self.empty(out_shape)
        if rows and length:
            self._launch("mean_rows", (f"-DRLOCAL={LOCAL}",), rows * LOCAL,
                         (x.base_data, y.base_data, np.int32(length)))
        return y

    def softmax_rows(self, x, length: int):
        """Softmax of contiguous ``x`` over rows of ``length`` (its last axis)."""
        y = self.empty(x.shape)
        rows = _size(x.shape) // max(length, 1)
        if rows and length:
            self._launch("softmax_rows", (f"-DRLOCAL={LOCAL}",), rows * LOCAL,
                         (x.base_data, y.base_data, np.int32(length)))
        return y

    def resize2d(self, x, out_hw, scales_hw, linear: bool, coord_mode: str, nearest_mode: str):
        """Resize NCHW ``x`` over H, W to ``out_hw`` (``scales_hw``: the output/input ratios ONNX divides by)."""
        n_, c, ih, iw = (int(s) for s in x.shape)
        oh, ow = out_hw
        y = self.empty((n_, c, oh, ow))
        total = _size(y.shape)
        if total:
            opts = [f"-DCOORD_MODE={COORD_MODES[coord_mode]}", f"-DNEAREST_MODE={NEAREST_MODES[nearest_mode]}"]
            if linear:
                opts.append("-DRESIZE_LINEAR")
            self._launch("resize2d", tuple(opts), total,
                         (x.base_data, y.base_data, np.int32(n_ * c), np.int32(ih), np.int32(iw), np.int32(oh),
                          np.int32(ow), np.float32(scales_hw[0]), np.float32(scales_hw[1])))
        return y

    def matmul(self, a, b):
        """``a @ b`` for ``a`` ``(..., M, K)``, ``b`` ``(..., K, N)`` (batch dims broadcast as numpy does)."""
        m, k = (int(v) for v in a.shape[-2:])
        k2, n = (int(v) for v in b.shape[-2:])
        if k != k2:
            raise ValueError(f"matmul of {tuple(a.shape)} and {tuple(b.shape)}: inner dimensions differ")
        batch = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
        y = self.empty(batch + (m, n))
        total = _size(y.shape)
        if total:
            sa = [s * m * k for s in self._bstrides(a.shape[:-2], batch)] if batch else []
            sb = [s * k * n for s in self._bstrides(b.shape[:-2], batch)] if batch else []
            bs, sa, sb = _nd(batch, sa, sb)
            self._launch("matmul", (), total, (a.base_data, b.base_data, y.base_data, np.int32(total), np.int32(m),
                                               np.int32(n), np.int32(k), bs, sa, sb))
        return y
