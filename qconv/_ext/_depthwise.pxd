# cython: language_level=3
"""Declarations of the depthwise conv (``qconv_depthwise.h``) shared with the modules that run its jobs
(``_pair.pyx``: a 1x1 conv and the depthwise conv after it as one call)."""
from libc.stdint cimport uint8_t, uint16_t, int8_t, int32_t, int64_t
from ._cpu cimport qc_native


cdef extern from "qconv_depthwise.h" nogil:
    enum:
        QC_DW_EXACT_TAPS
        QC_DW_FG
    ctypedef struct qc_dw_job:
        int64_t N, C, H, W, OH, OW
        int32_t M, KH, KW, sh, sw, ph, pw, dh, dw
        int32_t kind, in_nc4hw4
        const void *x
        const int32_t *z
        const float *dx
        const float *qs
        int32_t qlo, qhi, variant
        const float *wq
        const float *scale
        const float *offset
        const float *bias
        float lo, hi
        int32_t tail
        const float *pa_s
        const float *pa_t
        int32_t out_nc4hw4, out_int8, ozp
        float oscale
        void *y
        int64_t band
        int32_t vec, flat
        const uint16_t *fmask
        int64_t xplane, xrow0
    int64_t qc_dw_items(const qc_dw_job *j)
    int qc_dw_flat(const qc_dw_job *j)
    int qc_dw_c8(const qc_dw_job *j)
    int qc_dw_flat_ok(const qc_dw_job *j)
    int64_t qc_dw_rs(const qc_dw_job *j)
    int64_t qc_dw_scratch_floats(const qc_dw_job *j)
    int64_t qc_dw_scratch_ptrs(const qc_dw_job *j)
    int64_t qc_dw_item(const qc_dw_job *j, int64_t item, float *scr, const float **ptrs)
    void qc_dw_thread_setup(const qc_dw_job *j, float *scr, const float **ptrs)
    void qc_quant(const float *x, int64_t n, float qs, int32_t z, int32_t qlo, int32_t qhi, int32_t abias,
                  uint8_t *dst, int variant)


# DepthwisePlan.native's call (qc_native.kind QC_NATIVE_DW)
ctypedef struct _DwNative:
    qc_native base
    qc_dw_job j     # every field but x and y
    int nt
