/* qconv_direct_int8.h -- the CPU engine's direct int8 conv (kernels "amx" and "avx512vnni", act_quant="tensor").
 *
 * Contract, per sample n, output channel o and output pixel (oy, ox):
 *   I = sum over c, ky, kx of q[o][c][ky][kx] * u[c][oy*sh - pt + ky*dh][ox*sw - pl + kx*dw]   (exact int32)
 *   S = the sum of the same u                       (u = xq - z, 0 outside the input; xq = clip(round(x*qs) + z,
 *                                                    qlo, qhi), the tensor quantization of the tiled GEMM path)
 *   y[n][o][oy][ox] = clamp(dx * fma(s[o], I, off[o] * S) + bias[o], lo, hi), then the tail activation (hardswish, silu) and v * ps + pt
 * with the float operations, in the order, of the VNNI kernel's epilogue (qc_vnni_facc, qc_vnni_fin) and of the
 * store's tail activation / post-affine: the results are bitwise those of the tiled GEMM path.
 * The static int8 path (the engine's input_qparams / output_qparams), each side on its own: an int8 input xi is
 * taken as its own quantization (xq = xi, z its zero point, dx its scale: no pass over x for a range), and an int8
 * output yi stores qc_requant's clip(round(y / oscale) + ozp, -128, 127) of the same y (qc_requant16_avx512).
 * Scope: any stride, kernel size, dilation and padding, one group, weights per channel or in blocks of a multiple
 * of 4 channels (symmetric or with offsets; several blocks: each block's integer sums I_b, S_b and the float sum
 * F = sum over b of fma(s_b, I_b, off_b * S_b) in the GEMM's order, then dx * F + bias), int8 or int4 weights,
 * float32 (or int8) NCHW input and output.
 *
 * Layout. Per sample the input is quantized once into a padded quad-major buffer of bytes U = xq + 128: per quad
 * (4 channels), the sh*sw phase planes of the zero-padded input, phase (a, b) holding padded rows a, a+sh, ... and
 * columns b, b+sw, ...: xq[quad][a][b][Hq][Wq][4] (Hq = OH + (KH-1)*dh / sh, Wq = OW + (KW-1)*dw / sw, integer
 * division; the padding and the padded channel lanes hold z + 128, i.e. u = 0), `plane` bytes per quad. Output
 * pixel (oy, ox) is the virtual pixel v = oy*Wq + ox, and tap (ky, kx) reads phase ((ky*dh) % sh, (kx*dw) % sw)
 * at v + (ky*dh / sh)*Wq + kx*dw / sw: for every tap, 16 consecutive virtual pixels are 16 consecutive 4-byte
 * groups, so a B tile (kg quads x 16 pixels x 4 channels) is one strided tile load straight from xq, without
 * im2col. Virtual pixels with ox >= OW are computed and dropped (a (Wq - OW) / Wq overhead).
 * The weights are the A operand: AmxConvWeightLayout tiles [O/16][taps][steps][16][kg][4] of signed q
 * (qconv/layouts/amx.py), multiplied by tdpbsud (A signed, B unsigned): acc = sum q*U, I = acc - (z+128)*wsx
 * with wsx = sum of q per output channel. The accumulators are 16 channels x 16 pixels, channel-major: each
 * output channel's 16 pixels are stored straight into its NCHW rows (masked, split where a run crosses a row).
 *
 * Blocks: block b owns steps b*spb .. (b+1)*spb - 1 of every tap, and step b*spb + j, row r reads input quad
 * b*bq + j*kg + r (AmxConvWeightLayout); its I_b and S_b sum over those steps alone.
 *
 * Work: quantization items (sample, quad, band of its phase-plane rows: qc_di8_quant_bands), pixel-sum items
 * (sample, phase-plane row; only with offsets), then compute items. AMX: (sample, pair of 16-channel tiles, block of
 * run pairs), four accumulator tiles per run pair; one weight block: the K sequence (tap, step) cut into chunks
 * whose weights stay in L1 across the run pairs; several: block after block. VNNI (qc_di8_vnni_run): (sample,
 * 16-channel tile, group of 3 runs, or 2 where that computes fewer padding runs), 8 channels x 3 (2) runs of
 * accumulators in registers, a K step's zero-padded quads skipped.
 */
#ifndef QCONV_DIRECT_INT8_H
#define QCONV_DIRECT_INT8_H

#include "qconv_kernels.h"

#ifdef QC_HAVE_X86

typedef struct {
    int64_t N, C, H, W, OH, OW;
    int32_t KH, KW, sh, sw, dh, dw, pt, pl;
    int32_t quads, kg, steps;     /* AmxConvWeightLayout: channel quads, quads per K step, K steps per tap */
    int32_t nblocks, bq, spb;     /* weight blocks, quads of a block, K steps of a block per tap */
    int32_t planes;               /* quad planes the kernels read: AMX AmxConvWeightLayout.quads_padded (its tiles
                                   * span whole K steps), VNNI quads (it skips the zero-padded rows of a step) */
    int32_t qbands;               /* bands of phase-plane rows per quantized quad (qc_di8_quant_bands) */
    int32_t O, otiles;            /* output channels, 16-channel tiles */
    /* set by qc_di8_setup */
    int64_t Hq, Wq, rows;         /* phase planes and their rows in a quad (sh*sw*Hq) */
    int64_t plane;                /* bytes between quads (pixels rows*Wq + QC_DI8_SLACK, rounded up) */
    int64_t nvirt, runs;          /* virtual pixels (OH-1)*Wq + OW and their 16-pixel runs */
    int64_t sample_bytes;         /* xq bytes per sample: `planes` planes */
    int64_t psum_len;             /* int32 pixel sums per sample and block: rows*Wq + QC_DI8_SLACK */
    int32_t rb;                   /* AMX: run pairs per compute item (<= QC_DI8_RB; 0: qc_di8_setup's choice) */
    int32_t vnr;                  /* VNNI: 16-pixel runs per compute item, 2 or 3 (qc_di8_setup) */
    int64_t kchunk;               /* AMX: K steps per chunk (0: qc_di8_setup's choice) */
    /* weights and tables: wsx, scale, offset [nblocks][16*otiles], bias, pa_s, pa_t [16*otiles] */
    const int8_t *wa;
    const int32_t *wsx;
    const float *scale, *offset, *bias;   /* offset NULL: symmetric weights (no pixel sums) */
    float lo, hi;
    int32_t tail;
    const float *pa_s, *pa_t;     /* post-affine per channel, or NULL */
    /* per call: float x and y, or (the static path) int8 xi and / or yi with the other NULL */
    const float *x;
    float *y;
    const int8_t *xi;
    int8_t *yi;
    float oscale;                 /* int8 output: y ~= (yi - ozp) * oscale */
    int32_t ozp;
    uint8_t *xq;
    int32_t *psum;                /* NULL when offset is NULL */
    const float *qs, *dx;         /* per sample */
    const int32_t *z;
    int32_t qlo, qhi;
    const int64_t *toff;          /* per tap: its phase plane's first pixel + (ky*dh / sh)*Wq + kx*dw / sw */
} qc_di8_job;

/* pixels of slack after each plane: the last group of runs of a compute item (two 16-pixel runs on AMX, three on
 * VNNI) reads up to 47 pixels beyond the plane's last valid one (their results are dropped) */
#define QC_DI8_SLACK 48
/* run pairs per compute item (at most), and the A bytes (two channel tiles) one K chunk may span by default: the
 * chunk's weights stay in L1 while the item's run pairs pass over it (partial sums wait in a stack buffer) */
#define QC_DI8_RB 8
#define QC_DI8_KCHUNK_BYTES 24576

static void qc_di8_setup(qc_di8_job *j)
{
    j->Hq = j->OH + (int64_t)(j->KH - 1) * j->dh / j->sh;
    j->Wq = j->OW + (int64_t)(j->KW - 1) * j->dw / j->sw;
    j->rows = (int64_t)j->sh * j->sw * j->Hq;
    j->nvirt = (j->OH - 1) * j->Wq + j->OW;
    j->runs = (j->nvirt + 15) / 16;
    int64_t plane = (j->rows * j->Wq + QC_DI8_SLACK) * 4;
    plane = (plane + 63) & ~(int64_t)63;
    /* a B tile reads 16 rows `plane` bytes apart: keep them off one L1 set */
    if (plane % 1024 == 0) plane += 64;
    j->plane = plane;
    j->sample_bytes = (int64_t)j->planes * plane;
    j->psum_len = j->rows * j->Wq + QC_DI8_SLACK;
    if (j->kchunk < 1) {
        j->kchunk = QC_DI8_KCHUNK_BYTES / (2 * 64 * (int64_t)j->kg);
        if (j->kchunk < 1) j->kchunk = 1;
    }
    /* VNNI: two runs an item where that computes fewer runs than three (7x7 outputs: 4 runs against 6); with
     * several weight blocks only where it saves 10% of them (each block's epilogue runs per run). 2026-12-06, Zen 4,
     * 2 threads: MobileNetV2's 1x1 convs at 7x7 0.70-0.93x the time (A/B); at 14x14 (14 runs against 15) 3x3
     * 256ch int8 per channel 0.334 against 0.363 ms and 1x1 256->1024 0.181 against 0.190 (bench_cpu.py, two
     * runs), int4 block-32 1.12-1.16x slower (A/B) */
    const int64_t r2 = (j->runs + 1) / 2 * 2, r3 = (j->runs + 2) / 3 * 3;
    j->vnr = (j->nblocks == 1 ? r2 < r3 : 10 * r2 <= 9 * r3) ? 2 : 3;
    /* one K chunk: blocks of run pairs only set the work items' size (2 keeps them many); several: a block
     * shares each chunk's weights */
    if (j->rb < 1 || j->rb > QC_DI8_RB)
        j->rb = j->nblocks > 1 || (int64_t)j->KH * j->KW * j->steps <= j->kchunk ? 2 : QC_DI8_RB;
}

/* bands of phase-plane rows a quad's quantization is cut into for `threads` threads: enough items for about 8 a
 * thread where the samples' quads alone are fewer (a 3-channel stem is one quad), whole planes otherwise */
static inline int32_t qc_di8_quant_bands(const qc_di8_job *j, int threads)
{
    const int64_t quads = j->N * j->planes, want = 8 * (int64_t)threads;
    int64_t b = quads >= want ? 1 : (want + quads - 1) / quads;
    b = b > j->rows ? j->rows : b;
    return (int32_t)(b < 1 ? 1 : b);
}

static inline int64_t qc_di8_quant_items(const qc_di8_job *j)
{
    return j->N * j->planes * j->qbands;
}

static void qc_di8_offsets(const qc_di8_job *j, int64_t *toff)
{
    for (int ky = 0; ky < j->KH; ++ky)
        for (int kx = 0; kx < j->KW; ++kx)
        {
            const int64_t ry = (int64_t)ky * j->dh, rx = (int64_t)kx * j->dw;
            const int64_t phase = (ry % j->sh) * j->sw + rx % j->sw;
            toff[ky * j->KW + kx] = phase * j->Hq * j->Wq + ry / j->sh * j->Wq + rx / j->sw;
        }
}

static inline void qc_di8_fill32(uint32_t *p, int64_t n, uint32_t v)
{
    for (int64_t i = 0; i < n; ++i) p[i] = v;
}

/* 16 columns (cnt valid, mask m) of an int8 input row at stride sw from src, as the bytes U = xi + 128 in int32
 * lanes (0 + 128 past cnt) */
QC_TGT_512 static inline __m512i qc_di8_load_i8(const int8_t *src, int64_t cnt, int64_t sw, __mmask16 m)
{
    __m512i v;
    if (sw == 1) v = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, src));
    else if (sw == 2) {   /* the even bytes of src[0 : 2*cnt - 1]: int16 lanes, then each int32 lane's low half */
        const int64_t nb = 2 * cnt - 1;
        const __mmask32 mb = nb >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << nb) - 1);
        v = _mm512_cvtepi16_epi32(_mm512_cvtepi32_epi16(_mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mb, src))));
    } else {
        int32_t t[16] __attribute__((aligned(64))) = {0};
        for (int64_t i = 0; i < cnt; ++i) t[i] = src[i * sw];
        v = _mm512_load_si512((const void *)t);
    }
    return _mm512_add_epi32(v, _mm512_set1_epi32(128));
}

/* quantization item (sample n, quad c4, band b of its qbands): rows [r0, r1) of the quad's phase planes of sample
 * n (row r: phase r / Hq, its row r % Hq), padding included; the last band adds the slack */
QC_TGT_512 static void qc_di8_quant(const qc_di8_job *j, int64_t item)
{
    const int64_t nq = j->planes, nb = j->qbands, n = item / (nq * nb), c4 = item / nb % nq, b = item % nb;
    const int64_t rpb = (j->rows + nb - 1) / nb, r0 = b * rpb < j->rows ? b * rpb : j->rows;
    const int64_t r1 = r0 + rpb < j->rows ? r0 + rpb : j->rows;
    const int32_t zpu = j->z[n] + 128;
    const uint32_t fill = 0x01010101u * (uint32_t)(zpu & 255);
    uint32_t *plane = (uint32_t *)(j->xq + n * j->sample_bytes + c4 * j->plane);
    const int64_t Hq = j->Hq, Wq = j->Wq, W = j->W, H = j->H, sh = j->sh, sw = j->sw;
    if (c4 >= j->quads) {   /* a padded quad (zero weights): any value, kept defined */
        qc_di8_fill32(plane + r0 * Wq, (b == nb - 1 ? j->plane / 4 : r1 * Wq) - r0 * Wq, fill);
        return;
    }
    if (b == nb - 1) qc_di8_fill32(plane + j->rows * Wq, QC_DI8_SLACK, fill);
    const __m512 q = _mm512_set1_ps(j->qs[n]);
    const __m512i zv = _mm512_set1_epi32(zpu), lo = _mm512_set1_epi32(j->qlo + 128);
    const __m512i hi = _mm512_set1_epi32(j->qhi + 128);
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i step = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)sw));
    const float *xc[4];
    const int8_t *xb[4];
    int real = 0;
    for (int i = 0; i < 4; ++i) {
        const int64_t c = 4 * c4 + i, at = (n * j->C + c) * H * W;
        xc[i] = c < j->C && j->x ? j->x + at : NULL;
        xb[i] = c < j->C && j->xi ? j->xi + at : NULL;
        real += c < j->C;
    }
    const int fast = sw == 1 && real == 4 && xc[3] != NULL && xb[3] == NULL;
    for (int64_t r = r0; r < r1;) {
        const int64_t pa = r / Hq / sw, pb = r / Hq % sw;
        /* column jj of this phase reads input column jj*sw + x0: inside the input for jj in [jlo, jhi) */
        const int64_t x0 = pb - j->pl;
        int64_t jlo = x0 >= 0 ? 0 : (-x0 + sw - 1) / sw;
        int64_t jhi = W - x0 <= 0 ? 0 : (W - 1 - x0) / sw + 1;
        jhi = jhi > Wq ? Wq : jhi;
        jlo = jlo > jhi ? jhi : jlo;
        const int64_t pend = (r / Hq + 1) * Hq < r1 ? (r / Hq + 1) * Hq : r1;   /* this phase's rows in the band */
        for (; r < pend; ++r) {
            uint32_t *row = plane + r * Wq;
            const int64_t i = r % Hq, yy = i * sh + pa - j->pt;
            if (yy < 0 || yy >= H || jlo >= jhi) { qc_di8_fill32(row, Wq, fill); continue; }
            qc_di8_fill32(row, jlo, fill);
            qc_di8_fill32(row + jhi, Wq - jhi, fill);
            if (fast) {   /* the loop below, unrolled: float input, stride 1, four real channels */
                const float *s0 = xc[0] + yy * W + x0, *s1 = xc[1] + yy * W + x0;
                const float *s2 = xc[2] + yy * W + x0, *s3 = xc[3] + yy * W + x0;
                for (int64_t jj = jlo; jj < jhi; jj += 16) {
                    const int64_t cnt = jhi - jj >= 16 ? 16 : jhi - jj;
                    const __mmask16 m = cnt == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cnt) - 1);
                    const __m512i v0 = qc_quant16_avx512(_mm512_maskz_loadu_ps(m, s0 + jj), q, zv, lo, hi);
                    const __m512i v1 = qc_quant16_avx512(_mm512_maskz_loadu_ps(m, s1 + jj), q, zv, lo, hi);
                    const __m512i v2 = qc_quant16_avx512(_mm512_maskz_loadu_ps(m, s2 + jj), q, zv, lo, hi);
                    const __m512i v3 = qc_quant16_avx512(_mm512_maskz_loadu_ps(m, s3 + jj), q, zv, lo, hi);
                    const __m512i acc = _mm512_or_si512(
                        _mm512_or_si512(v0, _mm512_slli_epi32(v1, 8)),
                        _mm512_or_si512(_mm512_slli_epi32(v2, 16), _mm512_slli_epi32(v3, 24)));
                    _mm512_mask_storeu_epi32(row + jj, m, acc);
                }
                continue;
            }
            for (int64_t jj = jlo; jj < jhi; jj += 16) {
                const int64_t cnt = jhi - jj >= 16 ? 16 : jhi - jj;
                const __mmask16 m = cnt == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cnt) - 1);
                __m512i acc = _mm512_setzero_si512();
                for (int c = 0; c < 4; ++c) {
                    __m512i v = zv;
                    if (c < real && xb[c]) v = qc_di8_load_i8(xb[c] + yy * W + jj * sw + x0, cnt, sw, m);
                    else if (c < real) {
                        const float *src = xc[c] + yy * W + jj * sw + x0;
                        __m512 f;
                        if (sw == 1) f = _mm512_maskz_loadu_ps(m, src);
                        else if (sw == 2) {   /* the even floats of src[0 : 2*cnt - 1] */
                            const int64_t nf = 2 * cnt - 1;
                            const __mmask16 m0 = nf >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nf) - 1);
                            const __mmask16 m1 = nf > 16 ? (__mmask16)((1u << (nf - 16)) - 1) : 0;
                            f = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(m0, src), even,
                                                       _mm512_maskz_loadu_ps(m1, src + 16));
                        } else
                            f = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, step, src, 4);
                        v = qc_quant16_avx512(f, q, zv, lo, hi);
                    }
                    acc = _mm512_or_si512(acc, _mm512_slli_epi32(v, 8 * c));
                }
                _mm512_mask_storeu_epi32(row + jj, m, acc);
            }
        }
    }
}

/* pixel-sum item (sample n, row r of the phase planes): per block, psum[p] = sum of u over the block's real channels
 * at plane position p (the last row also clears the slack) */
QC_TGT_VNNI static void qc_di8_psum(const qc_di8_job *j, int64_t item)
{
    const int64_t n = item / j->rows, r = item % j->rows, Wq = j->Wq;
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t b = 0; b < j->nblocks; ++b) {
        const int64_t q0 = b * j->bq, q1 = q0 + j->bq < j->quads ? q0 + j->bq : j->quads;
        const uint8_t *xs = j->xq + n * j->sample_bytes + q0 * j->plane + r * Wq * 4;
        int32_t *ps = j->psum + (n * j->nblocks + b) * j->psum_len + r * Wq;
        const __m512i bias = _mm512_set1_epi32(4 * (int32_t)(q1 - q0) * (j->z[n] + 128));
        for (int64_t x0 = 0; x0 < Wq; x0 += 16) {
            const __mmask16 m = Wq - x0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (Wq - x0)) - 1);
            __m512i acc = _mm512_setzero_si512();
            for (int64_t c4 = 0; c4 < q1 - q0; ++c4)
                acc = _mm512_dpbusd_epi32(acc, _mm512_maskz_loadu_epi32(m, xs + c4 * j->plane + x0 * 4), ones);
            _mm512_mask_storeu_epi32(ps + x0, m, _mm512_sub_epi32(acc, bias));
        }
        if (r == j->rows - 1) memset(ps + Wq, 0, QC_DI8_SLACK * sizeof(int32_t));
    }
}

/* where the 16 virtual pixels v0 .. v0+15 go: up to 17 row segments (mask of lanes, output offset of lane 0) */
typedef struct { int n; __mmask16 mask[17]; int64_t off[17]; } qc_di8_segs;

static inline void qc_di8_segments(const qc_di8_job *j, int64_t v0, qc_di8_segs *sg)
{
    sg->n = 0;
    for (int64_t oy = v0 / j->Wq; oy * j->Wq < v0 + 16 && oy < j->OH; ++oy) {
        int64_t a = oy * j->Wq - v0, b = a + j->OW;
        a = a < 0 ? 0 : a;
        b = b > 16 ? 16 : b;
        if (a >= b) continue;
        sg->mask[sg->n] = (__mmask16)(((1u << b) - 1) & ~((1u << a) - 1));
        sg->off[sg->n] = oy * j->OW + (v0 - oy * j->Wq);   /* lane i -> oy*OW + (v0 + i - oy*Wq) */
        sg->n++;
    }
}

/* epilogue of one 16 x 16 accumulator tile (channels 16*ot.., virtual pixels v0..) into y of sample n; has_off,
 * hs (the tail activation's code, 0: none) and pa are constants in each of qc_di8_epi's calls, so every
 * combination compiles to a branch-free row loop */
QC_TGT_VNNI static inline __attribute__((always_inline))
void qc_di8_epi_rows(const qc_di8_job *j, int64_t n, int64_t ot, int64_t v0, const int32_t *cbuf, int64_t k,
                     float *part, const qc_di8_segs *sg, const int has_off, const int hs, const int pa)
{
    /* the job's fields as locals: the stores to y below may alias them as far as the compiler knows */
    const int64_t tk = k * 16 * j->otiles + 16 * ot;   /* block k's tables of this channel tile */
    const float *scale = j->scale + tk, *offset = has_off ? j->offset + tk : NULL;
    const float *bias = j->bias + 16 * ot, *pas = pa ? j->pa_s + 16 * ot : NULL, *pat = pa ? j->pa_t + 16 * ot : NULL;
    const int32_t *wsx = j->wsx + tk;
    const int nseg = sg->n, first = k == 0, last = k == j->nblocks - 1;
    __m512 sf = _mm512_setzero_ps();
    if (has_off) {
        const int32_t *ps = j->psum + (n * j->nblocks + k) * j->psum_len + v0;
        __m512i s = _mm512_setzero_si512();
        for (int t = 0; t < j->KH * j->KW; ++t) s = _mm512_add_epi32(s, _mm512_loadu_si512((const void *)(ps + j->toff[t])));
        sf = _mm512_cvtepi32_ps(s);
    }
    const int32_t zpu = j->z[n] + 128;
    const __m512 dx = _mm512_set1_ps(j->dx[n]), lo = _mm512_set1_ps(j->lo), hi = _mm512_set1_ps(j->hi);
    const __m512 zero = _mm512_setzero_ps();
    const int mmax = j->O - 16 * ot < 16 ? (int)(j->O - 16 * ot) : 16;
    const int64_t ohw = j->OH * j->OW;
    const int o8 = j->yi != NULL;
    float *y0 = o8 ? NULL : j->y + (n * j->O + 16 * ot) * ohw;
    int8_t *b0 = o8 ? j->yi + (n * j->O + 16 * ot) * ohw : NULL;
    const __m512 osc = _mm512_set1_ps(j->oscale);
    const __m512i ozp = _mm512_set1_epi32(j->ozp);
    for (int m = 0; m < mmax; ++m) {
        const __m512i acc = _mm512_loadu_si512((const void *)(cbuf + 16 * m));
        const __m512i i = _mm512_sub_epi32(acc, _mm512_set1_epi32(zpu * wsx[m]));
        /* the VNNI epilogue's fma(s, I, o*S), with o*S = +0 when symmetric */
        const __m512 off = has_off ? _mm512_mul_ps(_mm512_set1_ps(offset[m]), sf) : zero;
        __m512 f = _mm512_fmadd_ps(_mm512_set1_ps(scale[m]), _mm512_cvtepi32_ps(i), off);
        /* blocks: the GEMM's order, F = f (first block), then f + F; dx and the bias after the last */
        if (!first) f = _mm512_add_ps(f, _mm512_load_ps(part + 16 * m));
        if (!last) { _mm512_store_ps(part + 16 * m, f); continue; }
        f = _mm512_fmadd_ps(dx, f, _mm512_set1_ps(bias[m]));
        f = _mm512_min_ps(_mm512_max_ps(f, lo), hi);
        f = qc_tail_affine512(f, hs, pa, _mm512_set1_ps(pa ? pas[m] : 1.0f), _mm512_set1_ps(pa ? pat[m] : 0.0f));
        if (o8) {
            const __m128i b = qc_requant16_avx512(f, osc, ozp);
            for (int s = 0; s < nseg; ++s) _mm_mask_storeu_epi8(b0 + m * ohw + sg->off[s], sg->mask[s], b);
            continue;
        }
        float *yo = y0 + m * ohw;
        if (nseg == 1) _mm512_mask_storeu_ps(yo + sg->off[0], sg->mask[0], f);
        else for (int s = 0; s < nseg; ++s) _mm512_mask_storeu_ps(yo + sg->off[s], sg->mask[s], f);
    }
}

/* the epilogue of block k for one accumulator tile; part: the tile's 256 float partial sums (several blocks) */
QC_TGT_VNNI static void qc_di8_epi_block(const qc_di8_job *j, int64_t n, int64_t ot, int64_t v0, const int32_t *cbuf,
                                         int64_t k, float *part)
{
    qc_di8_segs sg;
    qc_di8_segments(j, v0, &sg);
    if (sg.n == 0) return;
    const int hs = QC_ACT_HARDSWISH, si = QC_ACT_SILU;
    switch ((j->offset != NULL) | (j->pa_s != NULL) << 1 | (j->tail == hs) << 2 | (j->tail == si) << 3) {
    case 0: qc_di8_epi_rows(j, n, ot, v0, cbuf, k, part, &sg, 0, 0, 0); break;
    case 1: qc_di8_epi_rows(j, n, ot, v0, cbuf, k, part, &sg, 1, 0, 0); break;
    case 2: qc_di8_epi_rows(j, n, ot, v0, cbuf, k, part, &sg, 0, 0, 1); break;
    case 3: qc_di8_epi_rows(j, n, ot, v0, cbuf, k, part, &sg, 1, 0, 1); break;
    case 4: qc_di8_epi_rows(j, n, ot, v0, cbuf, k, part, &sg, 0, hs, 0); break;
    case 5: qc_di8_epi_rows(j, n, ot, v0, cbuf, k, part, &sg, 1, hs, 0); break;
    case 6: qc_di8_epi_rows(j, n, ot, v0, cbuf, k, part, &sg, 0, hs, 1); break;
    case 7: qc_di8_epi_rows(j, n, ot, v0, cbuf, k, part, &sg, 1, hs, 1); break;
    case 8: qc_di8_epi_rows(j, n, ot, v0, cbuf, k, part, &sg, 0, si, 0); break;
    case 9: qc_di8_epi_rows(j, n, ot, v0, cbuf, k, part, &sg, 1, si, 0); break;
    case 10: qc_di8_epi_rows(j, n, ot, v0, cbuf, k, part, &sg, 0, si, 1); break;
    default: qc_di8_epi_rows(j, n, ot, v0, cbuf, k, part, &sg, 1, si, 1); break;
    }
}

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) qc_di8_cfg;

/* the tile configuration of both AMX runs, loaded on the calling thread: C 0..3 (16 x 64 bytes), A (weights) 4, 5
 * (16 x 4kg), B (pixels) 6, 7 (kg x 64) */
QC_TGT_AMX static inline void qc_di8_amx_config(const qc_di8_job *j)
{
    qc_di8_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 4; ++i) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }
    for (int i = 4; i < 6; ++i) { cfg.rows[i] = 16; cfg.colsb[i] = (uint16_t)(4 * j->kg); }
    for (int i = 6; i < 8; ++i) { cfg.rows[i] = (uint8_t)j->kg; cfg.colsb[i] = 64; }
    _tile_loadconfig(&cfg);
}

/* one K step of a 2x2 block: A tiles (weights) a and a + ostride, B tiles (pixels) b and b + 64; the second channel
 * tile / run only when two_o / two_r */
QC_TGT_AMX static inline __attribute__((always_inline))
void qc_di8_amx_step(const int8_t *a, const uint8_t *b, int64_t astride, int64_t ostride, int64_t plane, int two_o,
                     int two_r)
{
    _tile_loadd(4, a, astride);
    _tile_loadd(6, b, plane);
    _tile_dpbsud(0, 4, 6);
    if (two_r) { _tile_loadd(7, b + 64, plane); _tile_dpbsud(1, 4, 7); }
    if (two_o) {
        _tile_loadd(5, a + ostride, astride);
        _tile_dpbsud(2, 5, 6);
        if (two_r) _tile_dpbsud(3, 5, 7);
    }
}

/* the four accumulator tiles into dst[4][256] (C00, C01, C10, C11) */
QC_TGT_AMX static inline __attribute__((always_inline)) void qc_di8_amx_store(int32_t *dst)
{
    _tile_stored(0, dst, 64); _tile_stored(1, dst + 256, 64);
    _tile_stored(2, dst + 512, 64); _tile_stored(3, dst + 768, 64);
}

/* block k's epilogue of the stored 2x2 block (part: 4 x 256 float partial sums, or NULL with one block) */
QC_TGT_AMX static inline void qc_di8_amx_epi(const qc_di8_job *j, int64_t n, int64_t ot, int64_t v0,
                                             const int32_t *cbuf, int64_t k, float *part, int two_o, int two_r)
{
    qc_di8_epi_block(j, n, ot, v0, cbuf, k, part);
    if (two_r) qc_di8_epi_block(j, n, ot, v0 + 16, cbuf + 256, k, part ? part + 256 : NULL);
    if (two_o) {
        qc_di8_epi_block(j, n, ot + 1, v0, cbuf + 512, k, part ? part + 512 : NULL);
        if (two_r) qc_di8_epi_block(j, n, ot + 1, v0 + 16, cbuf + 768, k, part ? part + 768 : NULL);
    }
}

static inline int64_t qc_di8_amx_items(const qc_di8_job *j)
{
    const int64_t rpairs = (j->runs + 1) / 2;
    return j->N * ((j->otiles + 1) / 2) * ((rpairs + j->rb - 1) / j->rb);
}

/* compute items i0 .. i1-1: item = (sample, channel-tile pair, block of QC_DI8_RB run pairs), the block fastest
 * (consecutive items share the pair's weights). Per item: K chunks of the (tap, step) sequence outside, run pairs
 * inside. Tiles: C 0..3 (16 x 64 bytes), A (weights) 4, 5 (16 x 4kg), B (pixels) 6, 7 (kg x 64). The configuration
 * is loaded and released here, on the calling thread. */
/* an AMX compute item (sample n, channel tiles ot and ot + 1 when two_o, run pairs rp0 .. rp1-1): its sample's
 * planes xs and its tile pair's weights wo */
typedef struct {
    int64_t n, ot, rp0, rp1;
    int two_o;
    const uint8_t *xs;
    const int8_t *wo;
} qc_di8_amx_item;

static inline void qc_di8_amx_decode(const qc_di8_job *j, int64_t item, qc_di8_amx_item *it)
{
    const int64_t opairs = (j->otiles + 1) / 2, rpairs = (j->runs + 1) / 2;
    const int64_t rblocks = (rpairs + j->rb - 1) / j->rb;
    const int64_t ostride = (int64_t)j->KH * j->KW * j->steps * 64 * (int64_t)j->kg;
    const int64_t rem = item % (opairs * rblocks);
    it->n = item / (opairs * rblocks);
    it->ot = 2 * (rem / rblocks);
    it->rp0 = (rem % rblocks) * j->rb;
    it->rp1 = it->rp0 + j->rb < rpairs ? it->rp0 + j->rb : rpairs;
    it->two_o = it->ot + 1 < j->otiles;
    it->xs = j->xq + it->n * j->sample_bytes;
    it->wo = j->wa + it->ot * ostride;
}

QC_TGT_AMX static void qc_di8_amx_run_blocks(const qc_di8_job *j, int64_t i0, int64_t i1);

QC_TGT_AMX static void qc_di8_amx_run(const qc_di8_job *j, int64_t i0, int64_t i1)
{
    if (j->nblocks > 1) { qc_di8_amx_run_blocks(j, i0, i1); return; }
    int32_t cbuf[4 * 256] __attribute__((aligned(64)));
    int32_t part[QC_DI8_RB][4 * 256] __attribute__((aligned(64)));
    qc_di8_amx_config(j);
    const int64_t taps = (int64_t)j->KH * j->KW, astride = 4 * (int64_t)j->kg, rpairs = (j->runs + 1) / 2;
    const int64_t tb = 64 * (int64_t)j->kg, ostride = taps * j->steps * tb;
    const int64_t bstep = (int64_t)j->kg * j->plane, plane = j->plane, steps = j->steps;
    const int64_t ksteps = taps * steps;
    const int64_t kchunk = j->kchunk;
    for (int64_t item = i0; item < i1; ++item) {
        qc_di8_amx_item it;
        qc_di8_amx_decode(j, item, &it);
        const int64_t n = it.n, ot = it.ot, rp0 = it.rp0, rp1 = it.rp1;
        const int two_o = it.two_o;
        const uint8_t *xs = it.xs;
        const int8_t *wo = it.wo;
        for (int64_t k0 = 0; k0 < ksteps; k0 += kchunk) {
            const int64_t k1 = k0 + kchunk < ksteps ? k0 + kchunk : ksteps;
            for (int64_t rp = rp0; rp < rp1; ++rp) {
                const int64_t r = 2 * rp, v0 = 16 * r;
                const int two_r = r + 1 < j->runs;
                int32_t *pb = part[rp - rp0];
                if (k0 == 0) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
                else {
                    _tile_loadd(0, pb, 64); _tile_loadd(1, pb + 256, 64);
                    _tile_loadd(2, pb + 512, 64); _tile_loadd(3, pb + 768, 64);
                }
                const uint8_t *xv = xs + 4 * v0;
                if (k0 == 0 && rp + 1 < rpairs) {
                    /* the next run pair's pixels under the last kernel row: the only lines of its B tiles that
                     * the pairs before did not bring in (one stream per quad plane: too many for the prefetcher) */
                    const uint8_t *nx = xv + 128 + 4 * j->toff[taps - j->KW];
                    for (int64_t q = 0; q < (int64_t)j->kg * steps; ++q) {
                        _mm_prefetch((const char *)(nx + q * plane), _MM_HINT_T0);
                        _mm_prefetch((const char *)(nx + q * plane + 64 + 4 * (j->KW - 1) * j->dw), _MM_HINT_T0);
                    }
                }
                for (int64_t ks = k0; ks < k1; ++ks) {
                    const int64_t t = ks / steps, s = ks - t * steps;
                    const int8_t *a = wo + ks * tb;
                    const uint8_t *b = xv + 4 * j->toff[t] + s * bstep;
                    qc_di8_amx_step(a, b, astride, ostride, plane, two_o, two_r);
                }
                qc_di8_amx_store(k1 == ksteps ? cbuf : pb);
                if (k1 == ksteps) qc_di8_amx_epi(j, n, ot, v0, cbuf, 0, NULL, two_o, two_r);
            }
        }
    }
    _tile_release();
}

/* several weight blocks (AMX): per run pair, block after block, each block's integer sums finished by its epilogue
 * (float partial sums per tile until the last block, the GEMM's order); no K chunks */
QC_TGT_AMX static void qc_di8_amx_run_blocks(const qc_di8_job *j, int64_t i0, int64_t i1)
{
    int32_t cbuf[4 * 256] __attribute__((aligned(64)));
    float part[4 * 256] __attribute__((aligned(64)));
    qc_di8_amx_config(j);
    const int64_t taps = (int64_t)j->KH * j->KW, astride = 4 * (int64_t)j->kg;
    const int64_t tb = 64 * (int64_t)j->kg, ostride = taps * j->steps * tb;
    const int64_t plane = j->plane, steps = j->steps, spb = j->spb, bq = j->bq, kg = j->kg;
    for (int64_t item = i0; item < i1; ++item) {
        qc_di8_amx_item it;
        qc_di8_amx_decode(j, item, &it);
        const int64_t n = it.n, ot = it.ot, rp0 = it.rp0, rp1 = it.rp1;
        const int two_o = it.two_o;
        const uint8_t *xs = it.xs;
        const int8_t *wo = it.wo;
        for (int64_t rp = rp0; rp < rp1; ++rp) {
            const int64_t r = 2 * rp, v0 = 16 * r;
            const int two_r = r + 1 < j->runs;
            const uint8_t *xv = xs + 4 * v0;
            for (int64_t blk = 0; blk < j->nblocks; ++blk) {
                _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                for (int64_t t = 0; t < taps; ++t)
                    for (int64_t jj = 0; jj < spb; ++jj) {
                        const int8_t *a = wo + (t * steps + blk * spb + jj) * tb;
                        const uint8_t *b = xv + 4 * j->toff[t] + (blk * bq + jj * kg) * plane;
                        qc_di8_amx_step(a, b, astride, ostride, plane, two_o, two_r);
                    }
                qc_di8_amx_store(cbuf);
                qc_di8_amx_epi(j, n, ot, v0, cbuf, blk, part, two_o, two_r);
            }
        }
    }
    _tile_release();
}

/* ------------------------------------------------------------------------------------------------ */
/* the same conv on AVX-512 VNNI (CPUs without AMX): pixels in the lanes, weights broadcast           */
/* ------------------------------------------------------------------------------------------------ */
/* One vpdpbusd multiplies 16 pixels x one quad (a 64-byte row of a B tile, U unsigned) by one output channel's
 * 4 weights of that quad (broadcast from its A-tile row, signed): the accumulators are the AMX ones, transposed
 * into registers, and the epilogue is the same. Register block: QC_DI8V_MR channels x NR (j->vnr: 3 or 2) runs
 * of 16 pixels (8*NR accumulators, NR pixel vectors, the broadcast weight folded into vpdpbusd). */
#define QC_DI8V_MR 8

static inline int64_t qc_di8_vnni_items(const qc_di8_job *j)
{
    return j->N * j->otiles * ((j->runs + j->vnr - 1) / j->vnr);
}

#define QC_DI8V_DECL3(m) __m512i c##m##0 = _mm512_setzero_si512(), c##m##1 = c##m##0, c##m##2 = c##m##0;
#define QC_DI8V_DECL2(m) __m512i c##m##0 = _mm512_setzero_si512(), c##m##1 = c##m##0;
#define QC_DI8V_W(m) const __m512i w##m = _mm512_set1_epi32(qc_load_i32((const uint8_t *)(a + (m) * astride + 4 * r)));
#define QC_DI8V_STEP3(m) { QC_DI8V_W(m) QC_DPBUSD(c##m##0, b0, w##m); QC_DPBUSD(c##m##1, b1, w##m); \
                           QC_DPBUSD(c##m##2, b2, w##m); }
#define QC_DI8V_STEP2(m) { QC_DI8V_W(m) QC_DPBUSD(c##m##0, b0, w##m); QC_DPBUSD(c##m##1, b1, w##m); }
#define QC_DI8V_ST(m, q) _mm512_store_si512((void *)(cbuf + 256 * (q) + 16 * (h * QC_DI8V_MR + (m))), c##m##q);
#define QC_DI8V_STORE3(m) { QC_DI8V_ST(m, 0) QC_DI8V_ST(m, 1) QC_DI8V_ST(m, 2) }
#define QC_DI8V_STORE2(m) { QC_DI8V_ST(m, 0) QC_DI8V_ST(m, 1) }
#define QC_DI8V_LOAD3 const __m512i b0 = _mm512_loadu_si512((const void *)b), \
        b1 = _mm512_loadu_si512((const void *)(b + 64)), b2 = _mm512_loadu_si512((const void *)(b + 128));
#define QC_DI8V_LOAD2 const __m512i b0 = _mm512_loadu_si512((const void *)b), \
        b1 = _mm512_loadu_si512((const void *)(b + 64));
#define QC_DI8V_ALL(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)

/* compute items i0 .. i1-1: item = (sample, 16-channel tile, group of NR runs), the group fastest; the blocks one
 * after the other, each finished by its epilogue (partial sums in `part` until the last) */
#define QC_DI8V_RUN(NAME, NR, DECL, LOAD, STEP, STORE)                                                             \
QC_TGT_VNNI static void NAME(const qc_di8_job *j, int64_t i0, int64_t i1)                                          \
{                                                                                                                  \
    int32_t cbuf[NR * 256] __attribute__((aligned(64)));                                                           \
    float part[NR * 256] __attribute__((aligned(64)));   /* several blocks: partial sums per run */                \
    const int64_t groups = (j->runs + NR - 1) / NR, taps = (int64_t)j->KH * j->KW;                                 \
    const int64_t tb = 64 * (int64_t)j->kg, ostride = taps * j->steps * tb, astride = 4 * (int64_t)j->kg;          \
    const int64_t plane = j->plane, steps = j->steps, kg = j->kg, spb = j->spb, bq = j->bq;                        \
    for (int64_t item = i0; item < i1; ++item) {                                                                   \
        const int64_t n = item / (j->otiles * groups), rem = item % (j->otiles * groups);                          \
        const int64_t ot = rem / groups, g = rem % groups, v0 = 16 * NR * g;                                       \
        const int64_t nr = j->runs - NR * g < NR ? j->runs - NR * g : NR;                                          \
        const uint8_t *xs = j->xq + n * j->sample_bytes + 4 * v0;                                                  \
        for (int64_t blk = 0; blk < j->nblocks; ++blk) {                                                           \
        for (int h = 0; h < 16 / QC_DI8V_MR && 16 * ot + h * QC_DI8V_MR < j->O; ++h) {                             \
            QC_DI8V_ALL(DECL)                                                                                      \
            for (int64_t t = 0; t < taps; ++t)                                                                     \
                for (int64_t jj = 0; jj < spb; ++jj) {                                                             \
                    const int64_t s = blk * spb + jj;                                                              \
                    const int8_t *a = j->wa + ot * ostride + (t * steps + s) * tb + h * QC_DI8V_MR * astride;      \
                    const uint8_t *b = xs + 4 * j->toff[t] + (blk * bq + jj * kg) * plane;                         \
                    /* the block's real quads only (blocks divide the channels): its padded rows add 0 */          \
                    const int64_t rmax = bq - jj * kg < kg ? bq - jj * kg : kg;                                    \
                    for (int64_t r = 0; r < rmax; ++r, b += plane) {                                               \
                        LOAD                                                                                       \
                        QC_DI8V_ALL(STEP)                                                                          \
                    }                                                                                              \
                }                                                                                                  \
            QC_DI8V_ALL(STORE)                                                                                     \
        }                                                                                                          \
        for (int64_t r = 0; r < nr; ++r) qc_di8_epi_block(j, n, ot, v0 + 16 * r, cbuf + 256 * r, blk, part + 256 * r); \
        }                                                                                                          \
    }                                                                                                              \
}
QC_DI8V_RUN(qc_di8_vnni_run3, 3, QC_DI8V_DECL3, QC_DI8V_LOAD3, QC_DI8V_STEP3, QC_DI8V_STORE3)
QC_DI8V_RUN(qc_di8_vnni_run2, 2, QC_DI8V_DECL2, QC_DI8V_LOAD2, QC_DI8V_STEP2, QC_DI8V_STORE2)

static void qc_di8_vnni_run(const qc_di8_job *j, int64_t i0, int64_t i1)
{
    if (j->vnr == 2) qc_di8_vnni_run2(j, i0, i1);
    else qc_di8_vnni_run3(j, i0, i1);
}
#undef QC_DI8V_RUN
#undef QC_DI8V_ALL
#undef QC_DI8V_DECL3
#undef QC_DI8V_DECL2
#undef QC_DI8V_W
#undef QC_DI8V_STEP3
#undef QC_DI8V_STEP2
#undef QC_DI8V_ST
#undef QC_DI8V_STORE3
#undef QC_DI8V_STORE2
#undef QC_DI8V_LOAD3
#undef QC_DI8V_LOAD2

#endif /* QC_HAVE_X86 */
#endif /* QCONV_DIRECT_INT8_H */
