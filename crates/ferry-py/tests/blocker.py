"""A process that blocks in one ferry call, for the Ctrl-C tests (test_interrupt.py).

    blocker.py CASE GROUP TIMEOUT

sets up what CASE needs to block (every peer lives in this process, in domains of
GROUP that never answer), prints "ready", and makes the call with `timeout=TIMEOUT`
("none": `timeout=None`). It prints "interrupted" if the call raised KeyboardInterrupt,
"returned" or "raised NAME" otherwise, then closes everything (the group file goes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable, Optional

import ferry

# Python leaves SIGINT ignored if it started ignored (a job started in the background by
# a shell without job control, `nohup`, some CI runners): Ctrl-C is what is tested here,
# so take it as an interactive program does.
signal.signal(signal.SIGINT, signal.default_int_handler)

# A call the test expects to block: (ExitStack, group, timeout) -> the call to make.
Setup = Callable[[contextlib.ExitStack, ferry.Group, Optional[float]], Callable[[], object]]


def pair(
    es: contextlib.ExitStack, g: ferry.Group, **kw: int
) -> tuple[ferry.Domain, ferry.Sender, ferry.Receiver]:
    """A channel between two domains of this process (connect runs in a thread)."""
    a = es.enter_context(g.join())
    b = es.enter_context(g.join())
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(tx=a.connect(b.id, timeout=30, **kw)))
    t.start()
    rx = es.enter_context(b.accept(timeout=30))
    t.join()
    return a, es.enter_context(out["tx"]), rx


def fill(tx: ferry.Sender) -> None:
    """Sends until the ring is full (nobody receives)."""
    while True:
        try:
            tx.try_send(b"x")
        except ferry.Full:
            return


def accept(es, g, t):
    d = es.enter_context(g.join())
    return lambda: d.accept(timeout=t)


def connect(es, g, t):
    d = es.enter_context(g.join())
    silent = es.enter_context(g.join())  # never accepts
    return lambda: d.connect(silent.id, timeout=t)


def subscriber(es, g, t):
    d = es.enter_context(g.join())
    return lambda: ferry.Subscriber(d, "nobody", timeout=t)


def client(es, g, t):
    d = es.enter_context(g.join())
    return lambda: ferry.Client(d, "nobody", timeout=t)


def wait_for_subscribers(es, g, t):
    d = es.enter_context(g.join())
    pub = es.enter_context(ferry.Publisher(d, "lonely"))
    return lambda: pub.wait_for_subscribers(1, timeout=t)


def call(es, g, t):
    sd = es.enter_context(g.join())
    cd = es.enter_context(g.join())
    es.enter_context(ferry.Server(sd, "deaf"))  # takes clients in, never answers
    c = es.enter_context(ferry.Client(cd, "deaf", timeout=30))
    return lambda: c.call(b"hello", timeout=t)


def recv(es, g, t):
    _, _, rx = pair(es, g)
    return lambda: rx.recv(timeout=t)


def recv_spin(es, g, t):
    _, _, rx = pair(es, g)
    return lambda: rx.recv(timeout=t, spin=0.2)


def send(es, g, t):
    _, tx, _ = pair(es, g, capacity=2)
    fill(tx)
    return lambda: tx.send(b"y", timeout=t)


def loan(es, g, t):
    _, tx, _ = pair(es, g, capacity=2)
    fill(tx)

    def run() -> None:
        with tx.loan(8, timeout=t) as buf:
            buf[:] = b"loanloan"

    return run


def subscriber_recv(es, g, t):
    pd = es.enter_context(g.join())
    sd = es.enter_context(g.join())
    pub = es.enter_context(ferry.Publisher(pd, "quiet"))
    sub = es.enter_context(ferry.Subscriber(sd, "quiet", timeout=30))
    pub.wait_for_subscribers(1, timeout=30)
    return lambda: sub.recv(timeout=t)


def server_recv(es, g, t):
    d = es.enter_context(g.join())
    srv = es.enter_context(ferry.Server(d, "idle"))
    return lambda: srv.recv(timeout=t)


def full_publisher(es: contextlib.ExitStack, g: ferry.Group) -> ferry.Publisher:
    """A blocking publisher whose one subscriber's queue is full (it never receives)."""
    pd = es.enter_context(g.join())
    sd = es.enter_context(g.join())
    pub = es.enter_context(ferry.Publisher(pd, "full", depth=2, slow="block"))
    es.enter_context(ferry.Subscriber(sd, "full", timeout=30))
    pub.wait_for_subscribers(1, timeout=30)
    pub.publish(b"0")
    pub.publish(b"1")
    return pub


def publish(es, g, t):
    pub = full_publisher(es, g)
    return lambda: pub.publish(b"2", timeout=t)


def publish_with_fds(es, g, t):
    pub = full_publisher(es, g)
    r, w = os.pipe()
    es.callback(os.close, r)
    es.callback(os.close, w)
    return lambda: pub.publish(b"2", timeout=t, fds=[r])


def call_with_fds(es, g, t):
    sd = es.enter_context(g.join())
    cd = es.enter_context(g.join())
    es.enter_context(ferry.Server(sd, "deaf-fds"))  # takes clients in, never answers
    c = es.enter_context(ferry.Client(cd, "deaf-fds", timeout=30))
    r, w = os.pipe()
    es.callback(os.close, r)
    es.callback(os.close, w)
    return lambda: c.call_with_fds(b"hello", timeout=t, fds=[w])


def publisher_loan(es, g, t):
    pub = full_publisher(es, g)

    def run() -> None:
        with pub.loan(8, timeout=t) as buf:
            buf[:] = b"loanloan"

    return run


CASES: dict[str, Setup] = {
    f.__name__: f
    for f in (
        accept,
        connect,
        subscriber,
        client,
        wait_for_subscribers,
        call,
        recv,
        recv_spin,
        send,
        loan,
        subscriber_recv,
        server_recv,
        publish,
        publish_with_fds,
        call_with_fds,
        publisher_loan,
    )
}


def main() -> None:
    case, group, timeout = sys.argv[1:]
    t = None if timeout == "none" else float(timeout)
    with ferry.Group(group) as g, contextlib.ExitStack() as es:
        blocked = CASES[case](es, g, t)
        print("ready", flush=True)
        try:
            blocked()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        except BaseException as e:
            print("raised", type(e).__name__, e, flush=True)
        else:
            print("returned", flush=True)


if __name__ == "__main__":
    main()
