"""Python services on two hosts joined by two `ferry-bridge` processes (docs/bridge.md).

The Python programs (service_peer.py) are the ones that would run on one host: they
name a group and a service, nothing about hosts or bridges. Each "host" is a network
namespace, the two joined by a veth pair the test makes, with the host's bridge and
Python programs inside it (root and `ip` needed; otherwise both bridges run on
loopback, and the test says so). A group is a file in /dev/shm, which every namespace
of one machine shares, so the two hosts also use two groups (A and B) whose bridges
share one scope, as crates/ferry-zenoh/tests/two_hosts.rs does.
"""

from __future__ import annotations

import hashlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Iterator, Optional

import pytest

from conftest import HERE, unique_name
from service_peer import payload

ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
BRIDGE = os.environ.get("FERRY_BRIDGE") or os.path.join(ROOT, "target", "release", "ferry-bridge")
SERVICE_PEER = os.path.join(HERE, "service_peer.py")
T = 60.0  # set-up steps on a loaded machine; a hang shows as a failure after it


class Proc:
    """A child process whose stdout lines arrive on a queue (and are echoed to stderr)."""

    def __init__(self, cmd: list[str], what: str) -> None:
        self.what = what
        self.lines: queue.Queue[Optional[str]] = queue.Queue()
        self.seen: list[str] = []
        self.p = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            line = line.rstrip("\n")
            print(f"    [{self.what}] {line}", file=sys.stderr, flush=True)
            self.seen.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, prefix: str, within: float = T) -> str:
        """The next line starting with `prefix` (for a bridge, whose message does)."""
        deadline = time.monotonic() + within
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{self.what}: no line {prefix!r} within {within} s") from None
            if line is None:
                raise AssertionError(f"{self.what}: ended before printing {prefix!r}")
            if line.startswith(prefix) or f"]: {prefix}" in line:
                return line

    def saw(self, needle: str) -> bool:
        return any(needle in line for line in self.seen)

    def tell(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def stop(self) -> int:
        """SIGTERM, as Ctrl-C would; the exit status."""
        self.p.send_signal(signal.SIGTERM)
        return self.p.wait(timeout=30)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        for f in (self.p.stdin, self.p.stdout):
            try:
                f and f.close()  # type: ignore[func-returns-value]
            except OSError:
                pass


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def del_netns(ns: str) -> None:
    try:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    except OSError:
        pass


def make_namespaces(a: str, b: str) -> Optional[str]:
    """Makes namespaces `a` and `b` joined by a veth pair; why not, if it cannot."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "no ip command"
    try:
        ip("netns", "add", a)
        ip("netns", "add", b)
        ip("link", "add", a, "type", "veth", "peer", "name", b)
        for ns, addr in ((a, "10.99.0.1/24"), (b, "10.99.0.2/24")):
            ip("link", "set", ns, "netns", ns)
            ip("-n", ns, "addr", "add", addr, "dev", ns)
            ip("-n", ns, "link", "set", ns, "up")
            ip("-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        return f"ip {' '.join(e.cmd[1:])}: {e.stderr.strip()}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hosts:
    """Two hosts: groups, namespaces (or none), bridges and programs; `close` ends every
    process, deletes the namespaces and whatever group file is left."""

    def __init__(self) -> None:
        base = unique_name()
        self.groups = {"A": f"{base}-a", "B": f"{base}-b"}
        self.scope = f"fp{os.getpid()}-{base.rsplit('-', 1)[1]}"
        # Also the namespaces' and veth ends' names, which must fit 15 bytes.
        na, nb = f"{self.scope}a", f"{self.scope}b"
        why = make_namespaces(na, nb)
        if why is None:
            self.ns: Optional[dict[str, str]] = {"A": na, "B": nb}
            self.endpoint = "tcp/10.99.0.1:7447"
        else:
            for ns in (na, nb):
                del_netns(ns)
            try:  # the veth pair, if it was made but not moved
                subprocess.run(["ip", "link", "del", na], capture_output=True)
            except OSError:
                pass
            print(f"note: no network namespaces ({why}): both bridges on loopback", file=sys.stderr)
            self.ns = None
            self.endpoint = f"tcp/127.0.0.1:{free_port()}"
        self.procs: list[Proc] = []

    def _start(self, host: str, cmd: list[str], what: str) -> Proc:
        if self.ns is not None:
            cmd = ["ip", "netns", "exec", self.ns[host], *cmd]
        p = Proc(cmd, f"{what} on {host}")
        self.procs.append(p)
        return p

    def bridge(self, host: str, *extra: str) -> Proc:
        """Host `host`'s bridge: A listens, B connects."""
        ep = ["--listen" if host == "A" else "--connect", self.endpoint]
        cmd = [BRIDGE, "--group", self.groups[host], "--scope", self.scope, *ep, *extra]
        return self._start(host, cmd, "bridge")

    def python(self, host: str, role: str, name: str, *args: str) -> Proc:
        """service_peer.py in `role` on host `host`, in that host's group."""
        cmd = [sys.executable, SERVICE_PEER, role, self.groups[host], name, *args]
        return self._start(host, cmd, f"{role} {name}")

    def stop_bridges(self, *bridges: Proc) -> None:
        for b in bridges:
            status = b.stop()
            assert status == 0, f"{b.what} ended with {status} after SIGTERM"

    def assert_no_leftovers(self) -> None:
        """Once every process has ended, neither group may leave a file in /dev/shm."""
        for p in self.procs:
            p.kill()
        for g in self.groups.values():
            f = f"/dev/shm/ferry.{g}"
            deadline = time.monotonic() + 5
            while os.path.exists(f) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not os.path.exists(f), f"{f} left behind"

    def close(self) -> None:
        for p in self.procs:
            p.kill()
        if self.ns is not None:
            for ns in self.ns.values():
                del_netns(ns)
        for g in self.groups.values():
            try:
                os.unlink(f"/dev/shm/ferry.{g}")
            except FileNotFoundError:
                pass


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    if not os.access(BRIDGE, os.X_OK):
        pytest.skip(f"SKIP: {BRIDGE} is not built (cargo build --release -p ferry-zenoh)")
    h = Hosts()
    try:
        yield h
    finally:
        h.close()


SIZES = [1, 64 << 10, 4 << 20, 1000]


def digests(sizes: list[int]) -> list[str]:
    return [f"got {s} {hashlib.sha256(payload(k, s)).hexdigest()}" for k, s in enumerate(sizes)]


def test_bridge_python_pubsub_and_calls_cross_hosts(hosts: Hosts) -> None:
    """A Python publisher on A reaches a Python subscriber on B byte-identical (1 B to
    4 MiB, in order), and a Python client on B calls a Python server on A (answers
    byte-identical, a failure's status as it is locally), through two bridges; B's
    group.services() says the service is bridged from A."""
    ba = hosts.bridge("A")
    bb = hosts.bridge("B")
    pub = hosts.python("A", "publish", "py/cam", ",".join(map(str, SIZES)))
    pub.expect("offered")
    srv = hosts.python("A", "serve", "py/calc")
    srv.expect("offered")
    sub = hosts.python("B", "subscribe", "py/cam", str(len(SIZES)), str(T))
    sub.expect("joined")
    pub.tell("go")
    for want in digests(SIZES):
        assert sub.expect("") == want
    assert sub.expect("") == "done"
    # group.services() on B says where py/cam lives: bridged from A's bridge.
    zid_a = next(line.split(" zid ")[1].split()[0] for line in ba.seen if " zid " in line)
    origin = sub.expect("origin")
    assert origin.startswith("origin bridged ") and f"({zid_a})" in origin, origin
    pub.expect("published")
    call_sizes = [1, 100, 64 << 10, 4 << 20]
    cli = hosts.python("B", "call", "py/calc", ",".join(map(str, call_sizes)))
    cli.expect("joined")
    for s in call_sizes:
        assert cli.expect("") == f"answer {s} ok"
    assert cli.expect("") == "failed 7"
    for p in (pub, srv, sub, cli):
        p.kill()
    hosts.stop_bridges(ba, bb)
    hosts.assert_no_leftovers()


def test_bridge_python_denied_service_never_arrives(hosts: Hosts) -> None:
    """A's bridge denies py/secret*: py/open reaches B's Python subscriber, py/secret
    does not exist on B (its subscriber gets NoSuchService) while A's own subscriber
    receives it."""
    ba = hosts.bridge("A", "--deny", "py/secret*")
    bb = hosts.bridge("B")
    sizes = [1, 64 << 10]
    po = hosts.python("A", "publish", "py/open", ",".join(map(str, sizes)))
    ps = hosts.python("A", "publish", "py/secret", ",".join(map(str, sizes)))
    po.expect("offered")
    ps.expect("offered")
    local = hosts.python("A", "subscribe", "py/secret", str(len(sizes)), str(T))
    local.expect("joined")
    so = hosts.python("B", "subscribe", "py/open", str(len(sizes)), str(T))
    so.expect("joined")
    po.tell("go")
    for want in digests(sizes):
        assert so.expect("") == want
    ps.tell("go")
    for want in digests(sizes):
        assert local.expect("") == want
    # py/open arrived, so B's bridge has seen A's exports: py/secret is not among them.
    ss = hosts.python("B", "subscribe", "py/secret", str(len(sizes)), "5")
    assert ss.expect("") == "end NoSuchService"
    assert not ba.saw("exporting py/secret"), "A's bridge exported a denied service"
    assert not bb.saw("importing py/secret"), "B's bridge imported a denied service"
    for p in (po, ps, local, so, ss):
        p.kill()
    hosts.stop_bridges(ba, bb)
    hosts.assert_no_leftovers()
