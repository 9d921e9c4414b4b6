//! What members publish in the control block about their paths and sending channels,
//! read by a process that does not join the group (as `ferry stat` does): the numbers
//! follow what child processes hold, dead members are not shown, and garbage written over
//! the area is reported, never followed. Each child is this test binary re-executed in a
//! role (`harness = false`).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use ferry::stats::MemberActivity;
use ferry::{DomainId, Group, PathConfig};

// ---------------------------------------------------------------- child roles

fn child_main(role: &str) {
    let (_gname, _group, domain, arg, mut stdin) = child_start();
    match role {
        // Accepts a channel, receives ARG messages and holds them; prints "holding".
        // On "drop" drops them and prints "dropped"; then waits for a line to exit.
        "holder" => {
            let mut rx = domain.accept(T).unwrap();
            let n: usize = arg.parse().unwrap();
            let held: Vec<_> = (0..n).map(|_| rx.recv_timeout(T).unwrap()).collect();
            println!("holding");
            assert_eq!(read_line(&mut stdin), "drop");
            drop(held);
            println!("dropped");
            read_line(&mut stdin);
        }
        // ARG "N,K": reads the holder's id, allocates K fbufs it keeps and sends N
        // one-fbuf messages; prints "sent". A thread collects releases every few ms
        // (the moment a sender's numbers refresh). On "release" drops the K fbufs and
        // prints "released"; then waits for a line to exit.
        "sender" => {
            let (n, k) = arg.split_once(',').unwrap();
            let (n, k): (usize, usize) = (n.parse().unwrap(), k.parse().unwrap());
            let peer: DomainId = read_line(&mut stdin).parse().unwrap();
            let path = domain.path(PathConfig::default()).unwrap();
            let tx = domain.connect(peer, T).unwrap();
            let kept: Vec<_> = (0..k).map(|_| path.alloc(100).unwrap().freeze()).collect();
            for seed in 0..n as u64 {
                tx.send(&fill(&path, seed, 100)).unwrap();
            }
            let stop = Arc::new(AtomicBool::new(false));
            let collector = {
                let (d, stop) = (domain.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        d.collect_releases();
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                })
            };
            println!("sent");
            assert_eq!(read_line(&mut stdin), "release");
            drop(kept);
            println!("released");
            read_line(&mut stdin);
            stop.store(true, Ordering::Relaxed);
            collector.join().unwrap();
            drop(tx);
        }
        _ => panic!("unknown role {role}"),
    }
}

// ---------------------------------------------------------------- helpers

/// The activity of the member with id `id`, if it is listed.
fn of(all: &[MemberActivity], id: DomainId) -> Option<&MemberActivity> {
    all.iter().find(|a| a.member.id == id)
}

/// (fbufs, bytes) of the sender's one listed path and (peer, in flight, sent) of its one
/// listed channel, or `None` if it does not list exactly those.
/// A path's (fbufs, bytes) and a channel's (peer, in flight, sent).
type Numbers = ((u64, u64), (DomainId, u64, u64));

fn sender_numbers(g: &Group, id: DomainId) -> Option<Numbers> {
    let all = g.activity();
    let a = of(&all, id)?;
    assert!(a.damage.is_empty(), "{:?}", a.damage);
    match (&a.paths[..], &a.channels[..]) {
        ([p], [c]) => Some(((p.fbufs, p.bytes), (c.peer, c.in_flight, c.sent))),
        _ => None,
    }
}

// ---------------------------------------------------------------- tests

/// A sender child with K fbufs of its own and N messages held by a receiver child: the
/// reader, not a member, sees K + N fbufs out on the path and N messages in flight on
/// the channel; after the receiver drops them, N are back, and after the sender drops
/// its own, none. A killed member is no longer shown.
fn outstanding_and_in_flight_follow_the_children() {
    let name = group_name("activity");
    let g = Group::open(&name).unwrap();
    let (n, k) = (5u64, 3u64);
    let mut holder = Peer::spawn("holder", &name, &n.to_string());
    let mut sender = Peer::spawn("sender", &name, &format!("{n},{k}"));
    sender.tell(&holder.id.to_string());
    assert_eq!(sender.line(), "sent");
    assert_eq!(holder.line(), "holding");
    let page = 4096u64;
    let quota = PathConfig::default().quota as u64;
    assert!(
        within(10, || sender_numbers(&g, sender.id)
            == Some(((n + k, (n + k) * page), (holder.id, n, n)))),
        "{:?}",
        g.activity()
    );
    let all = g.activity();
    assert_eq!(all.len(), 2, "the reader is no member: {all:?}");
    let p = &of(&all, sender.id).unwrap().paths[0];
    assert_eq!(p.quota, quota);
    let h = of(&all, holder.id).unwrap();
    assert!(h.paths.is_empty() && h.channels.is_empty(), "{h:?}");
    assert_eq!(h.member.pid, holder.child.id());

    holder.tell("drop");
    assert_eq!(holder.line(), "dropped");
    assert!(
        within(10, || sender_numbers(&g, sender.id)
            == Some(((k, k * page), (holder.id, 0, n)))),
        "{:?}",
        g.activity()
    );
    sender.tell("release");
    assert_eq!(sender.line(), "released");
    assert!(
        within(10, || sender_numbers(&g, sender.id)
            == Some(((0, 0), (holder.id, 0, n)))),
        "{:?}",
        g.activity()
    );

    // A member killed with its entries still published is not shown.
    sender.kill9();
    assert!(
        within(10, || of(&g.activity(), sender.id).is_none()),
        "{:?}",
        g.activity()
    );
    assert!(of(&g.activity(), holder.id).is_some());
    holder.tell("exit");
    assert!(holder.child.wait().unwrap().success());
    assert!(within(10, || g.activity().is_empty()));
}

/// Offsets inside one member's activity area (checked against the layout by the
/// library's unit test `activity::tests::layout_is_stable`).
const PATHS_AT: usize = 8;
const PATH_LEN: usize = 32;
const CHANNELS_AT: usize = PATHS_AT + 32 * PATH_LEN;
const CHANNEL_LEN: usize = 32;

/// Garbage over a member's activity area: the reader reports damaged entries and never
/// panics or lists out-of-range values; once the owner rewrites its entries they read
/// right again.
fn garbage_in_the_activity_area_is_reported() {
    let name = group_name("activity-garbage");
    let g = Group::open(&name).unwrap();
    let (a, b) = (g.join().unwrap(), g.join().unwrap());
    let path = a.path(PathConfig::default()).unwrap();
    let (bid, a2) = (b.id(), a.clone());
    let t = std::thread::spawn(move || a2.connect(bid, T).unwrap());
    let mut rx = b.accept(T).unwrap();
    let tx = t.join().unwrap();
    tx.send(&path.alloc(100).unwrap().freeze()).unwrap();
    let got = rx.recv_timeout(T).unwrap();
    let mine = of(&g.activity(), a.id()).unwrap().clone();
    assert_eq!((mine.paths.len(), mine.channels.len()), (1, 1));
    assert_eq!(mine.paths[0].fbufs, 1);
    assert_eq!(mine.channels[0].in_flight, 1);
    let (pi, ci) = (
        mine.paths[0].entry as usize,
        mine.channels[0].entry as usize,
    );

    // This process's own mapping of the control memfd, as a hostile member has.
    let map = map_control_block(&name);
    let (off, len) = ferry::testing::activity_span(a.id().slot);
    let (path_at, chan_at) = (
        off + PATHS_AT + pi * PATH_LEN,
        off + CHANNELS_AT + ci * CHANNEL_LEN,
    );

    // Values no owner writes, one field at a time.
    write_u64(&map, path_at + 16, u64::MAX - 4095);
    let m = of(&g.activity(), a.id()).unwrap().clone();
    assert!(m.paths.is_empty());
    assert_eq!(m.damage[0].why, "outstanding bytes out of range", "{m:?}");
    write_u64(&map, path_at + 16, 4096);
    write_u64(&map, path_at + 24, 1 << 60);
    let m = of(&g.activity(), a.id()).unwrap().clone();
    assert_eq!(m.damage[0].why, "outstanding fbufs out of range", "{m:?}");
    write_word(&map, path_at, 0x1234_5678);
    let m = of(&g.activity(), a.id()).unwrap().clone();
    assert_eq!(m.damage[0].why, "unknown tag", "{m:?}");
    // A channel's peer: slot in the high half, generation in the low.
    let peer_word = |slot: u64| slot << 32 | b.id().generation as u64;
    write_u64(&map, chan_at + 8, peer_word(999));
    let m = of(&g.activity(), a.id()).unwrap().clone();
    assert!(m.channels.is_empty());
    assert_eq!(m.damage[1].why, "peer slot out of range", "{m:?}");
    write_u64(&map, chan_at + 8, peer_word(b.id().slot as u64));
    write_u64(&map, chan_at + 16, u64::MAX);
    let m = of(&g.activity(), a.id()).unwrap().clone();
    assert_eq!(m.damage[1].why, "messages in flight out of range", "{m:?}");

    // Random words over the whole area, many times: no panic, every listed value in
    // range, at most one entry per path and channel slot.
    let mut rng = seed_rng();
    for round in 0..300 {
        for w in (0..len).step_by(4) {
            let v = match round % 3 {
                0 => rng.next() as u32,
                1 => (rng.next() % 4) as u32,
                // Valid tags (PATH, CHANNEL) and small numbers: entries that look right.
                _ => [0x5041_5448, 0x4348_414e, 0, 1, 4096][rng.below(5) as usize],
            };
            write_word(&map, off + w, v);
        }
        for m in g.activity() {
            assert!(m.paths.len() + m.damage.len() <= 32 + 64);
            assert!(m.channels.len() <= 64);
            for p in &m.paths {
                assert!(p.bytes <= g.lot_size() as u64 && p.bytes % 4096 == 0);
            }
            for c in &m.channels {
                assert!((c.peer.slot as usize) < 64 && c.in_flight <= u32::MAX as u64);
            }
        }
    }
    // The owner's entries are its own again once it rewrites them: zero the area and
    // make a new path and channel.
    for w in (0..len).step_by(4) {
        write_word(&map, off + w, 0);
    }
    drop(got);
    drop((tx, rx, path));
    let path = a.path(PathConfig::default()).unwrap();
    let _held = path.alloc(100).unwrap();
    let m = of(&g.activity(), a.id()).unwrap().clone();
    assert!(m.damage.is_empty(), "{m:?}");
    assert_eq!(m.paths.len(), 1);
    assert_eq!((m.paths[0].fbufs, m.paths[0].bytes), (1, 4096));
}

/// A domain with more paths than its area has entries lists as many as fit and counts
/// the rest; a freed entry is taken by the next path.
fn paths_beyond_the_entries_are_counted() {
    let name = group_name("activity-unlisted");
    let g = Group::open(&name).unwrap();
    let d = g.join().unwrap();
    let counts = || {
        let all = g.activity();
        let m = of(&all, d.id()).unwrap();
        (m.paths.len(), m.unlisted_paths)
    };
    let mut paths: Vec<_> = (0..34)
        .map(|_| d.path(PathConfig::default()).unwrap())
        .collect();
    assert_eq!(counts(), (32, 2));
    drop(paths.remove(0));
    assert_eq!(counts(), (31, 2));
    drop(paths.pop());
    assert_eq!(counts(), (31, 1));
    paths.push(d.path(PathConfig::default()).unwrap());
    assert_eq!(counts(), (32, 1));
    drop(paths);
    assert_eq!(counts(), (0, 0));
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[
        (
            "outstanding_and_in_flight_follow_the_children",
            outstanding_and_in_flight_follow_the_children,
        ),
        (
            "garbage_in_the_activity_area_is_reported",
            garbage_in_the_activity_area_is_reported,
        ),
        (
            "paths_beyond_the_entries_are_counted",
            paths_beyond_the_entries_are_counted,
        ),
    ]);
}
