/* Dynamic activation quantization on the device (act_quant="row"; quant_row / row_params in common.cl).
 *
 * Build options: IN_NCHW (else NC4HW4).
 */

/* quant_rows: x -> dequantize(quantize_row(x)) per sample (the float kernels then read it): one
 * work-group per sample n. NCHW: the sample is E = C*H*W contiguous floats at n*E. NC4HW4
 * ([C4][N][HW][4], HW = E4 / (4 * C4)): lane c of block c4 is at ((c4*N + n)*HW + p)*4 + lane; padding
 * lanes (channel >= C) are left out of the max and written as 0. */
__kernel void quant_rows(__global const float *x, __global float *xd, __local float *red, const int E,
                         const int nsamples, const int C, const int HW) {
    const int n = get_group_id(0);
    const int lid = get_local_id(0), nloc = get_local_size(0);
#ifdef IN_NCHW
#define QR_INDEX(i) (n * E + (i))
#define QR_VALID(i) true
#else
    /* i runs over the sample's C4*HW*4 slots */
#define QR_INDEX(i) ((((i) / (HW * 4)) * nsamples + n) * HW * 4 + (i) % (HW * 4))
#define QR_VALID(i) (((i) / (HW * 4)) * 4 + (i) % 4 < C)
#endif
    float m = 0.0f;
    for (int i = lid; i < E; i += nloc)
        if (QR_VALID(i))
            m = fmax(m, fabs(x[QR_INDEX(i)]));
    const float2 qd = row_params(work_group_amax(red, m, lid, nloc));
    for (int i = lid; i < E; i += nloc)
        xd[QR_INDEX(i)] = QR_VALID(i) ? (float)quant_row(x[QR_INDEX(i)], qd.x) * qd.y : 0.0f;
}
