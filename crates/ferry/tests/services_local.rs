//! Named services between domains of one process (threads): naming errors, pub-sub and
//! req-resp semantics, and the zero-syscall steady state. The same guarantees across
//! real processes are in `services.rs`.

mod common;

use std::sync::Arc;

use common::Reverse;
use std::time::{Duration, Instant};

use ferry::{
    Caller, Client, Error, Group, IoData, PathAllocator, PathConfig, Placement, Publisher, Server,
    ServiceConfig, SlowSubscriber, Subscriber,
};
use ferry::{Request, ServiceKind};

use common::T;

fn group(tag: &str) -> Arc<Group> {
    Group::open(&format!("svc-{tag}-{}", std::process::id())).unwrap()
}

fn msg(path: &PathAllocator, seed: u64, len: usize) -> IoData {
    let mut m = path.alloc(len).unwrap();
    let bytes: Vec<u8> = (0..len)
        .map(|i| (seed as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect();
    m.write_at(0, &bytes);
    m.write_at(0, &seed.to_le_bytes());
    m.freeze()
}

fn seed_of(d: &IoData) -> u64 {
    let mut b = [0u8; 8];
    d.copy_range_to_slice(0..8, &mut b);
    let seed = u64::from_le_bytes(b);
    for (i, x) in d.iter_bytes().enumerate().skip(8) {
        assert_eq!(x, (seed as usize).wrapping_mul(31).wrapping_add(i) as u8);
    }
    seed
}

#[test]
fn names_collide_and_unknown_names_are_errors() {
    let g = group("names");
    let (a, b, c) = (g.join().unwrap(), g.join().unwrap(), g.join().unwrap());
    let p = Publisher::offer(&a, "camera/front", ServiceConfig::default()).unwrap();
    assert!(matches!(
        Publisher::offer(&b, "camera/front", ServiceConfig::default()),
        Err(Error::ServiceExists { name }) if name == "camera/front"
    ));
    assert!(matches!(
        Server::offer(&b, "camera/front", ServiceConfig::default()),
        Err(Error::ServiceExists { .. })
    ));
    assert!(matches!(
        Subscriber::open(&c, "camera/back", Duration::from_millis(50)),
        Err(Error::NoSuchService { name }) if name == "camera/back"
    ));
    // The wrong kind is no such service either.
    assert!(matches!(
        Client::open(&c, "camera/front", Duration::from_millis(50)),
        Err(Error::NoSuchService { .. })
    ));
    assert!(matches!(
        Publisher::offer(&b, "", ServiceConfig::default()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        Publisher::offer(&b, &"x".repeat(65), ServiceConfig::default()),
        Err(Error::InvalidArgument(_))
    ));
    let s = Subscriber::open(&c, "camera/front", T).unwrap();
    assert!(matches!(
        Subscriber::open(&c, "camera/front", T),
        Err(Error::AlreadyMember { .. })
    ));
    let list = g.services();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].name, "camera/front");
    assert_eq!(list[0].kind, ServiceKind::PubSub);
    assert_eq!(list[0].owner.id, a.id());
    assert_eq!(list[0].owner.pid, std::process::id());
    assert_eq!(
        list[0].subscribers.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![c.id()]
    );
    assert_eq!(g.service_table_damage(), 0);
    drop(s);
    assert!(g.services()[0].subscribers.is_empty());
    // Withdrawn on drop: the name is free again.
    drop(p);
    assert!(g.services().is_empty());
    let _p = Publisher::offer(&b, "camera/front", ServiceConfig::default()).unwrap();
    assert_eq!(g.services()[0].owner.id, b.id());
}

#[test]
fn one_publish_reaches_every_subscriber_without_copy() {
    let g = group("fanout");
    let pubd = g.join().unwrap();
    let mut p = Publisher::offer(&pubd, "fan", ServiceConfig::default()).unwrap();
    let doms: Vec<_> = (0..4).map(|_| g.join().unwrap()).collect();
    let mut subs: Vec<Subscriber> = doms
        .iter()
        .map(|d| Subscriber::open(d, "fan", T).unwrap())
        .collect();
    p.wait_for_subscribers(4, T).unwrap();
    let path = pubd.path(PathConfig::default()).unwrap();
    let data = msg(&path, 7, 3 * 4096 + 5);
    assert_eq!(p.publish(&data).unwrap(), 4);
    let got: Vec<IoData> = subs
        .iter_mut()
        .map(|s| s.recv_timeout(T).unwrap())
        .collect();
    for d in &got {
        assert_eq!(seed_of(d), 7);
        // The very pages of the publisher's fbuf.
        assert_eq!(
            d.fragments()[0].as_slice().as_ptr(),
            data.fragments()[0].as_slice().as_ptr()
        );
    }
    drop(data);
    // The fbuf comes back only when the last subscriber drops its copy.
    let mut got = got;
    while let Some(d) = got.pop() {
        drop(d);
        p.collect_releases();
        assert_eq!(path.outstanding() == 0, got.is_empty());
    }
    // A message outside any lot is copied once, not once per subscriber.
    p.publish(&IoData::from_vec(vec![5u8; 100])).unwrap();
    assert_eq!(p.stats().copied_bytes, 100);
    for s in &mut subs {
        assert_eq!(s.recv_timeout(T).unwrap().to_vec(), vec![5u8; 100]);
    }
    assert_eq!(p.stats().delivered, 8);
}

/// A publisher's loans take back what its subscribers released without waiting for a
/// sixteenth send or for the path to run short: each loan collects one subscriber's
/// releases, in turn, so with N subscribers a message's fbuf is back within N loans of
/// its last release.
#[test]
fn loans_take_releases_back_within_one_turn_of_the_subscribers() {
    let g = group("loan-turn");
    let pubd = g.join().unwrap();
    let mut p = Publisher::offer(&pubd, "turn", ServiceConfig::default()).unwrap();
    let doms: Vec<_> = (0..3).map(|_| g.join().unwrap()).collect();
    let mut subs: Vec<Subscriber> = doms
        .iter()
        .map(|d| Subscriber::open(d, "turn", T).unwrap())
        .collect();
    p.wait_for_subscribers(3, T).unwrap();
    // Spare fbufs on the path's free list, so that no allocation runs short (and
    // collects everything) on the way.
    let spare: Vec<_> = (0..64).map(|_| p.path().alloc(64).unwrap()).collect();
    drop(spare);
    for seq in 0..40u64 {
        let mut m = p.loan(64).unwrap();
        m.as_mut_slice()[..8].copy_from_slice(&seq.to_le_bytes());
        assert_eq!(m.send().unwrap(), 3);
        for s in &mut subs {
            let got = s.recv_timeout(T).unwrap();
            assert_eq!(got.slice(0..8).to_vec(), seq.to_le_bytes());
        }
    }
    // Every message was received and dropped: one turn brings every fbuf back, whatever
    // the count of sends since each sender last collected. With fewer than four
    // subscribers a loan collects every ceil(4 / n) loans, so a turn of three
    // subscribers is six loans.
    for _ in 0..6 {
        drop(p.loan(64).unwrap());
    }
    assert_eq!(p.path().stats().outstanding_fbufs, 0);
}

/// Loans to subscribers that leave and join between them: one that left gets nothing more,
/// and what it held comes back at the next collection (the publisher keeps no reference
/// to its channel); one that joins gets the loans after its join, in order; a loan
/// dropped unsent reaches no one.
#[test]
fn loans_follow_subscribers_that_leave_and_join() {
    let g = group("loan-churn");
    let pubd = g.join().unwrap();
    // Blocking: a loan claims its subscribers' ring places ahead.
    let config = ServiceConfig {
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    let mut p = Publisher::offer(&pubd, "churn", config).unwrap();
    let (da, db, dc) = (g.join().unwrap(), g.join().unwrap(), g.join().unwrap());
    let mut a = Subscriber::open(&da, "churn", T).unwrap();
    let mut b = Subscriber::open(&db, "churn", T).unwrap();
    p.wait_for_subscribers(2, T).unwrap();
    let send = |p: &mut Publisher, seq: u64| {
        let mut m = p.loan(64).unwrap();
        m.as_mut_slice()[..8].copy_from_slice(&seq.to_le_bytes());
        m.send().unwrap()
    };
    let next = |s: &mut Subscriber| {
        let got = s.recv_timeout(T).unwrap();
        u64::from_le_bytes(got.slice(0..8).to_vec().try_into().unwrap())
    };
    for seq in 0..10 {
        assert_eq!(send(&mut p, seq), 2);
        assert_eq!((next(&mut a), next(&mut b)), (seq, seq));
    }
    // Three more that `b` leaves queued, then it leaves.
    for seq in 10..13 {
        assert_eq!(send(&mut p, seq), 2);
        assert_eq!(next(&mut a), seq);
    }
    drop(b);
    assert_eq!(send(&mut p, 13), 1);
    assert_eq!(next(&mut a), 13);
    // Everything is released: what `b` left queued comes back too.
    p.collect_releases();
    assert_eq!(p.path().stats().outstanding_fbufs, 0);
    let mut c = Subscriber::open(&dc, "churn", T).unwrap();
    p.wait_for_subscribers(2, T).unwrap();
    for seq in 14..20 {
        assert_eq!(send(&mut p, seq), 2);
    }
    drop(p.loan(64).unwrap());
    assert_eq!(send(&mut p, 20), 2);
    for seq in (14..20).chain([20]) {
        assert_eq!((next(&mut a), next(&mut c)), (seq, seq));
    }
    assert!(a.try_recv().unwrap().is_none() && c.try_recv().unwrap().is_none());
    p.collect_releases();
    assert_eq!(p.path().stats().outstanding_fbufs, 0);
}

/// A large loan takes the fbuf its subscribers released last, though an older one waits
/// on the free list: it collects every subscriber's releases first (a collection in
/// turn would leave the last one held by a subscriber not collected yet), and the free
/// list hands back the most recently freed.
#[test]
fn a_large_loan_reuses_the_fbuf_released_last() {
    const BIG: usize = 1 << 20;
    let g = group("loan-lifo");
    let pubd = g.join().unwrap();
    let mut p = Publisher::offer(&pubd, "lifo", ServiceConfig::default()).unwrap();
    let doms: Vec<_> = (0..2).map(|_| g.join().unwrap()).collect();
    let mut subs: Vec<Subscriber> = doms
        .iter()
        .map(|d| Subscriber::open(d, "lifo", T).unwrap())
        .collect();
    p.wait_for_subscribers(2, T).unwrap();
    let take_all = |subs: &mut [Subscriber], n: usize| {
        for s in subs.iter_mut() {
            for _ in 0..n {
                drop(s.recv_timeout(T).unwrap());
            }
        }
    };
    // Two large fbufs sent, received, dropped and collected: both on the free list.
    for _ in 0..2 {
        let mut m = p.loan(BIG).unwrap();
        m.as_mut_slice()[0] = 1;
        assert_eq!(m.send().unwrap(), 2);
    }
    take_all(&mut subs, 2);
    p.collect_releases();
    // One of them goes out again and comes back uncollected; the other stays free.
    let mut m = p.loan(BIG).unwrap();
    let last = m.as_mut_slice().as_ptr();
    assert_eq!(m.send().unwrap(), 2);
    take_all(&mut subs, 1);
    let mut again = p.loan(BIG).unwrap();
    assert_eq!(
        again.as_mut_slice().as_ptr(),
        last,
        "the next large loan took an older fbuf, not the one released last"
    );
}

/// More subscribers than one fan-out pass serves (16), some with full queues under the
/// blocking policy: every subscriber gets every message once, in order, and every fbuf
/// comes back.
#[test]
fn a_wide_fan_out_with_full_queues_delivers_everything_in_order() {
    let g = group("wide");
    let pubd = g.join().unwrap();
    let config = ServiceConfig {
        depth: 4,
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    let mut p = Publisher::offer(&pubd, "wide", config).unwrap();
    const N: usize = 20;
    let doms: Vec<_> = (0..N).map(|_| g.join().unwrap()).collect();
    let subs: Vec<Subscriber> = doms
        .iter()
        .map(|d| Subscriber::open(d, "wide", T).unwrap())
        .collect();
    p.wait_for_subscribers(N, T).unwrap();
    const MSGS: u64 = 60;
    // Odd subscribers read slowly, so their queues are often full when a publish comes.
    let readers: Vec<_> = subs
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            std::thread::spawn(move || {
                for seq in 0..MSGS {
                    if i % 2 == 1 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    let got = s.recv_timeout(T).unwrap();
                    assert_eq!(seed_of(&got), seq, "subscriber {i}");
                }
                s
            })
        })
        .collect();
    let path = pubd.path(PathConfig::default()).unwrap();
    for seq in 0..MSGS {
        let data = msg(&path, seq, 100);
        assert_eq!(p.publish(&data).unwrap(), N);
    }
    let subs: Vec<Subscriber> = readers.into_iter().map(|t| t.join().unwrap()).collect();
    drop(subs);
    p.collect_releases();
    assert_eq!(path.outstanding(), 0);
    assert_eq!(p.stats().delivered, N as u64 * MSGS);
}

#[test]
fn drop_policy_evicts_the_oldest_for_a_full_subscriber_only() {
    let g = group("droppol");
    let (pd, fast_d, slow_d) = (g.join().unwrap(), g.join().unwrap(), g.join().unwrap());
    let cfg = ServiceConfig {
        depth: 4,
        slow: SlowSubscriber::Drop,
        ..ServiceConfig::default()
    };
    let mut p = Publisher::offer(&pd, "drop", cfg).unwrap();
    let mut fast = Subscriber::open(&fast_d, "drop", T).unwrap();
    let mut slow = Subscriber::open(&slow_d, "drop", T).unwrap();
    p.wait_for_subscribers(2, T).unwrap();
    let path = pd.path(PathConfig::default()).unwrap();
    for seed in 0..20 {
        assert!(p.publish(&msg(&path, seed, 100)).unwrap() >= 1);
        assert_eq!(seed_of(&fast.try_recv().unwrap().unwrap()), seed);
    }
    let slow_info = p
        .subscribers()
        .into_iter()
        .find(|s| s.member.id == slow_d.id())
        .unwrap();
    assert_eq!(slow_info.delivered, 20);
    assert_eq!(slow_info.dropped, 16);
    assert_eq!(slow_info.in_flight, 4);
    assert_eq!(p.stats().dropped, 16);
    assert_eq!(p.stats().delivered, 40);
    // The slow one has the last four: the oldest were dropped for it, and their fbufs
    // are back already (only the four queued ones are still out).
    let one = {
        let m = msg(&path, 99, 100);
        path.outstanding() - {
            drop(m);
            path.outstanding()
        }
    };
    assert_eq!(path.outstanding(), 4 * one);
    for seed in 16..20 {
        assert_eq!(seed_of(&slow.try_recv().unwrap().unwrap()), seed);
    }
    assert!(slow.try_recv().unwrap().is_none());
    // A receiver that resumes after a gap goes on with new messages.
    p.publish(&msg(&path, 20, 100)).unwrap();
    assert_eq!(seed_of(&fast.try_recv().unwrap().unwrap()), 20);
    assert_eq!(seed_of(&slow.try_recv().unwrap().unwrap()), 20);
    p.collect_releases();
    assert_eq!(path.outstanding(), 0);
}

#[test]
fn block_policy_times_out_and_then_delivers() {
    let g = group("blockpol");
    let (pd, sd) = (g.join().unwrap(), g.join().unwrap());
    let cfg = ServiceConfig {
        depth: 2,
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    let mut p = Publisher::offer(&pd, "block", cfg).unwrap();
    let mut s = Subscriber::open(&sd, "block", T).unwrap();
    p.wait_for_subscribers(1, T).unwrap();
    let path = pd.path(PathConfig::default()).unwrap();
    p.publish(&msg(&path, 0, 10)).unwrap();
    p.publish(&msg(&path, 1, 10)).unwrap();
    assert!(matches!(
        p.publish_timeout(&msg(&path, 2, 10), Duration::from_millis(20)),
        Err(Error::Timeout)
    ));
    assert_eq!(seed_of(&s.recv().unwrap()), 0);
    p.publish_timeout(&msg(&path, 3, 10), T).unwrap();
    // The queue is full again: a deadline already passed times out, as a timeout does.
    assert!(matches!(
        p.publish_until(&msg(&path, 4, 10), Some(Instant::now())),
        Err(Error::Timeout)
    ));
    assert_eq!(seed_of(&s.recv().unwrap()), 1);
    // Room for one: no deadline delivers it.
    assert_eq!(p.publish_until(&msg(&path, 5, 10), None).unwrap(), 1);
    assert_eq!(seed_of(&s.recv().unwrap()), 3);
    assert_eq!(seed_of(&s.recv().unwrap()), 5);
}

#[test]
fn publisher_gone_is_seen_by_subscribers() {
    let g = group("pubgone");
    let (pd, sd) = (g.join().unwrap(), g.join().unwrap());
    let mut p = Publisher::offer(&pd, "gone", ServiceConfig::default()).unwrap();
    let mut s = Subscriber::open(&sd, "gone", T).unwrap();
    p.wait_for_subscribers(1, T).unwrap();
    let path = pd.path(PathConfig::default()).unwrap();
    p.publish(&msg(&path, 9, 10)).unwrap();
    drop(p);
    assert_eq!(seed_of(&s.recv_timeout(T).unwrap()), 9);
    assert!(matches!(s.recv_timeout(T), Err(Error::Disconnected)));
}

/// Steady state, busy-polling: publish to two subscribers and take from both, and a
/// request-response round trip, make no system call at all.
#[test]
fn steady_state_services_make_no_system_calls() {
    let g = group("nosys");
    let pd = g.join().unwrap();
    let mut p = Publisher::offer(&pd, "nosys/pub", ServiceConfig::default()).unwrap();
    let sds: Vec<_> = (0..2).map(|_| g.join().unwrap()).collect();
    let mut subs: Vec<Subscriber> = sds
        .iter()
        .map(|d| Subscriber::open(d, "nosys/pub", T).unwrap())
        .collect();
    p.wait_for_subscribers(2, T).unwrap();
    let path = pd.path(PathConfig::default()).unwrap();
    let mut round = |seed: u64| {
        let mut m = path.alloc(4096).unwrap();
        m.write_at(0, &seed.to_le_bytes());
        assert_eq!(p.publish(&m.freeze()).unwrap(), 2);
        for s in &mut subs {
            let d = s.try_recv().unwrap().unwrap();
            assert!(d.slice(0..8).eq_bytes(&seed.to_le_bytes()));
        }
    };
    for i in 0..20 {
        round(i);
    }
    let before = ferry::stats::thread_syscall_count();
    for i in 0..5_000 {
        round(i);
    }
    assert_eq!(ferry::stats::thread_syscall_count() - before, 0);

    let sd = g.join().unwrap();
    let cd = g.join().unwrap();
    let mut server = Server::offer(&sd, "nosys/rr", ServiceConfig::default()).unwrap();
    let mut client = Client::open(&cd, "nosys/rr", T).unwrap();
    let cpath = cd.path(PathConfig::default()).unwrap();
    // Wait for the server's door to connect the client.
    let deadline = std::time::Instant::now() + T;
    while server.clients().is_empty() {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut rr = |seed: u64| {
        let mut m = cpath.alloc(4096).unwrap();
        m.write_at(0, &seed.to_le_bytes());
        let id = client.try_send_request(&m.freeze()).unwrap();
        let req = server.try_recv().unwrap().unwrap();
        assert_eq!(req.id, id);
        let resp = req.data.clone();
        server.reply(&req, &resp).unwrap();
        drop((req, resp));
        let r = client.try_response().unwrap().unwrap();
        assert_eq!(r.id, id);
        assert!(r.result.unwrap().slice(0..8).eq_bytes(&seed.to_le_bytes()));
    };
    for i in 0..20 {
        rr(i);
    }
    let before = ferry::stats::thread_syscall_count();
    for i in 0..5_000 {
        rr(i);
    }
    assert_eq!(ferry::stats::thread_syscall_count() - before, 0);
}

#[test]
fn request_response_with_several_clients_and_errors() {
    let g = group("rr");
    let sd = g.join().unwrap();
    let server = Server::offer(&sd, "rev", ServiceConfig::default()).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    let serving = std::thread::spawn(move || {
        let mut server = server;
        let mut h = Reverse { calls: 0 };
        while !st.load(std::sync::atomic::Ordering::Relaxed) {
            match server.serve_one(&mut h, Duration::from_millis(20)) {
                Ok(()) | Err(Error::Timeout) => {}
                Err(e) => panic!("{e}"),
            }
        }
        server.stats()
    });
    let clients: Vec<_> = (0..3)
        .map(|k| {
            let d = g.join().unwrap();
            std::thread::spawn(move || {
                let mut c = Client::open(&d, "rev", T).unwrap();
                let path = d.path(PathConfig::default()).unwrap();
                for i in 0..200u64 {
                    let req = msg(&path, k * 1000 + i, 50);
                    let got = c.call(&req, T).unwrap();
                    let mut want = req.to_vec();
                    want.reverse();
                    assert_eq!(got.slice(0..50).to_vec(), want);
                }
                assert!(matches!(
                    c.call(&IoData::new(), T),
                    Err(Error::RequestFailed { status: 1 })
                ));
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let stats = serving.join().unwrap();
    assert_eq!(stats.requests, 603);
    assert_eq!(stats.failed, 3);
    // A client whose server is gone gets a clear error.
    let cd = g.join().unwrap();
    assert!(matches!(
        Client::open(&cd, "rev", Duration::from_millis(50)),
        Err(Error::NoSuchService { .. })
    ));
}

#[test]
fn timed_out_requests_do_not_confuse_later_ones() {
    let g = group("rrtimeout");
    let (sd, cd) = (g.join().unwrap(), g.join().unwrap());
    let mut server = Server::offer(&sd, "slow", ServiceConfig::default()).unwrap();
    let mut client = Client::open(&cd, "slow", T).unwrap();
    let path = cd.path(PathConfig::default()).unwrap();
    assert!(matches!(
        client.call(&msg(&path, 1, 10), Duration::from_millis(30)),
        Err(Error::Timeout)
    ));
    // The server answers the first late, then the second.
    let t = std::thread::spawn(move || {
        let answer = |server: &mut Server, r: &Request| {
            let d = r.data.clone();
            server.reply(r, &d).unwrap();
        };
        let r1 = server.recv_timeout(T).unwrap();
        let r2 = server.recv_timeout(T).unwrap();
        answer(&mut server, &r1);
        answer(&mut server, &r2);
        server
    });
    let got = client.call(&msg(&path, 2, 10), T).unwrap();
    assert_eq!(seed_of(&got), 2);
    let server = t.join().unwrap();
    drop(server);
    assert!(matches!(
        client.call(&msg(&path, 3, 10), T),
        Err(Error::Disconnected | Error::PeerGone { .. })
    ));
}

/// The same handler, in process and behind a server (a thread here; a real process in
/// `services.rs`), gives the same answers.
#[test]
fn a_handler_runs_in_process_or_remotely_with_the_same_results() {
    let g = group("place");
    let sd = g.join().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    let serving = std::thread::spawn(move || {
        let mut h = Reverse { calls: 0 };
        ferry::run_server(&sd, "place", ServiceConfig::default(), &mut h, |_| {
            !st.load(std::sync::atomic::Ordering::Relaxed)
        })
        .unwrap();
    });
    let mut answers = Vec::new();
    for placement in ["in-process", "remote"] {
        let d = g.join().unwrap();
        let placement: Placement = placement.parse().unwrap();
        let mut caller = Caller::bind(&d, "place", placement, || Reverse { calls: 0 }, T).unwrap();
        assert_eq!(caller.is_local(), placement == Placement::InProcess);
        let path = d.path(PathConfig::default()).unwrap();
        let mut out = Vec::new();
        for i in 0..20 {
            out.push(
                caller
                    .call(&msg(&path, i, 10 + i as usize * 100), T)
                    .unwrap()
                    .to_vec(),
            );
        }
        answers.push(out);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    serving.join().unwrap();
    assert_eq!(answers[0], answers[1]);
}
