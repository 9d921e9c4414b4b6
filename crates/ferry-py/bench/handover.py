"""Hands numpy arrays from a producer process to a consumer process, several ways.

    python handover.py [--quick] [--sizes 6220800,67108864] [--messages N]

Prints one JSON object: {"results": [...], "skipped": {...}}. Each result has the
transport, the payload size, the series ("handover": the consumer holds the array;
"handover+read": it has also summed every byte) and one-way latencies in microseconds
(the producer's clock stamp just before it hands the array over, to the consumer's stamp,
both CLOCK_MONOTONIC). Producer and consumer take turns (the producer waits for the
consumer's acknowledgement before the next message), so this is latency, not throughput.

Transports: iceoryx2 when its Python package is importable (loaned slice, busy-polled
subscriber), ferry (the producer writes the frame into an fbuf, freezes and sends it; the
consumer reads the producer's pages), multiprocessing.Queue (the array is pickled), and
multiprocessing.shared_memory plus a queue of segment names (the producer writes into a
new segment per message, the consumer attaches by name). `ferry bench python` runs this
and turns the JSON into its report.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np

FRAME = 1920 * 1080 * 3  # one 1080p RGB frame: 6,220,800 bytes
BIG = 64 << 20


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# ---------------------------------------------------------------- ferry


def ferry_producer(group: str, peer: str, size: int, n: int, acks) -> None:
    import ferry

    with ferry.Group(group) as g, g.join() as d, d.connect(peer, timeout=30) as tx:
        path = d.path()
        for i in range(n):
            buf = path.alloc(size)
            a = np.frombuffer(buf, dtype=np.uint8)
            a[8:] = i & 0xFF  # the producer makes its frame in place
            a[:8] = np.frombuffer(now_ns().to_bytes(8, "little"), dtype=np.uint8)
            del a
            tx.send(buf.freeze(), timeout=30)
            acks.recv()
        while tx.in_flight:
            tx.collect_releases()
            time.sleep(0.001)


def ferry_consumer(size: int, n: int, read: bool) -> list[float]:
    import ferry

    group = f"pybench-{os.getpid()}-{size}-{int(read)}"
    lat = []
    with ferry.Group(group) as g, g.join() as d:
        ack_r, ack_w = mp.Pipe(duplex=False)
        p = mp.Process(target=ferry_producer, args=(group, d.id, size, n, ack_r))
        p.start()
        with d.accept(timeout=60) as rx:
            for _ in range(n):
                msg = rx.recv(timeout=60)
                a = np.frombuffer(msg, dtype=np.uint8)
                if read:
                    a.sum(dtype=np.uint64)
                t1 = now_ns()
                t0 = int.from_bytes(bytes(a[:8]), "little")
                lat.append((t1 - t0) / 1e3)
                del a, msg
                ack_w.send(None)
            p.join(60)
    return lat


# ---------------------------------------------------------------- multiprocessing.Queue


def queue_producer(q, size: int, n: int, acks) -> None:
    frame = np.empty(size, dtype=np.uint8)
    for i in range(n):
        frame[:] = i & 0xFF
        q.put((now_ns(), frame))
        acks.recv()


def queue_consumer(size: int, n: int, read: bool) -> list[float]:
    q = mp.Queue(maxsize=2)
    ack_r, ack_w = mp.Pipe(duplex=False)
    p = mp.Process(target=queue_producer, args=(q, size, n, ack_r))
    p.start()
    lat = []
    for _ in range(n):
        t0, a = q.get(timeout=60)
        if read:
            a.sum(dtype=np.uint64)
        lat.append((now_ns() - t0) / 1e3)
        del a
        ack_w.send(None)
    p.join(60)
    return lat


# ---------------------------------------------------------------- shared_memory + names


def shm_producer(q, size: int, n: int, acks) -> None:
    from multiprocessing import shared_memory

    for i in range(n):
        shm = shared_memory.SharedMemory(create=True, size=size)
        a = np.ndarray((size,), dtype=np.uint8, buffer=shm.buf)
        a[:] = i & 0xFF
        del a
        q.put((now_ns(), shm.name))
        acks.recv()  # the consumer is done with it
        shm.close()
        shm.unlink()


def shm_consumer(size: int, n: int, read: bool) -> list[float]:
    from multiprocessing import shared_memory

    q = mp.Queue(maxsize=2)
    ack_r, ack_w = mp.Pipe(duplex=False)
    p = mp.Process(target=shm_producer, args=(q, size, n, ack_r))
    p.start()
    lat = []
    for _ in range(n):
        t0, name = q.get(timeout=60)
        # (The spawned producer shares this process's resource tracker, so attaching
        # here registers nothing new; the producer unlinks each segment.)
        shm = shared_memory.SharedMemory(name=name)
        a = np.ndarray((size,), dtype=np.uint8, buffer=shm.buf)
        if read:
            a.sum(dtype=np.uint64)
        lat.append((now_ns() - t0) / 1e3)
        del a
        shm.close()
        ack_w.send(None)
    p.join(60)
    return lat


# ---------------------------------------------------------------- iceoryx2 (if installed)


def iox_producer(service: str, size: int, n: int, acks) -> None:
    import ctypes

    import iceoryx2 as iox

    node = iox.NodeBuilder.new().create(iox.ServiceType.Ipc)
    svc = (
        node.service_builder(iox.ServiceName.new(service))
        .publish_subscribe(iox.Slice[ctypes.c_uint8])
        .open_or_create()
    )
    pub = svc.publisher_builder().initial_max_slice_len(size).create()
    acks.recv()  # the consumer's subscriber exists
    for i in range(n):
        sample = pub.loan_slice_uninit(size)
        a = np.frombuffer(sample.payload().as_memory_view(), dtype=np.uint8)
        a[8:] = i & 0xFF
        a[:8] = np.frombuffer(now_ns().to_bytes(8, "little"), dtype=np.uint8)
        del a
        sample.assume_init().send()
        acks.recv()


def iox_consumer(size: int, n: int, read: bool) -> list[float]:
    import ctypes

    import iceoryx2 as iox

    service = f"ferry-bench/{os.getpid()}/{size}/{int(read)}"
    node = iox.NodeBuilder.new().create(iox.ServiceType.Ipc)
    svc = (
        node.service_builder(iox.ServiceName.new(service))
        .publish_subscribe(iox.Slice[ctypes.c_uint8])
        .open_or_create()
    )
    sub = svc.subscriber_builder().create()
    ack_r, ack_w = mp.Pipe(duplex=False)
    p = mp.Process(target=iox_producer, args=(service, size, n, ack_r))
    p.start()
    ack_w.send(None)
    lat = []
    for _ in range(n):
        deadline = time.monotonic() + 60
        while (sample := sub.receive()) is None:  # no blocking receive: poll
            if time.monotonic() > deadline:
                raise TimeoutError("iceoryx2: nothing received")
            time.sleep(0)
        a = np.frombuffer(sample.payload().as_memory_view(), dtype=np.uint8)
        if read:
            a.sum(dtype=np.uint64)
        t1 = now_ns()
        lat.append((t1 - int.from_bytes(bytes(a[:8]), "little")) / 1e3)
        del a, sample
        ack_w.send(None)
    p.join(60)
    return lat


def small_roundtrip(n: int) -> list[float]:
    """Publish a 64-byte message and receive it, in one thread of one process (two
    domains): the binding's own cost, compared with the same loop in Rust."""
    import ferry

    out = []
    with ferry.Group(f"pyrt-{os.getpid()}") as g, g.join() as a, g.join() as b:
        with ferry.Publisher(a, "rt") as pub, ferry.Subscriber(b, "rt") as sub:
            pub.wait_for_subscribers(1, timeout=10)
            buf = a.path().alloc(64)
            buf.write(b"x" * 64)
            msg = buf.freeze()
            for _ in range(n):
                t0 = time.perf_counter_ns()
                pub.publish(msg)
                got = sub.recv(timeout=1)
                got.release()
                out.append((time.perf_counter_ns() - t0) / 1e3)
            del msg
    return out[n // 10 :]  # the first tenth warms up


TRANSPORTS = {
    "ferry": ferry_consumer,
    "multiprocessing.Queue": queue_consumer,
    "shared_memory+Queue": shm_consumer,
}

try:
    import iceoryx2  # noqa: F401

    TRANSPORTS["iceoryx2"] = iox_consumer
    ICEORYX2 = None
except ImportError:
    ICEORYX2 = "the iceoryx2 package is not importable (pip install iceoryx2==0.10.0)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default=f"{FRAME},{BIG}")
    ap.add_argument("--messages", type=int, default=0)
    args = ap.parse_args()
    mp.set_start_method("spawn")
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    for size in sizes:
        n = args.messages or (4 if args.quick else 50)
        if size >= BIG and not args.messages:
            n = 2 if args.quick else 20
        for name, consumer in TRANSPORTS.items():
            for read in (False, True):
                lat = consumer(size, n + 1, read)[1:]  # the first one warms up
                results.append(
                    {
                        "transport": name,
                        "size": size,
                        "series": "handover+read" if read else "handover",
                        "us": lat,
                    }
                )
                print(f"  {name} {size} read={read}: median {sorted(lat)[len(lat) // 2]:.0f} us", file=sys.stderr)
    roundtrip = small_roundtrip(2000 if args.quick else 20000)
    skipped = {}
    if ICEORYX2:
        skipped["iceoryx2"] = ICEORYX2
    try:
        import torch  # noqa: F401

        skipped["torch.multiprocessing"] = "not measured yet"
    except ImportError:
        skipped["torch.multiprocessing"] = "torch is not importable"
    json.dump({"results": results, "roundtrip_us": roundtrip, "skipped": skipped, "python": sys.version.split()[0]}, sys.stdout)


if __name__ == "__main__":
    main()
