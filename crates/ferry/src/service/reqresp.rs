//! Request-response: one [`Server`] per service name, up to
//! [`MAX_MEMBERS`](super::MAX_MEMBERS) [`Client`]s, each with a pair of channels (requests
//! client to server, responses server to client).
//!
//! Each message starts with a 16-byte header fragment in its own fbuf, followed by the
//! payload's fragments untouched (so the payload is never copied): a request header is
//! `"FREQ"`, 0, request id (u64); a response header is `"FRSP"`, status (0: the handler
//! succeeded), the id of the request it answers. Ids let a client that gave up on a
//! request (timeout) recognise and drop its late response.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::epoll;

use super::door::{Admit, HANDSHAKE_PATIENCE};
use super::table::Kind;
use super::{Handler, Membership, Offering, ServiceConfig};
use crate::channel::{FdKinds, Fds, Receiver, Sender};
use crate::error::{Error, Result};
use crate::iodata::IoData;
use crate::region::group::Member;
use crate::region::{Domain, DomainId, PathAllocator, PathConfig};
use crate::sync::lock;
use crate::sys::fd::EventFd;
use crate::until::Until;

const REQ_MAGIC: u32 = u32::from_le_bytes(*b"FREQ");
const RSP_MAGIC: u32 = u32::from_le_bytes(*b"FRSP");
const HEADER: usize = 16;

/// Status a server sends when its handler returned an error.
pub const STATUS_HANDLER_FAILED: u32 = 1;

/// Builds `header ++ body` (the header in a fresh fbuf of `path`).
fn framed(path: &PathAllocator, magic: u32, word: u32, id: u64, body: &IoData) -> Result<IoData> {
    let mut h = path.alloc(HEADER)?;
    let mut b = [0u8; HEADER];
    b[0..4].copy_from_slice(&magic.to_le_bytes());
    b[4..8].copy_from_slice(&word.to_le_bytes());
    b[8..16].copy_from_slice(&id.to_le_bytes());
    h.write_at(0, &b);
    let mut out = h.freeze();
    out.append(body.clone());
    Ok(out)
}

/// Splits a framed message: (word, id, body), or `None` if the header is not `magic`'s.
fn unframe(d: &IoData, magic: u32) -> Option<(u32, u64, IoData)> {
    if d.len() < HEADER {
        return None;
    }
    let mut b = [0u8; HEADER];
    d.copy_range_to_slice(0..HEADER, &mut b);
    let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    (word(0) == magic).then(|| {
        (
            word(4),
            u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            d.slice(HEADER..),
        )
    })
}

/// One client as the server sees it.
struct Conn {
    member: Member,
    tx: Sender,
    rx: Receiver,
}

struct SrvShared {
    domain: Domain,
    config: ServiceConfig,
    conns: Mutex<Vec<Conn>>,
    epoll: OwnedFd,
    /// Notified by the door when a client joins, so a server waiting on the epoll fd
    /// looks at the new connection.
    joined: EventFd,
}

impl Admit for SrvShared {
    fn connected(&self) -> Vec<DomainId> {
        let mut conns = lock(&self.conns);
        // As for publishers: no system call under the lock `try_recv` takes.
        conns.retain(|c| {
            let open = !c.tx.is_closed();
            if !open {
                // The eventfd's file lives on in the client: take it out of the set.
                let _ = epoll::delete(&self.epoll, c.rx.as_fd());
            }
            open
        });
        conns.iter().map(|c| c.member.id).collect()
    }

    fn admit(&self, m: Member) -> Result<()> {
        // The server connects first (responses), then accepts (requests); the client
        // does the opposite, so neither waits for the other's second step.
        let tx =
            self.domain
                .connect_with(m.id, self.config.channel_config(), HANDSHAKE_PATIENCE)?;
        let rx = self.domain.accept_from(m.id, HANDSHAKE_PATIENCE)?;
        epoll::add(
            &self.epoll,
            rx.as_fd(),
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN,
        )?;
        lock(&self.conns).push(Conn { member: m, tx, rx });
        self.joined.notify();
        Ok(())
    }
}

/// A request taken by a [`Server`]: answer it with [`Server::reply`] or
/// [`Server::fail`].
#[derive(Debug, Clone)]
pub struct Request {
    /// The client's domain and process.
    pub client: Member,
    /// The client's id for this request.
    pub id: u64,
    /// The request's payload (the client's fbufs, read-only).
    pub data: IoData,
}

/// Counters of a server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Requests taken.
    pub requests: u64,
    /// Responses sent (with any status).
    pub responses: u64,
    /// Requests whose handler failed.
    pub failed: u64,
    /// Messages dropped because their header was not a request header.
    pub malformed: u64,
    /// Clients removed because they died or left.
    pub departed: u64,
}

/// The serving end of a named request-response service.
///
/// A [`Client`] sends a request [`IoData`](crate::IoData) and gets the response, both
/// zero-copy apart from a 16-byte header fragment (request id, status), with timeouts
/// ([`Error::Timeout`](crate::Error::Timeout)); the server serves its clients in turn,
/// each through a pair of channels its door makes when the client joins. A client that
/// dies is dropped by the server (what it held reclaimed); a server that dies makes its
/// clients' calls fail with [`Error::PeerGone`](crate::Error::PeerGone). Names are
/// offered and found as for a [`Publisher`](crate::Publisher). A
/// [`Handler`](crate::Handler) can run where a [`Placement`](crate::Placement) puts it:
/// called directly in process ([`Caller`](crate::Caller)), or in a server process that
/// runs [`run_server`](crate::run_server).
///
/// Its [`AsFd`] is an epoll descriptor over every client's request queue and the
/// door's join notifications: call [`arm`](Self::arm), wait for it to turn readable,
/// then [`try_recv`](Self::try_recv).
pub struct Server {
    /// First: as for [`Publisher`](super::Publisher), withdrawn before the channels
    /// close.
    offering: Offering,
    shared: Arc<SrvShared>,
    path: PathAllocator,
    cursor: usize,
    stats: ServerStats,
    /// The kinds of descriptor accepted with requests (see [`Server::set_fd_kinds`]).
    fd_kinds: FdKinds,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.offering.entry.name)
            .field("clients", &self.clients().len())
            .finish()
    }
}

impl Server {
    /// Offers request-response service `name` from `domain`.
    ///
    /// # Errors
    /// As [`Publisher::offer`](super::Publisher::offer).
    pub fn offer(domain: &Domain, name: &str, config: ServiceConfig) -> Result<Server> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let joined = EventFd::new()?;
        epoll::add(
            &epoll,
            joined.as_fd(),
            epoll::EventData::new_u64(1),
            epoll::EventFlags::IN,
        )?;
        let shared = Arc::new(SrvShared {
            domain: domain.clone(),
            config,
            conns: Mutex::new(Vec::new()),
            epoll,
            joined,
        });
        let weak: std::sync::Weak<dyn Admit> = Arc::downgrade(&shared) as _;
        let offering = Offering::start(domain, name, Kind::ReqResp, &shared.config, weak)?;
        Ok(Server {
            path: domain.path(PathConfig::default())?,
            shared,
            cursor: 0,
            stats: ServerStats::default(),
            fd_kinds: FdKinds::default(),
            offering,
        })
    }

    /// Takes the next request from any client, never blocking (`Ok(None)` if none).
    /// Clients are served in turn. A client that died or left is dropped here
    /// (everything it held is reclaimed) and does not surface as an error.
    pub fn try_recv(&mut self) -> Result<Option<Request>> {
        self.take(None)
    }

    /// Like [`recv_timeout`](Self::recv_timeout), and takes the descriptors the request
    /// carried (see [`Client::call_with_fds`] for an example).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Server, ServiceConfig};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-srv-fds-{}", std::process::id()))?;
    /// # let d = group.join()?;
    /// let mut server = Server::offer(&d, "frames/srv-fds", ServiceConfig::default())?;
    /// let r = server.recv_with_fds_timeout(Duration::from_millis(10));
    /// assert!(matches!(r, Err(ferry::Error::Timeout)));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`recv_timeout`](Self::recv_timeout); [`Error::FdRefused`] and
    /// [`Error::FdsLost`] as [`Receiver::try_recv_with_fds`] (that request is dropped;
    /// the server goes on serving).
    pub fn recv_with_fds_timeout(&mut self, timeout: Duration) -> Result<(Request, Fds)> {
        let mut fds = Fds::default();
        let r = self.recv_until(timeout, Some(&mut fds))?;
        Ok((r, fds))
    }

    /// Sets the kinds of descriptor accepted with requests, as
    /// [`Receiver::set_fd_kinds`].
    ///
    /// ```
    /// # use ferry::{FdKind, FdKinds, Server, ServiceConfig};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-srv-kinds-{}", std::process::id()))?;
    /// # let d = group.join()?;
    /// let mut server = Server::offer(&d, "frames/srv-kinds", ServiceConfig::default())?;
    /// server.set_fd_kinds(FdKinds::only(FdKind::Memfd));
    /// # Ok(()) }
    /// ```
    pub fn set_fd_kinds(&mut self, kinds: FdKinds) {
        self.fd_kinds = kinds;
    }

    fn take(&mut self, mut cargo: Option<&mut Fds>) -> Result<Option<Request>> {
        let kinds = self.fd_kinds;
        let mut conns = lock(&self.shared.conns);
        let n = conns.len();
        let mut gone = Vec::new();
        let mut found = None;
        for k in 0..n {
            let i = (self.cursor + k) % n;
            match conns[i].rx.take(cargo.as_deref_mut(), kinds) {
                Ok(Some(d)) => match unframe(&d, REQ_MAGIC) {
                    Some((_, id, data)) => {
                        self.cursor = i + 1;
                        found = Some(Request {
                            client: conns[i].member,
                            id,
                            data,
                        });
                        break;
                    }
                    None => self.stats.malformed += 1,
                },
                Ok(None) => {}
                Err(Error::PeerGone { .. } | Error::Disconnected) => gone.push(i),
                // A hostile client's bad descriptor: counted by the channel, skipped.
                Err(Error::BadDescriptor(_)) => self.stats.malformed += 1,
                Err(e) => return Err(e),
            }
        }
        // Highest index first, so that each swap_remove leaves the others in place.
        gone.sort_unstable_by(|a, b| b.cmp(a));
        for &i in &gone {
            let c = conns.swap_remove(i);
            let _ = epoll::delete(&self.shared.epoll, c.rx.as_fd());
            self.stats.departed += 1;
        }
        if found.is_some() {
            self.stats.requests += 1;
        }
        Ok(found)
    }

    /// Waits up to `timeout` for the next request.
    ///
    /// # Errors
    /// [`Error::Timeout`] if none came in time.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Request> {
        self.recv_until(timeout, None)
    }

    fn recv_until(&mut self, timeout: Duration, mut cargo: Option<&mut Fds>) -> Result<Request> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.take(cargo.as_deref_mut())? {
                return Ok(r);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            if !self.arm()? {
                continue;
            }
            // Wake now and then even without events: dead clients are noticed by
            // try_recv's liveness probes.
            let wait = left.min(Duration::from_millis(50));
            crate::sys::fd::wait_readable(&[self.as_fd()], Some(wait))?;
        }
    }

    /// Prepares to wait on [`as_fd`](AsFd::as_fd): false if a request is already
    /// queued (do not wait).
    pub fn arm(&mut self) -> Result<bool> {
        self.shared.joined.drain();
        let mut conns = lock(&self.shared.conns);
        for c in conns.iter_mut() {
            if !c.rx.arm()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Sends `response` to the client of `request`, without copying its payload.
    ///
    /// # Errors
    /// [`Error::PeerGone`] or [`Error::Disconnected`] if the client died or left (the
    /// server goes on serving the others); [`Error::Timeout`] if the client's response
    /// queue stayed full for [`ServiceConfig::reply_timeout`].
    pub fn reply(&mut self, request: &Request, response: &IoData) -> Result<()> {
        self.respond(request, 0, response, &[])
    }

    /// Like [`reply`](Self::reply), with `fds` as cargo (see [`Fds`]).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use std::os::fd::AsFd;
    /// # use ferry::{Client, Server, ServiceConfig};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-reply-fds-{}", std::process::id()))?;
    /// # let (s, c) = (group.join()?, group.join()?);
    /// let mut server = Server::offer(&s, "frames/reply-fds", ServiceConfig::default())?;
    /// let serving = std::thread::spawn(move || -> ferry::Result<()> {
    ///     let (req, _) = server.recv_with_fds_timeout(Duration::from_secs(5))?;
    ///     let (r, _w) = std::io::pipe()?;
    ///     server.reply_with_fds(&req, &req.data, &[r.as_fd()])
    /// });
    /// let mut client = Client::open(&c, "frames/reply-fds", Duration::from_secs(5))?;
    /// let req = c.path(ferry::PathConfig::default())?.alloc(4)?.freeze();
    /// let (_, fds) = client.call_with_fds(&req, &[], Duration::from_secs(5))?;
    /// assert_eq!(fds.kind(0), Some(ferry::FdKind::Pipe));
    /// serving.join().unwrap()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`reply`](Self::reply); [`Error::TooManyFds`].
    pub fn reply_with_fds(
        &mut self,
        request: &Request,
        response: &IoData,
        fds: &[BorrowedFd<'_>],
    ) -> Result<()> {
        self.respond(request, 0, response, fds)
    }

    /// Tells the client of `request` that it failed, with status `status` (non-zero).
    pub fn fail(&mut self, request: &Request, status: u32) -> Result<()> {
        self.stats.failed += 1;
        self.respond(request, status.max(1), &IoData::new(), &[])
    }

    fn respond(
        &mut self,
        request: &Request,
        status: u32,
        body: &IoData,
        fds: &[BorrowedFd<'_>],
    ) -> Result<()> {
        crate::channel::check_fd_count(fds.len())?;
        let msg = framed(&self.path, RSP_MAGIC, status, request.id, body)?;
        let conns = lock(&self.shared.conns);
        let c = conns
            .iter()
            .find(|c| c.member.id == request.client.id)
            .ok_or(Error::PeerGone {
                pid: request.client.pid,
            })?;
        let deadline = Instant::now() + self.shared.config.reply_timeout;
        c.tx.send_until(&msg, fds, Some(deadline))?;
        self.stats.responses += 1;
        Ok(())
    }

    /// Takes one request (waiting up to `timeout`), runs `handler` on it and sends its
    /// result back (or a failure status if it returned an error). A client that died
    /// before its response could be sent is not an error.
    ///
    /// # Errors
    /// [`Error::Timeout`] if no request came.
    pub fn serve_one(&mut self, handler: &mut dyn Handler, timeout: Duration) -> Result<()> {
        let req = self.recv_timeout(timeout)?;
        let sent = match handler.handle(&req.data, &self.path) {
            Ok(resp) => self.reply(&req, &resp),
            Err(_) => self.fail(&req, STATUS_HANDLER_FAILED),
        };
        match sent {
            Err(Error::PeerGone { .. } | Error::Disconnected) => Ok(()),
            other => other,
        }
    }

    /// The allocator the server frames responses from, and hands to handlers.
    pub fn path(&self) -> &PathAllocator {
        &self.path
    }

    /// Clients connected now.
    pub fn clients(&self) -> Vec<Member> {
        lock(&self.shared.conns).iter().map(|c| c.member).collect()
    }

    /// The server's counters.
    pub fn stats(&self) -> ServerStats {
        self.stats.clone()
    }

    /// The service's name.
    pub fn name(&self) -> &str {
        &self.offering.entry.name
    }

    /// Records that this service is imported from another host, `far` naming it (its
    /// host name and zenoh id, at most [`MAX_FAR`](crate::MAX_FAR) bytes, no control
    /// characters): [`ServiceInfo::origin`](crate::ServiceInfo::origin) then says
    /// [`Origin::Bridged`](crate::Origin::Bridged), as `ferry stat` shows. `""` clears
    /// it. For bridges; a claim shown to people, never used to decide anything (see
    /// [`Origin`](crate::Origin)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a description too long or with control
    /// characters, [`Error::BadServiceTable`] if the service's entry was taken over.
    pub fn set_bridged_from(&self, far: &str) -> Result<()> {
        self.offering.set_bridged_from(far)
    }
}

impl AsFd for Server {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.epoll.as_fd()
    }
}

impl AsRawFd for Server {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.shared.epoll.as_raw_fd()
    }
}

/// The calling end of a named request-response service.
///
/// Its [`AsFd`] is the response receiver's wait descriptor (readable on a response or when the
/// server dies; see [`arm`](Self::arm)).
pub struct Client {
    tx: Sender,
    rx: Receiver,
    path: PathAllocator,
    member: Membership,
    next_id: u64,
    /// The kinds of descriptor accepted with responses (see [`Client::set_fd_kinds`]).
    fd_kinds: FdKinds,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("name", &self.member.entry.name)
            .field("server", &self.member.entry.owner)
            .finish()
    }
}

/// A response taken by [`Client::try_response`].
#[derive(Debug, Clone)]
pub struct Response {
    /// The id of the request it answers.
    pub id: u64,
    /// The payload, or [`Error::RequestFailed`] with the server's status.
    pub result: Result<IoData, u32>,
}

impl Client {
    /// Connects `domain` to request-response service `name`, waiting up to `timeout`
    /// for it to be offered and for the server to take the client in.
    ///
    /// # Errors
    /// As [`Subscriber::open`](super::Subscriber::open).
    pub fn open(domain: &Domain, name: &str, timeout: Duration) -> Result<Client> {
        Self::open_until(domain, name, Until::timeout(timeout))
    }

    /// Like [`open`](Self::open), waiting as `until` says (see
    /// [`Subscriber::open_until`](super::Subscriber::open_until)).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_until(domain: &Domain, name: &str, mut until: Until<'_>) -> Result<Client> {
        let (member, turn) = Membership::join(domain, name, Kind::ReqResp, until.part())?;
        let server = member.entry.owner.id;
        let rx = domain.accept_from_until(server, until.part())?;
        let config = ServiceConfig {
            depth: member.entry.depth,
            ..ServiceConfig::default()
        };
        // The server connects back as soon as it took our channel: give it that long
        // even if our own deadline is nearer.
        let tx = domain.connect_until(
            server,
            config.channel_config(),
            until.part_at_least(HANDSHAKE_PATIENCE),
        )?;
        // Held through the connect back too: the server takes our channel by its peer
        // alone, so one domain connects to it for one service at a time.
        drop(turn);
        Ok(Client {
            tx,
            rx,
            path: domain.path(PathConfig::default())?,
            member,
            next_id: 1,
            fd_kinds: FdKinds::default(),
        })
    }

    /// Sends `request` if the request queue has room, never blocking; returns its id.
    ///
    /// # Errors
    /// [`Error::Full`] if the queue is full; [`Error::PeerGone`] or
    /// [`Error::Disconnected`] if the server died or withdrew.
    pub fn try_send_request(&mut self, request: &IoData) -> Result<u64> {
        let id = self.next_id;
        let msg = framed(&self.path, REQ_MAGIC, 0, id, request)?;
        self.tx.try_send(&msg)?;
        self.next_id += 1;
        Ok(id)
    }

    /// Takes the next response if one arrived, never blocking (`Ok(None)` if none).
    ///
    /// # Errors
    /// [`Error::PeerGone`] once the server died, [`Error::Disconnected`] once it
    /// withdrew the service.
    pub fn try_response(&mut self) -> Result<Option<Response>> {
        loop {
            let Some(d) = self.rx.try_recv()? else {
                return Ok(None);
            };
            // Anything that is not a response header is dropped (a broken server).
            if let Some((status, id, body)) = unframe(&d, RSP_MAGIC) {
                let result = if status == 0 { Ok(body) } else { Err(status) };
                return Ok(Some(Response { id, result }));
            }
        }
    }

    /// Sends `request` and waits for its response, at most `timeout` in all.
    ///
    /// # Errors
    /// [`Error::Timeout`] if no response came in time (a late one is dropped when it
    /// comes), [`Error::RequestFailed`] if the server's handler failed, and
    /// [`Error::PeerGone`]/[`Error::Disconnected`] if the server died or withdrew.
    pub fn call(&mut self, request: &IoData, timeout: Duration) -> Result<IoData> {
        self.call_until(request, Until::timeout(timeout))
    }

    /// Like [`call`](Self::call), waiting as `until` says: up to its deadline (none: for
    /// as long as it takes), and only while its stop check lets it
    /// ([`Error::Interrupted`]; the request is then abandoned as on a timeout, and its
    /// late response dropped by a later call).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub fn call_until(&mut self, request: &IoData, until: Until<'_>) -> Result<IoData> {
        self.call_inner(request, &[], until, None)
    }

    /// Like [`call`](Self::call), with `fds` as cargo for the request, and takes the
    /// descriptors the response carried (see [`Fds`]).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use std::os::fd::AsFd;
    /// # use ferry::{Client, Server, ServiceConfig};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-call-fds-{}", std::process::id()))?;
    /// # let (s, c) = (group.join()?, group.join()?);
    /// let mut server = Server::offer(&s, "frames/call-fds", ServiceConfig::default())?;
    /// let serving = std::thread::spawn(move || -> ferry::Result<usize> {
    ///     let (req, fds) = server.recv_with_fds_timeout(Duration::from_secs(5))?;
    ///     server.reply(&req, &req.data)?;
    ///     Ok(fds.len())
    /// });
    /// let mut client = Client::open(&c, "frames/call-fds", Duration::from_secs(5))?;
    /// let (r, _w) = std::io::pipe()?;
    /// let req = c.path(ferry::PathConfig::default())?.alloc(4)?.freeze();
    /// let (_, fds) = client.call_with_fds(&req, &[r.as_fd()], Duration::from_secs(5))?;
    /// assert!(fds.is_empty());
    /// assert_eq!(serving.join().unwrap()?, 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`call`](Self::call); [`Error::TooManyFds`]; [`Error::FdRefused`] and
    /// [`Error::FdsLost`] for the response's descriptors, as
    /// [`Receiver::try_recv_with_fds`].
    pub fn call_with_fds(
        &mut self,
        request: &IoData,
        fds: &[BorrowedFd<'_>],
        timeout: Duration,
    ) -> Result<(IoData, Fds)> {
        self.call_with_fds_until(request, fds, Until::timeout(timeout))
    }

    /// Like [`call_with_fds`](Self::call_with_fds), waiting as `until` says, as
    /// [`call_until`](Self::call_until).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Client, Server, ServiceConfig, Until};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-call-fds-until-{}", std::process::id()))?;
    /// # let (s, c) = (group.join()?, group.join()?);
    /// # let _server = Server::offer(&s, "frames/call-fds-until", ServiceConfig::default())?;
    /// let mut client = Client::open(&c, "frames/call-fds-until", Duration::from_secs(5))?;
    /// let req = c.path(ferry::PathConfig::default())?.alloc(4)?.freeze();
    /// // Nobody answers; the stop check gives up at once.
    /// let mut stop = || true;
    /// let until = Until::timeout(Duration::from_secs(60)).with_stop(&mut stop);
    /// assert!(matches!(
    ///     client.call_with_fds_until(&req, &[], until),
    ///     Err(ferry::Error::Interrupted)
    /// ));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`call_with_fds`](Self::call_with_fds); [`Error::Interrupted`] as
    /// [`call_until`](Self::call_until).
    pub fn call_with_fds_until(
        &mut self,
        request: &IoData,
        fds: &[BorrowedFd<'_>],
        until: Until<'_>,
    ) -> Result<(IoData, Fds)> {
        let mut out = Fds::default();
        let d = self.call_inner(request, fds, until, Some(&mut out))?;
        Ok((d, out))
    }

    /// Sets the kinds of descriptor accepted with responses, as
    /// [`Receiver::set_fd_kinds`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Client, FdKind, FdKinds, Server, ServiceConfig};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-client-kinds-{}", std::process::id()))?;
    /// # let (s, c) = (group.join()?, group.join()?);
    /// # let server = Server::offer(&s, "frames/client-kinds", ServiceConfig::default())?;
    /// let mut client = Client::open(&c, "frames/client-kinds", Duration::from_secs(5))?;
    /// client.set_fd_kinds(FdKinds::only(FdKind::Memfd));
    /// # drop(server);
    /// # Ok(()) }
    /// ```
    pub fn set_fd_kinds(&mut self, kinds: FdKinds) {
        self.fd_kinds = kinds;
    }

    fn call_inner(
        &mut self,
        request: &IoData,
        fds: &[BorrowedFd<'_>],
        mut until: Until<'_>,
        mut cargo: Option<&mut Fds>,
    ) -> Result<IoData> {
        crate::channel::check_fd_count(fds.len())?;
        let id = self.next_id;
        let msg = framed(&self.path, REQ_MAGIC, 0, id, request)?;
        until
            .part()
            .sliced(|slice| self.tx.send_until(&msg, fds, Some(Instant::now() + slice)))?;
        self.next_id += 1;
        self.rx.set_fd_kinds(self.fd_kinds);
        until.sliced(|slice| {
            let d = match cargo.as_deref_mut() {
                None => self.rx.recv_timeout(slice)?,
                Some(out) => {
                    let (d, f) = self.rx.recv_with_fds_timeout(slice)?;
                    *out = f;
                    d
                }
            };
            match unframe(&d, RSP_MAGIC) {
                Some((0, rid, body)) if rid == id => Ok(body),
                Some((status, rid, _)) if rid == id => Err(Error::RequestFailed { status }),
                // The late answer to a request given up on (or not a response): dropped,
                // and the wait goes on as after a slice that brought nothing.
                _ => Err(Error::Timeout),
            }
        })
    }

    /// Like [`call`](Self::call), busy-polling for the response (no system call in
    /// steady state).
    ///
    /// # Errors
    /// As [`call`](Self::call); [`Error::Full`] if the request queue is full.
    pub fn call_spin(&mut self, request: &IoData, timeout: Duration) -> Result<IoData> {
        let deadline = Instant::now() + timeout;
        let id = self.try_send_request(request)?;
        loop {
            if let Some(r) = self.try_response()? {
                if r.id == id {
                    return r.result.map_err(|status| Error::RequestFailed { status });
                }
                continue;
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
            std::hint::spin_loop();
        }
    }

    /// Prepares to wait on [`as_fd`](AsFd::as_fd); false if a response is already
    /// queued. See [`Receiver::arm`].
    pub fn arm(&mut self) -> Result<bool> {
        self.rx.arm()
    }

    /// The server's domain and process.
    pub fn server(&self) -> Member {
        self.member.entry.owner
    }

    /// The service's name.
    pub fn name(&self) -> &str {
        &self.member.entry.name
    }

    /// Records that this member carries the service to other hosts, `far` naming them
    /// (at most [`MAX_FAR`](crate::MAX_FAR) bytes, no control characters):
    /// [`ServiceInfo::origin`](crate::ServiceInfo::origin) then says
    /// [`Origin::Carried`](crate::Origin::Carried), as `ferry stat` shows, until this
    /// member leaves. `""` clears it. For bridges; a claim shown to people, never used to
    /// decide anything (see [`Origin`](crate::Origin)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a description too long or with control characters.
    pub fn set_carried_to(&self, far: &str) -> Result<()> {
        self.member.set_carried_to(far)
    }
}

impl AsFd for Client {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

impl AsRawFd for Client {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.rx.as_raw_fd()
    }
}
