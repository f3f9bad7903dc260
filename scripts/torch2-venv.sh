#!/usr/bin/env bash
# scripts/torch2-venv.sh: a virtual environment with the newest PyTorch 2.x and Hugging Face transformers from PyPI,
# what users of clattn's Python package run (the rest of the suite runs on Debian's torch 1.13). PyPI's Linux torch
# needs its CUDA libraries to import, even on a CPU: about 5.6 GB and 150 s here (2 vCPUs). NumPy comes from PyPI
# too (torch 2.x is built for NumPy 2). Prints the venv's python.
#   bash scripts/torch2-venv.sh [DIR]     # DIR default: $TORCH2_VENV, else .venv-torch2 in the checkout
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-${TORCH2_VENV:-$PWD/.venv-torch2}}
py=${PYTHON:-}
if [ -z "$py" ]; then if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=python3; fi; fi
if ! "$venv/bin/python" -c "import torch, transformers" 2>/dev/null; then
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "torch>=2.4" "transformers>=4.53" numpy pytest >&2
fi
"$venv/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >&2
echo "$venv/bin/python"
