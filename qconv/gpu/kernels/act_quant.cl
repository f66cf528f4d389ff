/* Dynamic activation quantization on the device (act_quant="row"; quant_row / row_params in common.cl).
 *
 * Build options: IN_NCHW (else NC4HW4); ONE_GROUP: quant_rows / quant_rows_i8 run one work-group per sample
 * (NDRange (L, N)), which takes the sample's max |x| itself (one launch, no row_amax; part and G unused);
 * without it they read the G partial maxima row_amax wrote (two launches, many work-groups per sample).
 */

/* quant_rows: NDRange (G2 * L, N), local (L, 1): x -> dequantize(quantize_row(x)) per sample (the float kernels
 * then read it), amax the max of row_amax's G partials (below) or, with ONE_GROUP (G2 = 1), the group's own.
 * NCHW: the sample is E = C*H*W contiguous floats at n*E. NC4HW4 ([C4][N][HW][4], HW = E4 / (4 * C4)): lane c
 * of block c4 is at ((c4*N + n)*HW + p)*4 + lane; padding lanes (channel >= C) are left out of the max and written as 0. */
#ifdef IN_NCHW
#define QR_INDEX(i) (n * E + (i))
#define QR_VALID(i) true
#else
/* i runs over the sample's C4*HW*4 slots */
#define QR_INDEX(i) ((((i) / (HW * 4)) * nsamples + n) * HW * 4 + (i) % (HW * 4))
#define QR_VALID(i) (((i) / (HW * 4)) * 4 + (i) % 4 < C)
#endif

/* max |x| over sample n's slots first, first + step, ... (padding lanes left out) */
inline float slots_amax(__global const float *x, int n, int first, int step, const int E, const int nsamples,
                        const int C, const int HW) {
    float m = 0.0f;
    for (int i = first; i < E; i += step)
        if (QR_VALID(i))
            m = fmax(m, fabs(x[QR_INDEX(i)]));
    return m;
}

/* max |x| of sample n: from row_amax's G partials, or (ONE_GROUP) from the work-group's own pass */
inline float sample_amax(__global const float *x, __global const float *part, const int G, __local float *red,
                         int n, const int E, const int nsamples, const int C, const int HW) {
#ifdef ONE_GROUP
    const int lid = get_local_id(0), nloc = get_local_size(0);
    return work_group_amax(red, slots_amax(x, n, lid, nloc, E, nsamples, C, HW), lid, nloc);
#else
    float m = 0.0f;
    for (int g = 0; g < G; g++)
        m = fmax(m, part[n * G + g]);
    return m;
#endif
}

/* (1/scale, scale) of sample n (row_params of its max |x|) */
inline float2 sample_params(__global const float *x, __global const float *part, const int G, __local float *red,
                            int n, const int E, const int nsamples, const int C, const int HW) {
    return row_params(sample_amax(x, part, G, red, n, E, nsamples, C, HW));
}

__kernel void quant_rows(__global const float *x, __global const float *part, const int G, __local float *red,
                         __global float *xd, const int E, const int nsamples, const int C, const int HW) {
    const int n = get_group_id(1), G2 = get_num_groups(0);
    const float2 qd = sample_params(x, part, G, red, n, E, nsamples, C, HW);
    for (int i = get_group_id(0) * get_local_size(0) + get_local_id(0); i < E; i += G2 * get_local_size(0))
        xd[QR_INDEX(i)] = QR_VALID(i) ? (float)quant_row(x[QR_INDEX(i)], qd.x) * qd.y : 0.0f;
}

/* act_quant="row" of large samples in two launches over many work-groups (one per sample would leave most of a
 * GPU idle): row_amax, then quant_rows (float kernels) or quant_rows_i8 (conv_mma); small samples in one
 * ONE_GROUP launch (a launch costs more host time than one group's two passes over them).
 * row_amax: NDRange (G * L, N), local (L, 1): work-group (g, n) writes the max |x| over its share of sample
 * n's E slots to part[n * G + g]. */
__kernel void row_amax(__global const float *x, __global float *part, __local float *red, const int E,
                       const int nsamples, const int C, const int HW) {
    const int n = get_group_id(1), G = get_num_groups(0);
    const int lid = get_local_id(0), nloc = get_local_size(0);
    const float m = work_group_amax(red, slots_amax(x, n, get_group_id(0) * nloc + lid, G * nloc, E, nsamples, C, HW),
                                    lid, nloc);
    if (lid == 0)
        part[n * G + get_group_id(0)] = m;
}

/* channel ch of pixel p of sample n (0 for channels >= C: the 32-channel chunks' padding) */
inline float channel_at(__global const float *x, int n, int ch, int p, const int nsamples, const int C, const int HW) {
    if (ch >= C)
        return 0.0f;
#ifdef IN_NCHW
    return x[(n * C + ch) * HW + p];
#else
    return x[(((ch / 4) * nsamples + n) * HW + p) * 4 + ch % 4];
#endif
}

/* quant_rows_i8: NDRange (G2 * L, N), local (L, 1): x -> its int8 quantization per sample (amax: the max of
 * row_amax's G partials, or with ONE_GROUP (G2 = 1) the group's own) in NC4HW4 with a pack of 32
 * (qconv.layouts.NC4HW4(32) over int8: [CH32][N][HW][32] bytes, channels >= C are 0; as 32-bit words
 * [CH32][N][HW][8], word j holding channels 4j .. 4j+3 of the chunk, byte e = channel 4j + e) and dx[n] = amax/127
 * (1 when amax is 0). */
__kernel void quant_rows_i8(__global const float *x, __global const float *part, const int G, __local float *red,
                            __global uint *xq, __global float *dx, const int E, const int nsamples, const int C,
                            const int HW) {
    const int n = get_group_id(1), G2 = get_num_groups(0);
    const int lid = get_local_id(0), nloc = get_local_size(0);
    const float2 qd = sample_params(x, part, G, red, n, E, nsamples, C, HW);
    if (get_group_id(0) == 0 && lid == 0)
        dx[n] = qd.y;
    /* word (c32, j, p), p fastest: neighbouring items read neighbouring pixels of one channel */
    const int nwords = CDIV(C, 32) * 8 * HW;
    for (int i = get_group_id(0) * nloc + lid; i < nwords; i += G2 * nloc) {
        const int p = i % HW, cj = i / HW; /* cj = 8 * c32 + j */
        uint word = 0;
        for (int e = 0; e < 4; e++) {
            const int ch = 4 * cj + e;
            const float v = channel_at(x, n, ch, p, nsamples, C, HW);
            word |= ((uint)quant_row(v, qd.x) & 0xFFu) << (8 * e);
        }
        xq[(((cj / 8) * nsamples + n) * HW + p) * 8 + cj % 8] = word;
    }
}

/* quant_rows_digits (float activations on conv_mma; build option DIGITS = 2 or 3, X_BITS = 8 * DIGITS - 2):
 * NDRange and amax as quant_rows_i8. Sample n is scaled by 2^sh, the power of two that puts max |x| in
 * [2^(X_BITS-1), 2^X_BITS) (|sh| <= 126: 2^-sh stays a normal float; sh = 0 when max |x| is 0), and
 * X = rint(x 2^sh) (ties to even) is written as DIGITS signed base-256 digits X = sum_d X_d 256^(DIGITS-1-d)
 * (X_d in [-128, 127] below the leading one, the leading one in [-64, 64]): digit d of input chunk c32 goes to
 * chunk DIGITS * c32 + d of NC4HW4(32) int8 words [DIGITS * CH32][N][HW][8] (OpenCLMMAWeightLayout(digits=DIGITS)
 * pairs each copy of a weight chunk with one digit). dx[n] = 2^-sh; NaN when x holds a non-finite value. */
#ifdef DIGITS
__kernel void quant_rows_digits(__global const float *x, __global const float *part, const int G,
                                __local float *red, __global uint *xq, __global float *dx, const int E,
                                const int nsamples, const int C, const int HW) {
    const int n = get_group_id(1), G2 = get_num_groups(0);
    const int lid = get_local_id(0), nloc = get_local_size(0);
    const float amax = sample_amax(x, part, G, red, n, E, nsamples, C, HW);
    int e = 0;
    frexp(amax, &e); /* amax = m 2^e, m in [0.5, 1) */
    const int sh = amax > 0.0f ? clamp(X_BITS - e, -126, 126) : 0;
    const float up = as_float((uint)(127 + sh) << 23); /* 2^sh */
    if (get_group_id(0) == 0 && lid == 0)
        dx[n] = isfinite(amax) ? as_float((uint)(127 - sh) << 23) : NAN;
    const int nwords = CDIV(C, 32) * 8 * HW;
    for (int i = get_group_id(0) * nloc + lid; i < nwords; i += G2 * nloc) {
        const int p = i % HW, cj = i / HW; /* cj = 8 * c32 + j */
        uint words[DIGITS];
        for (int d = 0; d < DIGITS; d++)
            words[d] = 0u;
        for (int b = 0; b < 4; b++) {
            const int ch = 4 * cj + b;
            const float v = channel_at(x, n, ch, p, nsamples, C, HW);
            int q = isfinite(v) ? convert_int_rte(v * up) : 0;
            for (int d = DIGITS - 1; d >= 0; d--) {
                const int lo = (q << 24) >> 24; /* the signed low byte */
                words[d] |= ((uint)lo & 0xFFu) << (8 * b);
                q = (q - lo) >> 8;
            }
        }
        for (int d = 0; d < DIGITS; d++)
            xq[((((cj / 8) * DIGITS + d) * nsamples + n) * HW + p) * 8 + cj % 8] = words[d];
    }
}
#endif
