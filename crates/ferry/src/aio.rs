//! Async endpoints for tokio (the `tokio` cargo feature).
//!
//! Each wrapper registers its endpoint's wait descriptor with tokio's reactor
//! ([`AsyncFd`]) and awaits it between non-blocking attempts, following the same
//! protocol any epoll loop would: `try_*` until nothing is ready, `arm()`, wait for
//! readability only if `arm()` said so, repeat. The descriptors are the ones the plain
//! endpoints hand out through [`AsFd`], so nothing here is hidden from
//! an epoll loop of one's own.
//!
//! ```no_run
//! use std::time::Duration;
//! use ferry::aio::AsyncSubscriber;
//! use ferry::Subscriber;
//! use ferry::Group;
//!
//! # async fn run() -> ferry::Result<()> {
//! let group = Group::open("demo")?;
//! let domain = group.join()?;
//! let mut sub = AsyncSubscriber::new(Subscriber::open(&domain, "camera/front", Duration::from_secs(5))?)?;
//! loop {
//!     match tokio::time::timeout(Duration::from_secs(1), sub.recv()).await {
//!         Ok(frame) => println!("{} bytes", frame?.len()),
//!         Err(_elapsed) => println!("no frame for a second"),
//!     }
//! }
//! # }
//! ```
//!
//! # What wakes a waiting task
//!
//! A receiver's descriptor is an epoll set over the channel's eventfd and the sender's
//! pidfd, so a task waits for a message, for the sender closing its end (then
//! [`Error::Disconnected`]) and for the sender's death (then [`Error::PeerGone`], once
//! the messages it sent are taken): a dead peer never leaves a task hanging.
//! Releases of received messages go back when the [`IoData`] is dropped, as with the
//! blocking calls; releases that found the reverse ring full wake the task when the
//! sender makes room ([`Receiver::arm`]). A sender waiting for room (ring full) sleeps
//! on the eventfd the receiver notifies and on the receiver's pidfd.
//!
//! Two things a blocking `recv` does while asleep are not done while a task awaits:
//! waking for *other* channels' releases (this domain's senders collect those when they
//! send, allocate or call `collect_releases`), and re-reading the ledgers every few
//! milliseconds while a dead peer's fragments sit in quarantine (done on the next
//! receive). Neither loses anything; each only happens later.
//!
//! # Cancellation
//!
//! Every future here is cancel safe in the sense tokio uses: the only await point is the
//! wait for readiness, and a message is taken off a ring only in the same synchronous
//! step that returns it. Dropping a `recv()` future (say, when `tokio::time::timeout`
//! expires, or in a `select!`) loses no message: the next `recv()` gets it. Dropping
//! [`AsyncClient::call`] abandons that request; its late response is recognised by its
//! id and discarded by a later call. Dropping [`AsyncSender::send`] while it waits sends
//! nothing.
//!
//! # Publishing
//!
//! [`AsyncPublisher::publish`] hands the message to every subscriber with room at once
//! and, under [`SlowSubscriber::Block`](crate::SlowSubscriber), awaits room in each full
//! queue in turn (an epoll set over that channel's eventfd and the subscriber's pidfd, so
//! a subscriber that dies while the task waits is reclaimed and the publish goes on).
//! Under `SlowSubscriber::Drop` it never waits. Subscribers keep joining while a publish
//! waits; they get the messages after it. Dropped while it waits, a publish has reached
//! the subscribers that had room and the full queues it had already waited for, and not
//! the others: the same partial delivery a `publish_timeout` that times out leaves
//! (counted in [`PublisherStats::delivered`](crate::service::PublisherStats), not in `published`).
//!
//! All constructors must run inside a tokio runtime with I/O enabled
//! (`enable_io()`, or `enable_all()`); [`AsyncFd`] panics otherwise.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::channel::{Receiver, Sender};
use crate::error::{Error, Result};
use crate::iodata::IoData;
use crate::service::{Client, Publisher, Request, Server, Subscriber};

/// An endpoint whose descriptor says when to try again: `arm` prepares the wait.
trait Armed: AsRawFd {
    /// False if the next attempt should not wait (something is ready).
    fn arm(&mut self) -> Result<bool>;
}

/// Endpoints whose [`AsRawFd`] is one descriptor they own, open and unchanged for as
/// long as they live (the wrappers below never hand out `&mut` to them, so nobody can
/// swap one for another while registered).
trait FixedFd: AsRawFd {}
impl FixedFd for RoomFd {}

fn register<T: FixedFd>(inner: T) -> Result<AsyncFd<T>> {
    // SAFETY: `FixedFd`: the descriptor is owned by `inner`, stays open and the same
    // until `inner` is dropped, which the `AsyncFd` does (or `into_inner` returns it).
    let fd = unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) };
    fd.map_err(|e| Error::Io(e.into_parts().1))
}

/// Tries `step` until it yields, awaiting the endpoint's descriptor in between.
async fn until<T: Armed, R>(
    fd: &mut AsyncFd<T>,
    mut step: impl FnMut(&mut T) -> Result<Option<R>>,
) -> Result<R> {
    loop {
        if let Some(r) = step(fd.get_mut())? {
            return Ok(r);
        }
        if !fd.get_mut().arm()? {
            continue;
        }
        // Readiness that came after the guard's tick is kept by `clear_ready`, so a
        // wake-up between `arm` and here is not lost.
        let mut ready = fd.readable_mut().await?;
        ready.clear_ready();
    }
}

/// An async wrapper: the struct, its constructor, and access to the plain endpoint.
macro_rules! wrapper {
    ($(#[$doc:meta])* $name:ident, $inner:ty) => {
        $(#[$doc])*
        pub struct $name {
            fd: AsyncFd<$inner>,
        }

        impl $name {
            /// Registers `inner` with the current tokio runtime.
            pub fn new(inner: $inner) -> Result<$name> {
                Ok($name {
                    fd: register(inner)?,
                })
            }

            /// The plain endpoint.
            pub fn get_ref(&self) -> &$inner {
                self.fd.get_ref()
            }

            /// Unregisters from the runtime and gives the plain endpoint back.
            pub fn into_inner(self) -> $inner {
                self.fd.into_inner()
            }
        }

        impl Armed for $inner {
            fn arm(&mut self) -> Result<bool> {
                <$inner>::arm(self)
            }
        }

        // Each of these owns its descriptor (a receiver's or a server's epoll set) for
        // life, and the wrapper never lends it out mutably.
        impl FixedFd for $inner {}

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_tuple(stringify!($name))
                    .field(self.fd.get_ref())
                    .finish()
            }
        }
    };
}

wrapper!(
    /// A channel [`Receiver`] whose receive can be awaited.
    AsyncReceiver,
    Receiver
);

impl AsyncReceiver {
    /// Receives the next message. Cancel safe.
    ///
    /// # Errors
    /// As [`Receiver::try_recv`]: [`Error::PeerGone`] once the sender died and its
    /// messages were taken, [`Error::Disconnected`] once it closed its end.
    pub async fn recv(&mut self) -> Result<IoData> {
        until(&mut self.fd, Receiver::try_recv).await
    }

    /// [`Receiver::try_recv`]: the next message if one is ready, never waiting.
    pub fn try_recv(&mut self) -> Result<Option<IoData>> {
        self.fd.get_mut().try_recv()
    }
}

wrapper!(
    /// A [`Subscriber`] whose receive can be awaited.
    AsyncSubscriber,
    Subscriber
);

impl AsyncSubscriber {
    /// Receives the next published message. Cancel safe.
    ///
    /// # Errors
    /// As [`Subscriber::try_recv`]: [`Error::PeerGone`] once the publisher died,
    /// [`Error::Disconnected`] once it withdrew the service.
    pub async fn recv(&mut self) -> Result<IoData> {
        until(&mut self.fd, Subscriber::try_recv).await
    }

    /// [`Subscriber::try_recv`]: the next message if one is queued, never waiting.
    pub fn try_recv(&mut self) -> Result<Option<IoData>> {
        self.fd.get_mut().try_recv()
    }
}

wrapper!(
    /// A request-response [`Client`] whose calls can be awaited.
    AsyncClient,
    Client
);

impl AsyncClient {
    /// Sends `request` and awaits its response. Wrap it in `tokio::time::timeout` for
    /// a deadline; dropping the future abandons the request (its late response is
    /// discarded by a later call).
    ///
    /// # Errors
    /// [`Error::Full`] if the request queue is full (only when that many earlier
    /// requests were abandoned and the server has not taken them),
    /// [`Error::RequestFailed`] if the server's handler failed,
    /// [`Error::PeerGone`]/[`Error::Disconnected`] if the server died or withdrew.
    pub async fn call(&mut self, request: &IoData) -> Result<IoData> {
        let id = self.fd.get_mut().try_send_request(request)?;
        until(&mut self.fd, |c| loop {
            match c.try_response()? {
                None => return Ok(None),
                Some(r) if r.id == id => {
                    return r
                        .result
                        .map(Some)
                        .map_err(|status| Error::RequestFailed { status })
                }
                Some(_) => {} // the late answer to an abandoned request
            }
        })
        .await
    }
}

wrapper!(
    /// A request-response [`Server`] whose receive can be awaited.
    AsyncServer,
    Server
);

impl AsyncServer {
    /// Receives the next request from any client. Cancel safe. Clients that die or
    /// leave are dropped on the way, as by [`Server::try_recv`].
    pub async fn recv(&mut self) -> Result<Request> {
        until(&mut self.fd, Server::try_recv).await
    }

    /// [`Server::try_recv`]: the next request if one is queued, never waiting.
    pub fn try_recv(&mut self) -> Result<Option<Request>> {
        self.fd.get_mut().try_recv()
    }

    /// Tells the client of `request` that it failed ([`Server::fail`]).
    pub fn fail(&mut self, request: &Request, status: u32) -> Result<()> {
        self.fd.get_mut().fail(request, status)
    }

    /// Answers `request` ([`Server::reply`]). This does not await: a client's response
    /// queue has room for every request it has outstanding unless it abandoned more
    /// than the queue's depth, and then this waits up to
    /// [`ServiceConfig::reply_timeout`](crate::ServiceConfig::reply_timeout).
    pub fn reply(&mut self, request: &Request, response: &IoData) -> Result<()> {
        self.fd.get_mut().reply(request, response)
    }
}

/// The wait set of an [`AsyncSender`]: the eventfd the receiver notifies when the ring
/// drains, and the receiver's pidfd.
struct RoomFd(OwnedFd);

impl AsRawFd for RoomFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A channel [`Sender`] whose send can await room in a full ring.
pub struct AsyncSender {
    tx: Sender,
    fd: AsyncFd<RoomFd>,
}

impl std::fmt::Debug for AsyncSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AsyncSender").field(&self.tx).finish()
    }
}

/// Ends a wait for room however the future ends (woken or dropped).
struct RoomWait<'a>(&'a Sender);

impl Drop for RoomWait<'_> {
    fn drop(&mut self) {
        self.0.end_room_wait();
    }
}

impl AsyncSender {
    /// Registers `tx` with the current tokio runtime (one epoll set over its two wait
    /// descriptors).
    pub fn new(tx: Sender) -> Result<AsyncSender> {
        let ep = crate::sys::fd::wait_set(&tx.room_fds())?;
        Ok(AsyncSender {
            fd: register(RoomFd(ep))?,
            tx,
        })
    }

    /// Sends `data`, awaiting room while the ring is full. Cancel safe: dropped while
    /// it waits, it has sent nothing.
    ///
    /// # Errors
    /// As [`Sender::try_send`]: [`Error::PeerGone`] if the receiver died (everything
    /// it held is reclaimed), [`Error::Disconnected`] if it closed its end.
    pub async fn send(&self, data: &IoData) -> Result<()> {
        send_awaiting_room(&self.tx, &self.fd, data).await
    }

    /// The plain sender, for its other calls.
    pub fn get_ref(&self) -> &Sender {
        &self.tx
    }

    /// Unregisters from the runtime and gives the plain sender back.
    pub fn into_inner(self) -> Sender {
        self.tx
    }
}

/// Sends `data` on `tx`, awaiting `fd` (an epoll set over `tx`'s
/// [`room_fds`](Sender::room_fds)) while the ring is full. Dropped while it waits, it has
/// sent nothing.
async fn send_awaiting_room(tx: &Sender, fd: &AsyncFd<RoomFd>, data: &IoData) -> Result<()> {
    loop {
        match tx.try_send(data) {
            Err(Error::Full) => {}
            other => return other,
        }
        if !tx.begin_room_wait()? {
            continue;
        }
        let wait = RoomWait(tx);
        let mut ready = fd.readable().await?;
        ready.clear_ready();
        drop(wait);
        if crate::sys::fd::exited(tx.room_fds()[1]) {
            return Err(tx.peer_died());
        }
    }
}

/// A [`Publisher`] whose publish awaits room in full queues (see [Publishing](self#publishing)).
pub struct AsyncPublisher {
    publisher: Publisher,
}

impl std::fmt::Debug for AsyncPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AsyncPublisher")
            .field(&self.publisher)
            .finish()
    }
}

impl AsyncPublisher {
    /// Wraps `publisher`; its waits register with the current tokio runtime.
    pub fn new(publisher: Publisher) -> AsyncPublisher {
        AsyncPublisher { publisher }
    }

    /// Publishes `data` to every subscriber, awaiting room in full queues under
    /// [`SlowSubscriber::Block`](crate::SlowSubscriber) (never under `Drop`). Returns how
    /// many subscribers were handed the message; one that died or left meanwhile is
    /// dropped and not counted.
    ///
    /// # Errors
    /// As [`Publisher::publish`].
    pub async fn publish(&mut self, data: &IoData) -> Result<usize> {
        let mut p = self.publisher.publish_start(data, &[])?;
        for i in 0..p.full.len() {
            let r = async {
                let tx = &p.full[i];
                // Its own epoll set for each wait: a wait is the slow path, and the set of
                // full queues changes from one publish to the next.
                let fd = register(RoomFd(crate::sys::fd::wait_set(&tx.room_fds())?))?;
                send_awaiting_room(tx, &fd, &p.data).await
            }
            .await;
            self.publisher.settle(&mut p, i, r)?;
        }
        self.publisher.publish_end(p)
    }

    /// The plain publisher.
    pub fn get_ref(&self) -> &Publisher {
        &self.publisher
    }

    /// The plain publisher, for the calls that take it mutably
    /// ([`collect_releases`](Publisher::collect_releases)).
    pub fn get_mut(&mut self) -> &mut Publisher {
        &mut self.publisher
    }

    /// Gives the plain publisher back.
    pub fn into_inner(self) -> Publisher {
        self.publisher
    }
}

impl AsFd for AsyncSender {
    /// The epoll set this sender waits on for room.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().0.as_fd()
    }
}
