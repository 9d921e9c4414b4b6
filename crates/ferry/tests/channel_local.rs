//! Channel behaviour between two domains of one process (the multi-process tests are in
//! `processes.rs`). Two domains in one process share the address space, so the receiver
//! reads the sender's lot through the sender's own mapping.

use std::time::Duration;

use ferry::{ChannelConfig, Domain, Error, Group, IoData, PathConfig, Receiver, Sender};

mod common;

/// The seed of a message made by `common::message`, after checking every byte.
fn verify_seed(d: &IoData) -> u64 {
    common::verify(d).unwrap()
}

const T: Duration = Duration::from_secs(5);

fn group(tag: &str) -> std::sync::Arc<Group> {
    Group::open(&format!("test-{tag}-{}", std::process::id())).unwrap()
}

fn pair(g: &std::sync::Arc<Group>) -> (Domain, Domain, Sender, Receiver) {
    pair_with(g, ferry::ChannelConfig::default())
}

/// `a`'s sender to `b`'s receiver, made with `config`.
fn pair_with(
    g: &std::sync::Arc<Group>,
    config: ferry::ChannelConfig,
) -> (Domain, Domain, Sender, Receiver) {
    let a = g.join().unwrap();
    let b = g.join().unwrap();
    let (tx, rx) = link(&a, &b, config);
    (a, b, tx, rx)
}

/// A channel from `a` to `b`, made with `config`.
fn link(a: &Domain, b: &Domain, config: ferry::ChannelConfig) -> (Sender, Receiver) {
    let (bid, a2) = (b.id(), a.clone());
    let t = std::thread::spawn(move || a2.connect_with(bid, config, T).unwrap());
    let rx = b.accept(T).unwrap();
    (t.join().unwrap(), rx)
}

#[test]
fn send_receive_release() {
    let g = group("srr");
    let (a, _b, tx, mut rx) = pair(&g);
    let path = a.path(PathConfig::default()).unwrap();
    for round in 0..100u32 {
        let mut m = path.alloc(10_000).unwrap();
        m.fill_from(&vec![(round % 251) as u8; 10_000]);
        let data = m.freeze();
        let addr = data.fragments()[0].as_slice().as_ptr();
        tx.try_send(&data).unwrap();
        drop(data);
        let got = rx.try_recv().unwrap().expect("message ready");
        assert_eq!(got.len(), 10_000);
        // Zero copy: the receiver reads the very same bytes.
        assert_eq!(got.fragments()[0].as_slice().as_ptr(), addr);
        assert!(got.iter_bytes().all(|b| b == (round % 251) as u8));
        assert!(path.outstanding() > 0);
        drop(got);
        tx.collect_releases().unwrap();
        assert_eq!(path.outstanding(), 0, "released fbuf went back to the path");
        assert_eq!(tx.in_flight(), 0);
    }
    // After the first round every allocation came from the path's free list.
    let s = path.stats();
    assert_eq!(s.allocs, 100);
    assert_eq!(s.cached, 99);
    assert_eq!(tx.stats().copied_bytes, 0);
}

/// A send collects releases only every few sends, so releases that arrive after the
/// last collecting send wait in the reverse ring; they still come home with no further
/// send, through whatever collects first: an allocation the path's quota would refuse,
/// the domain's `collect_releases`, `in_flight`.
#[test]
fn releases_come_home_without_further_sends() {
    let g = group("nosend");
    let (a, _b, tx, mut rx) = pair(&g);
    let one = {
        let probe = a.path(PathConfig::default()).unwrap();
        let m = probe.alloc(4096).unwrap();
        probe.outstanding() - {
            drop(m);
            probe.outstanding()
        }
    };
    // Room for two messages: the third allocation must collect the first's release
    // (a send may not have), or the quota refuses it.
    let path = a
        .path(PathConfig {
            quota: 2 * one,
            ..PathConfig::default()
        })
        .unwrap();
    for round in 0..100u64 {
        let m = common::message(&path, round, 4096, 1);
        tx.try_send(&m).unwrap();
        drop(m);
        let got = rx.try_recv().unwrap().expect("message ready");
        assert_eq!(verify_seed(&got), round);
    }
    assert_eq!(path.stats().quota_refusals, 0);
    // A few sends after a collecting one, then nothing but releases.
    let path = a.path(PathConfig::default()).unwrap();
    for sends in 1..4u64 {
        for seed in 0..sends {
            tx.try_send(&common::message(&path, seed, 4096, 1)).unwrap();
        }
        for seed in 0..sends {
            assert_eq!(verify_seed(&rx.try_recv().unwrap().unwrap()), seed);
        }
        assert_eq!(tx.in_flight(), 0, "released messages are not in flight");
        a.collect_releases();
        assert_eq!(path.outstanding(), 0, "after {sends} sends");
    }
    // The same through the domain alone (no call on the sender at all).
    for seed in 0..3 {
        tx.try_send(&common::message(&path, seed, 4096, 1)).unwrap();
        drop(rx.try_recv().unwrap().unwrap());
    }
    a.collect_releases();
    assert_eq!(path.outstanding(), 0);
}

/// A received one-fragment message (one segment that carries its release token) stays out
/// while any clone or slice of it lives, and is released once, when the last piece goes.
#[test]
fn one_fragment_message_is_released_once_by_its_last_piece() {
    let g = group("onefrag");
    let (a, _b, tx, mut rx) = pair(&g);
    let path = a.path(PathConfig::default()).unwrap();
    let mut m = path.alloc(8192).unwrap();
    m.fill_from(&[7u8; 8192]);
    tx.try_send(&m.freeze()).unwrap();
    let got = rx.try_recv().unwrap().expect("message ready");
    assert_eq!(got.num_fragments(), 1);
    let (front, back) = got.split_at(100);
    let copy = got.clone();
    drop(got);
    for piece in [front, copy] {
        drop(piece);
        tx.collect_releases().unwrap();
        assert_eq!(tx.in_flight(), 1, "a piece is still held");
    }
    assert!(back.iter_bytes().all(|b| b == 7));
    drop(back);
    tx.collect_releases().unwrap();
    assert_eq!(tx.in_flight(), 0);
    assert_eq!(path.outstanding(), 0);
    assert_eq!(rx.stats().releases, 1, "released exactly once");
    assert_eq!(tx.stats().bad_from_peer, 0);
}

#[test]
fn many_fragments_and_heap_fallback() {
    let g = group("frag");
    let (a, _b, tx, mut rx) = pair(&g);
    let path = a.path(PathConfig::default()).unwrap();
    let mut want = Vec::new();
    let mut data = IoData::new();
    for i in 0..700usize {
        let mut m = path.alloc(1 + i % 50).unwrap();
        let bytes: Vec<u8> = (0..1 + i % 50).map(|j| (i * 7 + j) as u8).collect();
        m.fill_from(&bytes);
        want.extend_from_slice(&bytes);
        data.append(m.freeze());
    }
    // A heap fragment must be copied into an fbuf (the visible fallback).
    data.append(IoData::from_vec(b"heap tail".to_vec()));
    want.extend_from_slice(b"heap tail");
    tx.send(&data).unwrap();
    let got = rx.recv().unwrap();
    assert_eq!(got.num_fragments(), 701);
    assert_eq!(got.to_vec(), want);
    assert_eq!(tx.stats().copied_bytes, 9);
}

/// A message that the path's quota could never hold is refused at once, naming its
/// size and the quota, rather than as a full quota (which would send a caller waiting
/// for releases that cannot make room); also when only its span, a power of two of
/// pages, is over the quota, and for a size no span can have.
#[test]
fn a_message_larger_than_the_quota_is_refused_at_once() {
    let g = group("toolarge");
    let d = g.join().unwrap();
    let quota = 1 << 20;
    let path = d
        .path(PathConfig {
            quota,
            secure: false,
            ..PathConfig::default()
        })
        .unwrap();
    let err = path.alloc(quota + 1).unwrap_err();
    assert!(
        matches!(err, Error::MessageTooLarge { len, quota: q, .. } if len == quota + 1 && q == quota),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "message of 1048577 bytes exceeds the path's quota of 1048576 bytes"
    );
    // 600 KiB fits a 768 KiB quota, but its span is 1 MiB.
    let odd = d
        .path(PathConfig {
            quota: 768 << 10,
            secure: false,
            ..PathConfig::default()
        })
        .unwrap();
    let err = odd.alloc(600 << 10).unwrap_err();
    assert!(
        matches!(err, Error::MessageTooLarge { span, .. } if span == 1 << 20),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("more than the path's quota"),
        "{err}"
    );
    assert!(matches!(
        path.alloc(usize::MAX),
        Err(Error::MessageTooLarge { .. })
    ));
    // Not a quota refusal: nothing was outstanding, and a full-size message still fits.
    assert_eq!(path.stats().quota_refusals, 0);
    assert!(path.alloc(quota).is_ok());
}

#[test]
fn quota_refuses_instead_of_blocking() {
    let g = group("quota");
    let (a, _b, tx, mut rx) = pair(&g);
    let path = a
        .path(PathConfig {
            quota: 64 * 1024,
            secure: false,
            ..PathConfig::default()
        })
        .unwrap();
    let mut held = Vec::new();
    let err = loop {
        match path.alloc(4096) {
            Ok(m) => {
                tx.send(&m.freeze()).unwrap();
                held.push(rx.recv().unwrap());
            }
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, Error::QuotaExceeded { quota: 65536, .. }),
        "{err}"
    );
    assert_eq!(held.len(), 16);
    assert_eq!(path.stats().quota_refusals, 1);
    held.clear();
    // The receiver let go: allocation works again (releases are collected on demand).
    assert!(path.alloc(4096).is_ok());
}

#[test]
fn full_ring_then_disconnect() {
    let g = group("full");
    let a = g.join().unwrap();
    let b = g.join().unwrap();
    let bid = b.id();
    let a2 = a.clone();
    let t = std::thread::spawn(move || {
        a2.connect_with(
            bid,
            ferry::ChannelConfig {
                capacity: 4,
                release_capacity: 8,
                ..Default::default()
            },
            T,
        )
        .unwrap()
    });
    let mut rx = b.accept(T).unwrap();
    let tx = t.join().unwrap();
    let d = IoData::from_vec(vec![1; 10]);
    for _ in 0..4 {
        tx.try_send(&d).unwrap();
    }
    assert!(matches!(tx.try_send(&d), Err(Error::Full)));
    assert!(matches!(
        tx.send_timeout(&d, Duration::from_millis(50)),
        Err(Error::Timeout)
    ));
    for _ in 0..4 {
        rx.try_recv().unwrap().unwrap();
    }
    drop(tx);
    assert!(matches!(rx.try_recv(), Err(Error::Disconnected)));
}

#[test]
fn blocking_receiver_is_woken() {
    let g = group("wake");
    let (a, _b, tx, mut rx) = pair(&g);
    let path = a.path(PathConfig::default()).unwrap();
    let t = std::thread::spawn(move || {
        for i in 0..50u8 {
            std::thread::sleep(Duration::from_millis(1));
            let mut m = path.alloc(100).unwrap();
            m.fill_from(&[i; 100]);
            tx.send(&m.freeze()).unwrap();
        }
        tx
    });
    for i in 0..50u8 {
        let d = rx.recv_timeout(T).expect("woken before the timeout");
        assert!(d.eq_bytes(&[i; 100]));
    }
    let tx = t.join().unwrap();
    assert!(rx.stats().sleeps > 0);
    assert!(tx.stats().wakeups > 0 && tx.stats().wakeups <= rx.stats().sleeps);
}

/// A lot goes only in one of its slot's address windows: with a page of this process in
/// each, joining fails rather than map elsewhere; with one window free, the join takes
/// that one and the group records it.
#[test]
fn address_in_use_is_an_error() {
    use ferry::testing::LOT_WINDOWS;
    let name = format!("test-addr-{}", std::process::id());
    let g = Group::open(&name).unwrap();
    let r = g.slot_range(0);
    let step = (r.end - r.start) / LOT_WINDOWS;
    let pages: Vec<_> = (0..LOT_WINDOWS)
        .map(|w| {
            let addr = r.start + w * step;
            // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; we own the
            // result.
            let p = unsafe {
                libc::mmap(
                    addr as *mut _,
                    4096,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            assert_eq!(p as usize, addr);
            p
        })
        .collect();
    let e = g.join().unwrap_err();
    assert!(
        matches!(e, Error::AddressInUse { addr: a, .. } if r.contains(&a)),
        "{e}"
    );
    // SAFETY: `pages[2]` is an anonymous page mapped above, referenced by nothing else.
    unsafe { libc::munmap(pages[2], 4096) };
    let d = g.join().unwrap();
    assert_eq!(d.id().slot, 0);
    assert_eq!(d.lot_addr(), r.start + 2 * step);
    assert_eq!(g.lot_addr(0), d.lot_addr());
    for (w, p) in pages.into_iter().enumerate() {
        if w != 2 {
            // SAFETY: as above; each page is unmapped once.
            unsafe { libc::munmap(p, 4096) };
        }
    }
}

#[test]
fn bad_descriptors_are_rejected_and_the_channel_goes_on() {
    use ferry::testing::{encode, RawDesc, RawFrag, RawRef};
    let g = group("baddesc");
    let (a, _b, tx, mut rx) = pair(&g);
    let me = a.id();
    let lot = g.lot_size() as u64;
    let frag = RawFrag::new;
    let one = |f: RawFrag| encode(0, &[f], &mut [], RawRef::NONE);
    let mut bad: Vec<(RawDesc, &str)> = vec![
        (
            one(frag(me.slot, me.generation, lot - 10, 11)),
            "out of bounds",
        ),
        (
            one(frag(me.slot, me.generation, u64::MAX - 1, 4)),
            "offset overflow",
        ),
        (
            one(frag(me.slot, me.generation + 7, 0, 10)),
            "stale generation",
        ),
        (one(frag(63, 1, 0, 10)), "unknown lot"),
        (one(frag(me.slot, me.generation, 0, 0)), "empty fragment"),
    ];
    let mut d = one(frag(me.slot, me.generation, 0, 10));
    d.nfrags = 100_000;
    bad.push((d, "too many fragments"));
    let mut d = one(frag(me.slot, me.generation, 0, 10));
    d.nfrags = 6;
    d.next = RawRef {
        slot: me.slot,
        pad: 0,
        generation: me.generation,
        offset: lot + 4096,
    };
    bad.push((d, "continuation block outside the lot"));
    for (d, why) in bad {
        ferry::testing::push_raw(&tx, d).unwrap();
        match rx.try_recv() {
            Err(Error::BadDescriptor(_)) => {}
            other => panic!("{why}: accepted or wrong error: {other:?}"),
        }
    }
    assert_eq!(rx.stats().bad_from_peer, 7);
    // The channel still works.
    let good = IoData::from_vec(b"still fine".to_vec());
    tx.send(&good).unwrap();
    assert!(rx.recv().unwrap().eq_bytes(b"still fine"));
}

/// A descriptor naming any slot a group cannot have (64 and up), as a fragment's lot or
/// as a continuation block's, is refused with `BadDescriptor`: never a panic, and the
/// channel goes on. Every u16 slot value is tried, with the sender's real generation.
#[test]
fn descriptors_naming_any_slot_are_refused_without_a_panic() {
    use ferry::testing::{encode, RawFrag, RawRef};
    let g = group("anyslot");
    let (a, b, tx, mut rx) = pair(&g);
    let me = a.id();
    let frag = |slot: u16| RawFrag {
        slot,
        pad: 0,
        generation: me.generation,
        offset: 0,
        len: 10,
    };
    for slot in 0..=u16::MAX {
        if slot == me.slot || slot == b.id().slot {
            continue;
        }
        let inline = encode(0, &[frag(slot)], &mut [], RawRef::NONE);
        let mut linked = encode(0, &[frag(me.slot)], &mut [], RawRef::NONE);
        linked.nfrags = 6;
        linked.next = RawRef {
            slot,
            pad: 0,
            generation: me.generation,
            offset: 0,
        };
        for d in [inline, linked] {
            ferry::testing::push_raw(&tx, d).unwrap();
            match rx.try_recv() {
                Err(Error::BadDescriptor(_)) => {}
                other => panic!("slot {slot}: accepted or wrong error: {other:?}"),
            }
        }
    }
    let good = IoData::from_vec(b"still fine".to_vec());
    tx.send(&good).unwrap();
    assert!(rx.recv().unwrap().eq_bytes(b"still fine"));
}

#[test]
fn map_per_transfer_reads_the_same_bytes_through_a_fresh_mapping() {
    let g = group("uncached");
    let (a, _b, tx, mut rx) = pair(&g);
    ferry::testing::set_map_per_transfer(&mut rx, true);
    let path = a.path(PathConfig::default()).unwrap();
    let mut m = path.alloc(3 * 4096 + 5).unwrap();
    m.fill_from(&vec![0x5a; 3 * 4096 + 5]);
    let data = m.freeze().slice(100..);
    tx.send(&data).unwrap();
    let got = rx.recv().unwrap();
    assert_eq!(got, data);
    assert_ne!(
        got.fragments()[0].as_slice().as_ptr(),
        data.fragments()[0].as_slice().as_ptr()
    );
    drop((got, data));
    tx.collect_releases().unwrap();
    assert_eq!(path.outstanding(), 0);
}

/// Steady state (warm free list, receiver keeping up, nobody sleeping): allocation,
/// send, receive and release make no system call at all.
#[test]
fn steady_state_makes_no_system_calls() {
    let g = group("nosys");
    let (a, _b, tx, mut rx) = pair(&g);
    let path = a.path(PathConfig::default()).unwrap();
    let mut round = |i: u64| {
        let mut m = path.alloc(64 * 1024).unwrap();
        m.write_at(0, &i.to_le_bytes());
        tx.try_send(&m.freeze()).unwrap();
        let got = rx.try_recv().unwrap().unwrap();
        assert!(got.slice(0..8).eq_bytes(&i.to_le_bytes()));
    };
    for i in 0..10 {
        round(i);
    }
    let before = ferry::stats::thread_syscall_count();
    for i in 0..10_000 {
        round(i);
    }
    assert_eq!(ferry::stats::thread_syscall_count() - before, 0);
    assert_eq!(path.stats().allocs, 10_010);
}

/// A forwarding stage that sleeps in `recv` still passes its downstream's releases
/// upstream: otherwise a source with a small quota would wait forever for fbufs the
/// stage holds (source -> stage -> sink, all blocking).
#[test]
fn blocking_stage_passes_releases_upstream() {
    let g = group("chain");
    let (a, b, c) = (g.join().unwrap(), g.join().unwrap(), g.join().unwrap());
    let (tx_a, mut ab) = link(&a, &b, ChannelConfig::default());
    let (tx_b, mut bc) = link(&b, &c, ChannelConfig::default());
    let n = 200u32;
    let stage = std::thread::spawn(move || {
        for _ in 0..n {
            let d = ab.recv().unwrap();
            tx_b.send(&d).unwrap();
        }
        (ab, tx_b)
    });
    let sink = std::thread::spawn(move || {
        for i in 0..n {
            let d = bc.recv().unwrap();
            assert!(d.slice(0..4).eq_bytes(&i.to_le_bytes()));
            std::thread::sleep(Duration::from_micros(50));
        }
        bc
    });
    // Two fbufs at most: the source must get each back through the stage.
    let path = a
        .path(PathConfig {
            quota: 2 * 4096,
            secure: false,
            ..PathConfig::default()
        })
        .unwrap();
    let t0 = std::time::Instant::now();
    for i in 0..n {
        let mut m = loop {
            match path.alloc(4096) {
                Ok(m) => break m,
                Err(Error::QuotaExceeded { .. }) => {
                    assert!(
                        t0.elapsed() < Duration::from_secs(20),
                        "source starved: releases stuck in the stage"
                    );
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
        };
        m.write_at(0, &i.to_le_bytes());
        tx_a.send(&m.freeze()).unwrap();
    }
    let _ = (stage.join().unwrap(), sink.join().unwrap());
}

/// A stage that polls its input until it is empty and then waits (an event loop's
/// `try_recv` ... `arm`) passes on its downstream's releases before it waits: the first
/// empty poll after a message collects them, and so does `arm`. Without that, the source's
/// fbuf stays out while the stage sleeps.
#[test]
fn a_polling_stage_passes_releases_upstream_before_it_waits() {
    let g = group("pollstage");
    let (a, b, c) = (g.join().unwrap(), g.join().unwrap(), g.join().unwrap());
    let (tx_a, mut ab) = link(&a, &b, ChannelConfig::default());
    let (tx_b, mut bc) = link(&b, &c, ChannelConfig::default());
    let path = a.path(PathConfig::default()).unwrap();
    for release_before_first_empty_poll in [true, false] {
        let mut m = path.alloc(4096).unwrap();
        m.write_at(0, b"fwd");
        tx_a.try_send(&m.freeze()).unwrap();
        let d = ab.try_recv().unwrap().expect("message ready");
        tx_b.try_send(&d).unwrap();
        drop(d);
        if release_before_first_empty_poll {
            // The sink takes the message and lets it go; then the stage polls, finds
            // nothing, and would wait: that first empty poll passes the release on.
            drop(bc.try_recv().unwrap().expect("forwarded"));
            assert!(ab.try_recv().unwrap().is_none());
        } else {
            // The stage polls empty first; the release comes later; the stage then arms
            // to wait, and arming passes it on.
            assert!(ab.try_recv().unwrap().is_none());
            drop(bc.try_recv().unwrap().expect("forwarded"));
            assert!(ab.arm().unwrap());
        }
        tx_a.collect_releases().unwrap();
        assert_eq!(
            path.outstanding(),
            0,
            "the stage kept the sink's release (released before its first empty poll: \
             {release_before_first_empty_poll})"
        );
    }
}

/// A sender closed while its receiver still holds data is parked in its domain; that
/// must not keep the domain (and so the group's control block) alive for ever.
#[test]
fn parked_sender_does_not_leak_the_group() {
    let name = format!("test-park-{}", std::process::id());
    let file = std::path::PathBuf::from(format!("/dev/shm/ferry.{name}"));
    {
        let g = Group::open(&name).unwrap();
        let (a, b, tx, mut rx) = pair(&g);
        let path = a.path(PathConfig::default()).unwrap();
        let mut m = path.alloc(4096).unwrap();
        m.write_at(0, b"held");
        tx.send(&m.freeze()).unwrap();
        let held = rx.recv().unwrap();
        drop(tx);
        assert_eq!(a.parked_senders(), 1);
        drop((a, path));
        // The receiver still reads the sender's bytes.
        assert!(held.slice(0..4).eq_bytes(b"held"));
        drop((held, rx, b, g));
    }
    assert!(!file.exists(), "{} left behind", file.display());
}

/// The receiver's fd works with poll(2) (and so epoll and async runtimes): after `arm`,
/// it turns readable when a message arrives, and `arm` refuses to arm over a waiting one.
#[test]
fn receiver_fd_is_pollable() {
    use std::os::fd::AsRawFd;
    let g = group("poll");
    let (a, _b, tx, mut rx) = pair(&g);
    let path = a.path(PathConfig::default()).unwrap();
    let poll = |fd: i32, ms: i32| {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the duration of the call.
        unsafe { libc::poll(&mut p, 1, ms) }
    };
    assert!(rx.arm().unwrap(), "empty ring: armed");
    assert_eq!(poll(rx.as_raw_fd(), 0), 0, "nothing yet");
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        let mut m = path.alloc(10).unwrap();
        m.write_at(0, b"0123456789");
        tx.send(&m.freeze()).unwrap();
        tx
    });
    assert_eq!(poll(rx.as_raw_fd(), 5000), 1, "woken by the send");
    assert!(rx.try_recv().unwrap().unwrap().eq_bytes(b"0123456789"));
    let tx = t.join().unwrap();
    tx.send(&IoData::from_vec(vec![1])).unwrap();
    assert!(!rx.arm().unwrap(), "a message is waiting: do not sleep");
    assert!(rx.try_recv().unwrap().is_some());
}

/// Releases that overflow a reverse ring smaller than what the receiver holds are sent by
/// every receive style, and a receiver asleep in `recv` is woken when the sender makes
/// room. The sender sends batches of 8 and waits for all 8 to come back before the next;
/// the receiver drops each batch at once into a release ring of 2. Before the fix, the 6
/// releases that did not fit were sent only on the receiver's next release, which never
/// came: the sender waited forever.
#[test]
fn overflowing_releases_are_flushed_by_every_receive_style() {
    for style in ["recv", "try_recv", "recv_timeout", "recv_spin"] {
        let g = group(&format!("relovf-{style}"));
        let a = g.join().unwrap();
        let b = g.join().unwrap();
        let (bid, a2) = (b.id(), a.clone());
        let config = ferry::ChannelConfig {
            capacity: 16,
            release_capacity: 2,
            ..Default::default()
        };
        let t = std::thread::spawn(move || a2.connect_with(bid, config, T).unwrap());
        let mut rx = b.accept(T).unwrap();
        let tx = t.join().unwrap();
        const BATCHES: usize = 20;
        let receiver = std::thread::spawn(move || {
            for _ in 0..BATCHES {
                let mut held = Vec::new();
                while held.len() < 8 {
                    let m = match style {
                        "recv" => rx.recv().unwrap(),
                        "recv_timeout" => rx.recv_timeout(T).expect("no timeout"),
                        "recv_spin" => rx.recv_spin(T).expect("no timeout"),
                        _ => loop {
                            if let Some(m) = rx.try_recv().unwrap() {
                                break m;
                            }
                            std::thread::yield_now();
                        },
                    };
                    held.push(m);
                }
                drop(held);
            }
            rx
        });
        let path = a.path(PathConfig::default()).unwrap();
        for batch in 0..BATCHES {
            for i in 0..8 {
                let mut m = path.alloc(4096).unwrap();
                m.write_at(0, &[(batch * 8 + i) as u8]);
                tx.send(&m.freeze()).unwrap();
            }
            let deadline = std::time::Instant::now() + T;
            while tx.in_flight() > 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{style}: {} releases never came back (batch {batch})",
                    tx.in_flight()
                );
                tx.collect_releases().unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let rx = receiver.join().unwrap();
        assert_eq!(rx.pending_releases(), 0, "{style}");
        assert_eq!(path.outstanding(), 0, "{style}");
    }
}

/// Two threads of one domain asleep in `recv` on different channels both wait for the
/// releases of the domain's sending channel. When one of them wakes for its own reason and
/// leaves, the other must still be woken by the next release. Here domain `a` forwards
/// `x`'s messages to `b` on one thread and listens to `h` on another; `h` closes its
/// channel, then `b` releases. Before the fix, the leaving thread cleared the shared
/// "sleeping" flag, the release woke nobody, and `x` never got its fbufs back.
#[test]
fn a_release_wakes_the_remaining_sleeper_when_another_leaves() {
    let g = group("twosleepers");
    let (x, a, b, h) = (
        g.join().unwrap(),
        g.join().unwrap(),
        g.join().unwrap(),
        g.join().unwrap(),
    );
    let connect = |from: &Domain, to: &Domain| {
        let (from, to_id) = (from.clone(), to.id());
        let t = std::thread::spawn(move || from.connect(to_id, T).unwrap());
        let rx = to.accept(T).unwrap();
        (t.join().unwrap(), rx)
    };
    let (to_a, mut from_x) = connect(&x, &a);
    let (to_b, mut from_a) = connect(&a, &b);
    let (from_h_tx, mut from_h) = connect(&h, &a);
    let forwarder = std::thread::spawn(move || {
        for _ in 0..4 {
            to_b.send(&from_x.recv().unwrap()).unwrap();
        }
        // Asleep in recv (x sends no more) while b holds everything.
        let r = from_x.recv_timeout(Duration::from_secs(8));
        (r.map(|_| true), to_b)
    });
    let listener = std::thread::spawn(move || from_h.recv().map(|_| ()));
    let path = x.path(PathConfig::default()).unwrap();
    for i in 0..4u8 {
        let mut m = path.alloc(4096).unwrap();
        m.write_at(0, &[i]);
        to_a.send(&m.freeze()).unwrap();
    }
    let held: Vec<_> = (0..4).map(|_| from_a.recv().unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    drop(from_h_tx); // the listener wakes (Disconnected) and leaves
    assert!(matches!(listener.join().unwrap(), Err(Error::Disconnected)));
    std::thread::sleep(Duration::from_millis(100));
    drop(held); // b releases: the forwarder must wake and pass them on to x
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while to_a.in_flight() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of x's messages never came back",
            to_a.in_flight()
        );
        to_a.collect_releases().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(to_a);
    let (r, _to_b) = forwarder.join().unwrap();
    assert!(matches!(r, Err(Error::Disconnected)), "{r:?}");
}

/// A receiver dropped with messages still in its ring releases them: the sender gets its
/// fbufs back and learns the end is closed. Before, those fbufs stayed charged to the
/// sender's quota for as long as the receiving process lived.
#[test]
fn messages_left_in_a_dropped_receivers_ring_come_back() {
    let g = group("leftinring");
    let (a, _b, tx, mut rx) = pair(&g);
    let path = a.path(PathConfig::default()).unwrap();
    for i in 0..10u8 {
        let mut m = path.alloc(4096).unwrap();
        m.write_at(0, &[i]);
        tx.send(&m.freeze()).unwrap();
    }
    let first = rx.recv().unwrap();
    drop(rx);
    tx.collect_releases().unwrap();
    assert_eq!(tx.in_flight(), 1, "only the message still held is out");
    assert!(matches!(tx.check_peer(), Err(Error::Disconnected)));
    drop(first);
    tx.collect_releases().unwrap();
    assert_eq!(tx.in_flight(), 0);
    assert_eq!(path.outstanding(), 0);
}

/// The same while the sender keeps sending as the receiver closes: every fbuf must come
/// back each time. (The narrow case of a message pushed after the receiver released what
/// was in its ring is tested directly by a unit test in `channel/sender.rs`.)
#[test]
fn messages_racing_a_receivers_close_come_back() {
    let g = group("closerace");
    for round in 0..60u64 {
        let (a, _b, tx, rx) = pair(&g);
        let path = a.path(PathConfig::default()).unwrap();
        let sender = std::thread::spawn(move || {
            loop {
                let m = path.alloc(4096).unwrap().freeze();
                match tx.try_send(&m) {
                    Ok(()) | Err(Error::Full) => {}
                    Err(Error::Disconnected) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            (tx, path)
        });
        std::thread::sleep(Duration::from_micros(50 + (round * 37) % 400));
        drop(rx);
        let (tx, path) = sender.join().unwrap();
        tx.collect_releases().unwrap();
        assert_eq!(tx.in_flight(), 0, "round {round}");
        assert_eq!(path.outstanding(), 0, "round {round}");
    }
}

/// A receiver records every forwarded fragment it holds in its ledger; when the ledger is
/// full (4096 entries) it copies further forwarded fragments instead, counts the copy,
/// and goes back to zero copy once entries are free again.
#[test]
fn a_full_ledger_makes_the_receiver_copy_forwarded_fragments() {
    let g = group("ledgerfull");
    let (a, b, c) = (g.join().unwrap(), g.join().unwrap(), g.join().unwrap());
    let connect = |from: &Domain, to: &Domain| {
        let (from, to_id) = (from.clone(), to.id());
        let t = std::thread::spawn(move || from.connect(to_id, T).unwrap());
        let rx = to.accept(T).unwrap();
        (t.join().unwrap(), rx)
    };
    let (a_to_b, mut b_from_a) = connect(&a, &b);
    let (b_to_c, mut c_from_b) = connect(&b, &c);
    let path = a.path(PathConfig::default()).unwrap();
    // 4096 fragments: every other 16-byte piece of one fbuf, so none merge.
    let mut m = path.alloc(4096 * 32).unwrap();
    m.fill_from(&(0..4096 * 32).map(|i| i as u8).collect::<Vec<_>>());
    let whole = m.freeze();
    let mut many = IoData::new();
    for i in 0..4096 {
        many.append(whole.slice(i * 32..i * 32 + 16));
    }
    assert_eq!(many.num_fragments(), 4096);
    let mut forward = |d: &IoData, rx: &mut Receiver| {
        a_to_b.send(d).unwrap();
        b_to_c.send(&b_from_a.recv().unwrap()).unwrap();
        rx.recv().unwrap()
    };
    let held = forward(&many, &mut c_from_b);
    assert_eq!(held, many);
    assert_eq!(c_from_b.stats().copied_bytes, 0, "recorded, not copied");
    // The ledger is full: the next forwarded fragment is copied, and reads the same.
    let one = whole.slice(8..24);
    let copied = forward(&one, &mut c_from_b);
    assert_eq!(copied, one);
    assert_eq!(c_from_b.stats().copied_bytes, 16);
    assert_ne!(
        copied.fragments()[0].as_slice().as_ptr(),
        one.fragments()[0].as_slice().as_ptr()
    );
    // Entries come back when the held message goes.
    drop(held);
    let again = forward(&one, &mut c_from_b);
    assert_eq!(c_from_b.stats().copied_bytes, 16, "zero copy again");
    assert_eq!(
        again.fragments()[0].as_slice().as_ptr(),
        one.fragments()[0].as_slice().as_ptr()
    );
}

/// A lossy pair, with a forward ring of `capacity`.
fn lossy_pair(g: &std::sync::Arc<Group>, capacity: u32) -> (Domain, Domain, Sender, Receiver) {
    let config = ferry::ChannelConfig {
        capacity,
        lossy: true,
        ..Default::default()
    };
    pair_with(g, config)
}

#[test]
fn lossy_channel_evicts_the_oldest_and_returns_its_fbufs() {
    let g = group("lossy");
    let (a, _b, tx, mut rx) = lossy_pair(&g, 4);
    let path = a.path(PathConfig::default()).unwrap();
    for seed in 0..20u64 {
        // Every other message has more fragments than a descriptor holds inline.
        let pieces = if seed % 2 == 1 { 40 } else { 1 };
        let evicted = tx
            .try_send_evicting(&common::message(&path, seed, 4000, pieces))
            .unwrap();
        assert_eq!(evicted, seed >= 4, "message {seed}");
    }
    let s = tx.stats();
    assert_eq!((s.messages, s.evicted, s.releases), (20, 16, 0));
    assert_eq!(tx.in_flight(), 4);
    // Only the four queued messages still hold fbufs of the path.
    let one = {
        let m = common::message(&path, 99, 4000, 1);
        path.outstanding() - {
            drop(m);
            path.outstanding()
        }
    };
    assert_eq!(path.outstanding(), 4 * one);
    // The receiver gets the newest four, in order and intact, then new ones.
    for want in 16..20 {
        let d = rx.try_recv().unwrap().expect("queued");
        assert_eq!(verify_seed(&d), want);
    }
    assert!(rx.try_recv().unwrap().is_none());
    tx.try_send(&common::message(&path, 20, 100, 1)).unwrap();
    assert_eq!(verify_seed(&rx.try_recv().unwrap().unwrap()), 20);
    tx.collect_releases().unwrap();
    assert_eq!(path.outstanding(), 0);
    assert_eq!(tx.in_flight(), 0);
    assert_eq!(tx.stats().bad_from_peer, 0);
    assert_eq!(rx.stats().bad_from_peer, 0);
    assert_eq!(rx.stats().messages, 5);
}

/// A sender evicting as fast as it can while the receiver takes messages (blocking
/// when the ring is empty): each message is either received, in order and intact, or
/// evicted and taken back by the sender, never both and never neither.
#[test]
fn lossy_sender_racing_a_receiver_loses_nothing_twice() {
    const N: u64 = 20_000;
    let g = group("lossyrace");
    let (a, _b, tx, mut rx) = lossy_pair(&g, 8);
    let path = a.path(PathConfig::default()).unwrap();
    let path2 = path.clone();
    let sending = std::thread::spawn(move || {
        let mut evicted = 0u64;
        for seed in 0..=N {
            let pieces = if seed % 7 == 0 {
                30
            } else {
                1 + seed as usize % 3
            };
            evicted += tx
                .try_send_evicting(&common::message(&path2, seed, 256, pieces))
                .unwrap() as u64;
        }
        (tx, evicted)
    });
    let mut got = 0u64;
    let mut last = None;
    loop {
        let seed = verify_seed(&rx.recv_timeout(T).unwrap());
        assert!(last.is_none_or(|l| seed > l), "{seed} after {last:?}");
        last = Some(seed);
        got += 1;
        if seed == N {
            break;
        }
    }
    let (tx, evicted) = sending.join().unwrap();
    assert_eq!(got + evicted, N + 1, "received {got}, evicted {evicted}");
    assert_eq!(tx.stats().evicted, evicted);
    assert!(rx.try_recv().unwrap().is_none());
    tx.collect_releases().unwrap();
    assert_eq!(tx.in_flight(), 0);
    assert_eq!(path.outstanding(), 0);
    assert_eq!(tx.stats().bad_from_peer, 0);
    assert_eq!(rx.stats().bad_from_peer, 0);
}

/// A channel of four messages (eight releases), lossy or not.
fn small_ring(g: &std::sync::Arc<Group>, lossy: bool) -> (Domain, Domain, Sender, Receiver) {
    pair_with(
        g,
        ChannelConfig {
            capacity: 4,
            release_capacity: 8,
            lossy,
        },
    )
}

/// `reserve` then `send`: the message goes out as with `try_send`, zero copy; a dropped
/// reservation sends nothing and leaves the channel as it was; a full ring refuses the
/// reservation itself; and while one thread holds a reservation, another thread's send
/// on the same sender waits for it, so messages keep the order their reservations were
/// taken in.
#[test]
fn reserve_then_send() {
    let g = group("reserve");
    let (a, _b, tx, mut rx) = small_ring(&g, false);
    let path = a.path(PathConfig::default()).unwrap();
    let msg = |v: u8| {
        let mut m = path.alloc(8192).unwrap();
        m.fill_from(&[v; 8192]);
        m
    };
    // Reserve first, write the payload, freeze, send.
    let slot = tx.reserve().unwrap();
    let d = msg(1).freeze();
    let addr = d.fragments()[0].as_slice().as_ptr();
    slot.send(&d).unwrap();
    drop(d);
    let got = rx.try_recv().unwrap().expect("sent");
    assert!(got.iter_bytes().all(|b| b == 1));
    assert_eq!(got.fragments()[0].as_slice().as_ptr(), addr, "zero copy");
    drop(got);
    // A reservation dropped unsent: nothing arrives, nothing stays in flight.
    drop(tx.reserve().unwrap());
    assert!(rx.try_recv().unwrap().is_none());
    tx.collect_releases().unwrap();
    assert_eq!(tx.in_flight(), 0);
    // A heap aggregate takes the copying fallback through a reservation too.
    tx.reserve()
        .unwrap()
        .send(&IoData::from_vec(vec![2; 100]))
        .unwrap();
    assert!(rx.try_recv().unwrap().unwrap().eq_bytes(&[2; 100]));
    // Full: four in the ring, the fifth reservation is refused.
    for v in 0..4 {
        tx.reserve().unwrap().send(&msg(v).freeze()).unwrap();
    }
    assert!(matches!(tx.reserve(), Err(Error::Full)));
    for v in 0..4 {
        assert!(rx.try_recv().unwrap().unwrap().iter_bytes().all(|b| b == v));
    }
    // Held by this thread: another thread's send waits for the reservation's message.
    let slot = tx.reserve().unwrap();
    std::thread::scope(|s| {
        let other = s.spawn(|| tx.send(&IoData::from_vec(vec![20; 10])));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!other.is_finished(), "a send went past a reservation");
        slot.send(&msg(10).freeze()).unwrap();
        other.join().unwrap().unwrap();
    });
    assert!(rx
        .try_recv()
        .unwrap()
        .unwrap()
        .iter_bytes()
        .all(|b| b == 10));
    assert!(rx
        .try_recv()
        .unwrap()
        .unwrap()
        .iter_bytes()
        .all(|b| b == 20));
    // The receiver closed: the reservation is refused.
    drop(rx);
    assert!(matches!(tx.reserve(), Err(Error::Disconnected)));
}

/// `loan`: the message is written in place and sent zero copy with the descriptor made
/// at the loan; a loan dropped unsent sends nothing and gives its fbuf back; a message
/// written shorter than loaned, a heap buffer, and a lossy channel take the general path
/// and arrive as written; a full ring refuses the loan.
#[test]
fn loan_then_send() {
    let g = group("loan");
    let (a, _b, tx, mut rx) = small_ring(&g, false);
    let path = a.path(PathConfig::default()).unwrap();
    for round in 0..50u8 {
        let mut loan = tx.loan(path.alloc(10_000).unwrap()).unwrap();
        loan.data().fill_from(&[round; 10_000]);
        let addr = loan.data().fragments_mut().next().unwrap().as_ptr();
        loan.send().unwrap();
        let got = rx.try_recv().unwrap().expect("sent");
        assert_eq!(got.len(), 10_000);
        assert!(got.iter_bytes().all(|b| b == round));
        assert_eq!(got.fragments()[0].as_slice().as_ptr(), addr, "zero copy");
    }
    tx.collect_releases().unwrap();
    assert_eq!(tx.in_flight(), 0);
    // Dropped unsent: nothing arrives, the fbuf goes back, the next loan works.
    let before = path.stats().outstanding_fbufs;
    drop(tx.loan(path.alloc(100).unwrap()).unwrap());
    assert_eq!(path.stats().outstanding_fbufs, before);
    assert!(rx.try_recv().unwrap().is_none());
    // Written shorter than loaned: described again at send.
    let mut loan = tx.loan(path.alloc(8192).unwrap()).unwrap();
    loan.data().fill_from(&[7; 8192]);
    loan.data().truncate(100);
    loan.send().unwrap();
    assert!(rx.try_recv().unwrap().unwrap().eq_bytes(&[7; 100]));
    // Replaced through `data()` by another buffer of the same length: described again,
    // and the new bytes arrive (the prepared descriptor names the old fbuf).
    let mut loan = tx.loan(path.alloc(4096).unwrap()).unwrap();
    let mut other = path.alloc(4096).unwrap();
    other.fill_from(&[42; 4096]);
    let old = std::mem::replace(loan.data(), other);
    loan.send().unwrap();
    assert!(rx.try_recv().unwrap().unwrap().eq_bytes(&[42; 4096]));
    drop(old);
    // A heap buffer: the copying fallback.
    let mut loan = tx.loan(ferry::IoDataMut::with_capacity_heap(50)).unwrap();
    loan.data().fill_from(&[9; 50]);
    loan.send().unwrap();
    assert!(rx.try_recv().unwrap().unwrap().eq_bytes(&[9; 50]));
    assert_eq!(tx.stats().copied_bytes, 50);
    // Full: four in the ring, the fifth loan is refused (its buffer dropped).
    for v in 0..4u8 {
        let mut loan = tx.loan(path.alloc(64).unwrap()).unwrap();
        loan.data().fill_from(&[v; 64]);
        loan.send().unwrap();
    }
    assert!(matches!(tx.loan(path.alloc(64).unwrap()), Err(Error::Full)));
    for v in 0..4u8 {
        assert!(rx.try_recv().unwrap().unwrap().eq_bytes(&[v; 64]));
    }
    tx.collect_releases().unwrap();
    assert_eq!(tx.in_flight(), 0);
    assert_eq!(path.stats().outstanding_fbufs, before);
}

/// `Loan::as_mut_slice`: the run found at the loan is the fbuf itself (zero copy); after
/// `data()` cut or replaced the message the slice follows it (found again), and what was
/// written through it arrives; several fragments give no slice but still send.
#[test]
fn loan_slice_follows_the_message() {
    let g = group("loanslice");
    let (a, _b, tx, mut rx) = small_ring(&g, false);
    let path = a.path(PathConfig::default()).unwrap();
    let mut loan = tx.loan(path.alloc(10_000).unwrap()).unwrap();
    let s = loan.as_mut_slice().expect("an fbuf is one run");
    assert_eq!(s.len(), 10_000);
    s.fill(3);
    s[9_999] = 4;
    let addr = s.as_ptr();
    loan.send().unwrap();
    let got = rx.try_recv().unwrap().expect("sent");
    assert_eq!(got.fragments()[0].as_slice().as_ptr(), addr, "zero copy");
    assert!(got.iter_bytes().take(9_999).all(|b| b == 3));
    assert_eq!(got.iter_bytes().last(), Some(4));
    drop(got);
    // Cut through `data()` after the slice was taken: the next slice is the new length,
    // and the message goes out as cut (described again at send).
    let mut loan = tx.loan(path.alloc(8192).unwrap()).unwrap();
    loan.as_mut_slice().unwrap().fill(5);
    loan.data().truncate(100);
    let s = loan.as_mut_slice().unwrap();
    assert_eq!(s.len(), 100);
    s[99] = 6;
    loan.send().unwrap();
    let mut want = [5u8; 100];
    want[99] = 6;
    assert!(rx.try_recv().unwrap().unwrap().eq_bytes(&want));
    // Replaced through `data()`: the slice is the new buffer's.
    let mut loan = tx.loan(path.alloc(4096).unwrap()).unwrap();
    let old = std::mem::replace(loan.data(), path.alloc(4096).unwrap());
    let s = loan.as_mut_slice().unwrap();
    s.fill(7);
    let addr = s.as_ptr();
    loan.send().unwrap();
    let got = rx.try_recv().unwrap().unwrap();
    assert!(got.eq_bytes(&[7; 4096]));
    assert_eq!(got.fragments()[0].as_slice().as_ptr(), addr);
    drop((got, old));
    // Two fragments: no one run; written through `data()`, sent on the general path.
    let two = ferry::IoDataMut::from_segments(
        vec![
            ferry::Segment::from_vec(vec![0; 10]),
            ferry::Segment::from_vec(vec![0; 10]),
        ],
        20,
    )
    .unwrap();
    let mut loan = tx.loan(two).unwrap();
    assert!(loan.as_mut_slice().is_none());
    loan.data().fill_from(&[8; 20]);
    loan.send().unwrap();
    assert!(rx.try_recv().unwrap().unwrap().eq_bytes(&[8; 20]));
    // Empty: an empty slice, and an empty message arrives.
    let mut loan = tx.loan(path.alloc(0).unwrap()).unwrap();
    assert_eq!(loan.as_mut_slice().map(|s| s.len()), Some(0));
    loan.send().unwrap();
    assert!(rx.try_recv().unwrap().unwrap().is_empty());
    tx.collect_releases().unwrap();
    assert_eq!(tx.in_flight(), 0);
}

/// A loan on a lossy channel: sent on the general path, so that a full ring loses its
/// oldest message as `try_send` does.
#[test]
fn loan_on_a_lossy_channel_evicts_the_oldest() {
    let g = group("loanlossy");
    let (a, _b, tx, mut rx) = small_ring(&g, true);
    let path = a.path(PathConfig::default()).unwrap();
    for v in 0..6u8 {
        let mut loan = tx.loan(path.alloc(64).unwrap()).unwrap();
        loan.data().fill_from(&[v; 64]);
        loan.send().unwrap();
    }
    // The two oldest were evicted.
    for v in 2..6u8 {
        assert!(rx.try_recv().unwrap().unwrap().eq_bytes(&[v; 64]));
    }
    assert!(rx.try_recv().unwrap().is_none());
}

/// The permissions of the mapping that holds `addr`, from `/proc/self/maps` ("rw-p").
fn perms_at(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (range, perms) = (f.next().unwrap(), f.next().unwrap());
        let (lo, hi) = range.split_once('-').unwrap();
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).unwrap(),
            usize::from_str_radix(hi, 16).unwrap(),
        );
        if (lo..hi).contains(&addr) {
            return perms.to_owned();
        }
    }
    panic!("{addr:#x} is not mapped");
}

/// `IoData::secure` on an fbuf of a plain path (not `PathConfig::secure`) write-protects
/// its pages until every holder (here a receiver) released it; then the span is writable
/// again and back on the path's free list, reused by the next allocation.
#[test]
fn securing_a_plain_fbuf_protects_it_until_released() {
    let g = group("secure-plain");
    let (a, _b, tx, mut rx) = pair(&g);
    let path = a.path(PathConfig::default()).unwrap();
    let mut m = path.alloc(3 * 4096).unwrap();
    m.write_at(0, b"guarded");
    let data = m.freeze();
    let addr = data.fragments()[0].as_slice().as_ptr() as usize;
    data.secure().unwrap();
    data.secure().unwrap();
    assert_eq!(&perms_at(addr)[..2], "r-", "secured pages are read-only");
    assert_eq!(&perms_at(addr + 2 * 4096)[..2], "r-");
    tx.send(&data).unwrap();
    drop(data);
    let got = rx.recv_timeout(T).unwrap();
    assert!(got.slice(0..7).eq_bytes(b"guarded"));
    tx.collect_releases().unwrap();
    assert_eq!(&perms_at(addr)[..2], "r-", "still held by the receiver");
    assert!(path.outstanding() > 0);
    drop(got);
    tx.collect_releases().unwrap();
    assert_eq!(path.outstanding(), 0, "released: back on the free list");
    assert_eq!(&perms_at(addr)[..2], "rw", "writable again once released");
    let mut again = path.alloc(3 * 4096).unwrap();
    again.write_at(0, b"rewrite");
    let again = again.freeze();
    assert_eq!(again.fragments()[0].as_slice().as_ptr() as usize, addr);
    assert!(again.slice(0..7).eq_bytes(b"rewrite"));
}

/// Messages outlive their receiver and its domain, and are dropped by several threads at
/// once, some before the receiver goes and some after: every byte stays readable, and
/// every release reaches the sender. (A received message of one fragment holds no
/// reference of its own to the channel's end; the end counts them, and a receiver that
/// goes with some still out leaves the end alive for them.)
#[test]
fn messages_outlive_their_receiver_dropped_from_many_threads() {
    let g = group("outlive");
    let a = g.join().unwrap();
    let path = a.path(PathConfig::default()).unwrap();
    // Verifies and drops `msgs`, split between `threads` threads.
    let drop_on_threads = |msgs: Vec<(u64, IoData)>, threads: usize| {
        let per = msgs.len().div_ceil(threads).max(1);
        let mut msgs = msgs;
        let mut handles = Vec::new();
        while !msgs.is_empty() {
            let part: Vec<_> = msgs.drain(..per.min(msgs.len())).collect();
            handles.push(std::thread::spawn(move || {
                for (seed, d) in part {
                    assert_eq!(verify_seed(&d), seed);
                }
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
    };
    for round in 0..20u64 {
        let b = g.join().unwrap();
        let (tx, mut rx) = link(&a, &b, ChannelConfig::default());
        let mut got = Vec::new();
        for i in 0..48u64 {
            let seed = round * 1000 + i;
            tx.try_send(&common::message(&path, seed, 256, 1)).unwrap();
            let d = rx.try_recv().unwrap().expect("message ready");
            assert_eq!(d.fragments().len(), 1);
            got.push((seed, d));
        }
        // Some dropped while the receiver lives, on other threads.
        drop_on_threads(got.drain(..16).collect(), 4);
        // The receiver and its domain go with 32 messages out.
        drop(rx);
        drop(b);
        drop_on_threads(got, 4);
        tx.collect_releases().unwrap();
        assert_eq!(
            tx.in_flight(),
            0,
            "round {round}: every release reached the sender"
        );
    }
    a.collect_releases();
    assert_eq!(path.outstanding(), 0);
}
