"""asyncio: awaitable receive on the receiver's fd."""

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


def test_await_recv(pair):
    async def main():
        def later():
            time.sleep(0.05)
            pair.tx.send(b"late")

        t = threading.Thread(target=later)
        t.start()
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        tick = asyncio.create_task(ticker())
        got = await ferry.aio.recv(pair.rx, timeout=5)
        tick.cancel()
        t.join()
        return got, ticks

    got, ticks = asyncio.run(main())
    assert got == b"late"
    assert ticks > 0  # the loop kept running while we waited


def test_await_recv_timeout(pair):
    with pytest.raises(ferry.Timeout):
        asyncio.run(ferry.aio.recv(pair.rx, timeout=0.05))


def test_await_recv_peer_gone(group_name):
    with ferry.Group(group_name) as g, g.join() as me:
        producer = subprocess.Popen(
            peer_cmd("produce", group_name, me.id, "4096", "1", "hold"),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            rx = me.accept(timeout=30)

            async def main():
                first = await ferry.aio.recv(rx, timeout=30)
                producer.send_signal(signal.SIGKILL)
                with pytest.raises(ferry.PeerGone):
                    await ferry.aio.recv(rx, timeout=30)
                return first

            first = asyncio.run(main())
            assert len(first) == 4096
            del first
        finally:
            if producer.poll() is None:
                producer.kill()
            producer.wait()
        rx.close()
