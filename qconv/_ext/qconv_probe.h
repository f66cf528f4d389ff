/* Machine-ceiling probes of the qconv CPU benchmark (not used by the engine):
 *   qc_probe_vnni(n):        n rounds of 12 independent 512-bit vpdpbusd (peak int8 multiply-add issue rate)
 *   qc_probe_read(p, bytes): streams `bytes` (a multiple of 256) with 512-bit loads; returns the XOR of all
 *                            64-bit words, so the caller can check that every byte was read.
 *   qc_probe_amx(n):         n rounds of 4 independent AMX tdpbusd on 16 x 16 int32 tiles (the AMX kernel's
 *                            2 x 2 tile shape, loads left out): the AMX-INT8 peak; -1 without AMX
 * Other CPUs get scalar fallbacks (the numbers then say so). */
#ifndef QCONV_PROBE_H
#define QCONV_PROBE_H

#include <stdint.h>
#include <string.h>
#include "qconv_kernels.h"   /* qc_kernel_supported (AMX permission) */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QC_PROBE_TGT __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define QC_PD(a) __asm__ volatile("vpdpbusd %1, %2, %0" : "+v"(a) : "v"(x), "v"(y))

QC_PROBE_TGT static int32_t qc_probe_vnni_x86(int64_t n)
{
    const __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(2);
    __m512i a0 = x, a1 = x, a2 = x, a3 = x, a4 = x, a5 = x, a6 = x, a7 = x, a8 = x, a9 = x, a10 = x, a11 = x;
    for (int64_t i = 0; i < n; ++i) {
        QC_PD(a0); QC_PD(a1); QC_PD(a2); QC_PD(a3); QC_PD(a4); QC_PD(a5);
        QC_PD(a6); QC_PD(a7); QC_PD(a8); QC_PD(a9); QC_PD(a10); QC_PD(a11);
    }
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                 _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
    return _mm512_reduce_add_epi32(s);
}
#undef QC_PD

QC_PROBE_TGT static uint64_t qc_probe_read_x86(const uint8_t *p, int64_t bytes)
{
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (int64_t i = 0; i < bytes; i += 256) {
        a = _mm512_xor_si512(a, _mm512_loadu_si512((const void *)(p + i)));
        b = _mm512_xor_si512(b, _mm512_loadu_si512((const void *)(p + i + 64)));
        c = _mm512_xor_si512(c, _mm512_loadu_si512((const void *)(p + i + 128)));
        d = _mm512_xor_si512(d, _mm512_loadu_si512((const void *)(p + i + 192)));
    }
    const __m512i s = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    uint64_t w[8], r = 0;
    _mm512_storeu_si512((void *)w, s);
    for (int i = 0; i < 8; ++i) r ^= w[i];
    return r;
}
#endif

static int qc_probe_simd(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

/* returns a value derived from the sums, so the work cannot be optimised away */
static int32_t qc_probe_vnni(int64_t n)
{
#if defined(__x86_64__) || defined(__i386__)
    if (qc_probe_simd()) return qc_probe_vnni_x86(n);
#endif
    volatile int32_t acc = 0;      /* scalar: 1 multiply-add per step */
    for (int64_t i = 0; i < n * 12 * 64; ++i) acc += 2;
    return acc;
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("amx-tile,amx-int8"))) static int32_t qc_probe_amx_x86(int64_t n)
{
    static const uint8_t src[1024] __attribute__((aligned(64))) = {1};
    int32_t out[256] __attribute__((aligned(64)));
    qc_amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 8; ++i) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }
    _tile_loadconfig(&cfg);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_loadd(4, src, 64); _tile_loadd(5, src, 64); _tile_loadd(6, src, 64); _tile_loadd(7, src, 64);
    for (int64_t i = 0; i < n; ++i) {
        _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
}
#endif

static int32_t qc_probe_amx(int64_t n)
{
#if defined(__x86_64__) || defined(__i386__)
    if (qc_kernel_supported(QC_KERNEL_AMX)) return qc_probe_amx_x86(n);
#endif
    (void)n;
    return -1;
}

static uint64_t qc_probe_read(const uint8_t *p, int64_t bytes)
{
#if defined(__x86_64__) || defined(__i386__)
    if (qc_probe_simd()) return qc_probe_read_x86(p, bytes);
#endif
    uint64_t r = 0, v;
    for (int64_t i = 0; i < bytes; i += 8) { memcpy(&v, p + i, 8); r ^= v; }
    return r;
}

#endif /* QCONV_PROBE_H */
