"""Publish-subscribe with a loan: each frame is written once, in place, in the publisher's
shared pages, and every subscriber reads those pages.
Run it with `python crates/ferry-py/examples/publish_loan.py`."""
import os
import subprocess
import sys

import numpy as np

import ferry

SHAPE = (480, 640)
FRAMES = 3


def subscriber(group: str) -> None:
    with ferry.Group(group) as g, g.join() as d:
        with ferry.Subscriber(d, "camera/front", timeout=10) as sub:
            for i in range(FRAMES):
                msg = sub.recv(timeout=10)
                frame = np.frombuffer(msg, dtype=np.uint16).reshape(SHAPE)
                assert frame.mean() == i and not frame.flags.writeable  # read-only here
                del frame, msg  # the fbuf goes back to the publisher
    print(f"received {FRAMES} frames")


if __name__ == "__main__" and len(sys.argv) == 2:
    subscriber(sys.argv[1])
elif __name__ == "__main__":  # the publisher: starts a subscriber process
    group = f"publish-loan-py-{os.getpid()}"
    with ferry.Group(group) as g, g.join() as d:
        with ferry.Publisher(d, "camera/front", slow="block") as pub:
            child = subprocess.Popen([sys.executable, __file__, group])
            pub.wait_for_subscribers(1, timeout=10)
            for i in range(FRAMES):
                with pub.loan(2 * SHAPE[0] * SHAPE[1]) as buf:  # a writable memoryview
                    frame = np.frombuffer(buf, dtype=np.uint16).reshape(SHAPE)
                    frame[...] = i  # written once, in place, for every subscriber
                    del frame  # no view may outlive the block
            assert child.wait() == 0
