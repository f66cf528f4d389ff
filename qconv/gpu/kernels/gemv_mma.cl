/* Linear layers on one row (N = H = W = 1) with float activations on the int8 tensor cores (gemv_mma).
 *
 * y[o] = act(sum_k (q[o,k] s[o,b(k)] + a[o,b(k)]) x[k] + bias[o])   (b(k): k's scale block; one block: NBLK1)
 *
 * Arguments: x float [IC]; wq uint4 (OpenCLGemvMMALayout); ws, wo: with NBLK1 the scales and offsets in
 * OpenCLScaleLayout, else ws holds both in OpenCLGemvMMAScaleLayout (wo unused); bias float [ceil(OC/4)*4];
 * y float [OC] (OUT_NCHW) or [ceil(OC/4)*4] (NC4HW4, N = H = W = 1); a_ic, a_oc: IC, OC when not built in.
 *
 * x is turned into integers X[k] = rint(x[k] 2^sh), with 2^sh putting max |x| in [2^28, 2^29) (so every
 * element within 2^-5 of max |x| is exact and the others are off by at most 2^-30 max |x|), and X is written
 * as four signed base-256 digits, X = d0 2^24 + d1 2^16 + d2 2^8 + d3 (d1..d3 in [-128, 127], |d0| <= 32).
 * One mma.sync.m16n8k32 (s8 x s8 -> s32) multiplies a tile of 16 output channels x 32 k by the digit
 * columns 0..3 of its B operand, so sum_k q X is exact: in int32 per column (16 q d <= 2^14 and at most
 * 131071 channels), then int64 over the columns and the warps. One rounding to float follows, per layer
 * (NBLK1) or per scale block (blocks: folded into float with the block's scale).
 *
 * Weights: OpenCLGemvMMALayout, uint4 [ceil(O/16)][KL][32 lanes]: a lane's 16 bytes hold its rows g and
 * g + 8 (g = lane / 4, t = lane % 4) at the channels 2t, 2t+1, 2t+8, 2t+9 of MPL = KT/16 16-channel steps
 * (KT = 64 int4, 32 int8 channels per load). The mma reads a pair of steps as one 32-channel product whose
 * k slots 4t..4t+3 (and 16+4t..) are those channels of the first (second) step, in the order the codes lie:
 * int4 (low nibbles of a word's bytes: row g; high nibbles: row g + 8) 2t, 2t+8, 2t+1, 2t+9; int8 (bytes 0,1
 * of the step's first word and of its second: row g; bytes 2,3: row g + 8) 2t, 2t+1, 2t+8, 2t+9. x's
 * digits are stored in that slot order, so the products pair the right channels. int4 codes are decoded
 * to the bytes 16 q (the two's-complement nibble q = (q + 8) ^ 8 under a byte's top half: one xor-and),
 * the factor 16 leaves with 2^sh.
 *
 * Scale blocks (no NBLK1): the scales (then, ASYM, the offsets: a second plane) are in OpenCLGemvMMAScaleLayout,
 * [ceil(O/16)][NBLK][8][2] each: one 4-byte (float16) load per block brings a lane the numbers of its rows g and
 * g + 8. Each fold starts its product from zero (FOLDM = 1: the products of a load are independent), turns lane
 * t's two columns into one integer (c0 2^8 + c1: |.| < 2^28) and one float (the only rounding, as in the
 * per-layer path), times the block's scale; lane t = 0's columns weigh 2^16 more (applied once, at the end).
 * The offsets' terms, offset times the block's sum of x, are shared out: of a batch's U x NFOLD folds, lane t
 * loads the offsets of folds t, t + 4, ... with the batch and adds their terms after its products; the four
 * lanes' sums are added at the tile's end. The sums of x: per 16-channel step, from the quads of the digits
 * pass (a sum over the step's four lanes), then per XB channels.
 *
 * NDRange: local (32, SPLIT) = SPLIT warps, G work-groups (the engine: at most the device's resident ones);
 * group g takes the tiles g, g + G, ...; warp lk takes loads kl = lk, lk + SPLIT, ... of the tile, a batch of
 * U of them in flight. Every group first reads x (and the first batch of its first tile, so that it streams
 * while x is reduced), finds max |x| (a non-finite x makes every output NaN), writes the digits to local
 * memory (4 columns x KS/2 step pairs x 4 lanes x uint2 = 64 bytes per 16 channels) and then runs its tiles
 * (each tile's epilogue scale, offset and bias loads are issued at its start). A batch's successor (the next
 * tile's first batch after the last one) is loaded before the batch's products (PIPE: 2U loads in flight) or
 * after them (before the tile's sums are added).
 *
 * Without -DNV_PTX the mma is emulated through local memory (each lane writes its fragments, every lane
 * computes its four sums with dp4a), for devices without PTX (CI on PoCL): integer sums, so the emulation
 * gives the same bits as the tensor cores; so are the sums over a quad's lanes (shfl.sync there), whose float
 * additions go in another order.
 *
 * Build options: QBITS, SCALE_HALF, ASYM, NBLK1 | BLOCK_CH (16, 32 or a multiple of 32), HAS_BIAS, ACT,
 * OUT_NCHW, G_IC, G_OC, SPLIT, U, PIPE, NV_PTX.
 */
#ifndef QBITS
#error "QBITS must be defined (4 or 8)"
#endif
#ifndef U
#define U 4
#endif
#define KT (QBITS == 4 ? 64 : 32) /* input channels per 16-byte load of a lane */
#define MPL (KT / 16)             /* 16-channel steps per load */
#define NMMA (MPL / 2)            /* mma products (32 channels) per load */
#define KL CDIV(IC, KT)           /* loads per tile row */
#define KS (KL * MPL)             /* 16-channel steps */
#define QT (32 * SPLIT)           /* items per work-group */
#define NPQ CDIV(KS * 4, QT)      /* (step, t) quads of x per item */
#define XREG (NPQ <= 4)           /* x kept in registers between the max and the digits (else read twice) */
#define CODE_SHIFT (QBITS == 4 ? 4 : 0) /* int4 products are 16 q X */
#ifdef NBLK1
#define XB 64                     /* channels per partial sum of x (the offsets' sum x, per-channel) */
#else
#define XB BLOCK_CH
#if BLOCK_CH % 32 != 0 && BLOCK_CH != 16
#error "BLOCK_CH must be 16 or a multiple of 32"
#endif
#define HALVES (BLOCK_CH == 16)   /* a block per 16-channel step: each half of a product folded apart */
#define MPB (HALVES ? 1 : BLOCK_CH / 32) /* products per block */
#define FOLDM (MPB < NMMA ? MPB : NMMA)  /* products per fold: at least one fold per load (a load's warp) */
#define FPL (HALVES ? 2 * NMMA : NMMA / FOLDM) /* folds per load */
#define NBLK (IC / BLOCK_CH)
#endif
#define NXB CDIV(IC, XB)
#ifdef NBLK1
#define NBLK_OR1 1
#else
#define NBLK_OR1 NBLK
#endif
#define NOFF CDIV(U * NFOLD_ASYM, 4) /* a lane's share of a batch's offsets (folds t, t + 4, ...) */

#ifdef NV_PTX
inline uint prmt(uint a, uint b, uint sel) {
    uint d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
/* d = A B + c (volatile: never sunk into a branch, which would split the warp) */
inline void mma_s8(int *d, const int *c, uint a0, uint a1, uint a2, uint a3, uint2 b) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y),
                   "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}
/* the sum of v over the 4 lanes of this lane's quad (lanes 4g .. 4g + 3) */
inline float quad_sum(float v) {
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, 1, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v));
    v += r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, 2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v));
    return v + r;
}
#define QUAD_SUM(v) quad_sum(v)
#else
/* prmt.b32 (selector nibbles 0-7 pick bytes of {b, a}; no sign modes) */
inline uint prmt(uint a, uint b, uint sel) {
    const ulong ab = (ulong)b << 32 | a;
    uint d = 0u;
    for (int i = 0; i < 4; ++i)
        d |= (uint)(ab >> (8 * ((sel >> (4 * i)) & 7u)) & 0xFFu) << (8 * i);
    return d;
}
/* d = A B + c as mma.m16n8k32 s8, through the warp's local tiles As[16 rows][8 words], Bs[8 columns][8 words] */
inline void mma_emul(int *d, const int *c, uint a0, uint a1, uint a2, uint a3, uint2 b, __local uint *As,
                     __local uint *Bs, int g, int t) {
    As[g * 8 + t] = a0;
    As[(g + 8) * 8 + t] = a1;
    As[g * 8 + 4 + t] = a2;
    As[(g + 8) * 8 + 4 + t] = a3;
    Bs[g * 8 + t] = b.x;
    Bs[g * 8 + 4 + t] = b.y;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < 4; ++i) { /* d0, d1: row g, columns 2t, 2t + 1; d2, d3: row g + 8 */
        const int r = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        int acc = c[i];
        for (int w = 0; w < 8; ++w)
            acc = dp4a_ss(As[r * 8 + w], Bs[col * 8 + w], acc);
        d[i] = acc;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
/* quad_sum through the warp's tile s (every item of the work-group calls it) */
inline float quad_sum_emul(float v, int lane, __local float *s) {
    s[lane] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    const int q = lane & ~3;
    const float r = (s[q] + s[q + 1]) + (s[q + 2] + s[q + 3]);
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
#define QUAD_SUM(v) quad_sum_emul(v, lane, (__local float *)As)
#endif

/* the digits of X (|X| < 2^29) as signed bytes: byte 0 = d3 (weight 1) ... byte 3 = d0 (2^24) */
inline uint digits(float v) {
    return ((uint)convert_int_rte(v) + 0x808080u) ^ 0x808080u;
}

/* x[16 s + 2 t + {0, 1, 8, 9}] (zeros past IC) of quad p = 4 s + t */
inline float4 load_quad(__global const float *x, int p) {
    const int k = 16 * (p >> 2) + 2 * (p & 3);
    return (float4)(k < IC ? x[k] : 0.0f, k + 1 < IC ? x[k + 1] : 0.0f, k + 8 < IC ? x[k + 8] : 0.0f,
                    k + 9 < IC ? x[k + 9] : 0.0f);
}

/* 2^e for e in [-252, 252] (two factors: each a normal float) */
inline float2 pow2_pair(int e) {
    const int e1 = clamp(e, -126, 126);
    return (float2)(as_float((uint)(127 + e1) << 23), as_float((uint)(127 + e - e1) << 23));
}

/* A fragments of product mm (0 .. NMMA-1) of a lane's 16 bytes: rows g, g + 8 of its two steps */
inline void decode_a(uint4 wv, int mm, uint *a) {
#if QBITS == 4
    const uint w0 = mm == 0 ? wv.x : wv.z, w1 = mm == 0 ? wv.y : wv.w;
    a[0] = ((w0 << 4) ^ 0x88888888u) & 0xF0F0F0F0u; /* low nibbles: row g, bytes 16 q */
    a[1] = (w0 ^ 0x88888888u) & 0xF0F0F0F0u;        /* high nibbles: row g + 8 */
    a[2] = ((w1 << 4) ^ 0x88888888u) & 0xF0F0F0F0u;
    a[3] = (w1 ^ 0x88888888u) & 0xF0F0F0F0u;
#else
    a[0] = prmt(wv.x, wv.y, 0x5410u);
    a[1] = prmt(wv.x, wv.y, 0x7632u);
    a[2] = prmt(wv.z, wv.w, 0x5410u);
    a[3] = prmt(wv.z, wv.w, 0x7632u);
#endif
}

#ifdef NV_PTX
#define MMA(d, c, a, b) mma_s8(d, c, a[0], a[1], a[2], a[3], b)
#else
#define MMA(d, c, a, b) mma_emul(d, c, a[0], a[1], a[2], a[3], b, As, Bs, g, t)
#endif

#ifdef NBLK1
/* this lane's columns (t = 0: digits d0, d1; t = 1: d2, d3) of rows g (r = 0) or g + 8 (r = 1) as one integer */
inline long lane_sum(const int *c, int r, int t) {
    const int sh = t == 0 ? 16 : 0;
    return (((long)c[2 * r] << 8) + c[2 * r + 1]) << sh;
}
#define NFOLD 1
typedef float fold_t; /* unused */
#else
/* a fold's numbers (OpenCLGemvMMAScaleLayout entry): the scales (or offsets) of rows g, g + 8 */
typedef float2 fold_t;
#ifdef SCALE_HALF
#define LOAD_FOLD(p, i) vloada_half2((i), (p))
#else
#define LOAD_FOLD(p, i) vload2((i), (p))
#endif
#define NFOLD FPL
/* fold f of load kl: its block and whether it holds the block's last product (HALVES: a block per fold) */
#define FOLD_BLOCK(kl, f) (HALVES ? (kl) * FPL + (f) : ((kl) * NMMA + (f) * FOLDM + FOLDM - 1) / MPB)
#define FOLD_LAST(kl, f) (HALVES || ((kl) * NMMA + (f) * FOLDM + FOLDM) % MPB == 0)
#endif
#if defined(ASYM) && !defined(NBLK1)
#define NFOLD_ASYM NFOLD
#else
#define NFOLD_ASYM 0
#endif

/* loads kl = base + lk + j SPLIT (clamped) of tile `tile` for j < U, their folds' scales and (ASYM) this lane's
 * share of their offsets (folds e = t, t + 4, ... of the U x NFOLD, from the plane wof) */
inline void load_batch(__global const uint4 *wq, __global const SCALE_T *ws, __global const SCALE_T *wof, int tile,
                       int base, int lk, int lane, uint4 *wv, fold_t *sv, fold_t *ov) {
#ifdef NBLK1
    (void)ws;
    (void)sv;
#else
    const int g = lane >> 2;
#endif
#if NFOLD_ASYM
#pragma unroll
    for (int i = 0; i < NOFF; ++i) {
        const int e = min(4 * i + (lane & 3), U * NFOLD - 1), j = e / NFOLD, f = e % NFOLD;
        const int klc = min(base + lk + j * SPLIT, KL - 1);
        ov[i] = LOAD_FOLD(wof, ((size_t)tile * NBLK + min(FOLD_BLOCK(klc, f), NBLK - 1)) * 8 + g);
    }
#else
    (void)wof;
    (void)ov;
#endif
#pragma unroll
    for (int j = 0; j < U; ++j) {
        const int klc = min(base + lk + j * SPLIT, KL - 1);
        wv[j] = wq[((size_t)tile * KL + klc) * 32 + lane];
#ifndef NBLK1
#pragma unroll
        for (int f = 0; f < FPL; ++f) {
            const int blk = min(HALVES ? klc * FPL + f : (klc * NMMA + f * FOLDM) / MPB, NBLK - 1);
            sv[j * FPL + f] = LOAD_FOLD(ws, ((size_t)tile * NBLK + blk) * 8 + g);
        }
#endif
    }
}

__kernel __attribute__((reqd_work_group_size(32, SPLIT, 1)))
void gemv_mma(__global const float *x,
              __global const uint4 *wq,
              __global const SCALE_T *ws,
              __global const SCALE_T *wo,
              __global const float *bias,
              __global float *y,
              const int a_ic, const int a_oc) {
    const int lane = get_local_id(0), lk = get_local_id(1);
    const int lin = lk * 32 + lane;
    const int g = lane >> 2, t = lane & 3;
    const int OCP = CDIV(OC, 4) * 4; /* the output's channels in NC4HW4 (and the per-layer scales' rows) */
    const int OT = CDIV(OC, 16);
    const int NG = get_num_groups(0);
    const int zero[4] = {0, 0, 0, 0};

    __local uint2 xb[4 * (KS / 2) * 4]; /* [digit column][step pair][t]: the B fragments (b0, b1) */
#ifdef ASYM
    __local float xstep[KS];            /* sums of x per 16-channel step */
    __local float xsum[NXB];            /* sums of x per XB channels: the offsets' factor */
#endif
    __local float red[QT];              /* max |x| */
    __local long part[SPLIT * 16 * 2];  /* the warps' sums [SPLIT][16 rows][t = 0, 1] */
#ifndef NV_PTX
    __local uint emu[SPLIT * 192];
    __local uint *As = emu + lk * 192, *Bs = As + 128;
#endif

    /* x, then the first batch of the first tile (it streams while x is reduced) */
    float4 xv[XREG ? NPQ : 1];
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < NPQ; ++i) {
        const float4 v = load_quad(x, lin + i * QT);
        if (XREG)
            xv[i] = v;
        const float4 av = fabs(v);
        m = fmax(m, fmax(fmax(av.x, av.y), fmax(av.z, av.w)));
        m = all(isfinite(v)) ? m : INFINITY;
    }
    const int tile0 = get_group_id(0);
    uint4 wv[U];
    fold_t sv[U * NFOLD], ov[NOFF > 0 ? NOFF : 1];
    __global const SCALE_T *wof = ws + (size_t)OT * NBLK_OR1 * 16; /* the offsets' plane (blocks, ASYM) */
    load_batch(wq, ws, wof, min(tile0, OT - 1), 0, lk, lane, wv, sv, ov);

    const float amax = work_group_amax(red, m, lin, QT);
    const bool finite = isfinite(amax);
    const int sh = amax > 0.0f && finite ? 155 - (int)(as_uint(amax) >> 23) : 0; /* max |X| in [2^28, 2^29) */
    const float2 sc = pow2_pair(sh), inv = pow2_pair(-sh - CODE_SHIFT);
#pragma unroll
    for (int i = 0; i < NPQ; ++i) {
        const int p = lin + i * QT;
        const float4 u = XREG ? xv[i] : load_quad(x, p); /* zeros past IC */
#ifdef ASYM
        const float su = QUAD_SUM((u.x + u.y) + (u.z + u.w)); /* quad p = 4 s + t: step s's sum */
        if ((p & 3) == 0 && p < KS * 4)
            xstep[p >> 2] = su;
#endif
        if (p < KS * 4) {
            const float4 v = u * sc.x * sc.y;
            /* slot order of the step's channels (see the header): digits of each in one word */
#if QBITS == 4
            const uint d0 = digits(v.x), d1 = digits(v.z), d2 = digits(v.y), d3 = digits(v.w);
#else
            const uint d0 = digits(v.x), d1 = digits(v.y), d2 = digits(v.z), d3 = digits(v.w);
#endif
            const uint lo01 = prmt(d0, d1, 0x5140u), lo23 = prmt(d2, d3, 0x5140u); /* bytes 0, 1 of each */
            const uint hi01 = prmt(d0, d1, 0x7362u), hi23 = prmt(d2, d3, 0x7362u); /* bytes 2, 3 */
            const int s = p >> 2, o = (((s >> 1) * 4 + (p & 3)) << 1) + (s & 1);
            __local uint *xw = (__local uint *)xb;
            xw[0 * KS * 4 + o] = prmt(hi01, hi23, 0x7632u); /* column 0: d0 */
            xw[1 * KS * 4 + o] = prmt(hi01, hi23, 0x5410u); /* column 1: d1 */
            xw[2 * KS * 4 + o] = prmt(lo01, lo23, 0x7632u); /* column 2: d2 */
            xw[3 * KS * 4 + o] = prmt(lo01, lo23, 0x5410u); /* column 3: d3 */
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#ifdef ASYM
    for (int b = lin; b < NXB; b += QT) {
        float s = 0.0f;
        for (int i = b * (XB / 16); i < min(KS, (b + 1) * (XB / 16)); ++i)
            s += xstep[i];
        xsum[b] = s;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
#if defined(NBLK1) && defined(ASYM)
    float xtotal = 0.0f;
    for (int b = 0; b < NXB; ++b)
        xtotal += xsum[b];
#endif

    for (int tile = tile0; tile < OT; tile += NG) {
        int c[4] = {0, 0, 0, 0};
        /* the epilogue's per-channel numbers, loaded now so that they arrive with the weights */
        const int o = tile * 16 + lin, os = min(o, OC - 1);
        float o_scale = 0.0f, o_offset = 0.0f, o_bias = 0.0f;
        if (lin < 16) {
#ifdef NBLK1
            o_scale = LOAD_S1(ws, os);
#ifdef ASYM
            o_offset = LOAD_S1(wo, os);
#endif
#endif
#ifdef HAS_BIAS
            o_bias = bias[os];
#endif
        }
#ifndef NBLK1
        float ya = 0.0f, yb = 0.0f; /* rows g, g + 8: this lane's columns, folded with the blocks' scales */
#ifdef ASYM
        float za = 0.0f, zb = 0.0f; /* the offsets' terms (used from lanes t = 0) */
#endif
#endif
        for (int base = 0; base < KL; base += SPLIT * U) { /* the same trip count in every warp */
            /* the successor batch: the next one of this tile, else the next tile's first */
            const bool more = base + SPLIT * U < KL;
            const int ntile = more ? tile : tile + NG, nbase = more ? base + SPLIT * U : 0;
#ifdef PIPE
            uint4 wn[U];
            fold_t sn[U * NFOLD], on[NOFF > 0 ? NOFF : 1];
            if (ntile < OT)
                load_batch(wq, ws, wof, ntile, nbase, lk, lane, wn, sn, on);
#endif
#pragma unroll
            for (int j = 0; j < U; ++j) {
                const int kl = base + lk + j * SPLIT;
                const bool valid = KL % (SPLIT * U) == 0 || kl < KL;
#pragma unroll
                for (int mm = 0; mm < NMMA; ++mm) {
                    uint a[4];
                    decode_a(wv[j], mm, a);
                    const int pr = kl * NMMA + mm; /* product index: channels 32 pr .. 32 pr + 31 */
                    /* lanes g >= 4 read the columns again: their products (columns 4-7) are not used */
                    uint2 bv = xb[((g & 3) * (KS / 2) + min(pr, KS / 2 - 1)) * 4 + t];
                    bv = valid ? bv : (uint2)(0u, 0u);
#ifdef NBLK1
                    MMA(c, c, a, bv);
#else
                    /* fold each block into float at its last product (products past IC are zero: skipped) */
#pragma unroll
                    for (int h = 0; h < (HALVES ? 2 : 1); ++h) {
                        int d[4];
                        if (HALVES) { /* one block per step: the product of each step alone */
                            const uint ah[4] = {h ? 0u : a[0], h ? 0u : a[1], h ? a[2] : 0u, h ? a[3] : 0u};
                            MMA(d, zero, ah, bv);
                        } else {
                            MMA(d, (FOLDM == 1 || mm % FOLDM == 0) ? zero : c, a, bv);
                        }
                        const int f = HALVES ? 2 * mm + h : mm / FOLDM;   /* this load's fold */
                        const int blk = HALVES ? 2 * pr + h : pr / MPB;
                        if (HALVES || (mm + 1) % FOLDM == 0) {
                            if (valid && blk < NBLK) {
                                const fold_t fs = sv[j * NFOLD + f];
                                ya = fma(fs.x, (float)((d[0] << 8) + d[1]), ya);
                                yb = fma(fs.y, (float)((d[2] << 8) + d[3]), yb);
                            }
                        } else {
                            c[0] = d[0], c[1] = d[1], c[2] = d[2], c[3] = d[3];
                        }
                    }
#endif
                }
            }
#if NFOLD_ASYM
            /* this lane's share of the batch's offsets: offset times the block's sum of x, at its last fold */
#pragma unroll
            for (int i = 0; i < NOFF; ++i) {
                const int e = 4 * i + t, j = e / NFOLD, f = e % NFOLD;
                const int kl = base + lk + j * SPLIT, blk = FOLD_BLOCK(kl, f);
                if ((U * NFOLD % 4 == 0 || e < U * NFOLD) && (KL % (SPLIT * U) == 0 || kl < KL) && FOLD_LAST(kl, f)
                    && blk < NBLK) {
                    const float xs = xsum[blk];
                    za = fma(ov[i].x, xs, za);
                    zb = fma(ov[i].y, xs, zb);
                }
            }
#endif
#ifdef PIPE
#pragma unroll
            for (int j = 0; j < U; ++j)
                wv[j] = wn[j];
#pragma unroll
            for (int j = 0; j < U * NFOLD; ++j)
                sv[j] = sn[j];
#pragma unroll
            for (int i = 0; i < NOFF; ++i)
                ov[i] = on[i];
#else
            if (ntile < OT)
                load_batch(wq, ws, wof, ntile, nbase, lk, lane, wv, sv, ov);
#endif
        }

        /* lanes t = 0, 1 hold rows g and g + 8 of this warp's part (columns 0, 1 and 2, 3): add the parts */
        if (t < 2) {
#ifdef NBLK1
            part[(lk * 16 + g) * 2 + t] = lane_sum(c, 0, t);
            part[(lk * 16 + g + 8) * 2 + t] = lane_sum(c, 1, t);
#else
            /* the folded float parts, as their bits (lane t = 0's columns weigh 2^16 more) */
            const float wt = t == 0 ? 65536.0f : 1.0f;
            part[(lk * 16 + g) * 2 + t] = as_int(ya * wt);
            part[(lk * 16 + g + 8) * 2 + t] = as_int(yb * wt);
#endif
        }
#if NFOLD_ASYM
        __local float *zpart = red; /* red is free after the max */
        za = QUAD_SUM(za);
        zb = QUAD_SUM(zb);
        if (t == 0) {
            zpart[lk * 16 + g] = za;
            zpart[lk * 16 + g + 8] = zb;
        }
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lin < 16) {
#ifdef NBLK1
            long tot = 0;
            for (int w = 0; w < SPLIT; ++w)
                tot += part[(w * 16 + lin) * 2] + part[(w * 16 + lin) * 2 + 1];
            float acc = o_scale * ((float)tot * inv.x * inv.y);
#ifdef ASYM
            acc = fma(o_offset, xtotal, acc);
#endif
#else
            float hi = 0.0f, lo = 0.0f;
            for (int w = 0; w < SPLIT; ++w) {
                hi += as_float((int)part[(w * 16 + lin) * 2]);
                lo += as_float((int)part[(w * 16 + lin) * 2 + 1]);
            }
            float acc = (hi + lo) * inv.x * inv.y;
#ifdef ASYM
            for (int w = 0; w < SPLIT; ++w)
                acc += zpart[w * 16 + lin];
#endif
#endif
#ifdef HAS_BIAS
            acc += o_bias;
#endif
            const float v = finite ? ACTIVATE(acc) : NAN;
#ifdef OUT_NCHW
            if (o < OC)
                y[o] = v;
#else
            if (o < OCP)
                y[o] = o < OC ? v : 0.0f;
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* part (and red) are written again by the next tile */
    }
}
