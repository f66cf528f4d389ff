/* qconv OpenCL kernels: shared definitions (prepended to every program by qconv.gpu.programs).
 *
 * Build options (generated from the layout specs in qconv/layouts/opencl.py and the ConvSpec):
 *   QBITS=8|4        weight bits (OpenCLConvWeightLayout / OpenCL1x1BufferLayout)
 *   SCALE_HALF       scales/offsets stored as fp16, read with vload_half (OpenCLScaleLayout)
 *   ASYM             offsets present (w = q*s + a), else symmetric (w = q*s)
 *   NBLK1            one block per output channel (per-channel scales)
 *   BLOCK_CH=b       input channels per block (blockwise; a block = b channels x all taps)
 *   HAS_BIAS, ACT=0|1|2 (none, relu, relu6)
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
#else
#define ACTIVATE(v) (v)
#endif

#define CDIV(a, b) (((a) + (b) - 1) / (b))

/* lane j of a float4 is a valid channel when base + j < limit */
inline float4 mask_lanes(float4 v, int base, int limit) {
    int4 c = (int4)(base) + (int4)(0, 1, 2, 3);
    return select((float4)(0.0f), v, c < (int4)(limit));
}

/* 8 int4 codes of a little-endian word -> float values q = code - 8, element e at bits 4e..4e+3 */
inline float8 nibbles8(uint w) {
    uint8 s = (uint8)(w) >> (uint8)(0, 4, 8, 12, 16, 20, 24, 28);
    return convert_float8(s & (uint8)(15)) - (float8)(8.0f);
}

/* 4 int4 codes from bits [shift, shift+16) of a word */
inline float4 nibbles4(uint w, uint shift) {
    uint4 s = (uint4)(w >> shift) >> (uint4)(0, 4, 8, 12);
    return convert_float4(s & (uint4)(15)) - (float4)(8.0f);
}
