"""Guarantees that cross processes, with real peer processes (tests/peer.py)."""

from __future__ import annotations

import functools
import gc
import os
import signal
import subprocess
import time

import pytest

import ferry
from conftest import peer_cmd

np = pytest.importorskip("numpy")

MIB = 1 << 20


def read_line(proc: subprocess.Popen, prefix: str, timeout: float = 30) -> list[str]:
    """The next stdout line of `proc`, which must start with `prefix`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"peer exited ({proc.poll()}) before printing {prefix!r}")
        words = line.split()
        if words and words[0] == prefix:
            return words[1:]
    raise AssertionError(f"peer did not print {prefix!r}")


def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(peer_cmd(*args), stdout=subprocess.PIPE, text=True)


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@functools.lru_cache(maxsize=None)
def pattern_sum(size: int) -> int:
    a = (np.arange(size, dtype=np.uint64) % 251).astype(np.uint8)
    return int(a.sum(dtype=np.uint64))


def expected(size: int, k: int) -> int:
    """Sum of the bytes peer.py writes into message k (byte 0 is k % 256; it was 0)."""
    return pattern_sum(size) + k % 256


def test_killed_producer_consumer_gets_peer_gone_and_keeps_arrays(group_name):
    size, count = 6 * MIB, 3
    with ferry.Group(group_name) as g, g.join() as me:
        producer = spawn("produce", group_name, me.id, str(size), str(count), "hold")
        try:
            rx = me.accept(timeout=30)
            msgs = [rx.recv(timeout=30) for _ in range(count)]
            arrays = [np.frombuffer(m, dtype=np.uint8) for m in msgs]
            read_line(producer, "sent")
        finally:
            kill(producer)
        with pytest.raises(ferry.PeerGone) as e:
            rx.recv(timeout=30)
        assert e.value.pid == producer.pid
        # The dead producer's pages stay mapped and readable here.
        for k, a in enumerate(arrays):
            assert int(a.sum(dtype=np.uint64)) == expected(size, k)
            assert not a.flags.writeable
        del arrays, msgs
        rx.close()
        gc.collect()


def test_killed_consumer_producers_fbufs_come_back(group_name):
    size, count = 1 * MIB, 4
    with ferry.Group(group_name) as g, g.join() as me:
        consumer = spawn("consume", group_name, str(count))
        try:
            (peer,) = read_line(consumer, "id")
            tx = me.connect(peer, timeout=30)
            path = me.path()
            for k in range(count):
                buf = path.alloc(size)
                buf.write(bytes([k]) * 16)
                tx.send(buf.freeze())
            read_line(consumer, "held")
            tx.collect_releases()
            assert path.outstanding == count * size
            assert tx.in_flight == count
        finally:
            kill(consumer)
        with pytest.raises(ferry.PeerGone):
            tx.check_peer()
        assert tx.in_flight == 0
        assert path.outstanding == 0
        with pytest.raises(ferry.PeerGone):
            tx.send(b"anyone?", timeout=5)
        tx.close()


def test_zero_copy_across_processes_pointer_and_rss(group_name):
    """The consumer's array lies in the producer's lot, and reading 100 messages of
    64 MiB grows this process's private memory by less than one payload."""
    size, count = 64 * MIB, 100
    with ferry.Group(group_name) as g, g.join() as me:
        producer = spawn("produce", group_name, me.id, str(size), str(count))
        try:
            (pid_id, lot_addr) = read_line(producer, "id")
            slot = int(pid_id.split(".")[0])
            lot_addr = int(lot_addr)
            assert lot_addr == g.lot_addr(slot)
            rx = me.accept(timeout=30)
            first = rx.recv(timeout=60)
            a = np.frombuffer(first, dtype=np.uint8)
            a.sum(dtype=np.uint64)  # fault the first payload in
            del a, first
            base = rss_anon()
            for k in range(1, count):
                m = rx.recv(timeout=60)
                a = np.frombuffer(m, dtype=np.uint8)
                ptr = a.ctypes.data
                assert lot_addr <= ptr and ptr + size <= lot_addr + g.lot_size
                assert int(a.sum(dtype=np.uint64)) == expected(size, k)
                del a, m
            grown = rss_anon() - base
            assert grown < size, f"RssAnon grew by {grown} bytes"
            read_line(producer, "sent")
            assert producer.wait(timeout=60) == 0
        finally:
            kill(producer)
        rx.close()


def test_receivers_pages_are_read_only_in_the_kernel(group_name):
    """Past the buffer protocol: a receiver that writes through a raw pointer faults."""
    with ferry.Group(group_name) as g, g.join() as me:
        peer = spawn("scribble", group_name)
        try:
            (peer_id,) = read_line(peer, "id")
            tx = me.connect(peer_id, timeout=30)
            path = me.path()
            buf = path.alloc(4096)
            buf.write(b"original")
            msg = buf.freeze()
            tx.send(msg)
            (addr,) = read_line(peer, "got")
            assert int(addr) == msg.address
            assert peer.wait(timeout=30) == -signal.SIGSEGV
            assert peer.stdout.read() == ""  # it never printed "wrote"
        finally:
            kill(peer)
        assert msg.to_bytes()[:8] == b"original"
        with pytest.raises(ferry.PeerGone):
            tx.check_peer()
        del msg
        tx.close()
