/* qconv_fused.h -- fused elementwise chains of the CPU session (qconv/onnx/fusion.py, driven by _fused.pyx).
 *
 * A program runs per output row (n, c, y) of W floats over row slots: slots 0 .. nleaves-1 are the leaves, the
 * others temporaries; instruction i computes slot dst from slots a (and b), one float32 operation per element in
 * the chain's order; the last instruction writes the output row. Leaf kinds:
 *   0 full:        row (n, c, y / fh) of a (N, C, lh, lw) tensor, each value repeated fw times (fw = 1: in place);
 *   1 per channel: value [n or 0][c] of a (N or 1, C, 1, 1) tensor, on the whole row;
 *   2 scalar:      the tensor's one value.
 * Operations (codes of _fused.OP_CODES): 0 a + b, 1 a - b, 2 a * b, 3 a / b, 10 max(a, 0), 11 clamp(a*p0 + p1,
 * 0, 1) (HardSigmoid), 13 clamp(a, p0, p1), 14 a * clamp(a*p0 + p1, 0, 1) (HardSwish): the
 * products and sums are rounded one at a time (no fused multiply-add), as onnxruntime's ops compute them.
 * qc_fused_rows_avx2 is the same code compiled for AVX2 (picked at run time), qc_fused_rows_c the portable one.
 */
#ifndef QCONV_FUSED_H
#define QCONV_FUSED_H

#include <stdint.h>

#include "qconv_kernels.h"   /* qc_exp_scalar / qc_exp_avx2, the tail activations (the gate) */

#define QC_FUSED_MAX_SLOTS 64

typedef struct {
    int64_t N, C, H, W;
    int32_t nleaves, nslots, nins;
    const float **leaf;
    const int32_t *kind, *fh, *fw;
    const int64_t *ln, *lh, *lw;   /* per-channel leaves: batch; full leaves: rows and columns */
    const int32_t *ins;            /* (nins, 4): op, dst, a, b (-1: unary) */
    const float *par;              /* (nins, 2) */
    float *y;
    float *scratch;                /* per thread: nslots rows of W floats */
    int64_t per_thread;
} qc_fused_job;

/* o[x] = op(a[x]), x < W, for the unary codes 10 max(a, 0), 11 clamp(a*p0 + p1, 0, 1), 13 clamp(a, p0, p1), 14
 * a * clamp(a*p0 + p1, 0, 1) (o may be a: each element is read before it is written, at its own index); the chains'
 * rows and the squeeze-excitation gate share it */
static inline __attribute__((always_inline)) void qc_unary_row(float *o, const float *a, int64_t W, int op, float p0,
                                                               float p1)
{
    switch (op) {
    case 10: for (int64_t x = 0; x < W; ++x) o[x] = a[x] > 0.0f ? a[x] : 0.0f; break;
    case 11:
        for (int64_t x = 0; x < W; ++x) {
            float v = a[x] * p0;
            v = v + p1;
            o[x] = v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v);
        }
        break;
    case 13: for (int64_t x = 0; x < W; ++x) o[x] = a[x] < p0 ? p0 : (a[x] > p1 ? p1 : a[x]); break;
    case 14:
        for (int64_t x = 0; x < W; ++x) {
            float v = a[x] * p0;
            v = v + p1;
            o[x] = a[x] * (v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v));
        }
        break;
    default: break;
    }
}

static inline __attribute__((always_inline)) void qc_fused_rows_body(const qc_fused_job *j, int64_t r0, int64_t r1,
                                                                     int tid)
{
    const int64_t W = j->W, H = j->H, C = j->C;
    const float *rows[QC_FUSED_MAX_SLOTS];
    float *buf = j->scratch + tid * j->per_thread;
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / (C * H), c = (r / H) % C, yy = r % H;
        for (int l = 0; l < j->nleaves; ++l) {
            float *o = buf + l * W;
            if (j->kind[l] == 0) {
                const float *src = j->leaf[l] + ((n * C + c) * j->lh[l] + yy / j->fh[l]) * j->lw[l];
                const int f = j->fw[l];
                if (f == 1) { rows[l] = src; continue; }
                if (f == 2) {
                    for (int64_t x = 0; x < W / 2; ++x) { o[2 * x] = src[x]; o[2 * x + 1] = src[x]; }
                } else {
                    for (int64_t x = 0; x < W / f; ++x)
                        for (int k = 0; k < f; ++k) o[x * f + k] = src[x];
                }
            } else {
                const float v = j->kind[l] == 1 ? j->leaf[l][(j->ln[l] > 1 ? n : 0) * C + c] : j->leaf[l][0];
                for (int64_t x = 0; x < W; ++x) o[x] = v;
            }
            rows[l] = o;
        }
        for (int i = 0; i < j->nins; ++i) {
            const int32_t *in = j->ins + 4 * i;
            float *restrict o = i == j->nins - 1 ? j->y + r * W : buf + in[1] * W;
            const float *restrict a = rows[in[2]];
            const float *restrict b = in[3] >= 0 ? rows[in[3]] : a;
            const float p0 = j->par[2 * i], p1 = j->par[2 * i + 1];
            switch (in[0]) {
            case 0: for (int64_t x = 0; x < W; ++x) o[x] = a[x] + b[x]; break;
            case 1: for (int64_t x = 0; x < W; ++x) o[x] = a[x] - b[x]; break;
            case 2: for (int64_t x = 0; x < W; ++x) o[x] = a[x] * b[x]; break;
            case 3: for (int64_t x = 0; x < W; ++x) o[x] = a[x] / b[x]; break;
            default: qc_unary_row(o, a, W, in[0], p0, p1); break;
            }
            rows[in[1]] = o;
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"), optimize("fp-contract=off"))) static int64_t qc_fused_rows_avx2(
    void *ctx, int64_t r0, int64_t r1, int tid)
{
    qc_fused_rows_body((const qc_fused_job *)ctx, r0, r1, tid);
    return 0;
}
#endif

__attribute__((optimize("fp-contract=off"))) static int64_t qc_fused_rows_c(void *ctx, int64_t r0, int64_t r1,
                                                                            int tid)
{
    qc_fused_rows_body((const qc_fused_job *)ctx, r0, r1, tid);
    return 0;
}

/* the row function for this CPU */
static inline int64_t (*qc_fused_rows(void))(void *, int64_t, int64_t, int)
{
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_cpu_supports("avx2")) return qc_fused_rows_avx2;
#endif
    return qc_fused_rows_c;
}

/* ---- squeeze-excitation blocks (qconv/onnx/excite.py): rows r = (n, c) of HW floats ----
 * qc_se_means: out[r] = (sum of row r) / HW, the sum in 16 float32 partial sums (element i into sum i % 16, in
 *              order), added pairwise (s_l + s_{l+8}, then +4, +2, +1): the same order on every CPU;
 * qc_se_scale: y[r, i] = x[r, i] * g[r] (one float32 product). */
typedef struct {
    const float *x, *g;
    float *out, *y;
    int64_t HW;
} qc_se_job;

static inline __attribute__((always_inline)) void qc_se_means_body(const qc_se_job *j, int64_t r0, int64_t r1)
{
    const int64_t HW = j->HW;
    for (int64_t r = r0; r < r1; ++r) {
        const float *p = j->x + r * HW;
        float s[16] = {0};
        int64_t i = 0;
        for (; i + 16 <= HW; i += 16)
            for (int l = 0; l < 16; ++l) s[l] += p[i + l];
        for (int l = 0; i + l < HW; ++l) s[l] += p[i + l];
        for (int w = 8; w >= 1; w /= 2)
            for (int l = 0; l < w; ++l) s[l] += s[l + w];
        j->out[r] = s[0] / (float)HW;
    }
}

static inline __attribute__((always_inline)) void qc_se_scale_body(const qc_se_job *j, int64_t r0, int64_t r1)
{
    const int64_t HW = j->HW;
    for (int64_t r = r0; r < r1; ++r) {
        const float *restrict p = j->x + r * HW;
        float *restrict q = j->y + r * HW;
        const float g = j->g[r];
        for (int64_t i = 0; i < HW; ++i) q[i] = p[i] * g;
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
/* qc_se_means_body with the 16 partial sums in vector lanes (two ymm: lanes 0-7, 8-15), the same sums */
__attribute__((target("avx2"))) static int64_t qc_se_means_avx2(void *ctx, int64_t r0, int64_t r1, int tid)
{
    const qc_se_job *j = (const qc_se_job *)ctx;
    const int64_t HW = j->HW;
    (void)tid;
    for (int64_t r = r0; r < r1; ++r) {
        const float *p = j->x + r * HW;
        __m256 a = _mm256_setzero_ps(), b = a;
        int64_t i = 0;
        for (; i + 16 <= HW; i += 16) {
            a = _mm256_add_ps(a, _mm256_loadu_ps(p + i));
            b = _mm256_add_ps(b, _mm256_loadu_ps(p + i + 8));
        }
        const int64_t left = HW - i;   /* 0 .. 15: masked loads add +0 past the row */
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        a = _mm256_add_ps(a, _mm256_maskload_ps(p + i, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left), lane)));
        b = _mm256_add_ps(b, _mm256_maskload_ps(p + i + 8, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left - 8), lane)));
        a = _mm256_add_ps(a, b);                                                               /* w = 8 */
        __m128 v = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));      /* w = 4 */
        v = _mm_add_ps(v, _mm_movehl_ps(v, v));                                                /* w = 2 */
        v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));                                           /* w = 1 */
        j->out[r] = _mm_cvtss_f32(v) / (float)HW;
    }
    return 0;
}
__attribute__((target("avx2"))) static int64_t qc_se_scale_avx2(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    qc_se_scale_body((const qc_se_job *)ctx, r0, r1);
    return 0;
}
#endif
__attribute__((optimize("fp-contract=off"))) static int64_t qc_se_means_c(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    qc_se_means_body((const qc_se_job *)ctx, r0, r1);
    return 0;
}
static int64_t qc_se_scale_c(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    qc_se_scale_body((const qc_se_job *)ctx, r0, r1);
    return 0;
}
/* ---- the squeeze-excitation gate (qconv/onnx/excite.py) on the (N, C) channel means, float32 ----
 * qc_gate_conv: u[n, o] = post(tail(clamp(sum_c wt[c, o] v[n, c] + b[o]))): wt the 1x1 conv's dequantized weight
 *   transposed, (C, O); each sum in c order, products and sums rounded one at a time; act 0 none, 1 relu, 2 relu6,
 *   3 hardswish, 4 silu (qconv_kernels.h's tail functions), post (ps, pt: NULL or (O,)) u*ps + pt;
 * qc_gate_op: v = op(v) in place, codes of _fused.GATE_OPS: 10 max(v, 0), 11 clamp(v*p0 + p1, 0, 1), 13 clamp(v,
 *   p0, p1), 14 v * clamp(v*p0 + p1, 0, 1), 20 1 / (1 + exp(-v)) (qc_exp_scalar's exp).
 * The AVX2 forms give the same bits. */
static inline __attribute__((always_inline)) void qc_gate_sums(const float *v, int64_t N, int64_t C, const float *wt,
                                                               const float *b, int64_t O, int act, float *u)
{
    for (int64_t n = 0; n < N; ++n) {
        float *un = u + n * O;
        for (int64_t o = 0; o < O; ++o) un[o] = 0.0f;
        for (int64_t c = 0; c < C; ++c) {
            const float x = v[n * C + c], *wr = wt + c * O;
            for (int64_t o = 0; o < O; ++o) un[o] += wr[o] * x;
        }
        for (int64_t o = 0; o < O; ++o) {
            float y = un[o] + b[o];
            if (act == 1 || act == 2) y = y > 0.0f ? y : 0.0f;
            if (act == 2) y = y < 6.0f ? y : 6.0f;
            un[o] = y;
        }
    }
}

static inline __attribute__((always_inline)) void qc_gate_post(float *u, int64_t N, int64_t O, const float *ps,
                                                               const float *pt)
{
    if (ps)
        for (int64_t n = 0; n < N; ++n)
            for (int64_t o = 0; o < O; ++o) u[n * O + o] = u[n * O + o] * ps[o] + pt[o];
}

static inline float qc_sigmoid_scalar(float x)
{
    float e = qc_exp_scalar(-x);
    QC_FP_KEEP(e);
    return 1.0f / (1.0f + e);
}

static inline __attribute__((always_inline)) void qc_gate_op_body(float *v, int64_t i0, int64_t n, int op, float p0,
                                                                  float p1)
{
    if (op != 20) {
        qc_unary_row(v + i0, v + i0, n - i0, op, p0, p1);
        return;
    }
    for (int64_t i = i0; i < n; ++i) v[i] = qc_sigmoid_scalar(v[i]);
}

__attribute__((optimize("fp-contract=off"))) static void qc_gate_conv_c(const float *v, int64_t N, int64_t C,
                                                                        const float *wt, const float *b, int64_t O,
                                                                        int act, const float *ps, const float *pt,
                                                                        float *u)
{
    qc_gate_sums(v, N, C, wt, b, O, act, u);
    if (act >= 3) qc_tail_scalar(u, N * O, act == 3 ? QC_ACT_HARDSWISH : QC_ACT_SILU);
    qc_gate_post(u, N, O, ps, pt);
}

__attribute__((optimize("fp-contract=off"))) static void qc_gate_op_c(float *v, int64_t n, int op, float p0, float p1)
{
    qc_gate_op_body(v, 0, n, op, p0, p1);
}

#ifdef QC_HAVE_X86
__attribute__((target("avx2,fma"), optimize("fp-contract=off"))) static void qc_gate_conv_avx2(
    const float *v, int64_t N, int64_t C, const float *wt, const float *b, int64_t O, int act, const float *ps,
    const float *pt, float *u)
{
    qc_gate_sums(v, N, C, wt, b, O, act, u);
    if (act >= 3) {
        const int tail = act == 3 ? QC_ACT_HARDSWISH : QC_ACT_SILU;
        int64_t i = 0;
        for (; i + 8 <= N * O; i += 8) _mm256_storeu_ps(u + i, qc_tail_avx2_v(_mm256_loadu_ps(u + i), tail));
        qc_tail_scalar(u + i, N * O - i, tail);
    }
    qc_gate_post(u, N, O, ps, pt);
}

__attribute__((target("avx2,fma"), optimize("fp-contract=off"))) static void qc_gate_op_avx2(float *v, int64_t n, int op,
                                                                                           float p0, float p1)
{
    int64_t i = 0;
    if (op == 20)
        for (; i + 8 <= n; i += 8) {
            const __m256 e = qc_exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(v + i)));
            _mm256_storeu_ps(v + i, _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
        }
    qc_gate_op_body(v, i, n, op, p0, p1);
}
#endif

static void qc_gate_conv(const float *v, int64_t N, int64_t C, const float *wt, const float *b, int64_t O, int act,
                         const float *ps, const float *pt, float *u)
{
#ifdef QC_HAVE_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        qc_gate_conv_avx2(v, N, C, wt, b, O, act, ps, pt, u);
        return;
    }
#endif
    qc_gate_conv_c(v, N, C, wt, b, O, act, ps, pt, u);
}

static void qc_gate_op(float *v, int64_t n, int op, float p0, float p1)
{
#ifdef QC_HAVE_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        qc_gate_op_avx2(v, n, op, p0, p1);
        return;
    }
#endif
    qc_gate_op_c(v, n, op, p0, p1);
}

/* the row functions for this CPU (which = 0: means, 1: scale) */
static inline int64_t (*qc_se_rows(int which))(void *, int64_t, int64_t, int)
{
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_cpu_supports("avx2")) return which ? qc_se_scale_avx2 : qc_se_means_avx2;
#endif
    return which ? qc_se_scale_c : qc_se_means_c;
}

#endif
