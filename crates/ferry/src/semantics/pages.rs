//! The pages of an application buffer ([`AppPages`]): its view, the lot page behind each
//! page, and what outputs hold on them. The buffer ([`app`](super::app)) and the TCOW
//! engine ([`tcow`](super::tcow)) both work on them.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::region::lot::Lot;
use crate::segment::{Keep, Segment};
use crate::sync::lock;
use crate::sys::mem::{Access, Mapping, Stash};
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
    /// output such a page is copied to a page of our own lot ([`AppPages::own_copy`]).
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
    pub moved: Vec<Moved>,
}

/// An application buffer's pages: its view (the application's own mapping of the lot's
/// memfd) and the lot page behind each page of it. What TCOW works on, without the
/// engine itself.
pub(crate) struct AppPages {
    pub view: Mapping,
    pub len: usize,
    pub lot: Arc<Lot>,
    pub state: Mutex<AppState>,
}

impl AppPages {
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

impl AppPages {
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

impl AppPages {
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
}

/// A run of a view whose page table entries `tcow::Engine::arm` moved out (and whose emptied
/// range it write-protected) for an output. The entries go back when no output protects
/// the run's pages any more.
pub(crate) struct Moved {
    /// The run's first page in the view.
    pub first: usize,
    /// Each page's epoch when moved: a page replaced since (a new epoch) keeps its new
    /// page and its entry is dropped.
    pub epochs: Vec<u32>,
    pub stash: Stash,
}
