#!/usr/bin/env bash
# scripts/ci-python.sh: the Python package as a user gets it. In a fresh virtual environment,
# `pip install ./python` (scikit-build-core from PyPI builds libclattn with CMake and puts it in the
# package), then the package's pytest suite, on ref and on the OpenCL device. The environment is the one the
# torch tests need: a venv over Debian's Python with its system packages (python3-torch, from
# scripts/setup.sh --python-tests), NumPy held at Debian's version (the torch built for it breaks on NumPy 2).
#   bash scripts/ci-python.sh    # PYTHON (default /usr/bin/python3, else python3), VENV (default a temporary one)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-}
if [ -z "$py" ]; then if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=python3; fi; fi
if [ -n "${VENV:-}" ]; then venv=$VENV; else own=$(mktemp -d); trap 'rm -rf "$own"' EXIT; venv=$own/venv; fi
"$py" -m venv --system-site-packages "$venv"
constraints=$(dirname "$venv")/constraints.txt
"$py" -c "import numpy; print('numpy==' + numpy.__version__)" > "$constraints" 2>/dev/null || : > "$constraints"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -c "$constraints" ./python pytest matplotlib
"$venv/bin/python" -c "import torch" 2>/dev/null ||
    echo "ci-python: no torch in $venv (bash scripts/setup.sh --python-tests installs Debian's): the torch tests skip"
# run from outside the source tree: the installed package, not python/clattn, must be what imports
(cd "$(dirname "$venv")" && "$venv/bin/python" -m pytest -q "$OLDPWD/python/tests")
# the training example: clattn's attention trained next to torch's, through clattn.autograd (a few steps)
if "$venv/bin/python" -c "import torch" 2>/dev/null; then
    "$venv/bin/python" examples/training/train_tiny.py --steps 3 | tail -1
    # and with the sequence split over 2 processes (clattn.distributed's ring): fails if the curves part
    "$venv/bin/python" examples/training/train_context_parallel.py --steps 3 | tail -1
    # a Llama-style block (GQA, rotary embeddings) from a NumPy checkpoint: exits 1 when clattn differs from torch
    "$venv/bin/python" examples/models/llama_attention.py | tail -3
fi
# clattn demo --plot: the tutorials' weights as heat maps through the package (and a clear failure without it)
plots=$(mktemp -d)
CLATTN_PYTHON="$venv/bin/python" ./build/clattn demo --device ref --plot "$plots" | tail -1
for f in sa_v1.png sa_v1_causal.png; do
    [ -s "$plots/$f" ] || { echo "ci-python: demo --plot wrote no $f" >&2; exit 1; }
done
if CLATTN_PYTHON=/nonexistent/python ./build/clattn demo --device ref --plot "$plots" >/dev/null 2>"$plots/err"; then
    echo "ci-python: demo --plot without Python should fail" >&2; exit 1
fi
grep -q "pip install" "$plots/err" || { echo "ci-python: the failure does not say how to fix it" >&2; exit 1; }
rm -rf "$plots"
echo "ci-python: the package installs, its tests pass, and clattn demo --plot draws through it"
