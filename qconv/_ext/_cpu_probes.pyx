# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Machine-ceiling probes of ``benchmarks/bench_cpu.py`` (the "% of peak" columns): peak int8 multiply-add
rates (AVX-512 VNNI ``vpdpbusd``, AMX ``tdpbusd``) and read bandwidth. Not used by the engine; the C code is
``qconv_probe.h``. Allocations go through the engine's refusal hook (``_cpu._alloc``). The threads are the engine's
pool (``_cpu._parallel_for``, one item a thread): a worker slow to wake leaves its item to another thread, so a
rate is a lower bound of the machine's."""
from libc.stdint cimport uint8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport free

from qconv._ext._cpu cimport _alloc, _parallel_for, qc_kernel_supported, QC_KERNEL_AMX


cdef extern from "qconv_probe.h" nogil:
    int32_t qc_probe_vnni(int64_t n) noexcept
    int32_t qc_probe_amx(int64_t n) noexcept
    uint64_t qc_probe_read(const uint8_t *p, int64_t nbytes)
    int qc_probe_simd()


# ----------------------------------------------------------------------------------------------------
# machine ceilings (for the benchmark's "% of peak" columns; not used by the engine)
# ----------------------------------------------------------------------------------------------------
ctypedef int32_t (*_probe_fn)(int64_t) noexcept nogil


cdef struct _ProbeCtx:
    _probe_fn probe
    int64_t n
    const uint8_t *buf
    int64_t chunk
    uint64_t *part


cdef int64_t _probe_items(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    """Parallel-for body: ``probe(n)`` once per item (one item a thread)."""
    cdef _ProbeCtx *p = <_ProbeCtx *> ctx
    cdef int64_t i, sink = 0
    for i in range(i0, i1):
        sink += p.probe(p.n)
    return sink


cdef int64_t _read_items(void *ctx, int64_t i0, int64_t i1, int tid) noexcept nogil:
    """Parallel-for body: the XOR of the 64-bit words of slices ``i0 .. i1-1`` of the buffer, into ``part``."""
    cdef _ProbeCtx *p = <_ProbeCtx *> ctx
    cdef int64_t t
    for t in range(i0, i1):
        p.part[t] = qc_probe_read(p.buf + t * p.chunk, p.chunk)
    return 0


cdef double _steps_per_second(_probe_fn probe, int threads, double seconds, int64_t n):
    """Rounds per second of ``probe(n)`` on ``threads`` threads, ``n`` grown until one timing lasts ``seconds``."""
    import time
    cdef int64_t sink = 0
    cdef double t = 0
    cdef _ProbeCtx p
    p.probe = probe
    while True:
        t0 = time.perf_counter()
        p.n = n
        with nogil:
            sink += _parallel_for(threads, 1, _probe_items, &p, threads)
        t = time.perf_counter() - t0
        if t >= seconds or n > (1 << 40):
            break
        n = <int64_t> (n * min(16.0, 1.2 * seconds / max(t, 1e-6)))
    return threads * n / t + 0 * sink


def probe_vnni_gops(int threads=1, double seconds=0.25):
    """Peak int8 multiply-add rate in GOP/s (2 ops per multiply-add): ``threads`` threads each issue independent
    512-bit ``vpdpbusd`` (12 accumulators) for about ``seconds``. Without AVX-512 VNNI a scalar loop runs
    (:func:`probe_simd` says which)."""
    # 12 vpdpbusd x 64 multiply-adds per round (the scalar loop counts the same number of additions)
    return _steps_per_second(qc_probe_vnni, threads, seconds, 20000) * 12 * 64 * 2 / 1e9


def probe_amx_gops(int threads=1, double seconds=0.25):
    """Peak AMX-INT8 multiply-add rate in GOP/s (2 ops per multiply-add): ``threads`` threads each issue rounds of
    4 independent ``tdpbusd`` (16 x 16 x 64 multiply-adds each) for about ``seconds``; None without AMX."""
    if not qc_kernel_supported(QC_KERNEL_AMX):
        return None
    return _steps_per_second(qc_probe_amx, threads, seconds, 2000) * 4 * 16 * 16 * 64 * 2 / 1e9


def probe_simd():
    """True when the probes use AVX-512 VNNI (else scalar loops)."""
    return bool(qc_probe_simd())


def probe_read(const uint8_t[::1] buf, int threads=1, int reps=3):
    """``(GB/s, checksum)``: best of ``reps`` passes of ``threads`` threads reading ``buf`` (its length a multiple
    of ``256*threads``) with 512-bit loads; ``checksum`` is the XOR of all 64-bit words of ``buf``."""
    import time
    cdef int64_t nbytes = buf.shape[0], chunk, t
    cdef uint64_t x = 0
    cdef uint64_t *part
    cdef _ProbeCtx p
    if threads < 1 or nbytes == 0 or nbytes % (256 * threads):
        raise ValueError("buf length must be a positive multiple of 256 * threads")
    chunk = nbytes // threads
    part = <uint64_t *> _alloc(threads * sizeof(uint64_t))
    if part == NULL:
        raise MemoryError("probe_read: no memory for the per-thread checksums")
    p.buf, p.chunk, p.part = &buf[0], chunk, part
    best = 0.0
    for _ in range(max(reps, 1)):
        t0 = time.perf_counter()
        with nogil:
            _parallel_for(threads, 1, _read_items, &p, threads)
        dt = time.perf_counter() - t0
        best = max(best, nbytes / dt / 1e9)
    x = 0
    for t in range(threads):
        x ^= part[t]
    free(part)
    return best, int(x)
