# Declarations shared by the qconv CPU engine's native modules (the model: scikit-learn's
# _hist_gradient_boosting/common.pxd beside one .pyx per role):
#   _cpu.pyx          the engine's native module: the public native API that qconv/cpu/ uses (ConvGeometry,
#                     ConvPlan, kernel selection, the activation-range passes)
#   _cpu_probes.pyx   machine-ceiling probes of benchmarks/bench_cpu.py (not used by the engine)
#   _cpu_testing.pyx  test-only wrappers of the nogil helpers below (tests/test_cpu_*.py)
# The helpers are cdef functions of _cpu, cimported by the other two (exported through _cpu's C-API capsule).
from libc.stdint cimport uint8_t, int8_t, uint16_t, int32_t, int64_t


cdef extern from "qconv_kernels.h" nogil:
    enum:
        QC_UNIT
        QC_SRC_UNIT
        QC_KERNEL_SCALAR
        QC_KERNEL_AVX2
        QC_KERNEL_AVX512VNNI
        QC_KERNEL_AMX

    ctypedef struct qc_gemm_args:
        const uint8_t *const *aptr
        int64_t ldp
        int64_t a_off
        int64_t a_bstride
        const uint8_t *w
        int64_t w_bstride
        int64_t w_tstride
        const int32_t *colsum
        int64_t lds
        const int32_t *wsx
        const float *scale
        const float *offset
        const uint16_t *hscale
        const uint16_t *hoffset
        int64_t ldt, ldtt
        const float *dx
        const float *dxb
        const float *bias
        float *out
        int64_t ldo
        int32_t nblocks, taps, bq, ncols, bits, ntiles
        int32_t nvalid
        int32_t first, last
        int32_t zpu
        int32_t asigned
        float lo, hi
        const uint8_t *wa
        int64_t wa_bstride, wa_tstride
        int32_t kp, amx_min
        float *wf

    void qc_gemm(const qc_gemm_args *g, int variant)
    void qc_quant(const float *x, int64_t n, float qs, int32_t z, int32_t qlo, int32_t qhi, int32_t abias,
                  uint8_t *dst, int variant)
    void qc_block_sums(const uint8_t *Q, int64_t npix, int64_t ltot, int64_t gnb, int64_t bcp, int32_t zpu,
                       int32_t flip, int32_t *ps, int variant)
    void qc_minmax(const float *x, int64_t n, float *lo, float *hi, int variant)
    float qc_absmax(const float *x, int64_t n, int variant)
    void qc_depth_to_space_row(const float *x, float *y, int64_t b, int64_t W, int64_t hw, int variant)
    void qc_transpose_u8(const uint8_t *src, int64_t rows, int64_t cols, int64_t src_stride, uint8_t *dst,
                         int64_t dst_stride)
    void qc_requant(float *v, int64_t n, float scale, int32_t zp, int variant)
    void qc_tail(float *v, int64_t n, int tail, int variant)
    int64_t qc_hswish_mismatches(int variant)
    void qc_hs_init()
    int qc_hs_mul()
    void qc_affine_rows(float *v, int64_t rows, int64_t ld, int64_t n, const float *s, const float *t, int variant)
    void qc_store_nchw(const float *OUT, int64_t ldo, int G, int Og, int OCp, float *yf, int8_t *yi, int64_t ohw,
                       int ncols, int variant)
    int qc_kernel_supported(int variant)
    int qc_best_kernel()


cdef extern from "qconv_float.h" nogil:
    void qc_gemm_f32(const qc_gemm_args *g, int variant)
    int64_t qc_pixels_f32(const float *src, int64_t C, int64_t npx, int64_t sst, float *dst, int64_t ldd,
                          int variant)


# Everything one forward call needs, as plain C data (built under the GIL, read by nogil workers).
cdef struct ConvJob:
    # input / output geometry
    int64_t N, H, W, OH, OW, OHW, P
    int C, O, G, Og, NB, BC, BCp, K, KH, KW, sh, sw, ph, pw, dh, dw
    int GNB, OCU, OCp, bits, variant, tile_cols
    int abias              # stored activation bytes are xq + abias: 128 (u8, int8 weights) or 0 (s8: int4 weights,
                           # or int8 weights in the AVX2 sign form, ConvGeometry.signed_input)
    int64_t Ltot1          # values per pixel of the pixel-major input Q = GNB * BCp (bytes; float_act: floats)
    int float_act          # act_quant=None: Q holds the float32 input itself, the GEMM is qc_gemm_f32, no PS / S
    int64_t pix_bytes      # bytes per Q pixel row: Ltot1, or 4 * Ltot1 with float_act
    int64_t ldo            # floats per out-scratch row = G * OCp
    # weights and fused tables (prepared once per layer)
    const uint8_t *w
    int64_t w_gstride, w_bstride, w_tstride
    const int32_t *wsx     # (G, OCU, NB, UNIT): tile-major, like the weight tiles
    const float *scale     # (G, OCU, NB, UNIT), or NULL with float16 tables
    const float *offset    # (G, OCU, NB, UNIT) or NULL
    const uint16_t *hscale   # the same tables as float16 bits (when the weight's scales/offsets are float16
    const uint16_t *hoffset  # values), else NULL
    const float *bias      # (G, OCp)
    const int32_t *oidx    # (O,) row position of output channel o in the out scratch
    float lo, hi
    int tail               # the activation after the clamp (qc_tail's codes, 0: none): on the out scratch before the store
    const float *pa_s      # post_affine (ldo,) scale and shift in out-scratch order, or NULL: v * s + t after
    const float *pa_t      # the activation
    # AMX weights (AmxWeightLayout, tile-major like w), or NULL until bound; calls of fewer than amx_min columns
    # (and every call of another kernel) use w
    const uint8_t *wa
    int64_t wa_gstride, wa_bstride, wa_tstride
    int kp, amx_min
    # activations of this call
    const uint8_t *Q       # (N*H*W, Ltot1) xq + abias, padded lanes = zpu (float_act: float32 x, padded lanes 0)
    const int32_t *PS      # (N*H*W, GNB) per-pixel block sums of u = xq - z (NULL with float_act)
    const float *dxn       # (N,) activation scale per sample
    int32_t zpu            # z + abias (the same for every sample): the stored zero point
    const uint8_t *zrow    # (Ltot1,) bytes of zpu: what out-of-image taps point to
    # scratch, one slot per thread (or per tile in the channel-split mode)
    const uint8_t **AP     # (slots, tile_cols, K) indirection: pixel row (in Q) of each column's taps
    int32_t *S             # (slots, tile_cols, GNB)
    float *OUT             # (slots, tile_cols, ldo)
    float *DXC             # (slots, tile_cols)
    # output
    void *y
    int out_nc4hw4, out_int8
    float oscale
    int ozp
    # act_quant="block" (block_mode): each column is quantized per (group, act block) from the pixel-major
    # float input xp into its own A row (no indirection into Q); the weights are split into fine blocks
    int block_mode
    int AB                 # input channels per activation block (a multiple of BC, the fine block)
    int64_t a_bs           # bytes between blocks in what AP points to: BCp (Q rows) or K*BCp (A rows)
    int64_t Lcol           # bytes per A row = GNB*K*BCp
    const float *xp        # (N*H*W, C) float32 pixel-major input
    uint8_t *A             # (slots, tile_cols, Lcol)
    float *DXB             # (slots, tile_cols, GNB) activation scale per (column, fine block)
    float *WF              # float_act: (threads, wf_len) each thread's packed float weights (qconv_float.h)
    int64_t wf_len
    # set by the run: threads its parallel loops were given, and 1 when it split output-channel tiles
    int used_threads, channel_split


# What one quantization pass needs (built under the GIL, read by nogil workers).
cdef struct QuantJob:
    const void *x           # float32 or int8 input, NCHW or NC4HW4 (pack 4)
    int int8_input, nc4hw4
    int64_t N, C, H, W
    const int32_t *chpos    # byte position of channel c inside a Q pixel row
    const float *qs         # per sample
    const int32_t *z        # per sample
    int qlo, qhi
    int64_t Ltot1, GNB, BCp
    int abias               # stored bytes are xq + abias (128 or 0)
    int contiguous          # chpos[c] == c for every channel
    int variant
    int64_t serial_values   # inputs of fewer values (N*C*H*W) are quantized by one thread
    int used_threads        # set by _quantize: the threads its parallel loop was given
    uint8_t *Q
    int32_t *PS


# The layer geometry handed from Python (qconv.cpu.CpuEngine) to the native plan: one typed field per quantity,
# named as in qconv.layouts.gemm_tiles.TiledWeightLayout (block_icl is MNN's ICL, the kernels' BCp). Derived
# quantities (taps, group_out_channels, gemm_blocks, oc_padded) are properties, not fields.
cdef class ConvGeometry:
    cdef readonly int in_channels, out_channels, groups, n_blocks, block_channels, block_icl
    cdef readonly int kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w
    cdef readonly int oc_tiles, bits, tile_cols, block_mode, act_block, signed_input, tail, float_act
    cdef readonly int64_t w_tile_stride, w_block_stride, w_group_stride
    cdef readonly float lo, hi


# A layer's prepared call on one input shape for the custom operator (qconv_native.h); NativeCall owns one
cdef extern from "qconv_native.h" nogil:
    enum:
        QC_NATIVE_MAX_DIMS
        QC_NATIVE_DW
        QC_NATIVE_DI8
    ctypedef struct qc_native:
        int64_t (*run)(const qc_native *self, const float *x, float *y, void *scratch) noexcept nogil
        int64_t scratch_bytes
        int32_t disabled
        int32_t kind
        int32_t nd, ond
        int64_t dims[8]
        int64_t odims[8]


cdef class NativeCall:
    cdef void *mem              # the preparing module's struct; its first member is the qc_native
    cdef readonly object keep   # what the struct's pointers point into (the plan, its arrays)


# --- nogil helpers of _cpu (see their docstrings there) ---
ctypedef int64_t (*pool_fn)(void *ctx, int64_t begin, int64_t end, int tid) noexcept nogil
cdef int64_t _parallel_for(int64_t n, int64_t chunk, pool_fn fn, void *ctx, int nthreads) noexcept nogil


cdef inline int64_t _chunk_of(int64_t n, int nthreads) noexcept nogil:
    """A parallel-for chunk for ``n`` small items on ``nthreads`` threads: about 8 chunks a thread. Every chunk is one
    claim on a shared counter (its part's); claims of single items of a few microseconds each contended for it (a 960@7 3x3
    depthwise call, 240 items: 85 us on 2 threads against 48 us on one, 29 us with these chunks; Zen 4 VM)."""
    return max(1, n // (8 * max(1, nthreads)))
cdef void _pool_testing(int stall_tid, int stall_ms, int count) noexcept nogil
cdef int64_t _pool_chunks(int tid) noexcept nogil
cdef void _geometry_into(ConvGeometry geo, ConvJob *j)
cdef void *_alloc(size_t n) noexcept nogil
cdef NativeCall _native_call(size_t nbytes, xshape, yshape, int64_t scratch_bytes, keep)
cdef int _fill_tensor(const float *x, int64_t n, const float *tail, int64_t tail_quads, int tail_lanes, int threads,
                      int variant, float *qs, int32_t *z, float *dx, int64_t N) noexcept nogil
cdef int64_t _refuse_allocations(int64_t k) noexcept nogil
cdef int64_t _quantize(QuantJob *q, int nthreads) noexcept nogil
cdef void _indirect(const ConvJob *j, int64_t p0, int ncols, const uint8_t **AP, int32_t *S) noexcept nogil
cdef int _block_cols(const ConvJob *j, int64_t p0, int ncols, uint8_t *A, const uint8_t **AP, int32_t *S,
                     float *DXB) noexcept nogil
cdef void _store(const ConvJob *j, float *OUT, int64_t p0, int ncols) noexcept nogil
cdef void _fill_quant(QuantJob *q, x, int nchw_input, int C, const float[::1] qs, const int32_t[::1] z, int qlo,
                      int qhi, const int32_t[::1] chpos, int64_t Ltot1, int64_t GNB, int64_t BCp, int variant,
                      uint8_t *Q, int32_t *PS, int contiguous=*, int abias=*, int64_t serial_values=*) except *
