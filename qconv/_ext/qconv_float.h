/* Float-activation GEMM micro-kernels of the qconv CPU engine (act_quant=None: weight-only quantization).
 *
 * The same call as qc_gemm (qconv_kernels.h: qc_gemm_args, 32 output channels per weight tile, `nblocks` blocks
 * of `taps` runs of `bq` tile rows, the layout's L order), but A holds float32 activations: column e, tap t,
 * block k reads the 4*bq floats at (const float *)(aptr[e*ldp + t] + a_off + k*a_bstride) (offsets in bytes;
 * out-of-image taps point to a row of zeros). The AVX2 kernel converts one (channel tile, block) of integer codes
 * (int8 q, or int4 stored as q + 8) at a time into g->wf, a per-thread scratch of 128*taps*bq + 33*ncols floats,
 * and runs every column of the call over it; nothing else of the weight is expanded:
 *   I_k = sum q*x (float32 FMA),  S_k = sum x (only with offsets),
 *   F = sum_k scale[k]*I_k + offset[k]*S_k;   y = clamp(dx[e]*F + bias, lo, hi)
 * with the partial F in `out` between calls of a split reduction (first / last), as the integer kernels.
 * The sums are float32 in the kernel's order (the AVX2 and scalar orders differ): results match the oracle's
 * float64 conv of the dequantized weight within its tolerance, not bitwise.
 */
#ifndef QCONV_FLOAT_H
#define QCONV_FLOAT_H

#include "qconv_kernels.h"

/* sum of column e's floats of block k */
static inline float qc_f32_colsum(const qc_gemm_args *g, int e, int k)
{
    float s = 0.0f;
    for (int t = 0; t < g->taps; ++t) {
        const float *a = (const float *)(g->aptr[(int64_t)e * g->ldp + t] + g->a_off + (int64_t)k * g->a_bstride);
        for (int i = 0; i < 4 * g->bq; ++i) s += a[i];
    }
    return s;
}

static inline int qc_f32_has_offsets(const qc_gemm_args *g) { return g->hscale ? g->hoffset != NULL : g->offset != NULL; }

static void qc_gemm_f32_scalar(const qc_gemm_args *g)
{
    for (int tile = 0; tile < g->ntiles; ++tile) {
        const int64_t to = (int64_t)tile * QC_UNIT;
        for (int e = 0; e < g->ncols; ++e) {
            float *out = g->out + (int64_t)e * g->ldo + to;
            for (int k = 0; k < g->nblocks; ++k) {
                const uint8_t *wk = g->w + (int64_t)tile * g->w_tstride + (int64_t)k * g->w_bstride;
                const int64_t tt = (int64_t)k * g->ldt + (int64_t)tile * g->ldtt;
                const float s = qc_f32_has_offsets(g) ? qc_f32_colsum(g, e, k) : 0.0f;
                float acc[QC_UNIT];
                int8_t wt[QC_UNIT * QC_SRC_UNIT];
                const int q0 = g->bits == 8 ? 0 : 8;   /* int4 codes are stored as q + 8 */
                for (int j = 0; j < QC_UNIT; ++j) acc[j] = 0.0f;
                for (int t = 0; t < g->taps; ++t) {
                    const float *a = (const float *)(g->aptr[(int64_t)e * g->ldp + t] + g->a_off
                                                     + (int64_t)k * g->a_bstride);
                    for (int l = 0; l < g->bq; ++l) {
                        const int8_t *wl = qc_tile_row(g, wk, (int64_t)t * g->bq + l, wt);
                        for (int j = 0; j < QC_UNIT; ++j)
                            for (int r = 0; r < 4; ++r) acc[j] += (float)(wl[4 * j + r] - q0) * a[4 * l + r];
                    }
                }
                for (int j = 0; j < QC_UNIT; ++j) {
                    float f = qc_scale_at(g, tt + j) * acc[j] + qc_offset_at(g, tt + j) * s;
                    if (k > 0 || !g->first) f += out[j];
                    if (k == g->nblocks - 1 && g->last) {
                        f = g->dx[e] * f + g->bias[to + j];
                        f = f < g->lo ? g->lo : f;
                        f = f > g->hi ? g->hi : f;
                    }
                    out[j] = f;
                }
            }
        }
    }
}

#ifdef QC_HAVE_X86
#define QC_F32_NC 6

/* block k of channel tile `tile` as floats into g->wf: row `row`, code r, channel j at wf[(4*row + r)*32 + j] */
QC_TGT_AVX2 static void qc_f32_pack(const qc_gemm_args *g, int tile, int k)
{
    const uint8_t *wk = g->w + (int64_t)tile * g->w_tstride + (int64_t)k * g->w_bstride;
    const int64_t blq = (int64_t)g->taps * g->bq;
    const __m256i m4 = _mm256_set1_epi8(15), eight = _mm256_set1_epi32(8), ff = _mm256_set1_epi32(255);
    for (int64_t row = 0; row < blq; ++row) {
        float *d = g->wf + 128 * row;
        for (int p = 0; p < 4; ++p) {   /* lane c of v: the 4 code bytes of channel 8p + c */
            if (g->bits == 8) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(wk + 128 * row + 32 * p));
                for (int r = 0; r < 4; ++r)
                    _mm256_storeu_ps(d + 32 * r + 8 * p,
                                     _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * r), 24)));
            } else {   /* half-split nibbles q + 8: channels 0-15 in the high nibbles, 16-31 in the low ones */
                const __m256i b = _mm256_loadu_si256((const __m256i *)(wk + 64 * row + 32 * (p & 1)));
                const __m256i v = p < 2 ? _mm256_and_si256(_mm256_srli_epi16(b, 4), m4) : _mm256_and_si256(b, m4);
                for (int r = 0; r < 4; ++r)
                    _mm256_storeu_ps(d + 32 * r + 8 * p, _mm256_cvtepi32_ps(
                        _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(v, 8 * r), ff), eight)));
            }
        }
    }
}

/* the scales and offsets of 8 channels at table index i (float16 or float32 tables; offsets 0 when symmetric) */
QC_TGT_AVX2 static inline __attribute__((always_inline)) void qc_f32_tables8(const qc_gemm_args *g, int64_t i,
                                                                            __m256 *sc, __m256 *of)
{
    if (g->hscale) {
        *sc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g->hscale + i)));
        *of = g->hoffset ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g->hoffset + i))) : _mm256_setzero_ps();
    } else {
        *sc = _mm256_loadu_ps(g->scale + i);
        *of = g->offset ? _mm256_loadu_ps(g->offset + i) : _mm256_setzero_ps();
    }
}

/* Taps t0 .. t1-1 of block k for NC columns x 8*NV channels (NV = 2: 16 channels, half h of the tile; NV = 1: its
 * first 8, for a last tile whose other 8 hold no stored output) from the packed floats: NV*NC accumulators, NV
 * weight vectors and one broadcast per code. The partial sums of a column live in acc (32 floats a column) between
 * tap chunks; the last chunk runs the epilogue. */
QC_TGT_AVX2 static inline __attribute__((always_inline))
void qc_f32_half(const qc_gemm_args *g, const int e0, const int NC, const int NV, int tile, int k, int h, int t0,
                 int t1, const float *s, float *acc)
{
    const int bq = g->bq;
    const int64_t to = (int64_t)tile * QC_UNIT, koff = g->a_off + (int64_t)k * g->a_bstride;
    const int64_t tt = (int64_t)k * g->ldt + (int64_t)tile * g->ldtt;
    const int add = k > 0 || !g->first, fin = k == g->nblocks - 1 && g->last;
    __m256 a0[QC_F32_NC], a1[QC_F32_NC];
#pragma GCC unroll 6
    for (int e = 0; e < NC; ++e) {
        a0[e] = t0 ? _mm256_loadu_ps(acc + 32 * (e0 + e) + 16 * h) : _mm256_setzero_ps();
        a1[e] = t0 && NV == 2 ? _mm256_loadu_ps(acc + 32 * (e0 + e) + 16 * h + 8) : _mm256_setzero_ps();
    }
    for (int t = t0; t < t1; ++t) {
        const float *ap[QC_F32_NC];
#pragma GCC unroll 6
        for (int e = 0; e < NC; ++e) ap[e] = (const float *)(g->aptr[(int64_t)(e0 + e) * g->ldp + t] + koff);
        const float *wr = g->wf + 128 * (int64_t)t * bq + 16 * h;
        for (int l = 0; l < 4 * bq; ++l) {   /* l = 4*row + r: code r of tile row `row` */
            const __m256 w0 = _mm256_loadu_ps(wr + 32 * l);
            const __m256 w1 = NV == 2 ? _mm256_loadu_ps(wr + 32 * l + 8) : w0;
#pragma GCC unroll 6
            for (int e = 0; e < NC; ++e) {
                const __m256 b = _mm256_broadcast_ss(ap[e] + l);
                a0[e] = _mm256_fmadd_ps(w0, b, a0[e]);
                if (NV == 2) a1[e] = _mm256_fmadd_ps(w1, b, a1[e]);
            }
        }
    }
    if (t1 < g->taps) {
#pragma GCC unroll 6
        for (int e = 0; e < NC; ++e) {
            _mm256_storeu_ps(acc + 32 * (e0 + e) + 16 * h, a0[e]);
            if (NV == 2) _mm256_storeu_ps(acc + 32 * (e0 + e) + 16 * h + 8, a1[e]);
        }
        return;
    }
    for (int q = 0; q < NV; ++q) {
        const int64_t c = 16 * h + 8 * q;
        __m256 sc, of;
        qc_f32_tables8(g, tt + c, &sc, &of);
#pragma GCC unroll 6
        for (int e = 0; e < NC; ++e) {
            __m256 f = _mm256_fmadd_ps(sc, q ? a1[e] : a0[e], _mm256_mul_ps(of, _mm256_set1_ps(s[e0 + e])));
            float *out = g->out + (int64_t)(e0 + e) * g->ldo + to + c;
            if (add) f = _mm256_add_ps(f, _mm256_loadu_ps(out));
            if (fin) {
                f = _mm256_fmadd_ps(_mm256_set1_ps(g->dx[e0 + e]), f, _mm256_loadu_ps(g->bias + to + c));
                f = _mm256_min_ps(_mm256_max_ps(f, _mm256_set1_ps(g->lo)), _mm256_set1_ps(g->hi));
            }
            _mm256_storeu_ps(out, f);
        }
    }
}

QC_TGT_AVX2 static inline __attribute__((always_inline))
void qc_f32_cols(const qc_gemm_args *g, const int e0, const int NC, int tile, int k, int t0, int t1, const float *s,
                 float *acc)
{
    const int32_t rem = g->nvalid - (int32_t)tile * QC_UNIT;   /* stored channels from this tile's first */
    if (rem > 8) qc_f32_half(g, e0, NC, 2, tile, k, 0, t0, t1, s, acc);
    else qc_f32_half(g, e0, NC, 1, tile, k, 0, t0, t1, s, acc);
    if (rem > 24) qc_f32_half(g, e0, NC, 2, tile, k, 1, t0, t1, s, acc);
    else if (rem > 16) qc_f32_half(g, e0, NC, 1, tile, k, 1, t0, t1, s, acc);
}

/* Per (channel tile, block): pack the codes as floats once (g->wf), then every column over chunks of taps whose
 * packed weights (<= 32 tile rows, 16 KiB) stay in L1 while all the call's columns pass over them. g->wf holds
 * 128*taps*bq floats of weights, then 32*ncols of partial sums and ncols block sums. */
QC_TGT_AVX2 static void qc_gemm_f32_avx2(const qc_gemm_args *g)
{
    float *acc = g->wf + 128 * (int64_t)g->taps * g->bq, *s = acc + 32 * (int64_t)g->ncols;
    const int tc = g->bq >= 32 ? 1 : 32 / g->bq;   /* taps per chunk */
    for (int tile = 0; tile < g->ntiles; ++tile)
        for (int k = 0; k < g->nblocks; ++k) {
            qc_f32_pack(g, tile, k);
            for (int e = 0; e < g->ncols; ++e) s[e] = qc_f32_has_offsets(g) ? qc_f32_colsum(g, e, k) : 0.0f;
            for (int t0 = 0; t0 < g->taps; t0 += tc) {
                const int t1 = t0 + tc < g->taps ? t0 + tc : g->taps;
                int e = 0;
                for (; e + QC_F32_NC <= g->ncols; e += QC_F32_NC) qc_f32_cols(g, e, QC_F32_NC, tile, k, t0, t1, s, acc);
                switch (g->ncols - e) {
                case 5: qc_f32_cols(g, e, 5, tile, k, t0, t1, s, acc); break;
                case 4: qc_f32_cols(g, e, 4, tile, k, t0, t1, s, acc); break;
                case 3: qc_f32_cols(g, e, 3, tile, k, t0, t1, s, acc); break;
                case 2: qc_f32_cols(g, e, 2, tile, k, t0, t1, s, acc); break;
                case 1: qc_f32_cols(g, e, 1, tile, k, t0, t1, s, acc); break;
                default: break;
                }
            }
        }
}

/* One column of int8 codes (a GEMV: a linear layer on one row, a conv on one pixel): no packing. Per tap row, the
 * 4 codes of two channels load as 8 floats (sign extend, convert) and meet x's 4 values broadcast to both halves:
 * lane 4c + r of accumulator m sums code r of channel 2m + c. A block ends with those 4 partial sums added as
 * (r0 + r1) + (r2 + r3), then qc_f32_half's epilogue. Half a tile (16 channels, 8 accumulators) a pass. */
QC_TGT_AVX2 static void qc_gemv_f32_avx2(const qc_gemm_args *g)
{
    const int bq = g->bq, add0 = !g->first;
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int tile = 0; tile < g->ntiles; ++tile) {
        const int64_t to = (int64_t)tile * QC_UNIT;
        for (int k = 0; k < g->nblocks; ++k) {
            const uint8_t *wk = g->w + (int64_t)tile * g->w_tstride + (int64_t)k * g->w_bstride;
            const int64_t koff = g->a_off + (int64_t)k * g->a_bstride;
            const int64_t tt = (int64_t)k * g->ldt + (int64_t)tile * g->ldtt;
            const float s = qc_f32_has_offsets(g) ? qc_f32_colsum(g, 0, k) : 0.0f;
            const int add = k > 0 || add0, fin = k == g->nblocks - 1 && g->last;
            for (int h = 0; h < 2; ++h) {
                __m256 a[8];
                for (int m = 0; m < 8; ++m) a[m] = _mm256_setzero_ps();
                for (int t = 0; t < g->taps; ++t) {
                    const float *x = (const float *)(g->aptr[t] + koff);
                    const uint8_t *wr = wk + (int64_t)t * bq * 128 + 64 * h;
                    for (int l = 0; l < bq; ++l) {
                        const __m256 xv = _mm256_broadcast_ps((const __m128 *)(x + 4 * l));
                        const uint8_t *w = wr + 128 * l;
#pragma GCC unroll 8
                        for (int m = 0; m < 8; ++m)
                            a[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                _mm_loadl_epi64((const __m128i *)(w + 8 * m)))), xv, a[m]);
                    }
                }
                for (int q = 0; q < 2; ++q) {   /* channels 16h + 8q .. +7 from accumulators 4q .. 4q+3 */
                    const __m256 i8 = _mm256_permutevar8x32_ps(
                        _mm256_hadd_ps(_mm256_hadd_ps(a[4 * q], a[4 * q + 1]), _mm256_hadd_ps(a[4 * q + 2], a[4 * q + 3])),
                        order);
                    const int64_t c = 16 * h + 8 * q;
                    __m256 sc, of;
                    qc_f32_tables8(g, tt + c, &sc, &of);
                    __m256 f = _mm256_fmadd_ps(sc, i8, _mm256_mul_ps(of, _mm256_set1_ps(s)));
                    float *out = g->out + to + c;
                    if (add) f = _mm256_add_ps(f, _mm256_loadu_ps(out));
                    if (fin) {
                        f = _mm256_fmadd_ps(_mm256_set1_ps(g->dx[0]), f, _mm256_loadu_ps(g->bias + to + c));
                        f = _mm256_min_ps(_mm256_max_ps(f, _mm256_set1_ps(g->lo)), _mm256_set1_ps(g->hi));
                    }
                    _mm256_storeu_ps(out, f);
                }
            }
        }
    }
}
#endif

/* ---- the input as pixel-major rows: dst[p*ldd + c] = src[c*sst + p] for channels c < C, pixels p < npx (an NCHW
 * run of npx pixels, channel planes sst floats apart); the caller zeroes padded lanes. Returns the number of
 * NaN / inf values copied (float activations have no quantization pass to refuse them) ---- */
static int64_t qc_pixels_f32_scalar(const float *src, int64_t C, int64_t npx, int64_t sst, float *dst, int64_t ldd)
{
    int64_t bad = 0;
    for (int64_t c = 0; c < C; ++c)
        for (int64_t p = 0; p < npx; ++p) {
            const float v = src[c * sst + p];
            bad += !(v - v == 0.0f);   /* NaN - NaN and inf - inf are NaN */
            dst[p * ldd + c] = v;
        }
    return bad;
}

#ifdef QC_HAVE_X86
QC_TGT_AVX2 static int64_t qc_pixels_f32_avx2(const float *src, int64_t C, int64_t npx, int64_t sst, float *dst,
                                              int64_t ldd)
{
    int64_t c = 0, bad = 0;
    for (; c + 8 <= C; c += 8) {   /* 8x8 blocks through the transpose */
        int64_t p = 0;
        __m256 nf = _mm256_setzero_ps();
        for (; p + 8 <= npx; p += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; ++i) {
                r[i] = _mm256_loadu_ps(src + (c + i) * sst + p);
                nf = _mm256_or_ps(nf, _mm256_cmp_ps(_mm256_sub_ps(r[i], r[i]), _mm256_setzero_ps(), _CMP_NEQ_UQ));
            }
            qc_tr8(r);
            for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + (p + i) * ldd + c, r[i]);
        }
        bad += _mm256_movemask_ps(nf) != 0;
        if (p < npx) bad += qc_pixels_f32_scalar(src + c * sst + p, 8, npx - p, sst, dst + p * ldd + c, ldd);
    }
    if (c < C) bad += qc_pixels_f32_scalar(src + c * sst, C - c, npx, sst, dst + c, ldd);
    return bad;
}
#endif

static inline int64_t qc_pixels_f32(const float *src, int64_t C, int64_t npx, int64_t sst, float *dst, int64_t ldd,
                                    int variant)
{
#ifdef QC_HAVE_X86
    if (variant >= QC_KERNEL_AVX2) return qc_pixels_f32_avx2(src, C, npx, sst, dst, ldd);
#endif
    (void)variant;
    return qc_pixels_f32_scalar(src, C, npx, sst, dst, ldd);
}

/* every x86 kernel variant (AVX2 and up) runs the AVX2 + FMA kernel; other machines the scalar one */
static inline void qc_gemm_f32(const qc_gemm_args *g, int variant)
{
#ifdef QC_HAVE_X86
    if (variant >= QC_KERNEL_AVX2) {
        if (g->ncols == 1 && g->bits == 8) qc_gemv_f32_avx2(g);
        else qc_gemm_f32_avx2(g);
        return;
    }
#endif
    (void)variant;
    qc_gemm_f32_scalar(g);
}

#endif /* QCONV_FLOAT_H */
