/* Linear layers (N = H = W = 1) with int8 activations (act_quant="row"): a weight-streaming GEMV with
 * integer dot products: one launch (FUSED: every work-group quantizes x into local memory first) or two
 * (quant_x_a8, then gemv_a8 reading its words from global memory).
 *
 * quant_x_a8 (one work-group of QL items): xq = clip(round(x * 127/amax), -127, 127), dx = amax/127,
 * amax = max |x| (the oracle's "row" mode; 127/amax and amax/127 correctly rounded: the engine builds with
 * -cl-fp32-correctly-rounded-divide-sqrt), stored in the order gemv_a8 reads it; beside dx, the sum of
 * all xq (per-channel weights) or the sums per scale group (blockwise weights).
 *
 * gemv_a8: y[o] = act(dx * sum_g (s[o,g] * (sum_{k in g} q[o,k] xq[k]) + a[o,g] * sum_{k in g} xq[k]) + b[o]).
 * Weights: OpenCL1x1BufferLayout (16-byte chunks [KCH][OCp], KC = 32 int4 or 16 int8 input channels;
 * int4 element e of a word at bits 4e as q + 8, int8 as two's complement bytes). Products are 4-way
 * byte dot products (dp4a): int4 words split into their even and odd nibbles (w & 0x0F0F0F0F and
 * (w >> 4) & 0x0F0F0F0F, unsigned q + 8), so xq keeps each weight word's even and odd elements in
 * separate words; sum (q + 8) xq - 8 * sum xq = sum q xq with the group sums of xq, which the asymmetric
 * weights need anyway. The quantized x (8 KB for 8192 channels) is read from L1/L2 by every work-group.
 *
 * gemv_a8 NDRange (2-D, G work-groups of local size (L0, SPLIT), fixed at build time) over tiles of L0 * NC
 * output channels: work-group g takes tiles g, g + G, ... (the engine makes G the device's resident
 * work-groups or fewer, so x is quantized once per group and the tiles spread evenly). dim 0: NC output
 * channels per item (o and o + L0 inside the tile, so a 32-item sub-group loads 512 contiguous bytes per
 * chunk); dim 1: split-K lanes (lane lk takes chunks lk, lk + SPLIT, ...), partial sums reduced by a tree
 * of fixed shape in local memory. Integer sums are exact; per-channel scales apply once at the end,
 * blockwise ones once per scale group (rows too long for exact int32 sums: see Bounds below). Loads in flight: U chunks per item, issued before they are used:
 * a tile's first chunks load during the previous tile's reduction (the first tile's: during the fused
 * prologue, after x's loads). Registers bound this kernel (the loads in flight come from occupancy): the
 * fused prologue keeps x in registers only until it is packed into local memory.
 *
 * Build options: QBITS, KC, SCALE_HALF, ASYM, NBLK1 | GROUP_CH (input channels per scale group inside a
 * chunk: min(block, KC), a multiple of 8 for int4 and 4 for int8), BLOCK_CH, HAS_BIAS, ACT, OUT_NCHW,
 * G_IC (required) / G_OC, QL, L0, SPLIT, NC, U (chunks per channel loaded before any is used), FUSED
 * (L0 * SPLIT a power of two), NV_PTX (NVIDIA: PTX dp4a and warp shuffles).
 */
#ifndef QBITS
#error "QBITS must be defined (4 or 8)"
#endif
#ifndef U
#define U 4
#endif
#ifndef NC
#define NC 1
#endif
#define NW 4 /* 32-bit weight words per chunk */
#if QBITS == 4
#define EPW 8 /* elements per weight word */
#define XW 2  /* xq words per weight word: even, odd elements */
#else
#define EPW 4
#define XW 1
#endif
#ifdef NBLK1
#define GW NW
#else
#define GW (GROUP_CH / EPW) /* weight words per scale group */
#endif
#define NSG (NW / GW) /* scale groups per chunk */
#if QBITS == 4 || defined(ASYM)
#define NEED_GSUM
#endif

/* x[i .. i+3], zeros past IC */
inline float4 load_x4(__global const float *x, int i, int ic) {
    if (i + 4 <= ic)
        return vload4(0, x + i);
    return (float4)(i < ic ? x[i] : 0.0f, i + 1 < ic ? x[i + 1] : 0.0f, i + 2 < ic ? x[i + 2] : 0.0f, 0.0f);
}

#define WORD(v, i) ((i) == 0 ? (v).x : (i) == 1 ? (v).y : (i) == 2 ? (v).z : (v).w)

#define KP (CDIV(IC, KC) * KC) /* input channels padded to whole chunks (xq holds zeros past IC) */
#ifdef FUSED
#define QT (L0 * SPLIT)        /* items that quantize x: the GEMV's work-group */
#else
#define QT QL                  /* quant_x_a8's work-group */
#endif
#define NV CDIV(KP, 4 * QT)    /* float4 of x per quantizing item */
#define XG (GW * XW)           /* xq words per scale group (contiguous) */
#define SPLIT_P2                                                                                  \
    (SPLIT <= 1 ? 1 : SPLIT <= 2 ? 2 : SPLIT <= 4 ? 4 : SPLIT <= 8 ? 8 : SPLIT <= 16 ? 16 : SPLIT <= 32 ? 32 \
     : SPLIT <= 64 ? 64 : SPLIT <= 128 ? 128 : SPLIT <= 256 ? 256 : SPLIT <= 512 ? 512 : 1024)
#define NGS (KP / KC * NSG)    /* scale groups */
/* Bounds (the engine's A8_EXACT_MAX_IC and A8_MAX_NV): per-channel int32 sums over the whole row are exact
 * while IC * (largest product) < 2^31 (int8: 128 * 127; int4: unsigned nibbles (q + 8) * xq, 15 * 127).
 * Longer rows need -DA8_WIDE (int8 only: int4 rows that long exceed the register bound below): each lane
 * folds its int32 sum into a float before it holds more than A8_FOLD chunks (so it never overflows; a lane
 * folds once per 132,104 channels at most), and the split-K lanes add in float. Blockwise sums run over one
 * scale group of one chunk (<= 32 products). x is held in registers by the quantizing items: at most 256
 * float4 each. */
#if defined(NBLK1) && !defined(A8_WIDE) && defined(G_IC) && G_IC > (QBITS == 8 ? 132104 : 1127288)
#error "per-channel gemv_a8 past its int32 bound needs -DA8_WIDE"
#endif
#ifdef A8_WIDE
#if QBITS != 8 || !defined(NBLK1)
#error "A8_WIDE: per-channel int8 weights only"
#endif
#define A8_FOLD (132104 / KC) /* chunks an int32 lane sum can take */
#define RED_T float
#else
#define RED_T int
#endif
#if defined(G_IC) && NV > 256
#error "gemv_a8: more than 256 float4 of x per quantizing item"
#endif

/* Quantization of x by the QT items of one work-group (lid: linear id). load_x: item lid's NV float4
 * of x (all loads in flight; amax4: their max |x|); pack_x4: the xq bytes of x[i .. i+3] (i % 4 == 0) with
 * their sum; STORE_XQ: all of the item's, through STORE_X4: int4: the even elements of weight word i / 8
 * go to xq word 2 (i / 8), the odd ones to 2 (i / 8) + 1, each as byte pair (i / 4) % 2 (p.x, p.y); int8:
 * one word (p.x). GROUP_SUM: the sum of scale group g's xq bytes. */
inline void load_x(__global const float *x, float4 *v, int lid) {
#pragma unroll
    for (int j = 0; j < NV; ++j)
        v[j] = load_x4(x, 4 * (lid + j * QT), IC);
}

inline float amax4(const float4 *v) {
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
        const float4 a = fabs(v[j]);
        m = fmax(m, fmax(fmax(a.x, a.y), fmax(a.z, a.w)));
    }
    return m;
}

inline uint2 pack_x4(float4 v, float qs, int *sum) {
    const int q0 = quant_row(v.x, qs), q1 = quant_row(v.y, qs), q2 = quant_row(v.z, qs), q3 = quant_row(v.w, qs);
    *sum += (q0 + q1) + (q2 + q3);
#if QBITS == 4
    return (uint2)((q0 & 0xFF) | (q2 & 0xFF) << 8, (q1 & 0xFF) | (q3 & 0xFF) << 8);
#else
    return (uint2)((uint)(q0 & 0xFF) | (uint)(q1 & 0xFF) << 8 | (uint)(q2 & 0xFF) << 16 | (uint)q3 << 24, 0u);
#endif
}

#if QBITS == 4
#define STORE_X4(SPACE, xq, i, p)                                                                 \
    {                                                                                             \
        SPACE ushort *xs_ = (SPACE ushort *)(xq);                                                 \
        xs_[4 * ((i) / 8) + ((i) / 4) % 2] = (ushort)(p).x;                                       \
        xs_[4 * ((i) / 8) + 2 + ((i) / 4) % 2] = (ushort)(p).y;                                   \
    }
#else
#define STORE_X4(SPACE, xq, i, p) ((SPACE uint *)(xq))[(i) / 4] = (p).x;
#endif
/* item lid's float4 v[NV] (x[4 (lid + j QT) ...]) quantized into xq; total += their sum */
#define STORE_XQ(SPACE, xq, v, lid, qs, total)                                                    \
    _Pragma("unroll") for (int j_ = 0; j_ < NV; ++j_) {                                           \
        const int i_ = 4 * ((lid) + j_ * QT);                                                     \
        if (i_ < KP) {                                                                            \
            const uint2 p_ = pack_x4((v)[j_], qs, &(total));                                      \
            STORE_X4(SPACE, xq, i_, p_)                                                           \
        }                                                                                         \
    }
#define GROUP_SUM(xq, g, sg)                                                                      \
    {                                                                                             \
        sg = 0;                                                                                   \
        for (int t_ = 0; t_ < XG; ++t_)                                                           \
            sg = dp4a_ss((xq)[(g) * XG + t_], 0x01010101u, sg);                                   \
    }

#ifndef FUSED
/* one work-group of QL items (a power of two): xq words [KCH][NW][XW], dx = gsum_dx[0] and the sums of xq
 * (gsum_dx[1]: all of them (NBLK1); else gsum_dx[1 + kc * NSG + g] per scale group g of chunk kc). */
__kernel __attribute__((reqd_work_group_size(QL, 1, 1)))
void quant_x_a8(__global const float *x, __global uint *xq, __global int *gsum_dx, __local float *red,
                const int a_ic) {
    const int lid = get_local_id(0);
    float4 v[NV];
    load_x(x, v, lid);
    const float2 qd = row_params(work_group_amax(red, amax4(v), lid, QL));
    if (lid == 0)
        ((__global float *)gsum_dx)[0] = qd.y;
    int total = 0;
    STORE_XQ(__global, xq, v, lid, qd.x, total)
#ifdef NBLK1
    barrier(CLK_LOCAL_MEM_FENCE); /* red is reused */
    total = work_group_isum((__local int *)red, total, lid, QL);
    if (lid == 0)
        gsum_dx[1] = total;
#else
    barrier(CLK_GLOBAL_MEM_FENCE); /* this work-group's own xq writes */
    for (int g = lid; g < NGS; g += QL) {
        int sg;
        GROUP_SUM(xq, g, sg)
        gsum_dx[1 + g] = sg;
    }
#endif
}
#endif

#ifdef L0 /* the engine builds quant_x_a8 once without the local size, gemv_a8 once per local size */
#ifdef FUSED
#define XQ_SPACE __local
#define A8_INPUT __global const float *x /* the float input: quantized by every work-group */
#else
#define XQ_SPACE __global
#define A8_INPUT                                                                                  \
    __global const uint4 *xq,     /* quant_x_a8's words, NW * XW / 4 uint4 per chunk */           \
        __global const int *gsum_dx /* quant_x_a8's dx (float bits) and sums of xq */
#endif
__kernel __attribute__((reqd_work_group_size(L0, SPLIT, 1)))
void gemv_a8(const int gws0, A8_INPUT,
             __global const uint4 *wq,
             __global const SCALE_T *ws,
             __global const SCALE_T *wo,
             __global const float *bias,
             __global float *y,
             __local float *red, /* NC * L0 * SPLIT: the split-K reduction (FUSED: and x's amax) */
             const int a_ic, const int a_oc) {
    const int lid0 = get_local_id(0), lk = get_local_id(1);
    const int lin = lk * L0 + lid0;
    const int OCP = CDIV(OC, 4) * 4;
    const int KCH = CDIV(IC, KC);
    const int NT = CDIV(gws0, L0 * NC); /* tiles of L0 * NC output channels */
    int t = get_group_id(0);
    int ob, oc[NC];
#define SET_TILE(t)                                                                             \
    ob = (t) * (L0 * NC) + lid0;                                                                \
    _Pragma("unroll") for (int c = 0; c < NC; ++c)                                              \
        oc[c] = min(ob + c * L0, gws0 - 1); /* items past gws0 compute a copy of the last channel */

    uint4 wv[U][NC];
#ifndef NBLK1
    float sv[U][NC][NSG];
#ifdef ASYM
    float av[U][NC][NSG];
#endif
#endif
#ifdef NBLK1
#define LOAD_SCALES(j, c, kj)
#elif defined(ASYM)
#define LOAD_SCALES(j, c, kj)                                                                   \
    for (int g = 0; g < NSG; ++g) {                                                             \
        const int blk = min(((kj) * KC + g * GROUP_CH) / BLOCK_CH, IC / BLOCK_CH - 1);          \
        sv[j][c][g] = LOAD_S1(ws, blk * OCP + oc[c]);                                           \
        av[j][c][g] = LOAD_S1(wo, blk * OCP + oc[c]);                                           \
    }
#else
#define LOAD_SCALES(j, c, kj)                                                                   \
    for (int g = 0; g < NSG; ++g) {                                                             \
        const int blk = min(((kj) * KC + g * GROUP_CH) / BLOCK_CH, IC / BLOCK_CH - 1);          \
        sv[j][c][g] = LOAD_S1(ws, blk * OCP + oc[c]);                                           \
    }
#endif
#define LOAD_CHUNKS(k0)                                                                         \
    _Pragma("unroll") for (int j = 0; j < U; ++j) {                                             \
        const int kj = min((k0) + j * SPLIT, KCH - 1);                                          \
        _Pragma("unroll") for (int c = 0; c < NC; ++c) {                                        \
            wv[j][c] = wq[kj * OCP + oc[c]];                                                    \
            LOAD_SCALES(j, c, kj)                                                               \
        }                                                                                       \
    }

#ifdef FUSED
    __local uint4 xq[KP / 16]; /* xq words as quant_x_a8 stores them */
    __local int gs_l[NGS];
    float dxv;
    int tx; /* sum of all xq (NBLK1) */
    {
        float4 v[NV];
        load_x(x, v, lin); /* x first: the weights below would queue ahead of it */
        SET_TILE(t)
        LOAD_CHUNKS(lk) /* the first tile's first weights are in flight while x is quantized */
        const float2 qd = row_params(work_group_amax(red, amax4(v), lin, QT));
        dxv = qd.y;
        int total = 0;
        STORE_XQ(__local, xq, v, lin, qd.x, total)
        barrier(CLK_LOCAL_MEM_FENCE); /* red is reused; xq is complete */
#ifdef NBLK1
        tx = work_group_isum((__local int *)red, total, lin, QT);
        barrier(CLK_LOCAL_MEM_FENCE); /* everyone has read red before the split-K reduction reuses it */
#else
        for (int g = lin; g < NGS; g += QT) {
            int sg;
            GROUP_SUM((__local uint *)xq, g, sg)
            gs_l[g] = sg;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }
    __local const int *gsv = gs_l;
#else
    SET_TILE(t)
    LOAD_CHUNKS(lk)
    const float dxv = as_float(gsum_dx[0]);
    __global const int *gsv = gsum_dx + 1;
#ifdef NBLK1
    const int tx = gsv[0];
#endif
#endif

    /* tiles t, t + G, ... (G work-groups: the engine sizes the grid to the device's resident work-groups) */
    for (; t < NT; t += get_num_groups(0)) {
#ifdef NBLK1
        int ia[NC];
#ifdef A8_WIDE
        float fa[NC]; /* folded lane sums */
        int nk = 0;   /* chunks in ia since the last fold */
#endif
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            ia[c] = 0;
#ifdef A8_WIDE
            fa[c] = 0.0f;
#endif
        }
#else
        float acc[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c)
            acc[c] = 0.0f;
#endif
        for (int k = lk; k < KCH; k += U * SPLIT) {
            if (k != lk) { /* the first chunks were loaded ahead */
                LOAD_CHUNKS(k)
            }
#pragma unroll
            for (int j = 0; j < U; ++j) {
                const int kj = k + j * SPLIT;
                if (j > 0 && kj >= KCH)
                    break;
                uint xw[NW * XW];
#pragma unroll
                for (int w4 = 0; w4 < NW * XW / 4; ++w4) {
                    const uint4 v = xq[kj * (NW * XW / 4) + w4];
                    xw[4 * w4] = v.x;
                    xw[4 * w4 + 1] = v.y;
                    xw[4 * w4 + 2] = v.z;
                    xw[4 * w4 + 3] = v.w;
                }
#if defined(NEED_GSUM) && !defined(NBLK1)
                int gs[NSG];
#pragma unroll
                for (int g = 0; g < NSG; ++g)
                    gs[g] = gsv[kj * NSG + g];
#endif
#pragma unroll
                for (int c = 0; c < NC; ++c) {
#pragma unroll
                    for (int g = 0; g < NSG; ++g) {
                        int d = 0;
#pragma unroll
                        for (int wi = g * GW; wi < (g + 1) * GW; ++wi) {
                            const uint w = WORD(wv[j][c], wi);
#if QBITS == 4
                            d = dp4a_us(w & 0x0F0F0F0Fu, xw[2 * wi], d);
                            d = dp4a_us((w >> 4) & 0x0F0F0F0Fu, xw[2 * wi + 1], d);
#else
                            d = dp4a_ss(w, xw[wi], d);
#endif
                        }
#ifdef NBLK1
                        ia[c] += d;
#else
#if QBITS == 4
                        d -= 8 * gs[g];
#endif
#ifdef ASYM
                        acc[c] = fma(sv[j][c][g], (float)d, fma(av[j][c][g], (float)gs[g], acc[c]));
#else
                        acc[c] = fma(sv[j][c][g], (float)d, acc[c]);
#endif
#endif
                    }
                }
            }
#ifdef A8_WIDE
            nk += U;
            if (nk + U > A8_FOLD) {
#pragma unroll
                for (int c = 0; c < NC; ++c) {
                    fa[c] += (float)ia[c];
                    ia[c] = 0;
                }
                nk = 0;
            }
#endif
        }

        /* the next tile's first weights load during this tile's reduction */
        const int o0 = ob;
#ifdef NBLK1
        float s_o[NC];
#ifdef ASYM
        float a_o[NC];
#endif
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            s_o[c] = LOAD_S1(ws, oc[c]);
#ifdef ASYM
            a_o[c] = LOAD_S1(wo, oc[c]);
#endif
        }
#endif
        if (t + (int)get_num_groups(0) < NT) {
            SET_TILE(t + (int)get_num_groups(0))
            LOAD_CHUNKS(lk)
        }

        /* sum over the split-K lanes: a tree of fixed shape in local memory, red[c][lk][lid0] */
#pragma unroll
        for (int c = 0; c < NC; ++c)
#ifdef NBLK1
#ifdef A8_WIDE
            red[c * (L0 * SPLIT) + lin] = fa[c] + (float)ia[c];
#else
            ((__local int *)red)[c * (L0 * SPLIT) + lin] = ia[c];
#endif
#else
            red[c * (L0 * SPLIT) + lin] = acc[c];
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int h = SPLIT_P2 / 2; h > 0; h >>= 1) {
            if (lk < h && lk + h < SPLIT) {
#pragma unroll
                for (int c = 0; c < NC; ++c)
#ifdef NBLK1
                    ((__local RED_T *)red)[c * (L0 * SPLIT) + lin] += ((__local RED_T *)red)[c * (L0 * SPLIT) + lin + h * L0];
#else
                    red[c * (L0 * SPLIT) + lin] += red[c * (L0 * SPLIT) + lin + h * L0];
#endif
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        /* row lk = 0 is not written again before its items have read it (the next tile's writes to it
         * are their own) */
        if (lk == 0) {
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const int o = o0 + c * L0;
#ifdef NBLK1
                /* exact integer sums: q.xq (int4: minus 8 * sum xq) and sum xq */
                RED_T tq = ((__local RED_T *)red)[c * (L0 * SPLIT) + lid0];
#if QBITS == 4
                tq -= 8 * tx;
#endif
                float r = s_o[c] * (float)tq;
#ifdef ASYM
                r = fma(a_o[c], (float)tx, r);
#endif
#else
                const float r = red[c * (L0 * SPLIT) + lid0];
#endif
                if (o < gws0) {
                    const float v = ACTIVATE(fma(dxv, r, bias[o]));
#ifdef OUT_NCHW
                    if (o < OC)
                        y[o] = v;
#else
                    y[o] = o < OC ? v : 0.0f;
#endif
                }
            }
        }
    }
}
#endif /* L0 */
