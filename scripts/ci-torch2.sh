#!/usr/bin/env bash
# scripts/ci-torch2.sh: the Python package's suite on what users run: PyPI's newest torch 2.x and Hugging Face
# transformers, in a venv of their own (scripts/torch2-venv.sh: about 60-150 s and 5.6 GB here), against this
# build's library. Debian's torch 1.13 runs the same suite in ctest and scripts/ci-python.sh; here the torch 2.x
# paths run too (clattn.functional's custom operator under torch.compile, the transformers models).
#   bash scripts/ci-torch2.sh     # TORCH2_VENV: where the venv goes (default: a new temporary one); BUILD_DIR (build)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if [ -n "${TORCH2_VENV:-}" ]; then venv=$TORCH2_VENV; else  # a temporary one of our own: gone when we end
    own=$(mktemp -d); trap 'rm -rf "$own"' EXIT; venv=$own/venv
fi
py=$(bash scripts/torch2-venv.sh "$venv")
installed=$(date +%s)
lib=$PWD/${BUILD_DIR:-build}/libclattn.so
[ -f "$lib" ] || { echo "ci-torch2: no $lib (build first: scripts/setup.sh)" >&2; exit 1; }
"$py" -c "import transformers, torch; assert int(torch.__version__.split('.')[0]) >= 2" ||
    { echo "ci-torch2: the venv has no torch 2.x with transformers" >&2; exit 1; }
CLATTN_TEST_PYTHON=$py sh scripts/run-python-tests.sh "$lib"
# the example: a transformers model generating with clattn, the same tokens as with its own sdpa
CLATTN_LIBRARY=$lib PYTHONPATH=$PWD/python "$py" examples/transformers/generate.py --new 8 | tail -1
CLATTN_LIBRARY=$lib PYTHONPATH=$PWD/python "$py" examples/transformers/generate.py --new 8 --device-cache | tail -1
echo "ci-torch2: venv $((installed - start)) s, tests $(( $(date +%s) - installed )) s"
