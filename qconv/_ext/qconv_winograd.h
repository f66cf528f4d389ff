/* Winograd F(2x2, 3x3) for the direct float-activation path (qconv_direct.h): 3x3 convs of stride 1 and dilation 1,
 * NCHW input and output, AVX2 + FMA (qc_direct_setup sets j->wino; other layers take the direct strips).
 *
 * A 2x2 block of outputs ("tile") of channel o is A^T [ sum_c U[o, c] (.) V[c] ] A, the sum over input channels of
 * elementwise (.) products of 4x4 matrices (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks"):
 *
 *   U[o, c] = G g G^T,   g = the dequantized 3x3 weight (scale*q + offset of its block), made per call (wf);
 *   V[c]    = B^T d B,   d = the 4x4 input patch of the tile: padded rows 2ty..2ty+3, columns 2tx..2tx+3;
 *   G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1],  B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],
 *   A^T = [1 1 1 0; 0 1 -1 -1].
 *
 * So each of the 16 positions xi of the 4x4 matrices is one GEMM (O x C) x (C x tiles): 4 multiplies an output where
 * the direct path takes 9, computed by the direct path's micro-kernel (4 channels x 24 tiles, k = c). The padded
 * input is the direct path's phase planes (qc_direct_pad) with two column phases (even and odd columns, so a run of
 * tiles reads each patch column as one contiguous run), grown to 2*TH + 2 rows and 2*TW + 2 columns of zeros
 * (TH x TW tiles) so that every patch is inside; the outputs of a last, half tile past OH or OW are dropped.
 * Work item: a strip of QC_DIRECT_NP consecutive tiles (row-major over the TH x TW tiles) of one sample, every
 * output channel, in groups of QC_DIRECT_OG blocks of 4. Every output is computed in the same order whatever the
 * thread count or the work split. The transforms add rounding steps: results match the oracle within its float
 * tolerance (|y - ref| <= 1e-4 * sum |w| |x|), not bitwise the direct strips.
 * Epilogue: the direct path's (qc_direct_post_avx2).
 */
#ifndef QCONV_WINOGRAD_H
#define QCONV_WINOGRAD_H

#ifdef QC_HAVE_X86

/* a sample's planes above this size: the input transform prefetches the next strip's rows itself */
#define QC_WINO_PREFETCH_BYTES (2 << 20)

/* floats of one thread's scratch: V (16, C, NP), a group's M (OG, 16, 4, NP), the tile outputs (4, NP) and 16
 * for alignment */
static inline int64_t qc_wino_scratch_floats(const qc_direct_job *j)
{
    return 16 * j->C * QC_DIRECT_NP + QC_DIRECT_OG * 16 * QC_DIRECT_MR * QC_DIRECT_NP + 4 * QC_DIRECT_NP + 16;
}

/* block `ocb` of U into wf: wf[((xi*OCB + ocb)*C + c)*4 + i] = (G g G^T)[xi] of output channel 4*ocb + i (0 past O) */
QC_TGT_AVX2 static void qc_wino_weights(const qc_direct_job *j, int64_t ocb, float *wf)
{
    const uint8_t *q = j->q + ocb * j->K * (j->bits == 8 ? 4 : 2);
    const int64_t C = j->C, OCB = j->OCB;
    const __m128 half = _mm_set1_ps(0.5f);
    __m256 s2 = _mm256_setzero_ps(), f2 = s2;
    int64_t bprev = -1;
    for (int64_t c = 0; c < C; ++c) {   /* the four channels of the block in the lanes */
        __m128 g[10], gg[12];
        const int64_t b = c * 9 / j->kblock;
        if (b != bprev) qc_direct_block_sf(j, ocb, b, &s2, &f2);
        bprev = b;
        const __m128 s = _mm256_castps256_ps128(s2), f = _mm256_castps256_ps128(f2);
        for (int t = 0; t < 9; t += 2) {   /* taps t, t+1 (the tenth value, past the taps, is not used) */
            const int64_t k = c * 9 + t;
            __m256 v;
            if (t < 8 || k + 1 < j->K) {
                v = _mm256_cvtepi32_ps(qc_direct_codes2_avx2(q, j->bits, k));
            } else {
                int u[8] = {0};
                for (int i = 0; i < QC_DIRECT_MR; ++i) u[i] = qc_direct_code(q, j->bits, k, i);
                v = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)u));
            }
            g[t] = _mm_add_ps(_mm_mul_ps(s, _mm256_castps256_ps128(v)), f);
            g[t + 1] = _mm_add_ps(_mm_mul_ps(s, _mm256_extractf128_ps(v, 1)), f);
        }
        for (int col = 0; col < 3; ++col) {   /* G g: 4 x 3 */
            const __m128 a = g[col], m = g[3 + col], z = g[6 + col];
            gg[col] = a;
            gg[3 + col] = _mm_mul_ps(half, _mm_add_ps(_mm_add_ps(a, m), z));
            gg[6 + col] = _mm_mul_ps(half, _mm_add_ps(_mm_sub_ps(a, m), z));
            gg[9 + col] = z;
        }
        for (int r = 0; r < 4; ++r) {          /* (G g) G^T: 4 x 4 */
            const __m128 a = gg[3 * r], m = gg[3 * r + 1], z = gg[3 * r + 2];
            float *u = wf + ((int64_t)(4 * r) * OCB + ocb) * C * 4 + c * 4;
            const int64_t xs = OCB * C * 4;   /* floats from position xi to xi + 1 */
            _mm_storeu_ps(u, a);
            _mm_storeu_ps(u + xs, _mm_mul_ps(half, _mm_add_ps(_mm_add_ps(a, m), z)));
            _mm_storeu_ps(u + 2 * xs, _mm_mul_ps(half, _mm_add_ps(_mm_sub_ps(a, m), z)));
            _mm_storeu_ps(u + 3 * xs, z);
        }
    }
}

/* V[xi*vs + t] = (B^T d B)[xi] of tiles t < n of one tile row: patch row r of tile t is ev[r*Wph + t],
 * od[r*Wph + t], ev[r*Wph + t + 1], od[r*Wph + t + 1] (the even and odd column planes); 8 tiles at a time, then
 * one at a time */
QC_TGT_AVX2 static void qc_wino_input(const float *ev, const float *od, int64_t Wph, int64_t n, float *V, int64_t vs)
{
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 c[4][4];
        for (int r = 0; r < 4; ++r) {
            const float *e = ev + r * Wph + t, *o = od + r * Wph + t;
            const __m256 d0 = _mm256_loadu_ps(e), d1 = _mm256_loadu_ps(o);
            const __m256 d2 = _mm256_loadu_ps(e + 1), d3 = _mm256_loadu_ps(o + 1);
            c[r][0] = _mm256_sub_ps(d0, d2);
            c[r][1] = _mm256_add_ps(d1, d2);
            c[r][2] = _mm256_sub_ps(d2, d1);
            c[r][3] = _mm256_sub_ps(d1, d3);
        }
        for (int s = 0; s < 4; ++s) {
            _mm256_storeu_ps(V + (0 + s) * vs + t, _mm256_sub_ps(c[0][s], c[2][s]));
            _mm256_storeu_ps(V + (4 + s) * vs + t, _mm256_add_ps(c[1][s], c[2][s]));
            _mm256_storeu_ps(V + (8 + s) * vs + t, _mm256_sub_ps(c[2][s], c[1][s]));
            _mm256_storeu_ps(V + (12 + s) * vs + t, _mm256_sub_ps(c[1][s], c[3][s]));
        }
    }
    for (; t < n; ++t) {
        float c[4][4];
        for (int r = 0; r < 4; ++r) {
            const float d0 = ev[r * Wph + t], d1 = od[r * Wph + t], d2 = ev[r * Wph + t + 1], d3 = od[r * Wph + t + 1];
            c[r][0] = d0 - d2;
            c[r][1] = d1 + d2;
            c[r][2] = d2 - d1;
            c[r][3] = d1 - d3;
        }
        for (int s = 0; s < 4; ++s) {
            V[(0 + s) * vs + t] = c[0][s] - c[2][s];
            V[(4 + s) * vs + t] = c[1][s] + c[2][s];
            V[(8 + s) * vs + t] = c[2][s] - c[1][s];
            V[(12 + s) * vs + t] = c[1][s] - c[3][s];
        }
    }
}

/* one work item: tiles [st*NP, st*NP + np) of sample n (st = item % ips with one strip an item), every channel */
QC_TGT_AVX2 static int qc_wino_item(const qc_direct_job *j, int64_t item, float *scratch)
{
    const int64_t NP = QC_DIRECT_NP, AB = QC_DIRECT_MR * NP, C = j->C, OCB = j->OCB;
    const int64_t TH = (j->OH + 1) / 2, TW = (j->OW + 1) / 2, T = TH * TW, n = item / j->ips;
    const int64_t p0 = (item % j->ips) * NP, np = T - p0 < NP ? T - p0 : NP;
    const int64_t plane = j->Hph * j->Wph;   /* one column phase of one channel */
    const int prefetch = qc_direct_sample(j) * (int64_t)sizeof(float) > QC_WINO_PREFETCH_BYTES;
    float *V = scratch + (16 - ((uintptr_t)scratch / sizeof(float)) % 16) % 16;   /* (16, C, NP), 64-byte aligned */
    float *M = V + 16 * C * NP, *Y = M + QC_DIRECT_OG * 16 * AB;
    /* V of every channel for the strip's tiles, run by run of one tile row; lanes past np are 0 */
    for (int64_t c = 0; c < C; ++c) {
        const float *xc = j->xp + n * qc_direct_sample(j) + 2 * c * plane;
        for (int64_t t = 0; t < np;) {
            const int64_t ty = (p0 + t) / TW, tx = (p0 + t) % TW, run = np - t < TW - tx ? np - t : TW - tx;
            const int64_t at = 2 * ty * j->Wph + tx;
            qc_wino_input(xc + at, xc + plane + at, j->Wph, run, V + c * NP + t, C * NP);
            if (prefetch)   /* the next strip's runs of these rows: one stream a channel row, too many for the */
                for (int r = 0; r < 4; ++r)   /* hardware prefetchers on planes past the L2 */
                    for (int ph = 0; ph < 2; ++ph) {
                        const char *a = (const char *)(xc + ph * plane + at + r * j->Wph + run);
                        _mm_prefetch(a, _MM_HINT_T0);
                        _mm_prefetch(a + 64, _MM_HINT_T0);
                    }
            t += run;
        }
        if (np < NP)
            for (int x = 0; x < 16; ++x) memset(V + (x * C + c) * NP + np, 0, (size_t)(NP - np) * sizeof(float));
    }
    const __m256 lo = _mm256_set1_ps(j->lo), hi = _mm256_set1_ps(j->hi);
    for (int64_t g0 = 0; g0 < OCB; g0 += QC_DIRECT_OG) {
        const int64_t g1 = g0 + QC_DIRECT_OG < OCB ? g0 + QC_DIRECT_OG : OCB;
        for (int x = 0; x < 16; ++x)
            for (int64_t k0 = 0; k0 < C; k0 += QC_DIRECT_KC) {
                const int64_t k1 = k0 + QC_DIRECT_KC < C ? k0 + QC_DIRECT_KC : C;
                for (int64_t ocb = g0; ocb < g1; ++ocb)
                    qc_direct_mk_avx2(j->wf + (x * OCB + ocb) * C * 4, V + x * C * NP, NULL, k0, k1,
                                      M + ((ocb - g0) * 16 + x) * AB, k0 == 0);
            }
        for (int64_t ocb = g0; ocb < g1; ++ocb)
            for (int i = 0; i < QC_DIRECT_MR; ++i) {
                const int64_t o = 4 * ocb + i;
                if (o >= j->O) break;
                const float *m = M + (ocb - g0) * 16 * AB + i * NP;   /* m + xi*AB: position xi of the 24 tiles */
                const __m256 b = _mm256_set1_ps(j->bias[o]);
                const __m256 ps = _mm256_set1_ps(j->pa_s ? j->pa_s[o] : 1.0f);
                const __m256 pt = _mm256_set1_ps(j->pa_s ? j->pa_t[o] : 0.0f);
                for (int t = 0; t < NP; t += 8) {   /* A^T m A: rows first, then columns */
                    __m256 r0[4], r1[4];
                    for (int s = 0; s < 4; ++s) {
                        const __m256 m0 = _mm256_loadu_ps(m + s * AB + t);
                        const __m256 m1 = _mm256_loadu_ps(m + (4 + s) * AB + t);
                        const __m256 m2 = _mm256_loadu_ps(m + (8 + s) * AB + t);
                        const __m256 m3 = _mm256_loadu_ps(m + (12 + s) * AB + t);
                        r0[s] = _mm256_add_ps(_mm256_add_ps(m0, m1), m2);
                        r1[s] = _mm256_sub_ps(_mm256_sub_ps(m1, m2), m3);
                    }
                    const __m256 y[4] = {_mm256_add_ps(_mm256_add_ps(r0[0], r0[1]), r0[2]),
                                         _mm256_sub_ps(_mm256_sub_ps(r0[1], r0[2]), r0[3]),
                                         _mm256_add_ps(_mm256_add_ps(r1[0], r1[1]), r1[2]),
                                         _mm256_sub_ps(_mm256_sub_ps(r1[1], r1[2]), r1[3])};
                    for (int q = 0; q < 4; ++q)
                        _mm256_storeu_ps(Y + q * NP + t,
                                         qc_direct_post_avx2(y[q], b, lo, hi, j->tail, j->pa_s != NULL, ps, pt));
                }
                /* tile t -> outputs (2ty + dy, 2tx + dx): Y[2dy + dx] */
                float *yo = j->y + (n * j->O + o) * j->OH * j->OW;
                for (int64_t t = 0; t < np;) {
                    const int64_t ty = (p0 + t) / TW, tx = (p0 + t) % TW, run = np - t < TW - tx ? np - t : TW - tx;
                    for (int dy = 0; dy < 2 && 2 * ty + dy < j->OH; ++dy) {
                        float *d = yo + (2 * ty + dy) * j->OW + 2 * tx;
                        const float *e = Y + 2 * dy * NP + t, *f = Y + (2 * dy + 1) * NP + t;
                        int64_t u = 0;
                        for (; u + 8 <= run && 2 * (tx + u) + 16 <= j->OW; u += 8)
                            qc_interleave8_avx2(e + u, f + u, d + 2 * u);
                        for (; u < run; ++u) {
                            d[2 * u] = e[u];
                            if (2 * (tx + u) + 1 < j->OW) d[2 * u + 1] = f[u];
                        }
                    }
                    t += run;
                }
            }
    }
    return 0;
}

#endif /* QC_HAVE_X86 */
#endif /* QCONV_WINOGRAD_H */
