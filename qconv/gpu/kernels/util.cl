/* Utility kernels of the benchmarks: float4 copies (memory bandwidth), a read-only stream (the fastest any
 * kernel can read a given number of bytes) and an empty kernel (launch floor). */
__kernel void copy_float4(__global const float4 *src, __global float4 *dst, const int n) {
    const int i = get_global_id(0);
    if (i < n)
        dst[i] = src[i];
}

#ifndef UNR
#define UNR 4
#endif
/* grid-stride float4 copy, UNR float4s in flight per item per step (bandwidth reference) */
__kernel void copy_float4_gs(__global const float4 *src, __global float4 *dst, const int n) {
    const int stride = get_global_size(0);
    int i = get_global_id(0);
    for (; i + (UNR - 1) * stride < n; i += UNR * stride) {
        float4 v[UNR];
#pragma unroll
        for (int u = 0; u < UNR; ++u)
            v[u] = src[i + u * stride];
#pragma unroll
        for (int u = 0; u < UNR; ++u)
            dst[i + u * stride] = v[u];
    }
    for (; i < n; i += stride)
        dst[i] = src[i];
}

/* grid-stride read of n uint4, UNR in flight per item, folded by xor; the fold is stored only when it is not
 * zero, which never happens for a zero-filled src, so the kernel's traffic is its reads (the compiler cannot
 * drop them). */
__kernel void read_uint4_gs(__global const uint4 *src, __global uint *dst, const int n) {
    const int stride = get_global_size(0);
    int i = get_global_id(0);
    uint4 acc = (uint4)(0u);
    for (; i + (UNR - 1) * stride < n; i += UNR * stride) {
        uint4 v[UNR];
#pragma unroll
        for (int u = 0; u < UNR; ++u)
            v[u] = src[i + u * stride];
#pragma unroll
        for (int u = 0; u < UNR; ++u)
            acc ^= v[u];
    }
    for (; i < n; i += stride)
        acc ^= src[i];
    const uint f = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (f != 0u)
        dst[0] = f;
}

/* does nothing: its event duration is the device's per-launch floor (benchmarks) */
__kernel void null_kernel(__global float *p) {}

/* count_nonfinite (check_finite=True layers): count[0] += the NaN/inf values among x[0 .. n), leaving out
 * NC4HW4 padding lanes (i >= last && i % 4 >= tail, when tail > 0: lanes >= C % 4 of the last block).
 * Grid-stride; one atomic per item that found any. */
__kernel void count_nonfinite(__global const float *x, const int n, const int last, const int tail,
                              __global int *count) {
    int c = 0;
    for (int i = get_global_id(0); i < n; i += get_global_size(0))
        c += (tail > 0 && i >= last && (i & 3) >= tail) ? 0 : (isfinite(x[i]) ? 0 : 1);
    if (c)
        atomic_add(count, c);
}
