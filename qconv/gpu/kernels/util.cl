/* Utility kernels: the float4 copy used to measure the device's memory bandwidth (benchmarks). */
__kernel void copy_float4(__global const float4 *src, __global float4 *dst, const int n) {
    const int i = get_global_id(0);
    if (i < n)
        dst[i] = src[i];
}
