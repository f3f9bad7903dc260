#!/usr/bin/env bash
# scripts/ci-python.sh: the Python package as a user gets it. In a fresh virtual environment,
# `pip install ./python` (scikit-build-core from PyPI builds libclattn with CMake and puts it in the
# package), then the package's pytest suite, on ref and on the OpenCL device.
#   bash scripts/ci-python.sh           # PYTHON (default python3), VENV (default a temporary one)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
venv=${VENV:-$(mktemp -d)/venv}
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q ./python pytest matplotlib
# run from outside the source tree: the installed package, not python/clattn, must be what imports
(cd "$(dirname "$venv")" && "$venv/bin/python" -m pytest -q "$OLDPWD/python/tests")
echo "ci-python: the package installs and its tests pass"
