"""Sender.loan: a message written in place, sent when its with block ends normally."""

from __future__ import annotations

import gc

import pytest

import ferry
from test_processes import MIB, expected, kill, read_line, spawn

np = pytest.importorskip("numpy")


def test_loans_carry_data_between_processes(group_name):
    size, count = 2 * MIB, 5
    with ferry.Group(group_name) as g, g.join() as me:
        producer = spawn("loan", group_name, me.id, str(size), str(count))
        try:
            rx = me.accept(timeout=30)
            msgs = [rx.recv(timeout=30) for _ in range(count)]
            read_line(producer, "sent")
            for k, m in enumerate(msgs):
                a = np.frombuffer(m, dtype=np.uint8)
                assert a[0] == k % 256
                assert int(a.sum(dtype=np.uint64)) == expected(size, k)
                assert not a.flags.writeable
                del a
            # The block that raised sent nothing.
            assert rx.try_recv() is None
            del msgs
            assert producer.wait(timeout=60) == 0
        finally:
            kill(producer)
        rx.close()


def test_loan_sends_on_normal_exit(pair):
    with pair.tx.loan(5, path=pair.path) as buf:
        assert isinstance(buf, memoryview) and not buf.readonly and len(buf) == 5
        buf[:] = b"hello"
        assert pair.path.outstanding > 0
    msg = pair.rx.recv(timeout=5)
    assert bytes(msg) == b"hello"
    assert msg.in_lot


def test_loan_exception_sends_nothing_and_returns_the_fbuf(pair):
    with pytest.raises(RuntimeError):
        with pair.tx.loan(4096, path=pair.path) as buf:
            buf[:5] = b"drop!"
            raise RuntimeError("discard")
    assert pair.rx.try_recv() is None
    assert pair.tx.in_flight == 0
    assert pair.path.outstanding == 0


def test_loan_view_is_unusable_after_the_block(pair):
    with pair.tx.loan(8) as buf:
        buf[:] = b"12345678"
    with pytest.raises(ValueError):  # a released memoryview
        buf[0]
    with pytest.raises(ValueError):
        buf[0] = 1
    assert bytes(pair.rx.recv(timeout=5)) == b"12345678"

    with pytest.raises(KeyError):
        with pair.tx.loan(8) as buf2:
            raise KeyError("x")
    with pytest.raises(ValueError):
        bytes(buf2)


def test_loan_refuses_to_send_while_an_array_over_it_lives(pair):
    with pytest.raises(BufferError):
        with pair.tx.loan(16, path=pair.path) as buf:
            arr = np.frombuffer(buf, dtype=np.uint8)
            arr[:] = 7
    assert pair.rx.try_recv() is None  # nothing was sent
    # The fbuf goes back with the last view of it.
    del arr
    gc.collect()
    assert pair.path.outstanding == 0


def test_loan_numpy_in_place(pair):
    with pair.tx.loan(4 * 6, path=pair.path) as buf:
        np.frombuffer(buf, dtype=np.int32)[:] = np.arange(6, dtype=np.int32)
    got = np.frombuffer(pair.rx.recv(timeout=5), dtype=np.int32)
    assert got.tolist() == list(range(6))


def test_loan_is_entered_once_and_reports_quota(pair, group):
    loan = pair.tx.loan(8)
    with loan as buf:
        buf[:] = b"abcdefgh"
        with pytest.raises(ValueError):
            loan.__enter__()
    assert bytes(pair.rx.recv(timeout=5)) == b"abcdefgh"
    small = pair.producer.path(quota=4096)
    held = pair.tx.loan(4096, path=small)
    with pytest.raises(ferry.QuotaExceeded):  # allocation never waits
        pair.tx.loan(4096, path=small)
    del held
