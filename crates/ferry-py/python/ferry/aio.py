"""asyncio support: awaitable receive on a :class:`ferry.Receiver`.

The receiver's ``fileno()`` is an eventfd that turns readable when a message arrives
after ``arm()``; :func:`recv` waits for it with ``loop.add_reader``. To notice a sender
that dies while we wait, it also watches a pidfd of the sender's process.
"""

from __future__ import annotations

import asyncio
import os
from typing import Optional, Protocol

from ._ferry import Message


class Receiving(Protocol):
    """What :func:`recv` needs: a :class:`ferry.Receiver` or :class:`ferry.Subscriber`."""

    @property
    def peer_pid(self) -> int: ...
    def try_recv(self) -> Optional[Message]: ...
    def arm(self) -> bool: ...
    def fileno(self) -> int: ...


__all__ = ["recv", "Receiving"]

# After the sender's pidfd turns readable, ferry reports PeerGone at its next liveness
# check (about every 10 ms of an empty ring): poll until then.
_DEATH_POLL = 0.005


def _pidfd(pid: int) -> Optional[int]:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None  # no pidfd support, or the process is already gone and reaped


async def recv(rx: Receiving, timeout: Optional[float] = None) -> Message:
    """Receives the next message from ``rx`` (a ``Receiver`` or ``Subscriber``) without
    blocking the event loop.

    Raises :class:`ferry.Timeout` after ``timeout`` seconds (``None``: no limit), and
    :class:`ferry.PeerGone` or :class:`ferry.Disconnected` like ``Receiver.recv``.
    """
    if timeout is None:
        return await _recv(rx)
    try:
        return await asyncio.wait_for(_recv(rx), timeout)
    except asyncio.TimeoutError:
        from .errors import Timeout

        raise Timeout("timed out") from None


async def _recv(rx: Receiving) -> Message:
    loop = asyncio.get_running_loop()
    fd = rx.fileno()
    pidfd = _pidfd(rx.peer_pid)
    try:
        while True:
            msg = rx.try_recv()
            if msg is not None:
                return msg
            if not rx.arm():
                continue  # a message arrived while arming
            woke: asyncio.Future[str] = loop.create_future()

            def wake(why: str) -> None:
                if not woke.done():
                    woke.set_result(why)

            loop.add_reader(fd, wake, "message")
            if pidfd is not None:
                loop.add_reader(pidfd, wake, "peer")
            try:
                why = await woke
            finally:
                loop.remove_reader(fd)
                if pidfd is not None:
                    loop.remove_reader(pidfd)
            if why == "peer":
                # Drain what the dead sender left, then PeerGone comes from try_recv.
                await asyncio.sleep(_DEATH_POLL)
                if pidfd is not None:
                    os.close(pidfd)
                    pidfd = None
                while True:
                    msg = rx.try_recv()
                    if msg is not None:
                        return msg
                    await asyncio.sleep(_DEATH_POLL)
    finally:
        if pidfd is not None:
            os.close(pidfd)
