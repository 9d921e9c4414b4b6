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
use std::sync::{Arc, Mutex};

use super::pages::{AppPages, AppState, Page};
use super::tcow::Engine;
use crate::error::{Error, Result};
use crate::region::PathAllocator;
use crate::segment::{Keep, Segment};
use crate::sys::mem::{Access, Mapping};
use crate::sys::page_size;

/// An application buffer's pages and the TCOW engine that protects them (if any): what
/// an [`AppBuffer`] and every output of it share.
pub(crate) struct AppInner {
    pages: AppPages,
    pub engine: Option<Arc<Engine>>,
}

impl std::ops::Deref for AppInner {
    type Target = AppPages;

    fn deref(&self) -> &AppPages {
        &self.pages
    }
}

impl AsRef<AppPages> for AppInner {
    fn as_ref(&self) -> &AppPages {
        &self.pages
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
            pages: AppPages {
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
            },
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
                let pieces = AppPages::pieces(&st, &range);
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
