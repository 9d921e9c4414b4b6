"""Fixtures: unique groups (no /dev/shm/ferry.* left behind) and connected pairs."""

from __future__ import annotations

import gc
import glob
import itertools
import os
import sys
import threading
from typing import Iterator, NamedTuple

import pytest

import ferry

_counter = itertools.count()
PREFIX = f"pytest-{os.getpid()}-"
HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peer.py")


def unique_name() -> str:
    return f"{PREFIX}{next(_counter)}"


@pytest.fixture(autouse=True)
def collect_garbage() -> None:
    """Frees what earlier tests left in reference cycles (pytest.raises keeps tracebacks,
    whose frames hold domains and messages) before each test. A group's lots sit at an
    address derived from its name, and two names can hash to the same one: a stale
    mapping of an earlier test's group would make joining fail with AddressInUse."""
    gc.collect()


@pytest.fixture
def group_name() -> str:
    return unique_name()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fails the run if any test left a group file behind (pytest holds each test's
    fixture values until the test is fully torn down, so this is checked at the end)."""
    gc.collect()
    left = glob.glob(f"/dev/shm/ferry.{PREFIX}*")
    if left:
        print(f"\nferry tests left {left} behind", file=sys.stderr)
        for f in left:
            os.unlink(f)
        session.exitstatus = 1


@pytest.fixture
def group(group_name: str) -> Iterator[ferry.Group]:
    with ferry.Group(group_name) as g:
        yield g


class Pair(NamedTuple):
    producer: ferry.Domain
    consumer: ferry.Domain
    tx: ferry.Sender
    rx: ferry.Receiver
    path: ferry.Path


def connect(producer: ferry.Domain, consumer: ferry.Domain) -> tuple[ferry.Sender, ferry.Receiver]:
    """A channel between two domains of this process (connect runs in a thread)."""
    out: dict = {}

    def run() -> None:
        try:
            out["tx"] = producer.connect(consumer.id, timeout=30)
        except BaseException as e:  # reported below
            out["err"] = e

    t = threading.Thread(target=run)
    t.start()
    rx = consumer.accept(timeout=30)
    t.join()
    if "err" in out:
        raise out["err"]
    return out["tx"], rx


@pytest.fixture
def pair(group: ferry.Group) -> Iterator[Pair]:
    a = group.join()
    b = group.join()
    tx, rx = connect(a, b)
    p = Pair(a, b, tx, rx, a.path())
    yield p
    for x in (tx, rx, a, b):
        x.close()


@pytest.fixture
def np():
    return pytest.importorskip("numpy")


def peer_cmd(*args: str) -> list[str]:
    return [sys.executable, PEER, *args]
