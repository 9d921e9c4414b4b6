//! A single-producer single-consumer ring in shared memory, with wake-up suppression.
//!
//! ```text
//!  RingCtl (one cache line per writer)        slots: [T; cap], cap a power of two
//!  +------------------------+
//!  | head      (consumer)   |   consumer reads slots[head % cap], then bumps head
//!  | tail      (producer)   |   producer writes slots[tail % cap], then bumps tail
//!  | sleeping  (consumer=1) |   set by a consumer about to block; cleared by the
//!  |                        |   producer that wakes it
//!  | waiting   (producer=1) |   set by a producer that found the ring full; cleared by
//!  +------------------------+   the consumer that wakes it at half empty
//! ```
//!
//! The producer wakes the consumer only when the consumer has said it sleeps, which it
//! does only after seeing the ring empty: so a wake-up happens only on an empty to
//! non-empty transition, and never while the consumer is busy. Both sleep handshakes
//! are the Dekker pattern: each side stores its flag (or index), issues a SeqCst fence,
//! then loads the other side's index (or flag), so at least one of them sees the other.
//!
//! Indices read from shared memory are not trusted: a value that would put more than
//! `cap` entries in the ring is reported as [`Corrupt`].

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
    tail: Padded<AtomicU64>,
    sleeping: Padded<AtomicU32>,
    waiting: Padded<AtomicU32>,
}

/// The peer wrote an index that cannot be right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Corrupt;

/// One side's view of a ring.
#[derive(Debug)]
struct Ring<T> {
    ctl: NonNull<RingCtl>,
    slots: NonNull<T>,
    cap: u64,
}

impl<T: Copy> Ring<T> {
    fn ctl(&self) -> &RingCtl {
        // SAFETY: `new` requires `ctl` to stay valid for the ring's lifetime; all its
        // fields are atomics, so shared access from both processes is sound.
        unsafe { self.ctl.as_ref() }
    }

    fn slot(&self, i: u64) -> *mut T {
        // SAFETY: `i % cap < cap`, and `new` requires `cap` slots behind `slots`.
        unsafe { self.slots.as_ptr().add((i & (self.cap - 1)) as usize) }
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
    tail_seen: u64,
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

/// Builds both sides over the same memory (for tests and in-process use), or one side
/// each in two processes.
///
/// # Safety
/// `ctl` must point to a `RingCtl` and `slots` to `cap` slots of `T`, both valid (and
/// zero-initialised or left by a previous pair) for as long as the returned sides live.
/// At most one `Producer` and one `Consumer` may exist for a ring at a time, in any
/// processes. `cap` must be a power of two.
pub(crate) unsafe fn producer<T: Copy>(ctl: NonNull<RingCtl>, slots: NonNull<T>, cap: u64) -> Producer<T> {
    assert!(cap.is_power_of_two());
    let ring = Ring { ctl, slots, cap };
    // SYNC: pairs with the consumer's Release store of head.
    let head = ring.ctl().head.0.load(Ordering::Acquire);
    let tail = ring.ctl().tail.0.load(Ordering::Relaxed);
    Producer { ring, tail, head_seen: head }
}

/// The consumer side; see [`producer`].
///
/// # Safety
/// As for [`producer`].
pub(crate) unsafe fn consumer<T: Copy>(ctl: NonNull<RingCtl>, slots: NonNull<T>, cap: u64) -> Consumer<T> {
    assert!(cap.is_power_of_two());
    let ring = Ring { ctl, slots, cap };
    let head = ring.ctl().head.0.load(Ordering::Relaxed);
    // SYNC: pairs with the producer's Release store of tail.
    let tail = ring.ctl().tail.0.load(Ordering::Acquire);
    Consumer { ring, head, tail_seen: tail }
}

impl<T: Copy> Producer<T> {
    /// Stores `v` if there is room, never blocking.
    pub fn try_push(&mut self, v: T) -> Result<Push<T>, Corrupt> {
        if self.tail.wrapping_sub(self.head_seen) >= self.ring.cap {
            self.refresh_head()?;
            if self.tail.wrapping_sub(self.head_seen) >= self.ring.cap {
                return Ok(Push::Full(v));
            }
        }
        // SAFETY: the slot at `tail` is not visible to the consumer until we publish the
        // new tail below, and the consumer is done with it (head has passed it).
        unsafe { self.ring.slot(self.tail).write_volatile(v) };
        self.tail = self.tail.wrapping_add(1);
        // SYNC: pairs with the consumer's Acquire load of tail in `try_pop`/`prepare_sleep`.
        self.ring.ctl().tail.0.store(self.tail, Ordering::Release);
        // Dekker: tail store above, fence, then load `sleeping` (the consumer stores
        // `sleeping`, fences, loads tail).
        fence(Ordering::SeqCst);
        let c = self.ring.ctl();
        let wake = c.sleeping.0.load(Ordering::Relaxed) != 0 && c.sleeping.0.swap(0, Ordering::AcqRel) != 0;
        Ok(Push::Done { wake })
    }

    fn refresh_head(&mut self) -> Result<(), Corrupt> {
        // SYNC: pairs with the consumer's Release store of head.
        let head = self.ring.ctl().head.0.load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > self.ring.cap || head.wrapping_sub(self.head_seen) > self.ring.cap {
            return Err(Corrupt);
        }
        self.head_seen = head;
        Ok(())
    }

    /// Announces that the producer is about to block because the ring is full. Returns
    /// false if room appeared meanwhile (do not block). After true, block until woken,
    /// then call [`cancel_wait`](Self::cancel_wait) and retry.
    pub fn prepare_wait(&mut self) -> Result<bool, Corrupt> {
        self.ring.ctl().waiting.0.store(1, Ordering::Relaxed);
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

impl<T: Copy> Consumer<T> {
    /// Takes the next value, if any, never blocking. The flag says the producer was
    /// waiting for room and the ring is now at most half full: wake it.
    pub fn try_pop(&mut self) -> Result<Option<(T, bool)>, Corrupt> {
        if self.head == self.tail_seen {
            self.refresh_tail()?;
            if self.head == self.tail_seen {
                return Ok(None);
            }
        }
        // SAFETY: head < tail_seen, and the producer published that slot before the tail
        // we loaded with Acquire; it will not rewrite it until we publish a head past it.
        let v = unsafe { self.ring.slot(self.head).read_volatile() };
        self.head = self.head.wrapping_add(1);
        // SYNC: pairs with the producer's Acquire load of head in `refresh_head`.
        self.ring.ctl().head.0.store(self.head, Ordering::Release);
        // Dekker: head store, fence, waiting load (see `Producer::prepare_wait`).
        fence(Ordering::SeqCst);
        let c = self.ring.ctl();
        let wake = c.waiting.0.load(Ordering::Relaxed) != 0
            && self.tail_seen.wrapping_sub(self.head) <= self.ring.cap / 2
            && c.waiting.0.swap(0, Ordering::AcqRel) != 0;
        Ok(Some((v, wake)))
    }

    fn refresh_tail(&mut self) -> Result<(), Corrupt> {
        // SYNC: pairs with the producer's Release store of tail.
        let tail = self.ring.ctl().tail.0.load(Ordering::Acquire);
        if tail.wrapping_sub(self.head) > self.ring.cap {
            return Err(Corrupt);
        }
        self.tail_seen = tail;
        Ok(())
    }

    /// True if an entry is ready (refreshes the producer's index).
    pub fn has_data(&mut self) -> Result<bool, Corrupt> {
        if self.head != self.tail_seen {
            return Ok(true);
        }
        self.refresh_tail()?;
        Ok(self.head != self.tail_seen)
    }

    /// Announces that the consumer is about to block on an empty ring. Returns false if
    /// data arrived meanwhile (do not block). After true, block until woken, then call
    /// [`cancel_sleep`](Self::cancel_sleep) and retry.
    pub fn prepare_sleep(&mut self) -> Result<bool, Corrupt> {
        self.ring.ctl().sleeping.0.store(1, Ordering::Relaxed);
        // Dekker: sleeping store, fence, tail load (see `Producer::try_push`).
        fence(Ordering::SeqCst);
        if self.has_data()? {
            self.cancel_sleep();
            return Ok(false);
        }
        Ok(true)
    }

    /// Clears the sleeping flag.
    pub fn cancel_sleep(&self) {
        self.ring.ctl().sleeping.0.store(0, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    struct Mem {
        ctl: Box<RingCtl>,
        slots: Vec<u64>,
    }

    fn pair(cap: u64) -> (Mem, Producer<u64>, Consumer<u64>) {
        let mut m = Mem { ctl: Box::default(), slots: vec![0; cap as usize] };
        let ctl = NonNull::from(&mut *m.ctl);
        let slots = NonNull::new(m.slots.as_mut_ptr()).unwrap();
        // SAFETY: `m` outlives both sides in every test, one producer and one consumer.
        let (p, c) = unsafe { (producer(ctl, slots, cap), consumer(ctl, slots, cap)) };
        (m, p, c)
    }

    #[test]
    fn layout_puts_each_writer_on_its_own_line() {
        assert_eq!(std::mem::size_of::<RingCtl>(), 256);
        assert_eq!(std::mem::offset_of!(RingCtl, tail), 64);
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
        assert_eq!(wakes, vec![false, false, false, true, false, false, false, false]);
    }

    #[test]
    fn corrupt_indices_are_detected() {
        let (m, mut p, mut c) = pair(4);
        m.ctl.tail.0.store(100, Ordering::Relaxed);
        assert_eq!(c.try_pop(), Err(Corrupt));
        m.ctl.tail.0.store(0, Ordering::Relaxed);
        for i in 0..4 {
            p.try_push(i).unwrap();
        }
        m.ctl.head.0.store(u64::MAX - 3, Ordering::Relaxed);
        assert_eq!(p.try_push(5), Err(Corrupt));
    }
}

/// Loom models of the ring: every interleaving (and every weak-memory outcome loom
/// models) of one producer thread and one consumer thread. Run with
/// `RUSTFLAGS="--cfg loom" cargo test -p ferry --lib --release loom_tests`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::{Arc, Condvar, Mutex};
    use loom::thread;

    /// The ring's memory: control words and two slots, as a process would map them.
    struct Mem {
        ctl: Box<RingCtl>,
        slots: Box<[u64]>,
    }

    const CAP: u64 = 2;

    /// Builds a ring of capacity [`CAP`] and both of its sides. The memory is leaked
    /// into the returned `Arc` and must outlive both sides (tests join their threads
    /// before it drops).
    fn pair() -> (Arc<Mem>, Producer<u64>, Consumer<u64>) {
        let mut m = Mem { ctl: Box::default(), slots: vec![0; CAP as usize].into_boxed_slice() };
        let ctl = NonNull::from(&mut *m.ctl);
        let slots = NonNull::new(m.slots.as_mut_ptr()).expect("boxed slice is non-null");
        // SAFETY: the boxes do not move when `m` moves into the Arc; every test keeps the
        // Arc alive until both threads are joined; one producer, one consumer.
        let (p, c) = unsafe { (producer(ctl, slots, CAP), consumer(ctl, slots, CAP)) };
        (Arc::new(m), p, c)
    }

    // SAFETY: `Mem` is only kept alive, never touched, by the tests; the sides reach it
    // through raw pointers under the ring protocol.
    unsafe impl Send for Mem {}
    // SAFETY: as above.
    unsafe impl Sync for Mem {}

    /// An eventfd, modelled: `notify` adds one, `wait` blocks until the count is non-zero
    /// and resets it.
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

    /// Runs `f` under loom, bounding preemptions to 3 unless `LOOM_MAX_PREEMPTIONS` says
    /// otherwise.
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        if b.preemption_bound.is_none() {
            b.preemption_bound = Some(3);
        }
        b.check(f);
    }

    /// Pushes `v`, waking the consumer when told to; on a full ring, sleeps on `room`
    /// (the producer's eventfd) with the `prepare_wait` handshake, then retries.
    fn push_blocking(p: &mut Producer<u64>, v: u64, data: &EventFd, room: Option<&EventFd>) {
        loop {
            match p.try_push(v).unwrap() {
                Push::Done { wake } => {
                    if wake {
                        data.notify();
                    }
                    return;
                }
                Push::Full(_) => match room {
                    Some(room) => {
                        if p.prepare_wait().unwrap() {
                            room.wait();
                            p.cancel_wait();
                        }
                    }
                    None => thread::yield_now(),
                },
            }
        }
    }

    /// Pops one value; on an empty ring, sleeps on `data` (the consumer's eventfd) with
    /// the `prepare_sleep` handshake, then retries. Wakes the producer when told to.
    fn pop_blocking(c: &mut Consumer<u64>, data: &EventFd, room: Option<&EventFd>) -> u64 {
        loop {
            match c.try_pop().unwrap() {
                Some((v, wake)) => {
                    if wake {
                        room.expect("the producer never waits in this model").notify();
                    }
                    return v;
                }
                None => {
                    if c.prepare_sleep().unwrap() {
                        data.wait();
                        c.cancel_sleep();
                    }
                }
            }
        }
    }

    /// (a) Three values through a ring of two arrive in order, whatever the interleaving.
    #[test]
    fn fifo_three_through_two() {
        model(|| {
            let (mem, mut p, mut c) = pair();
            let t = thread::spawn(move || {
                let mut i = 0;
                while i < 3 {
                    match p.try_push(i).unwrap() {
                        Push::Done { .. } => i += 1,
                        Push::Full(v) => {
                            assert_eq!(v, i);
                            thread::yield_now();
                        }
                    }
                }
            });
            let mut got = Vec::new();
            while got.len() < 3 {
                match c.try_pop().unwrap() {
                    Some((v, _)) => got.push(v),
                    None => thread::yield_now(),
                }
            }
            t.join().unwrap();
            assert_eq!(got, [0, 1, 2]);
            assert_eq!(c.try_pop().unwrap(), None);
            drop(mem);
        });
    }

    /// (b) A consumer that sleeps on an empty ring is always woken: the producer notifies
    /// only when `try_push` says so, and loom finds no interleaving where the consumer
    /// blocks forever (which it would report as a deadlock).
    #[test]
    fn consumer_sleep_has_no_lost_wakeup() {
        model(|| {
            let (mem, mut p, mut c) = pair();
            let data = Arc::new(EventFd::default());
            let d = data.clone();
            let t = thread::spawn(move || {
                for i in 0..2 {
                    push_blocking(&mut p, i, &d, None);
                }
            });
            let got: Vec<u64> = (0..2).map(|_| pop_blocking(&mut c, &data, None)).collect();
            t.join().unwrap();
            assert_eq!(got, [0, 1]);
            drop(mem);
        });
    }

    /// (c) A producer that sleeps on a full ring is always woken by the consumer's
    /// `try_pop` flag. The consumer does not block here, so only the producer's
    /// handshake is under test.
    #[test]
    fn producer_wait_has_no_lost_wakeup() {
        model(|| {
            let (mem, mut p, mut c) = pair();
            let data = Arc::new(EventFd::default());
            let room = Arc::new(EventFd::default());
            let r = room.clone();
            let t = thread::spawn(move || {
                let mut got = Vec::new();
                while got.len() < 3 {
                    match c.try_pop().unwrap() {
                        Some((v, wake)) => {
                            if wake {
                                r.notify();
                            }
                            got.push(v);
                        }
                        None => thread::yield_now(),
                    }
                }
                got
            });
            for i in 0..3 {
                push_blocking(&mut p, i, &data, Some(&room));
            }
            assert_eq!(t.join().unwrap(), [0, 1, 2]);
            drop(mem);
        });
    }

    /// (b) and (c) together: both sides block, each on its own eventfd, as a channel's
    /// endpoints do.
    #[test]
    fn both_sides_block_without_lost_wakeups() {
        model(|| {
            let (mem, mut p, mut c) = pair();
            let data = Arc::new(EventFd::default());
            let room = Arc::new(EventFd::default());
            let (d, r) = (data.clone(), room.clone());
            let t = thread::spawn(move || (0..3).map(|_| pop_blocking(&mut c, &d, Some(&r))).collect::<Vec<_>>());
            for i in 0..3 {
                push_blocking(&mut p, i, &data, Some(&room));
            }
            assert_eq!(t.join().unwrap(), [0, 1, 2]);
            drop(mem);
        });
    }
}
