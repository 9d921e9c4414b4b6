"""The examples run as written: the README's quick start, the publisher loan and the
asyncio pipeline, each a process that starts its peer process. (That the READMEs quote them verbatim
is checked by the Rust test `crates/ferry/tests/readme.rs`.)"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")


@pytest.mark.parametrize(
    "example, expect",
    [
        ("quickstart.py", "received a (1080, 1920, 3) frame"),
        ("aio_pipeline.py", "frame 9: mean 9.0, writeable=False"),
        ("publish_loan.py", "received 3 frames"),
    ],
)
def test_example_runs(example: str, expect: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, os.path.join(EXAMPLES, example)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out + err
    assert expect in out
    # Each example names its group after its pid, and must leave no group file behind.
    assert not glob.glob(f"/dev/shm/ferry.*-{proc.pid}")
