#!/usr/bin/env bash
# bench/ab.sh: two builds of clattn-bench, alternating, in one run: A B A B ... per configuration, so
# that drift on a shared machine hits both alike. Each line of output is clattn-bench's JSON with a
# "build" key added ("a" or "b") and the round.
#   bash bench/ab.sh A_BENCH B_BENCH ROUNDS -- ARGS... [-- ARGS...]...
# e.g. bash bench/ab.sh /tmp/before/build/clattn-bench build/clattn-bench 2 -- --seq 512 -- --seq 1024 --causal
# Both run with CLATTN_TUNE=0 (the defaults, whatever tuning file the machine has) unless it is set.
set -euo pipefail
[ $# -ge 5 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
a=$1 b=$2 rounds=$3
shift 3
[ "$1" = "--" ] || { echo "ab.sh: expected -- before the first configuration" >&2; exit 2; }
shift
export CLATTN_TUNE=${CLATTN_TUNE:-0}
configs=()
cur=""
for arg in "$@"; do
    if [ "$arg" = "--" ]; then configs+=("$cur"); cur=""; else cur="$cur $arg"; fi
done
configs+=("$cur")
for cfg in "${configs[@]}"; do
    for ((r = 1; r <= rounds; r++)); do
        for which in a b; do
            bin=$a
            [ "$which" = b ] && bin=$b
            # shellcheck disable=SC2086
            "$bin" --json $cfg | sed "s/^{/{\"build\":\"$which\",\"round\":$r,/"
        done
    done
done
