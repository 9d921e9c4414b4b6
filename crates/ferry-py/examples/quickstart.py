"""A numpy frame from one process to another, without a copy.
Run it with `python crates/ferry-py/examples/quickstart.py`."""
import os
import subprocess
import sys

import numpy as np

import ferry

SHAPE = (1080, 1920, 3)


def producer(group: str, consumer_id: str) -> None:
    with ferry.Group(group) as g, g.join() as d, d.connect(consumer_id, timeout=10) as tx:
        buf = d.path().alloc(int(np.prod(SHAPE)))  # an fbuf in its write phase
        frame = np.frombuffer(buf, dtype=np.uint8).reshape(SHAPE)
        frame[...] = 42  # written in place, in the producer's shared pages
        del frame  # freeze() refuses while a writable view exists
        tx.send(buf.freeze(), timeout=10)  # only a descriptor crosses


if __name__ == "__main__" and len(sys.argv) == 3:
    producer(sys.argv[1], sys.argv[2])
elif __name__ == "__main__":  # the consumer: starts the producer with our id
    group = f"quickstart-py-{os.getpid()}"
    with ferry.Group(group) as g, g.join() as d:
        child = subprocess.Popen([sys.executable, __file__, group, d.id])
        with d.accept(timeout=10) as rx:
            msg = rx.recv(timeout=10)
            img = np.frombuffer(msg, dtype=np.uint8).reshape(SHAPE)  # the producer's pages
            assert img.mean() == 42 and not img.flags.writeable  # read-only here
            print(f"received a {img.shape} frame")
            del img, msg  # the fbuf goes back to the producer
        assert child.wait() == 0
