//! Buffers that an io_uring operation may own: the [`IoBuf`] / [`IoBufMut`] traits,
//! page-aligned [`AlignedBuf`]s for `O_DIRECT`, and the registered [`FixedPool`].
//!
//! An operation takes its buffer by value and gives it back only with its completion, so
//! the caller cannot free or reuse memory the kernel may still write. The traits are
//! `unsafe` to implement because the driver relies on the pointer staying valid and fixed
//! while the value is moved around.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// A buffer the kernel may read from while an operation owns it.
///
/// # Safety
///
/// `stable_ptr` must point to `bytes_init` readable bytes that stay valid, and at the
/// same address, for as long as the value lives, even when the value is moved. (A `Vec`'s
/// heap block qualifies; an array held inline does not.)
pub unsafe trait IoBuf: Send + 'static {
    /// Start of the bytes.
    fn stable_ptr(&self) -> *const u8;
    /// How many bytes an output operation sends or writes.
    fn bytes_init(&self) -> usize;
    /// The registered-buffer slot that covers these bytes, if any, and the id of the ring
    /// that registered it.
    fn fixed_slot(&self) -> Option<(u64, u16)> {
        None
    }
}

/// A buffer the kernel may write into while an operation owns it.
///
/// # Safety
///
/// As [`IoBuf`], and `stable_mut_ptr` must point to `bytes_total` writable bytes that
/// nothing else reads or writes while the operation runs.
pub unsafe trait IoBufMut: IoBuf {
    /// Start of the writable bytes.
    fn stable_mut_ptr(&mut self) -> *mut u8;
    /// How many bytes an input operation may fill (from the start).
    fn bytes_total(&self) -> usize;
}

// SAFETY: a Vec's heap block does not move when the Vec is moved; its length is `len()`.
unsafe impl IoBuf for Vec<u8> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: inputs fill `[0, len)`, which is initialised and exclusively owned.
unsafe impl IoBufMut for Vec<u8> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

// SAFETY: a boxed slice's heap block does not move when the box is moved.
unsafe impl IoBuf for Box<[u8]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: the box owns its bytes exclusively.
unsafe impl IoBufMut for Box<[u8]> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

/// A zeroed heap buffer aligned to `align` bytes (a power of two), for `O_DIRECT` I/O,
/// which needs buffers, offsets and lengths aligned to the device's logical block.
///
/// ```
/// let mut b = ferry::uring::AlignedBuf::zeroed(8192, 4096);
/// assert_eq!(b.as_ptr() as usize % 4096, 0);
/// b[0] = 7;
/// assert_eq!(b.len(), 8192);
/// ```
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: `AlignedBuf` owns its allocation exclusively, like a `Box<[u8]>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes aligned to `align`.
    ///
    /// # Panics
    ///
    /// If `len` is zero, `align` is not a power of two, or the allocation fails.
    pub fn zeroed(len: usize, align: usize) -> AlignedBuf {
        assert!(len > 0, "an AlignedBuf needs at least one byte");
        let layout = Layout::from_size_align(len, align).expect("align is a power of two");
        // SAFETY: the layout has a non-zero size (checked above).
        let p = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, layout }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` owns `layout.size()` initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.layout.size())
            .field("align", &self.layout.align())
            .finish()
    }
}

// SAFETY: the heap block does not move with the value.
unsafe impl IoBuf for AlignedBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.layout.size()
    }
}

// SAFETY: owned exclusively.
unsafe impl IoBufMut for AlignedBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.layout.size()
    }
}

/// The memory behind a [`FixedPool`]: one page-aligned allocation, cut into equal slots,
/// each registered with the ring as one buffer (`IORING_REGISTER_BUFFERS`).
pub(crate) struct PoolInner {
    pub(crate) region: AlignedBuf,
    pub(crate) slot_size: usize,
    pub(crate) ring_id: u64,
    free: Mutex<Vec<u16>>,
}

impl PoolInner {
    pub(crate) fn new(ring_id: u64, slot_size: usize, slots: u16) -> PoolInner {
        let page = crate::sys::page_size();
        PoolInner {
            region: AlignedBuf::zeroed(slot_size * slots as usize, page),
            slot_size,
            ring_id,
            free: Mutex::new((0..slots).rev().collect()),
        }
    }

    pub(crate) fn slots(&self) -> usize {
        self.region.len() / self.slot_size
    }
}

/// A pool of buffers registered with one [`Uring`](super::Uring) (`IORING_REGISTER_BUFFERS`).
///
/// I/O on a [`FixedBuf`] uses `READ_FIXED` / `WRITE_FIXED` (and the fixed-buffer form of
/// `SEND_ZC`), so the kernel does not pin and unpin the pages on every operation. A
/// `FixedBuf` goes back to the pool when dropped; while an operation owns it, it cannot
/// be dropped. The memory is freed when the pool, every buffer and the ring are gone.
#[derive(Clone)]
pub struct FixedPool {
    pub(crate) inner: Arc<PoolInner>,
}

impl std::fmt::Debug for FixedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedPool")
            .field("slot_size", &self.inner.slot_size)
            .field("slots", &self.inner.slots())
            .field("free", &self.free())
            .finish()
    }
}

impl FixedPool {
    /// Takes a free buffer, its length set to the slot size, or `None` if all are out.
    pub fn get(&self) -> Option<FixedBuf> {
        let slot = self
            .inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()?;
        Some(FixedBuf {
            pool: Arc::clone(&self.inner),
            slot,
            len: self.inner.slot_size,
        })
    }

    /// Bytes per buffer.
    pub fn slot_size(&self) -> usize {
        self.inner.slot_size
    }

    /// Buffers in the pool.
    pub fn slots(&self) -> usize {
        self.inner.slots()
    }

    /// Buffers not handed out right now.
    pub fn free(&self) -> usize {
        self.inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

/// One registered buffer from a [`FixedPool`]; its bytes are `[0, len)` of the slot.
pub struct FixedBuf {
    pool: Arc<PoolInner>,
    slot: u16,
    len: usize,
}

impl FixedBuf {
    /// Sets how many bytes of the slot count (what a write sends, what a read may fill).
    ///
    /// # Panics
    ///
    /// If `len` exceeds the slot size.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.pool.slot_size,
            "FixedBuf::set_len past the slot"
        );
        self.len = len;
    }

    /// The slot size.
    pub fn capacity(&self) -> usize {
        self.pool.slot_size
    }

    /// The registered buffer index of this slot.
    pub fn index(&self) -> u16 {
        self.slot
    }

    fn base(&self) -> *mut u8 {
        // SAFETY: slot < slots, so the offset stays inside the region allocation.
        unsafe { (self.pool.region.ptr.as_ptr()).add(self.slot as usize * self.pool.slot_size) }
    }
}

impl std::fmt::Debug for FixedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedBuf")
            .field("slot", &self.slot)
            .field("len", &self.len)
            .finish()
    }
}

impl std::ops::Deref for FixedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `[base, base + len)` lies in this slot, which only this FixedBuf
        // hands out (slots are taken from the free list exactly once).
        unsafe { std::slice::from_raw_parts(self.base(), self.len) }
    }
}

impl std::ops::DerefMut for FixedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.base(), self.len) }
    }
}

impl Drop for FixedBuf {
    fn drop(&mut self) {
        self.pool
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.slot);
    }
}

// SAFETY: the slot lies in the pool's allocation, which the `Arc` keeps alive and in place.
unsafe impl IoBuf for FixedBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.base()
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
    fn fixed_slot(&self) -> Option<(u64, u16)> {
        Some((self.pool.ring_id, self.slot))
    }
}

// SAFETY: the slot is owned by this FixedBuf alone.
unsafe impl IoBufMut for FixedBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.base()
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_slots_come_back_on_drop() {
        let inner = Arc::new(PoolInner::new(1, 4096, 3));
        let pool = FixedPool { inner };
        let a = pool.get().unwrap();
        let mut b = pool.get().unwrap();
        let c = pool.get().unwrap();
        assert!(pool.get().is_none());
        assert_ne!(a.index(), b.index());
        b.set_len(10);
        b.copy_from_slice(b"0123456789");
        assert_eq!(&b[..], b"0123456789");
        assert_eq!(
            b.stable_ptr() as usize - a.stable_ptr() as usize,
            4096 * (b.index() as usize - a.index() as usize)
        );
        drop(b);
        assert_eq!(pool.free(), 1);
        drop((a, c));
        assert_eq!(pool.free(), 3);
    }

    #[test]
    fn aligned_buf_is_aligned_and_zeroed() {
        let b = AlignedBuf::zeroed(3 * 4096, 4096);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert!(b.iter().all(|&x| x == 0));
    }
}
