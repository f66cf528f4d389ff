# Declarations of the qconv CPU engine's native parts (see _cpu.pyx and qconv_kernels.h).
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
        int32_t first, last
        int32_t zpu
        float lo, hi
        const uint8_t *wa
        int64_t wa_bstride, wa_tstride
        int32_t kp, amx_min

    void qc_gemm(const qc_gemm_args *g, int variant)
    void qc_quant(const float *x, int64_t n, float qs, int32_t z, int32_t qlo, int32_t qhi, int32_t abias,
                  uint8_t *dst, int variant)
    void qc_block_sums(const uint8_t *Q, int64_t npix, int64_t ltot, int64_t gnb, int64_t bcp, int32_t zpu,
                       int32_t flip, int32_t *ps, int variant)
    void qc_minmax(const float *x, int64_t n, float *lo, float *hi, int variant)
    float qc_absmax(const float *x, int64_t n, int variant)
    void qc_transpose_u8(const uint8_t *src, int64_t rows, int64_t cols, int64_t src_stride, uint8_t *dst,
                         int64_t dst_stride)
    int qc_store16_nchw(const float *OUT, int64_t ldo, int G, int Og, int OCp, float *yimg, int64_t ohw,
                        int variant)
    int qc_kernel_supported(int variant)
    int qc_best_kernel()


# Everything one forward call needs, as plain C data (built under the GIL, read by nogil workers).
cdef struct ConvJob:
    # input / output geometry
    int64_t N, H, W, OH, OW, OHW, P
    int C, O, G, Og, NB, BC, BCp, K, KH, KW, sh, sw, ph, pw, dh, dw
    int GNB, OCU, OCp, bits, variant, tile_cols
    int abias              # stored activation bytes are xq + abias: 128 (u8, int8 weights) or 0 (s8, int4)
    int64_t Ltot1          # bytes per pixel of the quantized input Q = GNB * BCp
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
    # AMX weights (AmxWeightLayout, tile-major like w), or NULL until bound; calls of fewer than amx_min columns
    # (and every call of another kernel) use w
    const uint8_t *wa
    int64_t wa_gstride, wa_bstride, wa_tstride
    int kp, amx_min
    # activations of this call
    const uint8_t *Q       # (N*H*W, Ltot1) xq + abias, padded lanes = zpu
    const int32_t *PS      # (N*H*W, GNB) per-pixel block sums of u = xq - z
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
    # set by the run: threads its parallel loops were given, and 1 when it split output-channel tiles
    int used_threads, channel_split
