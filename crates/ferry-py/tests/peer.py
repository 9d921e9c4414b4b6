"""A peer process for the multi-process tests, driven by arguments and stdout lines.

    peer.py produce GROUP PEER SIZE COUNT [hold]   connect to PEER, send COUNT messages
                                                   of SIZE bytes (byte i % 251 + k for
                                                   message k), print "sent", then wait
                                                   to be killed if "hold"
    peer.py publish GROUP NAME COUNT               offer publish-subscribe NAME, wait for
                                                   one subscriber, publish "NAME k" for k
                                                   below COUNT, wait to be killed
    peer.py scribble GROUP                         print our id, accept, receive one
                                                   message, print "got", then write into
                                                   it through ctypes (the kernel must
                                                   kill us with SIGSEGV)
    peer.py consume GROUP COUNT                    print our id, accept, receive COUNT
                                                   messages and keep them, print
                                                   "held", wait to be killed
    peer.py fds GROUP PEER                         connect to PEER, send "cargo" with a
                                                   memfd, an eventfd, a pipe's write end
                                                   and a socket; print "checked" with
                                                   what the receiver did through them,
                                                   "count NOW BASE" (descriptors once
                                                   released), then send an eventfd alone
    peer.py loan GROUP PEER SIZE COUNT             as produce, writing each message in
                                                   place (with tx.loan(SIZE) as buf),
                                                   and a last one that raises in its
                                                   block (not sent); print "sent"
    peer.py loan_publish GROUP NAME SIZE COUNT     offer publish-subscribe NAME, print
                                                   "offered", wait for one subscriber,
                                                   publish COUNT messages as produce's,
                                                   each written in a publisher loan (and
                                                   asking for a second loan inside each
                                                   block), then one whose block raises,
                                                   then b"end"; print "published" with
                                                   the second loans refused, wait to be
                                                   killed
"""

from __future__ import annotations

import ctypes
import sys
import time

import numpy as np

import ferry


def pattern(size: int, k: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.uint64) + k) % 251).astype(np.uint8)


def produce(group: str, peer: str, size: int, count: int, hold: bool) -> None:
    g = ferry.Group(group)
    d = g.join()
    print("id", d.id, d.lot_addr, flush=True)
    tx = d.connect(peer, timeout=10)
    path = d.path()
    base = pattern(size, 0)
    for k in range(count):
        while True:
            try:
                buf = path.alloc(size)
                break
            except ferry.QuotaExceeded:
                tx.collect_releases()
                time.sleep(0.001)
        a = np.frombuffer(buf, dtype=np.uint8)
        a[:] = base
        a[0] = k % 256
        del a
        tx.send(buf.freeze(), timeout=30)
    print("sent", flush=True)
    if hold:
        time.sleep(3600)
    # Wait for the consumer to let go before leaving (the fbufs stay readable to it
    # anyway; this keeps the test's accounting simple).
    deadline = time.monotonic() + 30
    while tx.in_flight and time.monotonic() < deadline:
        tx.collect_releases()
        time.sleep(0.005)


def loan(group: str, peer: str, size: int, count: int) -> None:
    g = ferry.Group(group)
    d = g.join()
    tx = d.connect(peer, timeout=10)
    base = pattern(size, 0)
    for k in range(count):
        while True:
            try:
                loan = tx.loan(size)
                break
            except ferry.QuotaExceeded:
                tx.collect_releases()
                time.sleep(0.001)
        with loan as buf:
            a = np.frombuffer(buf, dtype=np.uint8)
            a[:] = base
            a[0] = k % 256
            del a
    try:
        with tx.loan(size) as buf:
            buf[:4] = b"oops"
            raise RuntimeError("not sent")
    except RuntimeError:
        pass
    print("sent", flush=True)
    deadline = time.monotonic() + 30
    while tx.in_flight and time.monotonic() < deadline:
        tx.collect_releases()
        time.sleep(0.005)


def consume(group: str, count: int) -> None:
    g = ferry.Group(group)
    d = g.join()
    print("id", d.id, flush=True)
    rx = d.accept(timeout=10)
    held = [rx.recv(timeout=10) for _ in range(count)]
    print("held", len(held), flush=True)
    time.sleep(3600)


def publish(group: str, name: str, count: int) -> None:
    g = ferry.Group(group)
    d = g.join()
    pub = ferry.Publisher(d, name, slow="block")
    pub.wait_for_subscribers(1, timeout=30)
    for k in range(count):
        pub.publish(f"{name} {k}".encode(), timeout=30)
    print("published", flush=True)
    time.sleep(3600)


def loan_publish(group: str, name: str, size: int, count: int) -> None:
    g = ferry.Group(group)
    d = g.join()
    pub = ferry.Publisher(d, name, slow="block", depth=8)
    print("offered", flush=True)
    pub.wait_for_subscribers(1, timeout=30)
    base = pattern(size, 0)
    refused = 0
    for k in range(count):
        loan = pub.loan(size, timeout=30)
        with loan as buf:
            try:
                pub.loan(size)
            except RuntimeError:
                refused += 1
            a = np.frombuffer(buf, dtype=np.uint8)
            a[:] = base
            a[0] = k % 256
            del a
        assert loan.delivered == 1, loan.delivered
    try:
        with pub.loan(size) as buf:
            buf[:4] = b"oops"
            raise RuntimeError("not published")
    except RuntimeError:
        pass
    with pub.loan(3, timeout=30) as buf:
        buf[:] = b"end"
    print("published", refused, flush=True)
    time.sleep(3600)


def scribble(group: str) -> None:
    import ctypes

    g = ferry.Group(group)
    d = g.join()
    print("id", d.id, flush=True)
    rx = d.accept(timeout=10)
    msg = rx.recv(timeout=10)
    print("got", msg.address, flush=True)
    ctypes.memset(msg.address, 0x55, 1)  # the sender's page, mapped read-only here
    print("wrote", flush=True)


def eventfd(initval: int = 0) -> int:
    """`os.eventfd`, which CPython has from 3.10 on; through libc before that."""
    import os

    if hasattr(os, "eventfd"):
        return os.eventfd(initval)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.eventfd(initval, 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "eventfd")
    return fd


def eventfd_read(fd: int) -> int:
    import os
    import struct

    return struct.unpack("=Q", os.read(fd, 8))[0]


def eventfd_write(fd: int, value: int) -> None:
    import os
    import struct

    os.write(fd, struct.pack("=Q", value))


def fds(group: str, peer: str) -> None:
    import os
    import socket

    g = ferry.Group(group)
    d = g.join()
    tx = d.connect(peer, timeout=10)
    m = os.memfd_create("py-cargo")
    os.write(m, b"memfd-cargo")
    e = eventfd(0)
    r, w = os.pipe()
    a, b = socket.socketpair()
    base = len(os.listdir("/proc/self/fd"))
    tx.send(b"cargo", timeout=10, fds=[m, e, w, b])
    value = eventfd_read(e)
    pipe = os.read(r, 4).decode()
    sock = a.recv(4).decode()
    print("checked", f"efd={value}", f"pipe={pipe}", f"sock={sock}", flush=True)
    deadline = time.monotonic() + 30
    while tx.in_flight and time.monotonic() < deadline:
        tx.collect_releases()
        time.sleep(0.005)
    print("count", len(os.listdir("/proc/self/fd")), base, flush=True)
    tx.send(b"efd", timeout=10, fds=[e])
    time.sleep(3600)


def main() -> None:
    role = sys.argv[1]
    if role == "fds":
        fds(sys.argv[2], sys.argv[3])
        return
    if role == "produce":
        produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), "hold" in sys.argv[6:])
    elif role == "publish":
        publish(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif role == "scribble":
        scribble(sys.argv[2])
    elif role == "loan":
        loan(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif role == "loan_publish":
        loan_publish(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif role == "consume":
        consume(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
