/* Linear layers on one row (N = H = W = 1) with float activations on the f16 tensor cores (gemv_mma).
 *
 * y[o] = act(sum_k (q[o,k] s[o,b(k)] + a[o,b(k)]) x[k] + bias[o])   (b(k): k's scale block; one block: NBLK1)
 *
 * The int4/int8 codes q are exact in f16. x is split per element into two f16 numbers, x * 2^e = hi + lo (hi:
 * x * 2^e rounded to f16, lo: the remainder rounded to f16; 22 significant bits per element), with 2^e putting
 * max |x| in [2^14, 2^15) so that neither overflows. One mma.sync.m16n8k16 (f32 accumulation) multiplies a
 * tile of 16 output channels x 16 k by the columns hi (0) and lo (1) of its B operand (columns 2-7 are 0),
 * so column 0 + column 1 of the result is sum_k q x 2^e for the 16 channels. Scales apply per block (folded
 * into f32 every BLOCK_CH / 16 k-steps) or once at the end (NBLK1); offsets multiply the float sums of x.
 *
 * Weights: OpenCLGemvMMALayout, uint4 [ceil(O/16)][KL][32 lanes]: lane l's 16 bytes are its A fragments of
 * MPL = KT/16 k-steps (KT = 64 int4, 32 int8 channels per load). Decoded without int->float conversions:
 * a nibble or byte or'ed under the f16 exponent of 1024 (or 64 for a nibble at bits 4-7) is 1024 + u
 * (64 + u) exactly; subtracting 1024 + 8 (64 + 8; bytes: u = q + 128, 1024 + 128) leaves q.
 *
 * NDRange: local (32, SPLIT) = SPLIT warps, G work-groups (the engine: at most the device's resident ones);
 * group g takes the tiles g, g + G, ...; warp lk takes loads kl = lk, lk + SPLIT, ... of the tile, U of them
 * in flight, and the warps' partial sums are added in local memory in a fixed order. Every group first
 * splits x into hi/lo in local memory (KS k-steps x 2 columns x 4 lanes x uint2 = 64 bytes per 16 k).
 *
 * Non-finite x gives non-finite outputs (NaN where the CUDA-core kernels may give +-inf: lo = inf - inf).
 *
 * Without -DNV_PTX the mma is emulated through local memory (each lane writes its fragment, every lane
 * computes its part of D): the same fragment mapping and sums, for devices without PTX (CI on PoCL).
 *
 * Build options: QBITS, SCALE_HALF, ASYM, NBLK1 | BLOCK_CH (a multiple of 16), HAS_BIAS, ACT, OUT_NCHW, G_IC,
 * G_OC, SPLIT, U, NV_PTX.
 */
#ifndef QBITS
#error "QBITS must be defined (4 or 8)"
#endif
#ifndef U
#define U 4
#endif
#define KT (QBITS == 4 ? 64 : 32) /* input channels per 16-byte load of a lane */
#define MPL (KT / 16)             /* mma k-steps per load */
#define KL CDIV(IC, KT)           /* loads per tile row */
#define KS (KL * MPL)             /* k-steps (16 channels each) */
#define QT (32 * SPLIT)           /* items per work-group */
#ifdef NBLK1
#define XB 64                     /* channels per partial sum of x (the offsets' sum x, per-channel) */
#else
#define XB BLOCK_CH
#define SPB (BLOCK_CH / 16)       /* k-steps per scale block */
#define FOLD (SPB < MPL ? SPB : MPL) /* k-steps per fold: a load never straddles two blocks */
#if SPB % MPL != 0 && MPL % SPB != 0
#error "BLOCK_CH must divide or be a multiple of the channels per load"
#endif
#define NFB (MPL / FOLD)          /* folds per load */
#define NBLK (IC / BLOCK_CH)
#endif
#define NXB CDIV(IC, XB)

#ifdef NV_PTX
inline uint f16x2_sub(uint a, uint b) {
    uint d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
inline uint prmt(uint a, uint b, uint sel) {
    uint d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
inline void mma_f16(float *c, const uint *a, uint2 b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}
#define BIAS_SUB(v, c) f16x2_sub((v), (c))
#else
#define BIAS_SUB(v, c) (v) /* the emulation subtracts in float (see mma_emul) */
#endif

/* A fragments (4 f16x2: (a0,a1) (a2,a3) (a4,a5) (a6,a7)) of k-step m of a lane's 16 bytes */
inline void decode_a(uint4 wv, int m, uint *a) {
#if QBITS == 4
    const uint w = m == 0 ? wv.x : m == 1 ? wv.y : m == 2 ? wv.z : wv.w;
    const uint w8 = w >> 8;
    a[0] = BIAS_SUB((w & 0x000F000Fu) | 0x64006400u, 0x64086408u);  /* 1024 + n - 1032 */
    a[1] = BIAS_SUB((w & 0x00F000F0u) | 0x54005400u, 0x54805480u);  /* 64 + n - 72 */
    a[2] = BIAS_SUB((w8 & 0x000F000Fu) | 0x64006400u, 0x64086408u);
    a[3] = BIAS_SUB((w8 & 0x00F000F0u) | 0x54005400u, 0x54805480u);
#else
    const uint u0 = (m == 0 ? wv.x : wv.z) ^ 0x80808080u, u1 = (m == 0 ? wv.y : wv.w) ^ 0x80808080u;
#ifdef NV_PTX
    a[0] = BIAS_SUB(prmt(u0, 0x64646464u, 0x4140u), 0x64806480u);  /* 1024 + q + 128 - 1152 */
    a[1] = BIAS_SUB(prmt(u0, 0x64646464u, 0x4342u), 0x64806480u);
    a[2] = BIAS_SUB(prmt(u1, 0x64646464u, 0x4140u), 0x64806480u);
    a[3] = BIAS_SUB(prmt(u1, 0x64646464u, 0x4342u), 0x64806480u);
#else
    a[0] = (u0 & 0xFFu) | (u0 & 0xFF00u) << 8 | 0x64006400u;
    a[1] = (u0 >> 16 & 0xFFu) | (u0 >> 24) << 16 | 0x64006400u;
    a[2] = (u1 & 0xFFu) | (u1 & 0xFF00u) << 8 | 0x64006400u;
    a[3] = (u1 >> 16 & 0xFFu) | (u1 >> 24) << 16 | 0x64006400u;
#endif
#endif
}

#ifndef NV_PTX
/* mma.m16n8k16 (only B columns 0 and 1 are nonzero) through the warp's local tiles As[16][16], Bs[16][2] */
inline void mma_emul(float *c, const uint *a, uint2 b, __local float *As, __local float *Bs, int g, int t) {
    float av[8];
    for (int i = 0; i < 4; ++i) {
        const float2 h = vload_half2(0, (const __private half *)&a[i]);
#if QBITS == 4
        const float bias = i % 2 == 0 ? 1032.0f : 72.0f;
#else
        const float bias = 1152.0f;
#endif
        av[2 * i] = h.x - bias;
        av[2 * i + 1] = h.y - bias;
    }
    /* element j of the fragment: rows g (+8 for j = 2,3,6,7), columns 2t, 2t+1 (+8 for j >= 4) */
    for (int j = 0; j < 8; ++j)
        As[(g + 8 * ((j >> 1) & 1)) * 16 + 2 * t + (j & 1) + 8 * (j >> 2)] = av[j];
    if (g < 2) {
        const uint bw[2] = {b.x, b.y};
        const float2 b0 = vload_half2(0, (const __private half *)&bw[0]);
        const float2 b1 = vload_half2(0, (const __private half *)&bw[1]);
        Bs[(2 * t) * 2 + g] = b0.x;
        Bs[(2 * t + 1) * 2 + g] = b0.y;
        Bs[(2 * t + 8) * 2 + g] = b1.x;
        Bs[(2 * t + 9) * 2 + g] = b1.y;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (t == 0) { /* D columns 0 and 1 (the lanes t > 0 hold columns 2-7: zero) */
        for (int r = 0; r < 2; ++r)
            for (int col = 0; col < 2; ++col) {
                float d = 0.0f;
                for (int k = 0; k < 16; ++k)
                    d = fma(As[(g + 8 * r) * 16 + k], Bs[k * 2 + col], d);
                c[2 * r + col] += d;
            }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#endif

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
    const int OCP = CDIV(OC, 4) * 4; /* the scale layout's rows; the output's in NC4HW4 */
    const int OT = CDIV(OC, 16);

    __local uint2 xb[2 * KS * 4];     /* [column hi/lo][k-step][t]: the B fragments (b0b1, b2b3) */
#ifdef ASYM
    __local float xsum[NXB];          /* sums of x per XB channels (unscaled): the offsets' factor */
#endif
    __local float red[QT];            /* max |x|, then the warps' partial sums [SPLIT][16] */
#ifndef NV_PTX
    __local float emu[SPLIT * (256 + 32)];
    __local float *As = emu + lk * (256 + 32), *Bs = As + 256;
#endif

    /* x * 2^e = hi + lo, 2^e puts max |x| in [2^14, 2^15) (1 when max |x| is 0, inf or NaN) */
    float m = 0.0f;
    for (int k = lin; k < IC; k += QT)
        m = fmax(m, fabs(x[k]));
    const float amax = work_group_amax(red, m, lin, QT);
    int e;
    frexp(amax, &e);
    const bool normal = amax > 0.0f && isfinite(amax);
    const int sh = normal ? clamp(15 - e, -126, 126) : 0;
    const float sc = ldexp(1.0f, sh), inv = ldexp(1.0f, -sh);
    for (int p = lin; p < KS * 8; p += QT) { /* channel pair (2p, 2p + 1) */
        const int k = 2 * p, s = k >> 4, r = k & 15;
        const float2 v = (float2)(k < IC ? x[k] : 0.0f, k + 1 < IC ? x[k + 1] : 0.0f) * sc;
        const int slot = (s * 4 + ((r & 7) >> 1)) * 2 + (r >> 3); /* uint index: (t, b0b1 | b2b3) */
        __local half *ph = (__local half *)((__local uint *)xb + slot);
        __local half *pl = (__local half *)((__local uint *)xb + 8 * KS + slot);
        vstore_half2_rte(v, 0, ph);
        vstore_half2_rte(v - vload_half2(0, ph), 0, pl);
    }
#ifdef ASYM
    for (int b = lin; b < NXB; b += QT) {
        float s = 0.0f;
        for (int k = b * XB; k < min(IC, (b + 1) * XB); ++k)
            s += x[k];
        xsum[b] = s;
    }
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
#if defined(NBLK1) && defined(ASYM)
    float xtotal = 0.0f;
    for (int b = 0; b < NXB; ++b)
        xtotal += xsum[b];
#endif

    for (int tile = get_group_id(0); tile < OT; tile += get_num_groups(0)) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const int og = min(tile * 16 + g, OC - 1), og8 = min(tile * 16 + g + 8, OC - 1); /* scale rows */
#ifndef NBLK1
        float ya = 0.0f, yb = 0.0f; /* rows g, g + 8: sum over folded blocks (units of x 2^e) */
#endif
        __global const uint4 *wt = wq + (size_t)tile * KL * 32 + lane;
        for (int base = 0; base < KL; base += SPLIT * U) { /* the same trip count in every warp */
            uint4 wv[U];
#ifndef NBLK1
            float sv[U][NFB][2]; /* the folds' scales (rows g, g + 8), loaded with the weights */
#ifdef ASYM
            float av[U][NFB][2];
#endif
#endif
#pragma unroll
            for (int j = 0; j < U; ++j) {
                const int klc = min(base + lk + j * SPLIT, KL - 1);
                wv[j] = wt[klc * 32];
#ifndef NBLK1
#pragma unroll
                for (int f = 0; f < NFB; ++f) {
                    const int blk = min((klc * MPL + f * FOLD) / SPB, NBLK - 1);
                    sv[j][f][0] = LOAD_S1(ws, blk * OCP + og);
                    sv[j][f][1] = LOAD_S1(ws, blk * OCP + og8);
#ifdef ASYM
                    av[j][f][0] = LOAD_S1(wo, blk * OCP + og);
                    av[j][f][1] = LOAD_S1(wo, blk * OCP + og8);
#endif
                }
#endif
            }
#pragma unroll
            for (int j = 0; j < U; ++j) {
                const int kl = base + lk + j * SPLIT;
                const bool valid = kl < KL;
#pragma unroll
                for (int mm = 0; mm < MPL; ++mm) {
                    uint a[4];
                    decode_a(wv[j], mm, a);
                    const int ks = kl * MPL + mm;
                    const uint2 bv = valid && g < 2 ? xb[(g * KS + ks) * 4 + t] : (uint2)(0u, 0u);
#ifdef NV_PTX
                    mma_f16(c, a, bv);
#else
                    mma_emul(c, a, bv, As, Bs, g, t);
#endif
#ifndef NBLK1
                    /* fold every FOLD steps of block ks / SPB into f32 with its scale; its offset times
                     * the block's sum of x once, at its last step (steps past IC are zero: skipped) */
                    if (valid && (ks + 1) % FOLD == 0 && ks < IC / 16) {
                        const int f = mm / FOLD;
                        ya = fma(sv[j][f][0], c[0] + c[1], ya);
                        yb = fma(sv[j][f][1], c[2] + c[3], yb);
#ifdef ASYM
                        if ((ks + 1) % SPB == 0) {
                            const float xs = xsum[ks / SPB] * sc;
                            ya = fma(av[j][f][0], xs, ya);
                            yb = fma(av[j][f][1], xs, yb);
                        }
#endif
                        c[0] = c[1] = c[2] = c[3] = 0.0f;
                    }
#endif
                }
            }
        }

        /* lanes t = 0 hold rows g and g + 8 of this warp's part: add the warps' parts in order */
        if (t == 0) {
#ifdef NBLK1
            red[lk * 16 + g] = c[0] + c[1];
            red[lk * 16 + g + 8] = c[2] + c[3];
#else
            red[lk * 16 + g] = ya;
            red[lk * 16 + g + 8] = yb;
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lin < 16) {
            const int o = tile * 16 + lin;
            float acc = 0.0f;
            for (int w = 0; w < SPLIT; ++w)
                acc += red[w * 16 + lin];
            const int os = min(o, OC - 1);
#ifdef NBLK1
            acc = LOAD_S1(ws, os) * (acc * inv);
#ifdef ASYM
            acc = fma(LOAD_S1(wo, os), xtotal, acc);
#endif
#else
            acc *= inv;
#endif
#ifdef HAS_BIAS
            acc += bias[os];
#endif
            const float v = ACTIVATE(acc);
#ifdef OUT_NCHW
            if (o < OC)
                y[o] = v;
#else
            if (o < OCP)
                y[o] = o < OC ? v : 0.0f;
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* red is written again by the next tile */
    }
}
