"""Descriptors as cargo: a message carries file descriptors besides bytes."""

from __future__ import annotations

import os
import subprocess

import pytest

import ferry
from peer import eventfd_write
from test_processes import kill, read_line, spawn


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_every_kind_crosses_processes_and_nothing_leaks(group_name):
    with ferry.Group(group_name) as g, g.join() as me:
        peer: subprocess.Popen = spawn("fds", group_name, me.id)
        try:
            rx = me.accept(timeout=30)
            base = fd_count()
            msg, fds = rx.recv_with_fds(timeout=30)
            assert bytes(msg) == b"cargo"
            assert [fds.kind(i) for i in range(len(fds))] == ["memfd", "eventfd", "pipe", "socket"]
            assert fd_count() == base + 4
            # The duplicates work.
            assert os.pread(fds[0], 64, 0) == b"memfd-cargo"
            eventfd_write(fds[1], 5)
            os.write(fds[2], b"pong")
            os.write(fds[3], b"sock")
            assert read_line(peer, "checked") == ["efd=5", "pipe=pong", "sock=sock"]
            # One taken out is the caller's; the rest close with the Fds.
            w = fds.take(2)
            with pytest.raises(IndexError):
                fds[2]
            fds.close()
            del msg
            assert fd_count() == base + 1
            os.close(w)
            assert fd_count() == base
            now, then = read_line(peer, "count")
            assert now == then, "the sender closed its copies once released"
            # A receiver that accepts only memfds refuses the eventfd that comes next.
            with pytest.raises(ferry.FdRefused) as e:
                rx.recv_with_fds(timeout=30, kinds=["memfd"])
            assert e.value.index == 0 and "eventfd" in str(e.value)
            assert fd_count() == base
        finally:
            kill(peer)


def test_over_the_limit_is_refused(pair):
    r, w = os.pipe()
    try:
        before = fd_count()
        with pytest.raises(ferry.TooManyFds) as e:
            pair.tx.send(b"x", fds=[r] * (ferry.MAX_FDS + 1))
        assert e.value.max == ferry.MAX_FDS
        assert fd_count() == before
        with pytest.raises(OSError):
            pair.tx.send(b"x", fds=[1 << 20])
    finally:
        os.close(r)
        os.close(w)


def test_services_carry_descriptors(group):
    a, b = group.join(), group.join()
    r, w = os.pipe()
    try:
        with ferry.Publisher(a, "fds/pub") as pub, ferry.Subscriber(b, "fds/pub") as sub:
            pub.wait_for_subscribers(1)
            assert pub.publish(b"frame", fds=[r]) == 1
            msg, fds = sub.recv_with_fds(timeout=5)
            with fds:
                assert bytes(msg) == b"frame" and fds.kind(0) == "pipe"
        with ferry.Server(a, "fds/rr") as srv, ferry.Client(b, "fds/rr") as cli:
            import threading

            def serve() -> None:
                req, got = srv.recv_with_fds(timeout=5)
                assert got.kind(0) == "pipe"
                got.close()
                srv.reply(req, b"ok", fds=[w])

            t = threading.Thread(target=serve)
            t.start()
            resp, fds = cli.call_with_fds(b"req", timeout=5, fds=[r])
            t.join()
            assert bytes(resp) == b"ok" and fds.kind(0) == "pipe"
            os.write(fds[0], b"!")
            assert os.read(r, 1) == b"!"
            fds.close()
    finally:
        os.close(r)
        os.close(w)
        a.close()
        b.close()
