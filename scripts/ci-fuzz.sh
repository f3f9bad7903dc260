#!/usr/bin/env bash
# scripts/ci-fuzz.sh: the fuzzing stage of CI (.ci/run calls it after the tests).
#
# Builds the libFuzzer harnesses of fuzz/ with clang (-fsanitize=fuzzer,address,undefined;
# the library itself with fuzzer-no-link,address,undefined) in ./build-fuzz, then runs each
# harness for FUZZ_SECONDS (side by side, one per CPU) over a scratch copy of its committed seed corpus
# (fuzz/corpus/<harness>/, never modified here). A crash, a sanitizer report (ASan, UBSan,
# LeakSanitizer), a violated property (the harnesses abort), a slow input (> 25 s) or an
# input that needs more than 2 GiB fails the stage: the input is kept as
# build-fuzz/artifacts/<harness>/crash-* (or leak-, timeout-, oom-) and printed in hex.
#
#   bash scripts/ci-fuzz.sh                          # from the repository root or anywhere
#   FUZZ_SECONDS=600 bash scripts/ci-fuzz.sh         # longer runs
#   build-fuzz/fuzz_plan build-fuzz/artifacts/plan/crash-...   # replay one input
#
# Environment: FUZZ_SECONDS (per harness, default 60), FUZZ_HARNESSES (default "npy plan"),
# BUILD_DIR (default build-fuzz). Installs clang and its runtime libraries (libFuzzer, the
# sanitizers) only when they are missing, with sudo when not root.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$(date +%s)
seconds=${FUZZ_SECONDS:-60}
harnesses=${FUZZ_HARNESSES:-npy plan}
build=${BUILD_DIR:-build-fuzz}

# ---- clang with libFuzzer: try to link a trivial fuzzer; install only when that fails
can_fuzz() {
  local t
  t=$(mktemp -d)
  printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }\n' > "$t/t.c"
  clang -fsanitize=fuzzer,address,undefined "$t/t.c" -o "$t/t" >/dev/null 2>&1
  local rc=$?
  rm -rf "$t"
  return $rc
}
if ! command -v clang >/dev/null 2>&1 || ! can_fuzz; then
  echo "fuzz: installing clang and its runtime libraries (libclang-rt-dev)"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q clang libclang-rt-dev
  can_fuzz || { echo "fuzz: clang cannot link -fsanitize=fuzzer even after installing libclang-rt-dev" >&2; exit 1; }
fi

# ---- build (RelWithDebInfo: optimised like CI's library, with line numbers in reports)
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLATTN_FUZZ=ON \
      -DCLATTN_BUILD_TESTS=OFF >/dev/null
targets=()
for h in $harnesses; do targets+=("fuzz_$h"); done
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
built=$(date +%s)

# Leaks are errors (LeakSanitizer after each input); UBSan stops at the first report with a stack.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# The harnesses run side by side, as many at once as there are CPUs (each is one process and one thread: on CI's
# 2 cores the two default harnesses take FUZZ_SECONDS together, not twice that); their reports follow in order.
fuzz_one() { # harness: its log and exit status under build-fuzz/fuzz-work/<harness>
  local h=$1 work=$root/$build/fuzz-work/$1 artifacts=$root/$build/artifacts/$1 rc=0 dict=()
  if [ -f "fuzz/$h.dict" ]; then dict=(-dict="fuzz/$h.dict"); fi
  "$build/fuzz_$h" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
      "${dict[@]}" -artifact_prefix="$artifacts/" "$work/corpus" > "$work/log" 2>&1 || rc=$?
  echo "$rc" > "$work/rc"
}
cpus=$(nproc 2>/dev/null || echo 1)
running=0
for h in $harnesses; do
  work=$root/$build/fuzz-work/$h
  rm -rf "$work" "$root/$build/artifacts/$h"
  mkdir -p "$work/corpus" "$root/$build/artifacts/$h"
  cp fuzz/corpus/"$h"/* "$work/corpus/"   # new inputs go to the scratch copy
  echo "fuzz: fuzz_$h for ${seconds} s (seeds: fuzz/corpus/$h, $(find fuzz/corpus/"$h" -type f | wc -l) files)"
  fuzz_one "$h" &
  running=$((running + 1))
  if [ "$running" -ge "$cpus" ]; then wait -n || true; running=$((running - 1)); fi
done
wait

failed=()
for h in $harnesses; do
  work=$root/$build/fuzz-work/$h
  artifacts=$root/$build/artifacts/$h
  rc=$(cat "$work/rc" 2>/dev/null || echo "?")
  echo "fuzz: fuzz_$h:"
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$work/log" \
      | sed "s/^/fuzz:   /" || true
  if [ "$rc" != 0 ]; then
    failed+=("$h")
    echo "fuzz: fuzz_$h FAILED (exit $rc); the end of its log ($work/log):"
    grep -v -E '^#[0-9]+' "$work/log" | tail -60 || true
    for f in "$artifacts"/*; do
      [ -f "$f" ] || continue
      echo "fuzz: input $f ($(stat -c %s "$f") bytes), replay with: $build/fuzz_$h $f"
      od -A x -t x1z -v "$f" | head -32
    done
  fi
done

echo "fuzz: build $((built - start)) s, fuzzing $(( $(date +%s) - built )) s"
if ((${#failed[@]})); then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no crash in ${seconds} s per harness (${harnesses})"
