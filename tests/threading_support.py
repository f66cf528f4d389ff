"""Running test work on many threads that interleave as often as the interpreter allows."""
import sys
import threading


def run_interleaved(work, n: int = 8) -> list:
    """``[work(0), ..., work(n-1)]``, each on its own thread, with the interpreter switching threads every few
    bytecodes (so an unlocked bind + enqueue, say, would interleave); an exception of any thread is re-raised."""
    results, errors = [None] * n, []

    def run(i):
        try:
            results[i] = work(i)
        except Exception as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    if errors:
        raise errors[0]
    return results
