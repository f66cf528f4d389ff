"""qconv's own test session: no OpenCL auto-tuning (it never changes results, only speed; the tuning
tests turn it on themselves) and a private tuning cache, so tests neither spend seconds tuning each new
shape nor write to the user's cache."""
import os
import tempfile


def pytest_configure(config):
    os.environ.setdefault("QCONV_TUNE", "none")
    if "QCONV_CACHE_DIR" not in os.environ:
        os.environ["QCONV_CACHE_DIR"] = tempfile.mkdtemp(prefix="qconv-test-cache-")
