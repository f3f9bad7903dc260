#!/usr/bin/env bash
# scripts/ci-sanitize.sh: the sanitizer stage of CI (.ci/run calls it after the tests).
#
# Configures ./build-asan (Debug at -O1, -DCLATTN_SANITIZE=ON: AddressSanitizer + UBSan, UBSan
# not recoverable), builds it and runs the whole ctest suite there. Every test case runs
# on `ref` and on the OpenCL device ($CLATTN_TEST_DEVICE, default "opencl": PoCL on a
# machine without a GPU), so one pass covers both. Fails on a failing test or on any
# sanitizer report from any process (test binaries, Criterion's test processes, the CLI).
#
#   bash scripts/ci-sanitize.sh          # from the repository root or anywhere
# Environment: BUILD_DIR (default build-asan), CLATTN_TEST_DEVICE, CTEST_ARGS (extra
# arguments to ctest, e.g. "-R test_robust").
#
# How the sanitizers are set up, and why:
#  - Criterion runs every test in its own process. LeakSanitizer does run when such a
#    process exits (Criterion 2.4's --no-early-exit is a no-op: the workers always return
#    from main), but by then the test has reported PASS, and Criterion ignores the exit
#    status LeakSanitizer sets: a leak would only be printed. abort_on_error=1 makes the
#    report end in SIGABRT instead, which Criterion reports as "crashed during its setup or
#    teardown" and counts in its exit status. Checked with a deliberately leaking test.
#  - ASan's log_path sends every ASan and LeakSanitizer report of every process to
#    $BUILD_DIR/sanitizer-logs/asan.<pid>; the script fails if any of them holds a report
#    (files that only list the suppressions used are shown, not failures). This also
#    catches processes whose status nobody checks. GCC's UBSan runtime ignores log_path and
#    writes to stderr (then aborts: the build uses -fno-sanitize-recover=undefined), so the
#    script also looks for "runtime error:" in ctest's log of every test's output.
#  - Suppressions (tests/lsan.supp): PoCL and the LLVM it compiles kernels with keep
#    allocations to the end of the process when they compile a kernel that is not in
#    PoCL's kernel cache yet. Nothing of clattn is suppressed. tests/ubsan.supp is empty:
#    only clattn is instrumented.
#  - No other option is needed for ASan + PoCL (Debian 12: pocl 3.1, LLVM 15, ocl-icd 2.3,
#    CLBlast 1.5.3): PoCL loads uninstrumented libraries only, so detect_odr_violation and
#    alloc_dealloc_mismatch stay at their defaults. Checked with a cold PoCL cache
#    (POCL_CACHE_DIR pointing to an empty directory), where PoCL runs LLVM in-process.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$(date +%s)
build=${BUILD_DIR:-build-asan}

# -O1, as AddressSanitizer's authors advise for a usable speed: the suite's longest entries took up to a third less
# (test_train 103 s -> 69 s, the decode families 63 s -> 53 s, PoCL, 2026-11-28). UBSan places its checks before
# the optimiser runs, so they stay. With the test oracle unsanitized (CMakeLists.txt), this stage's build and tests
# took 76 + 373 s at -O1 against 43 + 457 s at -O0 (2 ctest jobs, PoCL, 2026-11-29).
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DCLATTN_SANITIZE=ON >/dev/null
cmake --build "$build" -j"$(nproc)"
built=$(date +%s)

logs=$root/$build/sanitizer-logs
rm -rf "$logs" "$logs-tracer-crash"
mkdir -p "$logs"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1:log_path=$logs/asan"
export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:suppressions=$root/tests/ubsan.supp"
export CLATTN_TEST_DEVICE=${CLATTN_TEST_DEVICE:-opencl}
# The compiled-kernel cache is off in this stage. With PoCL 3.1, processes that create and release many plans from
# cached program binaries (the encoder's fault walk, a CLI child) sometimes make LeakSanitizer's exit-time tracer
# crash ("Tracer caught signal 11", no report about any code), which fails the test. test_program_cache turns the
# cache back on for its own tests, so the cache's code still runs under the sanitizers.
export CLATTN_PROGRAM_CACHE=0
# PoCL alone: the ICD loader otherwise loads Mesa's drivers (mesa-opencl-icd, for CI's rusticl stage) into every
# process, and Clover's libMesaOpenCL.so keeps 128 bytes to exit from code LeakSanitizer's fast unwinder cannot walk
# (the stack ends in "<unknown module>", so tests/lsan.supp's library pattern cannot match it). Host code that lists
# several platforms still runs in the README command's stage, where both are installed.
if [ -z "${OCL_ICD_VENDORS:-}" ] && [ -f /etc/OpenCL/vendors/pocl.icd ]; then
    export OCL_ICD_VENDORS=/etc/OpenCL/vendors/pocl.icd
    echo "sanitize: OCL_ICD_VENDORS=$OCL_ICD_VENDORS"
fi
echo "sanitize: ASAN_OPTIONS=$ASAN_OPTIONS"
echo "sanitize: LSAN_OPTIONS=$LSAN_OPTIONS"
echo "sanitize: UBSAN_OPTIONS=$UBSAN_OPTIONS"
"$build/clattn" devices

rc=0
# Only the host code is instrumented: the README's test command's entries (every family once, every core's
# conformance family; not the `matrix` label, whose per-core entries run the same host code with other kernels, nor
# the `config` label: a core's second and later tuning configurations, the same host code with other -D values;
# about 70 s of this stage on CI's 2 cores), and the GEMM cores' test_limits entries (their blocking, sub-buffers past 2^31 elements and the seam under lowered
# limits, host code of the GEMM cores' own). Not flash_mma's conformance: its host code is the flash family's
# (flash.c, which flash_gemm's entries run here, split workspace included) and its descriptor, which test_mma runs
# here; on PoCL its kernel is the slow emulation, the same with or without the sanitizers.
# Nor test_fused's long sequences (long/*, 47 s here against 35 s for its fused/* suite, 2026-11-29): their host code,
# the score matrix in blocks of rows and the GEMMs within the BLAS index range, is what test_limits' lowered limits
# run (limits/row_blocks_*, limits/blas_index_*), here too; the plain entry runs them on the Release build.
tmp=$build/Testing/Temporary
rm -f "$tmp"/LastTest-*.log   # (a run before this one's logs are not this run's)
# LeakSanitizer's exit-time tracer itself sometimes crashes under PoCL ("Tracer caught signal 11", no report about
# any code; seen in test_tune's search once in three CI runs, passing when run again). So each pass: when it fails,
# a tracer crashed and no log holds a sanitizer report, its failed entries run once more; anything that fails again
# fails the stage. Its ctest logs are kept as LastTest-NAME*.log for the UBSan scan below.
run_pass() { # NAME ctest-arguments...
  local name=$1 r=0 tracer_logs
  shift
  ctest --test-dir "$build" --output-on-failure "$@" || r=$?
  cp "$tmp/LastTest.log" "$tmp/LastTest-$name.log" 2>/dev/null || true
  tracer_logs=$(grep -l 'Tracer caught signal' "$logs"/* 2>/dev/null || true)
  if [ "$r" -ne 0 ] && [ -n "$tracer_logs" ] &&
     ! grep -q -E 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$logs"/* 2>/dev/null; then
    echo "sanitize: LeakSanitizer's tracer crashed in $(echo "$tracer_logs" | wc -l) process(es) (no report): the" \
         "failed entries of the $name pass once more"
    mkdir -p "$logs-tracer-crash"
    for f in $tracer_logs; do mv "$f" "$logs-tracer-crash/"; done
    r=0
    ctest --test-dir "$build" --output-on-failure --rerun-failed || r=$?
    cp "$tmp/LastTest.log" "$tmp/LastTest-$name-rerun.log" 2>/dev/null || true
  fi
  return "$r"
}
# shellcheck disable=SC2086
run_pass first -LE '^(matrix|config)$' -E '_core_flash_mma|^test_fused$' ${CTEST_ARGS:-} || rc=$?
# test_fused without its long sequences (above); CTEST_ARGS is the other passes' (its -R would replace this one's)
CRITERION_TEST_PATTERN='fused/*' run_pass fused -R '^test_fused$' || rc=$?
# shellcheck disable=SC2086
run_pass gemm-limits -R '^test_limits_core_gemm_' ${CTEST_ARGS:-} || rc=$?

reports=0
shopt -s nullglob
logfiles=("$logs"/*)
for f in "${logfiles[@]}"; do
  if grep -q -E 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: ' "$f"; then
    reports=$((reports + 1))
    echo "sanitize: ---- report in $f"
    cat "$f"
  fi
done
used=""
((${#logfiles[@]})) && used=$(cat "${logfiles[@]}" | awk '/Suppressions used:/ {on = 1; next} on && NF == 3 && $1 ~ /^[0-9]+$/ {n[$3] += $1; b[$3] += $2} /^-+$/ {on = 0} END {for (k in n) printf "%s: %d allocations, %d bytes; ", k, n[k], b[k]}')
if [ -n "$used" ]; then echo "sanitize: suppressed at exit (tests/lsan.supp): $used"; fi
for ctest_log in "$tmp"/LastTest-*.log; do
  if [ -f "$ctest_log" ] && grep -q 'runtime error:' "$ctest_log"; then
    reports=$((reports + 1))
    echo "sanitize: ---- UndefinedBehaviorSanitizer in $ctest_log:"
    grep -B2 -A12 'runtime error:' "$ctest_log" | head -200
  fi
done

echo "sanitize: build $((built - start)) s, tests $(( $(date +%s) - built )) s"
if [ "$reports" -ne 0 ]; then
  echo "sanitize: $reports sanitizer report(s), see above" >&2
  rc=1
fi
if [ "$rc" -ne 0 ]; then
  echo "sanitize: FAILED" >&2
  exit "$rc"
fi
echo "sanitize: no failing test and no sanitizer report"
