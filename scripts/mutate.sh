#!/usr/bin/env bash
# scripts/mutate.sh: does the test suite catch planted bugs?
#
# Copies the repository's tracked files to a scratch directory, builds it once, checks that the
# tests named in scripts/mutants.txt pass unmutated, then plants each bug of that list alone
# (an exact text replacement), rebuilds incrementally, runs the tests the list names for it, and
# reports which test caught it. The working tree is never touched.
#
#   bash scripts/mutate.sh [--list FILE] [--only REGEX] [--scratch DIR] [--jobs N] [--workers N] [--no-baseline]
# The scratch directory (default: a new one under $TMPDIR) keeps each mutant's test log. --workers (default: the
# CPUs, at most 2 when more than 20 mutants are chosen, else 1): copies of the tree, each with its own build, that
# take the mutants in turn side by side (a mutant's build and tests are mostly single-threaded). --no-baseline: skip
# the unmutated run of the named tests, for a caller that has just run them on the same sources (CI: the README's
# command, the matrix and the torch2 stage, at -O3 where this builds at MUTATE_OPT, default -O1), where it cost
# minutes for no new verdict.
#
# The tests field is a ctest regex, optionally followed by " % PATTERN": a Criterion filter (CRITERION_TEST_PATTERN,
# "suite/name" globs) that the mutant's test binaries run instead of all their tests, as the test that catches it
# (scripts/mutants-narrow.py writes them from a run's log). It replaces an entry's own --filter too: the filtered
# entries pass the variable where it is set (CMakeLists.txt's clattn_add_filtered_test, cmake/core_tests.cmake.in).
# "pytest:EXPR" does the same for the Python entries (pytest -k EXPR); one that selects no test is BROKEN.
# A mutant's tests that run past MUTATE_TEST_TIMEOUT seconds (default 300, all of them together) are
# killed, and a bug that makes a kernel loop forever counts as caught (a hang).
# Exit status: 0 when every bug was caught; 1 when any survived; 2 when the list is stale (a text
# that no longer occurs exactly once), a mutant does not build, or the unmutated tests fail.
# Needs the build dependencies of scripts/setup.sh (cmake, OpenCL, CLBlast, Criterion) and an
# OpenCL device (PoCL on CI). On the 2-core CI machine all 794 took 18 minutes (fresh clone, 2026-11-29).
set -euo pipefail
trap 'echo "mutate.sh: internal error at line $LINENO (exit 2, not a verdict on the tests)" >&2; exit 2' ERR

root=$(cd "$(dirname "$0")/.." && pwd)
list=$root/scripts/mutants.txt
only=
scratch=
jobs=$(nproc 2>/dev/null || echo 2)
workers=
baseline=1
test_timeout=${MUTATE_TEST_TIMEOUT:-300}
# The scratch builds' optimisation level. -O1: a mutant's recompile and relink are most of its time; 30 C mutants
# (a random sample of src/) took 114 s at -O3, 84 s at -O1 and 70 s at -O0 with 2 workers, setup included, but at -O0
# the float64 oracles and the ref device ran slower (one mutant's tests 25 s against 13; PoCL, 2026-11-29). The
# numbers are -O3's: ISO C11 (CMAKE_C_EXTENSIONS OFF) keeps GCC's -ffp-contract=off, and without -march x86-64 has
# no FMA to contract into, so only undefined behaviour (the sanitizer stage's to find) could differ; --no-baseline
# (CI) relies on that.
opt=${MUTATE_OPT:--O1}
# (the cache variable's value: the optimisation level, and NDEBUG as CMake's Release has it)
release_flags="-DCMAKE_C_FLAGS_RELEASE=$opt -DNDEBUG"
while [ $# -gt 0 ]; do
    case $1 in
        --list) list=$2; shift 2 ;;
        --only) only=$2; shift 2 ;;
        --scratch) scratch=$2; shift 2 ;;
        --jobs) jobs=$2; shift 2 ;;
        --workers) workers=$2; shift 2 ;;
        --no-baseline) baseline=0; shift ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "mutate.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -f "$list" ] || { echo "mutate.sh: no mutant list at $list" >&2; exit 2; }
command -v flock >/dev/null || { echo "mutate.sh: needs flock (util-linux): the workers' queue" >&2; exit 2; }
# The random-combination sweeps (prefill/sweep, train/sweep) run no cases here: every mutant names the families that
# catch it, and the sweeps would add about 8 s to each of the 130 mutants that run test_train or test_conformance.
export CLATTN_TEST_SWEEP=${CLATTN_TEST_SWEEP:-0}
[ -n "$scratch" ] || scratch=$(mktemp -d "${TMPDIR:-/tmp}/clattn-mutate.XXXXXX")

# ---- the list: id, file, find, replace, tests (fields separated by " @@ ")
ids=(); files=(); finds=(); repls=(); regexes=(); patterns=()
while IFS= read -r line; do
    case $line in ''|'#'*) continue ;; esac
    seps=$(printf '%s' "$line" | grep -o ' @@ ' | wc -l)
    [ "$seps" -eq 4 ] || { echo "mutate.sh: not 5 fields separated by ' @@ ': $line" >&2; exit 2; }
    rest=$line
    fields=()
    for _ in 1 2 3 4; do
        fields+=("${rest%% @@ *}")
        rest=${rest#* @@ }
    done
    fields+=("$rest")
    if [ -n "$only" ] && ! [[ ${fields[0]} =~ $only ]]; then continue; fi
    [ -f "$root/${fields[1]}" ] || { echo "mutate.sh: ${fields[0]}: no file ${fields[1]}" >&2; exit 2; }
    pattern=
    case ${fields[4]} in *' % '*) pattern=${fields[4]#* % }; fields[4]=${fields[4]%% % *} ;; esac
    ids+=("${fields[0]}"); files+=("${fields[1]}"); finds+=("${fields[2]}"); repls+=("${fields[3]}"); regexes+=("${fields[4]}")
    patterns+=("$pattern")
done < "$list"
[ "${#ids[@]}" -gt 0 ] || { echo "mutate.sh: no mutant selected" >&2; exit 2; }

# ---- a scratch copy of the tracked files, built once
t_start=$(date +%s)
echo "mutate.sh: ${#ids[@]} mutants; scratch copy in $scratch"
rm -rf "$scratch/src"
mkdir -p "$scratch/src"
# tracked files and new ones not ignored: what the next commit would hold
(cd "$root" && git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$scratch/src/")
# Ninja where it is installed (scripts/setup.sh installs it): a mutant's rebuild checks the whole tree's dependencies
# in 0.03 s against make's 0.8-1.0 s, and recompiles one file in 0.8 s against 1.7 s. Measured on CI's 2-core
# machine, 42 mutants with 2 workers: 94 s against 106 s with make (about 0.3 s of wall time per mutant)
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
rm -rf "$scratch/build"   # (a --scratch DIR used before may hold another generator's build)
cmake "${generator[@]}" -S "$scratch/src" -B "$scratch/build" -DCMAKE_BUILD_TYPE=Release "$release_flags" \
    >/dev/null
build() { cmake --build "${1:-$scratch/build}" -j "$jobs" >"${1:-$scratch/build}.log" 2>&1; }
build || { tail -30 "$scratch/build.log"; echo "mutate.sh: the unmutated copy does not build" >&2; exit 2; }

# What each mutant's tests need built, from one listing of the ctest entries (a ctest and a Python start per mutant
# took 0.25 s each, 3 minutes for 720 mutants). An entry needs the build outputs named on its command line, the
# wrapper's arguments and script included (a core's entry is `sh -c 'exec "$0" ...' build/test_decode`, a Python
# suite's is run-python-tests.sh with build/libclattn.so): the test executables (their target builds the library,
# and the CLI for test_cli), the shared library for the Python suites, the CLI, the bench. A mutant relinks those
# alone; an entry that names the build directory itself or an output not in this table takes the whole build ("").
# The whole build after a C mutant relinked every executable: 6.5-10 s a mutant against 2.4 s, for the 310 mutants
# whose tests were wrapped (CI's run of 2026-11-28). A regex that names no entry would make its mutant "survive" for
# nothing: the list is stale (exit 2).
targets=()
(cd "$scratch/build" && ctest --show-only=json-v1) >"$scratch/tests.json"
printf '%s\n' "${regexes[@]}" >"$scratch/regexes.txt"
mapfile -t targets < <(python3 - "$scratch/tests.json" "$scratch/regexes.txt" "$scratch/build" "${generator[*]}" <<'EOF'
import json, os, re, shlex, sys
tests = json.load(open(sys.argv[1])).get("tests", [])
build = os.path.realpath(sys.argv[3])
ninja = "Ninja" in sys.argv[4]
named = {"clattn": "clattn_cli", "clattn-bench": "clattn_bench"}   # output name -> target, where they differ
def needs(t):  # the targets an entry's command needs, or None for the whole build
    out = set()
    for word in t.get("command") or []:
        try:
            tokens = shlex.split(word)
        except ValueError:
            tokens = word.split()
        for tok in tokens:
            tok = tok.strip("'\"")
            if not tok.startswith("/"):
                continue
            path = os.path.realpath(tok)
            if os.path.commonpath([path, build]) != build:
                continue   # a source file or a system tool
            rel = os.path.relpath(path, build)
            name = os.path.basename(rel)
            if "/" in rel or rel == ".":
                return None
            if name.startswith("test_"):
                out.add(name)
            elif name.startswith("libclattn.so"):
                # the shared library's target is `clattn`, which Ninja takes for the CLI's file of that name (the
                # library was left stale): with Ninja its file is the target
                out.add(name if ninja else "clattn")
            elif name in named:
                out.add(named[name])
            else:
                return None
    return out or None
for rx in open(sys.argv[2]).read().splitlines():
    sel = [t for t in tests if re.search(rx, t["name"])]
    if not sel:
        print("NONE")
        continue
    got = set()
    for t in sel:
        n = needs(t)
        if n is None:
            got = None
            break
        got |= n
    print(" ".join(sorted(got)) if got else "")
EOF
)
[ "${#targets[@]}" -eq "${#ids[@]}" ] || { echo "mutate.sh: listing the tests' targets failed" >&2; exit 2; }
for k in "${!ids[@]}"; do
    [ "${targets[$k]}" != NONE ] || { echo "mutate.sh: ${ids[$k]}: '${regexes[$k]}' names no ctest entry" >&2; exit 2; }
done
build_for() { # k build-dir: the targets of mutant k, or the whole build
    if [ -n "${targets[$1]}" ]; then
        # shellcheck disable=SC2086
        cmake --build "$2" -j "$jobs" --target ${targets[$1]} >"$2.log" 2>&1
    else
        build "$2"
    fi
}
echo "mutate.sh: the copy built and its tests listed in $(( $(date +%s) - t_start )) s"
# the union of the lists' regexes, alternatives of the form ^name$ listed once
union=$(printf '%s\n' "${regexes[@]}" | sed 's/\$|\^/$\n^/g' | sort -u | paste -sd'|')
if [ "$baseline" -eq 0 ]; then
    echo "mutate.sh: no unmutated run (--no-baseline): the caller ran these tests on the same sources"
elif echo "mutate.sh: unmutated run of: $union" &&
     ! (cd "$scratch/build" && ctest -R "$union" --output-on-failure >"$scratch/baseline.log" 2>&1); then
    grep -E "Failed|\*\*\*" "$scratch/baseline.log" | head -20
    echo "mutate.sh: the tests fail without any planted bug; fix that first" >&2
    exit 2
fi

# ---- one bug at a time
apply() { # file find replace -> 0, or 3 when the text does not occur exactly once (perl: in every Debian)
    MUT_FILE=$1 MUT_FIND=$2 MUT_REPL=$3 perl -e '
        my ($path, $find, $repl) = @ENV{qw(MUT_FILE MUT_FIND MUT_REPL)};
        open(my $in, "<", $path) or die "$path: $!\n";
        local $/; my $s = <$in>; close $in;
        my ($n, $at) = (0, -1);
        for (my $i = index($s, $find); $i >= 0; $i = index($s, $find, $i + 1)) { $n++; $at = $i; }
        if ($n != 1) { print STDERR "\"$find\" occurs $n times in $path\n"; exit 3; }
        substr($s, $at, length $find) = $repl;
        open(my $out, ">", $path) or die "$path: $!\n"; print $out $s; close $out;'
}

# mutant k in the copy src/build of worker w: its verdict into $scratch/verdict.k ("caught", "survived" or
# "broken" and a line), the line on stdout
one() {
    local k=$1 src=$2 bld=$3 w=$4
    local id=${ids[$k]} f=$src/${files[$k]} line verdict rc=0
    cp "$f" "$scratch/orig.$w"
    if ! apply "$f" "${finds[$k]}" "${repls[$k]}"; then
        printf 'broken\t%s (stale: text not found once)\n' "$id" >"$scratch/verdict.$k"
        return
    fi
    local t0; t0=$(date +%s)
    if ! build_for "$k" "$bld"; then
        cp "$scratch/orig.$w" "$f"
        printf 'broken\t%s (does not build)\n' "$id" >"$scratch/verdict.$k"
        printf '%s\t%s\n' "$(( $(date +%s) - t0 ))" "$id" >"$scratch/time.$k"
        echo "$(printf '%-30s BROKEN    (does not build)' "$id")"
        return
    fi
    local log=$scratch/$id.log
    # the first failing test is the verdict: ctest stops there, and so do Criterion and pytest (-x) within a binary.
    # A pattern "pytest:EXPR" selects the pytest entries' tests (-k EXPR), any other the Criterion binaries'.
    local pyk="" crit="${patterns[$k]}"
    case $crit in pytest:*) pyk=" -k '${crit#pytest:}'" crit="" ;; esac
    (cd "$bld" && if [ -n "$crit" ]; then export CRITERION_TEST_PATTERN="$crit"; fi &&
        CRITERION_FAIL_FAST=1 PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} -x$pyk" CTEST_PARALLEL_LEVEL=$per_ctest \
        timeout -k 10 "$test_timeout" ctest -R "${regexes[$k]}" --stop-on-failure --output-on-failure) >"$log" 2>&1 ||
        rc=$?
    verdict=caught
    if [ -n "$pyk" ] && grep -qE "^[= ]*[0-9]+ deselected in [0-9.]+s" "$log"; then   # -k selected no test (pytest
        # exits 5, a failure to ctest): a stale pattern, not a catch
        verdict=broken
        line=$(printf '%-30s BROKEN    (its pattern %s selects no test)' "$id" "${patterns[$k]}")
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        pkill -KILL -f "$bld/" 2>/dev/null || true   # test binaries left behind by ctest
        line=$(printf '%-30s caught: its tests ran past %s s (a hang)' "$id" "$test_timeout")
    elif [ "$rc" -eq 0 ]; then
        verdict=survived
        line=$(printf '%-30s SURVIVED  (ran %s%s)' "$id" "${regexes[$k]}" "${patterns[$k]:+ % ${patterns[$k]}}")
    elif grep -qE "CL_BUILD_PROGRAM_FAILURE|building kernels .* failed" "$log"; then   # the compiler's refusal (a
        # kernel the library refuses after its build, as clattn_core_check_local does, is a catch)
        verdict=broken
        line=$(printf '%-30s BROKEN    (a kernel does not compile)' "$id")
    else
        local caught fails nfail first
        caught=$(sed -n 's/^[[:space:]]*[0-9][0-9]* - \([^ ]*\) (.*/\1/p' "$log" | paste -sd, -)
        fails=$(sed -n -e 's/^\[FAIL\] \([^:]*::[^:]*\):.*/\1/p' \
                       -e 's/^FAILED [^ ]*::\(test_[A-Za-z0-9_]*\).*/pytest::\1/p' "$log")
        nfail=$(printf '%s\n' "$fails" | grep -c . || true)
        first=$(printf '%s\n' "$fails" | head -3 | paste -sd' ' - || true)
        [ -n "$first" ] || first=$(grep -m1 -iE "fail|error|crash|signal" "$log" | cut -c1-100 || true)
        line=$(printf '%-30s caught by %s, %s failing: %s' "$id" "${caught:-?}" "$nfail" "$first")
    fi
    cp "$scratch/orig.$w" "$f"
    case $verdict in
        survived) printf 'survived\t%s\n' "$id" >"$scratch/verdict.$k" ;;
        broken) local why=${line#*BROKEN    (}; printf 'broken\t%s (%s)\n' "$id" "${why%)}" >"$scratch/verdict.$k" ;;
        *) printf 'caught\t%s\n' "$id" >"$scratch/verdict.$k" ;;
    esac
    local took=$(( $(date +%s) - t0 ))
    printf '%s\t%s\n' "$took" "$id" >"$scratch/time.$k"
    echo "$line ($took s)"
}

# the next mutant nobody has taken yet (a counter in $scratch/queue, under flock), or nothing when none is left.
# Workers take mutants from this one queue rather than every workers-th of the list: a mutant takes 1 to 80 s here,
# and a fixed share left one worker idle while the other still had minutes of slow ones to go.
claim() {
    local fd n
    exec {fd}>>"$scratch/queue.lock"
    flock "$fd"
    n=$(cat "$scratch/queue")
    echo $((n + 1)) >"$scratch/queue"
    flock -u "$fd"
    exec {fd}>&-
    [ "$n" -lt "${#ids[@]}" ] && echo "${order[$n]}"
    return 0
}
# The queue's order: by file, then by the targets built. A mutant's build compiles the file it mutates and the file
# the mutant before it restored: one compile where the two are the same file, two where they are not.
mapfile -t order < <(for k in "${!ids[@]}"; do printf '%s\t%s\t%s\n' "${files[$k]}" "${targets[$k]}" "$k"; done |
                     sort -t$'\t' -k1,1 -k2,2 -k3,3n | cut -f3)

# worker w: worker 0 in the copy built above, the others in a copy of their own, built first (while worker 0 already
# runs); each takes mutants from the queue until it is empty
work() {
    local w=$1 src=$scratch/src bld=$scratch/build k
    if [ "$w" -gt 0 ]; then
        src=$scratch/src.w$w bld=$scratch/build.w$w   # copied, unmutated, before any worker started
        cmake "${generator[@]}" -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=Release "$release_flags" >/dev/null &&
            build "$bld" ||
            { echo "mutate.sh: worker $w's copy does not build (see $bld.log)" >&2; return 1; }
    fi
    while k=$(claim) && [ -n "$k" ]; do
        one "$k" "$src" "$bld" "$w"
    done
    # (no rebuild of the restored sources here: the copy's build is left as its last mutant built it, and a later
    # run removes it; rebuilding every target took each worker 30 s to 2 minutes at the end of the stage)
}

if [ -z "$workers" ]; then
    workers=1
    if [ "${#ids[@]}" -gt 20 ] && [ "$jobs" -gt 1 ]; then workers=2; fi
fi
# side by side, each mutant's ctest runs its entries one at a time
per_ctest=${CTEST_PARALLEL_LEVEL:-1}
[ "$workers" -le 1 ] || per_ctest=1
rm -f "$scratch"/verdict.* "$scratch"/time.*
echo 0 >"$scratch/queue"
# the other workers' copies of the unmutated tree, made before worker 0 plants its first bug
for ((w = 1; w < workers; w++)); do
    rm -rf "$scratch/src.w$w" "$scratch/build.w$w"
    cp -a "$scratch/src" "$scratch/src.w$w"
done
pids=()
for ((w = 0; w < workers; w++)); do
    work "$w" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || true; done
echo "mutate.sh: the workers ended $(( $(date +%s) - t_start )) s after the start"

survived=(); broken=()
for k in "${!ids[@]}"; do
    if [ ! -f "$scratch/verdict.$k" ]; then
        broken+=("${ids[$k]} (not run: its worker failed)")
        continue
    fi
    IFS=$'\t' read -r verdict what <"$scratch/verdict.$k"
    case $verdict in
        survived) survived+=("$what") ;;
        broken) broken+=("$what") ;;
    esac
done

# where the stage's time went: every mutant's seconds (build and tests) into $scratch/times.tsv, slowest first, and
# the slowest listed here (what to narrow or split when the stage grows)
if compgen -G "$scratch/time.*" >/dev/null; then
    cat "$scratch"/time.* | sort -rn >"$scratch/times.tsv"
    echo
    total=$(awk -F'\t' '{s += $1} END {print s}' "$scratch/times.tsv")
    echo "mutate.sh: $total s of mutant time in $workers worker(s); the slowest (all in $scratch/times.tsv):"
    head -15 "$scratch/times.tsv" | awk -F'\t' '{printf "  %5d s  %s\n", $1, $2}'
fi

echo
echo "mutate.sh: ${#ids[@]} mutants, $(( ${#ids[@]} - ${#survived[@]} - ${#broken[@]} )) caught, ${#survived[@]} survived, ${#broken[@]} broken"
for s in "${survived[@]}"; do echo "  SURVIVED: $s"; done
for b in "${broken[@]}"; do echo "  BROKEN:   $b"; done
[ "${#broken[@]}" -eq 0 ] || exit 2
[ "${#survived[@]}" -eq 0 ] || exit 1
exit 0
