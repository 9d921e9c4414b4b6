"""asyncio example: a producer process sends frames; this process awaits them.

    python crates/ferry-py/examples/aio_pipeline.py

The consumer (this process) joins a group and starts a producer child with its domain id;
`ferry.aio.recv` awaits each frame through the receiver's eventfd while other tasks keep
running. Frames arrive as read-only numpy arrays over the producer's pages.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import numpy as np

import ferry
import ferry.aio

FRAMES = 10
SHAPE = (1080, 1920, 3)


def producer(group: str, peer: str) -> None:
    with ferry.Group(group) as g, g.join() as d, d.connect(peer, timeout=10) as tx:
        path = d.path()
        for i in range(FRAMES):
            buf = path.alloc(int(np.prod(SHAPE)))
            frame = np.frombuffer(buf, dtype=np.uint8).reshape(SHAPE)
            frame[...] = i
            del frame  # freeze() refuses while a writable view exists
            tx.send(buf.freeze(), timeout=10)
        while tx.in_flight:  # let the consumer finish with our pages
            tx.collect_releases()


async def consumer(rx: ferry.Receiver) -> None:
    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(0.01)

    beat = asyncio.create_task(heartbeat())
    for _ in range(FRAMES):
        msg = await ferry.aio.recv(rx, timeout=10)
        frame = np.frombuffer(msg, dtype=np.uint8).reshape(SHAPE)
        print(f"frame {int(frame[0, 0, 0])}: mean {frame.mean():.1f}, writeable={frame.flags.writeable}")
    beat.cancel()


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "produce":
        producer(sys.argv[2], sys.argv[3])
        return
    group = f"aio-example-{os.getpid()}"
    with ferry.Group(group) as g, g.join() as d:
        child = subprocess.Popen([sys.executable, __file__, "produce", group, d.id])
        with d.accept(timeout=10) as rx:
            asyncio.run(consumer(rx))
        child.wait()


if __name__ == "__main__":
    main()
