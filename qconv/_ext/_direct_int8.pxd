# cython: language_level=3
"""Declarations of the direct int8 conv (``qconv_direct_int8.h``) shared with the modules that run its jobs
(``_pair.pyx``: a 1x1 conv and the depthwise conv after it as one call)."""
from libc.stdint cimport uint8_t, int8_t, int32_t, int64_t
from ._cpu cimport qc_native


cdef extern from "qconv_direct_int8.h" nogil:
    ctypedef struct qc_di8_job:
        int64_t N, C, H, W, OH, OW
        int32_t KH, KW, sh, sw, dh, dw, pt, pl
        int32_t quads, kg, steps
        int32_t nblocks, bq, spb, planes, qbands
        int32_t O, otiles
        int64_t Hq, Wq, rows, plane, nvirt, runs, sample_bytes, psum_len
        const int8_t *wa
        const int32_t *wsx
        const float *scale
        const float *offset
        const float *bias
        float lo, hi
        int32_t tail
        const float *pa_s
        const float *pa_t
        const float *x
        float *y
        const int8_t *xi
        int8_t *yi
        float oscale
        int32_t ozp
        uint8_t *xq
        int32_t *psum
        const float *qs
        const float *dx
        const int32_t *z
        int32_t qlo, qhi
        const int64_t *toff
    void qc_di8_setup(qc_di8_job *j)
    void qc_di8_offsets(const qc_di8_job *j, int64_t *toff)
    int32_t qc_di8_quant_bands(const qc_di8_job *j, int threads)
    int64_t qc_di8_quant_items(const qc_di8_job *j)
    void qc_di8_quant(const qc_di8_job *j, int64_t item)
    void qc_di8_psum(const qc_di8_job *j, int64_t item)
    int64_t qc_di8_amx_items(const qc_di8_job *j)
    void qc_di8_amx_run(const qc_di8_job *j, int64_t i0, int64_t i1)
    int64_t qc_di8_vnni_items(const qc_di8_job *j)
    void qc_di8_vnni_run(const qc_di8_job *j, int64_t i0, int64_t i1)


# DirectInt8Plan.native's call (qc_native.kind QC_NATIVE_DI8)
ctypedef struct _Di8Native:
    qc_native base
    qc_di8_job j                # shape, weights, its own tap offsets (the run sets x, y, the scratch pointers)
    int nt, amx, variant
    int64_t chunk, items, count, psum_at, params_at


cdef int _native_job(const _Di8Native *d, qc_di8_job *j, const float *x, float *y, void *scratch) noexcept nogil
cdef void _prepasses(qc_di8_job *j, int threads) noexcept nogil
