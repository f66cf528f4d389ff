"""Kernel labs: sweeps of the OpenCL engine's public options (see docs/benchmarks_gpu.md)."""
