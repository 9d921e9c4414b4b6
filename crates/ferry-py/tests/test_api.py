"""The Python API: groups, domains, channels, exceptions, context managers."""

from __future__ import annotations

import pytest

import ferry
from conftest import connect


def test_exception_hierarchy():
    for name in ferry.errors.__all__:
        assert issubclass(getattr(ferry, name), ferry.FerryError)
    assert issubclass(ferry.Timeout, TimeoutError)
    assert issubclass(ferry.InvalidArgument, ValueError)


def test_send_receive_bytes_and_messages(pair):
    pair.tx.send(b"hello, ferry")
    got = pair.rx.recv(timeout=5)
    assert got == b"hello, ferry"
    assert got.in_lot  # the sender copied the bytes into an fbuf...
    assert pair.tx.stats()["copied_bytes"] == len(b"hello, ferry")  # ...and counted it

    buf = pair.path.alloc(100)
    buf.write(b"abc", offset=10)
    m = buf.freeze()
    pair.tx.send(m)
    got = pair.rx.recv(timeout=5)
    assert got.to_bytes()[10:13] == b"abc"
    assert got.address == m.address  # the same pages: no copy
    assert len(got) == 100


def test_recv_timeout_and_try_recv(pair):
    assert pair.rx.try_recv() is None
    with pytest.raises(ferry.Timeout):
        pair.rx.recv(timeout=0.05)
    with pytest.raises(ValueError):
        pair.rx.recv(timeout=-1)


def test_try_send_full(group):
    a, b = group.join(), group.join()
    tx, rx = connect(a, b)
    with pytest.raises(ferry.Full):
        for _ in range(100_000):
            tx.try_send(b"x")
    with pytest.raises(ferry.Timeout):
        tx.send(b"x", timeout=0.05)
    assert rx.recv(timeout=5) == b"x"
    for x in (tx, rx, a, b):
        x.close()


def test_connect_timeout_and_bad_id(group):
    with group.join() as a:
        with pytest.raises(ferry.Timeout):
            a.accept(timeout=0.05)
        with pytest.raises(ferry.InvalidArgument):
            a.connect("not-an-id", timeout=0.05)


def test_disconnected_after_sender_closes(pair):
    pair.tx.send(b"last")
    pair.tx.close()
    assert pair.rx.recv(timeout=5) == b"last"
    with pytest.raises(ferry.Disconnected):
        pair.rx.recv(timeout=5)


def test_closed_objects_raise_value_error(group):
    d = group.join()
    d.close()
    assert d.closed
    with pytest.raises(ValueError):
        d.path()
    with pytest.raises(ValueError):
        _ = d.id


def test_context_managers(group_name):
    with ferry.Group(group_name) as g:
        with g.join() as a, g.join() as b:
            tx, rx = connect(a, b)
            with tx, rx:
                tx.send(b"x")
                with rx.recv(timeout=5) as m:
                    assert m == b"x"
                assert m.released
                with pytest.raises(ValueError):
                    m.to_bytes()
            assert tx.closed and rx.closed
    assert g.closed


def test_quota_exceeded(pair):
    path = pair.producer.path(quota=1 << 20)
    held = [path.alloc(256 << 10) for _ in range(4)]
    with pytest.raises(ferry.QuotaExceeded) as e:
        path.alloc(256 << 10)
    assert e.value.quota == 1 << 20
    assert path.stats()["quota_refusals"] == 1
    del held


def test_members_and_ids(group):
    with group.join() as a:
        slot, gen = a.id.split(".")
        assert (a.id, __import__("os").getpid()) in group.members()
        assert a.lot_addr == group.lot_addr(int(slot))
        assert int(gen) >= 1


def test_fileno_and_arm(pair):
    import select

    assert pair.rx.arm() is True
    r, _, _ = select.select([pair.rx.fileno()], [], [], 0)
    assert r == []
    pair.tx.send(b"wake")
    r, _, _ = select.select([pair.rx.fileno()], [], [], 5)
    assert r == [pair.rx.fileno()]
    assert pair.rx.try_recv() == b"wake"
