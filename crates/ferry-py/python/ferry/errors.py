"""Exceptions raised by ferry.

Every error of ferry derives from :class:`FerryError`; a failed system call is an
:class:`OSError` (with its ``errno``), as for Python's own I/O.
"""

from __future__ import annotations

__all__ = [
    "FerryError",
    "PeerGone",
    "Disconnected",
    "QuotaExceeded",
    "LotExhausted",
    "GroupFull",
    "BadGroup",
    "AddressInUse",
    "BadDescriptor",
    "Full",
    "Timeout",
    "InvalidArgument",
    "ServiceExists",
    "NoSuchService",
    "ServiceTableFull",
    "ServiceFull",
    "AlreadyMember",
    "BadServiceTable",
    "RequestFailed",
    "TooManyFds",
    "FdRefused",
    "FdsLost",
]


class FerryError(Exception):
    """Base class of ferry's errors."""


class PeerGone(FerryError):
    """The peer process exited or was killed. ``pid`` is its process id.

    A receiver sees it only after it has received everything the dead sender sent;
    messages it holds stay readable.
    """

    pid: int


class Disconnected(FerryError):
    """The peer closed its end of the channel."""


class QuotaExceeded(FerryError):
    """A path holds its quota: receivers are not releasing its fbufs.

    ``outstanding`` and ``quota`` are in bytes.
    """

    outstanding: int
    quota: int


class LotExhausted(FerryError):
    """The domain's lot has no free span of ``requested`` bytes."""

    requested: int


class GroupFull(FerryError):
    """The group has no free domain slot."""


class BadGroup(FerryError):
    """The group's file is not a usable ferry group."""


class AddressInUse(FerryError):
    """The address a lot must occupy is taken in this process (``addr``, ``len``)."""

    addr: int
    len: int


class BadDescriptor(FerryError):
    """A descriptor written by the peer failed validation (a buggy or hostile peer)."""


class Full(FerryError):
    """The channel's ring is full (``try_send``)."""


class Timeout(FerryError, TimeoutError):
    """A blocking call's timeout expired."""


class InvalidArgument(FerryError, ValueError):
    """An argument was out of range."""


class ServiceExists(FerryError):
    """A live domain of the group already offers a service of this name."""


class NoSuchService(FerryError):
    """No live domain offers a service of this name (and kind) within the timeout."""


class ServiceTableFull(FerryError):
    """Every entry of the group's service table is in use."""


class ServiceFull(FerryError):
    """The service has its maximum of subscribers or clients."""


class AlreadyMember(FerryError):
    """This domain already subscribed to (or is a client of) the service."""


class BadServiceTable(FerryError):
    """The group's service table is damaged or its lock stayed held."""


class RequestFailed(FerryError):
    """The server's handler failed the request; ``status`` is its non-zero code."""

    status: int


class TooManyFds(FerryError):
    """A message was given more descriptors (``count``) than one carries (``max``)."""

    count: int
    max: int


class FdRefused(FerryError):
    """A received message carried a descriptor (at ``index``) of a kind the receiver
    does not accept; the message was dropped and none of its descriptors kept."""

    index: int


class FdsLost(FerryError):
    """The sender (``pid``) died before the receiver took the message's descriptors;
    the message was dropped."""

    pid: int
