//! [`Passing`]: one domain's output and input operations under a chosen [`Semantics`].

use std::ops::Range;
use std::sync::Arc;

use super::app::{AppBuffer, Hold};
use super::cache::{take_class, Queues};
use super::copyout::copy_into;
pub use super::copyout::InputAlignment;
use super::hide::{self, Hidden};
use super::regions::{describe, Afterwards, RegionGuard, SysBuffer, SysKind};
use super::stats::{add, Counters, Fallback, SemanticsStats, ThresholdSource};
use super::tcow::Engine;
use super::{Allocator, Semantics, Thresholds};
use crate::channel::{Receiver, Sender};
use crate::error::{Error, Result};
use crate::iodata::IoData;
use crate::region::lot::{class_of, Lot};
use crate::region::{Domain, PathAllocator, PathConfig};
use crate::segment::Segment;
use crate::sync::lock;
use crate::sys::page_size;

/// Settings of a [`Passing`].
#[derive(Clone, Debug)]
pub struct PassingConfig {
    /// Thresholds to use; `None` takes [`Thresholds::default`]. The ones `ferry calibrate`
    /// measured are in its file: [`Calibration::load`](super::Calibration::load) reads it.
    /// Stats say which ([`ThresholdSource`]).
    pub thresholds: Option<Thresholds>,
    /// Use TCOW (userfaultfd write protection) for emulated copy. `false` behaves as if
    /// userfaultfd were refused: emulated copy then copies and counts
    /// [`Fallback::NoUserfaultfd`].
    pub tcow: bool,
    /// The path allocator output buffers come from.
    pub path: PathConfig,
    /// Most regions each of the domain's reuse queues (cached, hidden) holds.
    pub cached_regions: usize,
}

impl Default for PassingConfig {
    fn default() -> Self {
        PassingConfig {
            thresholds: None,
            tcow: true,
            path: PathConfig::default(),
            cached_regions: 64,
        }
    }
}

/// How an output was actually done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Used {
    /// The semantics' own mechanism.
    Mechanism,
    /// An emulated form below its threshold: copied.
    ConvertedToCopy,
    /// The mechanism was unavailable: copied (or, for [`Fallback::LockFailed`], passed
    /// without locking), keeping the semantics' promise.
    Fallback(Fallback),
}

/// The domain's reuse queues of output regions, with what they need to reinstate one.
pub(crate) struct Regions {
    q: Queues,
    pub(super) lot: Arc<Lot>,
    limit: usize,
    stats: Arc<Counters>,
}

impl Regions {
    #[cfg(feature = "uring")]
    pub(crate) fn count_hidden(&self) {
        add(&self.stats.regions_hidden, 1);
    }

    pub(crate) fn hidden(&self, h: Hidden) {
        let mut v = lock(&self.q.hidden);
        if v.len() < self.limit {
            v.push(h);
            return;
        }
        drop(v);
        // Full: give the span back to its path, readable again.
        match hide::reinstate(&self.lot, h) {
            Ok(seg) => drop(seg),
            Err(seg) => self.keep_or_lose(seg, false),
        }
    }

    pub(crate) fn cache(&self, seg: Segment) {
        let mut v = lock(&self.q.cached);
        if v.len() < self.limit {
            add(&self.stats.regions_cached, 1);
            v.push(seg);
        }
    }

    /// Frees `seg` if `ok`, else keeps it out of circulation for good.
    pub(crate) fn keep_or_lose(&self, seg: Segment, ok: bool) {
        if !ok {
            add(&self.stats.regions_lost, 1);
            lock(&self.q.lost).push(seg);
        }
    }
}

impl Drop for Regions {
    fn drop(&mut self) {
        // Hidden regions go back to their path readable, or never.
        let hidden = std::mem::take(&mut *lock(&self.q.hidden));
        for h in hidden {
            if let Err(seg) = hide::reinstate(&self.lot, h) {
                // A span whose pages could not come back must never be handed out again.
                std::mem::forget(seg);
            }
        }
    }
}

/// One domain's data passing under Genie's semantics, over ferry channels.
///
/// Output operations take a [`Semantics`] and a buffer of the right kind:
///
/// | operation | semantics | buffer |
/// |---|---|---|
/// | [`send_bytes`](Self::send_bytes) | copy | any `&[u8]`, left with the caller |
/// | [`send_app`](Self::send_app) | copy, emulated copy, share, emulated share | an [`AppBuffer`], left with the caller |
/// | [`send_sys`](Self::send_sys) | move, emulated move, weak move, emulated weak move | a [`SysBuffer`], given up |
///
/// and input operations fill an application buffer ([`recv_into`](Self::recv_into),
/// [`recv_into_app`](Self::recv_into_app)) or return a new system buffer
/// ([`recv_sys`](Self::recv_sys); [`recv_in_place`](Self::recv_in_place) also for share
/// and emulated share, whose weak integrity lets the receiver read the sender's pages in
/// place). What each semantics promises:
///
/// | semantics | buffer during output | buffer after output returns | receiver sees |
/// |---|---|---|---|
/// | copy | the caller's; copied before the call returns | the caller's, free to write | the bytes at the call |
/// | emulated copy | the caller's; at or above the threshold its pages are write-protected (TCOW) until every receiver released them | free to write: a write lands on a fresh copy of the page | the bytes at the call |
/// | share | the caller's, pages locked (`mlock`) until released | free to write | the caller's pages: writes during output may show |
/// | emulated share | the caller's, nothing locked | free to write | as share |
/// | move | given up; its pages leave its address (moved, page tables and all, to one only ferry knows) until released | gone: any access faults | the bytes at the call, as a new buffer |
/// | emulated move | given up; its pages are hidden (moved out as for move) and later reused | gone: any access faults | as move |
/// | weak move | given up; stays mapped, the caller promises not to touch it | gone (by contract) | the pages, no promise about stray writes |
/// | emulated weak move | given up; stays mapped and is queued for reuse | gone (by contract) | as weak move |
///
/// Strong-integrity receivers never see later or partial data; every conversion to copy
/// (below a threshold) and every fallback (a mechanism missing) is counted in
/// [`stats`](Self::stats).
pub struct Passing {
    domain: Domain,
    path: PathAllocator,
    pub(super) thresholds: Thresholds,
    source: ThresholdSource,
    pub(super) engine: Option<Arc<Engine>>,
    tcow_error: Option<String>,
    pub(super) stats: Arc<Counters>,
    pub(super) regions: Arc<Regions>,
    /// This process's id, read once: `getpid` is a system call (glibc stopped caching
    /// it), and output used to ask it on every message.
    pid: u32,
}

impl std::fmt::Debug for Passing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Passing")
            .field("domain", &self.domain.id())
            .field("thresholds", &self.thresholds)
            .field("tcow", &self.engine.is_some())
            .finish()
    }
}

impl Passing {
    /// Sets up passing for `domain`: a path for output buffers, the thresholds, and the
    /// TCOW engine (a userfaultfd and its handler thread) unless unavailable.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] in a group of hugetlb lots
    /// ([`Pages::HugeTlb`](crate::Pages)): the semantics move, hide, write-protect and
    /// replace single 4 KiB pages, which a hugetlb mapping cannot do.
    pub fn new(domain: &Domain, config: PassingConfig) -> Result<Passing> {
        if domain.group().pages() == crate::Pages::HugeTlb {
            return Err(Error::InvalidArgument(
                "Genie's semantics (move, TCOW, hide) work on single 4 KiB pages, which a \
                 group of hugetlb lots cannot protect, move or replace: use a group with \
                 Pages::Normal or Pages::Transparent",
            ));
        }
        let (thresholds, source) = match config.thresholds {
            Some(t) => (t, ThresholdSource::Config),
            None => (Thresholds::default(), ThresholdSource::Defaults),
        };
        let stats = Arc::new(Counters::default());
        let (engine, tcow_error) = if !config.tcow {
            (None, Some("disabled by PassingConfig::tcow".to_owned()))
        } else {
            match Engine::start(stats.clone()) {
                Ok(e) => (Some(e), None),
                Err(e) => (None, Some(format!("userfaultfd refused: {e}"))),
            }
        };
        let path = domain.path(config.path)?;
        let regions = Arc::new(Regions {
            q: Queues::default(),
            lot: path.lot().clone(),
            limit: config.cached_regions,
            stats: stats.clone(),
        });
        Ok(Passing {
            domain: domain.clone(),
            path,
            thresholds,
            source,
            engine,
            tcow_error,
            stats,
            regions,
            pid: std::process::id(),
        })
    }

    /// The domain.
    pub fn domain(&self) -> &Domain {
        &self.domain
    }

    /// The thresholds in use.
    pub fn thresholds(&self) -> Thresholds {
        self.thresholds
    }

    /// Whether emulated copy can use TCOW here (else it copies and counts a fallback).
    pub fn tcow_available(&self) -> bool {
        self.engine.is_some()
    }

    /// How input lines up with the data's pages (see [`InputAlignment`]).
    pub fn input_alignment(&self) -> InputAlignment {
        InputAlignment {
            align: page_size(),
            preserves_page_offset: true,
            swap_at: self.thresholds.swap,
        }
    }

    /// Where `data` starts within a page in the sender's memory (ferry keeps the offset
    /// the sender's buffer had). Received into a page-aligned application buffer at this
    /// offset, its whole pages line up with the buffer's, as page swapping needs.
    pub fn preferred_offset(&self, data: &IoData) -> usize {
        data.fragments()
            .first()
            .and_then(|f| f.lot_span())
            .map_or(0, |s| s.offset as usize % page_size())
    }

    /// The counters.
    pub fn stats(&self) -> SemanticsStats {
        self.stats.snapshot(
            self.thresholds,
            self.source,
            self.tcow_error.clone(),
            self.engine.as_ref().is_some_and(|e| e.user_mode_only()),
        )
    }

    /// A new application buffer of `len` bytes in this domain's lot, for
    /// [`send_app`](Self::send_app). Its bytes are whatever the span last held.
    pub fn app_buffer(&self, len: usize) -> Result<AppBuffer> {
        AppBuffer::new(&self.path, len, self.engine.clone())
    }

    /// A new system buffer of `len` bytes for [`send_sys`](Self::send_sys): a region of
    /// the domain's queue of cached regions (no system call), else a hidden one
    /// (reinstated), else a fresh fbuf of the path.
    pub fn sys_buffer(&self, len: usize) -> Result<SysBuffer> {
        if let Some(seg) = take_class(&self.regions.q.cached, len, |s| s) {
            add(&self.stats.regions_reused, 1);
            return Ok(SysBuffer {
                kind: SysKind::Local { seg, len },
            });
        }
        while let Some(h) = take_class(&self.regions.q.hidden, len, |h: &Hidden| &h.seg) {
            match hide::reinstate(&self.regions.lot, h) {
                Ok(seg) => {
                    add(&self.stats.regions_reinstated, 1);
                    return Ok(SysBuffer {
                        kind: SysKind::Local { seg, len },
                    });
                }
                Err(seg) => self.regions.keep_or_lose(seg, false),
            }
        }
        let (_, size) = class_of(len);
        let seg = self.path.alloc_segment(size)?;
        Ok(SysBuffer {
            kind: SysKind::Local { seg, len },
        })
    }

    /// A guard that keeps `seg` reserved until released.
    pub(super) fn region_guard(&self, seg: Segment, then: Afterwards) -> RegionGuard {
        RegionGuard {
            seg: Some(seg),
            then,
            regions: self.regions.clone(),
        }
    }

    /// Copies `bytes` into a fresh fbuf at the same offset within a page as they have in
    /// memory (see [`InputAlignment`]) and sends it.
    fn copy_send(&self, tx: &Sender, bytes: &[u8], s: Semantics) -> Result<()> {
        let po = bytes.as_ptr() as usize % page_size();
        let mut m = self.path.alloc(po + bytes.len())?;
        m.write_at(po, bytes);
        let d = m.freeze().slice(po..);
        self.stats.copied(s, bytes.len());
        tx.send(&d)
    }

    /// Output under copy semantics of any bytes: they are copied into an fbuf before this
    /// returns, so the caller may reuse `bytes` at once; the receiver gets exactly them.
    pub fn send_bytes(&self, tx: &Sender, bytes: &[u8]) -> Result<()> {
        self.copy_send(tx, bytes, Semantics::Copy)?;
        self.stats.output(Semantics::Copy, bytes.len());
        Ok(())
    }

    /// Decides how an application-allocated output of `range` of `buf` is done, for any
    /// transport: `Ok(None)` means copy (counted as conversion or fallback already);
    /// `Ok(Some(data))` is what to hand over, with the buffer's pages protected (TCOW) or
    /// locked as the semantics says until `data` and its copies are gone.
    pub(super) fn plan_app(
        &self,
        buf: &AppBuffer,
        range: &Range<usize>,
        s: Semantics,
    ) -> Result<(Option<IoData>, Used)> {
        s.expect(Allocator::Application)?;
        if range.start > range.end || range.end > buf.len() {
            return Err(Error::InvalidArgument("range past the buffer"));
        }
        if s != Semantics::Copy && self.thresholds.converts(s, range.len()) {
            // Before anything else: a conversion does exactly what copy does, no more.
            self.stats.converted(s);
            return Ok((None, Used::ConvertedToCopy));
        }
        let app = &buf.inner;
        let pages = app.pages_of(range);
        if s != Semantics::Copy {
            // Pages swapped in from another domain are named by their own lot offsets
            // only once they are copied into ours.
            let n = app.adopt_swapped_in(pages.clone())?;
            if n > 0 {
                add(&self.stats.pages_settled, n as u64);
            }
        }
        let fallback = |why| {
            self.stats.fallback(s, why);
            Ok((None, Used::Fallback(why)))
        };
        match s {
            Semantics::Copy => Ok((None, Used::Mechanism)),
            Semantics::EmulatedCopy => match &self.engine {
                None => fallback(Fallback::NoUserfaultfd),
                Some(e) => match e.arm(app, range) {
                    Ok((epochs, pieces)) => Ok((
                        Some(app.describe_pieces(range.clone(), pieces, Hold::Tcow(epochs))),
                        Used::Mechanism,
                    )),
                    Err(_) => fallback(Fallback::ProtectFailed),
                },
            },
            Semantics::Share if !app.lock_pages(pages) => {
                self.stats.fallback(s, Fallback::LockFailed);
                Ok((
                    Some(app.describe(range.clone(), Hold::Plain)),
                    Used::Fallback(Fallback::LockFailed),
                ))
            }
            Semantics::Share => Ok((
                Some(app.describe(range.clone(), Hold::Locked)),
                Used::Mechanism,
            )),
            _ => Ok((
                Some(app.describe(range.clone(), Hold::Plain)),
                Used::Mechanism,
            )),
        }
    }

    /// The sender's side of an output of `range` of `buf` under `s`, without the send:
    /// what the receiver would be handed (`None` when the semantics copies), as
    /// [`send_app`](Self::send_app) prepares it (for emulated copy: the pages
    /// write-protected through the TCOW engine and described). Dropping the result
    /// releases it as a receiver's release would. For `ferry calibrate`'s probes, through
    /// [`probe::prepare_output`](super::probe::prepare_output).
    pub(crate) fn prepare_output(
        &self,
        buf: &AppBuffer,
        range: Range<usize>,
        s: Semantics,
    ) -> Result<Option<IoData>> {
        Ok(self.plan_app(buf, &range, s)?.0)
    }

    /// Output of `range` of an application buffer, which stays with the application,
    /// under an application-allocated semantics (see the table on [`Passing`]).
    ///
    /// # Errors
    /// [`Error::WrongSemantics`] for a system-allocated semantics,
    /// [`Error::InvalidArgument`] for a range past the buffer; channel errors from
    /// [`Sender::send`].
    pub fn send_app(
        &self,
        tx: &Sender,
        buf: &AppBuffer,
        range: Range<usize>,
        s: Semantics,
    ) -> Result<Used> {
        let (data, used) = self.plan_app(buf, &range, s)?;
        match data {
            Some(d) => tx.send(&d)?,
            None => self.copy_send(tx, &buf.as_slice()[range.clone()], s)?,
        }
        self.stats.output(s, range.len());
        Ok(used)
    }

    /// Output of a system buffer, which the application gives up, under a
    /// system-allocated semantics (see the table on [`Passing`]).
    ///
    /// # Errors
    /// [`Error::WrongSemantics`] for an application-allocated semantics,
    /// [`Error::ReceivedBuffer`] for a received buffer (forward its
    /// [`data`](SysBuffer::data) instead); channel errors.
    pub fn send_sys(&self, tx: &Sender, buf: SysBuffer, s: Semantics) -> Result<Used> {
        s.expect(Allocator::System)?;
        let SysKind::Local { seg, len } = buf.kind else {
            return Err(Error::ReceivedBuffer);
        };
        if len == 0 {
            // Nothing to unmap, hide or queue: the region simply goes back to its path.
            drop(seg);
            tx.send(&IoData::new())?;
            self.stats.output(s, 0);
            return Ok(Used::Mechanism);
        }
        let npages = len.div_ceil(page_size());
        // Asked only by move and emulated move, which cannot hide from a receiver in this
        // same process.
        let same_process = || tx.peer_pid() == self.pid;
        let copy = |seg: Segment, used: Used| -> Result<Used> {
            self.copy_send(tx, &seg.as_slice()[..len], s)?;
            // The region goes back to the path; the application gave it up.
            drop(seg);
            Ok(used)
        };
        let guard = |seg, then| self.region_guard(seg, then);
        let used = match s {
            _ if self.thresholds.converts(s, len) => {
                self.stats.converted(s);
                copy(seg, Used::ConvertedToCopy)?
            }
            Semantics::Move | Semantics::EmulatedMove if same_process() => {
                self.stats.fallback(s, Fallback::SameProcess);
                copy(seg, Used::Fallback(Fallback::SameProcess))?
            }
            Semantics::Move => {
                let gone = super::regions::unmap(&self.regions.lot, &seg, npages);
                match gone {
                    Ok(stash) => {
                        add(&self.stats.regions_unmapped, 1);
                        tx.send(&describe(guard(seg, Afterwards::Remap(stash)), len))?;
                        Used::Mechanism
                    }
                    Err(_) => {
                        self.stats.fallback(s, Fallback::HideFailed);
                        copy(seg, Used::Fallback(Fallback::HideFailed))?
                    }
                }
            }
            Semantics::EmulatedMove => match hide::hide(&self.regions.lot, &seg, npages) {
                Ok(stash) => {
                    add(&self.stats.regions_hidden, 1);
                    tx.send(&describe(guard(seg, Afterwards::Hide(stash)), len))?;
                    Used::Mechanism
                }
                Err(_) => {
                    self.stats.fallback(s, Fallback::HideFailed);
                    copy(seg, Used::Fallback(Fallback::HideFailed))?
                }
            },
            Semantics::WeakMove => {
                tx.send(&describe(guard(seg, Afterwards::Free), len))?;
                Used::Mechanism
            }
            _ => {
                tx.send(&describe(guard(seg, Afterwards::Cache), len))?;
                Used::Mechanism
            }
        };
        self.stats.output(s, len);
        Ok(used)
    }

    /// Input under an application-allocated semantics: receives the next message and
    /// copies it into the start of `dst` (see [`InputAlignment`](super::InputAlignment) for why input
    /// copies). Returns its length.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the message is longer than `dst` (it is dropped:
    /// receive with [`Receiver::recv`] and use [`input_into`](Self::input_into) to look at
    /// the length first); channel errors.
    pub fn recv_into(&self, rx: &mut Receiver, s: Semantics, dst: &mut [u8]) -> Result<usize> {
        let data = rx.recv()?;
        self.input_into(&data, s, dst)
    }

    /// Input of already received `data` into the start of `dst`, as
    /// [`recv_into`](Self::recv_into) does.
    pub fn input_into(&self, data: &IoData, s: Semantics, dst: &mut [u8]) -> Result<usize> {
        s.expect(Allocator::Application)?;
        let n = copy_into(data, dst)?;
        self.stats.copied(s, n);
        self.stats.input(s, n);
        Ok(n)
    }

    /// Input into an application buffer at byte `at`: see
    /// [`input_into_app`](Self::input_into_app).
    pub fn recv_into_app(
        &self,
        rx: &mut Receiver,
        s: Semantics,
        dst: &mut AppBuffer,
        at: usize,
    ) -> Result<usize> {
        let data = rx.recv()?;
        self.input_into_app(&data, s, dst, at)
    }

    /// Input of already received `data` into an application buffer at byte `at`. At or
    /// above [`Thresholds::swap`] (never, by default) whole pages whose offset within a
    /// page matches the data's are swapped in (mapped privately from the sender's lot;
    /// see [`InputAlignment`](super::InputAlignment)); partial pages and the rest are copied.
    ///
    /// # Errors
    /// [`Error::WrongSemantics`] for a system-allocated semantics,
    /// [`Error::InvalidArgument`] if the data does not fit from `at`.
    pub fn input_into_app(
        &self,
        data: &IoData,
        s: Semantics,
        dst: &mut AppBuffer,
        at: usize,
    ) -> Result<usize> {
        s.expect(Allocator::Application)?;
        let n = data.len();
        if at > dst.len() || n > dst.len() - at {
            return Err(Error::InvalidArgument(
                "destination is shorter than the message",
            ));
        }
        let swapped = if n >= self.thresholds.swap {
            self.swap_in(data, dst, at)?
        } else {
            Vec::new()
        };
        // Copy what was not swapped (the gaps between swapped ranges of the message).
        let out = &mut dst.as_mut_slice()[at..at + n];
        let mut from = 0;
        for r in swapped.iter().cloned().chain(std::iter::once(n..n)) {
            if r.start > from {
                data.copy_range_to_slice(from..r.start, &mut out[from..r.start]);
                self.stats.copied(s, r.start - from);
            }
            from = r.end;
        }
        self.stats.input(s, n);
        Ok(n)
    }

    /// Swaps in the whole pages of `data` that line up with `dst` from `at`; returns the
    /// message ranges it swapped, in order.
    fn swap_in(&self, data: &IoData, dst: &AppBuffer, at: usize) -> Result<Vec<Range<usize>>> {
        let p = page_size();
        let mut done = Vec::new();
        let mut pos = 0;
        for f in data.fragments() {
            let (start, len) = (pos, f.len());
            pos += len;
            let Some(span) = f.lot_span() else { continue };
            // First page boundary of the destination inside this fragment.
            let d0 = at + start;
            let q = d0.next_multiple_of(p);
            let skip = q - d0;
            if skip >= len || (span.offset as usize + skip) % p != 0 {
                continue;
            }
            let whole = (len - skip) / p;
            if whole == 0 {
                continue;
            }
            let lot = self.domain.inner.resolve(span.lot)?;
            if dst.inner.swap_in(
                q / p,
                whole,
                lot.fd(),
                span.offset + skip as u64,
                f.segment(),
                f.offset() + skip,
            )? {
                add(&self.stats.pages_swapped, whole as u64);
                done.push(start + skip..start + skip + whole * p);
            }
        }
        Ok(done)
    }

    /// Input under a system-allocated semantics: the next message as a new buffer, the
    /// sender's pages read in place (no copy). Dropping it releases them to the sender.
    pub fn recv_sys(&self, rx: &mut Receiver, s: Semantics) -> Result<SysBuffer> {
        s.expect(Allocator::System)?;
        let data = rx.recv()?;
        Ok(self.in_place(data, s))
    }

    /// Input in place, for a receiver that accepts a system buffer instead of naming its
    /// own: the next message as a new buffer that reads the sender's pages where they
    /// are (no copy, no mapping: the receiver's domain maps the sender's lot already).
    /// Dropping it releases the pages to the sender. Counted in
    /// [`SemanticsCounters::inputs_in_place`](super::SemanticsCounters::inputs_in_place).
    ///
    /// Which promises allow it: every system-allocated semantics (this is
    /// [`recv_sys`](Self::recv_sys)), and share and emulated share. Those two promise no
    /// integrity: their receiver may see the sender's later writes to its buffer anyway,
    /// and reading the sender's pages in place shows exactly that: the bytes at output,
    /// or whatever the application wrote into that buffer since (which may be the start
    /// of its next message, if it reuses the buffer before this one is released; an
    /// application that needs the bytes of one message must not write the buffer until
    /// the receiver released it, or must use a strong-integrity form). Copy and emulated copy
    /// are refused: their input is defined as the bytes landing in the application's own
    /// buffer, which [`recv_into`](Self::recv_into) and
    /// [`recv_into_app`](Self::recv_into_app) do (copying out, or swapping pages where
    /// calibration says so); share and emulated share may use those too, and then copy
    /// (counted in [`SemanticsCounters::copied_bytes`](super::SemanticsCounters::copied_bytes)).
    ///
    /// # Errors
    /// [`Error::WrongSemantics`] for copy and emulated copy (nothing is received);
    /// channel errors.
    pub fn recv_in_place(&self, rx: &mut Receiver, s: Semantics) -> Result<SysBuffer> {
        Self::expect_in_place(s)?;
        let data = rx.recv()?;
        Ok(self.in_place(data, s))
    }

    /// Input in place of already received `data`, as [`recv_in_place`](Self::recv_in_place)
    /// does.
    pub fn input_in_place(&self, data: IoData, s: Semantics) -> Result<SysBuffer> {
        Self::expect_in_place(s)?;
        Ok(self.in_place(data, s))
    }

    fn expect_in_place(s: Semantics) -> Result<()> {
        if s.may_input_in_place() {
            return Ok(());
        }
        Err(Error::WrongSemantics {
            semantics: s.name(),
            needs: "weak-integrity or system-allocated",
        })
    }

    fn in_place(&self, data: IoData, s: Semantics) -> SysBuffer {
        self.stats.input(s, data.len());
        self.stats.in_place(s);
        SysBuffer {
            kind: SysKind::Received(data),
        }
    }

    /// A writable buffer with the bytes of `buf` (a received one; a local one is returned
    /// as is): copied into a region from this domain's queues (a cached one, or a hidden
    /// one reinstated), else a fresh fbuf. Counted as copied bytes of `s`.
    pub fn make_writable(&self, buf: SysBuffer, s: Semantics) -> Result<SysBuffer> {
        let SysKind::Received(data) = &buf.kind else {
            return Ok(buf);
        };
        let mut out = self.sys_buffer(data.len())?;
        let n = data.len();
        data.copy_range_to_slice(.., &mut out.as_mut_slice().expect("local")[..n]);
        self.stats.copied(s, n);
        Ok(out)
    }
}
