/* Direct float-activation convolution of the qconv CPU engine (act_quant=None), pixels in vector lanes.
 *
 * The GEMM path puts channels in the vector lanes, so an NCHW input is transposed to pixel-major rows first and
 * every output tile is transposed back on its store; for the many-pixel, few-channel layers of vision models those
 * two transposes cost more than the arithmetic. Here the lanes hold consecutive output pixels of one channel:
 *
 *   out[n, o, oy, ox] = post(act(sum_k wf[o, k] * xp[n, koff[k] + oy*Wph + ox] + bias[o])),  k = (c*KH + ky)*KW + kx
 *
 *   xp  the input as phase planes: sample n, channel c, row phase ry < sh, column phase rx < sw hold the padded
 *       input's rows ry, ry+sh, ... and columns rx, rx+sw, ...: a (Hph, Wph) plane, Hph = ceil(Hp/sh),
 *       Wph = ceil(Wp/sw) (Hp, Wp: the zero-padded height and width). Tap (ky, kx) of output (oy, ox) is then at
 *       row oy + ky*dh/sh, column ox + kx*dw/sw of phase plane ((ky*dh)%sh, (kx*dw)%sw): every tap of a run of
 *       outputs is one contiguous run of xp, at koff[k] from the output's grid index p = oy*Wph + ox. The output
 *       grid is OH x Wph; its columns ox >= OW are computed and dropped. The caller makes xp per call (one pass
 *       over the input, which also checks it for NaN / inf); a 1x1 stride-1 unpadded conv on NCHW reads x itself
 *       (xp = x, Wph = W), checking the rows each strip reads.
 *   Grouped convs (G groups, O/G a multiple of 4 output channels each): K = (C/G)*KH*KW, koff indexes the first
 *       group's channels and a block of 4 output channels reads its group's planes, (4*ocb / (O/G)) * (C/G)
 *       channels further (qc_direct_goff); a micro-tile pairs two blocks of one group only.
 *   wf  float32 (OCB, K, 4): the weight dequantized, wf = scale[o, b]*q + offset[o, b] (b = k / kblock: a block
 *       holds block_channels input channels x all taps), four output channels interleaved per k (channels past O
 *       are 0). Made per call and freed after it: no float copy of the weight outlives a call.
 *
 * A work item is a strip of QC_DIRECT_NP grid pixels of one sample, every output channel: micro-tiles of 4 channels
 * x 24 pixels, 12 float32 FMA chains (3 row loads and 4 broadcasts a k); on AVX-512 CPUs (vec = 2) strips of
 * QC_DIRECT_NP512 = 32 pixels and micro-tiles of 8 channels x 32 pixels (qc_direct_mk512: the same chains, the same
 * bits; 1x1 layers of det, rec and MobileNetV2 alone 0.71-0.96x the AVX2 time, 2026-12-05, AMX Xeon, 2 threads, A/B
 * in one process; inside det's session, where these layers wait on memory, 0.94x), over chunks of QC_DIRECT_KC k values (in
 * place, an item's rows are first copied to one block, and K <= QC_DIRECT_KC_IN_PLACE is one chunk). Every output
 * is one chain over k in increasing order, so results do not depend on the thread count or the work split (nor on
 * the chunks); they match the oracle within
 * its float tolerance (float32 sums of dequantized weights), not bitwise the GEMM path.
 * Epilogue, one pass a row (qc_direct_epilogue_avx2): v = acc + bias; v = min(max(v, lo), hi); then the engine's
 * the tail activation and post_affine (qc_tail_scalar, qc_affine_run), stored straight to NCHW when the row is one run.
 *
 * vec = 1 runs the AVX2 + FMA code (target attributes, picked at run time by the caller), vec = 0 portable C.
 */
#ifndef QCONV_DIRECT_H
#define QCONV_DIRECT_H

#include <stdint.h>
#include <string.h>

#include "qconv_kernels.h"

#define QC_DIRECT_NP 24   /* grid pixels a strip (AVX2, scalar, Winograd's tiles a strip) */
/* grid pixels a strip of the AVX-512 micro-kernel (vec = 2): 8 channels x 32 pixels, 16 zmm FMA chains (2 row loads
 * and 8 broadcasts a k); a strip's row is two whole cache lines */
#define QC_DIRECT_NP512 32
#define QC_DIRECT_MR 4    /* output channels a micro-tile (one wf block) */
/* strips ahead that the micro-kernels prefetch a phase-plane row: one load instruction walks K rows, which the
 * hardware's stride prefetch cannot follow (a 3-channel stem at 224x224 ran 0.95x the time from cold caches,
 * 2026-12-08, AMX VM; 1 and 2 strips ahead: 0.96x) */
#define QC_DIRECT_PF_STRIPS 4
#define QC_DIRECT_OG 8    /* wf blocks a group: a group's accumulators, and its weights over a k chunk, stay in L1 */
#define QC_DIRECT_KC 96   /* k values a chunk: the strip's rows of a chunk stay in L1 for every block of a group */
/* in-place (1x1) layers with at most this many k values take them all in one chunk: no accumulator round trips; the
 * gathered strip streams from L2. On rec's 1x1 layers (K = 128-960, 2026-12-02, AVX2, 2 threads, A/B in one
 * process) 0.86-0.97x the time of 96-value chunks; on 3x3 layers with K = 2304-4608 one chunk took 1.14-1.34x. */
#define QC_DIRECT_KC_IN_PLACE 1024
/* Winograd from this many output pixels a sample (3x3 stride 1; qconv_winograd.h). On det's 96 -> 24 layers
 * (2026-12-02, AVX2, 2 threads, A/B in one process) it took 0.53-0.78x the strips' time at 160x160, 0.64-0.91x at
 * 80x80, 0.87-1.22x at 40x40 and 0.99-1.18x at 20x20. */
#define QC_WINO_MIN_PIXELS 4096
#define QC_DIRECT_NS 8    /* strips a work item at most: each row of a chunk is read as one run of NS*NP pixels
                           * (NCHW rows of different channels are far apart: short runs defeat the prefetchers) */

typedef struct {
    int64_t N, C, H, W, OH, OW, K;  /* input (N, C, H, W), output (N, O, OH, OW), K = (C/G)*KH*KW */
    int32_t KH, KW, sh, sw, ph, pw, dh, dw;
    int32_t O, OCB, NB;              /* output channels, their blocks of 4, weight blocks per channel */
    int32_t G;                       /* groups (1: dense); O/G is a multiple of 4 when G > 1 */
    int64_t kblock;                  /* k values per weight block */
    const uint8_t *q;                /* (OCB, K, 4) int8 codes, or (OCB, K, 2) bytes of two int4 codes (channel
                                      * 2m in the low nibble, 2m+1 in the high one, two's complement); channels past
                                      * O hold 0 */
    int32_t bits;                    /* 8 or 4 */
    const float *scale;              /* (O, NB) */
    const float *offset;             /* (O, NB), or NULL (symmetric) */
    const float *bias;               /* (O,) */
    float lo, hi;                    /* activation clamp */
    int32_t tail;                    /* the activation after the clamp (qc_tail_scalar's codes; 0: none) */
    const float *pa_s, *pa_t;        /* (O,) post_affine, or NULL */
    const float *x;                  /* NCHW (N, C, H, W), or NC4HW4 (ceil(C/4), N, H, W, 4) */
    int32_t in_nc4hw4, out_nc4hw4;
    float *y;                        /* NCHW (N, O, OH, OW), or NC4HW4 (ceil(O/4), N, OH, OW, 4) */
    int32_t vec;                     /* 0: portable C; 1: AVX2 + FMA; 2: the AVX-512 micro-kernel (AVX2 elsewhere) */
    int32_t np;                      /* grid pixels a strip (qc_direct_setup): QC_DIRECT_NP, or QC_DIRECT_NP512 */
    int32_t ns;                      /* strips a work item at most (1 .. QC_DIRECT_NS; results do not depend on it) */
    int64_t ips;                     /* work items a sample, >= ceil(strips / ns): item i of a sample takes strips
                                      * [i*strips/ips, (i+1)*strips/ips), so items differ by one strip at most */
    int32_t winograd;                /* 1: Winograd F(2x2, 3x3) where the layer allows it (the caller's choice) */
    int32_t wino;                    /* 1: this call runs Winograd (qc_direct_setup; qconv_winograd.h) */
    /* per call (qc_direct_setup, then the caller's buffers) */
    int32_t in_place;                /* 1: xp = x (1x1, stride 1, no padding, NCHW); an item's strips' rows are
                                      * copied to one contiguous block first */
    int64_t kc;                      /* k values a chunk */
    int64_t Hph, Wph;                /* phase plane rows and columns */
    int32_t psw;                     /* column phases of the planes: sw (Winograd: 2, even and odd columns) */
    const float *xp;                 /* the phase planes: (N, C, sh, psw, Hph, Wph) and qc_direct_slack floats of 0 */
    const int64_t *koff;             /* (K,) */
    const float *wf;                 /* (OCB, K, 4) */
} qc_direct_job;

/* fill in_place, Hph, Wph, psw, wino */
static inline void qc_direct_setup(qc_direct_job *j)
{
    j->in_place = j->KH == 1 && j->KW == 1 && j->sh == 1 && j->sw == 1 && j->ph == 0 && j->pw == 0 && !j->in_nc4hw4
                  && j->G == 1;
    j->Hph = j->in_place ? j->H : (j->H + 2 * (int64_t)j->ph + j->sh - 1) / j->sh;
    j->Wph = j->in_place ? j->W : (j->W + 2 * (int64_t)j->pw + j->sw - 1) / j->sw;
    j->psw = j->sw;
    j->wino = 0;
    j->kc = j->in_place && j->K <= QC_DIRECT_KC_IN_PLACE ? j->K : QC_DIRECT_KC;
    j->np = QC_DIRECT_NP;
#ifdef QC_HAVE_X86
    j->wino = j->winograd && j->vec && j->G == 1 && j->KH == 3 && j->KW == 3 && j->sh == 1 && j->sw == 1 && j->dh == 1
              && j->dw == 1 && !j->in_nc4hw4 && !j->out_nc4hw4 && j->OH * j->OW >= QC_WINO_MIN_PIXELS;
    if (j->wino) {   /* 2*TH + 2 padded rows and 2*TW + 2 columns, as even and odd columns: every patch inside */
        j->Hph = 2 * ((j->OH + 1) / 2) + 2;
        j->Wph = (j->OW + 1) / 2 + 1;
        j->psw = 2;
    }
    if (j->vec == 2 && !j->wino) j->np = QC_DIRECT_NP512;
#endif
}
/* strips a work item at most: QC_DIRECT_NS strips of QC_DIRECT_NP pixels, as many pixels in wider strips */
static inline int32_t qc_direct_max_ns(const qc_direct_job *j) { return QC_DIRECT_NS * QC_DIRECT_NP / j->np; }
static inline int64_t qc_direct_sample(const qc_direct_job *j) { return j->C * j->sh * j->psw * j->Hph * j->Wph; }
/* zeros after the phase planes: the furthest read of a strip past its sample's planes */
static inline int64_t qc_direct_slack(const qc_direct_job *j) { return j->np + (int64_t)j->KW * j->dw + 16; }
static inline int64_t qc_direct_strips(const qc_direct_job *j)
{
    const int64_t grid = j->wino ? ((j->OH + 1) / 2) * ((j->OW + 1) / 2) : j->OH * j->Wph;   /* Winograd: tiles */
    return (grid + j->np - 1) / j->np;
}
static inline int64_t qc_direct_items(const qc_direct_job *j) { return j->N * j->ips; }
/* floats of one thread's scratch: a group's accumulators and the gathered strips of an item (in place), 64-byte
 * aligned */
#ifdef QC_HAVE_X86
static inline int64_t qc_wino_scratch_floats(const qc_direct_job *j);
#endif
static inline int64_t qc_direct_scratch_floats(const qc_direct_job *j)
{
#ifdef QC_HAVE_X86
    if (j->wino) return qc_wino_scratch_floats(j);
#endif
    return (int64_t)qc_direct_max_ns(j) * QC_DIRECT_OG * QC_DIRECT_MR * j->np + 16
           + (j->in_place ? (int64_t)qc_direct_max_ns(j) * j->K * j->np : 0);
}

/* floats between two threads' scratch: the scratch rounded up to 4 KiB, then 17 cache lines more, so that where
 * the threads' copies of a buffer start within a 4 KiB page (their cache sets) does not depend on the scratch's
 * size. Moving the second thread's scratch by 768 bytes once made det's 96 -> 24 Winograd layer at 160x160 1.16x
 * slower with 2 threads (2026-12-02, AVX2). */
static inline int64_t qc_direct_thread_floats(const qc_direct_job *j)
{
    return (qc_direct_scratch_floats(j) + 1023) / 1024 * 1024 + 17 * 16;
}

/* floats of wf: the dequantized weight (OCB, K, 4), or Winograd's U (16, OCB, C, 4) */
static inline int64_t qc_direct_wf_floats(const qc_direct_job *j)
{
    return j->wino ? 16 * (int64_t)j->OCB * j->C * 4 : (int64_t)j->OCB * j->K * 4;
}

static void qc_direct_offsets(const qc_direct_job *j, int64_t *koff)
{
    const int64_t hw = j->Hph * j->Wph;
    for (int64_t c = 0; c < j->C / j->G; ++c)
        for (int ky = 0; ky < j->KH; ++ky)
            for (int kx = 0; kx < j->KW; ++kx) {
                const int64_t ty = (int64_t)ky * j->dh, tx = (int64_t)kx * j->dw;
                koff[(c * j->KH + ky) * j->KW + kx] = ((c * j->sh + ty % j->sh) * j->sw + tx % j->sw) * hw
                                                      + ty / j->sh * j->Wph + tx / j->sw;
            }
}

/* floats from the first group's planes to those of output channel block ocb's group (0 for dense convs) */
static inline int64_t qc_direct_goff(const qc_direct_job *j, int64_t ocb)
{
    if (j->G == 1) return 0;
    return 4 * ocb / (j->O / j->G) * (j->C / j->G) * j->sh * j->psw * j->Hph * j->Wph;
}

#ifdef QC_HAVE_X86
QC_TGT_AVX2 static int qc_direct_run_bad_avx2(const float *v, int64_t n);
#endif

/* 1 when one of v[0:n] is NaN / inf (the AVX2 check when j->vec) */
static inline int qc_direct_bad(const qc_direct_job *j, const float *v, int64_t n)
{
#ifdef QC_HAVE_X86
    if (j->vec) return qc_direct_run_bad_avx2(v, n);
#endif
    return qc_nonfinite_run(v, n);
}

#ifdef QC_HAVE_X86
#define QC_TGT_DIRECT512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#define QC_DIRECT_NONFINITE 0x99   /* vfpclassps classes: QNaN, +inf, -inf, SNaN */

/* both column phases of a row at once: r0[col] = s[2*col - pw], r1[col] = s[2*col + 1 - pw] where the index is in
 * [0, W), else 0, for col < ncols; 32 source floats (masked loads: nothing outside the row is read) give 16 of
 * each. The AVX2 deinterleave below, one phase a call, took as long as the layer's multiply-adds on stride-2
 * grouped layers (208 channels at 28x28). Returns nonzero when a float it read is NaN / inf. */
QC_TGT_DIRECT512 static inline __attribute__((always_inline)) int
qc_direct_deint2_512(const float *s, int64_t W, int64_t pw, float *r0, float *r1, int64_t ncols)
{
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    __mmask16 bad = 0;
    for (int64_t c0 = 0; c0 < ncols; c0 += 16) {
        const int64_t base = 2 * c0 - pw;   /* source index of the window's first float */
        const int64_t lo = base < 0 ? -base : 0, hi = W - base < 32 ? W - base : 32;
        const uint64_t m = hi > lo ? ((hi >= 64 ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1)) : 0;
        const __m512 a = _mm512_maskz_loadu_ps((__mmask16)(m & 0xFFFF), s + base);
        const __m512 b = _mm512_maskz_loadu_ps((__mmask16)(m >> 16), s + base + 16);
        bad |= _mm512_fpclass_ps_mask(a, QC_DIRECT_NONFINITE) | _mm512_fpclass_ps_mask(b, QC_DIRECT_NONFINITE);
        const __mmask16 st = (__mmask16)(ncols - c0 >= 16 ? 0xFFFF : (1u << (ncols - c0)) - 1);
        _mm512_mask_storeu_ps(r0 + c0, st, _mm512_permutex2var_ps(a, ie, b));
        _mm512_mask_storeu_ps(r1 + c0, st, _mm512_permutex2var_ps(a, io, b));
    }
    return bad != 0;
}

/* row[col] = s[col - pw] where the index is in [0, W), else 0, for col < ncols: 16 columns a masked load and store
 * (memset, memcpy, memset a row took a third of a grouped layer at 14x14, 2026-12-06). Returns nonzero when a float
 * it read is NaN / inf. */
QC_TGT_DIRECT512 static inline __attribute__((always_inline)) int
qc_direct_row1_512(const float *s, int64_t W, int64_t pw, float *row, int64_t ncols)
{
    __mmask16 bad = 0;
    for (int64_t c0 = 0; c0 < ncols; c0 += 16) {
        const int64_t base = c0 - pw;
        const int64_t lo = base < 0 ? -base : 0, hi = W - base < 16 ? W - base : 16;
        const __mmask16 m = (__mmask16)(hi > lo ? ((1u << hi) - 1) & ~((1u << lo) - 1) : 0);
        const __mmask16 st = (__mmask16)(ncols - c0 >= 16 ? 0xFFFF : (1u << (ncols - c0)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, s + base);
        bad |= _mm512_fpclass_ps_mask(v, QC_DIRECT_NONFINITE);
        _mm512_mask_storeu_ps(row + c0, st, v);
    }
    return bad != 0;
}

/* rows r0 .. r1-1 of the phase planes of one NCHW channel plane src (H x W) into dst (qc_direct_pad's layout), psw 1
 * or 2: rows in phase order, no division a row (7x7 and 14x14 planes: a grouped layer's padding took as long as its
 * multiply-adds). Returns nonzero when a float it read is NaN / inf (every input row and column lies in some phase
 * plane: Hph*sh >= H + 2*ph, Wph*sw >= W + 2*pw). */
QC_TGT_DIRECT512 static int qc_direct_plane512(const qc_direct_job *j, const float *src, float *dst, int64_t r0,
                                              int64_t r1)
{
    const int64_t hw = j->Hph * j->Wph;
    int bad = 0;
    for (int ry = 0; ry < j->sh; ++ry) {
        float *row = dst + (int64_t)ry * j->psw * hw + r0 * j->Wph;
        for (int64_t r = r0; r < r1; ++r, row += j->Wph) {
            const int64_t iy = r * j->sh + ry - j->ph;
            if (iy < 0 || iy >= j->H) {
                for (int rx = 0; rx < j->psw; ++rx)
                    for (int64_t c0 = 0; c0 < j->Wph; c0 += 16) {
                        const int64_t left = j->Wph - c0;
                        _mm512_mask_storeu_ps(row + rx * hw + c0, (__mmask16)(left >= 16 ? 0xFFFF : (1u << left) - 1),
                                              _mm512_setzero_ps());
                    }
                continue;
            }
            if (j->psw == 1) bad |= qc_direct_row1_512(src + iy * j->W, j->W, j->pw, row, j->Wph);
            else bad |= qc_direct_deint2_512(src + iy * j->W, j->W, j->pw, row, row + hw, j->Wph);
        }
    }
    return bad;
}

/* row[col] = s[ix0 + 2*col] where 0 <= ix0 + 2*col < W, else 0, for col < ncols: 16 floats deinterleaved at a time */
QC_TGT_AVX2 static void qc_direct_deint2_avx2(const float *s, int64_t W, int64_t ix0, float *row, int64_t ncols)
{
    int64_t col = 0;
    for (; col < ncols && ix0 + 2 * col < 0; ++col) row[col] = 0.0f;
    for (; col + 8 <= ncols && ix0 + 2 * col + 16 <= W; col += 8) {
        const float *p = s + ix0 + 2 * col;
        _mm256_storeu_ps(row + col, qc_even_avx2(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)));
    }
    for (; col < ncols; ++col) {
        const int64_t ix = ix0 + 2 * col;
        row[col] = ix >= 0 && ix < W ? s[ix] : 0.0f;
    }
}
#endif

/* phase-plane row bands a channel is cut into for `threads` threads: about 8 items a thread where the samples'
 * channels alone are fewer (a 3-channel stem: one band a channel left a thread with two of the three planes) */
static inline int64_t qc_direct_pad_bands(const qc_direct_job *j, int threads)
{
    const int64_t planes = j->N * j->C, want = 8 * (int64_t)threads;
    if (planes >= want) return 1;
    const int64_t b = (want + planes - 1) / planes;
    return b < j->Hph ? b : j->Hph;
}

/* item i of the phase planes (qc_direct_pad_bands bands a channel): rows [r0, r1) of sample n, channel c's planes
 * into xp (qc_direct_sample layout); returns 1 when the input rows of the band hold NaN / inf (x*0 is NaN exactly for
 * them; the first band also checks the rows above it and the last the rows below it that no plane holds): NCHW rows
 * are checked as they are read on AVX-512, else in one run (row by row, 7x7 planes spent a third of a grouped layer's
 * time in the checks); NC4HW4 rows as they are copied */
static int qc_direct_pad(const qc_direct_job *j, int64_t i, int64_t bands, float *xp)
{
    const int64_t n = i / (j->C * bands), c = i / bands % j->C, band = i % bands;
    const int64_t r0 = band * j->Hph / bands, r1 = (band + 1) * j->Hph / bands;
    const int64_t hw = j->Hph * j->Wph, step = j->in_nc4hw4 ? 4 : 1;
    const float *src = j->in_nc4hw4 ? j->x + ((c / 4) * j->N + n) * j->H * j->W * 4 + c % 4
                                    : j->x + (n * j->C + c) * j->H * j->W;
    float *dst = xp + n * qc_direct_sample(j) + c * j->sh * j->psw * hw;
    int bad = 0;
#ifdef QC_HAVE_X86
    if (j->vec == 2 && step == 1 && j->psw <= 2) return qc_direct_plane512(j, src, dst, r0, r1);
#endif
    if (step == 1) {   /* the band's input rows, clipped to the image */
        int64_t y0 = band == 0 ? 0 : r0 * j->sh - j->ph, y1 = band == bands - 1 ? j->H : r1 * j->sh - j->ph;
        y0 = y0 < 0 ? 0 : y0 > j->H ? j->H : y0;
        y1 = y1 < y0 ? y0 : y1 > j->H ? j->H : y1;
        bad = qc_direct_bad(j, src + y0 * j->W, (y1 - y0) * j->W);
    }
    for (int64_t iyp = r0 * j->sh; iyp < r1 * j->sh; ++iyp) {
        const int64_t iy = iyp - j->ph;
        for (int rx = 0; rx < j->psw; ++rx) {
            float *row = dst + ((iyp % j->sh) * j->psw + rx) * hw + iyp / j->sh * j->Wph;
            if (iy < 0 || iy >= j->H) {
                memset(row, 0, (size_t)j->Wph * sizeof(float));
                continue;
            }
            const float *s = src + iy * j->W * step;
            if (step == 1 && j->psw == 1) {   /* zeros, the row, zeros */
                const int64_t a = j->pw < j->Wph ? j->pw : j->Wph;
                const int64_t b = j->pw + j->W < j->Wph ? j->pw + j->W : j->Wph;
                memset(row, 0, (size_t)a * sizeof(float));
                memcpy(row + a, s, (size_t)(b - a) * sizeof(float));
                memset(row + b, 0, (size_t)(j->Wph - b) * sizeof(float));
                continue;
            }
#ifdef QC_HAVE_X86
            if (j->vec && step == 1 && j->psw == 2) {
                qc_direct_deint2_avx2(s, j->W, rx - j->pw, row, j->Wph);
                continue;
            }
#endif
            for (int64_t col = 0; col < j->Wph; ++col) {
                const int64_t ix = col * j->psw + rx - j->pw;
                row[col] = ix >= 0 && ix < j->W ? s[ix * step] : 0.0f;
            }
            if (step != 1) bad |= qc_direct_bad(j, row, j->Wph);
        }
    }
    return bad;
}

/* code i (output channel 4*ocb + i) of k in a block's codes q: (OCB, K, 4) int8 or (OCB, K, 2) two int4 a byte (the
 * nibble shifted to the top of a signed byte and back: sign-extended) */
static inline int qc_direct_code(const uint8_t *q, int bits, int64_t k, int i)
{
    return bits == 8 ? (int8_t)q[4 * k + i] : (int8_t)(q[2 * k + i / 2] << (4 - 4 * (i & 1))) >> 4;
}

#ifdef QC_HAVE_X86
QC_TGT_AVX2 static void qc_wino_weights(const qc_direct_job *j, int64_t ocb, float *wf);

/* the scales and offsets of weight block b of output channels 4*ocb .. 4*ocb+3, twice (two k values a vector; 0 past
 * O, whose codes are 0: their weights come out 0) */
QC_TGT_AVX2 static inline void qc_direct_block_sf(const qc_direct_job *j, int64_t ocb, int64_t b, __m256 *s, __m256 *f)
{
    float sv[8], fv[8];
    for (int i = 0; i < QC_DIRECT_MR; ++i) {
        const int64_t o = 4 * ocb + i;
        sv[i] = sv[i + 4] = o < j->O ? j->scale[o * j->NB + b] : 0.0f;
        fv[i] = fv[i + 4] = o < j->O && j->offset ? j->offset[o * j->NB + b] : 0.0f;
    }
    *s = _mm256_loadu_ps(sv);
    *f = _mm256_loadu_ps(fv);
}

/* the codes of k and k+1 (k+1 < K) of block ocb as int32 lanes (channel i of k in lane i, of k+1 in lane 4+i);
 * q: the block's codes (OCB, K, 4) int8 or (OCB, K, 2) two int4 a byte */
QC_TGT_AVX2 static inline __m256i qc_direct_codes2_avx2(const uint8_t *q, int bits, int64_t k)
{
    if (bits == 8) return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 4 * k)));
    uint32_t u;
    memcpy(&u, q + 2 * k, 4);   /* bytes: (ch 0 | ch 1 << 4), (ch 2 | ch 3 << 4) of k, then of k+1 */
    const __m128i dup = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)u), _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1,
                                                                                  -1, -1, -1, -1, -1, -1));
    const __m256i v = _mm256_sllv_epi32(_mm256_cvtepu8_epi32(dup), _mm256_setr_epi32(28, 24, 28, 24, 28, 24, 28, 24));
    return _mm256_srai_epi32(v, 28);   /* the nibble at the top, shifted back down with its sign */
}

/* qc_direct_dequant for j->vec: two k values (8 floats) a step */
QC_TGT_AVX2 static void qc_direct_dequant_avx2(const qc_direct_job *j, int64_t ocb, float *wf)
{
    const uint8_t *q = j->q + ocb * j->K * (j->bits == 8 ? 4 : 2);
    float *d = wf + ocb * j->K * 4;
    for (int64_t b = 0; b < j->NB; ++b) {
        __m256 s, f;
        qc_direct_block_sf(j, ocb, b, &s, &f);
        int64_t k = b * j->kblock;
        const int64_t k1 = (b + 1) * j->kblock < j->K ? (b + 1) * j->kblock : j->K;
        for (; k + 2 <= k1; k += 2)
            _mm256_storeu_ps(d + 4 * k, _mm256_add_ps(_mm256_mul_ps(s, _mm256_cvtepi32_ps(
                qc_direct_codes2_avx2(q, j->bits, k))), f));
        for (; k < k1; ++k)
            for (int i = 0; i < QC_DIRECT_MR; ++i) d[4 * k + i] = s[i] * (float)qc_direct_code(q, j->bits, k, i) + f[i];
    }
}
#endif

/* block `ocb` of the dequantized weight into wf + ocb*K*4 (Winograd: of U, qc_wino_weights) */
static void qc_direct_dequant(const qc_direct_job *j, int64_t ocb, float *wf)
{
#ifdef QC_HAVE_X86
    if (j->wino) { qc_wino_weights(j, ocb, wf); return; }
    if (j->vec) { qc_direct_dequant_avx2(j, ocb, wf); return; }
#endif
    const uint8_t *q = j->q + ocb * j->K * (j->bits == 8 ? 4 : 2);
    float *d = wf + ocb * j->K * 4;
    for (int i = 0; i < QC_DIRECT_MR; ++i) {
        const int64_t o = 4 * ocb + i;
        if (o >= j->O) {
            for (int64_t k = 0; k < j->K; ++k) d[4 * k + i] = 0.0f;
            continue;
        }
        for (int b = 0; b < j->NB; ++b) {
            const float s = j->scale[o * j->NB + b], f = j->offset ? j->offset[o * j->NB + b] : 0.0f;
            const int64_t k1 = (b + 1) * j->kblock < j->K ? (b + 1) * j->kblock : j->K;
            for (int64_t k = b * j->kblock; k < k1; ++k) d[4 * k + i] = s * (float)qc_direct_code(q, j->bits, k, i) + f;
        }
    }
}

/* acc[i*NP + t] (+)= sum_{k0 <= k < k1} w[4k + i] * B[koff[k] + t]: 4 channels x NP pixels (from 0 when first);
 * koff NULL: row k at B + k*NP (a gathered strip, Winograd's V) */
static void qc_direct_mk_scalar(const float *w, const float *B, const int64_t *koff, int64_t k0, int64_t k1,
                                float *acc, int first)
{
    if (first)
        for (int i = 0; i < QC_DIRECT_MR * QC_DIRECT_NP; ++i) acc[i] = 0.0f;
    for (int64_t k = k0; k < k1; ++k)
        for (int i = 0; i < QC_DIRECT_MR; ++i)
            for (int t = 0; t < QC_DIRECT_NP; ++t)
                acc[i * QC_DIRECT_NP + t] += w[4 * k + i] * B[(koff ? koff[k] : k * QC_DIRECT_NP) + t];
}

/* v[t] <- min(max(v[t] + bias, lo), hi) for t < NP: the clamp of the activation (a NaN stays NaN) */
static void qc_direct_bias_clamp(float *v, float bias, float lo, float hi)
{
    for (int t = 0; t < QC_DIRECT_NP; ++t) {
        const float x = v[t] + bias;
        v[t] = x < lo ? lo : x > hi ? hi : x;
    }
}

#ifdef QC_HAVE_X86
/* acc (4 x NP) (+)= w[k0:k1] (k, 4) x rows B + koff[k]; koff == NULL: row k at B + k*NP (a gathered strip) */
QC_TGT_AVX2 static inline __attribute__((always_inline)) void qc_direct_mk_body(const float *w, const float *B,
                                                                                const int64_t *koff, int64_t k0,
                                                                                int64_t k1, float *acc, int first)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
    __m256 c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
    if (!first) {
        c00 = _mm256_loadu_ps(acc); c01 = _mm256_loadu_ps(acc + 8); c02 = _mm256_loadu_ps(acc + 16);
        c10 = _mm256_loadu_ps(acc + 24); c11 = _mm256_loadu_ps(acc + 32); c12 = _mm256_loadu_ps(acc + 40);
        c20 = _mm256_loadu_ps(acc + 48); c21 = _mm256_loadu_ps(acc + 56); c22 = _mm256_loadu_ps(acc + 64);
        c30 = _mm256_loadu_ps(acc + 72); c31 = _mm256_loadu_ps(acc + 80); c32 = _mm256_loadu_ps(acc + 88);
    }
    const float *b = koff ? B : B + k0 * QC_DIRECT_NP;
    for (int64_t k = k0; k < k1; ++k) {
        if (koff) {   /* the row QC_DIRECT_PF_STRIPS strips ahead */
            b = B + koff[k];
            _mm_prefetch((const char *)(b + QC_DIRECT_PF_STRIPS * QC_DIRECT_NP), _MM_HINT_T0);
            _mm_prefetch((const char *)(b + QC_DIRECT_PF_STRIPS * QC_DIRECT_NP + 16), _MM_HINT_T0);
        }
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), b2 = _mm256_loadu_ps(b + 16);
        __m256 v = _mm256_broadcast_ss(w + 4 * k);
        c00 = _mm256_fmadd_ps(v, b0, c00); c01 = _mm256_fmadd_ps(v, b1, c01); c02 = _mm256_fmadd_ps(v, b2, c02);
        v = _mm256_broadcast_ss(w + 4 * k + 1);
        c10 = _mm256_fmadd_ps(v, b0, c10); c11 = _mm256_fmadd_ps(v, b1, c11); c12 = _mm256_fmadd_ps(v, b2, c12);
        v = _mm256_broadcast_ss(w + 4 * k + 2);
        c20 = _mm256_fmadd_ps(v, b0, c20); c21 = _mm256_fmadd_ps(v, b1, c21); c22 = _mm256_fmadd_ps(v, b2, c22);
        v = _mm256_broadcast_ss(w + 4 * k + 3);
        c30 = _mm256_fmadd_ps(v, b0, c30); c31 = _mm256_fmadd_ps(v, b1, c31); c32 = _mm256_fmadd_ps(v, b2, c32);
        if (!koff) b += QC_DIRECT_NP;
    }
    _mm256_storeu_ps(acc, c00); _mm256_storeu_ps(acc + 8, c01); _mm256_storeu_ps(acc + 16, c02);
    _mm256_storeu_ps(acc + 24, c10); _mm256_storeu_ps(acc + 32, c11); _mm256_storeu_ps(acc + 40, c12);
    _mm256_storeu_ps(acc + 48, c20); _mm256_storeu_ps(acc + 56, c21); _mm256_storeu_ps(acc + 64, c22);
    _mm256_storeu_ps(acc + 72, c30); _mm256_storeu_ps(acc + 80, c31); _mm256_storeu_ps(acc + 88, c32);
}
QC_TGT_AVX2 static void qc_direct_mk_avx2(const float *w, const float *B, const int64_t *koff, int64_t k0,
                                          int64_t k1, float *acc, int first)
{
    if (koff) qc_direct_mk_body(w, B, koff, k0, k1, acc, first);
    else qc_direct_mk_body(w, B, NULL, k0, k1, acc, first);   /* no offset table to read */
}

/* The epilogue of the last k chunk in registers (qc_direct_mk512 with epi): channel row i of the micro-tile
 * (i < 8) goes to its NCHW plane y[i] (NULL: a channel past O, not stored), qc_direct_post_avx2's float32 operations
 * on 16 lanes. The strip's 32 grid pixels are nseg runs of outputs: run s holds the lanes set in mask[s] (one
 * output row, columns below OW), lane l at y[i] + off[s] + l. */
#define QC_DIRECT_MAX_SEGS 8
typedef struct {
    float *y[8];
    float bias[8];
    float lo, hi;
    int tail, nseg;
    const float *pa_s, *pa_t;   /* the tile's first channel's post_affine, or NULL */
    int64_t off[QC_DIRECT_MAX_SEGS];
    uint32_t mask[QC_DIRECT_MAX_SEGS];
} qc_direct_epi512;

/* the runs of grid pixels p0 .. p0+np-1 (np <= 32) that are outputs (column < OW), into e; 0 when there are more
 * than QC_DIRECT_MAX_SEGS */
static inline int qc_direct_segments(const qc_direct_job *j, int64_t p0, int64_t np, qc_direct_epi512 *e)
{
    e->nseg = 0;
    for (int64_t t = 0; t < np;) {
        const int64_t oy = (p0 + t) / j->Wph, ox = (p0 + t) % j->Wph;
        const int64_t run = np - t < j->Wph - ox ? np - t : j->Wph - ox;
        const int64_t keep = ox >= j->OW ? 0 : (run < j->OW - ox ? run : j->OW - ox);
        if (keep > 0) {
            if (e->nseg == QC_DIRECT_MAX_SEGS) return 0;
            e->off[e->nseg] = oy * j->OW + ox - t;
            e->mask[e->nseg] = (uint32_t)((((uint64_t)1 << keep) - 1) << t);
            e->nseg++;
        }
        t += run;
    }
    return 1;
}

QC_TGT_DIRECT512 static inline __attribute__((always_inline)) __m512 qc_direct_post512(const qc_direct_epi512 *e,
                                                                                    int i, __m512 v)
{
    const int pa = e->pa_s != NULL;
    v = _mm512_min_ps(_mm512_set1_ps(e->hi), _mm512_max_ps(_mm512_set1_ps(e->lo), _mm512_add_ps(v, _mm512_set1_ps(e->bias[i]))));
    const __m512 ps = _mm512_set1_ps(pa ? e->pa_s[i] : 1.0f), pt = _mm512_set1_ps(pa ? e->pa_t[i] : 0.0f);
    if (e->tail == QC_ACT_HARDSWISH) return qc_tail_affine512(v, QC_ACT_HARDSWISH, pa, ps, pt);
    if (e->tail == QC_ACT_SILU) return qc_tail_affine512(v, QC_ACT_SILU, pa, ps, pt);
    return qc_tail_affine512(v, 0, pa, ps, pt);
}

/* The AVX-512 micro-kernel: nb (1 or 2) weight blocks w[b] = w0 + b*K*4 of 4 channels x QC_DIRECT_NP512 pixels,
 * accumulators acc[b] (4 rows of 32) (+)= w[b][k0:k1] (k, 4) x rows B + koff[k] (koff NULL: row k at B + k*32);
 * with epi (the last chunk, outputs one run of 32 each), the epilogue in registers into epi->y instead.
 * Each output is the same float32 FMA chain over k as in qc_direct_mk_body: the same results, bit for bit. */
QC_TGT_DIRECT512 static inline __attribute__((always_inline)) void
qc_direct_mk512_body(const float *w0, int64_t wstride, const float *B, const int64_t *koff, int64_t k0, int64_t k1,
                     float *acc0, float *acc1, int first, const int nb, const qc_direct_epi512 *epi)
{
    enum { NP = QC_DIRECT_NP512 };
    __m512 c[8][2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        float *a = (i < 4 ? acc0 : acc1) + (i % 4) * NP;
        if (i >= 4 * nb) break;
        c[i][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(a);
        c[i][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(a + 16);
    }
    const float *b = koff ? B : B + k0 * NP;
    const float *w1 = w0 + wstride;
    for (int64_t k = k0; k < k1; ++k) {
        if (koff) {   /* rows at koff[k] (phase planes): the row QC_DIRECT_PF_STRIPS strips ahead into L1 */
            b = B + koff[k];
            _mm_prefetch((const char *)(b + QC_DIRECT_PF_STRIPS * NP), _MM_HINT_T0);
            _mm_prefetch((const char *)(b + QC_DIRECT_PF_STRIPS * NP + 16), _MM_HINT_T0);
        }
        const __m512 x0 = _mm512_loadu_ps(b), x1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
            if (i >= 4 * nb) break;
            const __m512 v = _mm512_set1_ps((i < 4 ? w0 : w1)[4 * k + i % 4]);
            c[i][0] = _mm512_fmadd_ps(v, x0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(v, x1, c[i][1]);
        }
        if (!koff) b += NP;
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        float *a = (i < 4 ? acc0 : acc1) + (i % 4) * NP;
        if (i >= 4 * nb) break;
        if (epi) {
            if (epi->y[i]) {
                const __m512 v0 = qc_direct_post512(epi, i, c[i][0]), v1 = qc_direct_post512(epi, i, c[i][1]);
                for (int s = 0; s < epi->nseg; ++s) {
                    float *d = epi->y[i] + epi->off[s];
                    const uint32_t m = epi->mask[s];
                    if (m & 0xFFFFu) _mm512_mask_storeu_ps(d, (__mmask16)(m & 0xFFFFu), v0);
                    if (m >> 16) _mm512_mask_storeu_ps(d + 16, (__mmask16)(m >> 16), v1);
                }
            }
            continue;
        }
        _mm512_storeu_ps(a, c[i][0]);
        _mm512_storeu_ps(a + 16, c[i][1]);
    }
}
/* two blocks (acc1 = NULL: one); epi: see qc_direct_mk512_body */
QC_TGT_DIRECT512 static void qc_direct_mk512(const float *w0, int64_t wstride, const float *B, const int64_t *koff,
                                             int64_t k0, int64_t k1, float *acc0, float *acc1, int first,
                                             const qc_direct_epi512 *epi)
{
    if (acc1) {
        if (koff) qc_direct_mk512_body(w0, wstride, B, koff, k0, k1, acc0, acc1, first, 2, epi);
        else qc_direct_mk512_body(w0, wstride, B, NULL, k0, k1, acc0, acc1, first, 2, epi);
    } else {
        if (koff) qc_direct_mk512_body(w0, wstride, B, koff, k0, k1, acc0, NULL, first, 1, epi);
        else qc_direct_mk512_body(w0, wstride, B, NULL, k0, k1, acc0, NULL, first, 1, epi);
    }
}

/* 1 when one of v[0:n] is NaN / inf */
QC_TGT_AVX2 static int qc_direct_run_bad_avx2(const float *v, int64_t n)
{
    const __m256 z = _mm256_setzero_ps();
    __m256 s0 = z, s1 = z;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_add_ps(s0, _mm256_mul_ps(_mm256_loadu_ps(v + i), z));
        s1 = _mm256_add_ps(s1, _mm256_mul_ps(_mm256_loadu_ps(v + i + 8), z));
    }
    s0 = _mm256_add_ps(s0, s1);
    return _mm256_movemask_ps(_mm256_cmp_ps(s0, s0, _CMP_UNORD_Q)) != 0 || qc_nonfinite_run(v + i, n - i);
}

/* dst[0:n] = src[0:n] (n a multiple of 8); 1 when one of them is NaN / inf */
QC_TGT_AVX2 static int qc_direct_copy_row_avx2(float *dst, const float *src, int n)
{
    const __m256 z = _mm256_setzero_ps();
    __m256 s = z;
    for (int t = 0; t < n; t += 8) {
        const __m256 a = _mm256_loadu_ps(src + t);
        _mm256_storeu_ps(dst + t, a);
        s = _mm256_add_ps(s, _mm256_mul_ps(a, z));
    }
    return _mm256_movemask_ps(_mm256_cmp_ps(s, s, _CMP_UNORD_Q)) != 0;
}

/* the epilogue of 8 results: post(tail(min(max(v + b, lo), hi))), the float32 operations of qc_direct_bias_clamp,
 * qc_tail_scalar and qc_affine_run (max / min return their second operand on NaN: the value goes second) */
QC_TGT_AVX2 static inline __m256 qc_direct_post_avx2(__m256 v, __m256 b, __m256 lo, __m256 hi, int tail, int pa,
                                                     __m256 ps, __m256 pt)
{
    return qc_tail_affine_avx2(_mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_add_ps(v, b))), tail, pa, ps, pt);
}

/* the epilogue of one channel's row of np results (a multiple of 8) into dst (dst may be a) */
QC_TGT_AVX2 static void qc_direct_epilogue_avx2(const float *a, float bias, float lo, float hi, int tail,
                                                const float *pa_s, const float *pa_t, float *dst, int np)
{
    const __m256 b = _mm256_set1_ps(bias), l = _mm256_set1_ps(lo), h = _mm256_set1_ps(hi);
    const __m256 ps = _mm256_set1_ps(pa_s ? *pa_s : 1.0f), pt = _mm256_set1_ps(pa_s ? *pa_t : 0.0f);
    for (int t = 0; t < np; t += 8)
        _mm256_storeu_ps(dst + t, qc_direct_post_avx2(_mm256_loadu_ps(a + t), b, l, h, tail, pa_s != NULL, ps, pt));
}
#endif

#ifdef QC_HAVE_X86
QC_TGT_AVX2 static int qc_wino_item(const qc_direct_job *j, int64_t item, float *scratch);
#endif

/* one work item: strips [i*S/ips, (i+1)*S/ips) (i = item % ips, S strips) of sample item / ips, every output
 * channel, in groups of QC_DIRECT_OG blocks over chunks of j->kc k values (Winograd: qc_wino_item).
 * Returns 1 when an in-place strip read a NaN / inf (nothing stored then). */

static int qc_direct_item(const qc_direct_job *j, int64_t item, float *scratch)
{
#ifdef QC_HAVE_X86
    if (j->wino) return qc_wino_item(j, item, scratch);
#endif
    const int64_t NP = j->np, AB = QC_DIRECT_MR * NP, ips = j->ips, grid = j->OH * j->Wph;
    const int64_t S = qc_direct_strips(j), ohw = j->OH * j->OW, n = item / ips;
    const int64_t s0 = (item % ips) * S / ips, s1 = (item % ips + 1) * S / ips;
    float *acc = scratch, *strips = scratch + (int64_t)qc_direct_max_ns(j) * QC_DIRECT_OG * AB;
    strips += (16 - ((uintptr_t)strips / sizeof(float)) % 16) % 16;   /* 64-byte aligned */
    const float *Bs[QC_DIRECT_NS];
    const int64_t *ks[QC_DIRECT_NS];
    int stored[QC_DIRECT_NS] = {0};   /* strips whose epilogue ran in the micro-kernel */
    for (int64_t st = s0; st < s1; ++st) {
        const int64_t p0 = st * NP, np = grid - p0 < NP ? grid - p0 : NP;
        const float *B = j->xp + n * qc_direct_sample(j) + p0;
        const int64_t *koff = j->koff;
        /* in place: the strip's rows gathered to one contiguous block, read by every block of every group (the
         * sample's last, partial strip padded with zeros, so that no read runs past x). Rows H*W floats apart fall
         * into the same few L1 sets on large planes (H*W*4 often a multiple of 4096) and evict each other; the
         * gather measured 0.79-0.92x the time at 160x160 and 320x320 and 0.94-0.96x at 400-480 pixels, about even
         * at 240 (2026-12-02, AVX2, A/B in one process). */
        if (j->in_place) {   /* the rows read are checked for NaN / inf on the way (nothing stored yet) */
            float *g = strips + (st - s0) * j->K * NP;
            int bad = 0;
            for (int64_t k = 0; k < j->K; ++k) {
#ifdef QC_HAVE_X86
                if (j->vec && np == NP) {
                    bad |= qc_direct_copy_row_avx2(g + k * NP, B + koff[k], (int)NP);
                    continue;
                }
#endif
                memcpy(g + k * NP, B + koff[k], (size_t)np * sizeof(float));
                memset(g + k * NP + np, 0, (size_t)(NP - np) * sizeof(float));
                bad |= qc_direct_bad(j, g + k * NP, np);
            }
            if (bad) return 1;
            B = g;
            koff = NULL;   /* row k at B + k*NP */
        }
        Bs[st - s0] = B;
        ks[st - s0] = koff;
    }
    for (int64_t g0 = 0; g0 < j->OCB; g0 += QC_DIRECT_OG) {
        const int64_t g1 = g0 + QC_DIRECT_OG < j->OCB ? g0 + QC_DIRECT_OG : j->OCB;
        for (int64_t k0 = 0; k0 < j->K; k0 += j->kc) {
            const int64_t k1 = k0 + j->kc < j->K ? k0 + j->kc : j->K;
            for (int64_t st = 0; st < s1 - s0; ++st) {
                const float *B = Bs[st];
                const int64_t *koff = ks[st];
                const int64_t p0 = (s0 + st) * NP, np = grid - p0 < NP ? grid - p0 : NP;
#ifdef QC_HAVE_X86
                /* the last chunk: the epilogue in the micro-kernel (AVX-512), stored run by run */
                qc_direct_epi512 e;
                const int fuse = j->vec == 2 && k1 == j->K && !j->out_nc4hw4 && qc_direct_segments(j, p0, np, &e);
                stored[st] = fuse;
#else
                (void)p0, (void)np;
#endif
                for (int64_t ocb = g0; ocb < g1; ++ocb) {
                    float *a = acc + (st * QC_DIRECT_OG + ocb - g0) * AB;
                    const float *Bg = B + qc_direct_goff(j, ocb);
#ifdef QC_HAVE_X86
                    if (j->vec == 2) {   /* two blocks a call (of one group) */
                        const int two = ocb + 1 < g1 && qc_direct_goff(j, ocb + 1) == qc_direct_goff(j, ocb);
                        if (fuse) {
                            e.lo = j->lo, e.hi = j->hi, e.tail = j->tail;
                            e.pa_s = j->pa_s ? j->pa_s + 4 * ocb : NULL, e.pa_t = j->pa_s ? j->pa_t + 4 * ocb : NULL;
                            for (int i = 0; i < 8; ++i) {
                                const int64_t o = 4 * ocb + i;
                                const int in = o < j->O && (two || i < 4);
                                e.y[i] = in ? j->y + (n * j->O + o) * ohw : NULL;
                                e.bias[i] = in ? j->bias[o] : 0.0f;
                            }
                        }
                        qc_direct_mk512(j->wf + ocb * j->K * 4, j->K * 4, Bg, koff, k0, k1, a, two ? a + AB : NULL,
                                        k0 == 0, fuse ? &e : NULL);
                        ocb += two;
                        continue;
                    }
                    if (j->vec) qc_direct_mk_avx2(j->wf + ocb * j->K * 4, Bg, koff, k0, k1, a, k0 == 0);
                    else
#endif
                        qc_direct_mk_scalar(j->wf + ocb * j->K * 4, Bg, koff, k0, k1, a, k0 == 0);
                }
            }
        }
        for (int64_t st = s0; st < s1; ++st) {
            const int64_t p0 = st * NP, np = grid - p0 < NP ? grid - p0 : NP;
            const int contiguous = j->Wph == j->OW && np == NP && !j->out_nc4hw4;   /* outputs: one run of NP */
            if (stored[st - s0]) continue;   /* by the micro-kernel */
            for (int64_t ocb = g0; ocb < g1; ++ocb)
                for (int i = 0; i < QC_DIRECT_MR; ++i) {
                    const int64_t o = 4 * ocb + i;
                    if (o >= j->O) break;
                    float *a = acc + ((st - s0) * QC_DIRECT_OG + ocb - g0) * AB + i * NP;
                    const int64_t ys = j->out_nc4hw4 ? 4 : 1;
                    const int64_t ybase = j->out_nc4hw4 ? ((o / 4) * j->N + n) * ohw * 4 + o % 4 : (n * j->O + o) * ohw;
                    /* the engine's epilogue, in place on the strip's row: bias and clamp, tail activation, post_affine */
#ifdef QC_HAVE_X86
                    if (j->vec) {
                        qc_direct_epilogue_avx2(a, j->bias[o], j->lo, j->hi, j->tail, j->pa_s ? j->pa_s + o : NULL,
                                                j->pa_s ? j->pa_t + o : NULL, contiguous ? j->y + ybase + p0 : a,
                                                (int)NP);
                        if (contiguous) continue;
                    } else
#endif
                    {
                        qc_direct_bias_clamp(a, j->bias[o], j->lo, j->hi);
                        if (j->tail) qc_tail_scalar(a, np, j->tail);
                        if (j->pa_s) qc_affine_run(a, np, j->pa_s[o], j->pa_t[o]);
                        if (contiguous) {
                            memcpy(j->y + ybase + p0, a, NP * sizeof(float));
                            continue;
                        }
                    }
                    /* grid pixels p0 .. p0+np-1 -> outputs (oy, ox), ox < OW */
                    for (int64_t t = 0; t < np;) {
                        const int64_t oy = (p0 + t) / j->Wph, ox = (p0 + t) % j->Wph;
                        const int64_t run = np - t < j->Wph - ox ? np - t : j->Wph - ox;
                        const int64_t keep = ox >= j->OW ? 0 : (run < j->OW - ox ? run : j->OW - ox);
                        float *d = j->y + ybase + (oy * j->OW + ox) * ys;
                        if (ys == 1) memcpy(d, a + t, (size_t)keep * sizeof(float));
                        else for (int64_t u = 0; u < keep; ++u) d[u * ys] = a[t + u];
                        t += run;
                    }
                }
        }
    }
    return 0;
}

#include "qconv_winograd.h"

#endif /* QCONV_DIRECT_H */
