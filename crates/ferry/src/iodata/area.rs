//! Lot areas: spans of a domain's lot that something outside ferry writes (a network
//! device's receive buffers: an AF_XDP UMEM), lent out piece by piece as read-only
//! [`IoData`] that channels pass on as descriptors, each piece reported back when its
//! last reference, here or in any receiver, is gone.

use std::os::fd::{AsFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use super::IoData;
use crate::error::{Error, Result};
use crate::region::PathAllocator;
use crate::segment::{Keep, LotSpan, Segment};

/// Told when a piece lent by an [`AreaLender`] is released everywhere.
pub trait AreaRelease: Send + Sync {
    /// The piece lent with `tag` has no reference left in any domain of the group.
    fn released(&self, tag: u64);
}

/// A span of the domain's own lot taken from a path and kept out of it until dropped,
/// whose bytes are written by something other than ferry (see [`PathAllocator::area`]).
pub struct LotArea {
    inner: Arc<AreaInner>,
}

struct AreaInner {
    /// The fbuf behind the area: keeps the span out of its path and the lot mapped.
    _seg: Segment,
    offset: u64,
    len: usize,
    lot: crate::segment::LotId,
    ptr: NonNull<u8>,
    fd_owner: PathAllocator,
}

// SAFETY: `ptr` points into the lot mapping that `seg` keeps alive; the area itself hands
// out no references to it except through `unsafe` calls whose contract covers access.
unsafe impl Send for AreaInner {}
// SAFETY: as for `Send`.
unsafe impl Sync for AreaInner {}

impl std::fmt::Debug for LotArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LotArea")
            .field("lot", &self.inner.lot)
            .field("offset", &self.inner.offset)
            .field("len", &self.inner.len)
            .finish()
    }
}

impl PathAllocator {
    /// Takes an area of at least `len` bytes (a whole span of this path's size class, so
    /// page-aligned in the lot) for memory that a device or the kernel writes. It counts
    /// against the path's quota until dropped, and so do the pieces lent from it.
    ///
    /// # Errors
    /// As for [`alloc`](PathAllocator::alloc).
    pub fn area(&self, len: usize) -> Result<LotArea> {
        if len == 0 {
            return Err(Error::InvalidArgument("an area of zero bytes"));
        }
        let seg = self.alloc_segment(len)?;
        let span = seg.lot_span().expect("fbufs lie in the lot");
        let ptr = NonNull::new(seg.as_slice().as_ptr() as *mut u8).expect("non-null");
        Ok(LotArea {
            inner: Arc::new(AreaInner {
                offset: span.offset,
                len: seg.len(),
                lot: span.lot,
                ptr,
                _seg: seg,
                fd_owner: self.clone(),
            }),
        })
    }
}

impl LotArea {
    /// Offset of the area's first byte in the lot (a multiple of the page size).
    pub fn lot_offset(&self) -> u64 {
        self.inner.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Never true: areas are not empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The lot this area lies in.
    pub fn lot(&self) -> crate::segment::LotId {
        self.inner.lot
    }

    /// Address of the first byte, at the same address in every process of the group.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.ptr.as_ptr()
    }

    /// The lot's memfd (read-write), to hand to whoever writes the area (a broker that
    /// registers it with the kernel). Anyone holding it can write the whole lot.
    pub fn lot_fd(&self) -> BorrowedFd<'_> {
        self.inner.fd_owner.lot().fd().as_fd()
    }

    /// A lender whose pieces report their release to `sink`.
    pub fn lender(&self, sink: Arc<dyn AreaRelease>) -> AreaLender {
        AreaLender {
            keep: Arc::new(Pieces {
                area: self.inner.clone(),
                sink,
            }),
        }
    }
}

/// Lends pieces of a [`LotArea`] as [`IoData`]; the area stays allocated while any
/// lender or piece lives.
#[derive(Clone)]
pub struct AreaLender {
    keep: Arc<Pieces>,
}

impl std::fmt::Debug for AreaLender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AreaLender")
            .field("lot", &self.keep.area.lot)
            .finish()
    }
}

struct Pieces {
    area: Arc<AreaInner>,
    sink: Arc<dyn AreaRelease>,
}

impl Keep for Pieces {
    fn segment_dropped(&self, tag: u64) {
        self.sink.released(tag);
    }
}

impl AreaLender {
    /// Bytes `off..off + len` of the area as read-only data, in place: sent on a channel
    /// it crosses as a descriptor. When its last reference in any domain is gone, the
    /// sink is told `released(tag)`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the range is not inside the area.
    ///
    /// # Safety
    /// Nothing may write `off..off + len` of the area from this call until the sink is
    /// told `released(tag)` (a device must not be given that memory again before).
    pub unsafe fn lend(&self, off: usize, len: usize, tag: u64) -> Result<IoData> {
        let a = &self.keep.area;
        if off.checked_add(len).map_or(true, |end| end > a.len) {
            return Err(Error::InvalidArgument("a piece outside its area"));
        }
        let ptr = NonNull::new(a.ptr.as_ptr().wrapping_add(off)).expect("non-null");
        let span = LotSpan {
            lot: a.lot,
            offset: a.offset + off as u64,
        };
        // SAFETY: the range lies in the area (checked), which `keep` holds allocated and
        // mapped; the caller promises no one writes it until the release; the segment is
        // read-only and is exactly that span of the lot.
        let seg = unsafe { Segment::from_raw_tagged(ptr, len, Some(span), self.keep.clone(), tag) };
        Ok(IoData::from_segment(Arc::new(seg)))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::region::{Group, PathConfig};

    #[derive(Default)]
    struct Log(Mutex<Vec<u64>>);

    impl AreaRelease for Log {
        fn released(&self, tag: u64) {
            self.0.lock().unwrap().push(tag);
        }
    }

    impl Log {
        fn tags(&self) -> Vec<u64> {
            self.0.lock().unwrap().clone()
        }
    }

    /// An area is a page-aligned span of the domain's lot, the same bytes through the
    /// lot's memfd and the mapping, held out of its path until dropped; a piece lent from
    /// it is read in place, refused outside the area, and reported released (with its
    /// tag) only when its last reference, here or in a domain it was sent to, is gone.
    #[test]
    fn area_lends_in_place_and_reports_each_release_once() {
        let g = Group::open(&format!("unit-area-{}", std::process::id())).unwrap();
        let (a, b) = (g.join().unwrap(), g.join().unwrap());
        let path = a.path(PathConfig::default()).unwrap();
        let page = rustix::param::page_size();
        let area = path.area(3 * page + 1).unwrap();
        assert!(area.len() > 3 * page);
        assert_eq!(
            area.lot_offset() % page as u64,
            0,
            "page-aligned in the lot"
        );
        assert_eq!(
            area.as_ptr() as usize,
            a.lot_addr() + area.lot_offset() as usize,
            "in this domain's lot mapping"
        );
        assert!(path.outstanding() >= area.len(), "held out of its path");
        assert!(path.area(0).is_err());

        // Written through the memfd (as a device or the kernel would), read in place.
        let at = area.lot_offset() + page as u64;
        rustix::io::pwrite(area.lot_fd(), b"device bytes", at).unwrap();
        let log = Arc::new(Log::default());
        let lender = area.lender(log.clone());
        // SAFETY: nothing writes the area while the pieces live (the test writes it
        // only before lending).
        let d = unsafe { lender.lend(page, 12, 7) }.unwrap();
        assert!(d.eq_bytes(b"device bytes"));
        let f = &d.fragments()[0];
        assert_eq!(
            f.as_slice().as_ptr() as usize,
            area.as_ptr() as usize + page
        );
        assert_eq!(
            f.lot_span(),
            Some(LotSpan {
                lot: area.lot(),
                offset: at
            })
        );
        // SAFETY: refused before anything is lent.
        assert!(unsafe { lender.lend(area.len() - 4, 5, 8) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { lender.lend(usize::MAX, 2, 8) }.is_err());

        // Clones: one release, when the last goes.
        let c = d.clone();
        drop(d);
        assert!(log.tags().is_empty());
        drop(c);
        assert_eq!(log.tags(), vec![7]);

        // Sent to another domain: released when the receiver drops it.
        let (a2, bid) = (a.clone(), b.id());
        let t = std::thread::spawn(move || a2.connect(bid, Duration::from_secs(5)).unwrap());
        let mut rx = b.accept(Duration::from_secs(5)).unwrap();
        let tx = t.join().unwrap();
        // SAFETY: as above.
        let d = unsafe { lender.lend(2 * page, 100, 9) }.unwrap();
        tx.send(&d).unwrap();
        drop(d);
        let r = rx.recv().unwrap();
        assert_eq!(
            r.fragments()[0].as_slice().as_ptr() as usize,
            area.as_ptr() as usize + 2 * page,
            "a descriptor, read in place"
        );
        tx.collect_releases().unwrap();
        assert_eq!(log.tags(), vec![7], "still held by the receiver");
        drop(r);
        let t0 = Instant::now();
        while log.tags().len() < 2 && t0.elapsed() < Duration::from_secs(5) {
            tx.collect_releases().unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(log.tags(), vec![7, 9]);

        // The area goes back to its path only when the area and its lenders are gone.
        let held = path.outstanding();
        drop(area);
        assert_eq!(path.outstanding(), held, "the lender keeps the area");
        drop(lender);
        assert_eq!(path.outstanding(), 0, "returned to its path");
    }
}
