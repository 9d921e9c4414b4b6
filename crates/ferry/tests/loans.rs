//! Loans between real processes: a publisher's loan written once and published to 1, 2
//! and 4 subscriber processes, checksummed; loans dropped unsent give their fbufs back
//! and publish nothing; subscribers that join, leave and die while loans are out; a
//! sender's loan from its own path; a receiver that spins, then blocks. Each child is
//! this test binary re-executed in a role (`harness = false`).

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferry::{Error, Publisher, ServiceConfig, SlowSubscriber, Subscriber};

/// Seed that ends a stream.
const END: u64 = u64::MAX;

// ---------------------------------------------------------------- child roles

fn child_main(role: &str) {
    let (_gname, _group, domain, arg, mut stdin) = child_start();
    match role {
        // ARG "service,strict|lossy,LIMIT": receive until END (or LIMIT messages, then
        // leave the service); in strict mode seeds must follow one another from the
        // first, in lossy mode only increase; verify every byte; print
        // "ok <count> <first>".
        "sub" => {
            let mut it = arg.split(',');
            let (name, mode) = (it.next().unwrap(), it.next().unwrap());
            let limit: u64 = it.next().map_or(u64::MAX, |l| l.parse().unwrap());
            let mut sub = Subscriber::open(&domain, name, T).unwrap();
            println!("joined");
            let (mut n, mut first, mut last) = (0u64, None, None);
            while n < limit {
                let d = sub.recv_timeout(Duration::from_secs(30)).unwrap();
                let seed = verify(&d).unwrap();
                drop(d);
                if seed == END {
                    break;
                }
                if let Some(l) = last {
                    if mode == "strict" {
                        assert_eq!(seed, l + 1, "a message was lost or reordered");
                    } else {
                        assert!(seed > l, "reordered");
                    }
                }
                first.get_or_insert(seed);
                last = Some(seed);
                n += 1;
            }
            // One with a limit leaves now; the others stay until told to exit.
            let stay = (n < limit).then_some(sub);
            println!("ok {n} {}", first.unwrap_or(0));
            read_line(&mut stdin);
            drop(stay);
        }
        // Connect to the domain read on stdin; on each line "send SEED" send one
        // message of 100 bytes following SEED through a loan of the sender's own path
        // (print "sent"); on "outstanding" print the bytes that path has out, once the
        // receiver's releases are in.
        "loan-sender" => {
            let to = read_line(&mut stdin).parse().unwrap();
            let tx = domain.connect(to, T).unwrap();
            loop {
                let line = read_line(&mut stdin);
                if line == "outstanding" {
                    tx.collect_releases().unwrap();
                    println!("{}", tx.path().outstanding());
                    continue;
                }
                let Some(seed) = line.strip_prefix("send ") else {
                    break;
                };
                let mut loan = tx.loan_slice(100).unwrap();
                write_seeded(loan.as_mut_slice().unwrap(), seed.parse().unwrap());
                loan.send().unwrap();
                println!("sent");
            }
        }
        _ => panic!("unknown role {role}"),
    }
}

// ---------------------------------------------------------------- helpers

/// Writes the bytes `common::verify` expects of the message `seed`.
fn write_seeded(bytes: &mut [u8], seed: u64) {
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = byte_at(seed, i);
    }
}

/// Publishes message `seed` of `len` bytes through a loan; returns what `send` does.
fn publish_loaned(p: &mut Publisher, seed: u64, len: usize) -> ferry::Result<usize> {
    let mut msg = p.loan(len)?;
    assert_eq!(msg.len(), len);
    write_seeded(msg.as_mut_slice(), seed);
    msg.send()
}

/// Reads a child's "ok <count> <first>" line.
fn ok_line(p: &mut Peer) -> (u64, u64) {
    let l = p.line();
    let mut it = l.split_whitespace();
    assert_eq!(it.next(), Some("ok"), "child said {l:?}");
    (
        it.next().unwrap().parse().unwrap(),
        it.next().unwrap().parse().unwrap(),
    )
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn finish(peers: impl IntoIterator<Item = Peer>) {
    for mut p in peers {
        p.tell("exit");
        p.child.wait().unwrap();
    }
}

fn spawn_sub(group: &str, arg: &str) -> Peer {
    let mut s = Peer::spawn("sub", group, arg);
    assert_eq!(s.line(), "joined");
    s
}

fn offer(d: &ferry::Domain, svc: &str, depth: u32, slow: SlowSubscriber) -> Publisher {
    let cfg = ServiceConfig {
        depth,
        slow,
        ..ServiceConfig::default()
    };
    Publisher::offer(d, svc, cfg).unwrap()
}

// ---------------------------------------------------------------- tests

/// One loan per message, written once in place, reaches 1, 2 and 4 subscriber
/// processes byte for byte (sizes from 8 bytes to 256 KiB, from one page to several):
/// `send` says how many it reached, each subscriber gets every message in order, and
/// every fbuf comes back to the publisher's path once they released it.
fn publisher_loan_reaches_every_subscriber_process() {
    let (_g, d, name) = join("fan");
    let mut rng = seed_rng();
    for n in [1usize, 2, 4] {
        let svc = format!("loan/{n}");
        let mut p = offer(&d, &svc, 16, SlowSubscriber::Block);
        let subs: Vec<Peer> = (0..n)
            .map(|_| spawn_sub(&name, &format!("{svc},strict")))
            .collect();
        p.wait_for_subscribers(n, T).unwrap();
        for seed in 0..300 {
            let len = 8 + rng.below(256 * 1024) as usize;
            assert_eq!(publish_loaned(&mut p, seed, len).unwrap(), n);
        }
        assert_eq!(publish_loaned(&mut p, END, 64).unwrap(), n);
        let mut subs = subs;
        for s in &mut subs {
            assert_eq!(ok_line(s), (300, 0));
        }
        wait_until("every fbuf back", || {
            p.collect_releases();
            p.path().outstanding() == 0
        });
        let st = p.stats();
        assert_eq!((st.published, st.delivered), (301, 301 * n as u64));
        assert_eq!(st.copied_bytes, 0, "a loan is in the publisher's lot");
        finish(subs);
    }
}

/// A loan dropped unsent publishes nothing (the subscriber, which checks that seeds
/// follow one another, sees only the sent ones) and its fbuf is back in the path at
/// once; loans dropped by the thousand do not use up the path's quota.
fn publisher_loan_dropped_unsent_returns_its_fbuf() {
    let (_g, d, name) = join("drop");
    let mut p = offer(&d, "loan/drop", 8, SlowSubscriber::Block);
    let mut sub = spawn_sub(&name, "loan/drop,strict");
    p.wait_for_subscribers(1, T).unwrap();
    // The same path as the publisher's (a clone shares its counters).
    let path = p.path().clone();
    let mut sent = 0u64;
    for round in 0..2000u64 {
        let mut msg = p.loan(64 * 1024).unwrap();
        if round % 3 == 0 {
            write_seeded(msg.as_mut_slice(), sent);
            assert_eq!(msg.send().unwrap(), 1);
            sent += 1;
        } else {
            // Written (as if about to be sent) with a seed out of sequence, then
            // dropped: were it published, the subscriber would fail.
            write_seeded(msg.as_mut_slice(), 1_000_000 + round);
            let before = path.stats();
            drop(msg);
            let after = path.stats();
            assert_eq!(
                after.outstanding_fbufs + 1,
                before.outstanding_fbufs,
                "the dropped loan's fbuf is back at once"
            );
            assert_eq!(after.outstanding + 64 * 1024, before.outstanding);
        }
    }
    publish_loaned(&mut p, END, 64).unwrap();
    assert_eq!(ok_line(&mut sub), (sent, 0));
    wait_until("every fbuf back", || {
        p.collect_releases();
        p.path().outstanding() == 0
    });
    let st = p.path().stats();
    assert_eq!(st.allocs, 2001);
    assert_eq!(st.quota_refusals, 0);
    assert_eq!(p.stats().published, sent + 1);
    finish([sub]);
}

/// Subscribers join, leave and die while loans are out (between a loan and its send):
/// the subscriber there from the start gets every message intact and in order, a late
/// joiner gets intact messages in order from some point on, one that leaves after 50
/// messages and one killed mid-stream stop counting, `send` never fails, and every
/// fbuf (including those the dead one held) comes back.
fn subscribers_join_and_leave_during_loans() {
    let (_g, d, name) = join("churn");
    let svc = "loan/churn";
    let mut p = offer(&d, svc, 8, SlowSubscriber::Block);
    let mut steady = spawn_sub(&name, &format!("{svc},strict"));
    p.wait_for_subscribers(1, T).unwrap();
    let (mut late, mut leaver, mut victim) = (None, None, None);
    for seed in 0..400u64 {
        let mut msg = p.loan(1000 + (seed as usize * 97) % 30_000).unwrap();
        write_seeded(msg.as_mut_slice(), seed);
        match seed {
            // Joins while this loan is out; gets every message from one on.
            50 => late = Some(spawn_sub(&name, &format!("{svc},strict"))),
            // Joins, and is killed while the loan of message 300 is out.
            100 => victim = Some(spawn_sub(&name, &format!("{svc},strict"))),
            // Joins while this loan is out and leaves after 50 messages (no one joins
            // after it left, which would drop its channel uncounted).
            150 => leaver = Some(spawn_sub(&name, &format!("{svc},strict,50"))),
            300 => victim.as_mut().unwrap().kill9(),
            _ => {}
        }
        let reached = msg.send().unwrap();
        assert!((1..=4).contains(&reached), "reached {reached}");
        // A joiner's channel is on the publisher's list a moment after the joiner's
        // side is open: wait for it, so that it gets the next message on.
        let want = match seed {
            50 => 2,
            100 => 3,
            150 => 4,
            _ => continue,
        };
        wait_until("the joiner", || p.subscriber_count() == want);
    }
    publish_loaned(&mut p, END, 64).unwrap();
    assert_eq!(ok_line(&mut steady), (400, 0));
    let (n, first) = ok_line(late.as_mut().unwrap());
    assert!(
        (50..=51).contains(&first) && n == 400 - first,
        "{n} from {first}"
    );
    let (n, first) = ok_line(leaver.as_mut().unwrap());
    assert!(n == 50 && (150..=151).contains(&first), "{n} from {first}");
    wait_until("every fbuf back, the dead subscriber's too", || {
        p.collect_releases();
        p.path().outstanding() == 0
    });
    assert_eq!(
        p.subscriber_count(),
        2,
        "the leaver and the dead one are gone"
    );
    assert_eq!(p.stats().departed, 2);
    finish([steady, late.unwrap(), leaver.unwrap()]);
}

/// `Sender::loan_slice` in a child process: messages written in its sender's own path
/// arrive intact, and the path (`Sender::path`) has them back once they are released.
fn sender_loan_slice_between_processes() {
    let (_g, d, name) = join("sender");
    let mut child = Peer::spawn("loan-sender", &name, "");
    let mut rx = accept_from(&d, &mut child);
    let mut held = Vec::new();
    for seed in 0..100 {
        child.tell(&format!("send {seed}"));
        assert_eq!(child.line(), "sent");
        let m = rx.recv_timeout(T).unwrap();
        assert_eq!(m.len(), 100);
        assert_eq!(verify(&m).unwrap(), seed);
        held.push(m);
    }
    child.tell("outstanding");
    assert_ne!(child.line(), "0", "the held messages are out");
    drop(held);
    child.tell("outstanding");
    assert_eq!(child.line(), "0");
    child.tell("exit");
    assert!(matches!(
        rx.recv_timeout(T),
        Err(Error::Disconnected | Error::PeerGone { .. })
    ));
    child.child.wait().unwrap();
}

/// A receiver set to spin takes a message that comes while it spins without sleeping;
/// one that comes after its spin still arrives, through the blocking wait; a receiver
/// not set to spin sleeps.
fn receiver_spins_then_blocks() {
    let (_g, d, name) = join("spin");
    let mut child = Peer::spawn("loan-sender", &name, "");
    let mut rx = accept_from(&d, &mut child);
    let sleeps = |rx: &ferry::Receiver| rx.stats().sleeps;
    let receive_later = |rx: &mut ferry::Receiver, child: &mut Peer, seed: u64| {
        std::thread::scope(|s| {
            let got = s.spawn(|| rx.recv_timeout(T));
            // Sent well after the receive began (the test asserts what the receiver
            // did, not how long it took).
            std::thread::sleep(Duration::from_secs(1));
            child.tell(&format!("send {seed}"));
            assert_eq!(verify(&got.join().unwrap().unwrap()).unwrap(), seed);
        });
        assert_eq!(child.line(), "sent");
    };
    // Spins long enough to see the message come: no sleep.
    rx.set_spin(Duration::from_secs(8));
    let before = sleeps(&rx);
    receive_later(&mut rx, &mut child, 1);
    assert_eq!(sleeps(&rx), before, "a spinning receiver slept");
    // A short spin, then the blocking wait takes the message.
    rx.set_spin(Duration::from_millis(1));
    let before = sleeps(&rx);
    receive_later(&mut rx, &mut child, 2);
    assert!(sleeps(&rx) > before, "the receive never blocked");
    // Not spinning: sleeps at once.
    rx.set_spin(Duration::ZERO);
    let before = sleeps(&rx);
    receive_later(&mut rx, &mut child, 3);
    assert!(sleeps(&rx) > before);
    child.tell("exit");
    child.child.wait().unwrap();
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[
        (
            "publisher_loan_reaches_every_subscriber_process",
            publisher_loan_reaches_every_subscriber_process,
        ),
        (
            "publisher_loan_dropped_unsent_returns_its_fbuf",
            publisher_loan_dropped_unsent_returns_its_fbuf,
        ),
        (
            "subscribers_join_and_leave_during_loans",
            subscribers_join_and_leave_during_loans,
        ),
        (
            "sender_loan_slice_between_processes",
            sender_loan_slice_between_processes,
        ),
        ("receiver_spins_then_blocks", receiver_spins_then_blocks),
    ]);
}
