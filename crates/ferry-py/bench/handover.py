"""Hands numpy arrays from a producer process to a consumer process, several ways.

    python handover.py [--quick] [--sizes 6220800,67108864] [--rounds R] [--messages N]

Prints one JSON object: {"results": [...], "skipped": {...}, ...}. Each result has the
system, the payload size, the series ("handover": the consumer holds the array;
"handover+read": it has also summed every byte) and one-way latencies in microseconds
(the producer's clock stamp just before it hands the array over, to the consumer's stamp,
both CLOCK_MONOTONIC). Producer and consumer take turns (the producer waits for the
consumer's acknowledgement before the next message), so this is latency, not throughput.

Every system gets one producer process for the whole run, started and warmed up (a few
messages of every size, not timed: the first messages of a fresh process fault in fresh
pages and wake a consumer that slept through all that) before any timing. The timing is
done in rounds; each round visits every system once, in an order rotated per round, and
takes a few messages of every size and series from it, so a burst of load from other
processes on the machine falls on all systems alike rather than on whichever ran then.
For the same reason the timed loops run with Python's garbage collector paused and
OpenBLAS held to one thread (its idle worker threads spin, and steal a CPU from whichever
process is waiting to be woken).

Systems: ferry (the producer writes the frame into an fbuf, freezes and sends it; the
consumer blocks in `recv` and reads the producer's pages), ferry-poll (the same, with a
consumer that polls, `recv(spin=...)`, as iceoryx2's must), multiprocessing.Queue (the
array is pickled), multiprocessing.shared_memory plus a queue of segment names (the
producer writes into a new segment per message, the consumer attaches by name), iceoryx2
when its Python package is importable (loaned slice; it has no blocking receive, so its
subscriber polls), and torch.multiprocessing when torch is importable (a tensor per
message through its queue, which shares the storage). Plus a floor, "floor: pipe wake":
the producer writes the array as ferry's does, then wakes the consumer blocked in a pipe
read with an 8-byte stamp (no data moves). `ferry-bench python` runs this and
turns the JSON into its report. The consumer and the producers are pinned to two different
CPUs when there are two.
"""

from __future__ import annotations

import os

# Before numpy is imported (here and in the spawned producers, which inherit it).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import multiprocessing as mp  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

FRAME = 1920 * 1080 * 3  # one 1080p RGB frame: 6,220,800 bytes
BIG = 64 << 20
WARMUP = 3  # untimed messages of every size when a system starts


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def stamp(a: np.ndarray) -> None:
    a[:8] = np.frombuffer(now_ns().to_bytes(8, "little"), dtype=np.uint8)


def stamp_of(a: np.ndarray) -> int:
    return int.from_bytes(bytes(a[:8]), "little")


def drive(ctl, one, acked=None) -> None:
    """A producer's loop: for each ("go", size, n) on `ctl`, make and hand over `n`
    messages of `size` bytes with `one(size, i)`, each after the consumer's ack (then
    `acked()`, if given, runs)."""
    i = 0
    while (cmd := ctl.recv()) is not None:
        _, size, n = cmd
        for _ in range(n):
            one(size, i)
            i += 1
            ctl.recv()  # the consumer is done with it
            if acked is not None:
                acked()


# The consumer (this process) and every producer run on CPUs of their own when there are
# two, as the Rust benchmarks pin theirs: unpinned, a woken producer tends to land on the
# consumer's CPU, and a polling consumer then competes with it for one CPU.
_CPUS = sorted(os.sched_getaffinity(0))
CONSUMER_CPU, PRODUCER_CPU = (_CPUS[0], _CPUS[1]) if len(_CPUS) >= 2 else (None, None)


class System:
    """One producer process and this process as its consumer."""

    name = "?"

    def start(self) -> None:
        self.ctl, child = mp.Pipe()
        self.proc = mp.Process(target=self.producer_main, args=(child,) + self.producer_args())
        self.proc.start()
        if PRODUCER_CPU is not None:
            os.sched_setaffinity(self.proc.pid, {PRODUCER_CPU})
        self.ready()

    def producer_args(self) -> tuple:
        return ()

    def ready(self) -> None:
        pass

    def take(self, size: int, read: bool) -> int:
        """Receives one message, reads it if asked, returns its producer stamp minus now
        (negative, in ns) -- the caller adds the stamp."""
        raise NotImplementedError

    def run(self, size: int, n: int, read: bool) -> list[float]:
        self.ctl.send(("go", size, n))
        lat = []
        for _ in range(n):
            lat.append(self.take(size, read) / 1e3)
            self.ctl.send(None)
        return lat

    def stop(self) -> None:
        self.ctl.send(None)
        self.proc.join(60)
        if self.proc.exitcode != 0:
            raise RuntimeError(f"{self.name}: the producer exited with {self.proc.exitcode}")


# ---------------------------------------------------------------- ferry


def ferry_producer(ctl, group: str, peer: str) -> None:
    import ferry

    with ferry.Group(group) as g, g.join() as d, d.connect(peer, timeout=30) as tx:
        path = d.path()

        def one(size: int, i: int) -> None:
            buf = path.alloc(size)
            a = np.frombuffer(buf, dtype=np.uint8)
            a[8:] = i & 0xFF  # the producer makes its frame in place
            stamp(a)
            del a
            tx.send(buf.freeze(), timeout=30)

        drive(ctl, one)
        while tx.in_flight:
            tx.collect_releases()
            time.sleep(0.001)


class Ferry(System):
    name = "ferry"
    producer_main = staticmethod(ferry_producer)

    def start(self) -> None:
        import ferry

        self.group = ferry.Group(f"pybench-{os.getpid()}")
        self.dom = self.group.join()
        super().start()

    def producer_args(self) -> tuple:
        return (self.group.name, self.dom.id)

    def ready(self) -> None:
        self.rx = self.dom.accept(timeout=60)

    def take(self, size: int, read: bool) -> int:
        msg = self.rx.recv(timeout=60)
        a = np.frombuffer(msg, dtype=np.uint8)
        if read:
            a.sum(dtype=np.uint64)
        t1 = now_ns()
        return t1 - stamp_of(a)

    def stop(self) -> None:
        super().stop()
        self.rx.close()
        self.dom.close()
        self.group.close()


class FerryPoll(Ferry):
    """ferry with a consumer that polls (`recv(spin=1.0)`: it spins with the GIL released
    before it would sleep) instead of sleeping in `recv`: the way iceoryx2's Python consumer
    below has to wait, and what a consumer on a core of its own would do. It saves the
    wake-up of a sleeping process. iceoryx2's polling loop yields with `os.sched_yield()`,
    not `time.sleep(0)`: the latter is a `clock_nanosleep` that the kernel's timer slack
    stretches to about 50 µs here."""

    name = "ferry-poll"

    def start(self) -> None:
        import ferry

        self.group = ferry.Group(f"pybench-poll-{os.getpid()}")
        self.dom = self.group.join()
        System.start(self)

    def take(self, size: int, read: bool) -> int:
        # Spins (GIL released) for up to a second before it would sleep: longer than the
        # producer takes to write a 64 MiB array.
        msg = self.rx.recv(timeout=60, spin=1.0)
        a = np.frombuffer(msg, dtype=np.uint8)
        if read:
            a.sum(dtype=np.uint64)
        t1 = now_ns()
        return t1 - stamp_of(a)


# ---------------------------------------------------------------- multiprocessing.Queue


def queue_producer(ctl, q) -> None:
    def one(size: int, i: int) -> None:
        frame = np.full(size, i & 0xFF, dtype=np.uint8)
        q.put((now_ns(), frame))

    drive(ctl, one)


class Queued(System):
    """A system whose producer puts onto a queue this process gets from."""

    def producer_args(self) -> tuple:
        self.q = self.make_queue()
        return (self.q,)

    def make_queue(self):
        return mp.Queue(maxsize=2)


class MpQueue(Queued):
    name = "multiprocessing.Queue"
    producer_main = staticmethod(queue_producer)

    def take(self, size: int, read: bool) -> int:
        t0, a = self.q.get(timeout=60)
        if read:
            a.sum(dtype=np.uint64)
        return now_ns() - t0


# ---------------------------------------------------------------- shared_memory + names


def shm_producer(ctl, q) -> None:
    from multiprocessing import shared_memory

    def one(size: int, i: int) -> None:
        shm = shared_memory.SharedMemory(create=True, size=size)
        a = np.ndarray((size,), dtype=np.uint8, buffer=shm.buf)
        a[:] = i & 0xFF
        del a
        q.put((now_ns(), shm.name))
        one.last = shm

    def release() -> None:
        if getattr(one, "last", None) is not None:
            one.last.close()
            one.last.unlink()
            one.last = None

    drive(ctl, one, release)  # a segment goes once the consumer is done with it


class ShmQueue(Queued):
    name = "shared_memory+Queue"
    producer_main = staticmethod(shm_producer)

    def take(self, size: int, read: bool) -> int:
        from multiprocessing import shared_memory

        t0, name = self.q.get(timeout=60)
        # (The spawned producer shares this process's resource tracker, so attaching
        # here registers nothing new; the producer unlinks each segment.)
        shm = shared_memory.SharedMemory(name=name)
        a = np.ndarray((size,), dtype=np.uint8, buffer=shm.buf)
        if read:
            a.sum(dtype=np.uint64)
        t1 = now_ns()
        del a
        shm.close()
        return t1 - t0


# ---------------------------------------------------------------- iceoryx2 (if installed)


def iox_service(node, name: str):
    import ctypes

    import iceoryx2 as iox

    return (
        node.service_builder(iox.ServiceName.new(name))
        .publish_subscribe(iox.Slice[ctypes.c_uint8])
        .open_or_create()
    )


def iox_producer(ctl, service: str, max_size: int) -> None:
    import iceoryx2 as iox

    node = iox.NodeBuilder.new().create(iox.ServiceType.Ipc)
    pub = iox_service(node, service).publisher_builder().initial_max_slice_len(max_size).create()

    def one(size: int, i: int) -> None:
        sample = pub.loan_slice_uninit(size)
        a = np.frombuffer(sample.payload().as_memory_view(), dtype=np.uint8)
        a[8:] = i & 0xFF
        stamp(a)
        del a
        sample.assume_init().send()

    drive(ctl, one)


class Iceoryx2(System):
    name = "iceoryx2"
    producer_main = staticmethod(iox_producer)

    def __init__(self, max_size: int) -> None:
        import iceoryx2 as iox

        self.service = f"ferry-bench/{os.getpid()}"
        self.node = iox.NodeBuilder.new().create(iox.ServiceType.Ipc)
        self.sub = iox_service(self.node, self.service).subscriber_builder().create()
        self.max_size = max_size

    def producer_args(self) -> tuple:
        return (self.service, self.max_size)

    def take(self, size: int, read: bool) -> int:
        deadline = time.monotonic() + 60
        while (sample := self.sub.receive()) is None:  # no blocking receive: poll
            if time.monotonic() > deadline:
                raise TimeoutError("iceoryx2: nothing received")
            os.sched_yield()
        a = np.frombuffer(sample.payload().as_memory_view(), dtype=np.uint8)
        if read:
            a.sum(dtype=np.uint64)
        t1 = now_ns()
        t = t1 - stamp_of(a)
        del a, sample
        return t


# ---------------------------------------------------------------- torch (if installed)


def torch_producer(ctl, q) -> None:
    import torch

    def one(size: int, i: int) -> None:
        t = torch.full((size,), i & 0xFF, dtype=torch.uint8)
        t.share_memory_()  # what a torch.multiprocessing queue does to a tensor it sends
        q.put((now_ns(), t))

    drive(ctl, one)


class Torch(Queued):
    name = "torch.multiprocessing"
    producer_main = staticmethod(torch_producer)

    def make_queue(self):
        import torch.multiprocessing as tmp

        return tmp.get_context("spawn").Queue(maxsize=2)

    def take(self, size: int, read: bool) -> int:
        t0, t = self.q.get(timeout=60)
        a = t.numpy()
        if read:
            a.sum(dtype=np.uint64)
        t1 = now_ns()
        del a, t
        return t1 - t0


# ---------------------------------------------------------------- the sleeping consumer's floor


PIPE_WAKE = "floor: pipe wake"


def pipe_wake_producer(ctl, w) -> None:
    arrays: dict[int, np.ndarray] = {}

    def one(size: int, i: int) -> None:
        a = arrays.get(size)
        if a is None:
            a = arrays[size] = np.zeros(size, dtype=np.uint8)
        a[8:] = i & 0xFF  # the same work as ferry's producer: write the frame
        w.send_bytes(now_ns().to_bytes(8, "little"))  # then only 8 bytes cross

    drive(ctl, one)


class PipeWake(System):
    """The floor under a consumer that sleeps until its message comes, at each size: the
    producer writes an array of that size (as ferry's does, so the consumer sleeps as long)
    and then wakes the consumer, blocked in a pipe read, with an 8-byte stamp. No data
    moves. On these VMs waking a CPU costs more the longer it slept (tens of µs after a
    millisecond, hundreds after tens of milliseconds), so a sleeping consumer of a big
    array pays more than the 8-byte floor below, whatever carries the array."""

    name = PIPE_WAKE
    producer_main = staticmethod(pipe_wake_producer)

    def producer_args(self) -> tuple:
        self.r, w = mp.Pipe(duplex=False)
        return (w,)

    def take(self, size: int, read: bool) -> int:
        t0 = int.from_bytes(self.r.recv_bytes(), "little")  # nothing else crossed
        return now_ns() - t0


# ---------------------------------------------------------------- the wake-up floor


def _waker(w, go, n: int) -> None:
    if PRODUCER_CPU is not None:
        os.sched_setaffinity(0, {PRODUCER_CPU})
    for _ in range(n):
        go.recv_bytes()  # the consumer is about to sleep in its read
        time.sleep(0.0005)  # let it fall asleep
        w.send_bytes(now_ns().to_bytes(8, "little"))


def wake_floor(n: int) -> list[float]:
    """One-way latency of waking a process that sleeps in a blocking read: the producer,
    pinned to the other CPU, stamps and writes 8 bytes to a pipe; the consumer returns from
    its read and stamps. No data moves: it is what any consumer that sleeps until a
    message arrives pays on this machine, whatever carries the message."""
    r, w = mp.Pipe(duplex=False)
    go_r, go_w = mp.Pipe(duplex=False)
    child = mp.Process(target=_waker, args=(w, go_r, n))
    child.start()
    out = []
    try:
        for _ in range(n):
            go_w.send_bytes(b"g")
            if not r.poll(30):
                raise TimeoutError("wake-up floor: the waker did not write")
            t0 = int.from_bytes(r.recv_bytes(), "little")
            out.append((now_ns() - t0) / 1e3)
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    return out


# ---------------------------------------------------------------- the binding's own cost


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


# ---------------------------------------------------------------- the run


def systems(max_size: int) -> tuple[list[System], dict[str, str]]:
    out: list[System] = [Ferry(), FerryPoll(), MpQueue(), ShmQueue(), PipeWake()]
    skipped = {}
    try:
        import iceoryx2  # noqa: F401

        out.append(Iceoryx2(max_size))
    except ImportError as e:
        skipped["iceoryx2"] = f"the iceoryx2 package is not importable ({e}; pip install iceoryx2==0.10.0)"
    try:
        import torch  # noqa: F401

        out.append(Torch())
    except ImportError as e:
        skipped["torch.multiprocessing"] = f"torch is not importable ({e}); not installed by test.sh (its wheel is gigabytes)"
    return out, skipped


def per_round(system: System, size: int, messages: int) -> int:
    """Messages per round and series: pickling 64 MiB takes most of a second, so
    multiprocessing.Queue gets one a round at the big size."""
    if size >= BIG and isinstance(system, MpQueue):
        return 1
    return messages


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default=f"{FRAME},{BIG}")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--messages", type=int, default=0, help="per round, size, series and system")
    args = ap.parse_args()
    mp.set_start_method("spawn")
    if CONSUMER_CPU is not None:
        os.sched_setaffinity(0, {CONSUMER_CPU})
    sizes = [int(s) for s in args.sizes.split(",")]
    rounds = args.rounds or (3 if args.quick else 12)
    messages = args.messages or (4 if args.quick else 10)
    todo, skipped = systems(max(sizes))
    lat: dict[tuple[str, int, bool], list[float]] = {}
    for s in todo:
        s.start()
        for size in sizes:
            s.run(size, 1 if isinstance(s, MpQueue) and size >= BIG else WARMUP, False)
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            order = todo[r % len(todo) :] + todo[: r % len(todo)]
            for s in order:
                for size in sizes:
                    for read in (False, True):
                        if read and isinstance(s, PipeWake):
                            continue  # nothing crossed to read
                        got = s.run(size, per_round(s, size, messages), read)
                        lat.setdefault((s.name, size, read), []).extend(got)
            print(f"  round {r + 1}/{rounds} done", file=sys.stderr)
    finally:
        gc.enable()
        for s in todo:
            s.stop()
    results = [
        {"transport": name, "size": size, "series": "handover+read" if read else "handover", "us": us}
        for (name, size, read), us in lat.items()
    ]
    roundtrip = small_roundtrip(2000 if args.quick else 20000)
    floor = wake_floor(200 if args.quick else 1000)
    json.dump(
        {
            "results": results,
            "rounds": rounds,
            "roundtrip_us": roundtrip,
            "wake_floor_us": floor,
            "skipped": skipped,
            "python": sys.version.split()[0],
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
