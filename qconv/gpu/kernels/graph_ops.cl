/* The operators a device graph (qconv/gpu/graph_ops.py) runs between qconv's layers, on float32 NCHW tensors
 * (C-contiguous, offsets in elements). Each kernel is built with the options its launch names; a work-item
 * writes one output element (or one row of a reduction) and indexes its inputs through the strides the host
 * passes, so one kernel serves every shape.
 *
 * unary:   y[i] = F(x[i]), i < n. UNARY: 0 identity, 1 relu, 2 clip(p0, p1), 3 sigmoid, 4 hard_sigmoid
 *          (clamp(p0 x + p1, 0, 1)), 5 hard_swish (x clamp(x / 6 + 1/2, 0, 1)), 6 leaky_relu (x < 0: p0 x), 7 tanh,
 *          8 silu (x sigmoid(x)), 9 exp, 10 sqrt, 11 neg, 12 abs, 13 erf-gelu (x (1 + erf(x / sqrt 2)) / 2),
 *          14 reciprocal.
 * binary:  y[i] = ACT(A(a[ia]) OP B(b[ib])) over an output of up to 6 dims (shape y_shape), ia / ib from
 *          broadcast strides (0 on broadcast axes). BINARY: 0 add, 1 sub, 2 mul, 3 div, 4 max, 5 min, 6 pow; ACT
 *          (common.cl) after; A, B: the unary ops PRE_A, PRE_B (UNARY codes, identity by default) with parameters
 *          pre = (a's p0, p1, b's p0, p1): a unary op fused into its one reader.
 * affine:  y[n][c][s] = ACT(x[n][c][s] * sc[c] + sh[c]) (BatchNormalization, a qconv node's post_affine), two
 *          roundings (the product, then the sum: the CPU engines' post_affine rule; FP_CONTRACT is off here).
 * copy_nd: y[yo + sum_d i_d ys_d] = x[xo + sum_d i_d xs_d] over a 6-dim index space (shape): Slice, Transpose,
 *          Concat (one launch per input), Pad's interior, DepthToSpace, Expand; strides may be negative (Slice
 *          with negative steps).
 * fill:    y[i] = v, i < n.
 * pool2d:  y[n][c][oy][ox] = max / average over the window (POOL_MAX, else average; COUNT_PAD: the average
 *          divides by the whole window, else by the taps inside the input) with kernel (kh, kw), stride, pads
 *          (top, left), dilation; NCHW, one output element per item.
 * mean_rows: y[r] = sum_j x[r * len + j] / len (GlobalAveragePool: rows = N*C, len = H*W; ReduceMean over the
 *          last axis); one work-group of RLOCAL items per row (tree sum in local memory).
 * softmax_rows: y = softmax over the last axis (rows of len), one work-group per row (max, sum of exp).
 * matmul:  y[t][m][n] = sum_k a[t][m][k] b[t][k][n] (float32 in order of k), t a batch index over bshape whose
 *          offsets in a and b come from broadcast strides (elements); one output element per item.
 * resize2d: NCHW (N*C planes) from (ih, iw) to (oh, ow): RESIZE_LINEAR (bilinear) or nearest (NEAREST_MODE: 0
 *          round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil), source coordinate from COORD_MODE: 0 half_pixel,
 *          1 asymmetric, 2 align_corners, 3 pytorch_half_pixel, 4 tf_half_pixel_for_nn; scale_h / scale_w are
 *          the output / input ratios the mode divides by.
 */

#pragma OPENCL FP_CONTRACT OFF

#define MAXD 6

/* op `code` of UNARY (a compile-time constant at every call: the switch folds away) */
inline float unary_op(const int code, const float v, const float p0, const float p1) {
    switch (code) {
    case 1: return fmax(v, 0.0f);
    case 2: return fmin(fmax(v, p0), p1);
    case 3: return 1.0f / (1.0f + exp(-v));
    case 4: return clamp(fma(p0, v, p1), 0.0f, 1.0f);
    case 5: return v * clamp(v / 6.0f + 0.5f, 0.0f, 1.0f);
    case 6: return v < 0.0f ? p0 * v : v;
    case 7: return tanh(v);
    case 8: return v / (1.0f + exp(-v));
    case 9: return exp(v);
    case 10: return sqrt(v);
    case 11: return -v;
    case 12: return fabs(v);
    case 13: return 0.5f * v * (1.0f + erf(v * 0.70710678118654752f));
    case 14: return 1.0f / v;
    default: return v;
    }
}

#ifndef UNARY
#define UNARY 0
#endif

__kernel void unary(__global const float *x, __global float *y, const int n, const float p0, const float p1) {
    const int i = get_global_id(0);
    if (i < n)
        y[i] = unary_op(UNARY, x[i], p0, p1);
}

/* the input offset of output element i: digits of i over `shape` (innermost last) times `strides` */
inline int nd_offset(int i, const int8 shape, const int8 strides) {
    int off = 0;
    const int s[MAXD] = {shape.s0, shape.s1, shape.s2, shape.s3, shape.s4, shape.s5};
    const int t[MAXD] = {strides.s0, strides.s1, strides.s2, strides.s3, strides.s4, strides.s5};
#pragma unroll
    for (int d = MAXD - 1; d >= 0; --d) {
        const int q = i / s[d];
        off += (i - q * s[d]) * t[d];
        i = q;
    }
    return off;
}

#ifndef PRE_A
#define PRE_A 0
#endif
#ifndef PRE_B
#define PRE_B 0
#endif

__kernel void binary(__global const float *a, __global const float *b, __global float *y, const int n,
                     const int8 shape, const int8 sa, const int8 sb, const float4 pre) {
    const int i = get_global_id(0);
    if (i >= n)
        return;
    const float u = unary_op(PRE_A, a[nd_offset(i, shape, sa)], pre.x, pre.y);
    const float v = unary_op(PRE_B, b[nd_offset(i, shape, sb)], pre.z, pre.w);
    float r;
#if BINARY == 0
    r = u + v;
#elif BINARY == 1
    r = u - v;
#elif BINARY == 2
    r = u * v;
#elif BINARY == 3
    r = u / v;
#elif BINARY == 4
    r = fmax(u, v);
#elif BINARY == 5
    r = fmin(u, v);
#elif BINARY == 6
    r = pow(u, v);
#endif
    y[i] = ACTIVATE(r);
}

__kernel void affine(__global const float *x, __global float *y, __global const float *sc, __global const float *sh,
                     const int n, const int C, const int S) {
    const int i = get_global_id(0);
    if (i >= n)
        return;
    const int c = (i / S) % C;
    y[i] = ACTIVATE(x[i] * sc[c] + sh[c]);
}

__kernel void copy_nd(__global const float *x, __global float *y, const int n, const int8 shape, const int8 xs,
                      const int8 ys, const int xo, const int yo) {
    const int i = get_global_id(0);
    if (i >= n)
        return;
    y[yo + nd_offset(i, shape, ys)] = x[xo + nd_offset(i, shape, xs)];
}

__kernel void fill(__global float *y, const int n, const float v) {
    const int i = get_global_id(0);
    if (i < n)
        y[i] = v;
}

__kernel void pool2d(__global const float *x, __global float *y, const int planes, const int IH, const int IW,
                     const int OH, const int OW, const int KH, const int KW, const int SH, const int SW,
                     const int PT, const int PL, const int DH, const int DW) {
    const int i = get_global_id(0);
    if (i >= planes * OH * OW)
        return;
    const int ox = i % OW, oy = (i / OW) % OH;
    __global const float *xp = x + (size_t)(i / (OH * OW)) * IH * IW; /* this output's input plane */
    const int y0 = oy * SH - PT, x0 = ox * SW - PL;
#ifdef POOL_MAX
    float acc = -INFINITY;
#else
    float acc = 0.0f;
    int cnt = 0;
#endif
    for (int ky = 0; ky < KH; ++ky) {
        const int iy = y0 + ky * DH;
        if (iy < 0 || iy >= IH)
            continue;
        for (int kx = 0; kx < KW; ++kx) {
            const int ix = x0 + kx * DW;
            if (ix < 0 || ix >= IW)
                continue;
#ifdef POOL_MAX
            acc = fmax(acc, xp[iy * IW + ix]);
#else
            acc += xp[iy * IW + ix];
            ++cnt;
#endif
        }
    }
#ifdef POOL_MAX
    y[i] = acc;
#else
#ifdef COUNT_PAD
    /* the window clipped to the padded input (ONNX: taps past the padding never count) */
    cnt = KH * KW;
#endif
    y[i] = acc / (float)max(cnt, 1);
#endif
}

#ifndef RLOCAL
#define RLOCAL 256
#endif

/* the work-group's sum (max_op 0) or max (1) of v, returned to every item (red may be reused after) */
inline float group_reduce(__local float *red, float v, int l, int max_op) {
    red[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = RLOCAL / 2; w > 0; w >>= 1) {
        if (l < w)
            red[l] = max_op ? fmax(red[l], red[l + w]) : red[l] + red[l + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

__kernel __attribute__((reqd_work_group_size(RLOCAL, 1, 1)))
void mean_rows(__global const float *x, __global float *y, const int len) {
    __local float red[RLOCAL];
    const int r = get_group_id(0), l = get_local_id(0);
    __global const float *xr = x + (size_t)r * len;
    float s = 0.0f;
    for (int j = l; j < len; j += RLOCAL)
        s += xr[j];
    s = group_reduce(red, s, l, 0);
    if (l == 0)
        y[r] = s / (float)len;
}

__kernel __attribute__((reqd_work_group_size(RLOCAL, 1, 1)))
void softmax_rows(__global const float *x, __global float *y, const int len) {
    __local float red[RLOCAL];
    const int r = get_group_id(0), l = get_local_id(0);
    __global const float *xr = x + (size_t)r * len;
    __global float *yr = y + (size_t)r * len;
    float m = -INFINITY;
    for (int j = l; j < len; j += RLOCAL)
        m = fmax(m, xr[j]);
    m = group_reduce(red, m, l, 1);
    float s = 0.0f;
    for (int j = l; j < len; j += RLOCAL)
        s += exp(xr[j] - m);
    const float inv = 1.0f / group_reduce(red, s, l, 0);
    for (int j = l; j < len; j += RLOCAL)
        yr[j] = exp(xr[j] - m) * inv;
}

/* the source coordinate of output coordinate o (COORD_MODE), for an axis of in_len -> out_len at scale s */
inline float src_coord(int o, int in_len, int out_len, float s) {
#if COORD_MODE == 0
    return ((float)o + 0.5f) / s - 0.5f;
#elif COORD_MODE == 1
    return (float)o / s;
#elif COORD_MODE == 2
    return out_len > 1 ? (float)o * (float)(in_len - 1) / (float)(out_len - 1) : 0.0f;
#elif COORD_MODE == 3
    return out_len > 1 ? ((float)o + 0.5f) / s - 0.5f : 0.0f;
#else
    return ((float)o + 0.5f) / s;
#endif
}

inline int nearest(float c, int len) {
#if NEAREST_MODE == 0
    int i = (c == floor(c) + 0.5f) ? (int)floor(c) : (int)round(c);
#elif NEAREST_MODE == 1
    int i = (int)round(c);
#elif NEAREST_MODE == 2
    int i = (int)floor(c);
#else
    int i = (int)ceil(c);
#endif
    return clamp(i, 0, len - 1);
}

__kernel void resize2d(__global const float *x, __global float *y, const int planes, const int IH, const int IW,
                       const int OH, const int OW, const float scale_h, const float scale_w) {
    const int i = get_global_id(0);
    if (i >= planes * OH * OW)
        return;
    const int ox = i % OW, oy = (i / OW) % OH;
    __global const float *xp = x + (size_t)(i / (OH * OW)) * IH * IW; /* this output's input plane */
    const float cy = src_coord(oy, IH, OH, scale_h), cx = src_coord(ox, IW, OW, scale_w);
#ifdef RESIZE_LINEAR
    const float fy = clamp(cy, 0.0f, (float)(IH - 1)), fx = clamp(cx, 0.0f, (float)(IW - 1));
    const int y0 = (int)floor(fy), x0 = (int)floor(fx);
    const int y1 = min(y0 + 1, IH - 1), x1 = min(x0 + 1, IW - 1);
    const float wy = fy - (float)y0, wx = fx - (float)x0;
    const float top = fma(wx, xp[y0 * IW + x1] - xp[y0 * IW + x0], xp[y0 * IW + x0]);
    const float bot = fma(wx, xp[y1 * IW + x1] - xp[y1 * IW + x0], xp[y1 * IW + x0]);
    y[i] = fma(wy, bot - top, top);
#else
    y[i] = xp[nearest(cy, IH) * IW + nearest(cx, IW)];
#endif
}

__kernel void matmul(__global const float *a, __global const float *b, __global float *y, const int n, const int M,
                     const int N, const int K, const int8 bshape, const int8 sa, const int8 sb) {
    const int i = get_global_id(0);
    if (i >= n)
        return;
    const int col = i % N, row = (i / N) % M, t = i / (M * N);
    __global const float *ap = a + nd_offset(t, bshape, sa) + (size_t)row * K;
    __global const float *bp = b + nd_offset(t, bshape, sb) + col;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k)
        acc = fma(ap[k], bp[(size_t)k * N], acc);
    y[i] = acc;
}
