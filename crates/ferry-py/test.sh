#!/usr/bin/env bash
# Builds the Python package into a private venv and runs its pytest suite.
#
#   crates/ferry-py/test.sh [pytest args...]
#
# Needs python3 >= 3.11 with venv, and PyPI (maturin, numpy, pytest are installed into
# the venv, target/py-venv, which is reused between runs). Unattended-safe (CI=true).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "ferry-py needs CPython >= 3.11 (the buffer protocol's stable ABI); $py is $("$py" --version 2>&1)" >&2
    exit 1
fi
venv=${FERRY_PY_VENV:-$root/target/py-venv}
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade \
    "maturin>=1.5,<2" numpy pytest
# iceoryx2 is a baseline of `ferry bench python`, not a dependency: its absence is not an error.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "iceoryx2==0.10.0" ||
    echo "iceoryx2 could not be installed: ferry bench python will skip it"
export PATH="$venv/bin:$PATH" # the build backend runs `maturin` by name
# Build with the workspace's target dir, so the Rust part is not compiled twice.
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target} \
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-build-isolation --force-reinstall --no-deps "$here"
cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
