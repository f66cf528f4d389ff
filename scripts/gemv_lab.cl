/* GEMV lab kernels (experiments, not the engine): y[o] = s[o] * sum_k q[o,k] x[k], weights in the
 * OpenCL1x1BufferLayout ([KCH][OCP] 16-byte chunks; int4: element e of word wi at bits 4e, value q + 8).
 * KIND 0: read only; 1: float decode (magic-number classes); 2: float without the FADD (wrong values,
 * cost probe); 3: int8 activations, dp4a. QB = 4 | 8. U chunks in flight per channel, NC channels per
 * item (o, o + L0), SPLIT split-K lanes (dim 1), DB = 1: loads of the next U chunks issued before the
 * current ones are decoded. Built after qconv/gpu/kernels/common.cl (q8x4, dp4a_us / dp4a_ss: -DNV_PTX
 * on NVIDIA). The int4 float decode is conv_1x1.cl's q4x8_classes, with the FADD removable (KIND 2). */
#define MAG 0x4B000000u

#if QB == 4
#define KC 32
#else
#define KC 16
#endif

inline void acc4_word(uint w, float4 xa, float4 xb, float *dc) {
    const uint w2 = w >> 12;
#if KIND == 2
#define SUBM(v, c) (v)
#else
#define SUBM(v, c) ((v) - (c))
#endif
    dc[0] = fma(SUBM(as_float((w & 0xFu) | MAG), 8388616.0f), xa.x, dc[0]);
    dc[1] = fma(SUBM(as_float((w & 0xF0u) | MAG), 8388736.0f), xa.y, dc[1]);
    dc[2] = fma(SUBM(as_float((w & 0xF00u) | MAG), 8390656.0f), xa.z, dc[2]);
    dc[3] = fma(SUBM(as_float((w & 0xF000u) | MAG), 8421376.0f), xa.w, dc[3]);
    dc[4] = fma(SUBM(as_float((w & 0xF0000u) | MAG), 8912896.0f), xb.x, dc[4]);
    dc[2] = fma(SUBM(as_float((w2 & 0xF00u) | MAG), 8390656.0f), xb.y, dc[2]);
    dc[3] = fma(SUBM(as_float((w2 & 0xF000u) | MAG), 8421376.0f), xb.z, dc[3]);
    dc[4] = fma(SUBM(as_float((w2 & 0xF0000u) | MAG), 8912896.0f), xb.w, dc[4]);
}

inline void acc8_word(uint w, float4 xa, float *dc) {
    const float4 q = q8x4(w); /* common.cl (KIND 2 probes only the int4 decode) */
    dc[0] = fma(q.x, xa.x, dc[0]);
    dc[1] = fma(q.y, xa.y, dc[1]);
    dc[2] = fma(q.z, xa.z, dc[2]);
    dc[3] = fma(q.w, xa.w, dc[3]);
}

__kernel __attribute__((reqd_work_group_size(L0, SPLIT, 1)))
void gemv(__global const uint4 *wq, __global const float *x, __global const uint4 *xq,
          const int sumxq, const float xs, __global const float *sw, __global float *y,
          const int KCH, const int OCP) {
    __local float red[L0 * SPLIT];
    const int lid0 = get_local_id(0), lk = get_local_id(1);
    const int ob = get_group_id(0) * L0 * NC + lid0;
#if KIND == 3
    int ia[NC];
    for (int c = 0; c < NC; ++c) ia[c] = 0;
#else
    float dc[NC][5];
    for (int c = 0; c < NC; ++c)
        for (int i = 0; i < 5; ++i) dc[c][i] = 0.0f;
#endif
    uint acc0 = 0;
    uint4 nx[U][NC];
#if DB
#pragma unroll
    for (int j = 0; j < U; ++j)
#pragma unroll
        for (int c = 0; c < NC; ++c)
            nx[j][c] = wq[min(lk + j * SPLIT, KCH - 1) * OCP + ob + c * L0];
#endif
    for (int k = lk; k < KCH; k += U * SPLIT) {
        uint4 wv[U][NC];
#if DB
#pragma unroll
        for (int j = 0; j < U; ++j)
#pragma unroll
            for (int c = 0; c < NC; ++c) wv[j][c] = nx[j][c];
        const int kn = k + U * SPLIT;
        if (kn < KCH) {
#pragma unroll
            for (int j = 0; j < U; ++j)
#pragma unroll
                for (int c = 0; c < NC; ++c)
                    nx[j][c] = wq[min(kn + j * SPLIT, KCH - 1) * OCP + ob + c * L0];
        }
#else
#pragma unroll
        for (int j = 0; j < U; ++j)
#pragma unroll
            for (int c = 0; c < NC; ++c)
                wv[j][c] = wq[min(k + j * SPLIT, KCH - 1) * OCP + ob + c * L0];
#endif
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const int kj = k + j * SPLIT;
            if (j > 0 && kj >= KCH)
                break;
#if KIND == 0
#pragma unroll
            for (int c = 0; c < NC; ++c) acc0 ^= wv[j][c].x ^ wv[j][c].y ^ wv[j][c].z ^ wv[j][c].w;
#elif KIND == 3
#if QB == 4
            const uint4 xe = xq[2 * kj], xo = xq[2 * kj + 1]; /* words 0,1 even/odd | 2,3 even/odd */
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const uint4 w = wv[j][c];
                int a = ia[c];
                a = dp4a_us(w.x & 0x0F0F0F0Fu, xe.x, a);
                a = dp4a_us((w.x >> 4) & 0x0F0F0F0Fu, xe.y, a);
                a = dp4a_us(w.y & 0x0F0F0F0Fu, xe.z, a);
                a = dp4a_us((w.y >> 4) & 0x0F0F0F0Fu, xe.w, a);
                a = dp4a_us(w.z & 0x0F0F0F0Fu, xo.x, a);
                a = dp4a_us((w.z >> 4) & 0x0F0F0F0Fu, xo.y, a);
                a = dp4a_us(w.w & 0x0F0F0F0Fu, xo.z, a);
                a = dp4a_us((w.w >> 4) & 0x0F0F0F0Fu, xo.w, a);
                ia[c] = a;
            }
#else
            const uint4 xv = xq[kj];
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const uint4 w = wv[j][c];
                int a = ia[c];
                a = dp4a_ss(w.x, xv.x, a);
                a = dp4a_ss(w.y, xv.y, a);
                a = dp4a_ss(w.z, xv.z, a);
                a = dp4a_ss(w.w, xv.w, a);
                ia[c] = a;
            }
#endif
#else
            float4 xv[KC / 4];
#pragma unroll
            for (int v = 0; v < KC / 4; ++v) xv[v] = vload4(kj * (KC / 4) + v, x);
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const uint4 w = wv[j][c];
#if QB == 4
                acc4_word(w.x, xv[0], xv[1], dc[c]);
                acc4_word(w.y, xv[2], xv[3], dc[c]);
                acc4_word(w.z, xv[4], xv[5], dc[c]);
                acc4_word(w.w, xv[6], xv[7], dc[c]);
#else
                acc8_word(w.x, xv[0], dc[c]);
                acc8_word(w.y, xv[1], dc[c]);
                acc8_word(w.z, xv[2], dc[c]);
                acc8_word(w.w, xv[3], dc[c]);
#endif
            }
#endif
        }
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
#if KIND == 0
        float r = (float)(acc0 & 1u);
#elif KIND == 3
        float r = (float)ia[c] * xs;
#elif QB == 4
        float r = dc[c][0] + 0x1p-4f * dc[c][1] + 0x1p-8f * dc[c][2] + 0x1p-12f * dc[c][3] + 0x1p-16f * dc[c][4];
#else
        float r = (dc[c][0] + dc[c][1]) + (dc[c][2] + dc[c][3]);
#endif
        red[lk * L0 + lid0] = r;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lk == 0) {
            for (int j = 1; j < SPLIT; ++j) r += red[j * L0 + lid0];
#if KIND == 3 && QB == 4
            r -= (float)(8 * sumxq) * xs;
#endif
            const int o = ob + c * L0;
            if (o < OCP) y[o] = r * sw[o];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

__kernel void copy4(__global const float4 *a, __global float4 *b, const int n) {
    for (int i = get_global_id(0); i < n; i += get_global_size(0)) b[i] = a[i];
}
