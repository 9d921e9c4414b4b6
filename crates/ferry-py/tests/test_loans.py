"""Sender.loan and Publisher.loan: a message written in place, sent (published) when its
with block ends normally."""

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


def test_publisher_loans_reach_a_subscriber_in_another_process(group_name):
    size, count = 256 * 1024, 5
    with ferry.Group(group_name) as g, g.join() as me:
        publisher = spawn("loan_publish", group_name, "frames", str(size), str(count))
        try:
            read_line(publisher, "offered")
            with ferry.Subscriber(me, "frames", timeout=30) as sub:
                msgs = [sub.recv(timeout=30) for _ in range(count)]
                for k, m in enumerate(msgs):
                    a = np.frombuffer(m, dtype=np.uint8)
                    assert m.in_lot and not a.flags.writeable  # the publisher's pages
                    assert a[0] == k % 256
                    assert int(a.sum(dtype=np.uint64)) == expected(size, k)
                    del a
                # The block that raised published nothing: "end" comes next.
                assert bytes(sub.recv(timeout=30)) == b"end"
                (refused,) = read_line(publisher, "published")
                assert int(refused) == count  # every second loan was refused
                assert sub.try_recv() is None
                del msgs
        finally:
            kill(publisher)


@pytest.fixture
def service(group):
    pd, sd = group.join(), group.join()
    pub = ferry.Publisher(pd, "loans", depth=8)
    sub = ferry.Subscriber(sd, "loans", timeout=5)
    pub.wait_for_subscribers(1, timeout=5)
    yield pub, sub, pd
    for x in (sub, pub, sd, pd):
        x.close()


def test_publisher_loan_publishes_on_normal_exit(service):
    pub, sub, _ = service
    loan = pub.loan(5)
    assert loan.delivered is None
    with loan as buf:
        assert isinstance(buf, memoryview) and not buf.readonly and len(buf) == 5
        buf[:] = b"hello"
        assert sub.try_recv() is None  # not before the block ends
    assert loan.delivered == 1
    msg = sub.recv(timeout=5)
    assert bytes(msg) == b"hello" and msg.in_lot
    with pytest.raises(ValueError):  # the view was released
        buf[0]
    assert pub.stats()["published"] == 1


def test_publisher_loan_exception_publishes_nothing(service):
    pub, sub, domain = service
    path = domain.path()
    with pytest.raises(KeyError):
        with pub.loan(4096, path=path) as buf:
            buf[:5] = b"drop!"
            assert path.outstanding > 0
            raise KeyError("discard")
    assert sub.try_recv() is None
    assert pub.stats()["published"] == 0
    assert path.outstanding == 0  # the fbuf is back
    with pub.loan(4, path=path) as buf:
        buf[:] = b"next"
    assert bytes(sub.recv(timeout=5)) == b"next"


def test_publisher_refuses_a_second_loan_while_one_is_open(service):
    pub, sub, _ = service
    with pub.loan(3) as buf:
        with pytest.raises(RuntimeError):
            pub.loan(3)
        buf[:] = b"one"
    with pub.loan(3) as buf:  # the first block ended: allowed again
        buf[:] = b"two"
    with pytest.raises(ZeroDivisionError):
        with pub.loan(3):
            1 / 0
    with pub.loan(5) as buf:  # and after a block that raised
        buf[:] = b"three"
    unused = pub.loan(1)  # open until its block ends, or it goes
    with pytest.raises(RuntimeError):
        pub.loan(1)
    del unused
    with pub.loan(4) as buf:
        buf[:] = b"four"
    assert [bytes(sub.recv(timeout=5)) for _ in range(4)] == [b"one", b"two", b"three", b"four"]


def test_publisher_loan_numpy_to_several_subscribers(group):
    pd, s1d, s2d = group.join(), group.join(), group.join()
    with ferry.Publisher(pd, "many") as pub:
        s1 = ferry.Subscriber(s1d, "many", timeout=5)
        s2 = ferry.Subscriber(s2d, "many", timeout=5)
        pub.wait_for_subscribers(2, timeout=5)
        loan = pub.loan(4 * 6)
        with loan as buf:
            np.frombuffer(buf, dtype=np.int32)[:] = np.arange(6, dtype=np.int32)
        assert loan.delivered == 2
        a, b = s1.recv(timeout=5), s2.recv(timeout=5)
        assert a.address == b.address  # one fbuf for both
        assert np.frombuffer(a, dtype=np.int32).tolist() == list(range(6))
        del a, b
        s1.close()
        s2.close()
    for d in (pd, s1d, s2d):
        d.close()
