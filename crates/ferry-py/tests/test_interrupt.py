"""Ctrl-C: every blocking call raises KeyboardInterrupt soon after SIGINT, with a long
timeout and with none. Each call blocks in a real separate process (tests/blocker.py)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest

from blocker import CASES
from conftest import HERE, unique_name

BLOCKER = os.path.join(HERE, "blocker.py")

# Far beyond the wait below: a call that ignored SIGINT would still be blocked.
LONG_TIMEOUT = "120"
# How long after SIGINT the call must have raised. The promise is about 100 ms; this
# leaves room for a loaded machine while staying far below the call's timeout.
PATIENCE = 5.0


def read_line(proc: subprocess.Popen, deadline: float) -> str:
    """The next line of `proc`'s stdout ("" at its end), or "" if none came before
    `deadline`. blocker.py prints whole lines and flushes each."""
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
        return ""
    return proc.stdout.readline().strip()


@pytest.mark.parametrize("timeout", [LONG_TIMEOUT, "none"], ids=["long-timeout", "no-timeout"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_sigint_interrupts_blocking_call(case: str, timeout: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, BLOCKER, case, unique_name(), timeout],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert read_line(proc, time.monotonic() + 60) == "ready"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        line = read_line(proc, time.monotonic() + PATIENCE)
        assert line == "interrupted", f"{case}: {line or 'nothing within the patience'}"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
