//! The broker: a privileged process that owns the redirect program, the XSKMAP and the
//! policy, and grants AF_XDP sockets to applications over a Unix socket.
//!
//! Each connection carries one request. The broker checks it and the peer's credentials
//! (`SO_PEERCRED`) against the policy, registers the span of the application's memfd as
//! the UMEM of a new socket, binds it, inserts it in the map and sends it back with
//! `SCM_RIGHTS`. The grant lasts while the connection is open and the process lives
//! (a pidfd): then the map entry goes (the flow returns to the normal stack), and the
//! queue is free again. A refusal closes the connection; nothing a client sends can
//! make the broker wait on it (a connection that says nothing is dropped after
//! [`REQUEST_TIMEOUT`]).

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::bpf::{AttachMode, Redirect, Steer};
use crate::proto::{self, Reply, Request, Status};
use crate::xsk::{make_socket, Geometry};

/// How long a new grant waits for a revoked socket's queue to be let go by the kernel.
pub const QUEUE_SETTLE: Duration = Duration::from_secs(1);

/// How long a connection may take to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// One `grant` line: user `uid` may take `queues` for UDP ports `ports`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The user.
    pub uid: u32,
    /// Queues it may take.
    pub queues: std::ops::RangeInclusive<u32>,
    /// UDP destination ports it may take.
    pub ports: std::ops::RangeInclusive<u16>,
}

/// The broker's policy (see `docs/adc.md` for the file format).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The interface the program is attached to.
    pub interface: String,
    /// How the program is attached.
    pub attach: AttachMode,
    /// How frames are matched to sockets.
    pub steer: Steer,
    /// Try zero-copy binds first.
    pub zerocopy: bool,
    /// Largest UMEM a grant registers (the broker's pages are not charged to the
    /// application's `RLIMIT_MEMLOCK`, so this is the bound).
    pub max_umem: u64,
    /// Largest ring.
    pub max_ring: u32,
    /// Who may take what.
    pub grants: Vec<Grant>,
}

fn range<T: std::str::FromStr + Copy>(s: &str) -> Option<std::ops::RangeInclusive<T>> {
    match s.split_once('-') {
        Some((a, b)) => Some(a.parse().ok()?..=b.parse().ok()?),
        None => {
            let v = s.parse().ok()?;
            Some(v..=v)
        }
    }
}

fn size(s: &str) -> Option<u64> {
    let (n, m) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    n.parse::<u64>().ok()?.checked_mul(m)
}

impl Policy {
    /// Parses a policy file's text.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let mut p = Policy {
            interface: String::new(),
            attach: AttachMode::Drv,
            steer: Steer::UdpPort,
            zerocopy: true,
            max_umem: 64 << 20,
            max_ring: 4096,
            grants: Vec::new(),
        };
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |what: &str| format!("line {}: {what}: {line:?}", i + 1);
            let mut w = line.split_whitespace();
            let key = w.next().unwrap_or("");
            let args: Vec<&str> = w.collect();
            let one = || {
                if args.len() == 1 {
                    Ok(args[0])
                } else {
                    Err(bad("expects one value"))
                }
            };
            match key {
                "interface" => p.interface = one()?.to_string(),
                "attach" => {
                    p.attach = match one()? {
                        "skb" => AttachMode::Skb,
                        "drv" => AttachMode::Drv,
                        _ => return Err(bad("attach is skb or drv")),
                    }
                }
                "steer" => {
                    p.steer = match one()? {
                        "queue" => Steer::Queue,
                        "udp-port" => Steer::UdpPort,
                        _ => return Err(bad("steer is queue or udp-port")),
                    }
                }
                "zerocopy" => {
                    p.zerocopy = match one()? {
                        "auto" => true,
                        "off" => false,
                        _ => return Err(bad("zerocopy is auto or off")),
                    }
                }
                "max-umem" => p.max_umem = size(one()?).ok_or_else(|| bad("a size"))?,
                "max-ring" => {
                    p.max_ring = one()?.parse().map_err(|_| bad("a number"))?;
                }
                "grant" => {
                    let mut g = Grant {
                        uid: u32::MAX,
                        queues: 0..=0,
                        ports: 1..=65535,
                    };
                    for a in &args {
                        let (k, v) = a.split_once('=').ok_or_else(|| bad("key=value"))?;
                        match k {
                            "uid" => g.uid = v.parse().map_err(|_| bad("uid"))?,
                            "queues" => g.queues = range(v).ok_or_else(|| bad("queues"))?,
                            "ports" => g.ports = range(v).ok_or_else(|| bad("ports"))?,
                            _ => return Err(bad("unknown grant key")),
                        }
                    }
                    if g.uid == u32::MAX {
                        return Err(bad("a grant names its uid"));
                    }
                    p.grants.push(g);
                }
                _ => return Err(bad("unknown setting")),
            }
        }
        if p.interface.is_empty() {
            return Err("the policy names no interface".into());
        }
        Ok(p)
    }
}

struct Pending {
    conn: OwnedFd,
    since: Instant,
}

struct Granted {
    conn: OwnedFd,
    pidfd: OwnedFd,
    pid: i32,
    queue: u32,
    key: u32,
    xsk: OwnedFd,
    /// The map entry is in (the application stocked its fill ring).
    armed: bool,
}

/// A running broker.
pub struct Broker {
    policy: Policy,
    redirect: Redirect,
    listener: OwnedFd,
    pending: Vec<Pending>,
    granted: Vec<Granted>,
}

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

impl Broker {
    /// Attaches the program to the policy's interface and listens on `socket` (mode
    /// 0666: any user may ask; the policy decides).
    pub fn new(policy: Policy, socket: &Path) -> io::Result<Broker> {
        let ifindex = crate::sys::ifindex(&policy.interface)?;
        let redirect = Redirect::attach(ifindex, policy.steer, policy.attach)?;
        let _ = std::fs::remove_file(socket);
        let listener = rustix::net::socket_with(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            // Accepted in a loop until none is left: never blocking.
            rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
            None,
        )
        .map_err(errno)?;
        rustix::net::bind(
            &listener,
            &rustix::net::SocketAddrUnix::new(socket).map_err(errno)?,
        )
        .map_err(errno)?;
        rustix::net::listen(&listener, 64).map_err(errno)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))?;
        Ok(Broker {
            policy,
            redirect,
            listener,
            pending: Vec::new(),
            granted: Vec::new(),
        })
    }

    /// Grants in force: (pid, queue, key).
    pub fn grants(&self) -> Vec<(i32, u32, u32)> {
        self.granted
            .iter()
            .map(|g| (g.pid, g.queue, g.key))
            .collect()
    }

    /// Serves until `stop` returns true (checked at least every 100 ms).
    pub fn run(&mut self, mut stop: impl FnMut() -> bool) -> io::Result<()> {
        while !stop() {
            self.step(Duration::from_millis(100))?;
        }
        Ok(())
    }

    /// Waits up to `timeout` for one round of events and handles them.
    pub fn step(&mut self, timeout: Duration) -> io::Result<()> {
        #[derive(Clone, Copy)]
        enum Who {
            Listener,
            Pending(usize),
            Conn(usize),
            Pid(usize),
        }
        let mut who = vec![Who::Listener];
        let mut fds = vec![PollFd::new(&self.listener, PollFlags::IN)];
        for (i, p) in self.pending.iter().enumerate() {
            who.push(Who::Pending(i));
            fds.push(PollFd::new(&p.conn, PollFlags::IN));
        }
        for (i, g) in self.granted.iter().enumerate() {
            who.push(Who::Conn(i));
            fds.push(PollFd::new(&g.conn, PollFlags::IN));
            who.push(Who::Pid(i));
            fds.push(PollFd::new(&g.pidfd, PollFlags::IN));
        }
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: timeout.subsec_nanos() as i64,
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok(()),
            Err(e) => return Err(errno(e)),
        }
        let ready: Vec<(Who, PollFlags)> = who
            .iter()
            .zip(fds.iter())
            .filter(|(_, f)| !f.revents().is_empty())
            .map(|(w, f)| (*w, f.revents()))
            .collect();
        drop(fds);
        let mut serve = Vec::new();
        let mut revoke = Vec::new();
        for (w, ev) in ready {
            match w {
                Who::Listener => {
                    while let Ok(c) = rustix::net::accept_with(
                        &self.listener,
                        rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
                    ) {
                        self.pending.push(Pending {
                            conn: c,
                            since: Instant::now(),
                        });
                    }
                }
                Who::Pending(i) => serve.push(i),
                Who::Conn(i) => {
                    let _ = ev;
                    let g = &mut self.granted[i];
                    // The application says once that its fill ring is stocked: only then
                    // is the flow steered to it (frames before would be dropped). After
                    // that, data or hang-up both end the grant.
                    let mut b = [0u8; 8];
                    let got = rustix::net::recv(&g.conn, &mut b, RecvFlags::DONTWAIT);
                    match got {
                        Ok((1, _)) if !g.armed && b[0] == proto::ARMED => {
                            let ok = self.redirect.insert(g.key, g.xsk.as_fd()).is_ok();
                            let _ = rustix::net::send(
                                &g.conn,
                                &[if ok { proto::ARMED } else { 0 }],
                                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
                            );
                            if ok {
                                g.armed = true;
                            } else {
                                revoke.push((i, "could not be steered"));
                            }
                        }
                        Err(rustix::io::Errno::AGAIN) => {}
                        _ => revoke.push((i, "closed its connection")),
                    }
                }
                Who::Pid(i) => revoke.push((i, "exited")),
            }
        }
        // Newest first, so that indices stay valid.
        revoke.sort_by_key(|r| std::cmp::Reverse(r.0));
        revoke.dedup_by_key(|r| r.0);
        for (i, why) in revoke {
            let g = self.granted.swap_remove(i);
            if g.armed {
                let _ = self.redirect.remove(g.key);
            }
            eprintln!(
                "ferry-adc: revoked pid {} queue {} key {} ({why}); its flow is back on the normal stack",
                g.pid, g.queue, g.key
            );
        }
        serve.sort_unstable_by(|a, b| b.cmp(a));
        for i in serve {
            let p = self.pending.swap_remove(i);
            self.serve(p.conn);
        }
        let now = Instant::now();
        self.pending.retain(|p| now - p.since < REQUEST_TIMEOUT);
        Ok(())
    }

    /// Reads one request from `conn` and answers it.
    fn serve(&mut self, conn: OwnedFd) {
        let refuse = |conn: &OwnedFd, status: Status, message: String| {
            eprintln!("ferry-adc: refused: {message}");
            let r = Reply {
                status,
                queue: u32::MAX,
                zerocopy: false,
                message,
            };
            let _ = rustix::net::send(conn, &r.encode(), SendFlags::NOSIGNAL | SendFlags::DONTWAIT);
        };
        let mut buf = [0u8; 512];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            &conn,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
        );
        let msg = match got {
            Ok(m) => m,
            Err(rustix::io::Errno::AGAIN) => {
                // Woken by a hang-up with nothing to read.
                return;
            }
            Err(e) => return refuse(&conn, Status::Malformed, format!("recvmsg: {e}")),
        };
        let mut fds: Vec<OwnedFd> = Vec::new();
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(r) = m {
                fds.extend(r);
            }
        }
        if msg.bytes == 0 && fds.is_empty() {
            return;
        }
        if msg.flags.contains(rustix::net::ReturnFlags::CTRUNC) || fds.len() != 1 {
            return refuse(
                &conn,
                Status::Malformed,
                format!(
                    "a request carries exactly one descriptor (the lot's memfd), this one {}",
                    fds.len()
                ),
            );
        }
        let req = match Request::decode(&buf[..msg.bytes.min(buf.len())]) {
            Ok(r) => r,
            Err(e) => return refuse(&conn, Status::Malformed, e),
        };
        let cred = match rustix::net::sockopt::socket_peercred(&conn) {
            Ok(c) => c,
            Err(e) => return refuse(&conn, Status::Malformed, format!("SO_PEERCRED: {e}")),
        };
        let uid = cred.uid.as_raw();
        let pid = cred.pid.as_raw_nonzero().get();
        match self.grant(&req, uid, pid, fds.remove(0)) {
            Ok((xsk, queue, key, zerocopy, pidfd)) => {
                let r = Reply {
                    status: Status::Ok,
                    queue,
                    zerocopy,
                    message: format!(
                        "queue {queue} of {} ({}), key {key}",
                        self.policy.interface,
                        if zerocopy { "zero-copy" } else { "copy mode" }
                    ),
                };
                let bytes = r.encode();
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
                let mut control = SendAncillaryBuffer::new(&mut space);
                let one = [xsk.as_fd()];
                control.push(SendAncillaryMessage::ScmRights(&one));
                if rustix::net::sendmsg(
                    &conn,
                    &[IoSlice::new(&bytes)],
                    &mut control,
                    SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
                )
                .is_err()
                {
                    eprintln!("ferry-adc: pid {pid} went before its grant was sent");
                    return;
                }
                eprintln!("ferry-adc: granted pid {pid} uid {uid} {}", r.message);
                self.granted.push(Granted {
                    conn,
                    pidfd,
                    pid,
                    queue,
                    key,
                    xsk,
                    armed: false,
                });
            }
            Err((status, message)) => refuse(&conn, status, message),
        }
    }

    #[allow(clippy::type_complexity)]
    fn grant(
        &self,
        req: &Request,
        uid: u32,
        pid: i32,
        memfd: OwnedFd,
    ) -> Result<(OwnedFd, u32, u32, bool, OwnedFd), (Status, String)> {
        let p = &self.policy;
        let malformed = |m: String| (Status::Malformed, m);
        if req.interface != p.interface {
            return Err((
                Status::Policy,
                format!("this broker serves {}, not {}", p.interface, req.interface),
            ));
        }
        if req.frame != 2048 && req.frame != 4096 {
            return Err(malformed(format!(
                "frame size {} (2048 or 4096)",
                req.frame
            )));
        }
        if !req.ring.is_power_of_two() || req.ring < 16 || req.ring > p.max_ring {
            return Err(malformed(format!(
                "ring of {} entries (a power of two, 16 to {})",
                req.ring, p.max_ring
            )));
        }
        let page = rustix::param::page_size() as u64;
        if req.len == 0 || req.len % req.frame as u64 != 0 || req.offset % page != 0 {
            return Err(malformed(format!(
                "UMEM at {} of {} bytes (page-aligned, a multiple of the frame size)",
                req.offset, req.len
            )));
        }
        if req.len > p.max_umem {
            return Err((
                Status::Policy,
                format!("UMEM of {} bytes exceeds max-umem {}", req.len, p.max_umem),
            ));
        }
        // A memfd (only shmem files have seals), large enough for the span.
        if rustix::fs::fcntl_get_seals(&memfd).is_err() {
            return Err(malformed("the descriptor is not a memfd".into()));
        }
        let st = rustix::fs::fstat(&memfd).map_err(|e| malformed(format!("fstat: {e}")))?;
        if req
            .offset
            .checked_add(req.len)
            .map_or(true, |end| end > st.st_size as u64)
        {
            return Err(malformed(format!(
                "UMEM at {}+{} lies beyond the memfd's {} bytes",
                req.offset, req.len, st.st_size
            )));
        }
        let mine: Vec<&Grant> = p.grants.iter().filter(|g| g.uid == uid).collect();
        if mine.is_empty() {
            return Err((Status::Policy, format!("uid {uid} has no grant")));
        }
        let port_ok = |g: &&&Grant| p.steer == Steer::Queue || g.ports.contains(&req.port);
        let allowed: Vec<u32> = mine
            .iter()
            .filter(port_ok)
            .flat_map(|g| g.queues.clone())
            .filter(|q| req.queue.map_or(true, |w| w == *q))
            .collect();
        if allowed.is_empty() {
            return Err((
                Status::Policy,
                format!(
                    "uid {uid} may not take port {} on queue {:?}",
                    req.port, req.queue
                ),
            ));
        }
        let taken: HashMap<u32, ()> = self.granted.iter().map(|g| (g.queue, ())).collect();
        let Some(queue) = allowed.into_iter().find(|q| !taken.contains_key(q)) else {
            return Err((
                Status::Busy,
                "every queue this user may take is held by another application".into(),
            ));
        };
        let key = match p.steer {
            Steer::Queue => queue,
            Steer::UdpPort => req.port as u32,
        };
        if self.granted.iter().any(|g| g.key == key) {
            return Err((
                Status::Busy,
                format!("port {} is held by another application", req.port),
            ));
        }
        let pidfd = rustix::process::pidfd_open(
            rustix::process::Pid::from_raw(pid).ok_or_else(|| malformed("no pid".into()))?,
            rustix::process::PidfdFlags::empty(),
        )
        .map_err(|e| (Status::Kernel, format!("pidfd_open({pid}): {e}")))?;
        let geometry = Geometry {
            frame: req.frame,
            ring: req.ring,
        };
        // A revoked socket lets go of its queue in deferred kernel work, a little after
        // its last descriptor closed: a bind in between is refused with EBUSY.
        let t0 = Instant::now();
        let (xsk, zc) = loop {
            match make_socket(
                self.redirect.ifindex,
                queue,
                memfd.as_fd(),
                req.offset,
                req.len,
                geometry,
                p.zerocopy,
            ) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && t0.elapsed() < QUEUE_SETTLE => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => {
                    break other.map_err(|e| {
                        (
                            Status::Kernel,
                            format!("AF_XDP socket on queue {queue}: {e}"),
                        )
                    })?
                }
            }
        };
        Ok((xsk, queue, key, zc, pidfd))
    }
}
