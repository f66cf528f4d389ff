/* The onnxruntime custom operator's scratch for native calls (qconv_native.h): one buffer per calling thread (a
 * pthread key; freed when the thread ends), grown to the largest request, like qconv.cpu.scratch's arena for the
 * Python path. Included by _ortops only, so there is one per process.
 */
#ifndef QCONV_NATIVE_SCRATCH_H
#define QCONV_NATIVE_SCRATCH_H

#include "qconv_native.h"
#include <pthread.h>
#include <stdlib.h>

typedef struct {
    void *base;   /* what free() takes */
    void *p;      /* 64-byte aligned */
    int64_t cap;
} qc_native_buf;

static pthread_key_t qc_native_key;
static pthread_once_t qc_native_once = PTHREAD_ONCE_INIT;
static int qc_native_key_ok = 0;

static void qc_native_free(void *v)
{
    qc_native_buf *b = (qc_native_buf *)v;
    if (b) free(b->base);
    free(b);
}
static void qc_native_key_init(void) { qc_native_key_ok = pthread_key_create(&qc_native_key, qc_native_free) == 0; }

/* this thread's scratch of at least `bytes` (64-byte aligned), or NULL when out of memory */
static void *qc_native_scratch(int64_t bytes)
{
    pthread_once(&qc_native_once, qc_native_key_init);
    if (!qc_native_key_ok) return NULL;
    qc_native_buf *b = (qc_native_buf *)pthread_getspecific(qc_native_key);
    if (b == NULL) {
        b = (qc_native_buf *)calloc(1, sizeof(qc_native_buf));
        if (b == NULL || pthread_setspecific(qc_native_key, b) != 0) {
            free(b);
            return NULL;
        }
    }
    if (bytes < 1) bytes = 1;
    if (b->cap < bytes) {
        free(b->base);
        b->cap = 0;
        b->p = NULL;
        b->base = malloc((size_t)bytes + 64);
        if (b->base == NULL) return NULL;
        b->p = (void *)(((uintptr_t)b->base + 63) & ~(uintptr_t)63);
        b->cap = bytes;
    }
    return b->p;
}

#endif
