//! Named services between real processes: many subscribers with checksummed payloads,
//! subscribers killed at random points and stopped under both policies, late joins,
//! names across processes, a hostile process scribbling over the service table,
//! request-response with a killed client and a killed server, and one handler run in
//! process and in another process. Each child is this test binary re-executed in a role
//! (`harness = false`).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ferry::ServiceKind;
use ferry::{
    Caller, Client, Error, IoData, PathConfig, Placement, Publisher, Server, ServiceConfig,
    SlowSubscriber, Subscriber,
};

/// Seed that ends a stream.
const END: u64 = u64::MAX;

// ---------------------------------------------------------------- child roles

fn child_main(role: &str) {
    let (gname, group, domain, arg, mut stdin) = child_start();
    match role {
        // ARG "service,strict": receive until END; in strict mode seeds must follow
        // one another from the first; verify every byte; print "ok <count> <first>".
        // Mode "leave-K": strict, but leave (drop the subscriber) after K messages.
        "sub" => {
            let (name, mode) = arg.split_once(',').unwrap();
            let leave_after = mode
                .strip_prefix("leave-")
                .map(|k| k.parse::<u64>().unwrap());
            let mode = if leave_after.is_some() {
                "strict"
            } else {
                mode
            };
            let mut sub = Subscriber::open(&domain, name, T).unwrap();
            println!("joined");
            let (mut n, mut first, mut last) = (0u64, None, None);
            loop {
                if Some(n) == leave_after {
                    drop(sub);
                    break;
                }
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
            println!("ok {n} {}", first.unwrap_or(0));
            read_line(&mut stdin);
        }
        // Two subscriber domains of this one process, both on ARG: both read the
        // publisher's lot (through one mapping); print "ok <count> <count>".
        "two-subs" => {
            let other = group.join().unwrap();
            let mut subs = [
                Subscriber::open(&domain, &arg, T).unwrap(),
                Subscriber::open(&other, &arg, T).unwrap(),
            ];
            println!("joined");
            let mut counts = [0u64; 2];
            for (k, s) in subs.iter_mut().enumerate() {
                loop {
                    let d = s.recv_timeout(Duration::from_secs(30)).unwrap();
                    if verify(&d).unwrap() == END {
                        break;
                    }
                    counts[k] += 1;
                }
            }
            println!("ok {} {}", counts[0], counts[1]);
            read_line(&mut stdin);
        }
        // Subscribe to ARG with no descriptor left to open; print "emfile" if that is
        // the error, else what happened.
        "sub-no-fds" => {
            exhaust_descriptors();
            let said = match Subscriber::open(&domain, &arg, T) {
                Err(Error::Io(e)) if e.raw_os_error() == Some(libc::EMFILE) => "emfile".into(),
                Err(e) => format!("error {e:?}"),
                Ok(_) => "subscribed".into(),
            };
            // stdout is open already: printing opens nothing.
            println!("{said}");
            read_line(&mut stdin);
        }
        // Offer a publisher named ARG and wait.
        "pub" => {
            let _p = Publisher::offer(&domain, &arg, ServiceConfig::default()).unwrap();
            println!("offered");
            read_line(&mut stdin);
        }
        // Serve ARG with the Reverse handler until stdin closes.
        "server" => {
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            std::thread::spawn(move || {
                read_line(&mut stdin);
                s.store(true, Ordering::Relaxed);
            });
            let mut h = Reverse { calls: 0 };
            ferry::run_server(&domain, &arg, ServiceConfig::default(), &mut h, |srv| {
                if srv.name() == arg && !stop.load(Ordering::Relaxed) {
                    return true;
                }
                false
            })
            .unwrap();
        }
        // ARG "service,calls": call the Reverse server, checking every answer; print
        // each call's number, then "ok".
        "client" => {
            let (name, calls) = arg.split_once(',').unwrap();
            let mut c = Client::open(&domain, name, T).unwrap();
            let path = domain.path(PathConfig::default()).unwrap();
            println!("joined");
            for i in 0..calls.parse::<u64>().unwrap() {
                let req = message(&path, i + 1, 100 + (i as usize * 37) % 20_000, 3);
                let got = c.call(&req, T).unwrap();
                let mut want = req.to_vec();
                want.reverse();
                assert_eq!(got.slice(0..req.len()).to_vec(), want);
                println!("{i}");
            }
            println!("ok");
            read_line(&mut stdin);
        }
        // Scribble over the service table: ARG "garbage,ROUNDS" writes random words,
        // "lock" takes the table lock as this (live) domain and holds it.
        "scribbler" => {
            let (what, rounds) = arg.split_once(',').unwrap();
            let (off, len) = ferry::testing::table_span();
            let map = map_control_block(&gname);
            let words = len / 4;
            let mut rng = Rng(std::process::id() as u64 | 1);
            if what == "lock" {
                let id = domain.id();
                let w = (id.slot as u32 + 1) | (id.generation & 0x00ff_ffff) << 8;
                write_word(&map, off, w);
            } else {
                for round in 0..rounds.parse::<u32>().unwrap() {
                    for k in 0..words {
                        let v = match round % 3 {
                            0 => rng.next() as u32,
                            1 => (rng.next() % 4) as u32,
                            // Plausible owner and member words: slots of this group.
                            _ => (rng.next() % 8 + 1) as u32 | ((rng.next() % 4) as u32) << 8,
                        };
                        write_word(&map, off + 4 * k, v);
                    }
                }
            }
            println!("done");
            read_line(&mut stdin);
        }
        _ => panic!("unknown role {role}"),
    }
}

// ---------------------------------------------------------------- helpers

/// Lowers this process's descriptor limit to its lowest free descriptor number, so that
/// opening any new descriptor fails with EMFILE.
fn exhaust_descriptors() {
    // SAFETY: dup(2) of stdin, which this process holds open, and close(2) of the
    // descriptor it made; no memory is involved.
    let lowest = unsafe { libc::dup(0) };
    assert!(lowest >= 0);
    // SAFETY: as above.
    unsafe { libc::close(lowest) };
    let limit = libc::rlimit {
        rlim_cur: lowest as libc::rlim_t,
        rlim_max: libc::RLIM_INFINITY,
    };
    let mut old = limit;
    // SAFETY: getrlimit(2) and setrlimit(2) with valid pointers to rlimit values of this
    // frame.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        let limit = libc::rlimit {
            rlim_max: old.rlim_max,
            ..limit
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

fn end_marker(path: &ferry::PathAllocator) -> IoData {
    fill(path, END, 64)
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

fn signal(p: &Peer, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(p.child.id() as i32, sig) };
}

fn finish(mut peers: Vec<Peer>) {
    for p in &mut peers {
        p.tell("exit");
        p.child.wait().unwrap();
    }
}

/// Offers `svc` from `d` with `depth` and `slow`, and starts one subscriber process
/// per mode in `modes` ("strict" or "lossy"), waiting until all are connected.
fn start(
    d: &ferry::Domain,
    group: &str,
    svc: &str,
    depth: u32,
    slow: SlowSubscriber,
    modes: &[&str],
) -> (Publisher, Vec<Peer>) {
    let cfg = ServiceConfig {
        depth,
        slow,
        ..ServiceConfig::default()
    };
    let p = Publisher::offer(d, svc, cfg).unwrap();
    let mut subs: Vec<Peer> = modes
        .iter()
        .map(|m| Peer::spawn("sub", group, &format!("{svc},{m}")))
        .collect();
    for s in &mut subs {
        assert_eq!(s.line(), "joined");
    }
    p.wait_for_subscribers(modes.len(), T).unwrap();
    (p, subs)
}

// ---------------------------------------------------------------- tests

/// Subscribers join, leave and are killed (SIGKILL) while one publisher alternates
/// loans and publishes of numbered, checksummed messages (blocking policy, queues of 4,
/// so that fan-outs keep meeting full queues): every subscriber gets every message from
/// the one published after it joined, in order and byte for byte, until the end or
/// until it leaves; no publish fails; every fbuf comes back to both paths.
fn fan_out_churn_checksummed() {
    let (_g, d, name) = join("churn");
    let svc = "churn/fan";
    let (mut p, mut subs) = start(&d, &name, svc, 4, SlowSubscriber::Block, &["strict"; 5]);
    let path = d.path(PathConfig::default()).unwrap();
    let mut rng = seed_rng();
    const MSGS: u64 = 600;
    // Subscribers that joined during the run, with the first message they must get.
    let mut joiners: Vec<(Peer, u64)> = Vec::new();
    let mut leaver = None;
    let spawn = |p: &Publisher, mode: &str| {
        let before = p.subscriber_count();
        let mut s = Peer::spawn("sub", &name, &format!("{svc},{mode}"));
        assert_eq!(s.line(), "joined");
        wait_until("the new subscriber", || p.subscriber_count() > before);
        s
    };
    for seed in 0..MSGS {
        match seed {
            100 | 350 => joiners.push((spawn(&p, "strict"), seed)),
            250 => leaver = Some((spawn(&p, "leave-50"), seed)),
            150 | 450 => subs.remove(rng.below(subs.len() as u64) as usize).kill9(),
            _ => {}
        }
        let len = 8 + rng.below(20_000) as usize;
        if seed % 2 == 0 {
            let mut loan = p.loan(len).unwrap();
            for (i, b) in loan.as_mut_slice().iter_mut().enumerate() {
                *b = byte_at(seed, i);
            }
            loan.send().unwrap();
        } else {
            let m = message(&path, seed, len, 1 + rng.below(3) as usize);
            p.publish(&m).unwrap();
        }
    }
    p.publish(&end_marker(&path)).unwrap();
    for s in &mut subs {
        assert_eq!(ok_line(s), (MSGS, 0), "a subscriber there from the start");
    }
    for (s, from) in &mut joiners {
        assert_eq!(
            ok_line(s),
            (MSGS - *from, *from),
            "a subscriber that joined"
        );
    }
    let (mut l, from) = leaver.unwrap();
    assert_eq!(ok_line(&mut l), (50, from), "the subscriber that left");
    wait_until("every fbuf back", || {
        p.collect_releases();
        path.outstanding() == 0 && p.path().outstanding() == 0
    });
    wait_until("the departures seen", || {
        p.collect_releases();
        p.stats().departed == 3
    });
    assert_eq!(p.subscriber_count(), 5);
    subs.extend(joiners.into_iter().map(|j| j.0));
    subs.push(l);
    finish(subs);
}

/// Six subscriber processes get every one of 300 multi-fragment messages, byte for
/// byte, from one publish each; the listing shows them with their pids; every fbuf
/// comes back to the publisher's path.
fn many_subscribers_checksummed() {
    let (g, d, name) = join("fan");
    let (mut p, mut subs) = start(
        &d,
        &name,
        "fan/out",
        16,
        SlowSubscriber::Block,
        &["strict"; 6],
    );
    let listed = g.services();
    assert_eq!(listed.len(), 1);
    let mut pids: Vec<u32> = listed[0].subscribers.iter().map(|m| m.pid).collect();
    let mut want: Vec<u32> = subs.iter().map(|s| s.child.id()).collect();
    pids.sort();
    want.sort();
    assert_eq!(pids, want);
    let path = d.path(PathConfig::default()).unwrap();
    let mut rng = seed_rng();
    for seed in 0..300 {
        let len = 8 + rng.below(64 * 1024) as usize;
        let m = message(&path, seed, len, 1 + rng.below(4) as usize);
        assert_eq!(p.publish(&m).unwrap(), 6);
    }
    p.publish(&end_marker(&path)).unwrap();
    for s in &mut subs {
        assert_eq!(ok_line(s), (300, 0));
    }
    wait_until("every fbuf back", || {
        p.collect_releases();
        path.outstanding() == 0
    });
    assert_eq!(p.stats().delivered, 301 * 6);
    finish(subs);
}

/// A subscriber killed at a random point: the publisher (blocking policy) and the
/// other subscribers go on, and everything the dead one held comes back.
fn subscriber_killed_at_random_points() {
    let (_g, d, name) = join("kill");
    let mut rng = seed_rng();
    for round in 0..3 {
        let svc = format!("kill/{round}");
        let (mut p, mut subs) = start(&d, &name, &svc, 8, SlowSubscriber::Block, &["strict"; 4]);
        let path = d.path(PathConfig::default()).unwrap();
        let kill_at = rng.below(200);
        let mut victim = subs.remove(rng.below(4) as usize);
        for seed in 0..200 {
            if seed == kill_at {
                victim.kill9();
            }
            p.publish(&message(&path, seed, 5000 + seed as usize, 2))
                .unwrap();
        }
        p.publish(&end_marker(&path)).unwrap();
        for s in &mut subs {
            assert_eq!(ok_line(s), (200, 0));
        }
        wait_until("the dead subscriber's fbufs", || {
            p.collect_releases();
            path.outstanding() == 0
        });
        assert_eq!(p.subscriber_count(), 3);
        assert!(p.stats().departed >= 1);
        finish(subs);
    }
}

/// Drop policy, the default: a stopped subscriber loses its oldest messages but never holds up the
/// publisher or the other subscriber; the publisher takes the evicted messages' fbufs
/// back at once; once the stopped one runs again it gets the newest `depth` messages,
/// in order and intact, then new ones.
fn stopped_subscriber_drop_policy() {
    let (_g, d, name) = join("stopdrop");
    // The default policy: a stopped subscriber must stall no one unless asked for.
    assert_eq!(ServiceConfig::default().slow, SlowSubscriber::Drop);
    let (mut p, mut subs) = start(
        &d,
        &name,
        "stop/drop",
        8,
        ServiceConfig::default().slow,
        &["strict", "strict"],
    );
    let (mut fast, mut slow) = (subs.remove(0), subs.remove(0));
    signal(&slow, libc::SIGSTOP);
    let path = d.path(PathConfig::default()).unwrap();
    // Bytes one message holds of the path.
    let per_message = {
        let m = message(&path, 0, 3000, 1);
        let n = path.outstanding();
        drop(m);
        assert_eq!(path.outstanding(), 0);
        n
    };
    let info = |p: &Publisher, peer: &Peer| {
        p.subscribers()
            .into_iter()
            .find(|s| s.member.pid == peer.child.id())
            .unwrap()
    };
    for seed in 0..200 {
        // Never blocks: the call returns whether or not the stopped one has room.
        p.publish(&message(&path, seed, 3000, 1)).unwrap();
        // Keep pace with the running subscriber (the drop policy would drop for it
        // too if the publisher outran it).
        wait_until("the running subscriber", || {
            p.collect_releases();
            info(&p, &fast).in_flight == 0
        });
    }
    let slow_info = |p: &Publisher| info(p, &slow);
    assert_eq!(slow_info(&p).delivered, 200);
    assert_eq!(slow_info(&p).dropped, 192);
    assert_eq!(slow_info(&p).in_flight, 8);
    assert_eq!(p.stats().dropped, 192);
    // What the publisher's path still lends out is exactly the stopped one's queue:
    // every evicted message came back.
    assert_eq!(path.outstanding(), 8 * per_message);
    signal(&slow, libc::SIGCONT);
    wait_until("the stopped subscriber to drain", || {
        p.collect_releases();
        slow_info(&p).in_flight == 0
    });
    p.publish(&end_marker(&path)).unwrap();
    // The running subscriber has every message, in order; the stopped one the last
    // eight published (192..=199), in order (strict mode), each checksummed.
    assert_eq!(ok_line(&mut fast), (200, 0));
    assert_eq!(ok_line(&mut slow), (8, 192));
    assert_eq!(info(&p, &fast).dropped, 0);
    finish(vec![fast, slow]);
    wait_until("every fbuf back", || {
        p.collect_releases();
        path.outstanding() == 0
    });
    assert_eq!(p.subscriber_count(), 0);
}

/// A subscriber process that has no descriptor left to open gets the error that says
/// so (EMFILE) from `Subscriber::open`, not a timeout that would blame the publisher.
fn subscriber_out_of_descriptors_says_so() {
    let (_g, d, name) = join("nofds");
    let p = Publisher::offer(&d, "nofds", ServiceConfig::default()).unwrap();
    let mut sub = Peer::spawn("sub-no-fds", &name, "nofds");
    assert_eq!(sub.line(), "emfile");
    finish(vec![sub]);
    drop(p);
}

/// Block policy: a stopped subscriber holds the publisher back (it publishes no more
/// than the queue holds) and so the other subscriber; once it runs again, every
/// subscriber gets every message.
fn stopped_subscriber_block_policy() {
    let (_g, d, name) = join("stopblock");
    let (mut p, mut subs) = start(
        &d,
        &name,
        "stop/block",
        8,
        SlowSubscriber::Block,
        &["strict"; 2],
    );
    let (mut a, mut b) = (subs.remove(0), subs.remove(0));
    signal(&b, libc::SIGSTOP);
    let progress = Arc::new(AtomicU64::new(0));
    let prog = progress.clone();
    let path = d.path(PathConfig::default()).unwrap();
    let publishing = std::thread::spawn(move || {
        for seed in 0..100 {
            p.publish(&message(&path, seed, 2000, 1)).unwrap();
            prog.store(seed + 1, Ordering::Release);
        }
        p.publish(&end_marker(&path)).unwrap();
        (p, path)
    });
    // Whatever the machine's speed, the publisher cannot get past the stopped queue.
    std::thread::sleep(Duration::from_millis(300));
    assert!(progress.load(Ordering::Acquire) <= 9);
    signal(&b, libc::SIGCONT);
    let (mut p, path) = publishing.join().unwrap();
    assert_eq!(ok_line(&mut a), (100, 0));
    assert_eq!(ok_line(&mut b), (100, 0));
    assert_eq!(p.stats().dropped, 0);
    wait_until("every fbuf back", || {
        p.collect_releases();
        path.outstanding() == 0
    });
    finish(vec![a, b]);
}

/// A subscriber that joins while the publisher is busy gets every message from some
/// point on, none before it joined.
fn late_join() {
    let (_g, d, name) = join("late");
    let cfg = ServiceConfig {
        depth: 8,
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    let mut p = Publisher::offer(&d, "late", cfg).unwrap();
    let path = d.path(PathConfig::default()).unwrap();
    for seed in 0..50 {
        assert_eq!(p.publish(&message(&path, seed, 1000, 1)).unwrap(), 0);
    }
    let mut s = Peer::spawn("sub", &name, "late,strict");
    assert_eq!(s.line(), "joined");
    let mut seed = 50;
    while p.subscriber_count() == 0 {
        p.publish(&message(&path, seed, 1000, 1)).unwrap();
        seed += 1;
    }
    for _ in 0..100 {
        p.publish(&message(&path, seed, 1000, 1)).unwrap();
        seed += 1;
    }
    p.publish(&end_marker(&path)).unwrap();
    let (n, first) = ok_line(&mut s);
    assert!(first >= 50, "got a message published before it joined");
    assert_eq!(first + n, seed);
    finish(vec![s]);
}

/// Two subscriber domains in one process read the same publisher's messages.
fn two_subscriber_domains_in_one_process() {
    let (_g, d, name) = join("twosubs");
    let cfg = ServiceConfig {
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    let mut p = Publisher::offer(&d, "two", cfg).unwrap();
    let mut child = Peer::spawn("two-subs", &name, "two");
    assert_eq!(child.line(), "joined");
    p.wait_for_subscribers(2, T).unwrap();
    let path = d.path(PathConfig::default()).unwrap();
    for seed in 0..20 {
        assert_eq!(p.publish(&message(&path, seed, 9000, 2)).unwrap(), 2);
    }
    p.publish(&end_marker(&path)).unwrap();
    assert_eq!(ok_line(&mut child), (20, 20));
    finish(vec![child]);
}

/// Names across processes: a collision, an unknown name, the listing, and a dead
/// publisher's name reclaimed.
fn names_across_processes() {
    let (g, d, name) = join("names");
    let mut other = Peer::spawn("pub", &name, "shared/name");
    assert_eq!(other.line(), "offered");
    assert!(matches!(
        Publisher::offer(&d, "shared/name", ServiceConfig::default()),
        Err(Error::ServiceExists { .. })
    ));
    let d2 = g.join().unwrap();
    assert!(matches!(
        Subscriber::open(&d2, "shared/nothing", Duration::from_millis(100)),
        Err(Error::NoSuchService { .. })
    ));
    let l = g.services();
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].owner.pid, other.child.id());
    assert_eq!(l[0].kind, ServiceKind::PubSub);
    other.kill9();
    assert!(g.services().is_empty(), "a dead publisher is listed");
    let _p = Publisher::offer(&d, "shared/name", ServiceConfig::default()).unwrap();
    assert_eq!(g.services()[0].owner.pid, std::process::id());
}

/// A hostile process scribbles over the service table: everyone else gets errors or
/// valid answers, never a crash or a hang, and channels already open go on.
fn hostile_scribbler() {
    let (g, d, name) = join("hostile");
    let (mut p, mut subs) = start(&d, &name, "victim", 64, SlowSubscriber::Block, &["strict"]);
    let mut sub = subs.remove(0);
    let path = d.path(PathConfig::default()).unwrap();
    let mut seed = 0;
    let mut scribbler = Peer::spawn("scribbler", &name, "garbage,30");
    let other = g.join().unwrap();
    let mut outcomes = std::collections::BTreeMap::<String, u32>::new();
    let mut note = |r: Result<(), Error>| {
        let k = match r {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("{e:?}")
                .split([' ', '(', '{'])
                .next()
                .unwrap()
                .to_owned(),
        };
        *outcomes.entry(k).or_default() += 1;
    };
    let t0 = Instant::now();
    for i in 0..30 {
        let _ = g.services();
        let _ = g.service_table_damage();
        note(Subscriber::open(&other, "victim", Duration::from_millis(20)).map(|_| ()));
        note(Publisher::offer(&other, &format!("new/{i}"), ServiceConfig::default()).map(|_| ()));
        note(Client::open(&other, "victim", Duration::from_millis(20)).map(|_| ()));
        p.publish(&message(&path, seed, 500, 1)).unwrap();
        seed += 1;
    }
    assert_eq!(scribbler.line(), "done");
    eprintln!("    outcomes under scribbling: {outcomes:?}");
    // Bounded: every call above gave up by its own timeout (plus handshake patience).
    assert!(t0.elapsed() < Duration::from_secs(120));
    p.publish(&end_marker(&path)).unwrap();
    assert_eq!(ok_line(&mut sub), (seed, 0));

    // A live member holding the table lock: offers fail with a clear error, and go
    // through once it is gone.
    let mut holder = Peer::spawn("scribbler", &name, "lock,0");
    assert_eq!(holder.line(), "done");
    assert!(matches!(
        Publisher::offer(&other, "after/lock", ServiceConfig::default()),
        Err(Error::BadServiceTable(_))
    ));
    holder.kill9();
    Publisher::offer(&other, "after/lock", ServiceConfig::default()).unwrap();
    finish(vec![sub, scribbler]);
}

/// Three client processes call one server; one is killed at a random point. The
/// others finish with every answer right; the server drops the dead one and gets its
/// fbufs back. Then a server process is killed under a client: the client's call fails
/// with PeerGone.
fn request_response_with_killed_client_and_server() {
    let (_g, d, name) = join("rr");
    let server = Server::offer(&d, "rev", ServiceConfig::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let serving = std::thread::spawn(move || {
        let mut server = server;
        let mut h = Reverse { calls: 0 };
        while !st.load(Ordering::Relaxed) {
            match server.serve_one(&mut h, Duration::from_millis(20)) {
                Ok(()) | Err(Error::Timeout) => {}
                Err(e) => panic!("server: {e}"),
            }
        }
        server
    });
    let mut clients: Vec<Peer> = (0..3)
        .map(|_| Peer::spawn("client", &name, "rev,300"))
        .collect();
    for c in &mut clients {
        assert_eq!(c.line(), "joined");
    }
    let mut rng = seed_rng();
    let mut victim = clients.remove(rng.below(3) as usize);
    let kill_after = rng.below(250);
    while victim.line().parse::<u64>().is_ok_and(|n| n < kill_after) {}
    victim.kill9();
    for c in &mut clients {
        loop {
            let l = c.line();
            if l == "ok" {
                break;
            }
            l.parse::<u64>().expect("a call number");
        }
    }
    finish(clients);
    stop.store(true, Ordering::Relaxed);
    let mut server = serving.join().unwrap();
    wait_until("the server's fbufs back", || {
        let _ = server.try_recv();
        d.collect_releases();
        server.path().outstanding() == 0
    });
    assert!(server.stats().departed >= 1);
    assert!(server.clients().is_empty());
    drop(server);

    // A server process killed under a client.
    let mut srv = Peer::spawn("server", &name, "rev2");
    let c = d.clone();
    let mut client = Client::open(&c, "rev2", T).unwrap();
    let path = d.path(PathConfig::default()).unwrap();
    client.call(&fill(&path, 1, 100), T).unwrap();
    srv.kill9();
    assert!(matches!(
        client.call(&fill(&path, 2, 100), T),
        Err(Error::PeerGone { .. } | Error::Disconnected)
    ));
}

/// One handler, run in this process and in a server process, gives identical results.
fn handler_in_process_or_in_another_process() {
    let (_g, d, name) = join("place");
    let mut srv = Peer::spawn("server", &name, "place/rev");
    let path = d.path(PathConfig::default()).unwrap();
    let mut answers = Vec::new();
    for placement in [Placement::InProcess, Placement::Remote] {
        let mut caller =
            Caller::bind(&d, "place/rev", placement, || Reverse { calls: 0 }, T).unwrap();
        let mut out = Vec::new();
        for i in 0..50 {
            let req = message(&path, i + 1, 10 + i as usize * 300, 2);
            out.push(caller.call(&req, T).unwrap().to_vec());
        }
        assert!(matches!(
            caller.call(&IoData::new(), T),
            Err(Error::InvalidArgument(_) | Error::RequestFailed { .. })
        ));
        answers.push(out);
    }
    assert_eq!(answers[0], answers[1]);
    srv.tell("exit");
    srv.child.wait().unwrap();
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[
        ("many_subscribers_checksummed", many_subscribers_checksummed),
        ("fan_out_churn_checksummed", fan_out_churn_checksummed),
        (
            "subscriber_killed_at_random_points",
            subscriber_killed_at_random_points,
        ),
        (
            "stopped_subscriber_drop_policy",
            stopped_subscriber_drop_policy,
        ),
        (
            "stopped_subscriber_block_policy",
            stopped_subscriber_block_policy,
        ),
        (
            "subscriber_out_of_descriptors_says_so",
            subscriber_out_of_descriptors_says_so,
        ),
        ("late_join", late_join),
        (
            "two_subscriber_domains_in_one_process",
            two_subscriber_domains_in_one_process,
        ),
        ("names_across_processes", names_across_processes),
        ("hostile_scribbler", hostile_scribbler),
        (
            "request_response_with_killed_client_and_server",
            request_response_with_killed_client_and_server,
        ),
        (
            "handler_in_process_or_in_another_process",
            handler_in_process_or_in_another_process,
        ),
    ]);
}
