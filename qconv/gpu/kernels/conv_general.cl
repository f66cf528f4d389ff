/* General weight-quantized conv (any kernel, stride, padding, dilation, groups).
 *
 * One work-item computes CB blocks of 4 output channels x HB output rows x WB output columns:
 * (CB, HB, WB) = (1,1,1) c4h1w1, (1,1,2) c4h1w2, (1,4,1) c4h4w1, (2,2,1) c8h2w1, (2,4,1) c8h4w1,
 * (1,1,4) c4h1w4, (2,1,4) c8h1w4, (1,2,4) c4h2w4, (2,2,4) c8h2w4, (4,1,4) c16h1w4, (2,1,8) c8h1w8.
 * Split-K (-DSPLIT=L > 1): dim 2 of the NDRange is exactly L items (local size L in dim 2); they take
 * contiguous ranges of input-channel groups (aligned to scale blocks) and lane 0 adds the partial sums
 * from local memory in a fixed order (batch-1 layers have too few outputs to fill a GPU otherwise).
 *
 * NDRange (2-D): gws0 = ceil(ceil(O/4)/CB) * ceil(OW/WB)  (channel-block group major, column block minor:
 * neighbouring items share weights and read neighbouring pixels), gws1 = N * ceil(OH/HB). The launch
 * size is rounded up to the local size; items past (gws0, gws1) return at once (no barriers here).
 *
 * Build options (besides common.cl): CB, HB, WB; WPACK (OpenCLConvWeightLayout.ic_pack);
 *   IC_LEAVE  I % 4 != 0: input lanes >= I of the last block are masked to 0 (robust to any padding);
 *   OC_LANE_LEAVE  O % 4 != 0: padding lanes of the last output block are written as 0 (NC4HW4) or
 *             skipped (NCHW);
 *   C_LEAVE   ceil(O/4) % CB != 0: the second channel block of the last item is skipped, weight and
 *             scale reads included (the seed read past the weights there, mnn-semantics s.6 item 7);
 *   H_LEAVE / W_LEAVE  OH % HB / OW % WB != 0: rows/columns past the output are not stored;
 *   BLOCK_ALIGN4  BLOCK_CH % 4 == 0 (one scale block per 4 input channels);
 *   GROUPED   groups > 1 (per-lane input channels); DEPTHWISE  groups == I_total == O (one input channel
 *             per output channel, read as a float4).
 * Arguments: geometry I (per group), O, groups, kh, kw, sh, sw, ph, pw, dh, dw; input N, IH, IW; output
 * OH, OW. Weights (uchar stream), scales/offsets ([n_blocks][OCp], SCALE_T), bias (float [OCp]).
 */

#ifndef QBITS
#error "QBITS must be defined (4 or 8)"
#endif

#ifndef CB
#define CB 1
#endif
#ifndef HB
#define HB 1
#endif
#ifndef WB
#define WB 1
#endif
#ifndef WPACK
#define WPACK 4
#endif
#ifndef SPLIT
#define SPLIT 1 /* split-K lanes = the local size in dim 2 (a build option, like conv_1x1's) */
#endif

/* one input value of channel c (of all CIN channels) at (n, iy, ix); caller checks bounds */
inline float load_x1(__global const float *x, int c, int n, int iy, int ix, int N, int CIN, int IH, int IW) {
#ifdef IN_NCHW
    return x[((n * CIN + c) * IH + iy) * IW + ix];
#else
    return x[((((c >> 2) * N + n) * IH + iy) * IW + ix) * 4 + (c & 3)];
#endif
}

/* the 4 input channels 4*c4 .. 4*c4+3 at (n, iy, ix); lanes >= CIN read as 0 in NCHW (never out of
   bounds); in NC4HW4 they are read (they exist) and masked by the caller under IC_LEAVE */
inline float4 load_x4(__global const float *x, int c4, int n, int iy, int ix, int N, int CIN, int IH, int IW) {
#ifdef IN_NCHW
    const int hw = IH * IW;
    const int base = ((n * CIN + 4 * c4) * IH + iy) * IW + ix;
    const int left = CIN - 4 * c4;
    if (left >= 4)
        return (float4)(x[base], x[base + hw], x[base + 2 * hw], x[base + 3 * hw]);
    return (float4)(x[base], left > 1 ? x[base + hw] : 0.0f, left > 2 ? x[base + 2 * hw] : 0.0f, 0.0f);
#else
    return vload4(0, x + ((((c4 * N + n) * IH + iy) * IW + ix) << 2));
#endif
}

/* q values (not yet scaled) of the 4 input lanes t of unit u: q0..q3 are float4 over 4 output lanes */
#if WPACK == 4
#if QBITS == 8
#define LOAD_Q(u, ustride)                                                       \
    {                                                                            \
        const uint4 _q = vload4((u), (__global const uint *)wq);                 \
        q0 = q8x4(_q.x);                                                         \
        q1 = q8x4(_q.y);                                                         \
        q2 = q8x4(_q.z);                                                         \
        q3 = q8x4(_q.w);                                                         \
    }
#else
#define LOAD_Q(u, ustride)                                                       \
    {                                                                            \
        const uint2 _q = vload2((u), (__global const uint *)wq);                 \
        q0 = q4x4(_q.x, 0);                                                      \
        q1 = q4x4(_q.x, 16);                                                     \
        q2 = q4x4(_q.y, 0);                                                      \
        q3 = q4x4(_q.y, 16);                                                     \
    }
#endif
#else /* WPACK == 1: the unit of input lane t is at u + t * ustride */
#if QBITS == 8
#define LOAD_Q1(u) q8x4(((__global const uint *)wq)[u])
#else
#define LOAD_Q1(u) q4x4((uint)(((__global const ushort *)wq)[u]), 0)
#endif
#define LOAD_Q(u, ustride)                                                       \
    {                                                                            \
        q0 = LOAD_Q1(u);                                                         \
        q1 = LOAD_Q1((u) + (ustride));                                           \
        q2 = LOAD_Q1((u) + 2 * (ustride));                                       \
        q3 = LOAD_Q1((u) + 3 * (ustride));                                       \
    }
#endif

/* How the scales are applied (all three compute sum_l (q_l*s + a)*x_l in float32):
 *   SCALE_AT_END  per-channel scales: acc = sum q*x (and sx = sum x when ASYM) over everything, then
 *                 y = s*acc + a*sx once (grouped convs only when symmetric: their sx differs per lane);
 *   BLOCK_FLUSH   blocks of a multiple of 4 channels (ungrouped): the same per block, added into tot;
 *   otherwise     w = q*s + a in registers, weight by weight (blocks not aligned to 4 input lanes). */
#if defined(NBLK1) && (!defined(ASYM) || !defined(GROUPED))
#define SCALE_AT_END
#elif defined(BLOCK_ALIGN4) && !defined(GROUPED)
#define BLOCK_FLUSH
#endif
#if defined(ASYM) && (defined(SCALE_AT_END) || defined(BLOCK_FLUSH))
#define SUMX
#endif
#if defined(SCALE_AT_END) || defined(BLOCK_FLUSH)
#define DEQ(qv, cb, t) (qv)
#elif defined(ASYM)
#define DEQ(qv, cb, t) ((qv) * sc[cb][t] + of[cb][t])
#else
#define DEQ(qv, cb, t) ((qv) * sc[cb][t])
#endif

__kernel void conv_general(const int gws0, const int gws1,
                           __global const float *x,
                           __global const uchar *wq,
                           __global const SCALE_T *ws,
                           __global const SCALE_T *wo,
                           __global const float *bias,
                           __global float *y,
                           __local float *red,
                           const int N, const int IH, const int IW, const int OH, const int OW,
                           const int a_ic, const int a_oc, const int a_groups,
                           const int a_kh, const int a_kw, const int a_sh, const int a_sw,
                           const int a_ph, const int a_pw, const int a_dh, const int a_dw) {
    const int g0 = get_global_id(0);
    const int g1 = get_global_id(1);
#if SPLIT > 1
    /* split-K: the SPLIT items of dim 2 take contiguous input-channel ranges; items past the launch
       take part in the barrier and store nothing */
    const bool valid = g0 < gws0 && g1 < gws1;
    const int lk = get_local_id(2);
#else
    if (g0 >= gws0 || g1 >= gws1)
        return;
#endif

    const int IC4 = CDIV(IC, 4);
    const int O4 = CDIV(OC, 4);
    const int OCP = O4 * 4;
    const int KK = KH * KW;
    const int CIN = IC * GROUPS;
    const int OWB = CDIV(OW, WB);
    const int OHB = CDIV(OH, HB);
    const int cg = g0 / OWB;
    const int ox0 = (g0 - cg * OWB) * WB;
    const int n = g1 / OHB;
    const int oy0 = (g1 - n * OHB) * HB;
    const int oc4_0 = cg * CB;
#ifdef GROUPED
    const int OCG = OC / GROUPS;
#endif
#if WPACK == 4
    const int ustride = 0;
#else
    const int ustride = O4 * KK;
#endif

    float4 acc[CB][HB][WB];
#ifdef BLOCK_FLUSH
    float4 tot[CB][HB][WB];
#endif
#ifdef SUMX
    float sx[HB][WB];
#pragma unroll
    for (int h = 0; h < HB; ++h)
#pragma unroll
        for (int w = 0; w < WB; ++w)
            sx[h][w] = 0.0f;
#endif
    float4 sc[CB][4];
#ifdef ASYM
    float4 of[CB][4];
#endif
#pragma unroll
    for (int cb = 0; cb < CB; ++cb) {
#pragma unroll
        for (int h = 0; h < HB; ++h)
#pragma unroll
            for (int w = 0; w < WB; ++w) {
                acc[cb][h][w] = (float4)(0.0f);
#ifdef BLOCK_FLUSH
                tot[cb][h][w] = (float4)(0.0f);
#endif
            }
    }

#ifndef NBLK1
#pragma unroll
    for (int cb = 0; cb < CB; ++cb)
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            sc[cb][t] = (float4)(0.0f); /* defined even for an empty split-K range */
#ifdef ASYM
            of[cb][t] = (float4)(0.0f);
#endif
        }
#endif
#ifdef NBLK1
#pragma unroll
    for (int cb = 0; cb < CB; ++cb) {
        const int oc4 = min(oc4_0 + cb, O4 - 1); /* clamped: never read past the scales */
        const float4 s = LOAD_S4(ws, oc4 * 4);
#ifdef ASYM
        const float4 a = LOAD_S4(wo, oc4 * 4);
#endif
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            sc[cb][t] = s;
#ifdef ASYM
            of[cb][t] = a;
#endif
        }
    }
#endif

#if SPLIT > 1
#ifdef BLOCK_FLUSH
    const int CHUNK_AL = BLOCK_CH / 4;
#else
    const int CHUNK_AL = 1;
#endif
    const int chunk = CDIV(CDIV(IC4, SPLIT), CHUNK_AL) * CHUNK_AL;
    const int ic4_lo = valid ? min(lk * chunk, IC4) : IC4;
    const int ic4_hi = min(ic4_lo + chunk, IC4);
#else
    const int ic4_lo = 0;
    const int ic4_hi = IC4;
#endif
    for (int ic4 = ic4_lo; ic4 < ic4_hi; ++ic4) {
#ifndef NBLK1
        {
            const int nblk = IC / BLOCK_CH;
#pragma unroll
            for (int cb = 0; cb < CB; ++cb) {
                const int oc4 = min(oc4_0 + cb, O4 - 1);
#ifdef BLOCK_ALIGN4
                const int blk = (4 * ic4) / BLOCK_CH;
                const float4 s = LOAD_S4(ws, blk * OCP + oc4 * 4);
#ifdef ASYM
                const float4 a = LOAD_S4(wo, blk * OCP + oc4 * 4);
#endif
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    sc[cb][t] = s;
#ifdef ASYM
                    of[cb][t] = a;
#endif
                }
#else
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    const int blk = min((4 * ic4 + t) / BLOCK_CH, nblk - 1);
                    sc[cb][t] = LOAD_S4(ws, blk * OCP + oc4 * 4);
#ifdef ASYM
                    of[cb][t] = LOAD_S4(wo, blk * OCP + oc4 * 4);
#endif
                }
#endif
            }
        }
#endif
        for (int ky = 0; ky < KH; ++ky) {
            int iy[HB];
#pragma unroll
            for (int h = 0; h < HB; ++h)
                iy[h] = (oy0 + h) * SH - PH + ky * DH;
            for (int kx = 0; kx < KW; ++kx) {
                int ix[WB];
#pragma unroll
                for (int w = 0; w < WB; ++w)
                    ix[w] = (ox0 + w) * SW - PW + kx * DW;
#ifndef GROUPED
                /* input: 4 channels per pixel, shared by every output block */
                float4 xv[HB][WB];
#pragma unroll
                for (int h = 0; h < HB; ++h) {
#pragma unroll
                    for (int w = 0; w < WB; ++w) {
                        const bool inside = iy[h] >= 0 && iy[h] < IH && ix[w] >= 0 && ix[w] < IW;
                        float4 v = inside ? load_x4(x, ic4, n, iy[h], ix[w], N, CIN, IH, IW) : (float4)(0.0f);
#ifdef IC_LEAVE
                        v = mask_lanes(v, 4 * ic4, IC);
#endif
                        xv[h][w] = v;
#ifdef SUMX
                        sx[h][w] += (v.x + v.y) + (v.z + v.w);
#endif
                    }
                }
#endif
                const int k = ky * KW + kx;
#pragma unroll
                for (int cb = 0; cb < CB; ++cb) {
                    const int oc4 = oc4_0 + cb;
#ifdef C_LEAVE
                    if (oc4 >= O4)
                        break;
#endif
                    float4 q0, q1, q2, q3;
                    const int u = ((ic4 * (4 / WPACK)) * O4 + oc4) * KK + k;
                    LOAD_Q(u, ustride);
                    const float4 w0 = DEQ(q0, cb, 0);
                    const float4 w1 = DEQ(q1, cb, 1);
                    const float4 w2 = DEQ(q2, cb, 2);
                    const float4 w3 = DEQ(q3, cb, 3);
#ifndef GROUPED
#pragma unroll
                    for (int h = 0; h < HB; ++h) {
#pragma unroll
                        for (int w = 0; w < WB; ++w) {
                            const float4 v = xv[h][w];
                            float4 a = acc[cb][h][w];
                            a += v.x * w0;
                            a += v.y * w1;
                            a += v.z * w2;
                            a += v.w * w3;
                            acc[cb][h][w] = a;
                        }
                    }
#elif defined(DEPTHWISE)
                    /* one input channel per output channel: lane j reads channel 4*oc4 + j; rows t >= 1
                       are padding input channels and are skipped */
#pragma unroll
                    for (int h = 0; h < HB; ++h) {
#pragma unroll
                        for (int w = 0; w < WB; ++w) {
                            const bool inside = iy[h] >= 0 && iy[h] < IH && ix[w] >= 0 && ix[w] < IW;
                            float4 v = inside ? load_x4(x, oc4, n, iy[h], ix[w], N, CIN, IH, IW) : (float4)(0.0f);
#ifdef OC_LANE_LEAVE
                            v = mask_lanes(v, 4 * oc4, OC);
#endif
                            acc[cb][h][w] += v * w0;
                        }
                    }
#else
                    /* grouped: lane j reads channel group(j) * IC + 4*ic4 + t */
                    int cbase[4];
                    bool lane_ok[4];
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const int oc = 4 * oc4 + j;
                        lane_ok[j] = oc < OC;
                        cbase[j] = (min(oc, OC - 1) / OCG) * IC + 4 * ic4;
                    }
#pragma unroll
                    for (int h = 0; h < HB; ++h) {
#pragma unroll
                        for (int w = 0; w < WB; ++w) {
                            const bool inside = iy[h] >= 0 && iy[h] < IH && ix[w] >= 0 && ix[w] < IW;
                            if (!inside)
                                continue;
                            float4 a = acc[cb][h][w];
                            float4 xt[4];
#pragma unroll
                            for (int t = 0; t < 4; ++t) {
                                const bool tok = 4 * ic4 + t < IC;
                                float lanes[4];
#pragma unroll
                                for (int j = 0; j < 4; ++j)
                                    lanes[j] = (tok && lane_ok[j])
                                                   ? load_x1(x, cbase[j] + t, n, iy[h], ix[w], N, CIN, IH, IW)
                                                   : 0.0f;
                                xt[t] = (float4)(lanes[0], lanes[1], lanes[2], lanes[3]);
                            }
                            a += xt[0] * w0;
                            a += xt[1] * w1;
                            a += xt[2] * w2;
                            a += xt[3] * w3;
                            acc[cb][h][w] = a;
                        }
                    }
#endif
                }
            }
        }
#ifdef BLOCK_FLUSH
        if ((4 * (ic4 + 1)) % BLOCK_CH == 0) { /* last 4 channels of a block: apply its scale */
#pragma unroll
            for (int cb = 0; cb < CB; ++cb) {
#pragma unroll
                for (int h = 0; h < HB; ++h) {
#pragma unroll
                    for (int w = 0; w < WB; ++w) {
#ifdef SUMX
                        tot[cb][h][w] += acc[cb][h][w] * sc[cb][0] + sx[h][w] * of[cb][0];
#else
                        tot[cb][h][w] += acc[cb][h][w] * sc[cb][0];
#endif
                        acc[cb][h][w] = (float4)(0.0f);
                    }
                }
            }
#ifdef SUMX
#pragma unroll
            for (int h = 0; h < HB; ++h)
#pragma unroll
                for (int w = 0; w < WB; ++w)
                    sx[h][w] = 0.0f;
#endif
        }
#endif
    }

    /* pre-bias results (scales applied) */
    float4 pre[CB][HB][WB];
#pragma unroll
    for (int cb = 0; cb < CB; ++cb)
#pragma unroll
        for (int h = 0; h < HB; ++h)
#pragma unroll
            for (int w = 0; w < WB; ++w) {
#if defined(BLOCK_FLUSH)
#if SPLIT > 1
                /* a range ending inside a block (never, with aligned chunks): flush what is left */
#ifdef SUMX
                pre[cb][h][w] = tot[cb][h][w] + acc[cb][h][w] * sc[cb][0] + sx[h][w] * of[cb][0];
#else
                pre[cb][h][w] = tot[cb][h][w] + acc[cb][h][w] * sc[cb][0];
#endif
#else
                pre[cb][h][w] = tot[cb][h][w];
#endif
#elif defined(SCALE_AT_END) && defined(SUMX)
                pre[cb][h][w] = acc[cb][h][w] * sc[cb][0] + sx[h][w] * of[cb][0];
#elif defined(SCALE_AT_END)
                pre[cb][h][w] = acc[cb][h][w] * sc[cb][0];
#else
                pre[cb][h][w] = acc[cb][h][w];
#endif
            }
#if SPLIT > 1
    {
        const int NV = CB * HB * WB;
        const int l01 = get_local_size(0) * get_local_size(1);
        const int lin = get_local_id(1) * get_local_size(0) + get_local_id(0);
        __local float *mine = red + ((lk * l01 + lin) * NV) * 4;
#pragma unroll
        for (int cb = 0; cb < CB; ++cb)
#pragma unroll
            for (int h = 0; h < HB; ++h)
#pragma unroll
                for (int w = 0; w < WB; ++w)
                    vstore4(pre[cb][h][w], (cb * HB + h) * WB + w, mine);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lk == 0) {
            for (int j = 1; j < SPLIT; ++j) {
                __local const float *other = red + ((j * l01 + lin) * NV) * 4;
#pragma unroll
                for (int cb = 0; cb < CB; ++cb)
#pragma unroll
                    for (int h = 0; h < HB; ++h)
#pragma unroll
                        for (int w = 0; w < WB; ++w)
                            pre[cb][h][w] += vload4((cb * HB + h) * WB + w, other);
            }
        }
    }
    if (lk != 0 || !valid)
        return;
#endif

    /* epilogue: bias, activation, padding lanes, store */
#pragma unroll
    for (int cb = 0; cb < CB; ++cb) {
        const int oc4 = oc4_0 + cb;
#ifdef C_LEAVE
        if (oc4 >= O4)
            break;
#endif
#ifdef HAS_BIAS
        const float4 b = vload4(0, bias + oc4 * 4);
#else
        const float4 b = (float4)(0.0f);
#endif
#pragma unroll
        for (int h = 0; h < HB; ++h) {
            const int oy = oy0 + h;
#ifdef H_LEAVE
            if (oy >= OH)
                break;
#endif
#pragma unroll
            for (int w = 0; w < WB; ++w) {
                const int ox = ox0 + w;
#ifdef W_LEAVE
                if (ox >= OW)
                    break;
#endif
                float4 v = ACTIVATE(pre[cb][h][w] + b);
#ifdef OC_LANE_LEAVE
                v = mask_lanes(v, oc4 * 4, OC);
#endif
#ifdef OUT_NCHW
                const int ohw = OH * OW;
                const int base = ((n * OC + 4 * oc4) * OH + oy) * OW + ox;
                y[base] = v.x;
#ifdef OC_LANE_LEAVE
                const int left = OC - 4 * oc4;
                if (left > 1) y[base + ohw] = v.y;
                if (left > 2) y[base + 2 * ohw] = v.z;
                if (left > 3) y[base + 3 * ohw] = v.w;
#else
                y[base + ohw] = v.y;
                y[base + 2 * ohw] = v.z;
                y[base + 3 * ohw] = v.w;
#endif
#else
                vstore4(v, 0, y + ((((oc4 * N + n) * OH + oy) * OW + ox) << 2));
#endif
            }
        }
    }
}
