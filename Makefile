# qconv developer targets; each one runs scripts/setup.sh (which is idempotent).
# The scripts are the source of truth: CI (.ci/run) and the README call them directly, so a machine
# without make still runs everything.
SHELL := /bin/bash
SETUP := bash scripts/setup.sh

.PHONY: setup demo test sanitize memcheck bench clean

setup:     ## apt OpenCL ICD (as root), .venv, editable install with test extras
	$(SETUP) setup

demo:      ## python -m qconv demo
	$(SETUP) demo

test:      ## pytest suite + examples/downstream_test.py + memcheck + sanitizer jobs (what CI runs)
	$(SETUP) test

sanitize:  ## CPU tests against an ASan+UBSan build of qconv/_ext (in build/sanitize/)
	$(SETUP) sanitize

memcheck:  ## every OpenCL kernel family under Oclgrind (tests/test_gpu_memcheck.py)
	$(SETUP) memcheck

bench:     ## benchmarks/bench_cpu.py and benchmarks/bench_gpu.py
	$(SETUP) bench

clean:     ## remove .venv, build/, generated C and built modules, caches
	$(SETUP) clean
