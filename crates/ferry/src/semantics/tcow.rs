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
//! # Why these mechanisms (numbers from `/work/shared/GENIE.md`, this VM class)
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

use super::app::{AppInner, LotPage};
use super::stats::{add, Counters};

use crate::segment::Segment;
use crate::sync::lock;
use crate::sys::fd::{wait_readable, EventFd};
use crate::sys::page_size;
use crate::sys::uffd::{Protector, WpFault};

/// What [`Engine::arm`] returns: the epochs of the protected pages and the lot pages
/// behind the range at that moment.
pub(crate) type Armed = (Vec<u32>, Vec<(Arc<Segment>, usize, usize)>);

/// What the handler thread shares with the buffers it serves.
struct Shared {
    prot: Protector,
    /// Made readable to stop the handler thread.
    stop: EventFd,
    /// Application buffers whose views this engine protects: start, length, buffer.
    apps: Mutex<Vec<(usize, usize, Weak<AppInner>)>>,
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

    pub fn track(&self, app: &Arc<AppInner>) {
        let mut v = lock(&self.shared.apps);
        v.retain(|(_, _, w)| w.strong_count() > 0);
        v.push((
            app.view.as_ptr() as usize,
            app.view.len(),
            Arc::downgrade(app),
        ));
    }

    pub fn forget(&self, start: usize) {
        lock(&self.shared.apps).retain(|(s, _, w)| *s != start && w.strong_count() > 0);
    }

    /// Write-protects the pages of `range` (bytes) of `app`'s view for one more output.
    /// Returns the epoch of each page (to release exactly these protections later) and
    /// the lot pages behind the range, taken in the same critical section (a page a
    /// writer touches right after is replaced, and must not be the one output); or the
    /// error that stopped it, with nothing left protected by this call.
    pub fn arm(&self, app: &AppInner, range: &Range<usize>) -> std::io::Result<Armed> {
        let pages = app.pages_of(range);
        let p = page_size();
        let base = app.view.as_ptr() as usize;
        let mut st = app.state();
        if !st.registered {
            self.shared.prot.register(base, app.view.len())?;
            st.registered = true;
        }
        // Protect the runs of pages no other output protects yet.
        let mut done: Vec<(usize, usize)> = Vec::new();
        let mut i = pages.start;
        while i < pages.end {
            if st.pages[i].prot > 0 {
                i += 1;
                continue;
            }
            let j = (i..pages.end)
                .find(|&j| st.pages[j].prot > 0)
                .unwrap_or(pages.end);
            if let Err(e) = self.shared.prot.protect(base + i * p, (j - i) * p) {
                for &(a, n) in &done {
                    let _ = self.shared.prot.unprotect(base + a * p, n * p);
                }
                return Err(e);
            }
            done.push((i, j - i));
            i = j;
        }
        let fresh: usize = done.iter().map(|&(_, n)| n).sum();
        add(&self.shared.stats.tcow_pages_protected, fresh as u64);
        let epochs = st.pages[pages.clone()]
            .iter_mut()
            .map(|pg| {
                pg.prot += 1;
                pg.epoch
            })
            .collect();
        Ok((epochs, AppInner::pieces(&st, range)))
    }

    /// Ends one output's protection of the pages from `first` (with the epochs `arm`
    /// returned): pages no other output protects become writable in place again.
    pub fn release(&self, app: &AppInner, first: usize, epochs: &[u32]) {
        let p = page_size();
        let base = app.view.as_ptr() as usize;
        let mut st = app.state();
        let mut i = 0;
        while i < epochs.len() {
            let mut j = i;
            while j < epochs.len() {
                let pg = &mut st.pages[first + j];
                if pg.epoch != epochs[j] || pg.prot == 0 {
                    break;
                }
                pg.prot -= 1;
                if pg.prot > 0 {
                    break;
                }
                j += 1;
            }
            if j > i {
                // If this fails the pages stay protected; the next write faults and the
                // handler, finding no output protecting them, unprotects then.
                let _ = self
                    .shared
                    .prot
                    .unprotect(base + (first + i) * p, (j - i) * p);
                i = j;
            } else {
                i += 1;
            }
        }
    }
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
    let Some(app) = app else {
        // Not ours any more (the buffer is being dropped): let the writer go.
        let _ = s.prot.unprotect(page_addr, p);
        return;
    };
    add(&s.stats.tcow_faults, 1);
    let i = (page_addr - app.view.as_ptr() as usize) / p;
    // Take the fresh page before locking the buffer: nothing here may wait on releases.
    let fresh = LotPage::take(&app.lot);
    let mut st = app.state();
    if st.pages[i].prot == 0 {
        // No output protects it (a release raced with the fault): just make it writable.
        drop(st);
        let _ = s.prot.unprotect(page_addr, p);
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
