/* A layer's prepared call on one input shape, run by the onnxruntime custom operator without Python (qc_native).
 *
 * A native plan of the CPU engine (DepthwisePlan.native, DirectPlan.native, DirectInt8Plan.native) fills one of
 * these as the first member of its own struct: run(self, x, y, scratch) does what the plan's forward does on the
 * shape it was prepared for (the same job, the same threads, so the same bits), on float32 x of dims[0..nd) into
 * float32 y of odims[0..ond), with scratch_bytes of 64-byte aligned scratch from the caller. run returns 0 when y
 * holds the result; anything else (a NaN / inf input, no memory for a per-call buffer) means y holds nothing
 * reliable and the caller runs the Python path again, which raises the error (or handles the case).
 *
 * The caller's scratch: qconv_native_scratch.h (the custom operator's module only).
 */
#ifndef QCONV_NATIVE_H
#define QCONV_NATIVE_H

#include <stdint.h>

#define QC_NATIVE_MAX_DIMS 8
/* qc_native.kind: 0 another plan's; a _DwNative (DepthwisePlan.native, float activations); a _Di8Native */
#define QC_NATIVE_DW 1
#define QC_NATIVE_DI8 2

typedef struct qc_native qc_native;
typedef int64_t (*qc_native_fn)(const qc_native *self, const float *x, float *y, void *scratch);

struct qc_native {
    qc_native_fn run;
    int64_t scratch_bytes;
    int32_t disabled;             /* set by NativeCall.disable(): the layer it ran changed, callers take Python */
    int32_t kind;                 /* the plan's struct this heads (QC_NATIVE_*): what a pair call may look into */
    int32_t nd, ond;
    int64_t dims[QC_NATIVE_MAX_DIMS], odims[QC_NATIVE_MAX_DIMS];
};

#endif
