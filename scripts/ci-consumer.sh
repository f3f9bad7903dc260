#!/usr/bin/env bash
# scripts/ci-consumer.sh: the README's three ways of linking clattn, tested. Installs ./build to a
# temporary prefix, then builds and runs examples/consumer
#   1. with CMake's find_package(clattn 0.1) against that prefix,
#   2. with plain cc and pkg-config against that prefix,
#   3. with add_subdirectory on the source tree.
#   bash scripts/ci-consumer.sh        # after scripts/setup.sh (BUILD_DIR, default build)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "${BUILD_DIR:-build}" --prefix "$prefix" >/dev/null
pcdir=$(dirname "$(find "$prefix" -name clattn.pc | head -1)")
libdir=$(dirname "$(find "$prefix" -name 'libclattn.so' | head -1)")

echo "consumer 1: find_package(clattn 0.1) against $prefix"
cmake -S examples/consumer -B "$tmp/find" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/find" >/dev/null
"$tmp/find/consumer"

echo "consumer 2: cc with pkg-config --cflags --libs clattn"
# shellcheck disable=SC2046
cc -std=c11 -o "$tmp/pc-consumer" examples/consumer/main.c \
   $(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs clattn) -lm -Wl,-rpath,"$libdir"
"$tmp/pc-consumer"

echo "consumer 3: add_subdirectory(clattn)"
cmake -S examples/consumer -B "$tmp/sub" -DCLATTN_SOURCE_DIR="$root" >/dev/null
cmake --build "$tmp/sub" -j"$(nproc)" >/dev/null
for f in test_opencl clattn clattn-bench; do   # the tests, the CLI, the bench
    if [ -e "$tmp/sub/clattn/$f" ]; then
        echo "ci-consumer: add_subdirectory built $f: tests, CLI and bench must stay off below the top level" >&2
        exit 1
    fi
done
"$tmp/sub/consumer"
echo "ci-consumer: the three ways work"
