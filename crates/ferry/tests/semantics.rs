//! Genie's eight semantics between real processes: each semantics' promise under a
//! concurrent writer, faults after move and emulated move, the fallbacks and thresholds,
//! and `kill -9` of either side during output and during a TCOW fault.

mod common;

use std::io::BufReader;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::*;
use ferry::semantics::{Fallback, Integrity, Passing, PassingConfig, Semantics, Thresholds, Used};
use ferry::{Domain, DomainId, Error, Group, IoData};

const MASK: u64 = 0xdead_beef_0000;

fn passing(d: &Domain) -> Passing {
    Passing::new(
        d,
        PassingConfig {
            thresholds: Some(Thresholds::NEVER_CONVERT),
            tcow: !tcow_off(),
            ..PassingConfig::default()
        },
    )
    .unwrap()
}

/// A channel from `from` to `to`, two domains of this process.
fn local_channel(from: &Domain, to: &Domain) -> (ferry::Sender, ferry::Receiver) {
    let (dd, id) = (from.clone(), to.id());
    let c = std::thread::spawn(move || dd.connect(id, T).unwrap());
    let rx = to.accept(T).unwrap();
    (c.join().unwrap(), rx)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte_at(seed, i)).collect()
}

/// Checks received bytes against the sender's seed: exactly the old pattern for strong
/// integrity; for weak, every byte is the old or the new one (no garbage, no tearing
/// inside a byte). Returns a complaint.
fn check(bytes: &[u8], seed: u64, strong: bool) -> Option<String> {
    for (i, &b) in bytes.iter().enumerate() {
        let old = byte_at(seed, i);
        if b == old {
            continue;
        }
        if strong || b != byte_at(seed ^ MASK, i) {
            return Some(format!(
                "message {seed}: byte {i} of {} is {b}, want {old}",
                bytes.len()
            ));
        }
    }
    None
}

/// Sizes around page and threshold edges, and random ones up to 3 MiB.
fn sizes(rng: &mut Rng, n: usize) -> Vec<usize> {
    let mut v = vec![1, 4095, 4096, 4097, 64 << 10, (1 << 20) + 13];
    while v.len() < n {
        v.push(1 + rng.below(3 << 20) as usize);
    }
    v
}

/// This test binary's own knob: with `FERRY_TEST_NO_TCOW=1`, [`passing`] turns
/// [`PassingConfig::tcow`] off, so the promises run without TCOW (as where userfaultfd is
/// refused). The library itself reads no environment variable.
fn tcow_off() -> bool {
    std::env::var("FERRY_TEST_NO_TCOW").is_ok_and(|v| v == "1")
}

/// Outputs `a` with `output` while another thread writes `new` over it from byte `at`
/// through a raw pointer: with `early`, as soon as output has protected the pages (while
/// the call still runs); with `at_once`, at once; otherwise once the call returned (or
/// once a short call is over). `then` runs on the writer thread after writing.
fn output_under_writer(
    a: ferry::semantics::AppBuffer,
    at: usize,
    new: Vec<u8>,
    early: bool,
    at_once: bool,
    then: impl FnOnce() + Send + 'static,
    output: impl FnOnce(&ferry::semantics::AppBuffer) -> Used,
) -> (Used, std::sync::Arc<ferry::semantics::AppBuffer>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let ptr = a.as_mut_ptr() as usize;
    let a = std::sync::Arc::new(a);
    let a2 = a.clone();
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let done2 = done.clone();
    let writer = std::thread::spawn(move || {
        while !(at_once || done2.load(Ordering::Acquire) || early && a2.protected_pages() > 0) {
            std::thread::yield_now();
        }
        // SAFETY: the buffer lives (an Arc) until this thread is joined.
        unsafe { std::ptr::copy_nonoverlapping(new.as_ptr(), (ptr + at) as *mut u8, new.len()) };
        then();
    });
    let used = output(&a);
    done.store(true, Ordering::Release);
    writer.join().unwrap();
    (used, a)
}

/// The mechanism was used, or the one fallback this machine may force: no userfaultfd
/// (emulated copy) or an `mlock` limit (share, without root).
fn expect_used(p: &Passing, s: Semantics, used: Used, len: usize) {
    match (s, used) {
        (_, Used::Mechanism) if s != Semantics::EmulatedCopy || p.tcow_available() => {}
        (Semantics::EmulatedCopy, Used::Fallback(Fallback::NoUserfaultfd))
            if !p.tcow_available() => {}
        (Semantics::Share, Used::Fallback(Fallback::LockFailed)) => {}
        _ => panic!("{s} at {len}: {used:?}"),
    }
}

// ---------------------------------------------------------------- children

fn child_main(role: &str) {
    let group = Group::open(&std::env::var("FERRY_TEST_GROUP").unwrap()).unwrap();
    let domain = group.join().unwrap();
    let arg = std::env::var("FERRY_TEST_ARG").unwrap();
    println!("{}", domain.id());
    let mut stdin = BufReader::new(std::io::stdin());
    let p = passing(&domain);
    match role {
        // Accept from the parent; receive messages under the semantics named in the
        // argument until the parent disconnects, checking each one at receipt and again
        // while the parent writes its buffer; report "ok N" or the first complaint.
        "rx" => {
            let s: Semantics = arg.parse().unwrap();
            let strong = s.integrity() == Integrity::Strong;
            let mut rx = domain.accept(T).unwrap();
            let mut n = 0;
            let mut bad = None;
            let mut buf = vec![0u8; 4 << 20];
            loop {
                let (bytes_now, later, seed) =
                    if s.allocator() == ferry::semantics::Allocator::Application {
                        let d = match rx.recv() {
                            Ok(d) => d,
                            Err(Error::Disconnected | Error::PeerGone { .. }) => break,
                            Err(e) => panic!("{e}"),
                        };
                        let now = d.to_vec();
                        std::thread::sleep(Duration::from_millis(2));
                        let seed = seed_of(&d);
                        if !strong && n % 2 == 0 {
                            // Weak integrity: every other message is input in place
                            // (the sender's pages), the rest copied out.
                            let b = p.input_in_place(d, s).unwrap();
                            (now, b.data().to_vec(), seed)
                        } else {
                            let len = p.input_into(&d, s, &mut buf).unwrap();
                            (now, buf[..len].to_vec(), seed)
                        }
                    } else {
                        let b = match p.recv_sys(&mut rx, s) {
                            Ok(b) => b,
                            Err(Error::Disconnected | Error::PeerGone { .. }) => break,
                            Err(e) => panic!("{e}"),
                        };
                        let now = b.as_slice().unwrap().to_vec();
                        std::thread::sleep(Duration::from_millis(2));
                        (now, b.as_slice().unwrap().to_vec(), seed_of(&b.data()))
                    };
                n += 1;
                if bad.is_none() {
                    bad = check(&bytes_now, seed, strong).or_else(|| check(&later, seed, strong));
                }
            }
            match bad {
                None => println!("ok {n}"),
                Some(b) => println!("bad {b}"),
            }
        }
        // Accept, input one message in place under the semantics in the argument, say
        // "got" and whether it holds pattern 41; on a line from the parent say whether it
        // now holds pattern 41 ^ MASK (what the parent wrote meanwhile) and the counters.
        "in_place" => {
            let s: Semantics = arg.parse().unwrap();
            let mut rx = domain.accept(T).unwrap();
            let b = p.recv_in_place(&mut rx, s).unwrap();
            let v = b.data().to_vec();
            println!("got {} {}", v.len(), check(&v, 41, true).is_none());
            read_line(&mut stdin);
            let v = b.data().to_vec();
            let c = p.stats().of(s).clone();
            println!(
                "now-new {} in-place {} copied {}",
                check(&v, 41 ^ MASK, true).is_none(),
                c.inputs_in_place,
                c.copied_bytes
            );
            read_line(&mut stdin);
            drop(b);
        }
        // Accept, receive one message, say "got", and hold it; on a line from the parent
        // check it still holds the pattern of the seed in the argument.
        "hold" => {
            let mut rx = domain.accept(T).unwrap();
            let d = rx.recv().unwrap();
            println!("got {}", d.len());
            read_line(&mut stdin);
            let seed: u64 = arg.parse().unwrap_or(0);
            match check(&d.to_vec(), seed, true) {
                None => println!("intact"),
                Some(b) => println!("torn {b}"),
            }
            read_line(&mut stdin);
            drop(d);
        }
        // Connect; send two copies of 1 MiB + 100 of pattern 31 under copy; say "sent";
        // on a line, report whether the parent released both.
        "sender" => {
            let peer: DomainId = read_line(&mut stdin).parse().unwrap();
            let tx = domain.connect(peer, T).unwrap();
            let v = pattern(31, (1 << 20) + 100);
            p.send_bytes(&tx, &v).unwrap();
            p.send_bytes(&tx, &v).unwrap();
            println!("sent");
            read_line(&mut stdin);
            let released = within(10, || {
                tx.collect_releases().unwrap();
                tx.in_flight() == 0
            });
            println!("released {released}");
            read_line(&mut stdin);
        }
        // Report which thresholds and whether TCOW a Passing with the default config
        // gets, and which thresholds one given the calibration file at the argument (if
        // any) gets.
        "config" => {
            let p = Passing::new(&domain, PassingConfig::default()).unwrap();
            let st = p.stats();
            println!(
                "{:?} {} tcow {}",
                st.threshold_source,
                st.thresholds.emulated_copy,
                p.tcow_available()
            );
            if !arg.is_empty() {
                let cal = ferry::semantics::Calibration::load(std::path::Path::new(&arg));
                let config = PassingConfig {
                    thresholds: cal.unwrap().map(|c| c.thresholds),
                    ..PassingConfig::default()
                };
                let st = Passing::new(&domain, config).unwrap().stats();
                println!("{:?} {}", st.threshold_source, st.thresholds.emulated_copy);
            }
        }
        // Report why TCOW is unavailable here (run under a seccomp filter).
        "refused" => {
            println!("{:?}", p.stats().tcow_unavailable);
        }
        // Connect to the parent; send a system buffer under the semantics of the argument,
        // say "sent", then read the region through a pointer kept from before (must
        // fault for move and emulated move).
        "touch" => {
            // "SEMANTICS" (2 MiB) or "SEMANTICS@LEN".
            let (s, len) = match arg.split_once('@') {
                Some((s, l)) => (s.parse::<Semantics>().unwrap(), l.parse().unwrap()),
                None => (arg.parse().unwrap(), 2 << 20),
            };
            let peer: DomainId = read_line(&mut stdin).parse().unwrap();
            let tx = domain.connect(peer, T).unwrap();
            let mut b = p.sys_buffer(len).unwrap();
            b.as_mut_slice().unwrap().copy_from_slice(&pattern(7, len));
            let ptr = b.as_mut_slice().unwrap().as_mut_ptr();
            let used = p.send_sys(&tx, b, s).unwrap();
            println!("sent {used:?}");
            read_line(&mut stdin);
            // The region's range must still be reserved (inaccessible, not a hole another
            // mapping could take): claiming a page of it fails.
            // SAFETY: MAP_FIXED_NOREPLACE replaces nothing; a mapping it made is unmapped.
            let claim = unsafe {
                let at = ptr.add(4096).cast::<libc::c_void>();
                let m = libc::mmap(
                    at,
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                );
                if m == libc::MAP_FAILED {
                    std::io::Error::last_os_error().to_string()
                } else {
                    libc::munmap(m, 4096);
                    format!("mapped at {m:?} (wanted {at:?})")
                }
            };
            println!("claim: {claim}");
            // SAFETY: deliberately touching a region given up at output: for move and
            // emulated move this must fault; weak move leaves it mapped.
            let v = unsafe { std::ptr::read_volatile(ptr.add(4096)) };
            println!("read {v}");
            read_line(&mut stdin);
        }
        // Connect; send 2 MiB of an application buffer under emulated copy, say "sent",
        // then write the buffer over and over (TCOW faults) until killed.
        "tcow-writer" => {
            let peer: DomainId = read_line(&mut stdin).parse().unwrap();
            let tx = domain.connect(peer, T).unwrap();
            let len = 2 << 20;
            let mut a = p.app_buffer(len).unwrap();
            a.as_mut_slice().copy_from_slice(&pattern(11, len));
            let used = p
                .send_app(&tx, &a, 0..len, Semantics::EmulatedCopy)
                .unwrap();
            println!("sent {used:?}");
            let mut k = 0u8;
            loop {
                for i in (0..len).step_by(4096) {
                    a.as_mut_slice()[i] = k;
                }
                k = k.wrapping_add(1);
            }
        }
        // An ordinary TCP program (std::net, no ferry): connects to the port on stdin,
        // then for each "seed:len" of the argument waits for "go" on stdin, reads len
        // bytes and checks them; then writes the same messages back; reports "ok N" or
        // the first complaint.
        "tcp-peer" => {
            use std::io::{Read, Write};
            let (sem, list) = arg.split_once(';').unwrap();
            let s: Semantics = sem.parse().unwrap();
            let strong = s.integrity() == Integrity::Strong;
            let port: u16 = read_line(&mut stdin).parse().unwrap();
            let mut sock = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            // A small receive buffer (no autotuning): a large message cannot sit in the
            // kernel before we read it, so the sender is still sending when we start.
            rustix::net::sockopt::set_socket_recv_buffer_size(&sock, 64 << 10).unwrap();
            let msgs: Vec<(u64, usize)> = list
                .split(',')
                .map(|m| {
                    let (a, b) = m.split_once(':').unwrap();
                    (a.parse().unwrap(), b.parse().unwrap())
                })
                .collect();
            let mut bad = None;
            for &(seed, len) in &msgs {
                // Read only once the sender's writer has written its buffer.
                assert_eq!(read_line(&mut stdin), "go");
                let mut v = vec![0u8; len];
                sock.read_exact(&mut v).unwrap();
                if bad.is_none() {
                    bad = check(&v, seed, strong);
                }
            }
            for &(seed, len) in &msgs {
                sock.write_all(&pattern(seed, len)).unwrap();
            }
            match bad {
                None => println!("ok {}", msgs.len()),
                Some(b) => println!("bad {b}"),
            }
        }
        other => panic!("unknown role {other}"),
    }
}

fn seed_of(d: &IoData) -> u64 {
    let mut s = [0u8; 8];
    d.copy_range_to_slice(0..8, &mut s);
    u64::from_le_bytes(s)
}

/// Starts a child in `role` that accepts from us, and connects to it.
fn connect_to(d: &Domain, name: &str, role: &str, arg: &str) -> (Peer, ferry::Sender) {
    let peer = Peer::spawn(role, name, arg);
    let tx = d.connect(peer.id, T).unwrap();
    (peer, tx)
}

fn exit_status(peer: &mut Peer) -> std::process::ExitStatus {
    let deadline = Instant::now() + T;
    loop {
        if let Some(s) = peer.child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "child did not exit");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------- the promises

/// Share and emulated share input in place: the receiving process reads the sender's
/// own pages (no copy, counted as an input in place), so a write the sender makes after
/// output shows there, as their weak integrity allows.
fn weak_input_reads_the_senders_pages_in_place() {
    for s in [Semantics::Share, Semantics::EmulatedShare] {
        let (_g, d, name) = join(&format!("inplace-{}", s.name()));
        let p = passing(&d);
        let (mut peer, tx) = connect_to(&d, &name, "in_place", s.name());
        let len = 3 * 4096 + 100;
        let mut a = p.app_buffer(len).unwrap();
        a.as_mut_slice().copy_from_slice(&pattern(41, len));
        let used = p.send_app(&tx, &a, 0..len, s).unwrap();
        expect_used(&p, s, used, len);
        assert_eq!(peer.line(), format!("got {len} true"), "{s}");
        a.as_mut_slice().copy_from_slice(&pattern(41 ^ MASK, len));
        peer.tell("look");
        assert_eq!(peer.line(), "now-new true in-place 1 copied 0", "{s}");
        peer.tell("done");
        assert!(exit_status(&mut peer).success());
        drop(tx);
    }
}

/// For one semantics: messages of many sizes to a receiving process; right after each
/// output returns, this process overwrites the buffer (while the receiver reads it). A
/// strong-integrity receiver must see exactly the bytes at output, at receipt and after.
fn promise_under_a_writer(s: Semantics) {
    let (_g, d, name) = join(&format!("prom-{}", s.name()));
    let p = passing(&d);
    let (mut peer, tx) = connect_to(&d, &name, "rx", s.name());
    let mut rng = seed_rng();
    let mut seed = 1u64;
    for len in sizes(&mut rng, 14) {
        let len = len.max(8);
        seed += 1;
        let old = pattern(seed, len);
        let new = pattern(seed ^ MASK, len);
        match s {
            Semantics::Copy => {
                let mut v = old.clone();
                p.send_bytes(&tx, &v).unwrap();
                v.copy_from_slice(&new);
            }
            _ if s.allocator() == ferry::semantics::Allocator::Application => {
                let at = rng.below(4096) as usize;
                let mut a = p.app_buffer(at + len).unwrap();
                a.as_mut_slice()[at..].copy_from_slice(&old);
                // The writer: under emulated copy it starts as soon as output has
                // protected the pages, while the output call is still running; otherwise
                // once the call returned.
                let early = s == Semantics::EmulatedCopy && p.tcow_available();
                let (used, a) = output_under_writer(
                    a,
                    at,
                    new.clone(),
                    early,
                    false,
                    || {},
                    |a| p.send_app(&tx, a, at..at + len, s).unwrap(),
                );
                expect_used(&p, s, used, len);
                assert_eq!(&a.as_slice()[at..], &new[..], "the writer's bytes");
                // `a` drops while the receiver may still read: the output keeps its pages.
            }
            _ => {
                let mut b = p.sys_buffer(len).unwrap();
                b.as_mut_slice().unwrap().copy_from_slice(&old);
                let ptr = b.as_mut_slice().unwrap().as_mut_ptr() as usize;
                let used = p.send_sys(&tx, b, s).unwrap();
                assert_eq!(used, Used::Mechanism, "{s} at {len}");
                if s.integrity() == Integrity::Weak {
                    // Weak move leaves the region mapped: a stray write is physically
                    // possible, and the receiver may see it (no promise).
                    // SAFETY: the region stays mapped under weak move (it is only queued
                    // or freed once the receiver releases it, after which nobody checks).
                    unsafe { std::ptr::copy_nonoverlapping(new.as_ptr(), ptr as *mut u8, len) };
                }
            }
        }
    }
    drop(tx);
    let line = peer.line();
    assert!(line.starts_with("ok 14"), "{s}: receiver says {line}");
    assert!(exit_status(&mut peer).success());
    let st = p.stats();
    assert_eq!(st.of(s).outputs, 14);
    if s == Semantics::EmulatedCopy && p.tcow_available() {
        assert!(st.tcow_faults > 0 && st.tcow_pages_copied > 0, "{st:?}");
    }
}

fn copy_promise() {
    promise_under_a_writer(Semantics::Copy)
}
fn emulated_copy_promise() {
    promise_under_a_writer(Semantics::EmulatedCopy)
}
fn share_promise() {
    promise_under_a_writer(Semantics::Share)
}
fn emulated_share_promise() {
    promise_under_a_writer(Semantics::EmulatedShare)
}
fn move_promise() {
    promise_under_a_writer(Semantics::Move)
}
fn emulated_move_promise() {
    promise_under_a_writer(Semantics::EmulatedMove)
}
fn weak_move_promise() {
    promise_under_a_writer(Semantics::WeakMove)
}
fn emulated_weak_move_promise() {
    promise_under_a_writer(Semantics::EmulatedWeakMove)
}

// ---------------------------------------------------------------- faults after move

fn touching_after(s: Semantics) -> (std::process::ExitStatus, String) {
    touching_after_len(s, 2 << 20)
}

/// As [`touching_after`], with a region of `len` bytes.
fn touching_after_len(s: Semantics, len: usize) -> (std::process::ExitStatus, String) {
    let (_g, d, name) = join(&format!("touch-{}-{len}", s.name()));
    let mut peer = Peer::spawn("touch", &name, &format!("{}@{len}", s.name()));
    let mut rx = accept_from(&d, &mut peer);
    let sent = peer.line();
    assert_eq!(sent, "sent Mechanism", "{s}");
    let got = rx.recv().unwrap();
    assert!(got.eq_bytes(&pattern(7, len)), "{s}: receiver's bytes");
    peer.tell("touch");
    let claim = peer.line();
    assert!(claim.contains("File exists"), "{s} at {len}: {claim}");
    let line = peer.line();
    if line.starts_with("read") {
        peer.tell("bye");
    }
    let status = exit_status(&mut peer);
    // Our copy stays readable whatever happened to the sender.
    assert!(got.eq_bytes(&pattern(7, len)));
    (status, line)
}

fn touching_a_moved_region_faults() {
    for s in [Semantics::Move, Semantics::EmulatedMove] {
        let (status, line) = touching_after(s);
        assert_eq!(
            status.signal(),
            Some(libc::SIGSEGV),
            "{s}: {status:?} {line}"
        );
    }
    // Move drops a region below 256 KiB (a placeholder over it) instead of moving its
    // pages out: that faults too.
    let (status, line) = touching_after_len(Semantics::Move, 64 << 10);
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "{status:?} {line}");
}

fn touching_a_weakly_moved_region_does_not_fault() {
    let (status, line) = touching_after(Semantics::WeakMove);
    // It read the byte (of the old pattern: nothing else wrote it) and exited normally.
    assert_eq!(line, format!("read {}", byte_at(7, 4096)));
    assert!(status.success(), "{status:?}");
}

// ---------------------------------------------------------------- regions are reused

fn emulated_move_regions_are_hidden_then_reinstated() {
    let (_g, d, name) = join("hide");
    let p = passing(&d);
    let (mut peer, tx) = connect_to(&d, &name, "rx", "emulated-move");
    let len = 1 << 20;
    let mut b = p.sys_buffer(len).unwrap();
    b.as_mut_slice().unwrap().copy_from_slice(&pattern(2, len));
    assert_eq!(
        p.send_sys(&tx, b, Semantics::EmulatedMove).unwrap(),
        Used::Mechanism
    );
    assert!(within(10, || {
        tx.collect_releases().unwrap();
        tx.in_flight() == 0
    }));
    let mut b = p.sys_buffer(len).unwrap();
    let st = p.stats();
    assert_eq!((st.regions_hidden, st.regions_reinstated), (1, 1), "{st:?}");
    // Reinstated: the same pages, moved back (their bytes are still there), and
    // writable again; output once more, the receiver reads what was written here through
    // its own mapping of the lot, so the buffer's range maps the lot's pages again.
    assert!(
        b.as_slice().unwrap() == &pattern(2, len)[..],
        "the hidden pages came back"
    );
    b.as_mut_slice().unwrap().copy_from_slice(&pattern(3, len));
    // A region still hidden when its Passing goes is reinstated before the path gets it:
    // a later allocation of that class from the lot can write it.
    p.send_sys(&tx, b, Semantics::EmulatedMove).unwrap();
    assert!(within(10, || {
        tx.collect_releases().unwrap();
        tx.in_flight() == 0
    }));
    drop(tx);
    assert_eq!(peer.line(), "ok 2");
    drop(p);
    let path = d.path(ferry::PathConfig::default()).unwrap();
    let bufs: Vec<_> = (0..8)
        .map(|_| {
            let mut m = path.alloc(len).unwrap();
            m.write_at(0, &vec![3u8; len]);
            m
        })
        .collect();
    drop(bufs);
}

fn emulated_weak_move_regions_are_cached_and_reused() {
    let (_g, d, name) = join("cache");
    let p = passing(&d);
    let (mut peer, tx) = connect_to(&d, &name, "rx", "emulated-weak-move");
    let len = 100_000;
    for seed in 2..6 {
        let mut b = p.sys_buffer(len).unwrap();
        b.as_mut_slice()
            .unwrap()
            .copy_from_slice(&pattern(seed, len));
        p.send_sys(&tx, b, Semantics::EmulatedWeakMove).unwrap();
        assert!(within(10, || {
            tx.collect_releases().unwrap();
            tx.in_flight() == 0
        }));
    }
    let st = p.stats();
    assert_eq!(st.regions_cached, 4, "{st:?}");
    assert_eq!(st.regions_reused, 3, "{st:?}");
    drop(tx);
    assert_eq!(peer.line(), "ok 4");
}

// ---------------------------------------------------------------- fallbacks, thresholds

fn emulated_copy_falls_back_to_copy_without_userfaultfd() {
    let (_g, d, name) = join("nouffd");
    let p = Passing::new(
        &d,
        PassingConfig {
            thresholds: Some(Thresholds::NEVER_CONVERT),
            tcow: false,
            ..PassingConfig::default()
        },
    )
    .unwrap();
    assert!(!p.tcow_available());
    let (mut peer, tx) = connect_to(&d, &name, "rx", "emulated-copy");
    let len = 2 << 20;
    let mut a = p.app_buffer(len).unwrap();
    a.as_mut_slice().copy_from_slice(&pattern(2, len));
    let used = p
        .send_app(&tx, &a, 0..len, Semantics::EmulatedCopy)
        .unwrap();
    assert_eq!(used, Used::Fallback(Fallback::NoUserfaultfd));
    a.as_mut_slice().copy_from_slice(&pattern(2 ^ MASK, len));
    drop(tx);
    assert_eq!(peer.line(), "ok 1", "integrity kept by copying");
    let st = p.stats();
    assert_eq!(
        st.of(Semantics::EmulatedCopy)
            .fallback(Fallback::NoUserfaultfd),
        1
    );
    assert_eq!(st.of(Semantics::EmulatedCopy).copied_bytes, len as u64);
    assert!(st.tcow_unavailable.is_some());
    assert_eq!(st.tcow_faults, 0);
}

/// Emulated copy's promise holds in a process whose Passing has TCOW turned off by its
/// config (this binary's `FERRY_TEST_NO_TCOW` knob sets `PassingConfig::tcow`). Its name
/// must not contain the child's filter, `emulated_copy_promise`, or the child would run it
/// again.
fn tcow_off_by_config_in_a_child() {
    let (_g, d, name) = join("nouffd-cfg");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .env("FERRY_TEST_NO_TCOW", "1")
        .arg("emulated_copy_promise")
        .stdout(std::process::Stdio::piped())
        .output()
        .unwrap();
    drop((d, name));
    let out = String::from_utf8_lossy(&child.stdout).to_string();
    assert!(child.status.success(), "{out}");
    assert!(out.contains("test emulated_copy_promise ... ok"), "{out}");
    child.stdout.clear();
}

/// Runs this test binary as a child whose `userfaultfd(2)` calls fail with `EPERM` (a
/// seccomp filter), as on a system that refuses userfaultfd.
fn without_userfaultfd(cmd: &mut std::process::Command) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure only makes two prctl calls on data it
    // owns (async-signal-safe).
    unsafe {
        cmd.pre_exec(|| {
            let mut filter = [
                // Load the syscall number; if userfaultfd, fail with EPERM; else allow.
                libc::sock_filter {
                    code: 0x20,
                    jt: 0,
                    jf: 0,
                    k: 0,
                },
                libc::sock_filter {
                    code: 0x15,
                    jt: 0,
                    jf: 1,
                    k: libc::SYS_userfaultfd as u32,
                },
                libc::sock_filter {
                    code: 0x06,
                    jt: 0,
                    jf: 0,
                    k: 0x0005_0000 | libc::EPERM as u32,
                },
                libc::sock_filter {
                    code: 0x06,
                    jt: 0,
                    jf: 0,
                    k: 0x7fff_0000,
                },
            ];
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_mut_ptr(),
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    cmd.stdout(std::process::Stdio::piped()).output().unwrap()
}

/// With userfaultfd refused by the kernel, emulated copy says why and still keeps its
/// promise by copying.
fn userfaultfd_refused_by_the_kernel() {
    let name = group_name("refused");
    let out = without_userfaultfd(
        std::process::Command::new(std::env::current_exe().unwrap())
            .env("FERRY_TEST_ROLE", "refused")
            .env("FERRY_TEST_GROUP", &name)
            .env("FERRY_TEST_ARG", ""),
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("userfaultfd refused") && text.contains("not permitted"),
        "{text}"
    );
    let out = without_userfaultfd(
        std::process::Command::new(std::env::current_exe().unwrap()).arg("emulated_copy_promise"),
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("test emulated_copy_promise ... ok"), "{text}");
}

/// A kernel write (`read(2)` from a pipe) into a page under emulated-copy output: with a
/// userfaultfd that takes kernel faults it waits for the copy and succeeds; the receiver
/// keeps the old bytes. A user-mode-only userfaultfd makes it fail with `EFAULT` instead.
fn kernel_write_into_a_page_under_output() {
    let (_g, d, name) = join("kwrite");
    let p = passing(&d);
    if !p.tcow_available() {
        eprintln!("    skipped: no userfaultfd here");
        return;
    }
    let (mut peer, tx) = connect_to(&d, &name, "hold", "5");
    let len = 2 << 20;
    let mut a = p.app_buffer(len).unwrap();
    a.as_mut_slice().copy_from_slice(&pattern(5, len));
    p.send_app(&tx, &a, 0..len, Semantics::EmulatedCopy)
        .unwrap();
    assert!(peer.line().starts_with("got"));
    let (r, w) = rustix::pipe::pipe().unwrap();
    rustix::io::write(&w, &[0xab; 4096]).unwrap();
    let faults = p.stats().tcow_faults;
    // SAFETY: 4096 bytes inside the buffer, which outlives the call.
    let got = unsafe {
        libc::read(
            std::os::fd::AsRawFd::as_raw_fd(&r),
            a.as_mut_ptr().add(8192).cast(),
            4096,
        )
    };
    if p.stats().tcow_user_mode_only {
        assert_eq!(got, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EFAULT)
        );
    } else {
        assert_eq!(got, 4096);
        assert!(a.as_slice()[8192..12288].iter().all(|&b| b == 0xab));
        assert!(p.stats().tcow_faults > faults);
    }
    peer.tell("check");
    assert_eq!(peer.line(), "intact");
    peer.tell("bye");
    assert!(exit_status(&mut peer).success());
}

/// The library takes its configuration from `PassingConfig` alone: a Passing with the
/// default config uses the built-in thresholds and TCOW (where userfaultfd works) in a
/// process whose environment names a calibration file (`FERRY_CALIBRATION`, and one at the
/// XDG default path) and asks for TCOW off (`FERRY_NO_USERFAULTFD=1`), the variables
/// earlier versions read. A calibration file is used when loaded and given: stats say so.
fn configuration_comes_from_the_config_not_the_environment() {
    let name = group_name("config");
    let dir = std::env::temp_dir().join(format!("ferry-cal-{}", std::process::id()));
    let file = ferry::semantics::Calibration::default_path(&dir);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "# test\nthreshold.emulated_copy = 12288\n").unwrap();
    let tcow_here = Passing::new(&join("config-here").1, PassingConfig::default())
        .unwrap()
        .tcow_available();
    let run = |arg: &std::path::Path| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .env("FERRY_TEST_ROLE", "config")
            .env("FERRY_TEST_GROUP", &name)
            .env("FERRY_TEST_ARG", arg)
            .env("FERRY_CALIBRATION", &file)
            .env("XDG_CACHE_HOME", &dir)
            .env("FERRY_NO_USERFAULTFD", "1")
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let default = Thresholds::default().emulated_copy;
    assert_eq!(
        run(&file),
        [
            format!("Defaults {default} tcow {tcow_here}"),
            "Config 12288".to_owned()
        ]
    );
    // A file that does not exist loads as none: the defaults.
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        run(&file),
        [
            format!("Defaults {default} tcow {tcow_here}"),
            format!("Defaults {default}")
        ]
    );
}

/// Operations refuse a semantics of the other allocator, a range past the buffer and a
/// received buffer given as output, and lose nothing doing so.
fn misuse_is_refused() {
    let (g, d, _name) = join("misuse");
    let p = passing(&d);
    let d2 = g.join().unwrap();
    let p2 = passing(&d2);
    let (tx, mut rx) = local_channel(&d, &d2);
    let a = p.app_buffer(100).unwrap();
    assert!(matches!(
        p.send_app(&tx, &a, 0..10, Semantics::Move),
        Err(Error::WrongSemantics {
            semantics: "move",
            ..
        })
    ));
    assert!(matches!(
        p.send_app(&tx, &a, 0..101, Semantics::Copy),
        Err(Error::InvalidArgument(_))
    ));
    let b = p.sys_buffer(10).unwrap();
    assert!(matches!(
        p.send_sys(&tx, b, Semantics::Share),
        Err(Error::WrongSemantics { .. })
    ));
    assert!(matches!(
        p2.recv_sys(&mut rx, Semantics::Copy),
        Err(Error::WrongSemantics { .. })
    ));
    // Strong-integrity application-allocated input fills the application's buffer: no
    // input in place (refused before receiving anything).
    for s in [Semantics::Copy, Semantics::EmulatedCopy] {
        assert!(matches!(
            p2.recv_in_place(&mut rx, s),
            Err(Error::WrongSemantics {
                needs: "weak-integrity or system-allocated",
                ..
            })
        ));
    }
    let mut b = p.sys_buffer(10).unwrap();
    b.as_mut_slice().unwrap().copy_from_slice(b"0123456789");
    p.send_sys(&tx, b, Semantics::WeakMove).unwrap();
    let mut got = p2.recv_sys(&mut rx, Semantics::WeakMove).unwrap();
    assert_eq!(got.as_slice().unwrap(), b"0123456789");
    assert!(
        got.as_mut_slice().is_none(),
        "received buffers are read-only"
    );
    // A received buffer cannot be output as a system buffer: refused before sending.
    assert!(matches!(
        p2.send_sys(&tx, got, Semantics::WeakMove),
        Err(Error::ReceivedBuffer)
    ));
    // Made writable, it is a local copy.
    let b = p.sys_buffer(10).unwrap();
    p.send_sys(&tx, b, Semantics::WeakMove).unwrap();
    let got = p2.recv_sys(&mut rx, Semantics::WeakMove).unwrap();
    let mut mine = p2.make_writable(got, Semantics::WeakMove).unwrap();
    mine.as_mut_slice().unwrap()[0] = b'x';
    assert_eq!(p2.stats().of(Semantics::WeakMove).copied_bytes, 10);
    assert!(within(10, || {
        tx.collect_releases().unwrap();
        tx.in_flight() == 0
    }));
}

/// With a swap threshold of 0, input swaps in the whole pages that line up (mapped
/// privately from the sender's lot, the message held meanwhile) and copies the rest; a
/// misaligned destination copies everything. Writes to swapped pages stay private, and
/// output of such a buffer first copies them into our own lot.
fn input_swaps_whole_pages_where_told() {
    let (g, d, name) = join("swap");
    let p = passing(&d);
    assert_eq!(p.thresholds().swap, 0);
    let mut peer = Peer::spawn("sender", &name, "");
    let mut rx = accept_from(&d, &mut peer);
    assert_eq!(peer.line(), "sent");
    let len = (1 << 20) + 100;
    let want = pattern(31, len);
    // Lined up (at the offset the data had in the sender's page): the whole pages are
    // swapped, the partial ones at both ends copied.
    let data = rx.recv().unwrap();
    let at = p.preferred_offset(&data);
    let mut a = p.app_buffer(at + len).unwrap();
    assert_eq!(
        p.input_into_app(&data, Semantics::Copy, &mut a, at)
            .unwrap(),
        len
    );
    drop(data);
    let st = p.stats();
    let whole = (at + len) / 4096 - at.div_ceil(4096);
    assert!(whole >= 255);
    assert_eq!(st.pages_swapped, whole as u64, "{st:?}");
    assert_eq!(
        st.of(Semantics::Copy).copied_bytes,
        (len - whole * 4096) as u64
    );
    assert_eq!(&a.as_slice()[at..], &want[..]);
    // Not lined up: copied.
    let data = rx.recv().unwrap();
    let off = (p.preferred_offset(&data) + 1) % 4096;
    let mut b = p.app_buffer(off + len).unwrap();
    p.input_into_app(&data, Semantics::Copy, &mut b, off)
        .unwrap();
    assert_eq!(p.stats().pages_swapped, whole as u64);
    assert_eq!(&b.as_slice()[off..], &want[..]);
    drop((b, data));
    // Writing a swapped page is private to us.
    a.as_mut_slice()[at + 5000] ^= 0xff;
    assert_ne!(a.as_slice()[at + 5000], want[5000]);
    // Output names our own lot pages: the swapped ones are copied in first.
    let d2 = g.join().unwrap();
    let (tx2, mut rx2) = local_channel(&d, &d2);
    p.send_app(&tx2, &a, 0..at + len, Semantics::EmulatedShare)
        .unwrap();
    assert_eq!(p.stats().pages_settled, whole as u64);
    let got = rx2.recv().unwrap();
    assert!(got.eq_bytes(a.as_slice()));
    drop(got);
    // The sender gets its message back once nothing maps it.
    drop(a);
    peer.tell("check");
    assert_eq!(peer.line(), "released true");
    peer.tell("bye");
    assert!(exit_status(&mut peer).success());
}

/// Two domains of this process joined by a local channel, and a `Passing` on the first,
/// for the TCOW tests; `None` (after saying `skipped`) where there is no userfaultfd.
struct TcowPair {
    _g: std::sync::Arc<Group>,
    _d: Domain,
    _d2: Domain,
    p: Passing,
    tx: ferry::Sender,
    rx: ferry::Receiver,
}

fn tcow_pair(name: &str, skipped: &str) -> Option<TcowPair> {
    let (g, d, _name) = join(name);
    let p = passing(&d);
    if !p.tcow_available() {
        eprintln!("    ({skipped})");
        return None;
    }
    let d2 = g.join().unwrap();
    let (tx, rx) = local_channel(&d, &d2);
    Some(TcowPair {
        _g: g,
        _d: d,
        _d2: d2,
        p,
        tx,
        rx,
    })
}

/// A buffer whose pages TCOW replaced (a write during an emulated-copy output) is then
/// output under emulated share: the receiver reads what the buffer holds now, the new
/// page included. (An untouched buffer is output as one piece without a walk over its
/// pages; this is the walk's case.)
fn output_after_tcow_replaced_pages_names_the_new_pages() {
    let Some(TcowPair { p, tx, mut rx, .. }) =
        tcow_pair("tcowshare", "no userfaultfd: nothing to replace; skipped")
    else {
        return;
    };
    let len = 4 * 4096;
    let mut a = p.app_buffer(len).unwrap();
    a.as_mut_slice().copy_from_slice(&pattern(7, len));
    p.send_app(&tx, &a, 0..len, Semantics::EmulatedCopy)
        .unwrap();
    // Written while the first output holds the pages: page 1 is replaced.
    a.as_mut_slice()[4096 + 10] ^= 0xff;
    assert!(p.stats().tcow_pages_copied >= 1, "{:?}", p.stats());
    let first = rx.recv().unwrap();
    assert!(
        first.eq_bytes(&pattern(7, len)),
        "the first output kept its bytes"
    );
    drop(first);
    p.send_app(&tx, &a, 0..len, Semantics::EmulatedShare)
        .unwrap();
    let second = rx.recv().unwrap();
    assert!(
        second.eq_bytes(a.as_slice()),
        "the second output names the new page"
    );
    assert!(
        second.num_fragments() >= 2,
        "page 1 is a lot page of its own"
    );
    drop(second);
}

/// A long emulated-copy output protects its pages by moving their page tables out (the
/// view's range left empty and write-protected): reads during output see the buffer,
/// writes land on private copies and the receiver keeps the bytes output; after release
/// the written pages keep the new bytes (the tables that come back skip them) and writes
/// no longer fault; and a second output, after the tables came back, protects again.
fn long_tcow_output_moves_page_tables_and_keeps_every_promise() {
    let Some(TcowPair { p, tx, mut rx, .. }) =
        tcow_pair("tcowmove", "no userfaultfd: nothing to protect; skipped")
    else {
        return;
    };
    let len = 8 << 20;
    let pg = 4096;
    let mut a = p.app_buffer(len).unwrap();
    let old = pattern(41, len);
    a.as_mut_slice().copy_from_slice(&old);
    let mut want = old.clone();
    for round in 0..3u8 {
        let before = p.stats();
        p.send_app(&tx, &a, 0..len, Semantics::EmulatedCopy)
            .unwrap();
        let armed = p.stats();
        assert!(
            // Pages replaced in the round before have lot pages of their own (three).
            armed.tcow_pages_moved >= before.tcow_pages_moved + (len / pg) as u64 - 3,
            "round {round}: the run's tables moved: {armed:?}"
        );
        assert!(
            a.as_slice() == &want[..],
            "round {round}: reads see the buffer"
        );
        // Round 0 writes nothing during output; rounds 1 and 2 write the first, a middle
        // and the last page (round 1 right after a clean round: the view must be
        // protected again once its tables came back).
        if round > 0 {
            for at in [3, len / 2 + 100, len - 1] {
                a.as_mut_slice()[at] ^= 0x5a ^ round;
                want[at] ^= 0x5a ^ round;
            }
            let st = p.stats();
            assert!(
                st.tcow_faults >= armed.tcow_faults + 3
                    && st.tcow_pages_copied >= armed.tcow_pages_copied + 3,
                "round {round}: writes during output fault: {st:?}"
            );
        }
        let got = rx.recv().unwrap();
        let sent: &[u8] = if round == 0 { &old } else { &want };
        let expect_sent = if round == 0 {
            sent.to_vec()
        } else {
            // What the buffer held when output was called: `want` before this round's
            // writes.
            let mut w = want.clone();
            for at in [3, len / 2 + 100, len - 1] {
                w[at] ^= 0x5a ^ round;
            }
            w
        };
        assert!(
            got.eq_bytes(&expect_sent),
            "round {round}: the receiver kept the bytes output"
        );
        drop(got);
        assert!(wait_unprotected(&p, &tx, &a), "round {round}: released");
        assert!(
            a.as_slice() == &want[..],
            "round {round}: the written pages kept the new bytes"
        );
        // Writes after release go in place, without faults.
        let f = p.stats().tcow_faults;
        for at in (0..len).step_by(pg * 97) {
            a.as_mut_slice()[at] = a.as_slice()[at].wrapping_add(1);
            want[at] = want[at].wrapping_add(1);
        }
        assert_eq!(
            p.stats().tcow_faults,
            f,
            "round {round}: no faults once released"
        );
        assert!(a.as_slice() == &want[..]);
    }
}

/// Long outputs armed and released over and over while a thread keeps writing whole
/// pages of the buffer, so that writes fault during output, race the release that moves
/// the page tables back, and land after it: the receiver always gets exactly the bytes of
/// output time, no write is lost or torn, and no writer is left waiting.
fn writes_racing_long_outputs_and_their_release() {
    use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
    use std::sync::Arc;
    let Some(TcowPair { p, tx, mut rx, .. }) =
        tcow_pair("tcowrace", "no userfaultfd: nothing to protect; skipped")
    else {
        return;
    };
    let (pg, npages) = (4096, 1024 + 3);
    let len = npages * pg;
    let mut rng = seed_rng();
    for round in 0..12u8 {
        // A fresh buffer each round: one whose pages TCOW replaced is split into many
        // mappings, and protects short runs page by page.
        let a = p.app_buffer(len).unwrap();
        let ptr = a.as_mut_ptr() as usize;
        let a = Arc::new(a);
        let moved = p.stats().tcow_pages_moved;
        let (mine, theirs) = (
            round.wrapping_mul(2).wrapping_add(1),
            round.wrapping_mul(2) + 2,
        );
        // SAFETY: no output holds the buffer and the writer is not running.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, mine, len) };
        p.send_app(&tx, &a, 0..len, Semantics::EmulatedCopy)
            .unwrap();
        assert_eq!(p.stats().tcow_pages_moved, moved + npages as u64);
        let stop = Arc::new(AtomicBool::new(false));
        let wrote: Arc<Vec<AtomicU8>> = Arc::new((0..npages).map(|_| AtomicU8::new(0)).collect());
        let writer = {
            let (stop, wrote, a) = (stop.clone(), wrote.clone(), a.clone());
            let mut r = Rng(rng.below(u64::MAX));
            std::thread::spawn(move || {
                let _keep = a;
                let mut n = 0;
                while !stop.load(Ordering::Acquire) || n < 64 {
                    let k = r.below(npages as u64) as usize;
                    // SAFETY: inside the buffer, which `_keep` holds; nobody else writes.
                    unsafe { std::ptr::write_bytes((ptr + k * pg) as *mut u8, theirs, pg) };
                    wrote[k].store(1, Ordering::Relaxed);
                    n += 1;
                }
            })
        };
        let got = rx.recv().unwrap();
        assert_eq!(got.len(), len);
        let mut bytes = vec![0u8; len];
        got.copy_range_to_slice(.., &mut bytes);
        assert!(
            bytes.iter().all(|&b| b == mine),
            "round {round}: the receiver saw a write made after output"
        );
        drop(got);
        assert!(wait_unprotected(&p, &tx, &a), "round {round}: released");
        stop.store(true, Ordering::Release);
        writer.join().unwrap();
        for k in 0..npages {
            let want = if wrote[k].load(Ordering::Relaxed) == 1 {
                theirs
            } else {
                mine
            };
            let page = &a.as_slice()[k * pg..(k + 1) * pg];
            assert!(
                page.iter().all(|&b| b == want),
                "round {round}: page {k} lost or tore a write"
            );
        }
    }
    let st = p.stats();
    assert!(st.tcow_faults > 0, "{st:?}");
}

/// Resident pages locked in `len` bytes from `addr`, in KiB, from `/proc/self/smaps`
/// (mlock splits the mapping at the locked range's edges, so whole areas add up).
fn locked_kib(addr: usize, len: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let (mut inside, mut kib) = (false, 0);
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = head.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a < addr + len && b > addr;
                continue;
            }
        }
        if let Some(v) = line.strip_prefix("Locked:") {
            if inside {
                kib += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap();
            }
        }
    }
    kib
}

fn share_locks_each_page_until_its_last_output_is_released() {
    let (g, d, _name) = join("sharelock");
    let d2 = g.join().unwrap();
    let (tx, mut rx) = local_channel(&d, &d2);
    let p = passing(&d);
    let pg = ferry::stats::page_size();
    let mut a = p.app_buffer(8 * pg).unwrap();
    a.as_mut_slice().fill(3);
    let (at, kib) = (a.as_mut_ptr() as usize, pg as u64 / 1024);
    assert_eq!(locked_kib(at, 8 * pg), 0);
    // Two outputs overlapping on pages 2 and 3, and a third apart from them.
    for r in [0..4 * pg, 2 * pg..6 * pg, 7 * pg..8 * pg] {
        let used = p.send_app(&tx, &a, r, Semantics::Share).unwrap();
        assert_eq!(used, Used::Mechanism);
    }
    assert_eq!(locked_kib(at, 8 * pg), 7 * kib, "pages 0-5 and 7 locked");
    let released = |n: usize, rx: &mut ferry::Receiver| {
        for _ in 0..n {
            drop(rx.recv().unwrap());
        }
        tx.collect_releases().unwrap();
    };
    released(1, &mut rx);
    // Pages 2 and 3 stay locked for the second output.
    assert_eq!(locked_kib(at, 8 * pg), 5 * kib, "pages 2-5 and 7 locked");
    released(2, &mut rx);
    assert_eq!(locked_kib(at, 8 * pg), 0, "every page unlocked");
}

/// Long emulated-copy outputs that overlap each other, and a share output over one of
/// them: the page tables of a moved run come back only once no output protects any of its
/// pages, every receiver keeps the bytes of its output time, writes made in between land,
/// and a page share locked keeps its lock when the tables come back under it.
fn overlapping_long_outputs_and_a_share_lock() {
    let Some(TcowPair { p, tx, mut rx, .. }) =
        tcow_pair("tcowlap", "no userfaultfd: nothing to protect; skipped")
    else {
        return;
    };
    let mib = 1 << 20;
    let len = 12 * mib;
    let mut a = p.app_buffer(len).unwrap();
    let v0 = pattern(61, len);
    a.as_mut_slice().copy_from_slice(&v0);
    let at = a.as_mut_ptr() as usize;
    // A: 0..8 MiB (moved); then a write at 5 MiB (a TCOW copy).
    p.send_app(&tx, &a, 0..8 * mib, Semantics::EmulatedCopy)
        .unwrap();
    a.as_mut_slice()[5 * mib] ^= 1;
    let v1 = a.as_slice().to_vec();
    // B: 4..12 MiB; its pages 8..12 MiB are a run of their own (moved); then writes at
    // 6 MiB (under A and B) and 10 MiB (under B).
    p.send_app(&tx, &a, 4 * mib..12 * mib, Semantics::EmulatedCopy)
        .unwrap();
    assert!(p.stats().tcow_pages_moved >= (12 * mib / 4096) as u64 - 1);
    a.as_mut_slice()[6 * mib] ^= 2;
    a.as_mut_slice()[10 * mib] ^= 4;
    // C: share of 0..2 MiB, which locks those pages (their tables are still out, A's).
    let used = p.send_app(&tx, &a, 0..2 * mib, Semantics::Share).unwrap();
    assert_eq!(used, Used::Mechanism);
    // smaps shares a page's "Locked" among its mappings (the lot's and the view): > 0.
    let locked = locked_kib(at, len);
    assert!(locked > 0, "C locked its pages");
    let ra = rx.recv().unwrap();
    assert!(ra.eq_bytes(&v0[..8 * mib]), "A kept its bytes");
    drop(ra);
    tx.collect_releases().unwrap();
    // A's run still has pages B protects (4..8 MiB): its tables stay out, and its pages
    // stay write-protected where B needs them: B's 8 MiB of pages, none released twice,
    // but the two replaced by the writes at 6 and 10 MiB (new pages, under no output).
    assert_eq!(
        a.protected_pages(),
        8 * mib / 4096 - 2,
        "B's pages stay protected"
    );
    // Among them the pages right after A's own (4 MiB on), which a release once freed
    // twice.
    for at in [4 * mib, 4 * mib + 4096, 7 * mib] {
        let f = p.stats().tcow_faults;
        a.as_mut_slice()[at] ^= 8;
        assert!(
            p.stats().tcow_faults > f,
            "B's page at {at} is still protected"
        );
    }
    let rb = rx.recv().unwrap();
    assert!(rb.eq_bytes(&v1[4 * mib..]), "B kept its bytes");
    drop(rb);
    tx.collect_releases().unwrap();
    assert_eq!(a.protected_pages(), 0);
    assert_eq!(
        locked_kib(at, len),
        locked,
        "C's lock survives the tables coming back"
    );
    let rc = rx.recv().unwrap();
    drop(rc);
    tx.collect_releases().unwrap();
    assert_eq!(locked_kib(at, len), 0);
    // Every write landed; writes fault no more.
    let mut want = v1.clone();
    want[6 * mib] ^= 2;
    want[10 * mib] ^= 4;
    for at in [4 * mib, 4 * mib + 4096, 7 * mib] {
        want[at] ^= 8;
    }
    assert!(a.as_slice() == &want[..], "every write kept");
    let f = p.stats().tcow_faults;
    for k in (0..len).step_by(4096 * 31) {
        a.as_mut_slice()[k] ^= 16;
    }
    assert_eq!(p.stats().tcow_faults, f);
}

/// Two short emulated-copy outputs that overlap (pages 0..8 and 4..12, protected page by
/// page): releasing the first frees only its own pages, once each, so the second's pages
/// (those right after the first's own included) stay protected and its receiver keeps
/// its bytes.
fn overlapping_short_outputs_release_each_page_once() {
    let Some(TcowPair { p, tx, mut rx, .. }) =
        tcow_pair("tcowlap2", "no userfaultfd: nothing to protect; skipped")
    else {
        return;
    };
    let pg = 4096;
    let mut a = p.app_buffer(12 * pg).unwrap();
    let v0 = pattern(71, 12 * pg);
    a.as_mut_slice().copy_from_slice(&v0);
    p.send_app(&tx, &a, 0..8 * pg, Semantics::EmulatedCopy)
        .unwrap();
    p.send_app(&tx, &a, 4 * pg..12 * pg, Semantics::EmulatedCopy)
        .unwrap();
    assert_eq!(p.stats().tcow_pages_moved, 0, "short runs: page by page");
    drop(rx.recv().unwrap());
    tx.collect_releases().unwrap();
    assert_eq!(a.protected_pages(), 8, "B's eight pages stay protected");
    for k in 4..12 {
        let f = p.stats().tcow_faults;
        a.as_mut_slice()[k * pg + 1] ^= 0xff;
        assert!(p.stats().tcow_faults > f, "page {k} is still B's");
    }
    let b = rx.recv().unwrap();
    assert!(b.eq_bytes(&v0[4 * pg..]), "B kept its bytes");
}

fn task_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// A Passing, its buffers and an emulated-copy output with a TCOW fault leave no
/// descriptor and no thread behind once dropped.
fn passing_leaves_no_fd_or_thread_behind() {
    let (g, d, _name) = join("noleak");
    let d2 = g.join().unwrap();
    let (tx, mut rx) = local_channel(&d, &d2);
    // An earlier test's TCOW handler thread that dropped its own engine (it held the last
    // buffer while serving a fault) exits on its own, a moment later: let it go first.
    assert!(
        within(10, || task_count() == 1),
        "a thread of an earlier test still runs: {} threads",
        task_count()
    );
    let (fds, tasks) = (fd_count(), task_count());
    {
        let p = passing(&d);
        let mut a = p.app_buffer(1 << 20).unwrap();
        a.as_mut_slice().fill(1);
        p.send_app(&tx, &a, 0..1 << 20, Semantics::EmulatedCopy)
            .unwrap();
        a.as_mut_slice()[0] = 2;
        let got = rx.recv().unwrap();
        assert!(got.iter_bytes().all(|b| b == 1));
        drop((got, a, p));
        tx.collect_releases().unwrap();
    }
    assert!(
        within(10, || fd_count() == fds && task_count() == tasks),
        "fds {fds} -> {}, threads {tasks} -> {}",
        fd_count(),
        task_count()
    );
}

fn thresholds_at_their_edges() {
    let (_g, d, name) = join("edges");
    let t = Thresholds {
        emulated_copy: 3 * 4096,
        emulated_share: 2 * 4096,
        emulated_move: 5 * 4096,
        emulated_weak_move: 4096,
        swap: usize::MAX,
    };
    let p = Passing::new(
        &d,
        PassingConfig {
            thresholds: Some(t),
            ..PassingConfig::default()
        },
    )
    .unwrap();
    drop(name);
    // A receiving domain in this process is enough for the application forms.
    let d2 = _g.join().unwrap();
    let (tx, mut rx) = local_channel(&d, &d2);
    let a = p.app_buffer(8 * 4096).unwrap();
    for (s, edge) in [
        (Semantics::EmulatedCopy, t.emulated_copy),
        (Semantics::EmulatedShare, t.emulated_share),
    ] {
        let below = p.send_app(&tx, &a, 0..edge - 1, s).unwrap();
        let at = p.send_app(&tx, &a, 0..edge, s).unwrap();
        if s == Semantics::EmulatedCopy && !p.tcow_available() {
            assert_eq!(at, Used::Fallback(Fallback::NoUserfaultfd));
        } else {
            assert_eq!(at, Used::Mechanism, "{s}");
        }
        assert_eq!(below, Used::ConvertedToCopy, "{s}");
        assert_eq!(p.stats().of(s).converted_to_copy, 1);
        rx.recv().unwrap();
        rx.recv().unwrap();
    }
    for (s, edge) in [
        (Semantics::EmulatedMove, t.emulated_move),
        (Semantics::EmulatedWeakMove, t.emulated_weak_move),
    ] {
        let below = p.send_sys(&tx, p.sys_buffer(edge - 1).unwrap(), s).unwrap();
        let at = p.send_sys(&tx, p.sys_buffer(edge).unwrap(), s).unwrap();
        assert_eq!(below, Used::ConvertedToCopy, "{s}");
        if s == Semantics::EmulatedMove {
            // The receiver is in this process: hiding would hide it from it too.
            assert_eq!(at, Used::Fallback(Fallback::SameProcess));
        } else {
            assert_eq!(at, Used::Mechanism, "{s}");
        }
        rx.recv().unwrap();
        rx.recv().unwrap();
    }
    assert_eq!(
        p.stats().threshold_source,
        ferry::semantics::ThresholdSource::Config
    );
}

// ---------------------------------------------------------------- kill -9

fn wait_unprotected(p: &Passing, tx: &ferry::Sender, a: &ferry::semantics::AppBuffer) -> bool {
    within(10, || {
        let _ = tx.check_peer();
        p.domain().collect_releases();
        a.protected_pages() == 0
    })
}

/// The receiver dies holding an emulated-copy output, while a thread of ours writes the
/// buffer (TCOW faults): afterwards no page stays protected, writes make no faults, no
/// fd leaked, and the lot pages came back.
fn receiver_killed_during_output_and_tcow_faults() {
    let (_g, d, name) = join("kill-rx");
    let p = passing(&d);
    if !p.tcow_available() {
        eprintln!("    skipped: no userfaultfd here");
        return;
    }
    let fds = fd_count();
    {
        let (mut peer, tx) = connect_to(&d, &name, "hold", "");
        let len = 4 << 20;
        let mut a = p.app_buffer(len).unwrap();
        a.as_mut_slice().copy_from_slice(&pattern(3, len));
        p.send_app(&tx, &a, 0..len, Semantics::EmulatedCopy)
            .unwrap();
        assert!(peer.line().starts_with("got"));
        assert!(a.protected_pages() > 0);
        let ptr = a.as_mut_ptr() as usize;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let st2 = stop.clone();
        let writer = std::thread::spawn(move || {
            let mut k = 0u8;
            while !st2.load(std::sync::atomic::Ordering::Relaxed) {
                for i in (0..len).step_by(4096) {
                    // SAFETY: the buffer lives until the writer is joined.
                    unsafe { std::ptr::write_volatile((ptr + i) as *mut u8, k) };
                }
                k = k.wrapping_add(1);
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        peer.kill9();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        assert!(wait_unprotected(&p, &tx, &a), "pages stay protected");
        let before = p.stats().tcow_faults;
        a.as_mut_slice().fill(9);
        assert_eq!(
            p.stats().tcow_faults,
            before,
            "a write after release faulted"
        );
        assert!(a.as_slice().iter().all(|&b| b == 9));
        drop(a);
        assert!(matches!(tx.check_peer(), Err(Error::PeerGone { .. })));
    }
    d.collect_releases();
    assert!(
        within(10, || fd_count() == fds),
        "fds {} -> {}",
        fds,
        fd_count()
    );
    assert_eq!(d.quarantined(), 0);
}

/// The receiver dies holding a moved and an emulated-moved region: both come back to
/// the sender mapped (moved) or queued hidden and reinstated on reuse (emulated move),
/// and writing every buffer of their size class afterwards does not fault.
fn receiver_killed_holding_moved_regions() {
    let (_g, d, name) = join("kill-move");
    let p = passing(&d);
    let fds = fd_count();
    let len = 1 << 20;
    for s in [Semantics::Move, Semantics::EmulatedMove] {
        let (mut peer, tx) = connect_to(&d, &name, "hold", "");
        let mut b = p.sys_buffer(len).unwrap();
        b.as_mut_slice().unwrap().fill(4);
        assert_eq!(p.send_sys(&tx, b, s).unwrap(), Used::Mechanism);
        assert!(peer.line().starts_with("got"));
        peer.kill9();
        assert!(within(10, || {
            let _ = tx.check_peer();
            d.collect_releases();
            tx.in_flight() == 0 && d.quarantined() == 0
        }));
    }
    let st = p.stats();
    assert_eq!((st.regions_unmapped, st.regions_hidden), (1, 1), "{st:?}");
    let bufs: Vec<_> = (0..4)
        .map(|_| {
            let mut b = p.sys_buffer(len).unwrap();
            b.as_mut_slice().unwrap().fill(6);
            b
        })
        .collect();
    assert_eq!(p.stats().regions_reinstated, 1);
    drop(bufs);
    assert!(
        within(10, || fd_count() == fds),
        "fds {fds} -> {}",
        fd_count()
    );
}

/// The sender dies while its writer thread takes TCOW faults on the pages we hold: our
/// copy keeps the bytes of the output, and nothing of it stays behind.
fn sender_killed_during_a_tcow_fault() {
    let (_g, d, name) = join("kill-tx");
    let fds = fd_count();
    {
        let mut peer = Peer::spawn("tcow-writer", &name, "");
        let mut rx = accept_from(&d, &mut peer);
        let sent = peer.line();
        let got = rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let want = pattern(11, 2 << 20);
        assert!(got.eq_bytes(&want), "{sent}: torn before the kill");
        peer.kill9();
        assert!(got.eq_bytes(&want), "{sent}: torn after the kill");
        drop(got);
        assert!(matches!(rx.recv(), Err(Error::PeerGone { .. })));
    }
    d.forget_dead_peers();
    assert_eq!(d.mapped_peers(), 0);
    assert!(
        within(10, || fd_count() == fds),
        "fds {} -> {}",
        fds,
        fd_count()
    );
}

// ---------------------------------------------------------------- TCP through io_uring

/// For one semantics over TCP to a plain `std::net` program in another process: output
/// through the io_uring driver while a thread writes the application buffer as soon as
/// its pages are protected; a strong-integrity peer sees only the bytes at output. Then
/// input of what the peer sends back.
fn tcp_promise(s: Semantics) {
    use ferry::uring::{RingConfig, Uring};
    if !ferry::uring::Features::probe().ring {
        eprintln!("    skipped: no io_uring here");
        return;
    }
    let (_g, d, name) = join(&format!("tcp-{}", s.name()));
    let p = passing(&d);
    let mut ring = Uring::new(&RingConfig::new(16)).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let msgs: Vec<(u64, usize)> = vec![(21, 100), (22, 4096), (23, (2 << 20) + 5), (24, 3 << 20)];
    let list: Vec<String> = msgs.iter().map(|(a, b)| format!("{a}:{b}")).collect();
    let mut peer = Peer::spawn(
        "tcp-peer",
        &name,
        &format!("{};{}", s.name(), list.join(",")),
    );
    peer.tell(&port.to_string());
    let (sock, _) = listener.accept().unwrap();
    // A small send buffer too: messages of 2 MiB and more stay in the sending call until
    // the peer reads, which it does only after our writer has written.
    rustix::net::sockopt::set_socket_send_buffer_size(&sock, 64 << 10).unwrap();
    let stdin = std::sync::Arc::new(std::sync::Mutex::new(peer.child.stdin.take().unwrap()));
    let go = |stdin: &std::sync::Arc<std::sync::Mutex<std::process::ChildStdin>>| {
        use std::io::Write;
        let mut w = stdin.lock().unwrap();
        writeln!(w, "go").unwrap();
        w.flush().unwrap();
    };
    let mut faults_at_large = 0;
    for &(seed, len) in &msgs {
        let old = pattern(seed, len);
        let faults_before = p.stats().tcow_faults;
        let used =
            if s.allocator() == ferry::semantics::Allocator::Application && s != Semantics::Copy {
                let mut a = p.app_buffer(len).unwrap();
                a.as_mut_slice().copy_from_slice(&old);
                let new = pattern(seed ^ MASK, len);
                let wait_for_protection = s == Semantics::EmulatedCopy && p.tcow_available();
                let stdin2 = stdin.clone();
                // The writer: once output has protected the pages (or at once, for the forms
                // that protect nothing, or once a short send is over), write the new bytes;
                // then let the peer read.
                output_under_writer(
                    a,
                    0,
                    new,
                    wait_for_protection,
                    !wait_for_protection,
                    move || go(&stdin2),
                    |a| p.tcp_send_app(&mut ring, &sock, a, 0..len, s).unwrap(),
                )
                .0
            } else {
                let stdin2 = stdin.clone();
                let teller = std::thread::spawn(move || go(&stdin2));
                let used = if s == Semantics::Copy {
                    p.tcp_send_bytes(&sock, &old)
                        .map(|_| Used::Mechanism)
                        .unwrap()
                } else {
                    let mut b = p.sys_buffer(len).unwrap();
                    b.as_mut_slice().unwrap().copy_from_slice(&old);
                    p.tcp_send_sys(&mut ring, &sock, b, s).unwrap()
                };
                teller.join().unwrap();
                used
            };
        expect_used(&p, s, used, len);
        if len >= 2 << 20 {
            faults_at_large += p.stats().tcow_faults - faults_before;
        }
    }
    // Input: what the peer writes back.
    for &(seed, len) in &msgs {
        let got = if s.allocator() == ferry::semantics::Allocator::Application {
            let mut a = p.app_buffer(len + 10).unwrap();
            let mut n = 0;
            while n < len {
                let k = if s == Semantics::Copy {
                    p.tcp_recv_into(&sock, s, &mut a.as_mut_slice()[10 + n..10 + len])
                        .unwrap()
                } else {
                    p.tcp_recv_into_app(&mut ring, &sock, s, &mut a, 10 + n)
                        .unwrap()
                };
                assert!(k > 0, "end of stream");
                n += k;
            }
            a.as_slice()[10..10 + len].to_vec()
        } else {
            let mut v = Vec::new();
            while v.len() < len {
                let b = p.tcp_recv_sys(&mut ring, &sock, s, len - v.len()).unwrap();
                assert!(!b.is_empty(), "end of stream");
                v.extend_from_slice(b.as_slice().unwrap());
            }
            v
        };
        assert!(got == pattern(seed, len), "{s}: input of message {seed}");
    }
    let line = peer.line();
    assert_eq!(line, "ok 4", "{s}");
    assert!(exit_status(&mut peer).success());
    let st = p.stats();
    if s.allocator() == ferry::semantics::Allocator::System
        || s == Semantics::Share
        || s == Semantics::EmulatedShare
        || (s == Semantics::EmulatedCopy && p.tcow_available())
    {
        assert!(st.zc_sends > 0, "{s}: {st:?}");
        eprintln!(
            "    {s}: {} zero-copy sends, {} copied by the kernel (loopback)",
            st.zc_sends, st.zc_copied
        );
    }
    if s == Semantics::EmulatedCopy && p.tcow_available() {
        assert!(
            faults_at_large > 0,
            "the writer never met a protected page: {st:?}"
        );
    }
}

fn tcp_all_semantics() {
    for s in Semantics::ALL {
        tcp_promise(s);
    }
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    if tcow_off() {
        eprintln!("    (FERRY_TEST_NO_TCOW=1: TCOW off in the tests' Passings)");
    }
    run(&[
        ("copy_promise", copy_promise),
        ("emulated_copy_promise", emulated_copy_promise),
        ("share_promise", share_promise),
        ("emulated_share_promise", emulated_share_promise),
        ("move_promise", move_promise),
        ("emulated_move_promise", emulated_move_promise),
        ("weak_move_promise", weak_move_promise),
        ("emulated_weak_move_promise", emulated_weak_move_promise),
        (
            "touching_a_moved_region_faults",
            touching_a_moved_region_faults,
        ),
        (
            "touching_a_weakly_moved_region_does_not_fault",
            touching_a_weakly_moved_region_does_not_fault,
        ),
        (
            "emulated_move_regions_are_hidden_then_reinstated",
            emulated_move_regions_are_hidden_then_reinstated,
        ),
        (
            "emulated_weak_move_regions_are_cached_and_reused",
            emulated_weak_move_regions_are_cached_and_reused,
        ),
        (
            "emulated_copy_falls_back_to_copy_without_userfaultfd",
            emulated_copy_falls_back_to_copy_without_userfaultfd,
        ),
        (
            "tcow_off_by_config_in_a_child",
            tcow_off_by_config_in_a_child,
        ),
        ("thresholds_at_their_edges", thresholds_at_their_edges),
        (
            "share_locks_each_page_until_its_last_output_is_released",
            share_locks_each_page_until_its_last_output_is_released,
        ),
        ("misuse_is_refused", misuse_is_refused),
        (
            "overlapping_short_outputs_release_each_page_once",
            overlapping_short_outputs_release_each_page_once,
        ),
        (
            "overlapping_long_outputs_and_a_share_lock",
            overlapping_long_outputs_and_a_share_lock,
        ),
        (
            "writes_racing_long_outputs_and_their_release",
            writes_racing_long_outputs_and_their_release,
        ),
        (
            "long_tcow_output_moves_page_tables_and_keeps_every_promise",
            long_tcow_output_moves_page_tables_and_keeps_every_promise,
        ),
        (
            "weak_input_reads_the_senders_pages_in_place",
            weak_input_reads_the_senders_pages_in_place,
        ),
        (
            "passing_leaves_no_fd_or_thread_behind",
            passing_leaves_no_fd_or_thread_behind,
        ),
        (
            "input_swaps_whole_pages_where_told",
            input_swaps_whole_pages_where_told,
        ),
        (
            "output_after_tcow_replaced_pages_names_the_new_pages",
            output_after_tcow_replaced_pages_names_the_new_pages,
        ),
        (
            "configuration_comes_from_the_config_not_the_environment",
            configuration_comes_from_the_config_not_the_environment,
        ),
        (
            "userfaultfd_refused_by_the_kernel",
            userfaultfd_refused_by_the_kernel,
        ),
        (
            "kernel_write_into_a_page_under_output",
            kernel_write_into_a_page_under_output,
        ),
        (
            "receiver_killed_during_output_and_tcow_faults",
            receiver_killed_during_output_and_tcow_faults,
        ),
        (
            "receiver_killed_holding_moved_regions",
            receiver_killed_holding_moved_regions,
        ),
        (
            "sender_killed_during_a_tcow_fault",
            sender_killed_during_a_tcow_fault,
        ),
        ("tcp_all_semantics", tcp_all_semantics),
    ]);
}
