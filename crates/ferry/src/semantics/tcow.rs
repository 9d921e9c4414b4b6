//! TCOW (transient copy-on-write) for emulated-copy output.
//!
//! Emulated copy keeps copy's promise, the receiver gets exactly the bytes the buffer held
//! when output was called, without copying them: the pages of the application's
//! [`AppBuffer`](super::AppBuffer) view are write-protected from output until every
//! receiver has released them, and the receivers read the lot pages in place. A write by
//! the application during that time faults to a handler thread, which copies the page to a
//! fresh lot page, maps that page under the application in place of the old one
//! (`mmap(MAP_SHARED | MAP_FIXED)` of the lot memfd over the faulting page of the view) and
//! wakes the writer. The writer's store then lands on the new page; receivers keep reading
//! the old lot offset, which nothing writes any more.
//!
//! # Why these mechanisms (the costs: docs/semantics.md, "Measured costs behind the design")
//! - **userfaultfd write protection, not `mprotect` + `SIGSEGV`.** Arming and disarming a
//!   range costs 1.7–2.25 µs at 4 KiB, 37–50 µs at 1 MiB and 570–760 µs at 16 MiB with
//!   userfaultfd, against 4.9–6.7 µs / 38–58 µs / 570–780 µs with `mprotect`: no worse, and
//!   a library cannot own the process's `SIGSEGV` handler. It also catches *kernel* writes
//!   through the protected address (a `read(2)` into the buffer waits for the handler like
//!   a user write), where `mprotect` makes them fail with `EFAULT`. That needs a
//!   userfaultfd that takes kernel-mode faults (root, `CAP_SYS_PTRACE` or
//!   `vm.unprivileged_userfaultfd = 1`); otherwise the engine opens a user-mode-only one
//!   and [`SemanticsStats::tcow_user_mode_only`](super::SemanticsStats) says that kernel
//!   writes into pages under output fail with `EFAULT` (integrity still holds).
//! - **Long runs: move the page tables out, protect the empty range.**
//!   `UFFDIO_WRITEPROTECT` changes every present page table entry (about 100 – 180 ns a
//!   page: 2.1 – 3.7 ms for 64 MiB, and as much again to unprotect). For a run of at
//!   least 2 MiB of pages backed by consecutive lot pages, `Engine::arm` instead moves
//!   the run's entries out of the view (`mremap(MREMAP_DONTUNMAP)` onto a reserved
//!   address) and write-protects the now empty range, which installs one marker per page
//!   (10 – 15 ns each): 0.4 – 0.75 ms at 64 MiB. The view stays mapped; a read refaults
//!   the same lot page, still protected (in the kernel, no handler); a write faults to the
//!   handler as before, kernel writes included. When no output protects the run any more
//!   the entries move back in one `mremap` per stretch of pages not replaced meanwhile
//!   (0.34 – 0.7 ms at 64 MiB), and the view is registered again (a moved-back range is
//!   a new mapping to the kernel). Counted in `tcow_pages_moved`.
//! - **Replace the page, don't copy it aside.** A handler that copies the page aside and
//!   unprotects (9.2–24 µs per page written) keeps integrity only if the receivers read the
//!   aside copy, but they read the lot in place. Replacing (16–32 µs per page) leaves the
//!   old lot page untouched for them. Its price: each replaced page splits the view's
//!   mapping (`vm.max_map_count`, 65,530, bounds how many pages can be replaced while the
//!   buffer lives) and the view's page → lot offset map diverges from the original span;
//!   the buffer keeps that map per page and later outputs name the new offsets.
//! - **Kernel COW (`MAP_PRIVATE` remap)** was rejected: every remap drops the range's page
//!   tables (about 290 µs/MiB of refaults) and `MAP_PRIVATE` is not a snapshot.
//! - **Threshold.** TCOW ties a hot copy at 256–1024 pages and wins 3–4x at 16 MiB, so
//!   below [`Thresholds::emulated_copy`](super::Thresholds) (1 MiB by default) emulated copy
//!   converts to copy.
//!
//! If the handler finds no free lot page for the copy, it does not wake the writer: the
//! writer waits until the receivers release the page (counted in `tcow_waits`). Integrity
//! is never traded for progress.

use std::ops::Range;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, Weak};
use std::thread::{JoinHandle, ThreadId};

use super::pages::{AppPages, AppState, LotPage, Moved};
use super::stats::{add, Counters};

use crate::segment::Segment;
use crate::sync::lock;
use crate::sys::fd::{wait_readable, EventFd};
use crate::sys::mem::Stash;
use crate::sys::page_size;
use crate::sys::uffd::{Protector, WpFault};

/// What [`Engine::arm`] returns: the epochs of the protected pages and the lot pages
/// behind the range at that moment.
pub(crate) type Armed = (Vec<u32>, Vec<(Arc<Segment>, usize, usize)>);

/// An application buffer the engine serves, as whatever holds its pages (the buffer's
/// `AppInner`, which the engine need not know).
type Tracked = Weak<dyn AsRef<AppPages> + Send + Sync>;

/// What the handler thread shares with the buffers it serves.
struct Shared {
    prot: Protector,
    /// Made readable to stop the handler thread.
    stop: EventFd,
    /// Application buffers whose views this engine protects: start, length, buffer.
    apps: Mutex<Vec<(usize, usize, Tracked)>>,
    stats: Arc<Counters>,
}

/// The TCOW engine of one [`Passing`](super::Passing): a userfaultfd and the thread that
/// serves its write faults. Stops when the last buffer using it is gone.
pub(crate) struct Engine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    thread_id: ThreadId,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("tcow::Engine")
    }
}

impl Engine {
    /// Opens the userfaultfd and starts the handler thread.
    pub fn start(stats: Arc<Counters>) -> std::io::Result<Arc<Engine>> {
        let shared = Arc::new(Shared {
            prot: Protector::new()?,
            stop: EventFd::new()?,
            apps: Mutex::new(Vec::new()),
            stats,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ferry-tcow".into())
            .spawn(move || serve(&s))?;
        Ok(Arc::new(Engine {
            shared,
            thread_id: thread.thread().id(),
            thread: Some(thread),
        }))
    }

    /// Whether kernel-mode writes into protected pages fail rather than wait.
    pub fn user_mode_only(&self) -> bool {
        self.shared.prot.user_mode_only()
    }

    /// Serves write faults in `app`'s view from now on, for as long as `app` lives (an
    /// application buffer: whatever holds its pages).
    pub fn track<A: AsRef<AppPages> + Send + Sync + 'static>(&self, app: &Arc<A>) {
        let pages = (**app).as_ref();
        let weak: Tracked = Arc::downgrade(app) as Weak<A>;
        let mut v = lock(&self.shared.apps);
        v.retain(|(_, _, w)| w.strong_count() > 0);
        v.push((pages.view.as_ptr() as usize, pages.view.len(), weak));
    }

    pub fn forget(&self, start: usize) {
        lock(&self.shared.apps).retain(|(s, _, w)| *s != start && w.strong_count() > 0);
    }

    /// Write-protects the pages of `range` (bytes) of `app`'s view for one more output.
    /// Returns the epoch of each page (to release exactly these protections later) and
    /// the lot pages behind the range, taken in the same critical section (a page a
    /// writer touches right after is replaced, and must not be the one output); or the
    /// error that stopped it, with nothing left protected by this call.
    pub fn arm(&self, app: &AppPages, range: &Range<usize>) -> std::io::Result<Armed> {
        let pages = app.pages_of(range);
        let mut st = app.state();
        if !st.registered {
            let base = app.view.as_ptr() as usize;
            self.shared.prot.register(base, app.view.len())?;
            st.registered = true;
        }
        // Protect the runs of pages no other output protects yet.
        let mut done: Vec<(usize, usize, bool)> = Vec::new();
        let mut i = pages.start;
        while i < pages.end {
            if st.pages[i].prot > 0 {
                i += 1;
                continue;
            }
            let j = (i..pages.end)
                .find(|&j| st.pages[j].prot > 0)
                .unwrap_or(pages.end);
            if let Err(e) = self.protect_pages(app, &mut st, i, j, &mut done) {
                for &(a, n, moved) in &done {
                    self.unprotect_run(app, &mut st, a, n, moved);
                }
                return Err(e);
            }
            i = j;
        }
        let fresh: usize = done.iter().map(|&(_, n, _)| n).sum();
        let moved: usize = done.iter().filter(|d| d.2).map(|&(_, n, _)| n).sum();
        add(&self.shared.stats.tcow_pages_protected, fresh as u64);
        add(&self.shared.stats.tcow_pages_moved, moved as u64);
        let epochs = st.pages[pages.clone()]
            .iter_mut()
            .map(|pg| {
                pg.prot += 1;
                pg.epoch
            })
            .collect();
        Ok((epochs, AppPages::pieces(&st, range)))
    }

    /// Write-protects pages `i..j` of the view, which no output protects, recording each
    /// run it protected in `done`: long runs of pages whose lot pages follow each other
    /// (one mapping of the kernel's) by moving their page tables out, the rest page by
    /// page, in as few calls as the moved runs allow.
    fn protect_pages(
        &self,
        app: &AppPages,
        st: &mut AppState,
        i: usize,
        j: usize,
        done: &mut Vec<(usize, usize, bool)>,
    ) -> std::io::Result<()> {
        let p = page_size();
        let follows = |st: &AppState, k: usize| {
            let (a, b) = (&st.pages[k - 1], &st.pages[k]);
            Arc::ptr_eq(&a.seg, &b.seg) && b.off == a.off + p
        };
        let mut plain = i; // pages plain..a still to protect page by page
        let mut a = i;
        while a < j {
            let mut b = a + 1;
            while b < j && follows(st, b) {
                b += 1;
            }
            if (b - a) * p >= MOVE_MIN {
                if plain < a {
                    self.protect_run(app, st, plain, a, false)?;
                    done.push((plain, a - plain, false));
                }
                let moved = self.protect_run(app, st, a, b, true)?;
                done.push((a, b - a, moved));
                plain = b;
            }
            a = b;
        }
        if plain < j {
            self.protect_run(app, st, plain, j, false)?;
            done.push((plain, j - plain, false));
        }
        Ok(())
    }

    /// Write-protects pages `i..j` of the view, which no output protects: with `try_move`
    /// by moving its page tables out and protecting the emptied range where it can
    /// (returns true), else page by page.
    fn protect_run(
        &self,
        app: &AppPages,
        st: &mut AppState,
        i: usize,
        j: usize,
        try_move: bool,
    ) -> std::io::Result<bool> {
        let p = page_size();
        let (at, len) = (app.view.as_ptr() as usize + i * p, (j - i) * p);
        let movable = try_move
            && st.pages[i..j]
                .iter()
                .all(|pg| pg.locked == 0 && !pg.private)
            && !st
                .moved
                .iter()
                .any(|m| m.first < j && i < m.first + m.epochs.len());
        if movable {
            // SAFETY: pages `i..j` are shared pages of the lot (none private, checked), so
            // the emptied range refaults the same bytes.
            if let Ok(stash) = unsafe { app.view.move_tables_out(i * p, len) } {
                // An empty registered range takes userfaultfd-wp markers: reads refault
                // the file's page still protected, writes fault to the handler.
                if let Err(e) = self.shared.prot.protect(at, len) {
                    self.put_back(app, st, i, j - i, stash, std::slice::from_ref(&(i..j)));
                    return Err(e);
                }
                let epochs = st.pages[i..j].iter().map(|pg| pg.epoch).collect();
                st.moved.push(Moved {
                    first: i,
                    epochs,
                    stash,
                });
                return Ok(true);
            }
            // Not one mapping (a replaced page splits it): protect page by page.
        }
        self.shared.prot.protect(at, len)?;
        Ok(false)
    }

    /// Undoes [`protect_run`](Self::protect_run) of `n` pages from `first`.
    fn unprotect_run(
        &self,
        app: &AppPages,
        st: &mut AppState,
        first: usize,
        n: usize,
        moved: bool,
    ) {
        let p = page_size();
        let base = app.view.as_ptr() as usize;
        if moved {
            if let Some(k) = st.moved.iter().position(|m| m.first == first) {
                let m = st.moved.swap_remove(k);
                self.put_back(
                    app,
                    st,
                    first,
                    n,
                    m.stash,
                    std::slice::from_ref(&(first..first + n)),
                );
                return;
            }
        }
        let _ = self.shared.prot.unprotect(base + first * p, n * p);
    }

    /// Ends one output's protection of the pages from `first` (with the epochs `arm`
    /// returned): pages no other output protects become writable in place again.
    pub fn release(&self, app: &AppPages, first: usize, epochs: &[u32]) {
        let p = page_size();
        let base = app.view.as_ptr() as usize;
        let mut st = app.state();
        // Each page this output still protects (same epoch) loses exactly one protection.
        let mut free = vec![false; epochs.len()];
        for (x, &e) in epochs.iter().enumerate() {
            let pg = &mut st.pages[first + x];
            if pg.epoch == e && pg.prot > 0 {
                pg.prot -= 1;
                free[x] = pg.prot == 0;
            }
        }
        // Pages still behind a moved run's stash come back with their tables (below); the
        // other free pages (a page replaced since, in a moved run's range, is one) are
        // unprotected here, a run at a time. If that fails they stay protected; the next
        // write faults and the handler, finding no output protecting them, unprotects then.
        let stashed = |a: usize| {
            st.moved.iter().any(|m| {
                (m.first..m.first + m.epochs.len()).contains(&a)
                    && st.pages[a].epoch == m.epochs[a - m.first]
            })
        };
        for r in runs(epochs.len(), |x| free[x] && !stashed(first + x)) {
            let from = first + r.start;
            let _ = self.shared.prot.unprotect(base + from * p, r.len() * p);
        }
        self.restore_moved(app, &mut st);
    }

    /// Moves the `parts` (pages of the view, in order) of a run of `n` pages from `first`
    /// back from `stash`, unprotects what could not go back (it stays empty, and refaults
    /// writable), and wakes any writer that faulted in the run: what came back is a new
    /// mapping to the kernel, unregistered, where the handler could no longer unprotect
    /// and so wake it. The view must be registered again before the next protection.
    fn put_back(
        &self,
        app: &AppPages,
        st: &mut AppState,
        first: usize,
        n: usize,
        stash: Stash,
        parts: &[Range<usize>],
    ) {
        let p = page_size();
        let base = app.view.as_ptr() as usize;
        let bytes: Vec<Range<usize>> = parts
            .iter()
            .map(|r| (r.start - first) * p..(r.end - first) * p)
            .collect();
        // SAFETY: the caller passes only pages neither replaced nor swapped over since
        // they moved out (their epoch is unchanged): their range of the view maps the same
        // lot page or nothing (markers, or refaults of that page); and pages no output
        // protects any more, or that it just protected under this lock and gives up.
        let failed = unsafe { app.view.move_back_parts(stash, &bytes) };
        for (r, _) in failed {
            let _ = self
                .shared
                .prot
                .unprotect(base + first * p + r.start, r.len());
        }
        st.registered = false;
        let _ = self.shared.prot.wake(base + first * p, n * p);
    }

    /// Moves back the page tables of every moved run whose pages no output protects any
    /// more, except pages replaced meanwhile (a new epoch), which keep their new page.
    fn restore_moved(&self, app: &AppPages, st: &mut AppState) {
        let p = page_size();
        let mut k = 0;
        while k < st.moved.len() {
            let m = &st.moved[k];
            let same = |x: usize| st.pages[m.first + x].epoch == m.epochs[x];
            if (0..m.epochs.len()).any(|x| same(x) && st.pages[m.first + x].prot > 0) {
                k += 1;
                continue;
            }
            let parts: Vec<Range<usize>> = runs(m.epochs.len(), same)
                .into_iter()
                .map(|r| m.first + r.start..m.first + r.end)
                .collect();
            let m = st.moved.swap_remove(k);
            self.put_back(app, st, m.first, m.epochs.len(), m.stash, &parts);
            // An `mlock` of a share output made meanwhile was on the mapping replaced.
            for r in parts {
                for run in runs(r.len(), |x| st.pages[r.start + x].locked > 0) {
                    let from = (r.start + run.start) * p;
                    let _ = app.view.lock_range(from, run.len() * p, true);
                }
            }
        }
    }
}

/// Runs at least this long (bytes) are write-protected by moving their page tables out
/// and protecting the emptied range, instead of page by page: protecting each entry
/// (`UFFDIO_WRITEPROTECT` of a populated range) and moving the entries out
/// (`mremap(MREMAP_DONTUNMAP)`, then `UFFDIO_WRITEPROTECT` of the empty range, one marker
/// per page) tie at 1 MiB, and from there the move wins, several-fold at 16 and 64 MiB,
/// both ways (docs/semantics.md, "Page-table moves").
const MOVE_MIN: usize = 2 << 20;

/// The maximal runs of `0..n` where `f` holds.
fn runs(n: usize, f: impl Fn(usize) -> bool) -> Vec<Range<usize>> {
    let mut v: Vec<Range<usize>> = Vec::new();
    for x in 0..n {
        if f(x) {
            match v.last_mut() {
                Some(r) if r.end == x => r.end = x + 1,
                _ => v.push(x..x + 1),
            }
        }
    }
    v
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.stop.notify();
        if let Some(t) = self.thread.take() {
            // The handler thread may itself drop the last buffer (it holds one while it
            // serves a fault): then it exits on its own after this.
            if std::thread::current().id() != self.thread_id {
                let _ = t.join();
            }
        }
    }
}

fn serve(s: &Shared) {
    let mut faults: Vec<WpFault> = Vec::new();
    loop {
        match wait_readable(&[s.prot.as_fd(), s.stop.as_fd()], None) {
            Ok(Some(0)) => {}
            Ok(_) => return,
            Err(_) => return,
        }
        faults.clear();
        if s.prot.read_faults(&mut faults).is_err() {
            return;
        }
        for f in &faults {
            serve_fault(s, f.addr);
        }
    }
}

fn serve_fault(s: &Shared, addr: usize) {
    let p = page_size();
    let page_addr = addr & !(p - 1);
    let app = lock(&s.apps)
        .iter()
        .find(|(start, len, _)| (*start..start + len).contains(&addr))
        .and_then(|(_, _, w)| w.upgrade());
    let Some(held) = app else {
        // Not ours any more (the buffer is being dropped): let the writer go.
        let_go(s, page_addr);
        return;
    };
    let app = (*held).as_ref();
    add(&s.stats.tcow_faults, 1);
    let i = (page_addr - app.view.as_ptr() as usize) / p;
    // Take the fresh page before locking the buffer: nothing here may wait on releases.
    let fresh = LotPage::take(&app.lot);
    let mut st = app.state();
    if st.pages[i].prot == 0 {
        // No output protects it (a release raced with the fault): just make it writable.
        drop(st);
        let_go(s, page_addr);
        return;
    }
    let Some(fresh) = fresh else {
        // No page to copy to: the writer waits until the receivers release this one.
        add(&s.stats.tcow_waits, 1);
        return;
    };
    if app.own_copy(&mut st, i, fresh).is_err() {
        drop(st);
        add(&s.stats.tcow_waits, 1);
        return;
    }
    drop(st);
    add(&s.stats.tcow_pages_copied, 1);
    let _ = s.prot.wake(page_addr, p);
}

/// Unprotects the page at `addr` and so wakes its writer; if the page is no longer in a
/// registered range (its page tables came back by `mremap`, a new mapping), the unprotect
/// fails and the writer is woken explicitly to retry its write there.
fn let_go(s: &Shared, addr: usize) {
    let p = page_size();
    if s.prot.unprotect(addr, p).is_err() {
        let _ = s.prot.wake(addr, p);
    }
}
