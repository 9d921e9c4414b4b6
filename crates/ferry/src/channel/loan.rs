//! A message written in place for one sender, iceoryx2's loan in ferry's terms: the
//! fbufs, the ring place and the descriptor are all made, and the descriptor stored in
//! its ring slot, before the payload is written, so that the send itself is one store
//! that publishes it.

use std::ptr::NonNull;

use super::desc::{self, RawDesc, RawFrag, RawRef};
use super::ring::{Producer, Reserved};
use super::sender::{SendSlot, Sent};
use crate::error::Result;
use crate::iodata::IoDataMut;

/// A message being written for one [`Sender`](super::Sender) (see
/// [`Sender::loan`](super::Sender::loan)): write it through
/// [`as_mut_slice`](Self::as_mut_slice) or [`data`](Self::data), then
/// [`send`](Self::send). It holds the sender's place in the ring (as [`SendSlot`] does,
/// with the same rules: keep it short, and do not block in the sender's domain while
/// holding it) and the message's descriptor, already encoded and stored in that place.
/// Dropped unsent, it sends nothing and its fbufs go back to their path.
///
/// A loan holds the sender's lock, so it stays on the thread that took it:
///
/// ```compile_fail
/// fn on_another_thread<T: Send>(_: T) {}
/// # fn demo(tx: &ferry::Sender, path: &ferry::PathAllocator) -> ferry::Result<()> {
/// on_another_thread(tx.loan(path.alloc(64)?)?);
/// # Ok(()) }
/// ```
#[must_use = "a loan sends nothing until `send` is called"]
pub struct Loan<'a> {
    /// Always `Some` until `send` or `drop` takes it.
    inner: Option<Inner<'a>>,
}

struct Inner<'a> {
    slot: SendSlot<'a>,
    data: IoDataMut,
    /// `data`'s bytes when they are one run, found at the loan or at the last
    /// [`Loan::as_mut_slice`]; forgotten when [`Loan::data`] lends `data` out.
    bytes: Option<Run>,
    /// The descriptor for `data` as it was loaned, its token taken, already in its ring
    /// slot; `None` when the message needs the general path at send (more than one
    /// segment, a segment outside any lot or with a send hook, a lossy channel).
    ready: Option<Ready>,
}

struct Ready {
    /// The ring place, found at the loan; the descriptor is written there, unpublished.
    place: Reserved<RawDesc>,
    idx: u32,
    generation: u32,
    /// The length `desc` describes, and the segment it names: if the message was written
    /// shorter since, or replaced by another (`data()` gives `&mut`), it is described
    /// again at send.
    len: usize,
    seg: *const crate::segment::Segment,
}

// SAFETY: `seg` is an address compared, never dereferenced; `place` points into the
// ring's shared mapping, which outlives the loan (it borrows the sender), and is written
// only at the loan and by `Loan::send`, under the sender's state lock, held by the loan
// throughout.
unsafe impl Send for Ready {}
// SAFETY: as above (a shared `Ready` gives no access to `place`).
unsafe impl Sync for Ready {}
/// Where `Inner::data`'s one run of bytes is.
#[derive(Clone, Copy)]
struct Run {
    ptr: NonNull<u8>,
    len: usize,
}

impl Run {
    fn of(s: &mut [u8]) -> Run {
        Run {
            ptr: NonNull::from(&mut *s).cast(),
            len: s.len(),
        }
    }
}

// SAFETY: a `Run` points into the fbufs its loan's `data` owns alone (an `IoDataMut` is
// `Send` and `Sync`), and is dereferenced only through `&mut Loan`.
unsafe impl Send for Run {}
// SAFETY: as above (a shared `Run` is only an address and a length).
unsafe impl Sync for Run {}

impl std::fmt::Debug for Loan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Loan");
        if let Some(i) = &self.inner {
            d.field("len", &i.data.len())
                .field("prepared", &i.ready.is_some());
        }
        d.finish()
    }
}

impl<'a> Loan<'a> {
    pub(super) fn new(mut slot: SendSlot<'a>, mut data: IoDataMut) -> Loan<'a> {
        let bytes = one_run(&mut data).map(Run::of);
        if let Some(r) = bytes.filter(|r| r.len > 0) {
            prefetch_for_write(r.ptr.as_ptr());
        }
        let ready = prepare(&mut slot, &data);
        Loan {
            inner: Some(Inner {
                slot,
                data,
                bytes,
                ready,
            }),
        }
    }

    /// The message, to write.
    pub fn data(&mut self) -> &mut IoDataMut {
        let inner = self.inner.as_mut().expect("a loan lives until sent");
        // It may be replaced, grown or cut through this borrow.
        inner.bytes = None;
        &mut inner.data
    }

    /// The message's bytes, to write, when they are one run (as those of an fbuf from a
    /// path's `alloc` are); `None` for a message of several fragments. The run is found
    /// at the loan, so writing through it reads none of the message's bookkeeping: after
    /// a large payload was written, the send then touches as few cold cache lines as it
    /// can. An empty message gives an empty slice.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        let inner = self.inner.as_mut().expect("a loan lives until sent");
        let r = match inner.bytes {
            Some(r) => r,
            None => *inner.bytes.insert(Run::of(one_run(&mut inner.data)?)),
        };
        // SAFETY: `r` is `data`'s one run, taken from `&mut data` and forgotten whenever
        // `data` is lent out (`data()`), so `data` is unchanged since and owns the bytes
        // alone; the borrow of `self` keeps both alive and unaliased.
        Some(unsafe { std::slice::from_raw_parts_mut(r.ptr.as_ptr(), r.len) })
    }

    /// Sends the message. Its descriptor was made and stored in the reserved ring place
    /// at the loan, so this publishes it before anything else, with one store (then
    /// freezes the message and puts it on record, as
    /// [`Sender::try_send`](super::Sender::try_send) does). A message whose length
    /// changed since the loan, that was replaced through [`data`](Self::data), or that
    /// needed the general path, is described (and its slot written) now. The receiver
    /// may have died or closed since the loan: the message then comes back to its path
    /// as any message it did not take.
    ///
    /// # Errors
    /// For a message described now, as [`SendSlot::send`].
    pub fn send(mut self) -> Result<()> {
        let Inner {
            mut slot,
            data,
            ready,
            ..
        } = self.inner.take().expect("a loan lives until sent");
        let ready = match ready {
            Some(r) if r.len == data.len() && data.sole_segment() == Some(r.seg) => r,
            other => {
                // Described again (or for the first time) on the general path.
                if let Some(r) = other {
                    slot.st.free_tokens.push(r.idx);
                }
                return slot.send(&data.freeze());
            }
        };
        let pos = ready.place.position();
        // Published before anything of the sender's state is touched: the application's
        // writes since the loan may have pushed it out of the caches and the TLB.
        // SAFETY: the place was reserved, and the descriptor written there, at the loan
        // under this same state lock, held since, so nothing was pushed in between.
        unsafe { slot.st.fwd.publish_written(ready.place) };
        let sent = Sent {
            idx: ready.idx,
            generation: ready.generation,
            pos,
            data: data.freeze(),
            meta: None,
            evicted: None,
        };
        slot.tx.finish_send(slot.st, sent, true);
        Ok(())
    }
}

/// The descriptor for `data` as it stands, if the fast path can take it.
fn prepare(slot: &mut SendSlot<'_>, data: &IoDataMut) -> Option<Ready> {
    if slot.tx.core.lossy {
        return None;
    }
    // One segment (what a path allocates): the only form checked cheaply at send. It
    // makes one fragment, or none if the message is empty.
    let seg = data.sole_segment()?;
    let frag = match data.frozen_spans().next() {
        Some((span, len)) => {
            let s = span?;
            Some(RawFrag::new(
                s.lot.slot,
                s.lot.generation,
                s.offset,
                len as u64,
            ))
        }
        None => None,
    };
    // The ring place: room was made for the loan, so there is one (a faulty receiver
    // that moved its position back leaves the message to the general path at send).
    let place = slot.st.fwd.reserve().ok().flatten()?;
    let (idx, generation) = slot.st.take_token();
    let token = (generation as u64) << 32 | idx as u64;
    let d: RawDesc = desc::encode(token, frag.as_slice(), &mut [], RawRef::NONE);
    // Stored now, published at send: the receiver does not read the slot before then,
    // and a send that finds the message changed (or a later push, if the loan is
    // dropped) writes the slot again.
    // SAFETY: reserved just above, under the state lock the loan holds until it is
    // sent or dropped.
    unsafe { Producer::write_reserved(&place, d) };
    Some(Ready {
        place,
        idx,
        generation,
        len: data.len(),
        seg,
    })
}

/// Asks for the cache line at `p` with the intent to write it. The caller is about to
/// write the message, and its first line (a recycled fbuf's) is most often still in the
/// cache of the receiver that read it last: taking it back now overlaps that transfer with
/// the loan's own work and the caller's, instead of leaving it to the caller's first
/// store (under x86 TSO, the publication waits for that store).
#[inline]
fn prefetch_for_write(p: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    if has_prefetchw() {
        // SAFETY: `prefetchw` (present, as CPUID said) is a hint: it never faults and
        // changes no memory, register or flag.
        unsafe {
            std::arch::asm!(
                "prefetchw [{0}]",
                in(reg) p,
                options(nostack, preserves_flags, readonly)
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Whether the CPU has `prefetchw` (CPUID 0x8000_0001, ECX bit 8), asked once.
#[cfg(target_arch = "x86_64")]
fn has_prefetchw() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    // 0: not asked yet, 1: present, 2: absent.
    static HAS: AtomicU8 = AtomicU8::new(0);
    match HAS.load(Relaxed) {
        1 => true,
        2 => false,
        _ => {
            // Leaf 0x8000_0001 exists on every x86-64 CPU (it holds the long-mode bit).
            let ecx = std::arch::x86_64::__cpuid(0x8000_0001).ecx;
            let yes = ecx & (1 << 8) != 0;
            HAS.store(if yes { 1 } else { 2 }, Relaxed);
            yes
        }
    }
}

/// `data`'s bytes when they are one run (or none).
fn one_run(data: &mut IoDataMut) -> Option<&mut [u8]> {
    let mut runs = data.fragments_mut();
    match (runs.next(), runs.next()) {
        (Some(s), None) => Some(s),
        (None, _) => Some(&mut []),
        _ => None,
    }
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        // Unsent: the token goes back; the fbufs go back with the data.
        if let Some(Inner {
            mut slot,
            ready: Some(r),
            ..
        }) = self.inner.take()
        {
            slot.st.free_tokens.push(r.idx);
        }
    }
}
