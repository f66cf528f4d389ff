/* Tiled implicit GEMM for ungrouped weight-quantized convs: y[o][p] = sum_k w[o][k] * x[k][p] over output
 * channels o, pixels p = (n, oy, ox) (P = N*OH*OW; rows m = (n, h, w) of a 1x1 conv / linear layer) and
 * k = (input channel, tap) (implicit im2col: zero padding, stride, dilation).
 *
 * A work-group of NTX x NTY = (TN/RN) x (TM/RM) items computes a TM (channels) x TN (pixels) tile; item
 * (tx, ty) owns o = o0 + ty*RM + i, p = p0 + tx*RN + j (i < RM, j < RN). K is walked in tiles of KT:
 *   weights in OpenCLConvWeightLayout (ic_pack 4): one group of 4 input channels x all taps, KT = 4*KH*KW,
 *       k = 4*tap + lane (a layout unit holds 4 input lanes x 4 output lanes of one tap);
 *   WL_1X1, weights in OpenCL1x1BufferLayout: KT = 32 input channels (KT/KC 16-byte chunks per channel).
 * Per K tile the work-group decodes its TM x KT weights once into local memory, dequantised
 * (w = q*s + a in float32: the oracle's weights), gathers the KT x TN inputs into local memory, and every
 * item does RM*RN FMAs per k from registers. The global loads of tile t+1 are issued before the FMAs of
 * tile t (register prefetch), so the loads of one work-group overlap its own arithmetic.
 *
 * Split-K inside the work-group (KS > 1, for long K and few tiles: linear layers): KS slices of NTX x NTY
 * items (dim 2) take the K tiles ks, ks + KS, ... with their own local tiles; slice 0 adds the partial
 * sums of slices 1 .. KS-1 in order (deterministic) and stores.
 *
 * NDRange: (ceil(P/TN)*NTX, ceil(O/TM)*NTY, KS), local size (NTX, NTY, KS) exactly.
 * Build options (besides common.cl): TM, TN, RM, RN, KS; WL_1X1 (+ KC); the specialised geometry
 *   (G_IC, G_OC and, without WL_1X1, G_KH ... G_DW: KT must be a compile-time constant); IC_LEAVE
 *   (input lanes >= I read as 0: NC4HW4 padding lanes may hold anything); OC_LANE_LEAVE; BLOCK_ALIGN4
 *   (BLOCK_CH % 4 == 0: one scale per 4 input lanes); B_KFAST (1x1, NCHW, H = W = 1: neighbouring items
 *   gather neighbouring input channels of one row, which are contiguous there).
 * Arguments: x (float32 NCHW or NC4HW4), weights (uchar stream), scales/offsets ([n_blocks][OCp],
 *   SCALE_T), bias (float [OCp]), y; N, IH, IW, OH, OW.
 */

#ifndef QBITS
#error "QBITS must be defined (4 or 8)"
#endif
#if !defined(G_IC) || !defined(G_OC)
#error "conv_gemm needs the specialised channel counts (-DG_IC, -DG_OC)"
#endif
#if !defined(TM) || !defined(TN) || !defined(RM) || !defined(RN)
#error "TM, TN, RM, RN must be defined"
#endif

#ifndef KS
#define KS 1
#endif
#define NTX (TN / RN)
#define NTY (TM / RM)
#define NT (NTX * NTY)
#ifdef WL_1X1
#define KHW 1
#define KT 32
#define KCT (KT / KC)       /* 16-byte chunks per output channel and K tile */
#define UNITS (KCT * TM)    /* 16-byte weight loads per K tile */
#define WUNIT uint4
#else
#ifndef G_KH
#error "conv_gemm needs the specialised geometry (-DG_KH ... -DG_DW)"
#endif
#define KHW (KH * KW)
#define KT (4 * KHW)
#define UNITS ((TM / 4) * KHW)
#if QBITS == 8
#define WUNIT uint4
#else
#define WUNIT uint2
#endif
#endif
#define UPT CDIV(UNITS, NT) /* weight units per item and K tile */
#ifdef B_KFAST
#define BSTEP (NT / KT)     /* rows gathered per pass */
#define BPT CDIV(TN, BSTEP)
#else
#define BSTEP (NT / TN)     /* k values gathered per pass */
#define BPT CDIV(KT, BSTEP) /* inputs per item and K tile */
#endif
#define ASTR (TM + 4)       /* row strides of the local tiles (+4: float4 stores of 4 rows hit other banks) */
#define BSTR (TN + 4)

#if RM % 4 != 0 || TM % 4 != 0
#error "RM and TM must be multiples of 4"
#endif
#if defined(B_KFAST) && NT % KT != 0
#error "B_KFAST needs NT % KT == 0"
#endif
#if !defined(B_KFAST) && NT % TN != 0
#error "conv_gemm needs NT % TN == 0"
#endif
#if KS > 1 && TM * TN > KT * ASTR
#error "split-K reduces in the weight tiles: TM * TN must fit in KT * ASTR"
#endif

/* the dequantised weights of unit `u` (tile index) of K tile kt into As */
#ifdef WL_1X1
inline void store_weights(__local float *As, WUNIT wv, int u, int kt, int o0,
                          __global const SCALE_T *ws, __global const SCALE_T *wo) {
    const int OCP = CDIV(OC, 4) * 4;
    const int kcl = u / TM;
    const int ol = u - kcl * TM;
    const int o = min(o0 + ol, OCP - 1); /* clamped: columns past OCp are never stored */
    const int c0 = (kt * KCT + kcl) * KC;
#ifdef NBLK1
    const float s0 = LOAD_S1(ws, o);
#ifdef ASYM
    const float a0 = LOAD_S1(wo, o);
#endif
#endif
#pragma unroll
    for (int v = 0; v < KC / 4; ++v) {
#if QBITS == 8
        const uint word = v == 0 ? wv.x : v == 1 ? wv.y : v == 2 ? wv.z : wv.w;
        const float4 q = q8x4(word);
#else
        const int wi = v >> 1;
        const uint word = wi == 0 ? wv.x : wi == 1 ? wv.y : wi == 2 ? wv.z : wv.w;
        const float4 q = q4x4(word, (uint)(v & 1) * 16u);
#endif
        const int c = c0 + 4 * v;
#ifdef NBLK1
        float4 w = q * s0;
#ifdef ASYM
        w += a0;
#endif
#elif defined(BLOCK_ALIGN4)
        const int blk = min(c / BLOCK_CH, IC / BLOCK_CH - 1);
        float4 w = q * LOAD_S1(ws, blk * OCP + o);
#ifdef ASYM
        w += LOAD_S1(wo, blk * OCP + o);
#endif
#else
        const int4 blk = min(((int4)(c) + (int4)(0, 1, 2, 3)) / (int4)(BLOCK_CH), (int4)(IC / BLOCK_CH - 1));
        const int4 idx = blk * OCP + (int4)(o);
        float4 w = q * (float4)(LOAD_S1(ws, idx.x), LOAD_S1(ws, idx.y), LOAD_S1(ws, idx.z), LOAD_S1(ws, idx.w));
#ifdef ASYM
        w += (float4)(LOAD_S1(wo, idx.x), LOAD_S1(wo, idx.y), LOAD_S1(wo, idx.z), LOAD_S1(wo, idx.w));
#endif
#endif
        __local float *dst = As + (kcl * KC + 4 * v) * ASTR + ol;
        dst[0] = w.x;
        dst[ASTR] = w.y;
        dst[2 * ASTR] = w.z;
        dst[3 * ASTR] = w.w;
    }
}
#else
inline void store_weights(__local float *As, WUNIT wv, int u, int kt, int o0,
                          __global const SCALE_T *ws, __global const SCALE_T *wo) {
    const int O4 = CDIV(OC, 4);
    const int OCP = O4 * 4;
    const int o4l = u / KHW;
    const int t = u - o4l * KHW;
    const int o4 = min(o0 / 4 + o4l, O4 - 1); /* clamped: columns past OCp are never stored */
    float4 q[4];
#if QBITS == 8
    q[0] = q8x4(wv.x);
    q[1] = q8x4(wv.y);
    q[2] = q8x4(wv.z);
    q[3] = q8x4(wv.w);
#else
    q[0] = q4x4(wv.x, 0);
    q[1] = q4x4(wv.x, 16);
    q[2] = q4x4(wv.y, 0);
    q[3] = q4x4(wv.y, 16);
#endif
#if defined(NBLK1) || defined(BLOCK_ALIGN4)
#ifdef NBLK1
    const int blk = 0;
#else
    const int blk = min((4 * kt) / BLOCK_CH, IC / BLOCK_CH - 1); /* clamped: K tiles past I (split-K) */
#endif
    const float4 s = LOAD_S4(ws, blk * OCP + 4 * o4);
#ifdef ASYM
    const float4 a = LOAD_S4(wo, blk * OCP + 4 * o4);
#endif
#endif
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
#if !defined(NBLK1) && !defined(BLOCK_ALIGN4)
        const int blk = min((4 * kt + lane) / BLOCK_CH, IC / BLOCK_CH - 1);
        const float4 s = LOAD_S4(ws, blk * OCP + 4 * o4);
#ifdef ASYM
        const float4 a = LOAD_S4(wo, blk * OCP + 4 * o4);
#endif
#endif
#ifdef ASYM
        const float4 w = q[lane] * s + a;
#else
        const float4 w = q[lane] * s;
#endif
        *(__local float4 *)(As + (4 * t + lane) * ASTR + 4 * o4l) = w;
    }
}
#endif

__kernel __attribute__((reqd_work_group_size(NTX, NTY, KS)))
void conv_gemm(__global const float *x,
               __global const uchar *wq,
               __global const SCALE_T *ws,
               __global const SCALE_T *wo,
               __global const float *bias,
               __global float *y,
               const int N, const int IH, const int IW, const int OH, const int OW) {
    __local float4 As4[KS * KT * ASTR / 4];
    __local float4 Bs4[KS * KT * BSTR / 4];
    const int ks = get_local_id(2);
    __local float *As = (__local float *)As4 + ks * KT * ASTR; /* this slice's tiles */
    __local float *Bs = (__local float *)Bs4 + ks * KT * BSTR;

    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int lt = ty * NTX + tx;
    const int p0 = get_group_id(0) * TN;
    const int o0 = get_group_id(1) * TM;
    const int O4 = CDIV(OC, 4);
    const int OCP = O4 * 4;
    const int OHW = OH * OW;
    const int P = N * OHW;

    /* --- the inputs this item gathers: a fixed pixel (p-fast) or a fixed k (B_KFAST) --- */
#ifdef B_KFAST
    const int bk = lt % KT;        /* k within the tile */
    const int bp = lt / KT;        /* first row */
#else
    const int bpl = lt % TN;       /* pixel within the tile */
    const int bk = lt / TN;        /* first k within the tile */
    const int bp = p0 + bpl;
    const bool bpix = bp < P;
    const int bn = bp / OHW;
    const int br = bp - bn * OHW;
#ifndef WL_1X1
    const int boy = br / OW;
    const int box = br - boy * OW;
    const int biy = boy * SH - PH;
    const int bix = box * SW - PW;
#endif
#endif

#ifdef WL_1X1
    const int KCH = CDIV(IC, KC);
    const int NKT = CDIV(KCH, KCT);
#else
    const int NKT = CDIV(IC, 4);
#endif

    WUNIT wreg[UPT];
    float xreg[BPT];

    /* global loads of K tile kt into wreg / xreg */
#ifdef WL_1X1
#define LOAD_W_TILE(kt)                                                                              \
    for (int i = 0; i < UPT; ++i) {                                                                  \
        const int u = lt + i * NT;                                                                   \
        const int kcl = u / TM;                                                                      \
        const int o = o0 + (u - kcl * TM);                                                           \
        const int kc = (kt) * KCT + kcl;                                                             \
        wreg[i] = (u < UNITS && o < OCP && kc < KCH) ? ((__global const uint4 *)wq)[kc * OCP + o]    \
                                                     : (uint4)(ZERO_WORD);                   \
    }
#else
#define LOAD_W_TILE(kt)                                                                              \
    for (int i = 0; i < UPT; ++i) {                                                                  \
        const int u = lt + i * NT;                                                                   \
        const int o4 = o0 / 4 + u / KHW;                                                             \
        const int gu = ((kt) * O4 + o4) * KHW + (u - (u / KHW) * KHW);                               \
        wreg[i] = (u < UNITS && o4 < O4 && (kt) < NKT) ? ((__global const WUNIT *)wq)[gu]            \
                                                       : (WUNIT)(ZERO_WORD);                         \
    }
#endif

#ifdef B_KFAST
#define LOAD_X_TILE(kt)                                                                              \
    for (int i = 0; i < BPT; ++i) {                                                                  \
        const int p = p0 + bp + i * BSTEP;                                                           \
        const int c = (kt) * KT + bk;                                                                \
        xreg[i] = (bp + i * BSTEP < TN && p < P && c < IC) ? x[p * IC + c] : 0.0f;                   \
    }
#elif defined(WL_1X1)
#define LOAD_X_TILE(kt)                                                                              \
    for (int i = 0; i < BPT; ++i) {                                                                  \
        const int kl = bk + i * BSTEP;                                                               \
        const int c = (kt) * KT + kl;                                                                \
        xreg[i] = (kl < KT && bpix && c < IC) ? X_AT(c) : 0.0f;                                      \
    }
#else
#define LOAD_X_TILE(kt)                                                                              \
    for (int i = 0; i < BPT; ++i) {                                                                  \
        const int kl = bk + i * BSTEP;                                                               \
        const int tap = kl >> 2;                                                                     \
        const int c = 4 * (kt) + (kl & 3);                                                           \
        const int ky = tap / KW;                                                                     \
        const int iy = biy + ky * DH;                                                                \
        const int ix = bix + (tap - ky * KW) * DW;                                                   \
        const bool ok = kl < KT && bpix && c < IC && iy >= 0 && iy < IH && ix >= 0 && ix < IW;      \
        xreg[i] = ok ? X_AT(c) : 0.0f;                                                               \
    }
#endif

    /* input value of channel c at this item's pixel (bn, iy, ix) / row (bn, br) */
#ifdef WL_1X1
#ifdef IN_NCHW
#define X_AT(c) x[(bn * IC + (c)) * OHW + br]
#else
#define X_AT(c) x[(((c) >> 2) * P + bp) * 4 + ((c) & 3)]
#endif
#else
#ifdef IN_NCHW
#define X_AT(c) x[((bn * IC + (c)) * IH + iy) * IW + ix]
#else
#define X_AT(c) x[(((((c) >> 2) * N + bn) * IH + iy) * IW + ix) * 4 + ((c) & 3)]
#endif
#endif
    /* a stored zero weight: int8 0 is byte 0; int4 0 is nibble 8 */
#if QBITS == 8
#define ZERO_WORD 0u
#else
#define ZERO_WORD 0x88888888u
#endif

    float acc[RM][RN];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j)
            acc[i][j] = 0.0f;

    /* every slice runs the same number of iterations (barriers); tiles past NKT load zeros */
#pragma unroll
    LOAD_W_TILE(ks)
#pragma unroll
    LOAD_X_TILE(ks)
    const int KEND = CDIV(NKT, KS) * KS;
    for (int kt = ks; kt < KEND; kt += KS) {
#pragma unroll
        for (int i = 0; i < UPT; ++i) {
            const int u = lt + i * NT;
            if (u < UNITS)
                store_weights(As, wreg[i], u, kt, o0, ws, wo);
        }
#pragma unroll
        for (int i = 0; i < BPT; ++i) {
#ifdef B_KFAST
            if (bp + i * BSTEP < TN)
                Bs[bk * BSTR + bp + i * BSTEP] = xreg[i];
#else
            if (bk + i * BSTEP < KT)
                Bs[(bk + i * BSTEP) * BSTR + bpl] = xreg[i];
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (kt + KS < KEND) {
#pragma unroll
            LOAD_W_TILE(kt + KS)
#pragma unroll
            LOAD_X_TILE(kt + KS)
        }
#pragma unroll 4
        for (int kk = 0; kk < KT; ++kk) {
            float a[RM], b[RN];
            __local const float *ap = As + kk * ASTR + ty * RM;
#pragma unroll
            for (int i = 0; i < RM; i += 4) {
                const float4 v = *(__local const float4 *)(ap + i);
                a[i] = v.x;
                a[i + 1] = v.y;
                a[i + 2] = v.z;
                a[i + 3] = v.w;
            }
            __local const float *bq = Bs + kk * BSTR + tx * RN;
#if RN % 4 == 0
#pragma unroll
            for (int j = 0; j < RN; j += 4) {
                const float4 v = *(__local const float4 *)(bq + j);
                b[j] = v.x;
                b[j + 1] = v.y;
                b[j + 2] = v.z;
                b[j + 3] = v.w;
            }
#elif RN == 2
            {
                const float2 v = *(__local const float2 *)bq;
                b[0] = v.x;
                b[1] = v.y;
            }
#else
#pragma unroll
            for (int j = 0; j < RN; ++j)
                b[j] = bq[j];
#endif
#pragma unroll
            for (int i = 0; i < RM; ++i)
#pragma unroll
                for (int j = 0; j < RN; ++j)
                    acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

#if KS > 1
    {
        /* slice 0 adds the other slices' sums (in order) from local memory */
        __local float *red = (__local float *)As4;
        if (ks > 0) {
#pragma unroll
            for (int i = 0; i < RM; ++i)
#pragma unroll
                for (int j = 0; j < RN; ++j)
                    red[(ks - 1) * TM * TN + (i * RN + j) * NT + lt] = acc[i][j];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (ks > 0)
            return;
        for (int s2 = 1; s2 < KS; ++s2)
#pragma unroll
            for (int i = 0; i < RM; ++i)
#pragma unroll
                for (int j = 0; j < RN; ++j)
                    acc[i][j] += red[(s2 - 1) * TM * TN + (i * RN + j) * NT + lt];
    }
#endif

    /* epilogue: bias, activation, padding lanes, store */
#ifdef OUT_NCHW
    const int olim = OC;
#else
    const int olim = OCP;
#endif
    int ybase[RN];
#pragma unroll
    for (int j = 0; j < RN; ++j) {
        const int p = p0 + tx * RN + j;
#ifdef OUT_NCHW
        const int n = p / OHW;
        ybase[j] = n * OC * OHW + (p - n * OHW);
#else
        ybase[j] = p * 4;
#endif
    }
#pragma unroll
    for (int i = 0; i < RM; ++i) {
        const int o = o0 + ty * RM + i;
        if (o >= olim)
            break;
#ifdef HAS_BIAS
        const float bo = bias[o];
#else
        const float bo = 0.0f;
#endif
#pragma unroll
        for (int j = 0; j < RN; ++j) {
            if (p0 + tx * RN + j >= P)
                break;
            float v = ACTIVATE(acc[i][j] + bo);
#ifdef OC_LANE_LEAVE
            v = o < OC ? v : 0.0f;
#endif
#ifdef OUT_NCHW
            y[ybase[j] + o * OHW] = v;
#else
            y[(o >> 2) * P * 4 + ybase[j] + (o & 3)] = v;
#endif
        }
    }
}
