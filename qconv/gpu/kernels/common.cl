/* qconv OpenCL kernels: shared definitions (prepended to every program by qconv.gpu.programs).
 *
 * Build options (generated from the layout specs in qconv/layouts/opencl.py and the ConvSpec):
 *   QBITS=8|4        weight bits (OpenCLConvWeightLayout / OpenCL1x1BufferLayout)
 *   SCALE_HALF       scales/offsets stored as fp16, read with vload_half (OpenCLScaleLayout)
 *   ASYM             offsets present (w = q*s + a), else symmetric (w = q*s)
 *   NBLK1            one block per output channel (per-channel scales)
 *   BLOCK_CH=b       input channels per block (blockwise; a block = b channels x all taps)
 *   HAS_BIAS, ACT=0|1|2|3|4 (none, relu, relu6, hardswish: (v * clamp(v + 3, 0, 6)) / 6, silu: v / (1 + exp(-v)));
 *   codes from qconv._validate.ACTIVATION_CODES
 *   IN_NCHW / OUT_NCHW  activations in NCHW, else NC4HW4 [ceil(C/4)][N][H][W][4]
 * Geometry constants are kernel arguments; an option G_<NAME>=v turns one into a compile-time
 * constant (specialisation: lets the compiler unroll the tap loops).
 *
 * Activations and accumulation are float32; weights are dequantised in registers.
 */
#ifdef SCALE_HALF
#define SCALE_T half
#define LOAD_S1(p, i) vload_half((i), (p))
#define LOAD_S4(p, i) vload_half4(0, (p) + (i))
#define LOAD_S2(p, i) vload_half2(0, (p) + (i))
#else
#define SCALE_T float
#define LOAD_S1(p, i) ((p)[i])
#define LOAD_S4(p, i) vload4(0, (p) + (i))
#define LOAD_S2(p, i) vload2(0, (p) + (i))
#endif

#ifndef ACT
#define ACT 0
#endif
#if ACT == 1
#define ACTIVATE(v) fmax((v), 0.0f)
#elif ACT == 2
#define ACTIVATE(v) clamp((v), 0.0f, 6.0f)
#elif ACT == 3
#define ACTIVATE(v) (((v) * clamp((v) + 3.0f, 0.0f, 6.0f)) / 6.0f)
#elif ACT == 4
#define ACTIVATE(v) ((v) / (1.0f + exp(-(v))))
#else
#define ACTIVATE(v) (v)
#endif

#define CDIV(a, b) (((a) + (b) - 1) / (b))

/* lane j of a float4 is a valid channel when base + j < limit */
inline float4 mask_lanes(float4 v, int base, int limit) {
    int4 c = (int4)(base) + (int4)(0, 1, 2, 3);
    return select((float4)(0.0f), v, c < (int4)(limit));
}

/* Weight decode without int->float conversions (a quarter-rate instruction on NVIDIA GPUs): a small
 * integer u < 2**23 or'ed into the mantissa of 2**23 is the float 2**23 + u exactly, and subtracting
 * 2**23 + bias leaves u - bias exactly. Words are little-endian (the engine refuses big-endian devices). */

/* 4 int8 values (two's complement bytes, byte e = element e) of a word -> float */
inline float4 q8x4(uint word) {
    const uint4 b = ((uint4)(word) >> (uint4)(0, 8, 16, 24)) & (uint4)(0xFFu);
    return as_float4(b ^ (uint4)(0x4B000080u)) - (float4)(8388736.0f); /* (b ^ 0x80) = q + 128 */
}

/* 4 int4 codes (q + 8, element e at bits shift + 4e) of a word -> float q */
inline float4 q4x4(uint word, uint shift) {
    const uint4 n = ((uint4)(word >> shift) >> (uint4)(0, 4, 8, 12)) & (uint4)(15u);
    return as_float4(n | (uint4)(0x4B000000u)) - (float4)(8388616.0f);
}

/* 4-way byte dot products c + sum a_i * b_i (a unsigned / signed bytes, b signed bytes): inline PTX dp4a
 * with -DNV_PTX (NVIDIA), plain integer arithmetic elsewhere. */
#ifdef NV_PTX
inline int dp4a_us(uint a, uint b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
inline int dp4a_ss(uint a, uint b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
#else
inline int dp4a_us(uint a, uint b, int c) {
    const int4 x = convert_int4(as_char4(b));
    const int4 w = convert_int4(as_uchar4(a));
    return c + w.x * x.x + w.y * x.y + w.z * x.z + w.w * x.w;
}
inline int dp4a_ss(uint a, uint b, int c) {
    const int4 x = convert_int4(as_char4(b));
    const int4 w = convert_int4(as_char4(a));
    return c + w.x * x.x + w.y * x.y + w.z * x.z + w.w * x.w;
}
#endif

/* Channel counts: compile-time constants when specialised (-DG_IC/-DG_OC), else kernel arguments. */
#ifdef G_IC
#define IC G_IC
#else
#define IC a_ic
#endif
#ifdef G_OC
#define OC G_OC
#else
#define OC a_oc
#endif
/* Conv geometry (conv_general, conv_gemm): compile-time constants when specialised (-DG_<NAME>). */
#ifdef G_GROUPS
#define GROUPS G_GROUPS
#else
#define GROUPS a_groups
#endif
#ifdef G_KH
#define KH G_KH
#else
#define KH a_kh
#endif
#ifdef G_KW
#define KW G_KW
#else
#define KW a_kw
#endif
#ifdef G_SH
#define SH G_SH
#else
#define SH a_sh
#endif
#ifdef G_SW
#define SW G_SW
#else
#define SW a_sw
#endif
#ifdef G_PH
#define PH G_PH
#else
#define PH a_ph
#endif
#ifdef G_PW
#define PW G_PW
#else
#define PW a_pw
#endif
#ifdef G_DH
#define DH G_DH
#else
#define DH a_dh
#endif
#ifdef G_DW
#define DW G_DW
#else
#define DW a_dw
#endif

/* act_quant="row" (qconv.reference.quantize_activation), per sample: xq = clip(round_half_away(v * qs),
 * -127, 127) with qs = 127/amax, dx = amax/127 correctly rounded (programs that use these are built with
 * -cl-fp32-correctly-rounded-divide-sqrt). */
inline int quant_row(float v, float qs) {
    return clamp(convert_int(round(v * qs)), -127, 127);
}

/* (qs, dx), or (1, 1) when amax is 0 or 127/amax overflows (the oracle's _usable) */
inline float2 row_params(float amax) {
    const float qs = 127.0f / amax;
    const bool ok = amax > 0.0f && isfinite(qs);
    return ok ? (float2)(qs, amax / 127.0f) : (float2)(1.0f, 1.0f);
}

/* Reductions over a work-group of a power-of-two size nloc (every item calls them with its linear id lid;
 * red: nloc floats or ints of local memory, which the caller may rewrite only after a barrier). With
 * -DNV_PTX and nloc a multiple of 32 they run on warps (32 consecutive linear ids on NVIDIA GPUs): a
 * butterfly of PTX shuffles, one barrier, then every warp reduces the warps' results again; else a tree in
 * local memory. max and integer sums do not depend on the order, so both give the same bits. */
#ifdef NV_PTX
inline float warp_max(float v) {
    for (int s = 16; s > 0; s >>= 1) {
        float o;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 31, 0xffffffff;" : "=f"(o) : "f"(v), "r"(s));
        v = fmax(v, o);
    }
    return v;
}
inline int warp_isum(int v) {
    for (int s = 16; s > 0; s >>= 1) {
        int o;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 31, 0xffffffff;" : "=r"(o) : "r"(v), "r"(s));
        v += o;
    }
    return v;
}
#define WARP_REDUCE(red, v, lid, nloc, zero, warp_op)                                             \
    if ((nloc) % 32 == 0) {                                                                       \
        v = warp_op(v);                                                                           \
        if ((lid) % 32 == 0)                                                                      \
            red[(lid) / 32] = v;                                                                  \
        barrier(CLK_LOCAL_MEM_FENCE);                                                             \
        v = (lid) % 32 < (nloc) / 32 ? red[(lid) % 32] : (zero);                                  \
        return warp_op(v);                                                                        \
    }
#else
#define WARP_REDUCE(red, v, lid, nloc, zero, warp_op)
#endif

/* op(a, b) over the work-group: the warp version where it applies, else a tree (returns from the caller) */
#define WORK_GROUP_REDUCE(red, v, lid, nloc, zero, op, warp_op)                                 \
    WARP_REDUCE(red, v, lid, nloc, zero, warp_op)                                               \
    red[lid] = v;                                                                               \
    barrier(CLK_LOCAL_MEM_FENCE);                                                               \
    for (int s_ = (nloc) / 2; s_ > 0; s_ >>= 1) {                                               \
        if ((lid) < s_)                                                                         \
            red[lid] = op(red[lid], red[(lid) + s_]);                                           \
        barrier(CLK_LOCAL_MEM_FENCE);                                                           \
    }                                                                                           \
    return red[0];
#define IADD(a, b) ((a) + (b))

inline float work_group_amax(__local float *red, float m, int lid, int nloc) {
    WORK_GROUP_REDUCE(red, m, lid, nloc, 0.0f, fmax, warp_max)
}

inline int work_group_isum(__local int *red, int v, int lid, int nloc) {
    WORK_GROUP_REDUCE(red, v, lid, nloc, 0, IADD, warp_isum)
}
