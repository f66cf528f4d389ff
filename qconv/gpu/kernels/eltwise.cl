/* Elementwise kernels of qconv.pipeline (qconv/gpu/eltwise.py builds and launches them).
 *
 * add_act: the residual add, in place: y[i] = ACTIVATE(y[i] + r[i]) for 0 <= i < n.
 *   y, r: float32 buffers of at least n elements, the same shape and layout (NCHW or NC4HW4: the add does not
 *   care; NC4HW4 padding lanes hold 0 in both and stay 0 under every ACT). y and r must not overlap.
 *   ACT (common.cl): 0 none, 1 relu (fmax(v, 0)), 2 relu6 (clamp(v, 0, 6)); one rounding (the float32 sum),
 *   so the result is bitwise numpy's float32 y + r followed by the same activation, for finite values.
 *   NDRange: (ceil(n / 4)) work-items, any local size; item i handles elements 4i .. 4i+3 (float4 when all
 *   four exist, else element by element). */
__kernel void add_act(__global float *y, __global const float *r, const int n) {
    const int i = get_global_id(0);
    const int e = 4 * i;
    if (e + 3 < n) {
        const float4 v = vload4(i, y) + vload4(i, r);
        vstore4((float4)(ACTIVATE(v.s0), ACTIVATE(v.s1), ACTIVATE(v.s2), ACTIVATE(v.s3)), i, y);
    } else {
        for (int k = e; k < n; ++k)
            y[k] = ACTIVATE(y[k] + r[k]);
    }
}
