"""ferry: zero-copy data passing between Linux processes.

Processes that join a :class:`Group` each own a *lot*, shared memory mapped read-write in
the owner and read-only everywhere else. A producer allocates an fbuf from a
:class:`Path`, writes it through the buffer protocol, freezes it into a :class:`Message`
and sends it; the consumer receives a :class:`Message` over the same pages, readable with
``memoryview(msg)`` or ``numpy.frombuffer(msg, ...)`` and never writable::

    import ferry, numpy as np

    group = ferry.Group("camera")
    with group.join() as domain:
        tx = domain.connect(peer_id, timeout=5)
        path = domain.path()
        buf = path.alloc(1920 * 1080 * 3)
        frame = np.frombuffer(buf, dtype=np.uint8).reshape(1080, 1920, 3)
        frame[...] = 7
        del frame                      # freeze() refuses while writable views exist
        tx.send(buf.freeze())

    # in the consumer
    msg = rx.recv(timeout=1)
    img = np.frombuffer(msg, dtype=np.uint8).reshape(1080, 1920, 3)  # read-only, no copy

Named services work the same way: ``ferry.Publisher(domain, "camera/front")`` and
``ferry.Subscriber(domain, "camera/front")`` for publish-subscribe,
``ferry.Server(domain, "resize")`` and ``ferry.Client(domain, "resize").call(msg)`` for
request-response.

A view keeps its message (and the mapping under it) alive; the fbuf returns to the
producer when the last view is gone.
"""

from __future__ import annotations

from . import errors
from ._ferry import (
    Buffer,
    Client,
    Domain,
    Fds,
    Fragment,
    Group,
    Loan,
    Message,
    Path,
    Publisher,
    Receiver,
    Request,
    Sender,
    Server,
    Subscriber,
    MAX_FDS,
    __version__,
    copy_stats,
)
from .errors import (
    AddressInUse,
    AlreadyMember,
    BadServiceTable,
    NoSuchService,
    RequestFailed,
    ServiceExists,
    ServiceFull,
    ServiceTableFull,
    BadDescriptor,
    BadGroup,
    Disconnected,
    FdRefused,
    FdsLost,
    FerryError,
    Full,
    GroupFull,
    InvalidArgument,
    LotExhausted,
    PeerGone,
    QuotaExceeded,
    Timeout,
    TooManyFds,
)

__all__ = [
    "Buffer",
    "Client",
    "Domain",
    "Fds",
    "MAX_FDS",
    "FdRefused",
    "FdsLost",
    "TooManyFds",
    "Publisher",
    "Request",
    "Server",
    "Subscriber",
    "AlreadyMember",
    "BadServiceTable",
    "NoSuchService",
    "RequestFailed",
    "ServiceExists",
    "ServiceFull",
    "ServiceTableFull",
    "Fragment",
    "Group",
    "Loan",
    "Message",
    "Path",
    "Receiver",
    "Sender",
    "copy_stats",
    "errors",
    "AddressInUse",
    "BadDescriptor",
    "BadGroup",
    "Disconnected",
    "FerryError",
    "Full",
    "GroupFull",
    "InvalidArgument",
    "LotExhausted",
    "PeerGone",
    "QuotaExceeded",
    "Timeout",
    "__version__",
]
