//! Fbufs and per-path allocators.
//!
//! An fbuf is a page-multiple span of its owner's lot. A [`PathAllocator`] serves one
//! data path: it keeps a LIFO free list per size class of fbufs that have already
//! travelled that path (so the receivers already have them mapped and, being last used,
//! they are likely still in cache), and a quota that bounds how much of the lot the path
//! may hold at once. Allocation and release on a warm path take a mutex that is never
//! contended across processes and make no system call.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::activity::Entry;
use super::domain::{Domain, DomainInner};
use super::lot::{class_of, min_class, Lot, CLASSES};
use super::pages::{Pages, HUGE_PAGE};
use crate::error::{Error, Result};
use crate::segment::{Keep, LotSpan, Segment};
use crate::sync::lock;
use crate::sys::mem::Access;

/// The smallest fbuf a path of [`Pages::Transparent`] backs with a huge page: from this
/// size up to 2 MiB, a fresh carve takes a whole 2 MiB-aligned span, collapses it and
/// keeps the rest for the path's next fbufs of the class. Below it, more than eight
/// small fbufs would share each huge page, which stays resident whole however little of
/// it they write, where 4 KiB pages hold only what was written.
pub const SHARE_HUGE_FROM: usize = 256 << 10;

/// Settings of one data path.
#[derive(Clone, Debug)]
pub struct PathConfig {
    /// Most bytes (in whole size-class spans) the path may have allocated and not yet
    /// returned. Allocation beyond it fails with [`Error::QuotaExceeded`]; it never blocks.
    /// A single allocation whose span is larger than the quota fails with
    /// [`Error::MessageTooLarge`], whatever is outstanding.
    pub quota: usize,
    /// Write-protect every fbuf of this path in the originator when it is sent, until all
    /// receivers have released it (secured fbufs). Off by default (volatile fbufs).
    pub secure: bool,
    /// What pages back the path's fbufs; `None` (the default) takes the group's
    /// ([`GroupConfig::pages`](super::GroupConfig)). [`Pages::Transparent`] works in any
    /// group whose lots are 2 MiB-aligned (the default geometry); [`Pages::HugeTlb`] is
    /// the group's choice, not a path's: in a group of hugetlb lots every path is
    /// hugetlb, and elsewhere no path can be. [`Domain::path`] refuses the mismatches.
    pub pages: Option<Pages>,
}

impl Default for PathConfig {
    fn default() -> Self {
        PathConfig {
            quota: 512 << 20,
            secure: false,
            pages: None,
        }
    }
}

/// Counters of one path allocator.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Fbufs handed out.
    pub allocs: u64,
    /// Of those, how many came from the path's own free list (already mapped along it).
    pub cached: u64,
    /// Allocations refused because of the quota.
    pub quota_refusals: u64,
    /// Bytes currently allocated and not returned.
    pub outstanding: usize,
    /// Fbufs currently allocated and not returned.
    pub outstanding_fbufs: u64,
    /// What pages back the path's fbufs (see [`Pages`]).
    pub pages: Pages,
    /// Spans of 2 MiB or more collapsed into transparent huge pages when the path carved
    /// them from the lot ([`Pages::Transparent`]; they stay huge while the path reuses
    /// them). A 2 MiB span carved for fbufs of [`SHARE_HUGE_FROM`] up to 2 MiB, which
    /// then share it, counts once.
    pub collapsed: u64,
    /// Spans the kernel refused to collapse (`MADV_COLLAPSE` failed, for instance for
    /// want of a free 2 MiB page): they stay 4 KiB pages.
    pub collapse_fallbacks: u64,
}

#[derive(Debug)]
pub(crate) struct PathInner {
    lot: Arc<Lot>,
    domain: Weak<DomainInner>,
    /// Inline, not a vector of vectors: a pop or push reaches its class's list without
    /// first loading the outer list from another line of the heap.
    free: Mutex<[Vec<u64>; CLASSES]>,
    outstanding: AtomicUsize,
    quota: usize,
    secure: bool,
    pages: Pages,
    collapsed: AtomicU64,
    fallbacks: AtomicU64,
    allocs: AtomicU64,
    /// Fbufs returned; written under the `free` lock only.
    frees: AtomicU64,
    cached: AtomicU64,
    refusals: AtomicU64,
    /// Where the path publishes its outstanding fbufs in the control block (`None` for
    /// a channel's private path for descriptor blocks).
    entry: Option<Entry>,
    /// Offsets of this path's plain fbufs write-protected by `IoData::secure` and not yet
    /// released (their keeper is the path itself, which has no per-fbuf state); a count
    /// beside it so that a release looks at the list only when it is not empty.
    secured: Mutex<Vec<u64>>,
    any_secured: AtomicUsize,
}

impl PathInner {
    /// Fbufs out: allocations less returns (never below zero, though a return read
    /// after a racing allocation may make it briefly look so).
    fn fbufs_out(&self, allocs: u64) -> u64 {
        allocs.saturating_sub(self.frees.load(Ordering::Relaxed))
    }

    /// Publishes the path's outstanding fbufs and bytes (two relaxed stores).
    fn publish(&self, allocs: u64, bytes: usize) {
        if let Some(e) = &self.entry {
            e.set(bytes as u64, self.fbufs_out(allocs));
        }
    }
}

impl Drop for PathInner {
    fn drop(&mut self) {
        let free = self.free.get_mut().unwrap_or_else(|p| p.into_inner());
        for (k, offs) in free.iter_mut().map(std::mem::take).enumerate() {
            self.lot.give(k, offs);
        }
    }
}

/// A per-path fbuf allocator. Cheap to clone; clones share the free lists and quota.
#[derive(Clone, Debug)]
pub struct PathAllocator {
    inner: Arc<PathInner>,
}

impl Domain {
    /// A new per-path allocator carving fbufs from this domain's lot.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `config.pages` asks for what the group's lots cannot
    /// give: [`Pages::HugeTlb`] in a group whose lots are not hugetlb, anything else in
    /// one whose lots are, or [`Pages::Transparent`] where lots are not 2 MiB-aligned.
    pub fn path(&self, config: PathConfig) -> Result<PathAllocator> {
        check_pages(&self.inner.lot, config.pages)?;
        Ok(PathAllocator::new(
            self.inner.lot.clone(),
            Arc::downgrade(&self.inner),
            config,
        ))
    }
}

/// Checks that a path asking for `asked` pages can have them from `lot`.
fn check_pages(lot: &Lot, asked: Option<Pages>) -> Result<()> {
    let group = lot.pages();
    match asked {
        None => Ok(()),
        Some(Pages::HugeTlb) if group != Pages::HugeTlb => Err(Error::InvalidArgument(
            "Pages::HugeTlb is a group setting (GroupConfig::pages): this group's lots are \
             shmem, so a path can ask for Pages::Transparent at most",
        )),
        Some(p) if group == Pages::HugeTlb && p != Pages::HugeTlb => Err(Error::InvalidArgument(
            "this group's lots are hugetlb (GroupConfig::pages): every path is \
                 2 MiB-granular and cannot ask for 4 KiB or transparent pages",
        )),
        Some(Pages::Transparent) if lot.base() as usize % HUGE_PAGE != 0 => {
            Err(Error::InvalidArgument(
                "Pages::Transparent needs lots at 2 MiB-aligned addresses: give the group \
                 a lot size and base address that are multiples of 2 MiB",
            ))
        }
        Some(_) => Ok(()),
    }
}

impl PathAllocator {
    pub(crate) fn new(lot: Arc<Lot>, domain: Weak<DomainInner>, config: PathConfig) -> Self {
        let entry = Entry::path(lot.group.clone(), lot.id.slot, config.quota);
        Self::with_entry(lot, domain, config, Some(entry))
    }

    /// A path that is not listed in the control block's activity area: a channel's
    /// private path for descriptor blocks (the channel's own entry shows its traffic).
    pub(crate) fn unlisted(lot: Arc<Lot>, domain: Weak<DomainInner>, config: PathConfig) -> Self {
        Self::with_entry(lot, domain, config, None)
    }

    fn with_entry(
        lot: Arc<Lot>,
        domain: Weak<DomainInner>,
        config: PathConfig,
        entry: Option<Entry>,
    ) -> Self {
        // Internal paths take the group's setting; users' are checked by `Domain::path`.
        let pages = match (lot.pages(), config.pages) {
            (Pages::HugeTlb, _) => Pages::HugeTlb,
            (_, Some(Pages::HugeTlb)) | (_, None) => lot.pages(),
            (_, Some(p)) => p,
        };
        let pages = if pages == Pages::Transparent && lot.base() as usize % HUGE_PAGE != 0 {
            Pages::Normal
        } else {
            pages
        };
        if let Some(e) = &entry {
            e.set_pages(pages, 0);
        }
        PathAllocator {
            inner: Arc::new(PathInner {
                lot,
                domain,
                free: Mutex::new(std::array::from_fn(|_| Vec::new())),
                outstanding: AtomicUsize::new(0),
                quota: config.quota,
                secure: config.secure,
                pages,
                collapsed: AtomicU64::new(0),
                fallbacks: AtomicU64::new(0),
                allocs: AtomicU64::new(0),
                frees: AtomicU64::new(0),
                cached: AtomicU64::new(0),
                refusals: AtomicU64::new(0),
                entry,
                secured: Mutex::new(Vec::new()),
                any_secured: AtomicUsize::new(0),
            }),
        }
    }

    /// Takes a span of at least `len` bytes for a new fbuf ([`alloc`] wraps it).
    ///
    /// [`alloc`]: PathAllocator::alloc
    pub(crate) fn alloc_segment(&self, len: usize) -> Result<Segment> {
        let p = &self.inner;
        // A message the quota can never hold is the caller's error, not a receiver's: say
        // so before looking at what is outstanding, so that no caller waits for releases
        // that could not make room.
        let too_large = |span| Error::MessageTooLarge {
            len,
            span,
            quota: p.quota,
        };
        if len > p.quota {
            // Its class may not even be computable (`class_of` assumes a span fits).
            let span = len
                .div_ceil(crate::sys::page_size())
                .checked_next_power_of_two()
                .and_then(|pages| pages.checked_mul(crate::sys::page_size()))
                .unwrap_or(usize::MAX);
            return Err(too_large(span));
        }
        if len > p.lot.len() {
            return Err(Error::LotExhausted { requested: len });
        }
        let (k, size) = class_of(len);
        // A hugetlb lot is carved in 2 MiB spans at least.
        let k = k.max(min_class(p.pages));
        let size = size.max(crate::sys::page_size() << k);
        if size > p.quota {
            return Err(too_large(size));
        }
        if p.outstanding.load(Ordering::Relaxed) + size > p.quota {
            self.collect();
            let outstanding = p.outstanding.load(Ordering::Relaxed);
            if outstanding + size > p.quota {
                p.refusals.fetch_add(1, Ordering::Relaxed);
                return Err(Error::QuotaExceeded {
                    outstanding,
                    quota: p.quota,
                });
            }
        }
        let off = match self.pop(k) {
            Some(off) => Some(off),
            None => {
                // Releases may be waiting on reverse rings; they are cheap to drain.
                self.collect();
                self.pop(k)
            }
        };
        let off = match off {
            Some(off) => {
                p.cached.fetch_add(1, Ordering::Relaxed);
                off
            }
            None => self
                .carve(k, size)
                .ok_or(Error::LotExhausted { requested: size })?,
        };
        let allocs = p.allocs.fetch_add(1, Ordering::Relaxed) + 1;
        let bytes = p.outstanding.fetch_add(size, Ordering::Relaxed) + size;
        p.publish(allocs, bytes);
        let ptr =
            NonNull::new(p.lot.base().wrapping_add(off as usize)).expect("lot base is non-null");
        let span = LotSpan {
            lot: p.lot.id,
            offset: off,
        };
        if !p.secure {
            // The path itself is the keeper, told the span (the tag) when the segment
            // goes: no keeper allocated per fbuf, and none freed per release.
            // SAFETY: `off..off+size` is a span of our lot that this path just took, so
            // no one else writes it until the segment's drop returns it; the path holds
            // the lot (and so the mapping) alive. `len <= size`.
            let seg =
                unsafe { Segment::from_raw(ptr, len, Some(span), true, self.inner.clone() as _) };
            return Ok(seg.with_tag(tag_of(off, k)));
        }
        let fbuf = Fbuf {
            path: self.inner.clone(),
            off,
            class: k,
            secure_on_send: p.secure,
            secured: AtomicBool::new(false),
        };
        // SAFETY: `off..off+size` is a span of our lot that this path just took, so no
        // one else writes it until `fbuf` returns it; `fbuf` holds the lot (and so the
        // mapping) alive. `len <= size`.
        let seg = unsafe { Segment::from_raw(ptr, len, Some(span), true, Arc::new(fbuf)) };
        // Only secured fbufs have work to do when sent (write-protect).
        Ok(seg.with_send_hook())
    }

    /// The lot this path carves fbufs from.
    pub(crate) fn lot(&self) -> &Arc<Lot> {
        &self.inner.lot
    }

    /// Takes a fresh span of class `k` (`size` bytes) from the lot, or `None` if the lot
    /// has no room. A path of [`Pages::Transparent`] collapses what it carves into huge
    /// pages: a span of 2 MiB or more on its own; one of [`SHARE_HUGE_FROM`] up to 2 MiB
    /// as part of a whole 2 MiB-aligned span, collapsed once, of which the others go
    /// straight to this path's free list (so they are not outstanding, and the next
    /// allocations of the class take them before carving again).
    fn carve(&self, k: usize, size: usize) -> Option<u64> {
        let p = &self.inner;
        if p.pages != Pages::Transparent || size < SHARE_HUGE_FROM {
            return p.lot.take(k, false);
        }
        if size >= HUGE_PAGE {
            let off = p.lot.take(k, true)?;
            self.collapse(off, size);
            return Some(off);
        }
        let per_huge = HUGE_PAGE / size;
        let Some(off) = p.lot.take(k + per_huge.trailing_zeros() as usize, true) else {
            // No aligned 2 MiB left: an ordinary span of the class, if there is one.
            return p.lot.take(k, false);
        };
        self.collapse(off, HUGE_PAGE);
        // Pushed last first, so that the next pops go up through the huge page.
        lock(&p.free)[k].extend((1..per_huge).rev().map(|i| off + (i * size) as u64));
        Some(off)
    }

    /// Collapses a span just carved from the lot into transparent huge pages (it is
    /// ours alone until handed out); if the kernel refuses, the span stays 4 KiB pages
    /// and the refusal is counted (and published for `ferry stat`).
    fn collapse(&self, off: u64, size: usize) {
        let p = &self.inner;
        match p.lot.mapping().collapse(off as usize, size) {
            Ok(()) => {
                p.collapsed.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                let n = p.fallbacks.fetch_add(1, Ordering::Relaxed) + 1;
                if let Some(e) = &p.entry {
                    e.set_pages(p.pages, n);
                }
            }
        }
    }

    fn pop(&self, k: usize) -> Option<u64> {
        lock(&self.inner.free)[k].pop()
    }

    fn collect(&self) {
        if let Some(d) = self.inner.domain.upgrade() {
            d.collect_releases();
        }
    }

    /// Bytes allocated from this path and not yet returned.
    pub fn outstanding(&self) -> usize {
        self.inner.outstanding.load(Ordering::Relaxed)
    }

    /// The path's counters.
    pub fn stats(&self) -> PathStats {
        let p = &self.inner;
        PathStats {
            allocs: p.allocs.load(Ordering::Relaxed),
            cached: p.cached.load(Ordering::Relaxed),
            quota_refusals: p.refusals.load(Ordering::Relaxed),
            outstanding: self.outstanding(),
            outstanding_fbufs: p.fbufs_out(p.allocs.load(Ordering::Relaxed)),
            pages: p.pages,
            collapsed: p.collapsed.load(Ordering::Relaxed),
            collapse_fallbacks: p.fallbacks.load(Ordering::Relaxed),
        }
    }
}

/// The tag of a plain fbuf's segment: its offset in the lot (page-aligned) and its size
/// class in the low bits.
fn tag_of(off: u64, class: usize) -> u64 {
    debug_assert!(off % crate::sys::page_size() as u64 == 0 && class < CLASSES);
    off | class as u64
}

/// The offset and class a tag names.
fn untag(tag: u64) -> (u64, usize) {
    let low = crate::sys::page_size() as u64 - 1;
    (tag & !low, (tag & low) as usize)
}

impl PathInner {
    fn size_of(class: usize) -> usize {
        crate::sys::page_size() << class
    }

    /// Puts a released fbuf back on the free list.
    fn give_back(&self, off: u64, class: usize) {
        let size = Self::size_of(class);
        {
            let mut free = lock(&self.free);
            free[class].push(off);
            // Under the lock: the only writer, so a plain load and store.
            self.frees
                .store(self.frees.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
        let bytes = self.outstanding.fetch_sub(size, Ordering::Relaxed) - size;
        self.publish(self.allocs.load(Ordering::Relaxed), bytes);
    }
}

/// The keeper of a plain (not `secure`) path's fbufs: each segment's tag names its span.
impl Keep for PathInner {
    fn secure(&self, tag: Option<u64>) -> Result<()> {
        let Some((off, class)) = tag.map(untag) else {
            return Ok(());
        };
        let mut secured = lock(&self.secured);
        if !secured.contains(&off) {
            self.lot
                .mapping()
                .protect(off as usize, Self::size_of(class), Access::Read)?;
            secured.push(off);
            self.any_secured.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn segment_dropped(&self, tag: u64) {
        let (off, class) = untag(tag);
        if self.any_secured.load(Ordering::Relaxed) != 0 {
            let mut secured = lock(&self.secured);
            if let Some(i) = secured.iter().position(|&o| o == off) {
                secured.swap_remove(i);
                self.any_secured.fetch_sub(1, Ordering::Relaxed);
                // Every receiver has released it: the originator may write again. If
                // this fails the span stays read-only, so keep it out of circulation.
                if self
                    .lot
                    .mapping()
                    .protect(off as usize, Self::size_of(class), Access::ReadWrite)
                    .is_err()
                {
                    return;
                }
            }
        }
        self.give_back(off, class);
    }
}

/// One fbuf; returns to its path's free list when the last reference goes.
struct Fbuf {
    path: Arc<PathInner>,
    off: u64,
    class: usize,
    /// The path's `secure` setting, copied here so that a send reads no other line.
    secure_on_send: bool,
    secured: AtomicBool,
}

impl Fbuf {
    fn size(&self) -> usize {
        crate::sys::page_size() << self.class
    }
}

impl Keep for Fbuf {
    fn secure(&self, _tag: Option<u64>) -> Result<()> {
        if !self.secured.swap(true, Ordering::AcqRel) {
            self.path
                .lot
                .mapping()
                .protect(self.off as usize, self.size(), Access::Read)?;
        }
        Ok(())
    }

    fn on_send(&self) -> Result<()> {
        if self.secure_on_send {
            self.secure(None)?;
        }
        Ok(())
    }
}

impl Drop for Fbuf {
    fn drop(&mut self) {
        if *self.secured.get_mut() {
            // Every receiver has released it: the originator may write again. If this
            // fails the span stays read-only, so keep it out of circulation.
            if self
                .path
                .lot
                .mapping()
                .protect(self.off as usize, self.size(), Access::ReadWrite)
                .is_err()
            {
                return;
            }
        }
        self.path.give_back(self.off, self.class);
    }
}
