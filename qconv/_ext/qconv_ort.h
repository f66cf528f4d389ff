/* qconv_ort.h -- the part of onnxruntime's C ABI that qconv's native custom operators use (qconv/_ext/_ortops.pyx).
 *
 * Contract
 *   - Written from the published ABI, not from onnxruntime's header (its wheel ships none):
 *       * OrtApi is a table of function pointers whose order never changes (new functions are appended), so
 *         each function used here is called through its index in the table (QC_ORT_*), with its C signature;
 *       * OrtCustomOp is declared with the members of version 16 (compute returning an OrtStatus*), which
 *         onnxruntime >= 1.16 reads; members of later versions are not read for version 16.
 *   - The table is the one onnxruntime passes for API version QC_ORT_API (16); every index below is < 100. An
 *     onnxruntime without that version (< 1.16) gets an error status from RegisterCustomOps naming both
 *     versions, so registering the library fails with it (rather than registering nothing).
 *   - The operators declare one required float32 input and output, so onnxruntime's graph check refuses a
 *     qconv node with another number of inputs or outputs (naming the node and the counts) before any kernel.
 *   - onnxruntime loads this extension module as a custom-op library (SessionOptions.register_custom_ops_library
 *     of the module's own file) and calls RegisterCustomOps, the one exported symbol defined here; the kernels
 *     then call back into the Python kernels the module was given (see _ortops.pyx).
 */
#ifndef QCONV_ORT_H
#define QCONV_ORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QC_ORT_API 16

typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef void *const *qc_ort_api;   /* the OrtApi table */

typedef struct {
    qc_ort_api (*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} qc_ort_api_base;

/* indices in the OrtApi table */
enum {
    QC_ORT_CreateStatus = 0,                  /* OrtStatus *(int code, const char *msg) */
    QC_ORT_GetErrorMessage = 2,               /* const char *(const OrtStatus *) */
    QC_ORT_CreateCustomOpDomain = 26,         /* (const char *domain, OrtCustomOpDomain **out) */
    QC_ORT_CustomOpDomain_Add = 27,           /* (OrtCustomOpDomain *, const OrtCustomOp *) */
    QC_ORT_AddCustomOpDomain = 28,            /* (OrtSessionOptions *, OrtCustomOpDomain *) */
    QC_ORT_GetTensorMutableData = 51,         /* (OrtValue *, void **out) */
    QC_ORT_GetDimensionsCount = 61,           /* (const OrtTensorTypeAndShapeInfo *, size_t *out) */
    QC_ORT_GetDimensions = 62,                /* (const OrtTensorTypeAndShapeInfo *, int64_t *dims, size_t n) */
    QC_ORT_GetTensorTypeAndShape = 65,        /* (const OrtValue *, OrtTensorTypeAndShapeInfo **out) */
    QC_ORT_KernelInfoGetAttribute_string = 87,/* (const OrtKernelInfo *, const char *name, char *out, size_t *size) */
    QC_ORT_KernelContext_GetInputCount = 88,  /* (const OrtKernelContext *, size_t *out) */
    QC_ORT_KernelContext_GetInput = 90,       /* (const OrtKernelContext *, size_t i, const OrtValue **out) */
    QC_ORT_KernelContext_GetOutput = 91,      /* (OrtKernelContext *, size_t i, const int64_t *dims, size_t n,
                                                  OrtValue **out) */
    QC_ORT_ReleaseStatus = 93,                /* void (OrtStatus *) */
    QC_ORT_ReleaseTensorTypeAndShapeInfo = 99 /* void (OrtTensorTypeAndShapeInfo *) */
};

#define QC_ORT_ERROR_FAIL 1
#define QC_ORT_FLOAT 1          /* ONNXTensorElementDataType of float32 */
#define QC_ORT_REQUIRED 0       /* OrtCustomOpInputOutputCharacteristic: a required input / output */
#define QC_ORT_VARIADIC 2       /* ... : one or more inputs of one type (the last declared input) */

typedef struct qc_ort_op {   /* OrtCustomOp, version 16 */
    uint32_t version;
    void *(*CreateKernel)(const struct qc_ort_op *, qc_ort_api, const OrtKernelInfo *);
    const char *(*GetName)(const struct qc_ort_op *);
    const char *(*GetExecutionProviderType)(const struct qc_ort_op *);
    int (*GetInputType)(const struct qc_ort_op *, size_t);
    size_t (*GetInputTypeCount)(const struct qc_ort_op *);
    int (*GetOutputType)(const struct qc_ort_op *, size_t);
    size_t (*GetOutputTypeCount)(const struct qc_ort_op *);
    void (*KernelCompute)(void *, OrtKernelContext *);
    void (*KernelDestroy)(void *);
    int (*GetInputCharacteristic)(const struct qc_ort_op *, size_t);
    int (*GetOutputCharacteristic)(const struct qc_ort_op *, size_t);
    int (*GetInputMemoryType)(const struct qc_ort_op *, size_t);
    int (*GetVariadicInputMinArity)(const struct qc_ort_op *);
    int (*GetVariadicInputHomogeneity)(const struct qc_ort_op *);
    int (*GetVariadicOutputMinArity)(const struct qc_ort_op *);
    int (*GetVariadicOutputHomogeneity)(const struct qc_ort_op *);
    OrtStatus *(*CreateKernelV2)(const struct qc_ort_op *, qc_ort_api, const OrtKernelInfo *, void **);
    OrtStatus *(*KernelComputeV2)(void *, OrtKernelContext *);
    const char *name;          /* qconv's own members from here on: never read by onnxruntime for version 16 */
} qc_ort_op;

/* ---- calls through the table (api: the table onnxruntime passed) ---- */
#define QC_ORT_FN(api, idx, type) ((type)((api)[idx]))

static inline OrtStatus *qc_ort_status(qc_ort_api api, const char *msg) {
    return QC_ORT_FN(api, QC_ORT_CreateStatus, OrtStatus *(*)(int, const char *))(QC_ORT_ERROR_FAIL, msg);
}

/* A new error status "<what> (onnxruntime: <s's message>)"; ``s`` is released. */
static inline OrtStatus *qc_ort_wrap(qc_ort_api api, OrtStatus *s, const char *what) {
    const char *inner = QC_ORT_FN(api, QC_ORT_GetErrorMessage, const char *(*)(const OrtStatus *))(s);
    size_t n = strlen(what) + strlen(inner) + 32;
    char *msg = (char *)malloc(n);
    OrtStatus *out;
    if (msg) {
        snprintf(msg, n, "%s (onnxruntime: %s)", what, inner);
        out = qc_ort_status(api, msg);   /* CreateStatus copies the message */
        free(msg);
    } else {
        out = qc_ort_status(api, what);
    }
    QC_ORT_FN(api, QC_ORT_ReleaseStatus, void (*)(OrtStatus *))(s);
    return out;
}

/* Attribute ``name`` of a node as a malloc'd NUL-terminated string (*out; free it), or an error status. */
static inline OrtStatus *qc_ort_attr_string(qc_ort_api api, const OrtKernelInfo *info, const char *name,
                                            char **out) {
    typedef OrtStatus *(*fn_t)(const OrtKernelInfo *, const char *, char *, size_t *);
    fn_t get = QC_ORT_FN(api, QC_ORT_KernelInfoGetAttribute_string, fn_t);
    size_t size = 0;
    OrtStatus *s = get(info, name, NULL, &size);
    *out = NULL;
    if (s) return s;
    char *buf = (char *)malloc(size + 1);
    if (!buf) return qc_ort_status(api, "qconv: out of memory reading a node attribute");
    s = get(info, name, buf, &size);
    if (s) { free(buf); return s; }
    buf[size] = 0;
    *out = buf;
    return NULL;
}

/* The float32 tensor of input ``i``: its data and up to ``cap`` dimensions (*nd). */
static inline OrtStatus *qc_ort_input(qc_ort_api api, OrtKernelContext *ctx, size_t i, const float **data,
                                      int64_t *dims, size_t cap, size_t *nd) {
    const OrtValue *v = NULL;
    OrtTensorTypeAndShapeInfo *info = NULL;
    OrtStatus *s = QC_ORT_FN(api, QC_ORT_KernelContext_GetInput,
                             OrtStatus *(*)(const OrtKernelContext *, size_t, const OrtValue **))(ctx, i, &v);
    if (!s && !v) return qc_ort_status(api, "qconv: the node has no input tensor");
    if (!s) s = QC_ORT_FN(api, QC_ORT_GetTensorTypeAndShape,
                          OrtStatus *(*)(const OrtValue *, OrtTensorTypeAndShapeInfo **))(v, &info);
    if (!s) s = QC_ORT_FN(api, QC_ORT_GetDimensionsCount,
                          OrtStatus *(*)(const OrtTensorTypeAndShapeInfo *, size_t *))(info, nd);
    if (!s && *nd > cap) s = qc_ort_status(api, "qconv: the input tensor has too many dimensions");
    if (!s) s = QC_ORT_FN(api, QC_ORT_GetDimensions,
                          OrtStatus *(*)(const OrtTensorTypeAndShapeInfo *, int64_t *, size_t))(info, dims, *nd);
    if (info) QC_ORT_FN(api, QC_ORT_ReleaseTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo *))(info);
    void *p = NULL;
    if (!s) s = QC_ORT_FN(api, QC_ORT_GetTensorMutableData, OrtStatus *(*)(OrtValue *, void **))((OrtValue *)v, &p);
    *data = (const float *)p;
    return s;
}

/* onnxruntime's output tensor ``i`` of shape dims[0..nd) (allocated by this call) and its data. */
static inline OrtStatus *qc_ort_output(qc_ort_api api, OrtKernelContext *ctx, size_t i, const int64_t *dims,
                                       size_t nd, float **data) {
    OrtValue *v = NULL;
    void *p = NULL;
    OrtStatus *s = QC_ORT_FN(api, QC_ORT_KernelContext_GetOutput,
                             OrtStatus *(*)(OrtKernelContext *, size_t, const int64_t *, size_t, OrtValue **))(
                                 ctx, i, dims, nd, &v);
    if (!s && !v) return qc_ort_status(api, "qconv: onnxruntime gave no output tensor");
    if (!s) s = QC_ORT_FN(api, QC_ORT_GetTensorMutableData, OrtStatus *(*)(OrtValue *, void **))(v, &p);
    *data = (float *)p;
    return s;
}

/* The number of inputs of a node's call (*n). */
static inline OrtStatus *qc_ort_input_count(qc_ort_api api, OrtKernelContext *ctx, size_t *n) {
    return QC_ORT_FN(api, QC_ORT_KernelContext_GetInputCount,
                     OrtStatus *(*)(const OrtKernelContext *, size_t *))(ctx, n);
}

/* ---- the operators: float32 inputs (one; QFused: one or more), one float32 output, on the CPU provider ---- */
static const char *qc_op_name(const qc_ort_op *op) { return op->name; }
static const char *qc_op_provider(const qc_ort_op *op) { (void)op; return NULL; }
static int qc_op_type(const qc_ort_op *op, size_t i) { (void)op; (void)i; return QC_ORT_FLOAT; }
static size_t qc_op_one(const qc_ort_op *op) { (void)op; return 1; }
static int qc_op_required(const qc_ort_op *op, size_t i) { (void)op; (void)i; return QC_ORT_REQUIRED; }
static int qc_op_mem_default(const qc_ort_op *op, size_t i) { (void)op; (void)i; return 0; }
static int qc_op_arity(const qc_ort_op *op) { (void)op; return 1; }
static int qc_op_variadic(const qc_ort_op *op, size_t i) { (void)op; (void)i; return QC_ORT_VARIADIC; }

/* Set by _ortops.pyx at import: kernel creation, compute and release. */
typedef OrtStatus *(*qc_ort_create_fn)(const qc_ort_op *, qc_ort_api, const OrtKernelInfo *, void **);
typedef OrtStatus *(*qc_ort_compute_fn)(void *, OrtKernelContext *);
typedef void (*qc_ort_destroy_fn)(void *);
static qc_ort_create_fn qc_ort_create;
static qc_ort_compute_fn qc_ort_compute;
static qc_ort_destroy_fn qc_ort_destroy;

static OrtStatus *qc_op_create(const qc_ort_op *op, qc_ort_api api, const OrtKernelInfo *info, void **k) {
    return qc_ort_create(op, api, info, k);
}
static OrtStatus *qc_op_compute(void *k, OrtKernelContext *ctx) { return qc_ort_compute(k, ctx); }
static void qc_op_destroy(void *k) { qc_ort_destroy(k); }

#define QC_ORT_OP(NAME) { QC_ORT_API, NULL, qc_op_name, qc_op_provider, qc_op_type, qc_op_one, qc_op_type, \
    qc_op_one, NULL, qc_op_destroy, qc_op_required, qc_op_required, qc_op_mem_default, qc_op_arity, qc_op_arity, \
    qc_op_arity, qc_op_arity, qc_op_create, qc_op_compute, NAME }

/* QFused: a variadic input (min arity 1, every input float32) */
#define QC_ORT_OP_VARIADIC(NAME) { QC_ORT_API, NULL, qc_op_name, qc_op_provider, qc_op_type, qc_op_one, qc_op_type, \
    qc_op_one, NULL, qc_op_destroy, qc_op_variadic, qc_op_required, qc_op_mem_default, qc_op_arity, qc_op_arity, \
    qc_op_arity, qc_op_arity, qc_op_create, qc_op_compute, NAME }

#define QC_ORT_NOPS 3
static qc_ort_op qc_ort_ops[QC_ORT_NOPS] = { QC_ORT_OP("QConv"), QC_ORT_OP("QMatMul"), QC_ORT_OP_VARIADIC("QFused") };
static OrtCustomOpDomain *qc_ort_domain;   /* one for the process: sessions only keep a pointer to it */
static const char *qc_ort_domain_name = "ai.qconv";

/* The error when onnxruntime has no table of version QC_ORT_API (onnxruntime < 1.16): made with the newest
 * older table it gives (CreateStatus is the first function of every version), naming both versions. NULL only if
 * it gives no table at all, when no status can be made. */
static OrtStatus *qc_ort_version_error(const qc_ort_api_base *base) {
    for (uint32_t v = QC_ORT_API - 1; v >= 1; v--) {
        qc_ort_api older = base->GetApi(v);
        if (!older) continue;
        char msg[320];
        snprintf(msg, sizeof msg, "qconv: onnxruntime %s gives its C API up to version %u; qconv's native "
                 "operators need version %d (onnxruntime >= 1.%d): upgrade onnxruntime",
                 base->GetVersionString ? base->GetVersionString() : "(unknown version)", v, QC_ORT_API,
                 QC_ORT_API);
        return qc_ort_status(older, msg);
    }
    return NULL;
}

/* The entry point onnxruntime looks up in a custom-op library. */
__attribute__((visibility("default"))) OrtStatus *RegisterCustomOps(OrtSessionOptions *so,
                                                                    const qc_ort_api_base *base) {
    qc_ort_api api = base->GetApi(QC_ORT_API);
    if (!api) return qc_ort_version_error(base);
    OrtStatus *s = NULL;
    if (!qc_ort_domain) {
        OrtCustomOpDomain *d = NULL;
        s = QC_ORT_FN(api, QC_ORT_CreateCustomOpDomain, OrtStatus *(*)(const char *, OrtCustomOpDomain **))(
            qc_ort_domain_name, &d);
        for (int i = 0; i < QC_ORT_NOPS && !s; i++)
            s = QC_ORT_FN(api, QC_ORT_CustomOpDomain_Add, OrtStatus *(*)(OrtCustomOpDomain *, const qc_ort_op *))(
                d, &qc_ort_ops[i]);
        if (s) return s;
        qc_ort_domain = d;
    }
    return QC_ORT_FN(api, QC_ORT_AddCustomOpDomain, OrtStatus *(*)(OrtSessionOptions *, OrtCustomOpDomain *))(
        so, qc_ort_domain);
}

#endif
