//! A single-producer single-consumer ring in shared memory, with wake-up suppression.
//!
//! ```text
//!  RingCtl (one cache line per writer)      slots: [Slot<T>; cap], cap a power of two
//!  +-------------------------+              +-----------------------------+
//!  | head      (consumer)    |              | seq (u64) | value T         |  slot p % cap
//!  | wait_tail (producer)    |              +-----------------------------+
//!  | sleeping  (consumer=1|2)|
//!  | waiting   (producer=1)  |
//!  +-------------------------+
//! ```
//!
//! The producer writes the value of position `p` into slot `p % cap`, then publishes it
//! by storing `seq = p + 1` in the same slot. The consumer polls the `seq` of the slot at
//! its `head`: the entry and its "ready" mark arrive in one cache line, with no separate
//! tail index to fetch first (on these VMs each cache line that moves between cores costs
//! about a quarter of a microsecond). The consumer publishes `head` so that the producer
//! can tell when the ring is full; the producer reads it only when its cached copy says so.
//!
//! The producer wakes the consumer only when the consumer has said it sleeps, which it
//! does only after seeing the ring empty: a wake-up happens only on an empty to non-empty
//! transition, never while the consumer is busy. A consumer that relays what it gets
//! elsewhere (a bridge) may say it sleeps with 2 instead of 1: a producer that wakes
//! several consumers after one publication wakes those first that said 1 (see
//! [`RingCtl::take_sleeper_first`]). A producer that finds the ring full
//! records its position in `wait_tail`, says it waits, and is woken by the consumer once at
//! most half the ring is in use. Both sleep handshakes are the Dekker pattern: each side
//! stores its flag (or publication), issues a SeqCst fence, then loads the other side's
//! publication (or flag), so at least one of them sees the other.
//!
//! Nothing read from shared memory is trusted: a `seq` that is not exactly the expected
//! one means "not ready", and a `head` that would put more than `cap` entries in the ring
//! is reported as [`Corrupt`].
//!
//! A ring may also be *lossy* (chosen when it is made, the same on both sides): a
//! producer that finds it full may take the oldest entry back with
//! [`Producer::evict_oldest`], which moves `head` forward by a compare-and-swap. `head`
//! then has two writers, so a lossy consumer takes an entry by copying it and then moving
//! `head` from `h` to `h + 1` with a compare-and-swap as well; if that fails, the producer
//! took the entry first, and the copy (possibly torn, as the producer may already have
//! rewritten the slot) is thrown away before anything was done with it. The winner of
//! the swap owns the entry. `head` only ever grows, so there is no ABA; a lossy consumer
//! that finds it moved backwards reports [`Corrupt`]. A non-lossy ring never takes the
//! compare-and-swap path: its consumer checks the mode once per call.

use std::ptr::NonNull;

use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

/// A value padded to its own cache line.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub(crate) struct Padded<T>(pub T);

/// The ring's control words, as laid out in shared memory.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct RingCtl {
    head: Padded<AtomicU64>,
    wait_tail: Padded<AtomicU64>,
    sleeping: Padded<AtomicU32>,
    waiting: Padded<AtomicU32>,
}

/// `sleeping`: the consumer sleeps and wants to be woken among the first.
const SLEEPS: u32 = 1;
/// `sleeping`: the consumer sleeps and may be woken after the others.
const SLEEPS_LAST: u32 = 2;

impl RingCtl {
    /// After the producer's publication and a SeqCst fence: true if the consumer said
    /// it sleeps, which this clears (so exactly one producer call wakes it).
    pub(crate) fn take_sleeper(&self) -> bool {
        let v = self.sleeping.0.load(Ordering::Relaxed);
        v != 0
            && self
                .sleeping
                .0
                .compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Whether the consumer said it sleeps (either way).
    pub(crate) fn sleeps(&self) -> bool {
        self.sleeping.0.load(Ordering::Relaxed) != 0
    }

    /// [`take_sleeper`](Self::take_sleeper), but only for a consumer that did not ask to
    /// be woken last: the first of a producer's two passes over several rings; the
    /// second pass takes the rest with `take_sleeper`.
    pub(crate) fn take_sleeper_first(&self) -> bool {
        self.sleeping.0.load(Ordering::Relaxed) == SLEEPS
            && self
                .sleeping
                .0
                .compare_exchange(SLEEPS, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }
}

/// One slot: the publication mark and the value.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Slot<T> {
    seq: AtomicU64,
    val: T,
}

impl<T: Default> Slot<T> {
    /// `n` empty slots on the heap (tests and in-process rings; shared memory starts
    /// zeroed, which is the same state).
    #[cfg(test)]
    pub fn boxed(n: u64) -> Box<[Slot<T>]> {
        (0..n)
            .map(|_| Slot {
                seq: AtomicU64::new(0),
                val: T::default(),
            })
            .collect()
    }
}

/// How the consumer copies a value out of shared memory. The default reads it whole;
/// an entry type may read only the parts it needs, so that a short entry costs one
/// cache line.
pub(crate) trait Entry: Copy {
    /// Copies the value at `p`.
    ///
    /// # Safety
    /// `p` must point to a readable `Self` (possibly being written by a misbehaving peer;
    /// the copy may then hold any bit pattern, so `Self` must accept any).
    unsafe fn read_shared(p: *const Self) -> Self {
        // SAFETY: the caller guarantees `p` is readable.
        unsafe { p.read_volatile() }
    }

    /// Stores `v` at `p`, or at least every part of it that
    /// [`read_shared`](Self::read_shared) reads back: a value may leave parts it does not
    /// use unwritten, so that its store touches no cache line its reader will not read.
    ///
    /// # Safety
    /// `p` must point to a writable `Self` that no one else writes meanwhile.
    unsafe fn write_shared(p: *mut Self, v: Self) {
        // SAFETY: the caller guarantees `p` is writable.
        unsafe { p.write_volatile(v) }
    }
}

impl Entry for u64 {}

/// The peer wrote an index that cannot be right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Corrupt;

/// One side's view of a ring.
#[derive(Debug)]
struct Ring<T> {
    ctl: NonNull<RingCtl>,
    slots: NonNull<Slot<T>>,
    cap: u64,
}

impl<T> Ring<T> {
    fn ctl(&self) -> &RingCtl {
        // SAFETY: `producer`/`consumer` require `ctl` to stay valid for the ring's
        // lifetime; all its fields are atomics, so shared access from both processes is
        // sound.
        unsafe { self.ctl.as_ref() }
    }

    fn slot(&self, i: u64) -> *mut Slot<T> {
        // SAFETY: `i % cap < cap`, and `producer`/`consumer` require `cap` slots.
        unsafe { self.slots.as_ptr().add((i & (self.cap - 1)) as usize) }
    }

    fn seq(&self, i: u64) -> &AtomicU64 {
        // SAFETY: the slot is valid (see `slot`); `seq` is an atomic, shared by design.
        unsafe { &(*self.slot(i)).seq }
    }
}

/// The producing side.
#[derive(Debug)]
pub(crate) struct Producer<T> {
    ring: Ring<T>,
    tail: u64,
    head_seen: u64,
}

/// The consuming side.
#[derive(Debug)]
pub(crate) struct Consumer<T> {
    ring: Ring<T>,
    head: u64,
    /// The producer may evict: take entries with a compare-and-swap of `head`.
    lossy: bool,
    /// What [`prepare_sleep`](Consumer::prepare_sleep) stores in `sleeping`.
    sleep_mark: u32,
}

// SAFETY: each side is used by one thread at a time (`&mut self`), and the memory it
// points to is shared memory designed for concurrent access through atomics.
unsafe impl<T: Send> Send for Producer<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for Consumer<T> {}

/// Outcome of a push.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Push<T> {
    /// Stored; `wake` says the consumer was asleep and must be woken.
    Done { wake: bool },
    /// The ring is full; the value is handed back.
    Full(T),
}

/// The producing side of a fresh ring.
///
/// # Safety
/// `ctl` must point to a `RingCtl` and `slots` to `cap` slots, both zero-initialised
/// (or made by [`Slot::boxed`] and `RingCtl::default`) and valid for as long as the
/// returned side lives. At most one `Producer` and one `Consumer` may ever exist for a
/// ring, in any processes. `cap` must be a power of two.
pub(crate) unsafe fn producer<T: Copy>(
    ctl: NonNull<RingCtl>,
    slots: NonNull<Slot<T>>,
    cap: u64,
) -> Producer<T> {
    assert!(cap.is_power_of_two());
    Producer {
        ring: Ring { ctl, slots, cap },
        tail: 0,
        head_seen: 0,
    }
}

/// The consuming side of a fresh ring; see [`producer`].
///
/// # Safety
/// As for [`producer`].
pub(crate) unsafe fn consumer<T: Entry>(
    ctl: NonNull<RingCtl>,
    slots: NonNull<Slot<T>>,
    cap: u64,
) -> Consumer<T> {
    assert!(cap.is_power_of_two());
    Consumer {
        ring: Ring { ctl, slots, cap },
        head: 0,
        lossy: false,
        sleep_mark: SLEEPS,
    }
}

/// Attempts of a lossy consumer against a producer that keeps moving `head` under it
/// before it reports "nothing yet" (only a producer evicting without pause, that is a
/// faulty one, can make it give up).
const LOSSY_RETRIES: u32 = 64;

/// The place the next value goes, found ahead of the push ([`Producer::reserve`]): a loan
/// finds it while the producer's state is at hand, so that its send, after the application
/// wrote the payload (which may have evicted that state from the caches and the TLB),
/// touches only the slot before the value is published.
#[derive(Debug)]
pub(crate) struct Reserved<T> {
    slot: *mut Slot<T>,
    /// The position it holds.
    pos: u64,
}

impl<T> Reserved<T> {
    /// The position the value will take.
    pub fn position(&self) -> u64 {
        self.pos
    }
}

impl<T: Entry> Producer<T> {
    /// Finds the place of the next push, if the ring has room now. Until it is used by
    /// [`publish_reserved`](Self::publish_reserved) (or
    /// [`write_reserved`](Self::write_reserved) and
    /// [`publish_written`](Self::publish_written)) nothing else may be pushed: the caller
    /// holds the producer (for a sender, its state lock) in between.
    pub fn reserve(&mut self) -> Result<Option<Reserved<T>>, Corrupt> {
        if !self.has_room()? {
            return Ok(None);
        }
        Ok(Some(Reserved {
            slot: self.ring.slot(self.tail),
            pos: self.tail,
        }))
    }

    /// Publishes `v` at `r`, then advances past it: the slot and its sequence number are
    /// written before anything of this producer's own state is read or written.
    ///
    /// # Safety
    /// `r` came from this producer's [`reserve`](Self::reserve), and nothing was pushed
    /// since (its slot is still the next, free for the producer, and the ring still
    /// mapped).
    pub unsafe fn publish_reserved(&mut self, r: Reserved<T>, v: T) {
        // SAFETY: the caller's contract is both callees'.
        unsafe {
            Self::write_reserved(&r, v);
            self.publish_written(r);
        }
    }

    /// Writes `v` into the reserved slot without publishing it: the consumer does not
    /// read the slot until [`publish_written`](Self::publish_written) publishes its
    /// sequence number. Written again, the last value is the one published.
    ///
    /// # Safety
    /// As [`publish_reserved`](Self::publish_reserved).
    pub unsafe fn write_reserved(r: &Reserved<T>, v: T) {
        // SAFETY: by the caller's contract the slot is the next one, free (room was seen
        // at `reserve`: the consumer's head has passed the entry `cap` positions back, and
        // a consumer only frees more), and not read before `seq` is published.
        unsafe { T::write_shared(std::ptr::addr_of_mut!((*r.slot).val), v) };
    }

    /// Publishes the value [`write_reserved`](Self::write_reserved) wrote at `r`, then
    /// advances past it. The publication is the first thing it writes: one store of the
    /// slot's sequence number.
    ///
    /// # Safety
    /// As [`publish_reserved`](Self::publish_reserved), and `r`'s slot was written by
    /// `write_reserved` since the reservation.
    pub unsafe fn publish_written(&mut self, r: Reserved<T>) {
        let next = r.pos.wrapping_add(1);
        // SYNC: pairs with the consumer's Acquire load of `seq` in `try_pop`/`has_data`;
        // the slot's value, written before, is visible with it.
        // SAFETY: `seq` is an atomic in the mapped slot (the caller's contract).
        unsafe { &(*r.slot).seq }.store(next, Ordering::Release);
        // Keep the compiler from moving the update of our own state (which may miss in
        // the caches and the TLB) before the publication.
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        debug_assert_eq!(self.tail, r.pos, "a reservation used after another push");
        self.tail = next;
    }

    /// Takes the position `r` holds without publishing anything there: the producer
    /// moves past it, and a value is written there later by
    /// [`write_reserved`](Self::write_reserved) and published by
    /// [`publish_claimed`](Self::publish_claimed), which touch only the slot, or the
    /// position is given back by [`unclaim`](Self::unclaim). The consumer sees nothing
    /// until then; the producer's own view (room, positions) counts the position taken.
    pub fn claim(&mut self, r: &Reserved<T>) {
        debug_assert_eq!(self.tail, r.pos, "a claim after another push");
        self.tail = r.pos.wrapping_add(1);
    }

    /// Publishes the value [`write_reserved`](Self::write_reserved) wrote at a position
    /// [`claim`](Self::claim) took: one store, the slot's sequence number, and nothing of
    /// the producer's state.
    ///
    /// Publish only a position claimed and neither published nor given back since:
    /// anything else garbles the ring's marks (which the consumer checks, as it checks
    /// everything a peer writes).
    ///
    /// # Safety
    /// `r`'s ring is still mapped.
    pub unsafe fn publish_claimed(r: &Reserved<T>) {
        // SYNC: pairs with the consumer's Acquire load of `seq`, as in `publish_written`.
        // SAFETY: `seq` is an atomic in the mapped slot (the caller's contract).
        unsafe { &(*r.slot).seq }.store(r.pos.wrapping_add(1), Ordering::Release);
    }

    /// Gives back a position [`claim`](Self::claim) took and that was not published:
    /// the next push takes it again.
    pub fn unclaim(&mut self, r: &Reserved<T>) {
        debug_assert_eq!(self.tail, r.pos.wrapping_add(1), "an unclaim after a push");
        self.tail = r.pos;
    }

    /// Stores `v` if there is room, never blocking.
    pub fn try_push(&mut self, v: T) -> Result<Push<T>, Corrupt> {
        let pushed = self.try_push_unfenced(v)?;
        if let Push::Full(v) = pushed {
            return Ok(Push::Full(v));
        }
        // Dekker: publication (in `try_push_unfenced`), fence, then load `sleeping` (the
        // consumer stores `sleeping`, fences, loads `seq`).
        fence(Ordering::SeqCst);
        Ok(Push::Done {
            wake: self.ring.ctl().take_sleeper(),
        })
    }

    /// Like [`try_push`](Self::try_push) without the wake-up check: it publishes `v`
    /// and returns `Done { wake: false }`. The caller must then issue
    /// `fence(Ordering::SeqCst)` and call [`RingCtl::take_sleeper`] on this ring (and
    /// wake the consumer if that says so); one fence may serve several rings, which
    /// is what lets a sender to many rings pay for it once.
    pub fn try_push_unfenced(&mut self, v: T) -> Result<Push<T>, Corrupt> {
        let Some(r) = self.reserve()? else {
            return Ok(Push::Full(v));
        };
        // SAFETY: reserved just above, with nothing pushed in between.
        unsafe { self.publish_reserved(r, v) };
        Ok(Push::Done { wake: false })
    }

    /// Whether a push would find room now. Reads the consumer's position (its cache
    /// line) only when the last one read says the ring is full.
    pub fn has_room(&mut self) -> Result<bool, Corrupt> {
        if self.tail.wrapping_sub(self.head_seen) < self.ring.cap {
            return Ok(true);
        }
        self.refresh_head()?;
        Ok(self.tail.wrapping_sub(self.head_seen) < self.ring.cap)
    }

    /// The position the next pushed value takes (values are numbered from 0).
    pub fn position(&self) -> u64 {
        self.tail
    }

    /// How many values the consumer has taken so far, read now.
    pub fn consumed(&mut self) -> Result<u64, Corrupt> {
        self.refresh_head()?;
        Ok(self.head_seen)
    }

    fn refresh_head(&mut self) -> Result<(), Corrupt> {
        // SYNC: pairs with the consumer's Release store of head.
        let head = self.ring.ctl().head.0.load(Ordering::Acquire);
        self.adopt_head(head)
    }

    /// Takes `head` as the consumer's position after checking it: it may not have moved
    /// backwards, nor past `tail`.
    fn adopt_head(&mut self, head: u64) -> Result<(), Corrupt> {
        let used = self.tail.wrapping_sub(head);
        if used > self.ring.cap || head.wrapping_sub(self.head_seen) > self.ring.cap {
            return Err(Corrupt);
        }
        self.head_seen = head;
        Ok(())
    }

    /// On a lossy ring (see the module docs): if the ring is full, takes its oldest entry
    /// away from the consumer and returns its position; the caller then owns that entry
    /// (the consumer will never see it). `None` if there is room (the consumer took
    /// something meanwhile). Must not be used on a ring whose consumer is not lossy.
    pub fn evict_oldest(&mut self) -> Result<Option<u64>, Corrupt> {
        // Each failed swap means the consumer moved `head` forward, and so made room:
        // the loop runs at most twice against a correct consumer.
        loop {
            self.refresh_head()?;
            if self.tail.wrapping_sub(self.head_seen) < self.ring.cap {
                return Ok(None);
            }
            let h = self.head_seen;
            // SYNC: AcqRel. Release: our later rewrite of the slot (and its `seq`) comes
            // after the swap for a consumer whose own swap fails on it. Acquire: a
            // consumer's successful swap (its copy of the entry) happens before we
            // rewrite the slot.
            match self.ring.ctl().head.0.compare_exchange(
                h,
                h.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.head_seen = h.wrapping_add(1);
                    return Ok(Some(h));
                }
                Err(now) => self.adopt_head(now)?,
            }
        }
    }

    /// Announces that the producer is about to block because the ring is full. Returns
    /// false if room appeared meanwhile (do not block). After true, block until woken,
    /// then call [`cancel_wait`](Self::cancel_wait) and retry.
    pub fn prepare_wait(&mut self) -> Result<bool, Corrupt> {
        let c = self.ring.ctl();
        c.wait_tail.0.store(self.tail, Ordering::Relaxed);
        // SYNC: Release so that a consumer seeing `waiting` (Acquire) sees `wait_tail`.
        c.waiting.0.store(1, Ordering::Release);
        // Dekker: waiting store, fence, head load (the consumer stores head, fences,
        // loads waiting).
        fence(Ordering::SeqCst);
        self.refresh_head()?;
        if self.tail.wrapping_sub(self.head_seen) < self.ring.cap {
            self.cancel_wait();
            return Ok(false);
        }
        Ok(true)
    }

    /// Clears the waiting flag.
    pub fn cancel_wait(&self) {
        self.ring.ctl().waiting.0.store(0, Ordering::Relaxed);
    }
}

impl<T: Entry> Consumer<T> {
    /// Makes this the consumer of a lossy ring (see the module docs): the producer may
    /// evict entries, and this side takes them with a compare-and-swap.
    pub fn with_lossy(mut self, lossy: bool) -> Self {
        self.lossy = lossy;
        self
    }

    /// Copies the value in the slot of position `i`.
    #[inline]
    fn read(&self, i: u64) -> T {
        let slot = self.ring.slot(i);
        // SAFETY: the slot lies in the ring's memory (see `Ring::slot`).
        // `Entry::read_shared` accepts whatever bytes are there (a faulty producer's, or
        // a torn copy on a lossy ring, which the caller then discards).
        unsafe { T::read_shared(std::ptr::addr_of!((*slot).val)) }
    }

    /// Takes the next value, if any, never blocking. The flag says the producer was
    /// waiting for room and the ring is now at most half full: wake it.
    pub fn try_pop(&mut self) -> Result<Option<(T, bool)>, Corrupt> {
        if self.lossy {
            return self.try_pop_lossy();
        }
        if !self.has_data_at_head() {
            return Ok(None);
        }
        // `seq` said the producer published this slot (Acquire, so its write of the
        // value is visible), and it will not rewrite it until we publish a head past it.
        let v = self.read(self.head);
        self.head = self.head.wrapping_add(1);
        // SYNC: pairs with the producer's Acquire load of head in `refresh_head`.
        self.ring.ctl().head.0.store(self.head, Ordering::Release);
        Ok(Some((v, self.after_pop())))
    }

    /// Takes up to `max` values, in order, handing each to `f`, and publishes the new
    /// `head` once for all of them: one store and one fence for the batch, where
    /// [`try_pop`](Self::try_pop) pays one of each per value. Returns how many were
    /// taken and, as `try_pop`'s flag, whether the producer waits for room and must be
    /// woken. (A lossy ring takes them one by one.)
    pub fn pop_batch(
        &mut self,
        max: usize,
        mut f: impl FnMut(T),
    ) -> Result<(usize, bool), Corrupt> {
        let (mut n, mut wake) = (0, false);
        if self.lossy {
            while n < max {
                let Some((v, w)) = self.try_pop_lossy()? else {
                    break;
                };
                f(v);
                wake |= w;
                n += 1;
            }
            return Ok((n, wake));
        }
        while n < max && self.has_data_at_head() {
            // As in `try_pop`: published (Acquire), and not rewritten by the producer
            // until a head past it is published, which happens below, after the copy.
            f(self.read(self.head));
            self.head = self.head.wrapping_add(1);
            n += 1;
        }
        if n == 0 {
            return Ok((0, false));
        }
        // SYNC: pairs with the producer's Acquire load of head in `refresh_head`.
        self.ring.ctl().head.0.store(self.head, Ordering::Release);
        Ok((n, self.after_pop()))
    }

    /// Reads the mark of the slot at `head` and forgets it: a load issued ahead, so that
    /// a later pop finds that cache line (written by the producer's core) at hand.
    #[inline]
    pub fn touch(&self) {
        std::hint::black_box(self.ring.seq(self.head).load(Ordering::Relaxed));
    }

    /// `try_pop` on a lossy ring: copy, then claim the entry with a swap of `head`.
    fn try_pop_lossy(&mut self) -> Result<Option<(T, bool)>, Corrupt> {
        for _ in 0..LOSSY_RETRIES {
            if !self.has_data_lossy()? {
                return Ok(None);
            }
            let h = self.head;
            let v = self.read(h);
            // SYNC: AcqRel. Release: our copy above happens before a producer's failing
            // eviction swap and so before it rewrites the slot. Acquire: pairs with the
            // producer's eviction swap when ours fails.
            match self.ring.ctl().head.0.compare_exchange(
                h,
                h.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.head = h.wrapping_add(1);
                    return Ok(Some((v, self.after_pop())));
                }
                // Evicted under us: `v` is not ours (and may be torn); forget it.
                Err(now) => self.adopt_head(now)?,
            }
        }
        Ok(None)
    }

    /// A lossy consumer's view of `head` as the producer may have moved it: forward
    /// only.
    fn adopt_head(&mut self, head: u64) -> Result<(), Corrupt> {
        if head.wrapping_sub(self.head) > u64::MAX / 2 {
            return Err(Corrupt);
        }
        self.head = head;
        Ok(())
    }

    /// True if an entry is ready at `head`, on a lossy ring: `head` is re-read, as the
    /// producer may have evicted entries (and reused their slots) since.
    fn has_data_lossy(&mut self) -> Result<bool, Corrupt> {
        for _ in 0..LOSSY_RETRIES {
            // SYNC: Acquire pairs with the producer's eviction swap (Release).
            let h = self.ring.ctl().head.0.load(Ordering::Acquire);
            self.adopt_head(h)?;
            // SYNC: pairs with the producer's Release store of `seq` in `try_push`.
            if self.ring.seq(h).load(Ordering::Acquire) == h.wrapping_add(1) {
                return Ok(true);
            }
            // Not ready, or the slot already holds a later lap: the producer then evicted
            // `h` before writing it, and (Acquire above) this load sees that. (Without
            // this re-read `try_pop` could say "nothing yet" with entries queued; a
            // sleep would still be safe, as `prepare_sleep`'s fence orders it.)
            if self.ring.ctl().head.0.load(Ordering::Acquire) == h {
                return Ok(false);
            }
        }
        Ok(false)
    }

    /// After taking an entry: the Dekker half of the producer's wait, and whether to wake
    /// it.
    #[inline]
    fn after_pop(&self) -> bool {
        // Dekker: head store, fence, waiting load (see `Producer::prepare_wait`).
        fence(Ordering::SeqCst);
        let c = self.ring.ctl();
        // SYNC: Acquire pairs with the producer's Release store of `waiting`, making
        // `wait_tail` visible.
        c.waiting.0.load(Ordering::Acquire) != 0
            && c.wait_tail
                .0
                .load(Ordering::Relaxed)
                .wrapping_sub(self.head)
                <= self.ring.cap / 2
            && c.waiting
                .0
                .compare_exchange(1, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// True if an entry is ready.
    pub fn has_data(&mut self) -> Result<bool, Corrupt> {
        if self.lossy {
            return self.has_data_lossy();
        }
        Ok(self.has_data_at_head())
    }

    /// True if the entry at our `head` is published (a non-lossy ring: nobody else
    /// moves `head`).
    #[inline]
    fn has_data_at_head(&self) -> bool {
        // SYNC: pairs with the producer's Release store of `seq` in `try_push`.
        self.ring.seq(self.head).load(Ordering::Acquire) == self.head.wrapping_add(1)
    }

    /// Announces that the consumer is about to block on an empty ring. Returns false if
    /// data arrived meanwhile (do not block). After true, block until woken, then call
    /// [`cancel_sleep`](Self::cancel_sleep) and retry.
    pub fn prepare_sleep(&mut self) -> Result<bool, Corrupt> {
        self.ring
            .ctl()
            .sleeping
            .0
            .store(self.sleep_mark, Ordering::Relaxed);
        // Dekker: sleeping store, fence, seq load (see `Producer::try_push`).
        fence(Ordering::SeqCst);
        if self.has_data()? {
            self.cancel_sleep();
            return Ok(false);
        }
        Ok(true)
    }

    /// Asks a producer that wakes several consumers at once to wake this one after the
    /// others (or, with false, among the first: the default).
    pub fn set_wake_last(&mut self, last: bool) {
        self.sleep_mark = if last { SLEEPS_LAST } else { SLEEPS };
    }

    /// Clears the sleeping flag.
    pub fn cancel_sleep(&self) {
        self.ring.ctl().sleeping.0.store(0, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Ring memory owned through raw pointers only, as in shared memory (so that Miri's
    /// aliasing model sees no `&mut` to it while the two sides use it).
    struct Mem {
        ctl: NonNull<RingCtl>,
        slots: NonNull<Slot<u64>>,
        cap: usize,
    }

    impl Mem {
        fn ctl(&self) -> &RingCtl {
            // SAFETY: allocated in `pair`, freed only in `drop`.
            unsafe { self.ctl.as_ref() }
        }
    }

    impl Drop for Mem {
        fn drop(&mut self) {
            // SAFETY: both came from `Box::into_raw` in `pair` and are freed once, here.
            unsafe {
                drop(Box::from_raw(self.ctl.as_ptr()));
                drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    self.slots.as_ptr(),
                    self.cap,
                )));
            }
        }
    }

    fn pair(cap: u64) -> (Mem, Producer<u64>, Consumer<u64>) {
        let ctl = NonNull::new(Box::into_raw(Box::<RingCtl>::default())).unwrap();
        let slots = Slot::<u64>::boxed(cap);
        let slots = NonNull::new(Box::into_raw(slots).cast::<Slot<u64>>()).unwrap();
        let m = Mem {
            ctl,
            slots,
            cap: cap as usize,
        };
        // SAFETY: `m` outlives both sides in every test, one producer and one consumer.
        let (p, c) = unsafe { (producer(ctl, slots, cap), consumer(ctl, slots, cap)) };
        (m, p, c)
    }

    #[test]
    fn layout_puts_each_writer_on_its_own_line() {
        assert_eq!(std::mem::size_of::<RingCtl>(), 256);
        assert_eq!(std::mem::offset_of!(RingCtl, wait_tail), 64);
        assert_eq!(std::mem::size_of::<Slot<u64>>(), 16);
        assert_eq!(std::mem::offset_of!(RingCtl, sleeping), 128);
        assert_eq!(std::mem::offset_of!(RingCtl, waiting), 192);
    }

    #[test]
    fn fifo_and_full() {
        let (_m, mut p, mut c) = pair(4);
        for i in 0..4 {
            assert_eq!(p.try_push(i), Ok(Push::Done { wake: false }));
        }
        assert_eq!(p.try_push(9), Ok(Push::Full(9)));
        for i in 0..4 {
            assert_eq!(c.try_pop().unwrap().unwrap().0, i);
        }
        assert_eq!(c.try_pop(), Ok(None));
        // Wraps around many times.
        for i in 0..1000u64 {
            assert!(matches!(p.try_push(i), Ok(Push::Done { .. })));
            assert_eq!(c.try_pop().unwrap().unwrap().0, i);
        }
    }

    #[test]
    fn a_reserved_place_publishes_in_order_and_none_when_full() {
        let (_m, mut p, mut c) = pair(4);
        p.try_push(10).unwrap();
        let r = p.reserve().unwrap().expect("room");
        assert_eq!(r.position(), 1);
        // Not visible before it is published.
        assert_eq!(c.try_pop().unwrap().unwrap().0, 10);
        assert_eq!(c.try_pop(), Ok(None));
        // SAFETY: reserved just above, nothing pushed since.
        unsafe { p.publish_reserved(r, 11) };
        assert_eq!(p.position(), 2);
        assert_eq!(c.try_pop().unwrap().unwrap().0, 11);
        // A reservation left unused takes no place.
        let _unused = p.reserve().unwrap();
        p.try_push(12).unwrap();
        assert_eq!(c.try_pop().unwrap().unwrap().0, 12);
        // Full: no place to reserve, and after a pop, the freed one (wrapping around).
        for i in 0..4 {
            p.try_push(20 + i).unwrap();
        }
        assert!(p.reserve().unwrap().is_none());
        assert_eq!(c.try_pop().unwrap().unwrap().0, 20);
        let r = p.reserve().unwrap().expect("room after a pop");
        assert_eq!(r.position(), 7);
        // SAFETY: as above.
        unsafe { p.publish_reserved(r, 24) };
        for i in 21..25 {
            assert_eq!(c.try_pop().unwrap().unwrap().0, i);
        }
    }

    #[test]
    fn a_value_written_at_a_reservation_is_seen_only_once_published() {
        let (_m, mut p, mut c) = pair(2);
        let r = p.reserve().unwrap().expect("room");
        // SAFETY: reserved just above, nothing pushed since (both writes and the
        // publication use the same reservation).
        unsafe { Producer::write_reserved(&r, 30) };
        assert_eq!(c.try_pop(), Ok(None), "written but not yet published");
        // SAFETY: as above.
        unsafe { Producer::write_reserved(&r, 31) };
        assert_eq!(c.try_pop(), Ok(None));
        // SAFETY: as above; the slot was written since the reservation.
        unsafe { p.publish_written(r) };
        assert_eq!(
            c.try_pop().unwrap().unwrap().0,
            31,
            "the last value written"
        );
        // Written and never published (a dropped loan): the next push takes the place.
        let r = p.reserve().unwrap().expect("room");
        // SAFETY: as above.
        unsafe { Producer::write_reserved(&r, 40) };
        p.try_push(41).unwrap();
        assert_eq!(c.try_pop().unwrap().unwrap().0, 41);
        assert_eq!(c.try_pop(), Ok(None));
    }

    #[test]
    fn wakes_sleeping_consumer_once_on_empty_to_nonempty() {
        let (_m, mut p, mut c) = pair(8);
        assert_eq!(c.prepare_sleep(), Ok(true));
        assert_eq!(p.try_push(1), Ok(Push::Done { wake: true }));
        // The consumer has not run yet: further pushes do not wake again.
        assert_eq!(p.try_push(2), Ok(Push::Done { wake: false }));
        // A consumer that is not sleeping is never woken.
        c.cancel_sleep();
        assert_eq!(c.try_pop().unwrap().unwrap().0, 1);
        assert_eq!(p.try_push(3), Ok(Push::Done { wake: false }));
        // Data present: the consumer must not go to sleep.
        assert_eq!(c.prepare_sleep(), Ok(false));
    }

    #[test]
    fn full_producer_is_woken_at_half_empty() {
        let (_m, mut p, mut c) = pair(8);
        for i in 0..8 {
            p.try_push(i).unwrap();
        }
        assert_eq!(p.prepare_wait(), Ok(true));
        let wakes: Vec<bool> = (0..8).map(|_| c.try_pop().unwrap().unwrap().1).collect();
        // Woken exactly once, when 4 of 8 remain.
        assert_eq!(
            wakes,
            vec![false, false, false, true, false, false, false, false]
        );
    }

    #[test]
    fn corrupt_indices_are_detected() {
        let (m, mut p, mut c) = pair(4);
        // A slot whose mark is not exactly the expected one is not ready, whatever it
        // holds (a stale lap, or garbage).
        for bad in [0, 2, 5, u64::MAX] {
            // SAFETY: slot 0 of the ring `m` owns; no side is using it concurrently.
            unsafe { (*m.slots.as_ptr()).seq.store(bad, Ordering::Relaxed) };
            assert_eq!(c.try_pop(), Ok(None));
        }
        // SAFETY: as above.
        unsafe { (*m.slots.as_ptr()).seq.store(0, Ordering::Relaxed) };
        for i in 0..4 {
            p.try_push(i).unwrap();
        }
        m.ctl().head.0.store(u64::MAX - 3, Ordering::Relaxed);
        assert_eq!(p.try_push(5), Err(Corrupt));
    }

    #[test]
    fn lossy_producer_evicts_the_oldest_and_the_consumer_skips_it() {
        let (_m, mut p, c) = pair(4);
        let mut c = c.with_lossy(true);
        assert_eq!(
            p.evict_oldest(),
            Ok(None),
            "nothing to evict while there is room"
        );
        for i in 0..4 {
            p.try_push(i).unwrap();
        }
        assert_eq!(p.try_push(4), Ok(Push::Full(4)));
        assert_eq!(p.evict_oldest(), Ok(Some(0)));
        assert_eq!(p.try_push(4), Ok(Push::Done { wake: false }));
        assert_eq!(p.try_push(5), Ok(Push::Full(5)));
        assert_eq!(p.evict_oldest(), Ok(Some(1)));
        p.try_push(5).unwrap();
        for want in 2..6 {
            assert_eq!(c.try_pop().unwrap().unwrap().0, want);
        }
        assert_eq!(c.try_pop(), Ok(None));
        // Many laps while the consumer does not run: it then finds the newest four, even
        // though the slot at its old head holds a later lap.
        let mut evicted = Vec::new();
        for i in 6..1000u64 {
            if let Push::Full(v) = p.try_push(i).unwrap() {
                evicted.push(p.evict_oldest().unwrap().unwrap());
                assert_eq!(p.try_push(v), Ok(Push::Done { wake: false }));
            }
        }
        assert_eq!(evicted, (6..996).collect::<Vec<_>>());
        assert!(c.has_data().unwrap());
        let got: Vec<u64> = std::iter::from_fn(|| c.try_pop().unwrap().map(|(v, _)| v)).collect();
        assert_eq!(got, vec![996, 997, 998, 999]);
        assert_eq!(c.prepare_sleep(), Ok(true));
        c.cancel_sleep();
    }

    #[test]
    fn lossy_head_moved_backwards_or_past_tail_is_corrupt() {
        let (m, mut p, c) = pair(4);
        let mut c = c.with_lossy(true);
        for i in 0..4 {
            p.try_push(i).unwrap();
        }
        for _ in 0..3 {
            c.try_pop().unwrap().unwrap();
        }
        assert_eq!(p.consumed(), Ok(3));
        // The producer moved head backwards: the lossy consumer refuses it.
        m.ctl().head.0.store(1, Ordering::Relaxed);
        assert_eq!(c.try_pop(), Err(Corrupt));
        assert_eq!(c.has_data(), Err(Corrupt));
        // The consumer moved head past tail, or backwards: the producer refuses it when
        // it would evict.
        for bad in [5, 0] {
            m.ctl().head.0.store(bad, Ordering::Relaxed);
            assert_eq!(p.evict_oldest(), Err(Corrupt), "head {bad}");
        }
    }
}

/// Loom models of the ring: one producer thread and one consumer thread, every
/// interleaving up to a preemption bound and the weak-memory outcomes loom models. Run
/// with `RUSTFLAGS="--cfg loom" cargo test -p ferry --lib --release loom_tests`.
///
/// The flags are cleared with `compare_exchange(1, 0)` rather than `swap(0)`: the two
/// are equivalent here (only 0 and 1 are stored), the exchange skips a write when the
/// flag is already clear, and loom 0.7 misorders a `swap` that returns 0 against a later
/// store by the other thread (tokio-rs/loom#254), reporting a lost wake-up that C++20
/// fence rules forbid.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::{Arc, Condvar, Mutex};
    use loom::thread;

    const CAP: u64 = 2;

    /// The ring's memory, as a process would map it: control words and [`CAP`] slots.
    struct Mem {
        _ctl: Box<RingCtl>,
        _slots: Box<[Slot<u64>]>,
    }

    // SAFETY: the tests only keep `Mem` alive; the two sides reach its memory through
    // raw pointers, under the ring protocol.
    unsafe impl Send for Mem {}
    // SAFETY: as above.
    unsafe impl Sync for Mem {}

    /// A ring of capacity [`CAP`] and both its sides. Keep the `Mem` until both sides
    /// are gone (the models join their thread before dropping it).
    fn pair() -> (Mem, Producer<u64>, Consumer<u64>) {
        let mut ctl: Box<RingCtl> = Box::default();
        let mut slots = Slot::<u64>::boxed(CAP);
        let ctl_ptr = NonNull::from(&mut *ctl);
        let slots_ptr = NonNull::new(slots.as_mut_ptr()).expect("a boxed slice is non-null");
        // SAFETY: the boxes' contents do not move when the boxes move into `Mem`, which
        // the caller keeps until both sides are dropped; one producer, one consumer;
        // `CAP` is a power of two and the memory starts zeroed.
        let (p, c) = unsafe {
            (
                producer(ctl_ptr, slots_ptr, CAP),
                consumer(ctl_ptr, slots_ptr, CAP),
            )
        };
        (
            Mem {
                _ctl: ctl,
                _slots: slots,
            },
            p,
            c,
        )
    }

    /// An eventfd, modelled: `notify` adds one; `wait` blocks until the count is
    /// non-zero, then resets it (so a stale notification only causes a spurious wake).
    #[derive(Default)]
    struct EventFd {
        count: Mutex<u64>,
        cv: Condvar,
    }

    impl EventFd {
        fn notify(&self) {
            let mut n = self.count.lock().unwrap();
            *n += 1;
            self.cv.notify_one();
        }

        fn wait(&self) {
            let mut n = self.count.lock().unwrap();
            while *n == 0 {
                n = self.cv.wait(n).unwrap();
            }
            *n = 0;
        }
    }

    /// Runs `f` under loom with at most 3 preemptions, unless `LOOM_MAX_PREEMPTIONS`
    /// says otherwise.
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        if b.preemption_bound.is_none() {
            b.preemption_bound = Some(3);
        }
        b.check(f);
    }

    /// Pushes `v` and notifies `data` iff `try_push` says the consumer sleeps. On a full
    /// ring: with `room`, sleeps on it after the `prepare_wait` handshake; without, yields.
    fn push_blocking(p: &mut Producer<u64>, v: u64, data: &EventFd, room: Option<&EventFd>) {
        loop {
            match p.try_push(v).unwrap() {
                Push::Done { wake } => {
                    if wake {
                        data.notify();
                    }
                    return;
                }
                Push::Full(back) => {
                    assert_eq!(back, v);
                    match room {
                        Some(room) => {
                            if p.prepare_wait().unwrap() {
                                room.wait();
                                p.cancel_wait();
                            }
                        }
                        None => thread::yield_now(),
                    }
                }
            }
        }
    }

    /// Pops one value, notifying `room` iff `try_pop` says the producer waits. On an
    /// empty ring: with `data`, sleeps on it after the `prepare_sleep` handshake;
    /// without, yields.
    fn pop_blocking(c: &mut Consumer<u64>, data: Option<&EventFd>, room: Option<&EventFd>) -> u64 {
        loop {
            match c.try_pop().unwrap() {
                Some((v, wake)) => {
                    if wake {
                        room.expect("only a producer with an eventfd waits")
                            .notify();
                    }
                    return v;
                }
                None => match data {
                    Some(data) => {
                        if c.prepare_sleep().unwrap() {
                            data.wait();
                            c.cancel_sleep();
                        }
                    }
                    None => thread::yield_now(),
                },
            }
        }
    }

    /// Sends `n` values from a producer thread to the consumer on this thread. Each side
    /// blocks on its eventfd if `*_blocks`, and otherwise yields and retries. Loom reports
    /// a lost wake-up as a deadlock.
    fn transfer(n: u64, consumer_blocks: bool, producer_blocks: bool) {
        model(move || {
            // `_mem` is declared first, so it is dropped after both sides.
            let (_mem, mut p, mut c) = pair();
            let data = Arc::new(EventFd::default());
            let room = Arc::new(EventFd::default());
            let (d, r) = (data.clone(), room.clone());
            let t = thread::spawn(move || {
                for i in 0..n {
                    push_blocking(&mut p, i, &d, producer_blocks.then_some(&*r));
                }
            });
            let got: Vec<u64> = (0..n)
                .map(|_| pop_blocking(&mut c, consumer_blocks.then_some(&*data), Some(&*room)))
                .collect();
            t.join().unwrap();
            assert_eq!(got, (0..n).collect::<Vec<_>>());
            assert_eq!(c.try_pop().unwrap(), None);
        });
    }

    /// (a) Three values through a ring of two arrive once each, in order.
    #[test]
    fn fifo_three_through_two() {
        transfer(3, false, false);
    }

    /// A place claimed first and written only later, with nothing the claim held (a
    /// publisher's loan: `Sender::claim` at the loan, under the sender's state lock; the
    /// descriptor and the payload written at the send by `Claimed::publish`, without
    /// it), then published with its one mark store: a consumer that takes the entry
    /// sees everything written before the mark, the value and the payload it names.
    #[test]
    fn claimed_place_written_later_is_seen_whole() {
        model(|| {
            let (_mem, mut p, mut c) = pair();
            let payload = Arc::new(loom::cell::UnsafeCell::new(0u64));
            let pl = payload.clone();
            let t = thread::spawn(move || {
                let v = pop_blocking(&mut c, None, None);
                // SAFETY: the entry is published, and the producer writes the payload only
                // before that (loom reports a read that races with the write).
                let seen = pl.with(|x| unsafe { *x });
                (v, seen)
            });
            let r = p.reserve().unwrap().expect("an empty ring has room");
            p.claim(&r);
            // SAFETY: nothing else publishes this payload; the consumer reads it only once
            // the entry below is published.
            payload.with_mut(|x| unsafe { *x = 7 });
            // SAFETY: `r` was reserved and claimed above, nothing pushed since; the ring's
            // memory lives in `_mem` until the end of the model.
            unsafe {
                Producer::write_reserved(&r, 42);
                Producer::publish_claimed(&r);
            }
            assert_eq!(t.join().unwrap(), (42, 7));
        });
    }

    /// (b) A consumer that sleeps on an empty ring after `prepare_sleep` is always woken
    /// by the producer's `Push::Done { wake: true }`.
    #[test]
    fn consumer_sleep_has_no_lost_wakeup() {
        transfer(2, true, false);
    }

    /// (f) A producer feeding two rings (a publisher and two subscribers) pushes to both
    /// with `try_push_unfenced`, then issues one fence and asks each ring whether its
    /// consumer sleeps: each consumer, sleeping on its empty ring after `prepare_sleep`,
    /// is always woken.
    #[test]
    fn one_fence_for_two_rings_loses_no_wakeup() {
        model(|| {
            let (_m1, mut p1, mut c1) = pair();
            let (_m2, mut p2, mut c2) = pair();
            let (d1, d2) = (Arc::new(EventFd::default()), Arc::new(EventFd::default()));
            let (e1, e2) = (d1.clone(), d2.clone());
            let t = thread::spawn(move || {
                assert_eq!(p1.try_push_unfenced(1).unwrap(), Push::Done { wake: false });
                assert_eq!(p2.try_push_unfenced(2).unwrap(), Push::Done { wake: false });
                fence(Ordering::SeqCst);
                for (p, d) in [(&p1, &e1), (&p2, &e2)] {
                    if p.ring.ctl().take_sleeper() {
                        d.notify();
                    }
                }
            });
            let other = thread::spawn(move || pop_blocking(&mut c2, Some(&*d2), None));
            assert_eq!(pop_blocking(&mut c1, Some(&*d1), None), 1);
            assert_eq!(other.join().unwrap(), 2);
            t.join().unwrap();
        });
    }

    /// (b) with three values, so the consumer sleeps again after a cancelled sleep. See
    /// the module docs for why loom 0.7 cannot check it against the current ring.
    #[test]
    fn consumer_sleep_has_no_lost_wakeup_3() {
        transfer(3, true, false);
    }

    /// (c) A producer that waits on a full ring after `prepare_wait` is always woken by
    /// the consumer's `try_pop` flag.
    #[test]
    fn producer_wait_has_no_lost_wakeup() {
        transfer(3, false, true);
    }

    /// (b) and (c) at once, as a channel's sender and receiver run.
    #[test]
    fn both_sides_block_without_lost_wakeups() {
        transfer(3, true, true);
    }

    /// (g) A consumer that takes values in batches (`pop_batch`: one head store and one
    /// fence per batch, as a sender collects releases) loses no wake-up of a producer
    /// waiting on the full ring, and gets every value once, in order.
    #[test]
    fn batched_pops_lose_no_producer_wakeup() {
        model(|| {
            let (_mem, mut p, mut c) = pair();
            let room = Arc::new(EventFd::default());
            let data = Arc::new(EventFd::default());
            let (r, d) = (room.clone(), data.clone());
            let t = thread::spawn(move || {
                for i in 0..4 {
                    push_blocking(&mut p, i, &d, Some(&*r));
                }
            });
            let mut got = Vec::new();
            while got.len() < 4 {
                let (n, wake) = c.pop_batch(CAP as usize, |v| got.push(v)).unwrap();
                if wake {
                    room.notify();
                }
                if n == 0 && c.prepare_sleep().unwrap() {
                    data.wait();
                    c.cancel_sleep();
                }
            }
            t.join().unwrap();
            assert_eq!(got, (0..4).collect::<Vec<_>>());
            assert_eq!(c.pop_batch(CAP as usize, |_| ()).unwrap(), (0, false));
        });
    }

    /// (d) A lossy ring: the producer evicts the oldest entry when the ring is full while
    /// the consumer pops (`pops` attempts during the pushes, then a drain). Every value
    /// is either taken by the consumer, in order, or handed back to the producer by
    /// `evict_oldest`, never both and never neither; the newest is always taken.
    fn lossy(n: u64, pops: usize) {
        model(move || {
            let (_mem, mut p, c) = pair();
            let mut c = c.with_lossy(true);
            let t = thread::spawn(move || {
                let mut evicted = Vec::new();
                for i in 0..n {
                    loop {
                        match p.try_push(i).unwrap() {
                            Push::Done { .. } => break,
                            Push::Full(_) => evicted.extend(p.evict_oldest().unwrap()),
                        }
                    }
                }
                evicted
            });
            let mut got = Vec::new();
            for _ in 0..pops {
                got.extend(c.try_pop().unwrap().map(|(v, _)| v));
            }
            let evicted = t.join().unwrap();
            while let Some((v, _)) = c.try_pop().unwrap() {
                got.push(v);
            }
            assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
            let mut all: Vec<u64> = got.iter().chain(&evicted).copied().collect();
            all.sort_unstable();
            assert_eq!(all, (0..n).collect::<Vec<_>>(), "{got:?} {evicted:?}");
            assert_eq!(got.last(), Some(&(n - 1)));
        });
    }

    /// (e) A lossy consumer that sleeps on what looks like an empty ring while the
    /// producer evicts (and reuses the slot at the consumer's old head) is always woken:
    /// it takes values until the last one, which is never evicted.
    fn lossy_blocking(n: u64) {
        model(move || {
            let (_mem, mut p, c) = pair();
            let mut c = c.with_lossy(true);
            let data = Arc::new(EventFd::default());
            let d = data.clone();
            let t = thread::spawn(move || {
                let mut evicted = Vec::new();
                for i in 0..n {
                    loop {
                        match p.try_push(i).unwrap() {
                            Push::Done { wake } => {
                                if wake {
                                    d.notify();
                                }
                                break;
                            }
                            Push::Full(_) => evicted.extend(p.evict_oldest().unwrap()),
                        }
                    }
                }
                evicted
            });
            let mut got = Vec::new();
            loop {
                let v = pop_blocking(&mut c, Some(&*data), None);
                got.push(v);
                if v == n - 1 {
                    break;
                }
            }
            let evicted = t.join().unwrap();
            assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
            let mut all: Vec<u64> = got.iter().chain(&evicted).copied().collect();
            all.sort_unstable();
            assert_eq!(all, (0..n).collect::<Vec<_>>(), "{got:?} {evicted:?}");
        });
    }

    #[test]
    fn lossy_consumer_sleep_has_no_lost_wakeup() {
        lossy_blocking(4);
    }

    #[test]
    fn lossy_evict_races_pop_3() {
        lossy(3, 1);
    }

    #[test]
    fn lossy_evict_races_pop_4() {
        lossy(4, 2);
    }
}
