"""Plain service programs: they know a group and a service name, nothing else (no host,
no bridge). test_bridge.py runs them on two hosts joined by ferry-bridge.

    service_peer.py publish GROUP NAME SIZE,...    offer publish-subscribe NAME, print
                                                   "offered", wait for "go" on stdin
                                                   and a subscriber, publish one message
                                                   per SIZE (message k: payload(k, SIZE)),
                                                   print "published", wait for stdin to
                                                   close
    service_peer.py subscribe GROUP NAME COUNT OPEN   open NAME (waiting at most OPEN
                                                   seconds), print "joined", then "got
                                                   LEN SHA256" per message for COUNT
                                                   messages, "done"; "end ERROR" if an
                                                   error of ferry ends it
    service_peer.py serve GROUP NAME               offer request-response NAME, print
                                                   "offered", answer each request with
                                                   its bytes reversed ("fail..." fails
                                                   with status 7) until killed
    service_peer.py call GROUP NAME SIZE,...       open NAME, print "joined", call once
                                                   per SIZE with payload(1000 + k, SIZE),
                                                   print "answer LEN ok" or "answer LEN
                                                   bad", then call b"fail please" and
                                                   print "failed STATUS"
"""

from __future__ import annotations

import hashlib
import random
import sys

import ferry


def payload(k: int, size: int) -> bytes:
    return random.Random(k).randbytes(size)


def publish(group: str, name: str, sizes: list[int]) -> None:
    d = ferry.Group(group).join()
    pub = ferry.Publisher(d, name, slow="block", depth=8)
    print("offered", flush=True)
    assert sys.stdin.readline().strip() == "go"
    pub.wait_for_subscribers(1, timeout=60)
    for k, size in enumerate(sizes):
        pub.publish(payload(k, size), timeout=60)
    print("published", flush=True)
    sys.stdin.read()


def subscribe(group: str, name: str, count: int, open_timeout: float) -> None:
    g = ferry.Group(group)
    d = g.join()
    try:
        sub = ferry.Subscriber(d, name, timeout=open_timeout)
        print("joined", flush=True)
        for _ in range(count):
            m = sub.recv(timeout=60)
            print("got", len(m), hashlib.sha256(m).hexdigest(), flush=True)
    except ferry.FerryError as e:
        print("end", type(e).__name__, flush=True)
        return
    print("done", flush=True)
    # Where the service lives, as the group lists it (for the tests; the code above
    # needs to know nothing of it).
    (svc,) = [s for s in g.services() if s["name"] == name]
    print("origin", svc["origin"], svc["far"], flush=True)


def serve(group: str, name: str) -> None:
    d = ferry.Group(group).join()
    server = ferry.Server(d, name)
    print("offered", flush=True)
    while True:
        req = server.recv()
        data = bytes(req.data)
        if data.startswith(b"fail"):
            server.fail(req, 7)
        else:
            server.reply(req, data[::-1])


def call(group: str, name: str, sizes: list[int]) -> None:
    d = ferry.Group(group).join()
    client = ferry.Client(d, name, timeout=60)
    print("joined", flush=True)
    for k, size in enumerate(sizes):
        req = payload(1000 + k, size)
        got = client.call(req, timeout=60)
        print("answer", len(got), "ok" if bytes(got) == req[::-1] else "bad", flush=True)
    try:
        client.call(b"fail please", timeout=60)
        print("failed none", flush=True)
    except ferry.RequestFailed as e:
        print("failed", e.status, flush=True)


def sizes(arg: str) -> list[int]:
    return [int(s) for s in arg.split(",")]


def main() -> None:
    role, group, name = sys.argv[1:4]
    if role == "publish":
        publish(group, name, sizes(sys.argv[4]))
    elif role == "subscribe":
        subscribe(group, name, int(sys.argv[4]), float(sys.argv[5]))
    elif role == "serve":
        serve(group, name)
    elif role == "call":
        call(group, name, sizes(sys.argv[4]))
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
