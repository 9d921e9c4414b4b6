#!/usr/bin/env bash
# Puts a private CPython 3.9 (with pip) under a prefix, for testing the non-abi3 build of
# ferry-py on the oldest Python the package supports. Prints the interpreter's path.
#
#   crates/ferry-py/python39.sh [PREFIX]     (default: target/cpython39 of the workspace)
#
# The interpreter is Debian 11 (bullseye)'s python3.9 and the libraries it needs that
# Debian 12 no longer ships (libssl1.1, libffi7, libmpdec3), unpacked with `dpkg -x`: no
# package is installed, the system's python3 is untouched, root is not needed. Each .deb is
# checked against the SHA256 of bullseye's package index. Run the interpreter with
# LD_LIBRARY_PATH="$(python39.sh --libs)" so it finds those libraries.
#
# Needs curl, xz and dpkg-deb, and deb.debian.org (or archive.debian.org, where bullseye
# goes when it is archived). Idempotent: a second run only prints the path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
libs_only=0
if [ "${1:-}" = "--libs" ]; then
    libs_only=1
    shift
fi
prefix=${1:-$root/target/cpython39}
libs="$prefix/usr/lib/x86_64-linux-gnu:$prefix/lib/x86_64-linux-gnu"
if [ $libs_only -eq 1 ]; then
    echo "$libs"
    exit 0
fi
py="$prefix/usr/bin/python3.9"
if [ -x "$py" ] && [ -f "$prefix/.complete" ]; then
    echo "$py"
    exit 0
fi
for tool in curl xz dpkg-deb sha256sum; do
    command -v "$tool" >/dev/null || {
        echo "python39.sh: needs $tool" >&2
        exit 1
    }
done
if [ "$(dpkg --print-architecture 2>/dev/null || uname -m)" != amd64 ] && [ "$(uname -m)" != x86_64 ]; then
    echo "python39.sh: only amd64 is supported" >&2
    exit 1
fi
packages=(python3.9-minimal libpython3.9-minimal libpython3.9-stdlib python3.9 python3.9-venv
    python3-distutils python3-lib2to3 libssl1.1 libffi7 libmpdec3)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mirror=""
for m in http://deb.debian.org/debian http://archive.debian.org/debian; do
    if curl -sfL --retry 3 -o "$work/Packages.xz" "$m/dists/bullseye/main/binary-amd64/Packages.xz"; then
        mirror=$m
        break
    fi
done
[ -n "$mirror" ] || {
    echo "python39.sh: cannot fetch bullseye's package index" >&2
    exit 1
}
xz -dc "$work/Packages.xz" >"$work/Packages"
rm -rf "$prefix"
mkdir -p "$prefix"
for p in "${packages[@]}"; do
    # The package's stanza: its file and checksum.
    read -r file sum < <(awk -v p="$p" 'BEGIN { RS = ""; FS = "\n" } {
        name = ""; file = ""; sum = ""
        for (i = 1; i <= NF; i++) {
            if ($i ~ /^Package: /) name = substr($i, 10)
            if ($i ~ /^Filename: /) file = substr($i, 11)
            if ($i ~ /^SHA256: /) sum = substr($i, 9)
        }
        if (name == p) { print file, sum; exit }
    }' "$work/Packages")
    [ -n "${file:-}" ] || {
        echo "python39.sh: $p is not in bullseye's index" >&2
        exit 1
    }
    deb="$work/$(basename "$file")"
    curl -sfL --retry 3 -o "$deb" "$mirror/$file"
    echo "$sum  $deb" | sha256sum -c --quiet -
    dpkg-deb -x "$deb" "$prefix"
done
LD_LIBRARY_PATH="$libs" "$py" -c 'import ssl, ctypes, decimal, venv' >&2
touch "$prefix/.complete"
echo "$py"
