"""Named services: publish-subscribe and request-response."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time

import pytest

import ferry
import ferry.aio
from conftest import peer_cmd


def test_publish_subscribe_zero_copy(group, np):
    cam, v1, v2 = group.join(), group.join(), group.join()
    with ferry.Publisher(cam, "camera/front", depth=8) as pub:
        s1 = ferry.Subscriber(v1, "camera/front")
        s2 = ferry.Subscriber(v2, "camera/front")
        pub.wait_for_subscribers(2, timeout=5)
        path = cam.path()
        buf = path.alloc(1 << 20)
        np.frombuffer(buf, dtype=np.uint8)[:] = 3
        frame = buf.freeze()
        assert pub.publish(frame) == 2
        a = s1.recv(timeout=5)
        b = s2.recv(timeout=5)
        assert a.address == b.address == frame.address  # one fbuf, three readers
        assert not np.frombuffer(a, dtype=np.uint8).flags.writeable
        (svc,) = group.services()
        assert svc["name"] == "camera/front" and svc["kind"] == "pubsub"
        assert (svc["origin"], svc["far"], svc["bridge"]) == ("local", None, None)
        assert len(svc["members"]) == 2
        with pytest.raises(ferry.ServiceExists):
            ferry.Publisher(v1, "camera/front")
        del a, b, frame
        pub.collect_releases()
        assert path.outstanding == 0
        assert pub.stats()["delivered"] == 2
        s1.close()
        s2.close()
    for d in (cam, v1, v2):
        d.close()


def test_blocking_publish_times_out_then_delivers(group):
    pd, sd = group.join(), group.join()
    with ferry.Publisher(pd, "blocking", depth=2, slow="block") as pub:
        with ferry.Subscriber(sd, "blocking") as sub:
            pub.wait_for_subscribers(1, timeout=5)
            assert pub.publish(b"0") == 1
            assert pub.publish(b"1") == 1
            with pytest.raises(ferry.Timeout):  # the queue is full
                pub.publish(b"2", timeout=0.02)
            assert bytes(sub.recv(timeout=5)) == b"0"
            assert pub.publish(b"3") == 1  # no limit: there is room now
            assert bytes(sub.recv(timeout=5)) == b"1"
            assert bytes(sub.recv(timeout=5)) == b"3"
    pd.close()
    sd.close()


def test_no_such_service(group):
    with group.join() as d:
        with pytest.raises(ferry.NoSuchService):
            ferry.Subscriber(d, "nobody", timeout=0.05)
        with pytest.raises(ferry.NoSuchService):
            ferry.Client(d, "nobody", timeout=0.05)


def test_request_response(group):
    srv_d, cli_d = group.join(), group.join()
    server = ferry.Server(srv_d, "upper")
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                req = server.recv(timeout=0.05)
            except ferry.Timeout:
                continue
            body = req.data.to_bytes()
            if body == b"fail":
                server.fail(req, 7)
            else:
                server.reply(req, body.upper())

    t = threading.Thread(target=serve)
    t.start()
    try:
        client = ferry.Client(cli_d, "upper")
        assert client.call(b"hello", timeout=5) == b"HELLO"
        with pytest.raises(ferry.RequestFailed) as e:
            client.call(b"fail", timeout=5)
        assert e.value.status == 7
        assert client.server[1] == __import__("os").getpid()
        client.close()
    finally:
        stop.set()
        t.join()
    server.close()
    srv_d.close()
    cli_d.close()


def test_subscriber_await_and_publisher_death(group_name):
    with ferry.Group(group_name) as g, g.join() as me:
        pub = subprocess.Popen(
            peer_cmd("publish", group_name, "news", "3"), stdout=subprocess.PIPE, text=True
        )
        try:
            sub = ferry.Subscriber(me, "news", timeout=30)

            async def main():
                got = [await ferry.aio.recv(sub, timeout=30) for _ in range(3)]
                pub.send_signal(signal.SIGKILL)
                with pytest.raises(ferry.PeerGone):
                    await ferry.aio.recv(sub, timeout=30)
                return got

            got = asyncio.run(main())
            assert [m.to_bytes() for m in got] == [b"news 0", b"news 1", b"news 2"]
            del got
            sub.close()
        finally:
            if pub.poll() is None:
                pub.kill()
            pub.wait()


def test_spinning_receive_releases_the_gil_and_does_not_sleep(group):
    pd, sd = group.join(), group.join()
    with ferry.Publisher(pd, "spin") as pub, ferry.Subscriber(sd, "spin") as sub:
        pub.wait_for_subscribers(1, timeout=5)
        # Another Python thread publishes while this one spins: it can only run if the
        # spin released the GIL, and then the message comes during the spin, so the
        # receive never goes to sleep.
        t = threading.Thread(target=lambda: (time.sleep(0.01), pub.publish(b"spun")))
        sleeps = sub.stats()["sleeps"]
        t.start()
        assert bytes(sub.recv(timeout=5, spin=1.0)) == b"spun"
        t.join()
        assert sub.stats()["sleeps"] == sleeps
        # Nothing to receive: the timeout holds even when shorter than the spin.
        with pytest.raises(ferry.Timeout):
            sub.recv(timeout=0.02, spin=0.5)
        # After the spin, the receive sleeps for the rest of the timeout.
        t = threading.Thread(target=lambda: (time.sleep(0.2), pub.publish(b"slept")))
        sleeps = sub.stats()["sleeps"]
        t.start()
        assert bytes(sub.recv(timeout=5, spin=0.001)) == b"slept"
        t.join()
        assert sub.stats()["sleeps"] > sleeps
        for bad in (-1.0, 2.0, float("nan")):
            with pytest.raises(ValueError):
                sub.recv(timeout=0.01, spin=bad)
    pd.close()
    sd.close()
