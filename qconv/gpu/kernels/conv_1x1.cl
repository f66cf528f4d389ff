/* 1x1, stride 1, unpadded conv (GEMV / GEMM): y[m, o] = sum_c x[m, c] * w[o, c] over rows m = (n, p),
 * M = N*H*W rows. H = W = 1 is the linear layer (GEMV for N = 1).
 *
 * NDRange (3-D):
 *   dim 0: ceil(OCp / NC) channel groups, NC = 1, 2 or 4 output channels per work-item;
 *   dim 1: split-K lanes, exactly the local size L = SPLIT (build option) in dim 1: the items of a work-group take the K chunks
 *          k = lk, lk + L, ... and add their partial sums in local memory in a fixed order (lane 0 first),
 *          so a weight-streaming GEMV has enough items in flight;
 *   dim 2: ceil(M / NB) row groups, NB = 1, 2 or 4 rows per item (batch blocking when H = W = 1, pixel
 *          blocking otherwise): each weight chunk read serves NB rows.
 * The launch size in dim 0 is rounded up to the local size; items past gws0 / gws2 take part in the
 * barrier and store nothing.
 *
 * Weights: OpenCL1x1BufferLayout (16-byte chunks, KC = 16 int8 or 32 int4 channels) as uint4, or
 * OpenCL1x1ImageLayout (USE_IMAGE: the same 16 bytes as an RGBA signed-int32 texel (o, k), read_imagei).
 * Scales/offsets: OpenCLScaleLayout [n_blocks][OCp].
 *
 * Build options (besides common.cl): NC, NB, KC; USE_IMAGE; IC_LEAVE (I % KC != 0: input lanes >= I read
 * as 0, never out of bounds); OC_LANE_LEAVE (O % 4 != 0: padding lanes written as 0 in NC4HW4, skipped in
 * NCHW); HW1 (H = W = 1: NCHW rows are contiguous); SG = input lanes per scale group (a multiple of 4
 * dividing KC and BLOCK_CH: one scale per group), or LANE_SCALE (blocks not aligned to 4 lanes).
 * Per-channel (NBLK1) scales are applied once at the end; blockwise ones once per scale group:
 * sum_l (q_l*s + a)*x_l = s*sum_l q_l*x_l + a*sum_l x_l, the same dequantised weights in fewer operations.
 */

#ifndef QBITS
#error "QBITS must be defined (4 or 8)"
#endif


#ifndef NC
#define NC 4
#endif
#ifndef NB
#define NB 1
#endif
#ifndef SPLIT
#define SPLIT 1 /* the local size in dim 1 (a build option: PoCL mishandles a barrier under a run-time branch) */
#endif
#ifndef KC
#error "KC must be defined (OpenCL1x1BufferLayout.ic_pack)"
#endif
#define NG (KC / 4) /* float4 groups per chunk */
#if defined(NBLK1) || !defined(SG)
#define GPS NG
#else
#define GPS (SG / 4) /* float4 groups per scale group */
#endif

#ifdef USE_IMAGE
__constant sampler_t SMP = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_NONE | CLK_FILTER_NEAREST;
#define WEIGHT_ARG __read_only image2d_t wimg
#define LOAD_W(k, o) as_uint4(read_imagei(wimg, SMP, (int2)((o), (k))))
#else
#define WEIGHT_ARG __global const uint4 *wq
#define LOAD_W(k, o) wq[(k) * OCP + (o)]
#endif

/* float4 group v (input lanes 4v .. 4v+3 of the chunk) of a 16-byte weight chunk, as q values */
inline float4 qgroup(uint4 wv, int v) {
#if QBITS == 8
    const uint word = v == 0 ? wv.x : v == 1 ? wv.y : v == 2 ? wv.z : wv.w;
    return q8x4(word);
#else
    const int wi = v >> 1;
    const uint word = wi == 0 ? wv.x : wi == 1 ? wv.y : wi == 2 ? wv.z : wv.w;
    return q4x4(word, (uint)(v & 1) * 16u);
#endif
}

#if QBITS == 4 && !defined(LANE_SCALE) && GPS % 2 == 0
#define Q4_CLASSES /* whole words per scale group: the shift-free decode below */
#endif
#ifdef Q4_CLASSES
/* The 8 int4 codes of a word with one AND/OR each (no shifts but one): code e sits at bits 4e (e < 5) of
 * w or at bits 4(e-3) of w >> 12 (e >= 5); or'ed into the mantissa of 2**23 it is 2**23 + n*16**c exactly
 * (class c = e for e < 5, e - 3 above), and subtracting 2**23 + 8*16**c leaves q*16**c exactly. Sums of
 * one class are scaled by 16**-c once (exact powers of two). */
#define Q4_CLASS(l) ((l) % 8 < 5 ? (l) % 8 : (l) % 8 - 3)
inline void q4x8_classes(uint w, float *q) {
    const uint m = 0x4B000000u;
    const uint w2 = w >> 12;
    q[0] = as_float((w & 0xFu) | m) - 8388616.0f;
    q[1] = as_float((w & 0xF0u) | m) - 8388736.0f;
    q[2] = as_float((w & 0xF00u) | m) - 8390656.0f;
    q[3] = as_float((w & 0xF000u) | m) - 8421376.0f;
    q[4] = as_float((w & 0xF0000u) | m) - 8912896.0f;
    q[5] = as_float((w2 & 0xF00u) | m) - 8390656.0f;
    q[6] = as_float((w2 & 0xF000u) | m) - 8421376.0f;
    q[7] = as_float((w2 & 0xF0000u) | m) - 8912896.0f;
}
#endif

/* input channels 4*c4 .. 4*c4+3 of row m (= n*HW + p) */
inline float4 load_row4(__global const float *x, int c4, int m, int M, int HW, int CIN) {
#ifdef IN_NCHW
#ifdef HW1
    const int base = m * CIN + 4 * c4;
    const int left = CIN - 4 * c4;
    if (left >= 4)
        return vload4(0, x + base);
    if (left <= 0)
        return (float4)(0.0f);
    return (float4)(x[base], left > 1 ? x[base + 1] : 0.0f, left > 2 ? x[base + 2] : 0.0f, 0.0f);
#else
    const int n = m / HW;
    const int base = (n * CIN + 4 * c4) * HW + (m - n * HW);
    const int left = CIN - 4 * c4;
    if (left >= 4)
        return (float4)(x[base], x[base + HW], x[base + 2 * HW], x[base + 3 * HW]);
    if (left <= 0)
        return (float4)(0.0f);
    return (float4)(x[base], left > 1 ? x[base + HW] : 0.0f, left > 2 ? x[base + 2 * HW] : 0.0f, 0.0f);
#endif
#else
#ifdef IC_LEAVE
    if (4 * c4 >= CIN)
        return (float4)(0.0f);
    return mask_lanes(vload4(0, x + ((c4 * M + m) << 2)), 4 * c4, CIN);
#else
    return vload4(0, x + ((c4 * M + m) << 2));
#endif
#endif
}

__kernel void conv_1x1(const int gws0, const int gws2,
                       __global const float *x,
                       WEIGHT_ARG,
                       __global const SCALE_T *ws,
                       __global const SCALE_T *wo,
                       __global const float *bias,
                       __global float *y,
                       __local float *red,
                       const int M, const int HW, const int a_ic, const int a_oc) {
    const int og = get_global_id(0);
    const int mg = get_global_id(2);
    const int lid0 = get_local_id(0);
    const int l0 = get_local_size(0);
    const int lk = get_local_id(1);
    const int L = SPLIT;
    const bool valid = og < gws0 && mg < gws2;

    const int O4 = CDIV(OC, 4);
    const int OCP = O4 * 4;
    const int KCH = CDIV(IC, KC);
    const int o0 = og * NC;
    const int m0 = mg * NB;

    float acc[NB][NC];
#ifdef NBLK1
    float accx[NB];
#endif
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#ifdef NBLK1
        accx[b] = 0.0f;
#endif
#pragma unroll
        for (int c = 0; c < NC; ++c)
            acc[b][c] = 0.0f;
    }

    if (valid) {
        for (int k = lk; k < KCH; k += L) {
            float4 xs[NB][NG];
            float sxs[NB][NG / GPS];
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const int m = m0 + b;
#pragma unroll
                for (int v = 0; v < NG; ++v)
                    xs[b][v] = m < M ? load_row4(x, k * NG + v, m, M, HW, IC) : (float4)(0.0f);
#if defined(ASYM) && !defined(LANE_SCALE)
#pragma unroll
                for (int g = 0; g < NG / GPS; ++g) {
                    float s = 0.0f;
#pragma unroll
                    for (int v = g * GPS; v < (g + 1) * GPS; ++v)
                        s += (xs[b][v].x + xs[b][v].y) + (xs[b][v].z + xs[b][v].w);
                    sxs[b][g] = s;
                }
#ifdef NBLK1
#pragma unroll
                for (int g = 0; g < NG / GPS; ++g)
                    accx[b] += sxs[b][g];
#endif
#endif
            }
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const int o = o0 + c;
                const uint4 wv = LOAD_W(k, o);
#ifdef LANE_SCALE
                /* blocks not aligned to 4 lanes: dequantise lane by lane */
                const int nblk = IC / BLOCK_CH;
#pragma unroll
                for (int v = 0; v < NG; ++v) {
                    const int ch = k * KC + 4 * v;
                    const int4 blk = min((int4)(ch) + (int4)(0, 1, 2, 3), (int4)(IC - 1)) / (int4)(BLOCK_CH);
                    const int4 idx = min(blk, (int4)(nblk - 1)) * OCP + (int4)(o);
                    const float4 s = (float4)(LOAD_S1(ws, idx.x), LOAD_S1(ws, idx.y), LOAD_S1(ws, idx.z), LOAD_S1(ws, idx.w));
                    float4 wf = qgroup(wv, v) * s;
#ifdef ASYM
                    wf += (float4)(LOAD_S1(wo, idx.x), LOAD_S1(wo, idx.y), LOAD_S1(wo, idx.z), LOAD_S1(wo, idx.w));
#endif
#pragma unroll
                    for (int b = 0; b < NB; ++b)
                        acc[b][c] += dot(wf, xs[b][v]);
                }
#else
#pragma unroll
                for (int g = 0; g < NG / GPS; ++g) {
#ifdef Q4_CLASSES
                    /* int4, 8 lanes per word: q * 16**class, summed per class, classes joined once */
                    float qs[GPS * 4];
#pragma unroll
                    for (int wi = 0; wi < GPS / 2; ++wi) {
                        const int gw = g * GPS / 2 + wi;
                        q4x8_classes(gw == 0 ? wv.x : gw == 1 ? wv.y : gw == 2 ? wv.z : wv.w, qs + 8 * wi);
                    }
#else
                    float4 qv[GPS];
#pragma unroll
                    for (int v = 0; v < GPS; ++v)
                        qv[v] = qgroup(wv, g * GPS + v);
#endif
#ifndef NBLK1
                    /* clamped: groups past I (zero inputs) must not read past the scales */
                    const int blk = min((k * KC + g * GPS * 4) / BLOCK_CH, IC / BLOCK_CH - 1);
                    const float s = LOAD_S1(ws, blk * OCP + o);
#ifdef ASYM
                    const float a = LOAD_S1(wo, blk * OCP + o);
#endif
#endif
#pragma unroll
                    for (int b = 0; b < NB; ++b) {
#ifdef Q4_CLASSES
                        float dc[5] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                        for (int v = 0; v < GPS; ++v) {
                            const float4 xv = xs[b][g * GPS + v];
                            const int l = 4 * v;
                            dc[Q4_CLASS(l)] = fma(qs[l], xv.x, dc[Q4_CLASS(l)]);
                            dc[Q4_CLASS(l + 1)] = fma(qs[l + 1], xv.y, dc[Q4_CLASS(l + 1)]);
                            dc[Q4_CLASS(l + 2)] = fma(qs[l + 2], xv.z, dc[Q4_CLASS(l + 2)]);
                            dc[Q4_CLASS(l + 3)] = fma(qs[l + 3], xv.w, dc[Q4_CLASS(l + 3)]);
                        }
                        const float d = dc[0] + 0x1p-4f * dc[1] + 0x1p-8f * dc[2] + 0x1p-12f * dc[3]
                                        + 0x1p-16f * dc[4];
#else
                        float d = 0.0f;
#pragma unroll
                        for (int v = 0; v < GPS; ++v)
                            d += dot(qv[v], xs[b][g * GPS + v]);
#endif
#ifdef NBLK1
                        acc[b][c] += d;
#elif defined(ASYM)
                        acc[b][c] += s * d + a * sxs[b][g];
#else
                        acc[b][c] += s * d;
#endif
                    }
                }
#endif
            }
        }
#ifdef NBLK1
        /* per-channel: acc = s * sum(q x) + a * sum(x) */
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const float s = LOAD_S1(ws, o0 + c);
#ifdef ASYM
            const float a = LOAD_S1(wo, o0 + c);
#endif
#pragma unroll
            for (int b = 0; b < NB; ++b) {
#ifdef ASYM
                acc[b][c] = s * acc[b][c] + a * accx[b];
#else
                acc[b][c] = s * acc[b][c];
#endif
            }
        }
#endif
    }

    /* split-K: lane 0 adds the partial sums of lanes 1 .. L-1, in order */
#if SPLIT > 1
    {
        const int slot = (lk * l0 + lid0) * (NB * NC);
#pragma unroll
        for (int b = 0; b < NB; ++b)
#pragma unroll
            for (int c = 0; c < NC; ++c)
                red[slot + b * NC + c] = acc[b][c];
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lk == 0) {
            for (int j = 1; j < L; ++j) {
                const int s2 = (j * l0 + lid0) * (NB * NC);
#pragma unroll
                for (int b = 0; b < NB; ++b)
#pragma unroll
                    for (int c = 0; c < NC; ++c)
                        acc[b][c] += red[s2 + b * NC + c];
            }
        }
    }
#endif
    if (lk != 0 || !valid)
        return;

    float bv[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
#ifdef HAS_BIAS
        bv[c] = bias[o0 + c];
#else
        bv[c] = 0.0f;
#endif
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        const int m = m0 + b;
        if (m >= M)
            break;
        float v[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            v[c] = ACTIVATE(acc[b][c] + bv[c]);
#ifdef OC_LANE_LEAVE
            v[c] = o0 + c < OC ? v[c] : 0.0f;
#endif
        }
#ifdef OUT_NCHW
        const int n = m / HW;
        const int p = m - n * HW;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
#ifdef OC_LANE_LEAVE
            if (o0 + c < OC)
#endif
                y[(n * OC + o0 + c) * HW + p] = v[c];
        }
#else
        __global float *dst = y + (((o0 >> 2) * M + m) << 2) + (o0 & 3);
#if NC == 4
        vstore4((float4)(v[0], v[1], v[2], v[3]), 0, dst);
#elif NC == 2
        vstore2((float2)(v[0], v[1]), 0, dst);
#else
        dst[0] = v[0];
#endif
#endif
    }
}

/* ---------------------------------------------------------------------------------------------------
 * gemv_1x1: the N = H = W = 1 case (a linear layer on one row) as a weight stream.
 *
 * NDRange (2-D): dim 0: one output channel per item, rounded up to the local size (adjacent items read
 * adjacent 16-byte chunks of one K row: a sub-group of 32 reads 512 contiguous bytes per load); dim 1:
 * split-K lanes, exactly the local size SPLIT (lane lk takes chunks lk, lk + SPLIT, ...). Each item issues
 * U independent chunk loads (and their scales) before decoding any, so U x 16 bytes per item are in
 * flight. Per scale group: acc += s * sum(q x) + a * sum(x); the sums of x per scale group (ASYM only)
 * are computed once per work-group into local memory. Partial sums are reduced in local memory in a
 * fixed order (lane 0 first). The input and output rows are contiguous in both NCHW and NC4HW4 when
 * M = 1 (NC4HW4 also writes its padding lanes, as 0).
 *
 * Build options: those of conv_1x1 (QBITS, KC, SG / NBLK1, ASYM, IC_LEAVE, ...; not LANE_SCALE, not
 * USE_IMAGE), U (chunks per item in flight), SPLIT.
 */
#ifndef U
#define U 4
#endif
#define NSG (NG / GPS) /* scale groups per chunk */

#ifdef IC_LEAVE
#define GEMV_X4(c4) load_row4(x, (c4), 0, 1, 1, IC)
#else
#define GEMV_X4(c4) vload4((c4), x)
#endif

__kernel void gemv_1x1(const int gws0,
                       __global const float *x,
                       __global const uint4 *wq,
                       __global const SCALE_T *ws,
                       __global const SCALE_T *wo,
                       __global const float *bias,
                       __global float *y,
                       __local float *red,
                       const int a_ic, const int a_oc) {
    const int og = get_global_id(0);
    const int lid0 = get_local_id(0);
    const int l0 = get_local_size(0);
    const int lk = get_local_id(1);
    const int OCP = CDIV(OC, 4) * 4;
    const int KCH = CDIV(IC, KC);
    const int o = min(og, gws0 - 1); /* items past gws0 compute a copy of the last channel, store nothing */

#ifdef ASYM
    /* sums of x per scale group, once per work-group */
    __local float *sx = red + l0 * SPLIT;
    {
        const int lin = lk * l0 + lid0;
        const int ngr = KCH * NSG;
        for (int g = lin; g < ngr; g += l0 * SPLIT) {
            float s = 0.0f;
#pragma unroll
            for (int v = 0; v < GPS; ++v) {
                const float4 xv = GEMV_X4(g * GPS + v);
                s += (xv.x + xv.y) + (xv.z + xv.w);
            }
            sx[g] = s;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#endif

    float acc = 0.0f;
#if defined(ASYM) && defined(NBLK1)
    float accx = 0.0f;
#endif

    int k = lk;
    for (; k < KCH; k += U * SPLIT) {
        uint4 wv[U];
#ifndef NBLK1
        float sv[U][NSG];
#ifdef ASYM
        float av[U][NSG];
#endif
#endif
        /* issue every load of the U chunks first (chunks past K: a valid chunk, skipped below) */
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const int kj = min(k + j * SPLIT, KCH - 1);
            wv[j] = wq[kj * OCP + o];
#ifndef NBLK1
#pragma unroll
            for (int g = 0; g < NSG; ++g) {
                const int blk = min((kj * KC + g * GPS * 4) / BLOCK_CH, IC / BLOCK_CH - 1);
                sv[j][g] = LOAD_S1(ws, blk * OCP + o);
#ifdef ASYM
                av[j][g] = LOAD_S1(wo, blk * OCP + o);
#endif
            }
#endif
        }
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const int kj = k + j * SPLIT;
            if (j > 0 && kj >= KCH)
                break;
#pragma unroll
            for (int g = 0; g < NSG; ++g) {
                float4 xs[GPS];
#pragma unroll
                for (int v = 0; v < GPS; ++v)
                    xs[v] = GEMV_X4(kj * NG + g * GPS + v);
#ifdef Q4_CLASSES
                float qs[GPS * 4];
#pragma unroll
                for (int wi = 0; wi < GPS / 2; ++wi) {
                    const int gw = g * GPS / 2 + wi;
                    q4x8_classes(gw == 0 ? wv[j].x : gw == 1 ? wv[j].y : gw == 2 ? wv[j].z : wv[j].w, qs + 8 * wi);
                }
                float dc[5] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int v = 0; v < GPS; ++v) {
                    const int l = 4 * v;
                    dc[Q4_CLASS(l)] = fma(qs[l], xs[v].x, dc[Q4_CLASS(l)]);
                    dc[Q4_CLASS(l + 1)] = fma(qs[l + 1], xs[v].y, dc[Q4_CLASS(l + 1)]);
                    dc[Q4_CLASS(l + 2)] = fma(qs[l + 2], xs[v].z, dc[Q4_CLASS(l + 2)]);
                    dc[Q4_CLASS(l + 3)] = fma(qs[l + 3], xs[v].w, dc[Q4_CLASS(l + 3)]);
                }
                const float d = dc[0] + 0x1p-4f * dc[1] + 0x1p-8f * dc[2] + 0x1p-12f * dc[3] + 0x1p-16f * dc[4];
#else
                float d = 0.0f;
#pragma unroll
                for (int v = 0; v < GPS; ++v)
                    d += dot(qgroup(wv[j], g * GPS + v), xs[v]);
#endif
#ifdef NBLK1
                acc += d;
#ifdef ASYM
                accx += sx[kj * NSG + g];
#endif
#elif defined(ASYM)
                acc += sv[j][g] * d + av[j][g] * sx[kj * NSG + g];
#else
                acc += sv[j][g] * d;
#endif
            }
        }
    }
#ifdef NBLK1
#ifdef ASYM
    acc = LOAD_S1(ws, o) * acc + LOAD_S1(wo, o) * accx;
#else
    acc = LOAD_S1(ws, o) * acc;
#endif
#endif

#if SPLIT > 1
    red[lk * l0 + lid0] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lk != 0)
        return;
    for (int j = 1; j < SPLIT; ++j)
        acc += red[j * l0 + lid0];
#endif
    if (og >= gws0)
        return;
    const float v = ACTIVATE(acc + bias[og]);
#ifdef OUT_NCHW
    if (og < OC)
        y[og] = v;
#else
    y[og] = og < OC ? v : 0.0f;
#endif
}
