"""qconv's benchmarks (run from the repository root: ``python benchmarks/bench_cpu.py``, ``python -m benchmarks.labs.variants``)."""
