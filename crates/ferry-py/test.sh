#!/usr/bin/env bash
# Builds the Python package into a private venv and runs its pytest suite, twice:
#  1. the abi3 build (CPython 3.11 and later) with the system's python3 (>= 3.11);
#  2. the non-abi3 build (`--no-default-features`, how CPython 3.9 and 3.10 get the buffer
#     protocol) with CPython 3.9, which python39.sh unpacks from Debian 11's packages.
#
#   crates/ferry-py/test.sh [pytest args...]
#
# Needs python3 >= 3.11 with venv, and PyPI (maturin, numpy, pytest are installed into
# the venvs, target/py-venv and target/py39-venv, which are reused between runs).
# FERRY_PY39=skip skips the 3.9 run (it says so); where python39.sh cannot work (no
# dpkg-deb, not amd64, no Debian mirror) the run fails unless FERRY_PY39=skip.
# Builds ferry-bridge (crates/ferry-zenoh) for tests/test_bridge.py. Unattended-safe (CI=true).
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
# iceoryx2 is a baseline of `ferry-bench python`, not a dependency: its absence is not an error.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "iceoryx2==0.10.0" ||
    echo "iceoryx2 could not be installed: ferry-bench python will skip it"
# install_and_test VENV [pytest args...]: builds the package from the checkout into VENV
# (the build backend runs `maturin` by name, from VENV) and runs pytest.
install_and_test() {
    local venv=$1
    shift
    (
        export PATH="$venv/bin:$PATH"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            --no-build-isolation --force-reinstall --no-deps "$here"
        cd "$here"
        "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
    )
}

# tests/test_bridge.py runs two ferry-bridge processes: build the binary (a no-op after
# `cargo test --workspace --release`, which builds it too) unless FERRY_BRIDGE names one.
if [ -z "${FERRY_BRIDGE:-}" ]; then
    (cd "$root" && CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target} \
        cargo build --release --quiet -p ferry-zenoh --bin ferry-bridge)
    export FERRY_BRIDGE=${CARGO_TARGET_DIR:-$root/target}/release/ferry-bridge
fi

echo "--- CPython $("$venv/bin/python" -c 'import platform; print(platform.python_version())'), abi3 build"
# Build with the workspace's target dir, so the Rust part is not compiled twice.
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target} install_and_test "$venv" "$@"

if [ "${FERRY_PY39:-}" = skip ]; then
    echo "--- CPython 3.9: skipped (FERRY_PY39=skip)"
    exit 0
fi
py39=$("$here/python39.sh")
export LD_LIBRARY_PATH="$("$here/python39.sh" --libs)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
venv39=${FERRY_PY39_VENV:-$root/target/py39-venv}
if [ ! -x "$venv39/bin/python" ]; then
    # Debian's venv module would take pip from /usr/share/python-wheels: bootstrap it from
    # a pip wheel off PyPI instead.
    "$py39" -m venv --without-pip "$venv39"
    wheels=$(mktemp -d)
    python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
        --python-version 3.9 --no-deps -d "$wheels" pip
    whl=$(ls "$wheels"/pip-*.whl)
    "$venv39/bin/python" "$whl/pip" install --quiet --disable-pip-version-check --no-index "$whl"
    rm -rf "$wheels"
fi
"$venv39/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade \
    "maturin>=1.5,<2" numpy pytest
# The default (abi3) build must refuse 3.9 with the command that works, not produce an
# extension that fails to import (build.rs).
echo "--- CPython 3.9, default (abi3) build: must be refused"
refusal=$(PATH="$venv39/bin:$PATH" CARGO_TARGET_DIR="$root/target/py39" \
    "$venv39/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-build-isolation --force-reinstall --no-deps "$here" 2>&1) && {
    echo "the abi3 build was not refused on CPython 3.9" >&2
    exit 1
}
grep -q "MATURIN_PEP517_ARGS=--no-default-features" <<<"$refusal" || {
    echo "the abi3 build failed on CPython 3.9 without saying what to do:" >&2
    echo "$refusal" | tail -20 >&2
    exit 1
}
echo "refused, with the command to use"
echo "--- CPython $("$venv39/bin/python" -c 'import platform; print(platform.python_version())'), non-abi3 build"
# Its own target dir: pyo3 configured for another interpreter would rebuild over the abi3
# build's artefacts on every run.
MATURIN_PEP517_ARGS="--no-default-features" CARGO_TARGET_DIR="$root/target/py39" \
    install_and_test "$venv39" "$@"
