#!/usr/bin/env sh
# scripts/run-python-tests.sh LIBRARY [pytest args...]: the Python package's pytest suite (python/tests) against
# the libclattn at LIBRARY, from the source tree (ctest's test_python and test_python_training). The interpreter is $CLATTN_TEST_PYTHON,
# else Debian's /usr/bin/python3 (whose python3-torch the torch tests use), else python3. Without NumPy and
# pytest for it the entry is skipped (exit 77), saying what to install; CI installs them
# (scripts/setup.sh --python-tests), so there it always runs.
set -eu
lib=$1; shift
root=$(cd "$(dirname "$0")/.." && pwd)
py=${CLATTN_TEST_PYTHON:-}
if [ -z "$py" ]; then
    if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=python3; fi
fi
if ! "$py" -c "import numpy, pytest" 2>/dev/null; then
    echo "test_python: skipped: $py has no NumPy or pytest (Debian: apt-get install python3-numpy python3-pytest," \
         "or bash scripts/setup.sh --python-tests; or set CLATTN_TEST_PYTHON)"
    exit 77
fi
# (found, not imported: importing torch took 2.9 s of every run, 72 of them in the mutation stage)
"$py" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null ||
    echo "test_python: no torch for $py: the torch tests are skipped"
cd "$root/python"
# CLATTN_PYTEST_PATHS: what to collect, relative to python/ (default: the whole suite)
# shellcheck disable=SC2086
CLATTN_LIBRARY=$lib PYTHONPATH=$root/python exec "$py" -m pytest -q -p no:cacheprovider ${CLATTN_PYTEST_PATHS:-tests} "$@"
