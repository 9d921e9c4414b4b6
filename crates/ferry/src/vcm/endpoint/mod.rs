//! The endpoint: one io_uring, a buffer region, a table of owned sockets, and the status
//! words of the commands placed on it (the VCM's per-application channel).
//!
//! ```
//! use std::net::UdpSocket;
//! use ferry::vcm::{BufRange, Command, Endpoint, EndpointConfig, Status, Vector};
//! # fn main() -> ferry::Result<()> {
//! # if !ferry::uring::Features::probe().ring { return Ok(()); }
//! let a = UdpSocket::bind("127.0.0.1:0")?;
//! let b = UdpSocket::bind("127.0.0.1:0")?;
//! let to = b.local_addr()?;
//! let mut ep = Endpoint::new(EndpointConfig::new(64 * 1024))?;
//! let sa = ep.add_socket(a.into())?;
//! let sb = ep.add_socket(b.into())?;
//! ep.buf_mut(BufRange::new(0, 5))?.copy_from_slice(b"hello");
//! let mut v = Vector::new();
//! v.push(Command::Accept { sock: sb, buf: BufRange::new(4096, 2048) });
//! v.push(Command::Send { sock: sa, buf: BufRange::new(0, 5), to: Some(to) });
//! let ids = ep.submit(&v)?;                 // one io_uring_enter (none under SQPOLL)
//! assert_eq!(ep.wait(ids[0], None)?, Status::Done(5));
//! assert_eq!(ep.buf(BufRange::new(4096, 5))?, b"hello");
//! # Ok(()) }
//! ```
//!
//! Safety story: the region and the `msghdr`s the kernel reads or writes belong to the
//! endpoint. The application reaches the region only through [`Endpoint::buf`] and
//! [`Endpoint::buf_mut`], which refuse ranges that an in-flight command may write (or, for
//! `buf_mut`, touch at all). Dropping the endpoint cancels everything in flight and waits
//! for the cancellations before the region is unmapped.

use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::command::{BufRange, Command, CommandId, Placed, SockHandle, Vector};
use super::status::{Status, StatusWord};
use crate::error::{Error, Result};
use crate::sys::mem::{Access, Mapping};
use crate::uring::ring::{self, Cqe, Drain, Ring};
use crate::uring::RingConfig;

mod commands;
mod sqe;
use commands::{Arming, Commands, Slot};
use sqe::MsgSpace;
#[cfg(test)]
use sqe::{split_user_data, user_data, PART_CANCEL, PART_MAIN, PART_REPLY};

/// How to build an [`Endpoint`].
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// The ring (set `sqpoll_idle_ms` for a kernel thread that polls the submission queue,
    /// so that activating commands needs no system call).
    pub ring: RingConfig,
    /// Bytes of buffer region (rounded up to pages).
    pub region_len: usize,
    /// Most commands (status words) alive at once.
    pub max_commands: u32,
    /// Most sockets registered at once.
    pub max_sockets: u32,
    /// How long [`Endpoint::wait`] spins on the completion ring before it blocks in
    /// `io_uring_enter`.
    pub spin: Duration,
    /// Send with `IORING_OP_SEND_ZC` from the registered region (`buf_index` 0, so the
    /// kernel checks the range against the registration). A command's status is written
    /// only when the kernel's notification says it no longer uses the buffer; copies the
    /// kernel made anyway are counted in [`EndpointStats::zc_copied`]. Without SEND_ZC or a
    /// registered region, sends fall back to plain `SEND` and [`EndpointStats::zc_fallback`]
    /// says so.
    pub zero_copy_send: bool,
}

impl EndpointConfig {
    /// A plain ring of 256 entries, `region_len` bytes of region, 256 commands, 16 sockets,
    /// 20 µs of spinning before blocking.
    pub fn new(region_len: usize) -> EndpointConfig {
        EndpointConfig {
            ring: RingConfig::new(256),
            region_len,
            max_commands: 256,
            max_sockets: 16,
            spin: Duration::from_micros(20),
            zero_copy_send: false,
        }
    }

    /// Uses an SQPOLL ring whose kernel thread sleeps after `idle_ms` without work.
    pub fn sqpoll(mut self, idle_ms: u32) -> EndpointConfig {
        self.ring = self.ring.sqpoll(idle_ms);
        self
    }
}

/// What an endpoint has done, counted by the endpoint itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Vectors activated with [`Endpoint::submit`].
    pub vectors: u64,
    /// Commands placed.
    pub commands: u64,
    /// Loop-command activations ([`Endpoint::activate`]).
    pub activations: u64,
    /// Every `io_uring_enter(2)` made, whatever the reason.
    pub enters: u64,
    /// Enters made only to wake a sleeping SQPOLL thread (`IORING_SQ_NEED_WAKEUP`).
    pub wakeups: u64,
    /// Enters made to block for a completion ([`Endpoint::wait`] after spinning).
    pub waits: u64,
    /// Completions reaped from the completion ring.
    pub completions: u64,
    /// Datagrams that did not fit their buffer.
    pub truncated: u64,
    /// Commands that completed with an error.
    pub failed: u64,
    /// Older messages dropped by accept-multiple in favour of a newer one.
    pub discarded: u64,
    /// Commands refused before submission (bad buffer, socket or target).
    pub refused: u64,
    /// Whether the region is registered with the kernel (`IORING_REGISTER_BUFFERS`).
    pub region_registered: bool,
    /// Zero-copy sends asked for but unavailable (no SEND_ZC or no registered region), so
    /// plain sends are used.
    pub zc_fallback: bool,
    /// Zero-copy sends whose notification arrived.
    pub zc_sends: u64,
    /// Of those, sends the kernel reported it copied anyway
    /// (`IORING_NOTIF_USAGE_ZC_COPIED`; always the case on loopback).
    pub zc_copied: u64,
}

struct SockSlot {
    fd: Option<OwnedFd>,
    generation: u32,
    /// A datagram socket: receives ask for `MSG_TRUNC` (on a stream it discards the data).
    dgram: bool,
}

static NEXT_ENDPOINT: AtomicU32 = AtomicU32::new(1);

/// One application's channel to the kernel: a ring, a registered buffer region, owned
/// sockets, and command status words. See the [module docs](crate::vcm).
pub struct Endpoint {
    ring: Ring,
    id: u32,
    zero_copy: bool,
    spin: Duration,
    sockets: Vec<SockSlot>,
    cmds: Commands,
    stats: EndpointStats,
    /// Unmapped in `Drop` only once the kernel holds no request into it.
    region: ManuallyDrop<Mapping>,
    _region_fd: OwnedFd,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id)
            .field("sqpoll", &self.ring.is_sqpoll())
            .field("region_len", &self.region.len())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Builds the ring, maps and registers the region, and makes sparse tables for
    /// `max_sockets` registered files. Missing kernel features are [`Error::Unsupported`].
    pub fn new(opts: EndpointConfig) -> Result<Endpoint> {
        if opts.max_commands == 0 || opts.max_commands > 1 << 24 {
            return Err(Error::InvalidArgument("max_commands must be 1 ..= 2^24"));
        }
        let len = crate::sys::round_up_pages(opts.region_len.max(1))
            .filter(|&l| l <= u32::MAX as usize)
            .ok_or(Error::InvalidArgument("region_len must fit in 32 bits"))?;
        let mut ring = Ring::new(&opts.ring)?;
        let fd = crate::sys::fd::memfd("ferry-vcm", len as u64)?;
        let region = Mapping::shared(fd.as_fd(), len, Access::ReadWrite)?;
        ring.register_files_sparse(opts.max_sockets.max(1))?;
        let iov = libc::iovec {
            iov_base: region.as_ptr().cast(),
            iov_len: len,
        };
        // SAFETY: the region stays mapped until after the ring is dropped (field order, and
        // `Drop` drains the ring first), so the registered pages outlive the registration.
        let registered = unsafe { ring.register_buffers(&[iov]) }.is_ok();
        let n = opts.max_commands as usize;
        let zero_copy =
            opts.zero_copy_send && registered && crate::uring::Features::probe().send_zc;
        Ok(Endpoint {
            zero_copy,
            ring,
            id: NEXT_ENDPOINT.fetch_add(1, Ordering::Relaxed),
            spin: opts.spin,
            sockets: (0..opts.max_sockets.max(1))
                .map(|_| SockSlot {
                    fd: None,
                    generation: 0,
                    dgram: false,
                })
                .collect(),
            cmds: Commands::new(n),
            stats: EndpointStats {
                region_registered: registered,
                zc_fallback: opts.zero_copy_send && !zero_copy,
                ..EndpointStats::default()
            },
            region: ManuallyDrop::new(region),
            _region_fd: fd,
        })
    }

    /// Length of the buffer region in bytes.
    pub fn region_len(&self) -> usize {
        self.region.len()
    }

    /// True when this endpoint's ring has an SQPOLL kernel thread.
    pub fn is_sqpoll(&self) -> bool {
        self.ring.is_sqpoll()
    }

    /// True when the SQPOLL thread has gone to sleep (the next activation must wake it
    /// with one `io_uring_enter`). Always false without SQPOLL.
    pub fn sqpoll_asleep(&mut self) -> bool {
        self.ring.sq_thread_asleep()
    }

    /// Counters so far.
    pub fn stats(&self) -> EndpointStats {
        EndpointStats {
            enters: self.ring.enters(),
            wakeups: self.ring.wakeups(),
            ..self.stats
        }
    }

    /// Takes ownership of a socket and registers it in the ring's file table
    /// (`IORING_REGISTER_FILES_UPDATE`). Commands name it by the returned handle. Its type
    /// is read once (`SO_TYPE`): receives on datagram sockets report truncation, those on
    /// streams do not. A descriptor that is not a socket is refused (`ENOTSOCK`).
    pub fn add_socket(&mut self, fd: OwnedFd) -> Result<SockHandle> {
        let slot = self
            .sockets
            .iter()
            .position(|s| s.fd.is_none())
            .ok_or(Error::TableFull {
                table: "socket table",
            })?;
        crate::sys::count();
        let dgram = rustix::net::sockopt::socket_type(&fd)? == rustix::net::SocketType::DGRAM;
        self.ring
            .register_files_update(slot as u32, &[fd.as_raw_fd()])?;
        let s = &mut self.sockets[slot];
        s.generation = s.generation.wrapping_add(1);
        s.fd = Some(fd);
        s.dgram = dgram;
        Ok(SockHandle {
            endpoint: self.id,
            slot: slot as u32,
            generation: s.generation,
        })
    }

    /// The socket behind a handle, for socket options.
    pub fn socket(&self, h: SockHandle) -> Result<BorrowedFd<'_>> {
        self.check_socket(h)?;
        Ok(self.sockets[h.slot as usize].fd.as_ref().unwrap().as_fd())
    }

    /// Unregisters a socket and gives it back. Refused while a command using it is in
    /// flight.
    pub fn remove_socket(&mut self, h: SockHandle) -> Result<OwnedFd> {
        self.check_socket(h)?;
        self.poll()?;
        if self
            .cmds
            .slots
            .iter()
            .any(|s| s.inflight > 0 && s.cmd.and_then(|c| c.socket()) == Some(h))
        {
            return Err(Error::Busy { what: "socket" });
        }
        self.ring.register_files_update(h.slot, &[-1])?;
        Ok(self.sockets[h.slot as usize].fd.take().unwrap())
    }

    fn check_socket(&self, h: SockHandle) -> Result<()> {
        match self.sockets.get(h.slot as usize) {
            Some(s) if h.endpoint == self.id && s.fd.is_some() && s.generation == h.generation => {
                Ok(())
            }
            _ => Err(Error::UnknownHandle { what: "socket" }),
        }
    }

    fn check_range(&self, r: BufRange, receive: bool) -> Result<()> {
        if r.end() > self.region.len() as u64 {
            return Err(Error::InvalidArgument(
                "buffer range lies outside the endpoint's region",
            ));
        }
        if receive && r.len == 0 {
            return Err(Error::InvalidArgument("a receive buffer must not be empty"));
        }
        Ok(())
    }

    fn slot_of(&self, id: CommandId) -> Result<&Slot> {
        match self.cmds.slots.get(id.slot as usize) {
            Some(s)
                if id.endpoint == self.id && s.generation == id.generation && s.cmd.is_some() =>
            {
                Ok(s)
            }
            _ => Err(Error::UnknownHandle { what: "command" }),
        }
    }

    fn validate(&self, p: &Placed) -> Result<()> {
        if let Some(h) = p.cmd.socket() {
            self.check_socket(h)?;
        }
        match p.cmd {
            Command::Send { buf, .. } => self.check_range(buf, false)?,
            Command::Accept { buf, .. } | Command::AcceptMultiple { buf, .. } => {
                self.check_range(buf, true)?
            }
            Command::Request { send, reply, .. } => {
                self.check_range(send, false)?;
                self.check_range(reply, true)?;
            }
            Command::AcceptStop { target } => {
                if !self.slot_of(target).is_ok_and(|s| s.looped) {
                    return Err(Error::UnknownHandle {
                        what: "accept-stop target (loop command)",
                    });
                }
            }
        }
        Ok(())
    }

    fn sqes_needed(&self, p: &Placed) -> usize {
        match p.cmd {
            _ if !p.arm => 0,
            Command::Request { .. } | Command::AcceptStop { .. } => 2,
            _ => 1,
        }
    }

    /// Validates every command of `v`, then places them all: one status word each, their
    /// submissions pushed in order, and the vector activated with one `io_uring_enter`
    /// (none under SQPOLL while its thread is awake). If any command is refused, nothing is
    /// placed. Returns the command ids in vector order.
    pub fn submit(&mut self, v: &Vector) -> Result<Vec<CommandId>> {
        for p in &v.commands {
            if let Err(e) = self.validate(p) {
                self.stats.refused += 1;
                return Err(e);
            }
        }
        if v.commands.len() > self.cmds.free.len() {
            return Err(Error::TableFull {
                table: "command table",
            });
        }
        let need: usize = v.commands.iter().map(|p| self.sqes_needed(p)).sum();
        self.reserve(need)?;
        let mut ids = Vec::with_capacity(v.commands.len());
        for (i, p) in v.commands.iter().enumerate() {
            let slot = self.cmds.free.pop().expect("checked above");
            let generation = self
                .cmds
                .slots
                .get(slot as usize)
                .map_or(1, |s| s.generation.wrapping_add(1));
            let cur = match p.cmd {
                Command::Send { buf, .. }
                | Command::Accept { buf, .. }
                | Command::AcceptMultiple { buf, .. } => buf,
                Command::Request { send, .. } => send,
                Command::AcceptStop { .. } => BufRange::new(0, 0),
            };
            let s = Slot {
                generation,
                cmd: Some(p.cmd),
                looped: p.looped,
                inflight: 0,
                seq: 0,
                stopping: false,
                send_err: 0,
                cur,
                source: None,
                probing: false,
                last: Status::Idle,
                stash: None,
                msg: MsgSpace::new(),
            };
            if (slot as usize) < self.cmds.slots.len() {
                self.cmds.slots[slot as usize] = s;
            } else {
                self.cmds.slots.push(s);
            }
            let id = CommandId {
                endpoint: self.id,
                slot,
                generation,
            };
            self.cmds.status[slot as usize].store(Status::Idle, 0);
            if p.arm {
                // Link a send to the next command when that one is a send too.
                let link = matches!(p.cmd, Command::Send { .. })
                    && matches!(
                        v.commands.get(i + 1),
                        Some(Placed {
                            cmd: Command::Send { .. },
                            arm: true,
                            ..
                        })
                    );
                self.arm(slot, link);
            }
            ids.push(id);
        }
        self.stats.vectors += 1;
        self.stats.commands += v.commands.len() as u64;
        self.flush()?;
        Ok(ids)
    }

    /// Re-activates a dormant loop command with a new offset and length (the send range of
    /// a send or request, the receive range of an accept). Under SQPOLL this writes the
    /// submission ring only; otherwise it makes one `io_uring_enter`.
    pub fn activate(&mut self, id: CommandId, range: BufRange) -> Result<()> {
        let s = self.slot_of(id)?;
        if !s.looped {
            return Err(Error::InvalidArgument(
                "only loop commands are re-activated",
            ));
        }
        if s.inflight > 0 {
            return Err(Error::Busy { what: "command" });
        }
        if s.stopping || self.cmds.status[id.slot as usize].load().0 == Status::Stopped {
            return Err(Error::Stopped);
        }
        let cmd = s.cmd.unwrap();
        if let Some(h) = cmd.socket() {
            self.check_socket(h)?;
        }
        if let Command::AcceptStop { target } = cmd {
            // The target may have been released (and its slot reused) since the stop was
            // placed: check it again, as `submit` does.
            if !self.slot_of(target).is_ok_and(|t| t.looped) {
                return Err(Error::UnknownHandle {
                    what: "accept-stop target (loop command)",
                });
            }
        }
        self.check_range(
            range,
            matches!(cmd, Command::Accept { .. } | Command::AcceptMultiple { .. }),
        )?;
        self.reserve(self.sqes_needed(&Placed {
            cmd,
            looped: true,
            arm: true,
        }))?;
        self.cmds.slots[id.slot as usize].cur = range;
        self.arm(id.slot, false);
        self.stats.activations += 1;
        self.flush()
    }

    /// The status of a command: a load from its status word, no system call. Call
    /// [`Endpoint::poll`] to move finished completions into the status words.
    pub fn status(&self, id: CommandId) -> Result<Status> {
        self.slot_of(id)?;
        Ok(self.cmds.status[id.slot as usize].load().0)
    }

    /// The status word itself, for applications that poll it directly.
    pub fn status_word(&self, id: CommandId) -> Result<&StatusWord> {
        self.slot_of(id)?;
        Ok(&self.cmds.status[id.slot as usize])
    }

    /// Where the last message an accept (or request) received came from.
    pub fn source(&self, id: CommandId) -> Result<Option<SocketAddr>> {
        Ok(self.slot_of(id)?.source)
    }

    /// Frees a command's slot and status word. Refused while it is in flight (stop a loop
    /// command first).
    pub fn release(&mut self, id: CommandId) -> Result<()> {
        self.poll()?;
        if self.slot_of(id)?.inflight > 0 {
            return Err(Error::Busy { what: "command" });
        }
        let s = &mut self.cmds.slots[id.slot as usize];
        s.cmd = None;
        self.cmds.status[id.slot as usize].store(Status::Idle, 0);
        self.cmds.free.push(id.slot);
        Ok(())
    }

    /// Moves completions from the completion ring (shared memory) into status words and
    /// returns how many it moved. It makes no system call, except that on a ring without
    /// SQPOLL a receive re-posted by accept-multiple is submitted with one `io_uring_enter`,
    /// and that completions which overflowed a full completion ring are flushed with one.
    pub fn poll(&mut self) -> Result<usize> {
        let mut total = 0;
        let mut reposted = false;
        let mut flushes = 0;
        loop {
            let mut batch = [Cqe::default(); 32];
            let (n, _) = self.ring.reap_into(&mut batch);
            for c in &batch[..n] {
                reposted |= self.complete(c.user_data, c.result, c.flags);
            }
            total += n;
            if n == batch.len() {
                continue;
            }
            // Completions the ring had no room for wait in the kernel (IORING_FEAT_NODROP)
            // until an enter flushes them: a rare syscall, counted like the others.
            if flushes == 4 || !self.ring.cq_overflow() {
                break;
            }
            flushes += 1;
            self.ring.flush()?;
        }
        if reposted {
            self.flush()?;
        }
        Ok(total)
    }

    /// Waits until `id` has a result: spins on [`Endpoint::poll`] for the configured
    /// spin time, then blocks in `io_uring_enter` for completions (counted in
    /// [`EndpointStats::waits`]). `None` waits for ever; past `timeout` it returns
    /// [`Error::Timeout`] and the command stays active, whether it was still spinning
    /// or already blocking.
    pub fn wait(&mut self, id: CommandId, timeout: Option<Duration>) -> Result<Status> {
        let start = Instant::now();
        loop {
            self.poll()?;
            let st = self.status(id)?;
            if st.is_final() || (st == Status::Idle && self.slot_of(id)?.inflight == 0) {
                return Ok(st);
            }
            let waited = start.elapsed();
            // The timeout bounds the spinning too: a spin longer than the timeout (a
            // benchmark's "never block") must not outlast it.
            if matches!(timeout, Some(t) if waited >= t) {
                return Err(Error::Timeout);
            }
            if waited < self.spin {
                std::hint::spin_loop();
                continue;
            }
            let slice = Duration::from_millis(10);
            let step = match timeout {
                Some(t) => (t - waited).min(slice),
                None => slice,
            };
            self.stats.waits += 1;
            self.ring.wait(1, Some(step))?;
        }
    }

    /// The bytes of `r`. Refused while a command may still write into them.
    pub fn buf(&self, r: BufRange) -> Result<&[u8]> {
        self.check_range(r, false)?;
        if self.busy(r, true) {
            return Err(Error::Busy {
                what: "buffer range (a receive may still write it)",
            });
        }
        // SAFETY: the range lies inside the mapping (checked), no in-flight command writes
        // it (checked), and no new one can start while `&self` is borrowed (`activate` and
        // `submit` take `&mut self`).
        Ok(unsafe {
            std::slice::from_raw_parts(self.region.as_ptr().add(r.offset as usize), r.len as usize)
        })
    }

    /// The bytes of `r`, writable. Refused while any command in flight uses them.
    pub fn buf_mut(&mut self, r: BufRange) -> Result<&mut [u8]> {
        self.check_range(r, false)?;
        if self.busy(r, false) {
            return Err(Error::Busy {
                what: "buffer range",
            });
        }
        // SAFETY: inside the mapping, no in-flight command reads or writes it (checked),
        // and `&mut self` keeps new commands and other slices out while this one lives.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(
                self.region.as_ptr().add(r.offset as usize),
                r.len as usize,
            )
        })
    }

    /// Makes room for `n` submissions: flushes (or, under SQPOLL, lets the kernel thread
    /// drain) the submission ring, and fails with [`Error::TableFull`] if it stays full.
    pub(super) fn reserve(&mut self, n: usize) -> Result<()> {
        if n > self.ring.sq_capacity() {
            return Err(Error::TableFull {
                table: "submission queue",
            });
        }
        let start = Instant::now();
        loop {
            if self.ring.sq_free() >= n {
                return Ok(());
            }
            if !self.ring.is_sqpoll() {
                self.flush()?;
            } else if start.elapsed() > Duration::from_secs(1) {
                return Err(Error::TableFull {
                    table: "submission queue",
                });
            } else {
                self.flush()?;
                std::hint::spin_loop();
            }
        }
    }

    /// Hands pushed submissions to the kernel: `io_uring_enter` without SQPOLL, nothing
    /// under SQPOLL unless its thread sleeps (or the kernel asks for a completion flush).
    pub(super) fn flush(&mut self) -> Result<()> {
        self.ring.flush().map(drop)
    }

    /// Pushes the submissions of slot `slot`'s current activation. Space was reserved.
    fn arm(&mut self, slot: u32, link_next: bool) {
        let dgram = self.cmds.slots[slot as usize]
            .cmd
            .and_then(|c| c.socket())
            .is_some_and(|h| self.sockets[h.slot as usize].dgram);
        let arming = Arming {
            base: self.region.as_ptr(),
            zc: self.zero_copy,
            dgram,
        };
        for e in self
            .cmds
            .activate(slot, link_next, arming)
            .into_iter()
            .flatten()
        {
            // SAFETY: every pointer in the entry points into the endpoint's region (range
            // checked) or into this slot's boxed MsgSpace; both stay valid and untouched by
            // safe code until the completion is reaped (`busy` guards the region, a slot is
            // not reused while `inflight > 0`, and `Drop` drains the ring before unmapping).
            unsafe { self.ring.push(&e) }.expect("space was reserved");
        }
    }

    /// Applies one completion; returns true when it re-posted a receive (accept-multiple
    /// looking for a newer message).
    fn complete(&mut self, ud: u64, res: i32, flags: u32) -> bool {
        let Some(slot) = self.cmds.complete(&mut self.stats, ud, res, flags) else {
            return false;
        };
        if self.reserve(1).is_ok() {
            self.arm(slot, false);
            true
        } else {
            self.cmds.stop_probing(&mut self.stats, slot);
            false
        }
    }

    /// True when an in-flight command touches `r` (only receives when `writes_only`).
    fn busy(&self, r: BufRange, writes_only: bool) -> bool {
        self.cmds.slots.iter().any(|s| {
            if s.inflight == 0 {
                return false;
            }
            match s.cmd {
                Some(Command::Send { .. }) => !writes_only && s.cur.overlaps(r),
                Some(Command::Accept { .. }) | Some(Command::AcceptMultiple { .. }) => {
                    s.cur.overlaps(r)
                }
                Some(Command::Request { reply, .. }) => {
                    reply.overlaps(r) || (!writes_only && s.cur.overlaps(r))
                }
                _ => false,
            }
        })
    }
}

impl Drain for Endpoint {
    fn ring(&mut self) -> &mut Ring {
        &mut self.ring
    }

    fn settled(&mut self) -> bool {
        let _ = self.poll();
        self.cmds.inflight == 0
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if ring::drain(self) {
            // SAFETY: no request into the region is left in the kernel, and the region is
            // not used after this point. With requests left (a kernel that would not cancel
            // within the ring core's patience), the mapping is leaked instead of unmapped
            // under the kernel.
            unsafe { ManuallyDrop::drop(&mut self.region) };
        } else {
            // The kernel may still write a receive's source address and flags into the
            // slots' boxed msghdrs: leak them with the region rather than free them.
            std::mem::forget(std::mem::take(&mut self.cmds.slots));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_moves_between_threads() {
        fn send<T: Send>() {}
        send::<Endpoint>();
        send::<crate::vcm::DatagramSocket>();
    }

    /// An accept-stop's second cancel completion can arrive after its target finished,
    /// was released, and its slot went to a new command: that late completion must not
    /// mark the new command stopped.
    #[test]
    fn late_cancel_completion_leaves_the_slots_new_owner_alone() {
        if !crate::uring::Features::probe().ring {
            eprintln!("skipped: no io_uring here");
            return;
        }
        let mut ep = Endpoint::new(EndpointConfig::new(16 * 1024)).unwrap();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = ep.add_socket(sock.into()).unwrap();
        let mut v = Vector::new();
        v.push_loop(Command::Accept {
            sock: s,
            buf: BufRange::new(0, 100),
        });
        let target = ep.submit(&v).unwrap()[0];
        let mut v = Vector::new();
        v.push(Command::AcceptStop { target });
        let stop = ep.submit(&v).unwrap()[0];
        let t = Some(Duration::from_secs(10));
        assert_eq!(ep.wait(stop, t).unwrap(), Status::Done(0));
        assert_eq!(ep.wait(target, t).unwrap(), Status::Stopped);
        // Model one of the stop's two cancel completions as still outstanding.
        ep.cmds.slots[stop.slot as usize].inflight = 1;
        ep.cmds.inflight += 1;
        ep.release(target).unwrap();
        let mut v = Vector::new();
        v.push_dormant(Command::Accept {
            sock: s,
            buf: BufRange::new(4096, 100),
        });
        let new = ep.submit(&v).unwrap()[0];
        assert_eq!(new.slot, target.slot, "the slot was reused");
        let ud = user_data(stop.slot, stop.generation, PART_CANCEL);
        ep.complete(ud, -libc::ENOENT, 0);
        assert_eq!(ep.status(new).unwrap(), Status::Idle);
        ep.activate(new, BufRange::new(4096, 100)).unwrap();
    }

    /// A zero-copy loop send stopped between its result and its notification ends as
    /// `Stopped` (as any stopped loop command), not with the stashed send result.
    #[test]
    fn loop_send_stopped_before_its_notification_reports_stopped() {
        if !crate::uring::Features::probe().ring {
            eprintln!("skipped: no io_uring here");
            return;
        }
        let mut ep = Endpoint::new(EndpointConfig::new(16 * 1024)).unwrap();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = sock.local_addr().unwrap();
        let s = ep.add_socket(sock.into()).unwrap();
        let mut v = Vector::new();
        v.push_dormant(Command::Send {
            sock: s,
            buf: BufRange::new(0, 5),
            to: Some(to),
        });
        let send = ep.submit(&v).unwrap()[0];
        // Model a zero-copy send whose result (with F_MORE) was reaped and whose
        // notification is still to come.
        {
            let sl = &mut ep.cmds.slots[send.slot as usize];
            sl.inflight = 1;
            sl.stash = Some(Status::Done(5));
        }
        ep.cmds.inflight += 1;
        let mut v = Vector::new();
        v.push(Command::AcceptStop { target: send });
        let stop = ep.submit(&v).unwrap()[0];
        let t = Some(Duration::from_secs(10));
        assert_eq!(ep.wait(stop, t).unwrap(), Status::Done(0));
        let notif = 1 << 3; // IORING_CQE_F_NOTIF
        ep.complete(user_data(send.slot, send.generation, PART_MAIN), 0, notif);
        assert_eq!(ep.status(send).unwrap(), Status::Stopped);
        assert_eq!(ep.cmds.slots[send.slot as usize].inflight, 0);
    }

    #[test]
    fn user_data_round_trips() {
        for (slot, generation, part) in [
            (0, 1, PART_MAIN),
            (77, 0xff_ffff, PART_CANCEL),
            (u32::MAX, 5, PART_REPLY),
        ] {
            assert_eq!(
                split_user_data(user_data(slot, generation, part)),
                (slot, generation, part)
            );
        }
    }
}
