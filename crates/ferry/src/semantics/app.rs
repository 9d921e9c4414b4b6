//! Application buffers that ferry can manage: what the application-allocated emulated
//! forms need.
//!
//! Plain [`Copy`](super::Semantics::Copy) takes any `&[u8]`. The other application-
//! allocated forms pass the application's own pages to the receiver, so those pages must
//! lie in this domain's lot (which receivers map read-only) and ferry must be able to
//! write-protect them without touching anyone else's view. An [`AppBuffer`] is that: a
//! span of the lot, and the application's own read-write *view* of it, a separate
//! `MAP_SHARED` mapping of the lot's memfd:
//!
//! ```text
//!  application view  V ──► page 0   page 1   page 2      (its own mapping of the memfd;
//!                          │        │        │            TCOW protects and replaces here)
//!  lot memfd        ... [ o0 ]   [ o1 ]   [ o2 ] ... [ o1' ]  (o1' a fresh page after
//!                          ▲        ▲        ▲                 a write during output)
//!  receivers' RO map ──────┴────────┴────────┘   (read the offsets the descriptor names)
//! ```
//!
//! Write protection is per mapping (checked: a write through another mapping of the
//! same memfd goes through), which is why the view is separate from the lot's main
//! mapping: TCOW protects and replaces pages of the view only, and descriptors name lot
//! offsets, which the receivers read through their own mappings. Each page remembers which
//! lot page backs it now; after TCOW replaced a page the backing differs from the
//! original span, and later outputs name the new offset.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use super::tcow::Engine;
use crate::error::{Error, Result};
use crate::region::lot::Lot;
use crate::region::PathAllocator;
use crate::segment::{Keep, Segment};
use crate::sync::lock;
use crate::sys::mem::{Access, Mapping};
use crate::sys::page_size;

/// One page of an application buffer: the lot page behind it and its output state.
pub(crate) struct Page {
    /// The fbuf holding the lot page that backs this page of the view now.
    pub seg: Arc<Segment>,
    /// Offset of the page within `seg`.
    pub off: usize,
    /// Outputs in flight that write-protect this page (TCOW).
    pub prot: u32,
    /// Bumped when TCOW replaces the page: outputs of an older epoch no longer own it.
    pub epoch: u32,
    /// Outputs in flight that `mlock` this page (share).
    pub locked: u32,
    /// The view maps this page `MAP_PRIVATE` from another domain's lot (swapped in on
    /// input; `seg` is the received fragment, held until the page is mapped over). Before
    /// output such a page is copied to a page of our own lot ([`AppInner::own_copy`]).
    pub private: bool,
}

pub(crate) struct AppState {
    pub pages: Vec<Page>,
    /// Whether the whole view is registered with the TCOW engine's userfaultfd. A page
    /// replaced by `mmap(MAP_FIXED)` is a new, unregistered mapping: register again.
    pub registered: bool,
    /// Some page's backing is no longer the buffer's own fbuf at its own offset (TCOW or
    /// a swap replaced it). Until then byte `i` of the view is byte `i` of `pages[0].seg`,
    /// and an output is one piece found without walking the pages.
    pub diverged: bool,
    /// Pages with `private` set: while there are none, settling before output walks
    /// nothing.
    pub private_pages: usize,
    /// Runs of the view whose page tables TCOW moved out for an output (see
    /// [`tcow`](super::tcow)), until their pages are released.
    pub moved: Vec<super::tcow::Moved>,
}

pub(crate) struct AppInner {
    pub view: Mapping,
    pub len: usize,
    pub lot: Arc<Lot>,
    pub state: Mutex<AppState>,
    pub engine: Option<Arc<Engine>>,
}

impl AppInner {
    pub fn state(&self) -> MutexGuard<'_, AppState> {
        lock(&self.state)
    }

    /// Page indices covering `range` (bytes of the buffer).
    pub fn pages_of(&self, range: &Range<usize>) -> Range<usize> {
        let p = page_size();
        if range.is_empty() {
            return 0..0;
        }
        range.start / p..range.end.div_ceil(p)
    }
}

/// A single page taken from the lot for a page of a view (a TCOW copy, or a swapped-in
/// page settled before output); goes back to the lot when no view page and no output
/// names it any more.
pub(crate) struct LotPage {
    lot: Arc<Lot>,
    off: u64,
}

impl LotPage {
    /// Takes one page from `lot`'s free spans (not from a path: no quota, no collecting
    /// of releases, so the TCOW handler may call it).
    pub fn take(lot: &Arc<Lot>) -> Option<LotPage> {
        Some(LotPage {
            lot: lot.clone(),
            off: lot.take(0, false)?,
        })
    }
}

impl Keep for LotPage {}

impl Drop for LotPage {
    fn drop(&mut self) {
        self.lot.give(0, [self.off]);
    }
}

impl AppInner {
    /// Makes page `i` of the view a page of our own lot holding the same bytes: copies
    /// it into `fresh` and maps `fresh` over it (`mmap(MAP_SHARED | MAP_FIXED)`), in one
    /// step. TCOW does this to a protected page a writer touched; output does it to a
    /// page swapped in from another domain. The page is then unprotected and unlocked,
    /// with a new epoch, and the view needs registering again.
    pub fn own_copy(&self, st: &mut AppState, i: usize, fresh: LotPage) -> std::io::Result<()> {
        let p = page_size();
        let src = self.view.as_ptr().wrapping_add(i * p);
        let dst = self.lot.base().wrapping_add(fresh.off as usize);
        // SAFETY: `src` is a mapped, readable page of the view, which nobody writes now
        // (protected, or the caller holds the buffer); `dst` is the fresh lot page, which
        // nothing else uses.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, p) };
        // SAFETY: page `i` of the view is this buffer's; its new backing holds the same
        // bytes, so every reference into the view reads what it read before.
        unsafe {
            self.view.replace(
                i * p,
                std::os::fd::AsFd::as_fd(self.lot.fd()),
                fresh.off,
                p,
                Access::ReadWrite,
            )?
        };
        let span = crate::segment::LotSpan {
            lot: self.lot.id,
            offset: fresh.off,
        };
        // SAFETY: the lot page stays mapped (the lot's main mapping) while `fresh` lives
        // in the keeper; it is exactly that span; only this buffer's page refers to it.
        let seg = unsafe {
            Segment::from_raw(
                std::ptr::NonNull::new(dst).expect("lot pages are non-null"),
                p,
                Some(span),
                false,
                Arc::new(fresh),
            )
        };
        if st.pages[i].private {
            st.private_pages -= 1;
        }
        st.diverged = true;
        let old = &st.pages[i];
        st.pages[i] = Page {
            seg: Arc::new(seg),
            off: 0,
            prot: 0,
            epoch: old.epoch.wrapping_add(1),
            locked: old.locked,
            private: false,
        };
        st.registered = false;
        Ok(())
    }

    /// Copies every swapped-in page of `pages` to our own lot, so that output can name
    /// them. Fails (nothing half done for any page) if the lot has no page left.
    pub fn adopt_swapped_in(&self, pages: Range<usize>) -> Result<usize> {
        let mut st = self.state();
        let mut n = 0;
        if st.private_pages == 0 {
            return Ok(0);
        }
        for i in pages {
            if !st.pages[i].private {
                continue;
            }
            let fresh = LotPage::take(&self.lot).ok_or(Error::LotExhausted {
                requested: page_size(),
            })?;
            self.own_copy(&mut st, i, fresh)?;
            n += 1;
        }
        Ok(n)
    }

    /// Maps `whole` pages of another domain's lot, from `src_off` of `fd`, privately over
    /// the view from page `first` (`mmap(MAP_PRIVATE | MAP_FIXED)`): page swapping on
    /// input. `held` keeps the pages' message (and so the sender's pages) alive for as
    /// long as the view maps them. Pages under output are left alone: returns false.
    pub fn swap_in(
        &self,
        first: usize,
        whole: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        src_off: u64,
        held: &Arc<Segment>,
        held_off: usize,
    ) -> Result<bool> {
        let p = page_size();
        let mut st = self.state();
        if st.pages[first..first + whole]
            .iter()
            .any(|pg| pg.prot > 0 || pg.locked > 0)
        {
            return Ok(false);
        }
        // SAFETY: the pages are this buffer's (the caller holds it mutably), under no
        // output; the private mapping shows the received bytes, which their sender keeps
        // unchanged while `held` (the message) lives, and `held` lives in the page table.
        unsafe {
            self.view
                .replace_private(first * p, fd, src_off, whole * p)?
        };
        st.diverged = true;
        for k in 0..whole {
            if !st.pages[first + k].private {
                st.private_pages += 1;
            }
            let old = &st.pages[first + k];
            st.pages[first + k] = Page {
                seg: held.clone(),
                off: held_off + k * p,
                prot: 0,
                epoch: old.epoch.wrapping_add(1),
                locked: 0,
                private: true,
            };
        }
        st.registered = false;
        Ok(true)
    }
}

impl Drop for AppInner {
    fn drop(&mut self) {
        if let Some(e) = &self.engine {
            e.forget(self.view.as_ptr() as usize);
        }
    }
}

/// An application-allocated buffer in this domain's lot, for the emulated application-
/// allocated semantics (emulated copy, share, emulated share). Made by
/// [`Passing::app_buffer`](super::Passing::app_buffer).
///
/// It stays with the application: output never takes it away, and the application may
/// write it at any time. Under emulated copy a write to a page still being output lands
/// on a private copy of that page (TCOW), so the receiver keeps the bytes output.
pub struct AppBuffer {
    pub(crate) inner: Arc<AppInner>,
}

impl std::fmt::Debug for AppBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppBuffer")
            .field("addr", &self.inner.view.as_ptr())
            .field("len", &self.inner.len)
            .finish()
    }
}

impl AppBuffer {
    pub(crate) fn new(
        path: &PathAllocator,
        len: usize,
        engine: Option<Arc<Engine>>,
    ) -> Result<AppBuffer> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "an application buffer needs at least one byte",
            ));
        }
        let p = page_size();
        let bytes =
            crate::sys::round_up_pages(len).ok_or(Error::InvalidArgument("length overflows"))?;
        let seg = path.alloc_segment(bytes)?;
        let lot = path.lot().clone();
        let span = seg.lot_span().expect("fbufs live in the lot");
        let view = Mapping::shared_at(
            std::os::fd::AsFd::as_fd(lot.fd()),
            span.offset,
            bytes,
            Access::ReadWrite,
        )?;
        let seg = Arc::new(seg);
        let pages = (0..bytes / p)
            .map(|i| Page {
                seg: seg.clone(),
                off: i * p,
                prot: 0,
                epoch: 0,
                locked: 0,
                private: false,
            })
            .collect();
        let inner = Arc::new(AppInner {
            view,
            len,
            lot,
            state: Mutex::new(AppState {
                pages,
                registered: false,
                diverged: false,
                private_pages: 0,
                moved: Vec::new(),
            }),
            engine: engine.clone(),
        });
        if let Some(e) = engine {
            e.track(&inner);
        }
        Ok(AppBuffer { inner })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// True if empty (never: buffers have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The bytes, as the application sees them now.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the view is mapped read-write for as long as `inner` lives; TCOW only
        // ever replaces a page by one holding the same bytes.
        unsafe { std::slice::from_raw_parts(self.inner.view.as_ptr(), self.inner.len) }
    }

    /// The bytes, writable. A write to a page under emulated-copy output goes to a fresh
    /// copy of that page; the receiver keeps reading the old one.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only reference from safe
        // code. The receivers read other mappings (of the lot pages named at output).
        unsafe { std::slice::from_raw_parts_mut(self.inner.view.as_ptr(), self.inner.len) }
    }

    /// Address of the first byte of the application's view, for writers that cannot
    /// borrow the buffer (another thread writing during output). Writing through it is
    /// as safe as any raw-pointer write into memory another reference may read.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.inner.view.as_ptr()
    }

    /// The lot offset backing page `i` now (it changes when TCOW replaces the page).
    pub fn backing_offset(&self, page: usize) -> Option<u64> {
        let st = self.inner.state();
        let pg = st.pages.get(page)?;
        Some(pg.seg.lot_span()?.offset + pg.off as u64)
    }

    /// Pages of this buffer still write-protected by outputs in flight.
    pub fn protected_pages(&self) -> usize {
        self.inner
            .state()
            .pages
            .iter()
            .filter(|p| p.prot > 0)
            .count()
    }
}

/// What an output of an application buffer holds on its pages until released.
pub(crate) enum Hold {
    /// TCOW write protection (emulated copy), with the epochs `Engine::arm` returned.
    Tcow(Vec<u32>),
    /// `mlock` (share): the pages stay resident while the receivers read them.
    Locked,
    /// Nothing (emulated share).
    Plain,
}

/// Keeps an output's lot pages (the backing at output time) reserved and its pages
/// protected or locked until every receiver released it.
struct AppGuard {
    app: Arc<AppInner>,
    first: usize,
    npages: usize,
    hold: Hold,
    _backing: Backing,
}

/// The fbufs an output's pieces lie in, kept until it is released: usually one (the
/// buffer's own), held without a list. Never read: holding them is the point.
#[allow(dead_code)]
enum Backing {
    One(Arc<Segment>),
    Many(Vec<Arc<Segment>>),
}

impl Keep for AppGuard {}

impl Drop for AppGuard {
    fn drop(&mut self) {
        match &self.hold {
            Hold::Tcow(epochs) => {
                if let Some(e) = &self.app.engine {
                    e.release(&self.app, self.first, epochs);
                }
            }
            Hold::Locked => {
                let p = page_size();
                let mut st = self.app.state();
                // One munlock per run of pages no other output still locks (a page at a
                // time made a 64 MiB share 16384 system calls).
                let mut run: Option<usize> = None;
                let end = self.first + self.npages;
                for i in self.first..=end {
                    let free = i < end && {
                        let pg = &mut st.pages[i];
                        pg.locked = pg.locked.saturating_sub(1);
                        pg.locked == 0
                    };
                    match (free, run) {
                        (true, None) => run = Some(i),
                        (false, Some(from)) => {
                            let _ = self.app.view.lock_range(from * p, (i - from) * p, false);
                            run = None;
                        }
                        _ => {}
                    }
                }
            }
            Hold::Plain => {}
        }
    }
}

impl AppInner {
    /// Locks the pages of `pages` in memory for a share output; false if `mlock` failed
    /// (nothing stays locked by this call then).
    pub fn lock_pages(&self, pages: Range<usize>) -> bool {
        let p = page_size();
        let mut st = self.state();
        if self
            .view
            .lock_range(pages.start * p, pages.len() * p, true)
            .is_err()
        {
            return false;
        }
        for pg in &mut st.pages[pages] {
            pg.locked += 1;
        }
        true
    }

    /// The lot pages behind `range` now, as (segment, offset in it, length), merged where
    /// contiguous. Call with the state locked, in the same critical section as whatever
    /// protects or locks those pages: a page TCOW replaces afterwards has a new backing.
    pub fn pieces(st: &AppState, range: &Range<usize>) -> Vec<(Arc<Segment>, usize, usize)> {
        if !st.diverged {
            // Every page is still the buffer's own fbuf at its own offset: one piece,
            // without a walk over the pages (emulated share's output stays independent
            // of the size).
            return match st.pages.first() {
                Some(pg) if !range.is_empty() => vec![(pg.seg.clone(), range.start, range.len())],
                _ => Vec::new(),
            };
        }
        let p = page_size();
        let mut pieces: Vec<(Arc<Segment>, usize, usize)> = Vec::new();
        let mut at = range.start;
        while at < range.end {
            let i = at / p;
            let within = at % p;
            let n = (p - within).min(range.end - at);
            let pg = &st.pages[i];
            let off = pg.off + within;
            match pieces.last_mut() {
                Some((s, o, l)) if Arc::ptr_eq(s, &pg.seg) && *o + *l == off => *l += n,
                _ => pieces.push((pg.seg.clone(), off, n)),
            }
            at += n;
        }
        pieces
    }

    /// The data of `range` as the receivers will read it, for outputs that protect
    /// nothing (share locks, but promises no integrity): the pages' backing now.
    pub fn describe(self: &Arc<Self>, range: Range<usize>, hold: Hold) -> crate::iodata::IoData {
        let st = self.state();
        match st.pages.first() {
            // Every page is still the buffer's own fbuf at its own offset: one fragment,
            // built without a list of pieces or of backing fbufs (two allocations, and
            // three reference counts, fewer on emulated share's hand-over).
            Some(pg) if !st.diverged && !range.is_empty() => {
                let seg = pg.seg.clone();
                drop(st);
                // Where the piece lies, read before the guard takes the fbuf (no count).
                let at = Piece::of(&seg, range.start);
                let guard = self.guard(&range, hold, Backing::One(seg));
                crate::iodata::IoData::from_fragment(at.fragment(range.len(), guard))
            }
            _ => {
                let pieces = Self::pieces(&st, &range);
                drop(st);
                self.describe_pieces(range, pieces, hold)
            }
        }
    }

    /// The data of `range` over `pieces` (from [`pieces`](Self::pieces)), kept (with
    /// `hold`) until every receiver released them.
    pub fn describe_pieces(
        self: &Arc<Self>,
        range: Range<usize>,
        pieces: Vec<(Arc<Segment>, usize, usize)>,
        hold: Hold,
    ) -> crate::iodata::IoData {
        let backing = match pieces.as_slice() {
            [(s, _, _)] => Backing::One(s.clone()),
            _ => {
                let mut backing: Vec<Arc<Segment>> = Vec::new();
                for (s, _, _) in &pieces {
                    if !backing.iter().any(|b| Arc::ptr_eq(b, s)) {
                        backing.push(s.clone());
                    }
                }
                Backing::Many(backing)
            }
        };
        let guard = self.guard(&range, hold, backing);
        let frags = pieces
            .into_iter()
            .map(|(s, off, len)| Piece::of(&s, off).fragment(len, guard.clone()));
        crate::iodata::IoData::from_fragments(frags)
    }

    /// The keeper of an output of `range`: holds its pages (`hold`) and their `backing`
    /// fbufs until every receiver released it.
    fn guard(
        self: &Arc<Self>,
        range: &Range<usize>,
        hold: Hold,
        backing: Backing,
    ) -> Arc<dyn Keep> {
        let pages = self.pages_of(range);
        Arc::new(AppGuard {
            app: self.clone(),
            first: pages.start,
            npages: pages.len(),
            hold,
            _backing: backing,
        })
    }
}

/// Where a piece of an output lies: `off` bytes into an fbuf of the lot.
struct Piece {
    span: Option<crate::segment::LotSpan>,
    ptr: std::ptr::NonNull<u8>,
}

impl Piece {
    fn of(s: &Segment, off: usize) -> Piece {
        Piece {
            span: s.lot_span().map(|sp| crate::segment::LotSpan {
                lot: sp.lot,
                offset: sp.offset + off as u64,
            }),
            ptr: std::ptr::NonNull::new(s.as_ptr().wrapping_add(off) as *mut u8).expect("non-null"),
        }
    }

    /// Its `len` bytes as a fragment kept by `guard`, which holds the fbuf.
    fn fragment(self, len: usize, guard: Arc<dyn Keep>) -> crate::iodata::Fragment {
        // SAFETY: the piece's `len` bytes lie inside an fbuf (a lot span mapped by the
        // lot's main mapping) that the guard keeps alive and reserved; the span is
        // exactly that part of the lot. Read-only: the application writes only through
        // its view, and under TCOW its writes go to other lot pages.
        let seg = unsafe { Segment::from_raw(self.ptr, len, self.span, false, guard) };
        crate::iodata::Fragment::whole(Arc::new(seg))
    }
}
