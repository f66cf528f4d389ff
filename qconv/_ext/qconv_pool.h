/* The CPU engine's one parallel-for: a persistent pool of worker pthreads shared by every native module.
 *
 *   qc_parallel_for(n, chunk, fn, ctx, nthreads)
 *
 * calls fn(ctx, begin, end, tid) on disjoint ranges [begin, end) covering items 0 .. n-1 exactly once, with
 * tid in [0, nthreads) (the calling thread is tid 0; per-thread scratch indexed by tid stays private: one tid
 * is never used by two threads at once). The items are cut into nthreads contiguous parts, each with its own
 * atomic counter; thread tid takes `chunk` items at a time from part tid, then from the parts after it (tid + 1,
 * ..., wrapping). So a thread that the OS deschedules (a core taken by another process) simply takes fewer chunks:
 * the others take the rest; and when every thread is on time, thread t runs the same share of the items in every
 * call (the t-th), so consecutive layers that cut their work alike find their inputs in the cache of the core that
 * wrote them. Which thread runs an item never changes what the item computes, so callers that split over outputs
 * (never over a reduction) get the same bits for any thread count. It returns once every item is done, with the
 * sum of fn's return values (counts: failed allocations, non-finite values; an integer sum, so it does not
 * depend on the split either).
 *
 * Waiting (the model is onnxruntime's thread pool, which spins a bounded number of pause iterations and then
 * blocks): a worker with nothing to do spins (pause, then sched_yield) for QC_POOL_SPIN_NS and then sleeps on a
 * condition variable; the caller, once the counter is exhausted, waits for chunks still running the same way.
 * Nothing depends on environment variables (OMP_* are not read).
 *
 * Serial fallbacks (the same results, tid 0): nthreads <= 1, n <= chunk, a call made while another call is in
 * flight (a call from inside fn -- nested --, or from a second Python thread), n >= 2^31 items. Workers are
 * created on first use and grown to the largest nthreads asked (up to QC_POOL_MAX_THREADS); a worker that
 * cannot be created lowers the thread count of that call. After fork() the child starts with no workers.
 *
 * Testing hook (qc_pool_test, set only by qconv._ext._cpu_testing): per-tid chunk counts, and a stall of one
 * worker, which before its first chunk of each call sleeps in 1 ms steps, up to stall_ms, while chunks of that
 * call remain unclaimed -- with the dynamic split the others take them all, and that worker's count stays 0.
 */
#ifndef QCONV_POOL_H
#define QCONV_POOL_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sched.h>

#define QC_POOL_MAX_THREADS 256
#define QC_POOL_SPIN_NS 1000000         /* spin before blocking: 1 ms (libgomp, the engine's threads up to
                                         * 0.10.0, spun a few ms; onnxruntime spins ~10^6 pauses) */
#define QC_POOL_PAUSE_NS 50000          /* of which pause-only (then sched_yield between checks) */
#define QC_POOL_COUNTED 64              /* tids whose chunks the testing hook counts */

typedef int64_t (*qc_pool_fn)(void *ctx, int64_t begin, int64_t end, int tid);

typedef struct {
    int stall_tid;                      /* -1: off */
    int stall_ms;
    int count;                          /* 1: count chunks per tid */
    int64_t chunks[QC_POOL_COUNTED];
} qc_pool_testing;

static qc_pool_testing qc_pool_test = {-1, 0, 0, {0}};

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;             /* workers sleep here for a new call */
    pthread_cond_t done_cv;             /* the caller sleeps here for running chunks */
    int nworkers;                       /* created: tids 1 .. nworkers */
    int busy;                           /* a call is in flight (1) */
    int sleepers;                       /* workers in work_cv */
    int caller_waiting;                 /* the caller is in done_cv */
    /* the call in flight: written by the caller before the parts open, read by workers (relaxed atomics: a
     * worker late for a call may read the next call's fields, but then its claims on the parts fail) */
    qc_pool_fn fn;
    void *ctx;
    int64_t n, chunk;
    int nthreads;
    uint64_t ticket;                    /* (generation << 32) of the call in flight: the workers wait for it */
    int64_t done;                       /* items finished */
    int64_t sum;                        /* of fn's return values */
} qc_pool_state;

static qc_pool_state qc_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
                                0, 0, 0, 0, NULL, NULL, 0, 0, 0, 0, 0, 0};

/* part p of the call in flight: items [lo, hi); next: (generation << 32) | next unclaimed item (0xffffffff:
 * closed). One cache line a part (the threads claim from their own). */
typedef struct {
    uint64_t next;
    int64_t hi;
    char pad[48];
} qc_pool_part;

static qc_pool_part qc_pool_parts[QC_POOL_MAX_THREADS] __attribute__((aligned(64)));

/* 1 while a part of the call of generation gen holds unclaimed items */
static int qc_pool_left(uint32_t gen, int nparts)
{
    for (int p = 0; p < nparts; ++p) {
        const uint64_t t = __atomic_load_n(&qc_pool_parts[p].next, __ATOMIC_ACQUIRE);
        if ((uint32_t)(t >> 32) == gen && (int64_t)(t & 0xffffffffu) < __atomic_load_n(&qc_pool_parts[p].hi, __ATOMIC_RELAXED))
            return 1;
    }
    return 0;
}

static inline void qc_pool_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int64_t qc_pool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One step of a bounded spin that started at t0: pause, or yield the core after QC_POOL_PAUSE_NS (so a thread
 * of ours sharing the core runs); 0 once QC_POOL_SPIN_NS has passed (time to block). */
static inline int qc_pool_spin(int64_t t0, int *k)
{
    if ((++*k & 31) != 0) {
        qc_pool_pause();
        return 1;
    }
    const int64_t dt = qc_pool_now_ns() - t0;
    if (dt >= QC_POOL_SPIN_NS)
        return 0;
    if (dt >= QC_POOL_PAUSE_NS)
        sched_yield();
    return 1;
}

/* Claims and runs chunks of the call of generation gen, from part tid and then the parts after it, until none is
 * left; a claim fails once the part's counter has moved to another generation (then the call is over). The thread
 * whose chunk completes the call wakes a sleeping caller. */
static void qc_pool_work(uint32_t gen, int tid, int is_worker)
{
    const int nparts = __atomic_load_n(&qc_pool.nthreads, __ATOMIC_RELAXED);   /* one part a thread */
    if (tid >= nparts)
        return;   /* (fields read before a claim: stale only when the call is over, and then every claim fails) */
    if (is_worker && tid == __atomic_load_n(&qc_pool_test.stall_tid, __ATOMIC_RELAXED)) {
        const int ms = __atomic_load_n(&qc_pool_test.stall_ms, __ATOMIC_RELAXED);
        for (int i = 0; i < ms && qc_pool_left(gen, nparts); ++i) {
            struct timespec ms1 = {0, 1000000};
            nanosleep(&ms1, NULL);
        }
    }
    const int64_t n = __atomic_load_n(&qc_pool.n, __ATOMIC_RELAXED);
    const int64_t chunk = __atomic_load_n(&qc_pool.chunk, __ATOMIC_RELAXED);
    for (int k = 0; k < nparts; ++k) {
        qc_pool_part *part = &qc_pool_parts[(tid + k) % nparts];
        uint64_t t = __atomic_load_n(&part->next, __ATOMIC_ACQUIRE);
        for (;;) {
            if ((uint32_t)(t >> 32) != gen)
                return;
            const int64_t b = (int64_t)(t & 0xffffffffu), hi = __atomic_load_n(&part->hi, __ATOMIC_RELAXED);
            if (b >= hi)
                break;
            const int64_t e = b + chunk < hi ? b + chunk : hi;
            if (!__atomic_compare_exchange_n(&part->next, &t, ((uint64_t)gen << 32) | (uint64_t)e, 1,
                                             __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                continue;   /* t now holds the part's current counter */
            /* the chunk is ours: the call cannot finish (nor its fields change) before it is counted done */
            qc_pool_fn fn = __atomic_load_n(&qc_pool.fn, __ATOMIC_RELAXED);
            void *ctx = __atomic_load_n(&qc_pool.ctx, __ATOMIC_RELAXED);
            const int64_t r = fn(ctx, b, e, tid);
            if (r)
                __atomic_fetch_add(&qc_pool.sum, r, __ATOMIC_RELAXED);   /* ordered before the release of done */
            if (__atomic_load_n(&qc_pool_test.count, __ATOMIC_RELAXED) && tid < QC_POOL_COUNTED)
                __atomic_fetch_add(&qc_pool_test.chunks[tid], 1, __ATOMIC_RELAXED);
            if (__atomic_add_fetch(&qc_pool.done, e - b, __ATOMIC_SEQ_CST) == n
                    && __atomic_load_n(&qc_pool.caller_waiting, __ATOMIC_SEQ_CST)) {
                pthread_mutex_lock(&qc_pool.mu);
                pthread_cond_signal(&qc_pool.done_cv);
                pthread_mutex_unlock(&qc_pool.mu);
            }
            t = __atomic_load_n(&part->next, __ATOMIC_ACQUIRE);
        }
    }
}

/* arg: tid | (generation before the creating call << 32) */
static void *qc_pool_worker(void *arg)
{
    const int tid = (int)((uintptr_t)arg & 0xffffffffu);
    uint32_t seen = (uint32_t)((uint64_t)(uintptr_t)arg >> 32);
    int spin = 1;   /* spin for the next call only after taking part in the last one */
    for (;;) {
        uint32_t gen = seen;
        if (spin) {
            const int64_t t0 = qc_pool_now_ns();
            int k = 0;
            while ((gen = (uint32_t)(__atomic_load_n(&qc_pool.ticket, __ATOMIC_ACQUIRE) >> 32)) == seen
                   && qc_pool_spin(t0, &k)) {
            }
        }
        if (gen == seen) {
            pthread_mutex_lock(&qc_pool.mu);
            __atomic_add_fetch(&qc_pool.sleepers, 1, __ATOMIC_SEQ_CST);
            while ((gen = (uint32_t)(__atomic_load_n(&qc_pool.ticket, __ATOMIC_SEQ_CST) >> 32)) == seen)
                pthread_cond_wait(&qc_pool.work_cv, &qc_pool.mu);
            __atomic_sub_fetch(&qc_pool.sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&qc_pool.mu);
        }
        seen = gen;
        spin = tid < __atomic_load_n(&qc_pool.nthreads, __ATOMIC_RELAXED);
        if (spin)
            qc_pool_work(gen, tid, 1);
    }
    return NULL;
}

/* Creates workers up to tid want-1 (callers hold busy); returns the threads available (workers + caller). */
static int qc_pool_grow(int want)
{
    if (want > QC_POOL_MAX_THREADS)
        want = QC_POOL_MAX_THREADS;
    if (qc_pool.nworkers + 1 >= want)
        return want;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);   /* signals stay with the Python threads */
    while (qc_pool.nworkers + 1 < want) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const uint64_t arg = (uint64_t)(qc_pool.nworkers + 1) | (qc_pool.ticket & 0xffffffff00000000ull);
        const int rc = pthread_create(&th, &attr, qc_pool_worker, (void *)(uintptr_t)arg);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break;
        qc_pool.nworkers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return qc_pool.nworkers + 1;
}

static void qc_pool_atfork_child(void)
{
    /* the workers do not exist in the child: start over (a call in flight in the parent is not the child's) */
    pthread_mutex_init(&qc_pool.mu, NULL);
    pthread_cond_init(&qc_pool.work_cv, NULL);
    pthread_cond_init(&qc_pool.done_cv, NULL);
    qc_pool.nworkers = 0;
    qc_pool.busy = 0;
    qc_pool.sleepers = 0;
    qc_pool.caller_waiting = 0;
}

static pthread_once_t qc_pool_once = PTHREAD_ONCE_INIT;
static void qc_pool_init(void) { pthread_atfork(NULL, NULL, qc_pool_atfork_child); }

static int64_t qc_parallel_for(int64_t n, int64_t chunk, qc_pool_fn fn, void *ctx, int nthreads)
{
    int64_t sum = 0;
    if (n <= 0)
        return 0;
    if (chunk < 1)
        chunk = 1;
    if (nthreads > 1 && n > chunk && n < ((int64_t)1 << 31)
            && !__atomic_exchange_n(&qc_pool.busy, 1, __ATOMIC_ACQUIRE)) {
        pthread_once(&qc_pool_once, qc_pool_init);
        const int64_t nchunks = (n + chunk - 1) / chunk;
        if (nthreads > nchunks)
            nthreads = (int)nchunks;
        nthreads = qc_pool_grow(nthreads);
        if (nthreads > 1) {
            /* Close the last call's parts before its fields change: a worker still holding one of their counters
             * (all of its items claimed) reads the new fields, and without the close its claim of [old end, ...)
             * could succeed against the unchanged counter, run an item of no call and count it in the new call's
             * done (a lost or early completion). A closed counter has its own generation and no items. */
            const uint32_t gen = (uint32_t)(qc_pool.ticket >> 32) + 2;
            const int closing = qc_pool.nthreads > nthreads ? qc_pool.nthreads : nthreads;   /* the last call's parts */
            for (int p = 0; p < closing; ++p)
                __atomic_store_n(&qc_pool_parts[p].next, ((uint64_t)(gen - 1) << 32) | 0xffffffffu, __ATOMIC_SEQ_CST);
            __atomic_store_n(&qc_pool.ticket, (uint64_t)(gen - 1) << 32, __ATOMIC_SEQ_CST);
            __atomic_store_n(&qc_pool.fn, fn, __ATOMIC_RELEASE);
            __atomic_store_n(&qc_pool.ctx, ctx, __ATOMIC_RELEASE);
            __atomic_store_n(&qc_pool.n, n, __ATOMIC_RELEASE);
            __atomic_store_n(&qc_pool.chunk, chunk, __ATOMIC_RELEASE);
            __atomic_store_n(&qc_pool.nthreads, nthreads, __ATOMIC_RELEASE);
            __atomic_store_n(&qc_pool.done, 0, __ATOMIC_RELEASE);
            __atomic_store_n(&qc_pool.sum, 0, __ATOMIC_RELEASE);
            for (int p = 0; p < nthreads; ++p) {   /* part p: chunks [nchunks p / T, nchunks (p + 1) / T) */
                const int64_t lo = nchunks * p / nthreads * chunk, hi = nchunks * (p + 1) / nthreads * chunk;
                __atomic_store_n(&qc_pool_parts[p].hi, hi < n ? hi : n, __ATOMIC_RELEASE);
                __atomic_store_n(&qc_pool_parts[p].next, ((uint64_t)gen << 32) | (uint64_t)lo, __ATOMIC_SEQ_CST);
            }
            __atomic_store_n(&qc_pool.ticket, (uint64_t)gen << 32, __ATOMIC_SEQ_CST);
            if (__atomic_load_n(&qc_pool.sleepers, __ATOMIC_SEQ_CST)) {
                pthread_mutex_lock(&qc_pool.mu);
                pthread_cond_broadcast(&qc_pool.work_cv);
                pthread_mutex_unlock(&qc_pool.mu);
            }
            qc_pool_work(gen, 0, 0);
            if (__atomic_load_n(&qc_pool.done, __ATOMIC_ACQUIRE) != n) {
                const int64_t t0 = qc_pool_now_ns();
                int k = 0;
                while (__atomic_load_n(&qc_pool.done, __ATOMIC_ACQUIRE) != n && qc_pool_spin(t0, &k)) {
                }
                if (__atomic_load_n(&qc_pool.done, __ATOMIC_ACQUIRE) != n) {
                    pthread_mutex_lock(&qc_pool.mu);
                    __atomic_store_n(&qc_pool.caller_waiting, 1, __ATOMIC_SEQ_CST);
                    while (__atomic_load_n(&qc_pool.done, __ATOMIC_SEQ_CST) != n)
                        pthread_cond_wait(&qc_pool.done_cv, &qc_pool.mu);
                    __atomic_store_n(&qc_pool.caller_waiting, 0, __ATOMIC_SEQ_CST);
                    pthread_mutex_unlock(&qc_pool.mu);
                }
            }
            sum = __atomic_load_n(&qc_pool.sum, __ATOMIC_RELAXED);
            __atomic_store_n(&qc_pool.busy, 0, __ATOMIC_RELEASE);
            return sum;
        }
        __atomic_store_n(&qc_pool.busy, 0, __ATOMIC_RELEASE);
    }
    for (int64_t b = 0; b < n; b += chunk) {
        sum += fn(ctx, b, b + chunk < n ? b + chunk : n, 0);
        if (__atomic_load_n(&qc_pool_test.count, __ATOMIC_RELAXED))
            __atomic_fetch_add(&qc_pool_test.chunks[0], 1, __ATOMIC_RELAXED);
    }
    return sum;
}

#endif
