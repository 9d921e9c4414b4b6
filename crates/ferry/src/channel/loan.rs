//! A message written in place for one sender, iceoryx2's loan in ferry's terms: the
//! fbufs, the ring place and the descriptor are all made, and the descriptor stored in
//! its ring slot, before the payload is written, so that the send itself is one store
//! that publishes it.

use std::ptr::NonNull;

use super::sender::{Prepared, SendSlot};
use crate::error::Result;
use crate::iodata::IoDataMut;

/// A message being written for one [`Sender`](super::Sender) (see
/// [`Sender::loan`](super::Sender::loan) and
/// [`Sender::loan_slice`](super::Sender::loan_slice)): write it through
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
    draft: Draft,
    /// The descriptor for the message as it was loaned, its token taken, already in its
    /// ring slot; `None` when the message needs the general path at send (see
    /// [`SendSlot::prepare`]).
    ready: Option<Prepared>,
}

/// A message being written in place, for a loan of any kind (a [`Loan`] on one sender,
/// a publisher's loan): the message, and where its one run of bytes is, found when the
/// draft is made (the first line then asked for with the intent to write it), so that
/// writing the payload reads none of the message's bookkeeping.
pub(crate) struct Draft {
    data: IoDataMut,
    /// `data`'s bytes when they are one run, found at the draft or at the last
    /// [`Draft::as_mut_slice`]; forgotten when [`Draft::data`] lends `data` out.
    bytes: Option<Run>,
}

/// Where `Draft::data`'s one run of bytes is.
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

// SAFETY: a `Run` points into the fbufs its draft's `data` owns alone (an `IoDataMut` is
// `Send` and `Sync`), and is dereferenced only through `&mut Draft`.
unsafe impl Send for Run {}
// SAFETY: as above (a shared `Run` is only an address and a length).
unsafe impl Sync for Run {}

impl Draft {
    /// Starts writing `data`: finds its run of bytes and prefetches its first line for
    /// writing.
    #[inline]
    pub(crate) fn new(mut data: IoDataMut) -> Draft {
        let bytes = one_run(&mut data).map(Run::of);
        if let Some(r) = bytes.filter(|r| r.len > 0) {
            prefetch_for_write(r.ptr.as_ptr());
        }
        Draft { data, bytes }
    }

    /// The message, to write (it may be replaced, grown or cut through this borrow).
    pub(crate) fn data(&mut self) -> &mut IoDataMut {
        self.bytes = None;
        &mut self.data
    }

    /// The message as it stands.
    pub(crate) fn get(&self) -> &IoDataMut {
        &self.data
    }

    /// The message's bytes when they are one run (see [`Loan::as_mut_slice`]).
    #[inline]
    pub(crate) fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        let r = match self.bytes {
            Some(r) => r,
            None => *self.bytes.insert(Run::of(one_run(&mut self.data)?)),
        };
        // SAFETY: `r` is `data`'s one run, taken from `&mut data` and forgotten whenever
        // `data` is lent out (`data()`), so `data` is unchanged since and owns the bytes
        // alone; the borrow of `self` keeps both alive and unaliased.
        Some(unsafe { std::slice::from_raw_parts_mut(r.ptr.as_ptr(), r.len) })
    }

    /// The message, written.
    #[inline]
    pub(crate) fn into_data(self) -> IoDataMut {
        self.data
    }
}

impl std::fmt::Debug for Loan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Loan");
        if let Some(i) = &self.inner {
            d.field("len", &i.draft.get().len())
                .field("prepared", &i.ready.is_some());
        }
        d.finish()
    }
}

impl<'a> Loan<'a> {
    pub(super) fn new(mut slot: SendSlot<'a>, data: IoDataMut) -> Loan<'a> {
        let draft = Draft::new(data);
        let ready = slot.prepare(draft.get());
        Loan {
            inner: Some(Inner { slot, draft, ready }),
        }
    }

    fn inner(&mut self) -> &mut Inner<'a> {
        self.inner.as_mut().expect("a loan lives until sent")
    }

    /// The message, to write.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-loan-data-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// let mut loan = tx.loan_slice(4)?;
    /// loan.data().fill_from(b"ping");
    /// loan.send()?;
    /// assert!(rx.recv()?.eq_bytes(b"ping"));
    /// # Ok(()) }
    /// ```
    pub fn data(&mut self) -> &mut IoDataMut {
        self.inner().draft.data()
    }

    /// The message's length in bytes.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-loan-len-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// let loan = tx.loan_slice(300)?;
    /// assert_eq!(loan.len(), 300);
    /// # drop(loan);
    /// # drop(rx);
    /// # Ok(()) }
    /// ```
    pub fn len(&self) -> usize {
        self.inner
            .as_ref()
            .expect("a loan lives until sent")
            .draft
            .get()
            .len()
    }

    /// True for a message of zero bytes.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-loan-is-empty-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// assert!(tx.loan_slice(0)?.is_empty());
    /// # drop(rx);
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The message's bytes, to write, when they are one run (as those of an fbuf from a
    /// path's `alloc` are); `None` for a message of several fragments. The run is found
    /// at the loan, so writing through it reads none of the message's bookkeeping: after
    /// a large payload was written, the send then touches as few cold cache lines as it
    /// can. An empty message gives an empty slice.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        self.inner().draft.as_mut_slice()
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
            draft,
            ready,
        } = self.inner.take().expect("a loan lives until sent");
        let data = draft.into_data();
        match ready {
            Some(p) if p.describes(&data) => {
                // SAFETY: `p` was made by this slot's `prepare` at the loan; the loan has
                // held the slot since and pushed nothing on it.
                unsafe { slot.publish_prepared(p, data) };
                Ok(())
            }
            other => {
                // Described again (or for the first time) on the general path.
                if let Some(p) = other {
                    slot.unprepare(p);
                }
                slot.send(&data.freeze())
            }
        }
    }
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
            ready: Some(p),
            ..
        }) = self.inner.take()
        {
            slot.unprepare(p);
        }
    }
}
