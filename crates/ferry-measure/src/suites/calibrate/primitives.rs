//! The timing loops of the primitives that run in one process (all but the hand-over),
//! on the calling thread, which the suite pins to the first CPU.
//!
//! Each loop returns nanoseconds per timed repetition; the untimed part of a repetition
//! puts things back (a fresh mapping, the protection re-armed) so every repetition
//! measures the same state.

use std::cell::Cell;
use std::hint::black_box;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{bail, Context, Result};
use ferry::semantics::primitive as p;
use ferry::semantics::probe::{prepare_output, MoveProbe};
use ferry::{Group, PathConfig};

use crate::sys::now_ns;
use crate::sys::vm::{memfd, page, Map, Prot, Uffd};

/// Untimed repetitions before the timed ones.
const WARM: usize = 1;

/// Times `op` `reps` times after [`WARM`] untimed ones, calling `reset` (untimed) after each.
fn timed(
    reps: usize,
    mut op: impl FnMut() -> Result<()>,
    mut reset: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(reps);
    for i in 0..WARM + reps {
        let t = now_ns();
        op()?;
        let dt = now_ns() - t;
        if i >= WARM {
            out.push(dt as f64);
        }
        reset()?;
    }
    Ok(out)
}

/// A memfd of `len` bytes with every byte written, and its read-write mapping.
fn filled(len: usize) -> Result<(std::os::fd::OwnedFd, Map)> {
    let fd = memfd(len)?;
    let m = Map::shared(fd.as_fd(), len, Prot::ReadWrite)?;
    m.fill(0x5a);
    Ok((fd, m))
}

/// Measures `primitive` at `size` bytes, `reps` times. The TCOW fault's size is the
/// bytes of pages written (one fault per page).
pub fn measure(primitive: &str, size: usize, reps: usize, other_cpu: usize) -> Result<Vec<f64>> {
    let pg = page();
    let none = || Ok(());
    match primitive {
        p::COPY_IN => copy_in(size, reps, Some(other_cpu)),
        p::COPY_IN_LOCAL => copy_in(size, reps, None),
        p::COPY_OUT => copy_out(size, reps, other_cpu),
        p::PROTECT_UFFD => app_output(size, reps, ferry::semantics::Semantics::EmulatedCopy),
        p::WIRE => app_output(size, reps, ferry::semantics::Semantics::Share),
        p::UNPROTECT_UFFD => {
            let (_fd, m) = filled(size)?;
            let u = Uffd::new().context("userfaultfd")?;
            u.register(&m)
                .context("UFFDIO_REGISTER (write-protect mode) of a memfd")?;
            let arm = |on| {
                u.write_protect(m.addr(), size, on)
                    .map_err(anyhow::Error::from)
            };
            arm(true)?;
            timed(reps, || arm(false), || arm(true))
        }
        p::PROTECT_MPROTECT | p::UNPROTECT_MPROTECT => {
            // A TCOW fallback protects an application buffer's whole view.
            let (_fd, m) = filled(size)?;
            let set = |prot| m.protect(0, size, prot).map_err(anyhow::Error::from);
            if primitive == p::PROTECT_MPROTECT {
                timed(reps, || set(Prot::Read), || set(Prot::ReadWrite))
            } else {
                set(Prot::Read)?;
                timed(reps, || set(Prot::ReadWrite), || set(Prot::Read))
            }
        }
        p::HIDE | p::REINSTATE | p::REGION_UNMAP => {
            // Move and emulated move take the region's pages out of the lot's one large
            // mapping (a page on either side here, so the kernel splits the mapping and
            // merges it back), written by the application: ferry's own mechanism.
            let pages = size.div_ceil(pg) * pg;
            let probe = std::cell::RefCell::new(if primitive == p::REGION_UNMAP {
                MoveProbe::for_move(pages)?
            } else {
                MoveProbe::new(pages)?
            });
            let out = || Ok(probe.borrow_mut().move_out()?);
            let back = || {
                let mut p = probe.borrow_mut();
                p.move_back()?;
                p.dirty();
                Ok(())
            };
            if primitive == p::REINSTATE {
                out()?;
                timed(reps, back, out)
            } else {
                timed(reps, out, back)
            }
        }
        p::TCOW_FAULT => tcow_fault(size.div_ceil(pg), reps, true),
        p::SWAP => {
            let (lot, _lot_map) = filled(size)?;
            let app = Map::anon(size)?;
            timed(
                reps,
                || {
                    app.replace_with(0, size, lot.as_fd(), 0, Prot::ReadWrite)?;
                    black_box(app.touch());
                    Ok(())
                },
                || Ok(app.replace_anon()?),
            )
        }
        p::MREMAP => {
            let (from, to) = (Map::anon(size)?, Map::anon(size)?);
            timed(reps, || Ok(from.move_to(&to)?), || Ok(from.replace_anon()?))
        }
        p::REGION_CREATE => timed(
            reps,
            || {
                drop(black_box(memfd(size)?));
                Ok(())
            },
            none,
        ),
        p::REGION_MAP => {
            let (fd, _m) = filled(size)?;
            let mapped = Cell::new(None);
            timed(
                reps,
                || {
                    let m = Map::shared(fd.as_fd(), size, Prot::Read)?;
                    black_box(m.touch());
                    mapped.set(Some(m));
                    Ok(())
                },
                || {
                    drop(mapped.take());
                    Ok(())
                },
            )
        }
        p::UNWIRE => {
            let (_fd, m) = filled(size)?;
            let lock = |on| m.lock(on).context("mlock/munlock");
            lock(true)?;
            timed(reps, || lock(false), || lock(true))
        }
        other => bail!("{other} is not measured in-process"),
    }
}

/// An application-allocated output's work on the sender, as `Passing::send_app` does it
/// before the send, on an application buffer's view (a mapping of the lot of its own,
/// whose pages the lot's mapping also maps). Emulated copy: the pages write-protected
/// through the TCOW engine (the `UFFDIO_WRITEPROTECT` and the engine's bookkeeping:
/// epochs, the pages' backing, the description the receiver gets); a bare ioctl timed
/// alone missed about a microsecond of that work at 16 KiB, and the thresholds derived
/// from it let emulated copy run at 1.5x copy there. Share: the view's pages locked
/// (`mlock`); an `mlock` of a private test mapping missed about 2 µs at 64 KiB (the page's
/// other mappings make locking it dearer). The untimed reset releases it as a receiver
/// would (unprotecting, unlocking), then writes the next message as genie's source does.
fn app_output(
    size: usize,
    reps: usize,
    semantics: ferry::semantics::Semantics,
) -> Result<Vec<f64>> {
    use ferry::semantics::{Passing, PassingConfig, Semantics, Thresholds};
    let group = fresh_group()?;
    let domain = group.join()?;
    let passing = Passing::new(
        &domain,
        PassingConfig {
            thresholds: Some(Thresholds::NEVER_CONVERT),
            ..PassingConfig::default()
        },
    )?;
    if semantics == Semantics::EmulatedCopy && !passing.tcow_available() {
        bail!("userfaultfd is not available here: emulated copy copies");
    }
    let mut buf = passing.app_buffer(size)?;
    buf.as_mut_slice().fill(0x5a);
    let buf = std::cell::RefCell::new(buf);
    let out = Cell::new(None);
    let mut v = 0u8;
    timed(
        reps,
        || {
            let b = buf.borrow();
            out.set(prepare_output(&passing, &b, 0..size, semantics)?);
            Ok(())
        },
        || {
            // The receivers released it (unprotected); the application writes its next
            // message, one byte per page, as genie's source does before each output.
            drop(out.take());
            v = v.wrapping_add(1);
            let mut b = buf.borrow_mut();
            for x in b.as_mut_slice().iter_mut().step_by(page()) {
                *x = v;
            }
            Ok(())
        },
    )
}

/// A group of its own for one measurement (its file goes when the last domain leaves).
fn fresh_group() -> Result<std::sync::Arc<Group>> {
    static N: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "calib-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    Ok(Group::open(&name)?)
}

/// Copy semantics' output work: an fbuf from a path (the path's cached fbufs, as in a
/// steady stream of messages), the bytes copied in, frozen. With a `reader` CPU, the
/// untimed reset hands the message to a thread pinned there, which copies it out (as the
/// receiving process does), then drops it, which returns the fbuf to the path: the next
/// copy in writes lines the other CPU last read, as between two processes (a hot loop on
/// one CPU would time cache-resident writes that the real path never sees). Without one
/// (`copy_in_local`) the reset just drops it: the receiver of a converted system buffer
/// takes it in place and reads only its header. The bytes land at their own page offset
/// in the fbuf, as `Passing` copies them: written at offset 0 from a heap buffer 16 bytes
/// into its page, this copy ran 1.5 – 2x slower from 16 KiB to 256 KiB than the one
/// genie's source makes. The cause is tied to the relative page offset but was not
/// isolated (4 KiB store/load aliasing is a guess).
fn copy_in(size: usize, reps: usize, reader: Option<usize>) -> Result<Vec<f64>> {
    let group = fresh_group()?;
    let domain = group.join()?;
    let path = domain.path(PathConfig::default())?;
    let src = vec![0x5au8; size];
    // As `Passing`'s copy output: the bytes land at their own page offset in the fbuf.
    let po = src.as_ptr() as usize % page();
    let frozen = Cell::new(None);
    let slot = std::sync::Mutex::new(None::<ferry::IoData>);
    let baton = Baton::new();
    let ns = std::thread::scope(|s| -> Result<Vec<f64>> {
        if let Some(cpu) = reader {
            let (slot, baton) = (&slot, &baton);
            s.spawn(move || {
                let _ = crate::sys::pin_to(cpu);
                let mut dst = vec![0u8; size];
                while baton.wait() {
                    if let Some(d) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                        d.copy_range_to_slice(.., black_box(&mut dst[..]));
                    }
                    baton.done();
                }
            });
        }
        let ns = timed(
            reps,
            || {
                let mut b = path.alloc(po + size)?;
                b.write_at(po, black_box(&src));
                frozen.set(Some(b.freeze().slice(po..)));
                Ok(())
            },
            || {
                let d = frozen.take();
                if reader.is_some() {
                    *slot.lock().unwrap_or_else(|e| e.into_inner()) = d;
                    baton.pass();
                }
                Ok(())
            },
        );
        baton.stop();
        ns
    })?;
    drop((path, domain, group));
    Ok(ns)
}

/// One page copied from a page into another, both page-aligned and hot in this CPU's
/// cache, as the TCOW handler copies a lot page: the "one page copy" of the TCOW-fault bar.
/// (Two heap `Vec`s of a page each lie 16 bytes apart modulo 4 KiB, glibc `memcpy`'s slow
/// case here, 13 – 16x: it made this reference about 2 µs instead of about 0.1.)
pub fn hot_page_copy(reps: usize) -> Result<Vec<f64>> {
    let pg = page();
    let m = Map::anon(2 * pg)?;
    m.fill(0x5a);
    timed(
        reps,
        || {
            m.copy_within(0, pg, pg);
            black_box(&m);
            Ok(())
        },
        || Ok(()),
    )
}

/// Copy semantics' input work: the receiver copies a message out of the sender's pages
/// into its own buffer, through a read-only shared mapping of the sender's memfd (what a
/// peer holds of a lot), after the sender wrote every byte on the other CPU (so the lines
/// come from the other core's cache or from memory, as between two processes). The
/// untimed reset has the writer thread, pinned to `other_cpu`, write the next message.
fn copy_out(size: usize, reps: usize, other_cpu: usize) -> Result<Vec<f64>> {
    let (fd, writer) = filled(size)?;
    let reader = Map::shared(fd.as_fd(), size, Prot::Read)?;
    black_box(reader.touch());
    let mut dst = vec![0u8; size];
    let baton = Baton::new();
    std::thread::scope(|s| -> Result<Vec<f64>> {
        let (w, baton) = (&writer, &baton);
        s.spawn(move || {
            let _ = crate::sys::pin_to(other_cpu);
            let mut v = 0u8;
            while baton.wait() {
                v = v.wrapping_add(1);
                w.fill(v);
                baton.done();
            }
        });
        baton.pass();
        let ns = timed(
            reps,
            || {
                reader.copy_out(0, black_box(&mut dst));
                Ok(())
            },
            || {
                baton.pass();
                Ok(())
            },
        );
        baton.stop();
        ns
    })
}

/// The floor under any userfaultfd TCOW fault: one write to a write-protected page whose
/// handler (same CPU) only removes the protection, which wakes the writer. No copy, no
/// mapping: the trap, the handler's wake-up and the resume.
pub fn wp_fault_floor(reps: usize) -> Result<Vec<f64>> {
    tcow_fault(1, reps, false)
}

/// A write to protected pages, handled by copy and replace: a region of a memfd is
/// write-protected with userfaultfd; the timed part writes one byte into each of `pages`
/// pages; a handler thread (on the same CPU, which it inherits) copies each faulting
/// page to a fresh memfd page, maps that page over the faulting one with
/// `mmap(MAP_FIXED)` and wakes the writer. The untimed reset maps the original memfd back
/// and re-arms the protection.
fn tcow_fault(pages: usize, reps: usize, replace: bool) -> Result<Vec<f64>> {
    let pg = page();
    let len = pages.max(16) * pg;
    let (fd, region) = filled(len)?;
    let (spare, spare_map) = filled(len)?;
    let u = Uffd::new().context("userfaultfd")?;
    let arm = || -> Result<()> {
        region.replace_with(0, len, fd.as_fd(), 0, Prot::ReadWrite)?;
        u.register(&region)?;
        u.write_protect(region.addr(), len, true)?;
        Ok(())
    };
    arm()?;
    let stop = AtomicBool::new(false);
    let handled = AtomicU64::new(0);
    std::thread::scope(|s| -> Result<Vec<f64>> {
        let handler = s.spawn(|| -> Result<()> {
            let mut page_buf = vec![0u8; pg];
            while !stop.load(Ordering::Acquire) {
                let Some(addr) = u.next_fault(20)? else {
                    continue;
                };
                let at = addr & !(pg - 1);
                if replace {
                    let off = at - region.addr();
                    region.copy_out(off, &mut page_buf);
                    spare_map.copy_in(off, &page_buf);
                    region.replace_with(off, pg, spare.as_fd(), off as u64, Prot::ReadWrite)?;
                    u.wake(at, pg)?;
                } else {
                    // Un-protecting wakes the writer: the trap and wake-up, nothing else.
                    u.write_protect(at, pg, false)?;
                }
                handled.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        });
        let r = timed(
            reps,
            || {
                for i in 0..pages {
                    region.poke(i * pg, 0xa5);
                }
                Ok(())
            },
            arm,
        );
        // SYNC POINT: pairs with the handler's Acquire load; it exits within its poll timeout.
        stop.store(true, Ordering::Release);
        handler
            .join()
            .map_err(|_| anyhow::anyhow!("fault handler panicked"))??;
        let ns = r?;
        let want = ((WARM + reps) * pages) as u64;
        let got = handled.load(Ordering::Relaxed);
        if got != want {
            bail!("{got} faults handled for {want} page writes: the writes were not all trapped");
        }
        Ok(ns)
    })
}

/// A hand-off to a helper thread pinned to the other CPU, both sides busy-polling, as
/// genie's processes do: a blocking hand-off (a channel, a futex) lets this CPU go idle
/// between repetitions, and on a VM an idle vCPU can come back with cold caches, which made
/// `copy_in` at 64 KiB twice what a whole copy costs between genie's busy processes.
struct Baton {
    /// Odd: the helper's turn; even: ours. `u64::MAX`: stop.
    turn: AtomicU64,
}

impl Baton {
    const STOP: u64 = u64::MAX;

    fn new() -> Baton {
        Baton {
            turn: AtomicU64::new(0),
        }
    }

    /// Our side: gives the helper its turn and spins until it is done.
    fn pass(&self) {
        let t = self.turn.fetch_add(1, Ordering::AcqRel) + 1;
        while self.turn.load(Ordering::Acquire) == t {
            std::hint::spin_loop();
        }
    }

    /// The helper's side: spins until its turn (`false`: stop).
    fn wait(&self) -> bool {
        loop {
            match self.turn.load(Ordering::Acquire) {
                Self::STOP => return false,
                t if t % 2 == 1 => return true,
                _ => std::hint::spin_loop(),
            }
        }
    }

    /// The helper's side: its turn is over.
    fn done(&self) {
        self.turn.fetch_add(1, Ordering::AcqRel);
    }

    /// Our side: ends the helper's loop.
    fn stop(&self) {
        self.turn.store(Self::STOP, Ordering::Release);
    }
}
