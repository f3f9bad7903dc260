#!/usr/bin/env bash
# scripts/setup.sh: install what clattn needs on Debian 12 (only the missing
# packages), then configure and build it in ./build (Release).
#   bash scripts/setup.sh            # from the repository root
#   bash scripts/setup.sh --python-tests   # also what ctest's test_python and scripts/ci-python.sh use:
#                                          # Debian's NumPy, pytest, venv and torch (with OpenBLAS's threads)
# Environment: BUILD_DIR (default build), CMAKE_ARGS (extra arguments to cmake).
set -euo pipefail
cd "$(dirname "$0")/.."

# mesa-opencl-icd: a second OpenCL implementation (Mesa's rusticl on llvmpipe, with RUSTICL_ENABLE=llvmpipe), whose
# driver defects CI checks clattn against (.ci/run; README, "Drivers with defects"). ninja-build: the mutation
# check's builds (scripts/mutate.sh; make is what ./build uses)
packages=(cmake gcc make pkg-config ocl-icd-opencl-dev opencl-c-headers libclblast-dev libcriterion-dev
          pocl-opencl-icd mesa-opencl-icd ninja-build)
case ${1:-} in
  --python-tests) packages+=(python3-numpy python3-pytest python3-venv python3-torch libopenblas0-pthread) ;;
  '') ;;
  *) echo "setup: unknown option '$1' (--python-tests, or nothing)" >&2; exit 2 ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
fi

build_dir=${BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j"$(nproc)"
echo "setup: built clattn in $build_dir"
