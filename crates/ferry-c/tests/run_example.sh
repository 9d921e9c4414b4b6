#!/usr/bin/env bash
# Builds libferry_c, compiles the C examples with the system compiler (against the
# shared and the static library) and runs them: pingpong (a channel between two
# processes), pubsub (a publisher and two subscriber processes), checksums compared, and
# fds (descriptors as cargo between two processes, descriptors counted).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
cargo build --release -p ferry-c
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc=${CC:-cc}
for ex in pingpong pubsub fds; do
    "$cc" -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -I crates/ferry-c/include \
        "crates/ferry-c/examples/$ex.c" -L "$target/release" -lferry_c \
        -Wl,-rpath,"$target/release" -o "$out/$ex"
    "$cc" -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -I crates/ferry-c/include \
        "crates/ferry-c/examples/$ex.c" "$target/release/libferry_c.a" -lpthread -ldl -lm \
        -o "$out/$ex-static"
done
# The header compiles as C++ too.
if command -v c++ >/dev/null; then
    echo '#include "ferry.h"' | c++ -x c++ -fsyntax-only -I crates/ferry-c/include -
fi
passed=0 failed=0
# The build commands of pingpong.c's comment, which the README quotes, run as written from
# the repository's root (they name target/release, so only when that is the target dir).
if [ "$target" -ef "$root/target" ]; then
    if [ -e pingpong ]; then
        echo "./pingpong exists at the repository's root: not overwriting it" >&2
        failed=$((failed + 1))
    else
        sed -n 's/^ \*   //p' crates/ferry-c/examples/pingpong.c >"$out/as-written.sh"
        cat "$out/as-written.sh"
        if bash -euo pipefail "$out/as-written.sh"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
        rm -f pingpong
    fi
else
    echo "CARGO_TARGET_DIR is not target/: pingpong.c's build comment (which names target/release) not run"
fi
for exe in pingpong pingpong-static pubsub pubsub-static fds fds-static; do
    if "$out/$exe" 50; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
leftover=$(ls /dev/shm | grep -c '^ferry\.c-example-' || true)
if [ "$leftover" != 0 ]; then
    echo "left $leftover /dev/shm/ferry.c-example-* files behind"; failed=$((failed + 1))
fi
echo "c: $passed passed, $failed failed"
[ "$failed" = 0 ]
