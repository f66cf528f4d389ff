/* Implicit GEMM on int8 tensor cores for ungrouped convs with act_quant="row" (batched linear layers
 * are 1x1 convs): y[o][p] = act(dx[n] * sum_b (s[o,b] * A[o,p,b] + a[o,b] * S[p,b]) + bias[o]) over
 * output channels o and pixels p = (n, oy, ox), P = N*OH*OW, with the exact integer sums
 * A[o,p,b] = sum_{k in block b} q[o,k] xq[k,p] and S[p,b] = sum_{k in b} xq[k,p] (the oracle's
 * integer_parts; padding taps and channels are 0).
 *
 * Operands: xq, the int8 activations of quant_rows_i8 (act_quant.cl) in NC4HW4(32) words [CH32][N][H][W][8];
 * weights in OpenCLMMAWeightLayout (rows padded to MMA_OCP, K in steps of 32 channels x 1 tap, step
 * s = chunk * KH*KW + tap; int4 as nibbles q + 8, low nibbles of word j = elements 8j .. 8j+3).
 *
 * A work-group of NTH = 32 * WM * WN items (WM x WN warps) computes a TM x TN tile (TM = 16 * MT * WM output
 * channels, TN = 8 * NT * WN pixels); each warp a (16 MT) x (8 NT) sub-tile of m16n8k32 products. A stage
 * is KSUB consecutive layout steps (contiguous in each weight row): the group stages their TM x 32 KSUB
 * weights (int4 decoded to int8 bytes) and 32 KSUB x TN inputs (implicit im2col) in local memory,
 * double-buffered: the global loads of stage t+1 are in flight while stage t multiplies, one barrier a stage.
 * Local rows are 8 words, the two halves of rows 4..7 (mod 8) swapped, so the fragment loads of a warp hit
 * 32 different banks. ASYM: the loading items also sum each 16-byte piece of input (dp4a with ones) into
 * local memory beside the tile, for S.
 *
 * Integer sums run over one scale block (BLOCK_STEPS = BLOCK_CH / 32 chunks x all taps) or, per-channel
 * (NBLK1), over at most 4096 steps (int32 cannot overflow: 4096 * 32 * 128 * 127 < 2^31), then fold into
 * float accumulators: facc += s * A (+ a * S). KSUB divides KSTEPS, and BLOCK_STEPS divides KSUB or KSUB
 * divides BLOCK_STEPS (the engine picks it so).
 *
 * -DNV_PTX: mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 through inline PTX (sm_80 and newer).
 * Elsewhere each item computes the same four products of its fragment from local memory with dp4a_ss
 * (slow; it lets a CPU OpenCL test everything except the PTX fragment mapping).
 *
 * Fragment mapping (PTX ISA, m16n8k32 .s8): with g = lane / 4 and c = lane % 4,
 *   A (row-major, 16 x 32): a0 = row g, bytes 4c..4c+3; a1 = row g+8; a2 = row g, bytes 16+4c..; a3 = row g+8
 *   B (col-major, 32 x 8):  b0 = column g, bytes 4c..4c+3; b1 = column g, bytes 16+4c..
 *   C (16 x 8, s32):        c0, c1 = row g, columns 2c, 2c+1; c2, c3 = row g+8.
 *
 * NDRange: (ceil(P/TN) * NTH, ceil(O/TM)), local size (NTH, 1).
 * Build options: QBITS, MMA_OCP, SCALE_HALF, ASYM, NBLK1 | BLOCK_CH (a multiple of 32), HAS_BIAS, ACT,
 *   OUT_NCHW, G_IC, G_OC, G_KH, G_KW, G_SH, G_SW, G_PH, G_PW, G_DH, G_DW (all required), WM, WN, MT, NT,
 *   KSUB, NV_PTX.
 * Arguments: xq (uint4), dx (float [N]), weights (uint4), scales/offsets ([n_blocks][OCp4], SCALE_T),
 *   bias (float [OCp4]), y (float NCHW or NC4HW4); N, IH, IW, OH, OW.
 */
#if !defined(G_IC) || !defined(G_OC) || !defined(G_KH) || !defined(G_DW)
#error "conv_mma needs the specialised geometry (-DG_IC, -DG_OC, -DG_KH ... -DG_DW)"
#endif
#if !defined(WM) || !defined(WN) || !defined(MT) || !defined(NT)
#error "WM, WN, MT, NT must be defined"
#endif

#ifndef KSUB
#define KSUB 1
#endif
#define NTH (32 * WM * WN)
#define TM (16 * MT * WM)
#define TN (8 * NT * WN)
#define TAPS (KH * KW)
#define NCH CDIV(IC, 32)          /* chunks of 32 input channels */
#define KSTEPS (NCH * TAPS)       /* layout steps */
#define NSTAGE (KSTEPS / KSUB)
#define OCP4 (CDIV(OC, 4) * 4)    /* scale / bias rows */
#if QBITS == 8
#define SQ 2                      /* 16-byte weight loads per row and layout step */
#else
#define SQ 1
#endif
#define ROWQ (KSTEPS * SQ)        /* 16-byte weight loads per row */
#ifdef NBLK1
#define BLOCK_STEPS (KSTEPS < 4096 ? KSTEPS : 4096)
#else
#define BLOCK_STEPS (BLOCK_CH / 32 * TAPS)
#endif
#if defined(NBLK1) && !defined(ASYM) && KSTEPS <= 4096
#define ONE_FOLD /* symmetric per-channel scales, one fold of the int32 sums: in the epilogue, no float accumulators */
#endif
#define NA (TM * SQ * KSUB)       /* weight loads per stage */
#define NB (TN * 2 * KSUB)        /* input loads per stage (32 bytes a pixel and layout step) */
#define RA CDIV(NA, NTH)
#define RB CDIV(NB, NTH)
/* word w of local row r (8 words a row; halves swapped on rows 4..7 mod 8) */
#define SWZ(r, w) ((r) * 8 + ((w) ^ ((((r) >> 2) & 1) << 2)))
/* uint4 half h (words 4h .. 4h+3) of local row r */
#define SWZ4(r, h) ((r) * 2 + ((h) ^ (((r) >> 2) & 1)))

#if KSTEPS % KSUB != 0
#error "KSUB must divide the layout steps"
#endif

/* int4 codes q + 8 in the four bytes of v (each 0..15) -> the int8 q bytes */
inline uint nib_to_s8(uint v) {
    return ((v | 0x80808080u) - 0x08080808u) ^ 0x80808080u;
}

#ifdef NV_PTX
inline void mma_s8(int *d, uint a0, uint a1, uint a2, uint a3, uint b0, uint b1) {
    int e0, e1, e2, e3;
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};"
                 : "=r"(e0), "=r"(e1), "=r"(e2), "=r"(e3)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(d[0]), "r"(d[1]), "r"(d[2]),
                   "r"(d[3]));
    d[0] = e0;
    d[1] = e1;
    d[2] = e2;
    d[3] = e3;
}
#endif

/* sum over the 32 bytes of local A row ra and local B column cb */
inline int dot32(__local const uint *sa, int ra, __local const uint *sb, int cb) {
    int acc = 0;
    for (int w = 0; w < 8; w++)
        acc = dp4a_ss(sa[SWZ(ra, w)], sb[SWZ(cb, w)], acc);
    return acc;
}

__kernel __attribute__((reqd_work_group_size(NTH, 1, 1)))
void conv_mma(__global const uint4 *xq, __global const float *dxs, __global const uint4 *wq,
              __global const SCALE_T *ws, __global const SCALE_T *wo, __global const float *bias,
              __global float *y, const int N, const int IH, const int IW, const int OH, const int OW) {
    __local uint sA[2][KSUB][TM * 8] __attribute__((aligned(16)));
    __local uint sB[2][KSUB][TN * 8] __attribute__((aligned(16)));
#ifdef ASYM
    __local int sS[2][KSUB][TN * 2]; /* input sums of the two 16-byte halves of each pixel */
#endif
    const int lid = get_local_id(0);
    const int lane = lid % 32, warp = lid / 32;
    const int g = lane / 4, c = lane % 4;
    const int wm = warp / WN, wn = warp % WN;
    const int P = N * OH * OW;
    const int p0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM;

    /* input slots of this item: e = (kk * TN + pixel) * 2 + half */
    int xbase[RB], iy0[RB], ix0[RB];
    for (int r = 0; r < RB; r++) {
        const int e = lid + r * NTH;
        const int p = p0 + (e / 2) % TN;
        if (e < NB && p < P) {
            const int n = p / (OH * OW), q = p % (OH * OW);
            xbase[r] = n * IH * IW;
            iy0[r] = (q / OW) * SH - PH;
            ix0[r] = (q % OW) * SW - PW;
        } else {
            xbase[r] = 0;
            iy0[r] = -(1 << 28); /* never inside the image */
            ix0[r] = 0;
        }
    }
    uint4 ra[RA], rb[RB];

/* the global loads of stage t: weights (row, then its KSUB * SQ contiguous 16-byte pieces), inputs */
#define LOAD_STAGE(t)                                                                               \
    {                                                                                               \
        for (int r = 0; r < RA; r++) {                                                              \
            const int e = lid + r * NTH;                                                            \
            if (NA % NTH == 0 || e < NA)                                                            \
                ra[r] = wq[(m0 + e / (SQ * KSUB)) * ROWQ + (t) * (SQ * KSUB) + e % (SQ * KSUB)];    \
        }                                                                                           \
        for (int r = 0; r < RB; r++) {                                                              \
            const int e = lid + r * NTH;                                                            \
            const int ls = (t) * KSUB + e / (2 * TN);                                               \
            const int ch = ls / TAPS, tap = ls % TAPS;                                              \
            const int iy = iy0[r] + (tap / KW) * DH, ix = ix0[r] + (tap % KW) * DW;                 \
            const bool in = (NB % NTH == 0 || e < NB) && iy >= 0 && iy < IH && ix >= 0 && ix < IW;  \
            rb[r] = in ? xq[((ch * N * IH * IW) + xbase[r] + iy * IW + ix) * 2 + e % 2] : (uint4)(0u); \
        }                                                                                           \
    }

#if QBITS == 8
#define STORE_A(buf)                                                                                \
    for (int r = 0; r < RA; r++) {                                                                  \
        const int e = lid + r * NTH;                                                                \
        if (NA % NTH == 0 || e < NA) {                                                              \
            const int kk = (e % (2 * KSUB)) / 2;                                                    \
            ((__local uint4 *)sA[buf][kk])[SWZ4(e / (2 * KSUB), e % 2)] = ra[r];                    \
        }                                                                                           \
    }
#else
#define STORE_A(buf)                                                                                \
    for (int r = 0; r < RA; r++) {                                                                  \
        const int e = lid + r * NTH;                                                                \
        if (NA % NTH == 0 || e < NA) {                                                              \
            const int row = e / KSUB, kk = e % KSUB;                                                \
            const uint4 v = ra[r], lo = v & (uint4)(0x0F0F0F0Fu), hi = (v >> 4) & (uint4)(0x0F0F0F0Fu); \
            ((__local uint4 *)sA[buf][kk])[SWZ4(row, 0)] =                                          \
                (uint4)(nib_to_s8(lo.x), nib_to_s8(hi.x), nib_to_s8(lo.y), nib_to_s8(hi.y));        \
            ((__local uint4 *)sA[buf][kk])[SWZ4(row, 1)] =                                          \
                (uint4)(nib_to_s8(lo.z), nib_to_s8(hi.z), nib_to_s8(lo.w), nib_to_s8(hi.w));        \
        }                                                                                           \
    }
#endif
#ifdef ASYM
#define STORE_SUM(buf, kk, e, v)                                                                    \
    sS[buf][kk][(e) % (2 * TN)] =                                                                   \
        dp4a_ss((v).w, 0x01010101u, dp4a_ss((v).z, 0x01010101u, dp4a_ss((v).y, 0x01010101u, dp4a_ss((v).x, 0x01010101u, 0))));
#else
#define STORE_SUM(buf, kk, e, v)
#endif
#define STORE_B(buf)                                                                                \
    for (int r = 0; r < RB; r++) {                                                                  \
        const int e = lid + r * NTH;                                                                \
        if (NB % NTH == 0 || e < NB) {                                                              \
            const int kk = e / (2 * TN);                                                            \
            ((__local uint4 *)sB[buf][kk])[SWZ4((e / 2) % TN, e % 2)] = rb[r];                      \
            STORE_SUM(buf, kk, e, rb[r])                                                            \
        }                                                                                           \
    }

#ifndef ONE_FOLD
    float facc[MT][NT][4];
#endif
    int iacc[MT][NT][4];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
#ifndef ONE_FOLD
                facc[mi][ni][e] = 0.0f;
#endif
                iacc[mi][ni][e] = 0;
            }
#ifdef ASYM
    int psum[NT][2]; /* S of this item's columns over the current block */
#pragma unroll
    for (int ni = 0; ni < NT; ni++)
        psum[ni][0] = psum[ni][1] = 0;
#endif

    LOAD_STAGE(0)
    STORE_A(0)
    STORE_B(0)
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int t = 0; t < NSTAGE; t++) {
        const int buf = t & 1;
        if (t + 1 < NSTAGE)
            LOAD_STAGE(t + 1)
#pragma unroll
        for (int kk = 0; kk < KSUB; kk++) {
            __local const uint *la = sA[buf][kk];
            __local const uint *lb = sB[buf][kk];
#ifdef NV_PTX
            uint af[MT][4];
#pragma unroll
            for (int mi = 0; mi < MT; mi++) {
                const int r = (wm * MT + mi) * 16 + g;
                af[mi][0] = la[SWZ(r, c)];
                af[mi][1] = la[SWZ(r + 8, c)];
                af[mi][2] = la[SWZ(r, c + 4)];
                af[mi][3] = la[SWZ(r + 8, c + 4)];
            }
#pragma unroll
            for (int ni = 0; ni < NT; ni++) {
                const int col = (wn * NT + ni) * 8 + g;
                const uint b0 = lb[SWZ(col, c)], b1 = lb[SWZ(col, c + 4)];
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
                    mma_s8(iacc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], b0, b1);
            }
#else
            for (int mi = 0; mi < MT; mi++) {
                const int r = (wm * MT + mi) * 16 + g;
                for (int ni = 0; ni < NT; ni++) {
                    const int col = (wn * NT + ni) * 8 + 2 * c;
                    iacc[mi][ni][0] += dot32(la, r, lb, col);
                    iacc[mi][ni][1] += dot32(la, r, lb, col + 1);
                    iacc[mi][ni][2] += dot32(la, r + 8, lb, col);
                    iacc[mi][ni][3] += dot32(la, r + 8, lb, col + 1);
                }
            }
#endif
#ifdef ASYM
#pragma unroll
            for (int ni = 0; ni < NT; ni++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int col = (wn * NT + ni) * 8 + 2 * c + j;
                    psum[ni][j] += sS[buf][kk][2 * col] + sS[buf][kk][2 * col + 1];
                }
#endif
#ifndef ONE_FOLD
            const int ls = t * KSUB + kk;
            if ((ls + 1) % BLOCK_STEPS == 0 || ls + 1 == KSTEPS) {
                /* fold the block's integer sums into the float accumulators */
                const int blk = ls / BLOCK_STEPS;
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int o = min(m0 + (wm * MT + mi) * 16 + g + 8 * h, OC - 1);
#ifdef NBLK1 /* one scale row: blk counts the 4096-step folds, not scale blocks */
                        const float sc = LOAD_S1(ws, o);
#ifdef ASYM
                        const float of = LOAD_S1(wo, o);
#endif
#else
                        const float sc = LOAD_S1(ws, blk * OCP4 + o);
#ifdef ASYM
                        const float of = LOAD_S1(wo, blk * OCP4 + o);
#endif
#endif
#pragma unroll
                        for (int ni = 0; ni < NT; ni++)
#pragma unroll
                            for (int j = 0; j < 2; j++) {
                                float v = fma(sc, (float)iacc[mi][ni][2 * h + j], facc[mi][ni][2 * h + j]);
#ifdef ASYM
                                v = fma(of, (float)psum[ni][j], v);
#endif
                                facc[mi][ni][2 * h + j] = v;
                                iacc[mi][ni][2 * h + j] = 0;
                            }
                    }
#ifdef ASYM
#pragma unroll
                for (int ni = 0; ni < NT; ni++)
                    psum[ni][0] = psum[ni][1] = 0;
#endif
            }
#endif
        }
        if (t + 1 < NSTAGE) {
            STORE_A(buf ^ 1)
            STORE_B(buf ^ 1)
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    /* epilogue: dx, bias, activation; NC4HW4 padding lanes (OC <= o < OCP4) written as 0 */
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int o = m0 + (wm * MT + mi) * 16 + g + 8 * h;
#ifdef HAS_BIAS
            const float b = bias[min(o, OCP4 - 1)];
#else
            const float b = 0.0f;
#endif
#ifdef ONE_FOLD
            const float sc = LOAD_S1(ws, min(o, OC - 1));
#endif
#pragma unroll
            for (int ni = 0; ni < NT; ni++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int p = p0 + (wn * NT + ni) * 8 + 2 * c + j;
                    if (p >= P)
                        continue;
                    const int n = p / (OH * OW), q = p % (OH * OW);
#ifdef ONE_FOLD
                    const float acc = sc * (float)iacc[mi][ni][2 * h + j];
#else
                    const float acc = facc[mi][ni][2 * h + j];
#endif
                    const float v = ACTIVATE(fma(dxs[n], acc, b));
#ifdef OUT_NCHW
                    if (o < OC)
                        y[(n * OC + o) * (OH * OW) + q] = v;
#else
                    if (o < OCP4)
                        y[(((o / 4) * N + n) * (OH * OW) + q) * 4 + o % 4] = o < OC ? v : 0.0f;
#endif
                }
        }
}
