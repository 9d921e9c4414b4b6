//! The `tokio` feature across real processes: async subscribers, clients, servers and
//! senders; many tasks on one current-thread runtime; a peer killed while a task
//! awaits; cancelled receives that lose nothing; and the same descriptor in a plain
//! epoll loop.

mod common;

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use ferry::aio::{
    AsyncClient, AsyncPublisher, AsyncReceiver, AsyncSender, AsyncServer, AsyncSubscriber,
};
use ferry::Handler;
use ferry::{ChannelConfig, Domain, Error, Group, PathConfig, Sender};
use ferry::{Client, Publisher, Server, ServiceConfig, SlowSubscriber, Subscriber};
use rustix::event::epoll;

/// Seed that ends a stream.
const END: u64 = u64::MAX;

/// Far longer than anything here should take: a wait that reaches it is a hang.
const HANG: Duration = Duration::from_secs(60);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

// ---------------------------------------------------------------- child roles

fn child_main(role: &str) {
    let (_, _group, domain, arg, mut stdin) = child_start();
    match role {
        // ARG "service,count,block|drop": offer, wait for "go <subscribers>", publish
        // seeds 0..count and END, print "done", wait for stdin to close. A count of 0
        // publishes nothing, not even END (the parent kills us).
        "pub" => {
            let mut it = arg.split(',');
            let (name, count, policy) = (
                it.next().unwrap(),
                it.next().unwrap().parse::<u64>().unwrap(),
                it.next().unwrap(),
            );
            let config = ServiceConfig {
                depth: 8,
                slow: if policy == "block" {
                    SlowSubscriber::Block
                } else {
                    SlowSubscriber::Drop
                },
                ..ServiceConfig::default()
            };
            let mut p = Publisher::offer(&domain, name, config).unwrap();
            println!("offered");
            let go = read_line(&mut stdin);
            let n: usize = go.strip_prefix("go ").unwrap().parse().unwrap();
            p.wait_for_subscribers(n, T).unwrap();
            println!("ready");
            if count > 0 {
                let path = domain.path(PathConfig::default()).unwrap();
                let mut rng = Rng(count | 1);
                for seed in (0..count).chain([END]) {
                    let len = 8 + rng.below(3 * 4096) as usize;
                    let m = message(&path, seed, len, 1 + rng.below(3) as usize);
                    assert_eq!(p.publish_timeout(&m, HANG).unwrap(), n);
                    if rng.below(8) == 0 {
                        // Let the subscribers catch up and go to sleep now and then.
                        std::thread::sleep(Duration::from_micros(rng.below(2000)));
                    }
                }
                println!("done");
            }
            read_line(&mut stdin);
        }
        // Serve ARG with the Reverse handler until stdin closes.
        "server" => {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s = stop.clone();
            std::thread::spawn(move || {
                read_line(&mut stdin);
                s.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            let mut h = Reverse { calls: 0 };
            ferry::run_server(&domain, &arg, ServiceConfig::default(), &mut h, |_| {
                !stop.load(std::sync::atomic::Ordering::Relaxed)
            })
            .unwrap();
        }
        // Accept a channel; ARG "count": receive seeds 0..count slowly, checking each,
        // print "ok", wait for stdin to close. "0": accept and never read.
        "slow-rx" => {
            let mut rx = domain.accept(T).unwrap();
            println!("accepted");
            let count: u64 = arg.parse().unwrap();
            for want in 0..count {
                let d = rx.recv_timeout(HANG).unwrap();
                assert_eq!(verify(&d).unwrap(), want, "lost or reordered");
                if want % 16 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            println!("ok");
            read_line(&mut stdin);
        }
        // ARG "service,calls": call the Reverse service `calls` times (blocking), checking
        // each answer; print "calling" after the first, "ok" at the end, then wait.
        "client" => {
            let (name, calls) = arg.split_once(',').unwrap();
            let calls: u64 = calls.parse().unwrap();
            let mut c = Client::open(&domain, name, T).unwrap();
            let path = domain.path(PathConfig::default()).unwrap();
            for i in 0..calls {
                let body = format!("call {i} from {}", std::process::id());
                let mut m = path.alloc(body.len()).unwrap();
                m.write_at(0, body.as_bytes());
                let got = c.call(&m.freeze(), HANG).unwrap();
                let mut want = body.into_bytes();
                want.reverse();
                assert_eq!(got.slice(0..want.len()).to_vec(), want);
                if i == 0 {
                    println!("calling");
                }
            }
            println!("ok");
            read_line(&mut stdin);
        }
        // ARG "service": subscribe, print "subscribed", read nothing until told "go"; then
        // receive until END, checking every byte and that seeds run on by one from the
        // first, print "ok <first> <count>" and wait for stdin to close.
        "gated-sub" => {
            let mut sub = Subscriber::open(&domain, &arg, T).unwrap();
            println!("subscribed");
            assert_eq!(read_line(&mut stdin), "go");
            let (mut first, mut count) = (None, 0u64);
            loop {
                let seed = verify(&sub.recv_timeout(HANG).unwrap()).unwrap();
                if seed == END {
                    break;
                }
                let first = *first.get_or_insert(seed);
                assert_eq!(seed, first + count, "lost or reordered");
                count += 1;
            }
            println!("ok {} {count}", first.unwrap_or(END));
            read_line(&mut stdin);
        }
        _ => panic!("unknown role {role}"),
    }
}

/// Starts a publisher child for `svc` and opens `subs` subscribers to it from fresh
/// domains of this process; then tells it to go.
fn publisher_and_subscribers(
    tag: &str,
    svc: &str,
    count: u64,
    policy: &str,
    subs: usize,
) -> (Arc<Group>, Peer, Vec<Subscriber>, String) {
    let name = group_name(tag);
    let g = Group::open(&name).unwrap();
    let mut p = Peer::spawn("pub", &name, &format!("{svc},{count},{policy}"));
    assert_eq!(p.line(), "offered");
    let subs: Vec<Subscriber> = (0..subs)
        .map(|_| Subscriber::open(&g.join().unwrap(), svc, T).unwrap())
        .collect();
    p.tell(&format!("go {}", subs.len()));
    assert_eq!(p.line(), "ready");
    (g, p, subs, name)
}

/// Receives seeds 0..count then END, in order, checking every byte.
async fn consume(sub: &mut AsyncSubscriber, count: u64) -> Result<u64, String> {
    for want in 0..count {
        let d = sub.recv().await.map_err(|e| format!("recv: {e}"))?;
        let seed = verify(&d)?;
        if seed != want {
            return Err(format!("got seed {seed}, want {want}"));
        }
    }
    let d = sub.recv().await.map_err(|e| format!("recv: {e}"))?;
    if verify(&d)? != END {
        return Err("no END".into());
    }
    Ok(count)
}

/// Starts a "slow-rx" child that reads `count` messages, and connects to it from `d`
/// with a ring of 4.
fn slow_receiver(d: &Domain, group: &str, count: u64) -> (Peer, Sender) {
    let mut rxp = Peer::spawn("slow-rx", group, &count.to_string());
    let config = ChannelConfig {
        capacity: 4,
        release_capacity: 16,
        ..ChannelConfig::default()
    };
    let tx = d.connect_with(rxp.id, config, T).unwrap();
    assert_eq!(rxp.line(), "accepted");
    (rxp, tx)
}

fn finish(mut p: Peer) {
    p.tell("exit");
    assert!(p.child.wait().unwrap().success());
}

// ---------------------------------------------------------------- tests

/// An async subscriber gets every message of a publisher in another process, in order
/// and intact, and is told Disconnected when the publisher withdraws.
fn async_subscriber_across_processes() {
    let (g, mut p, mut subs, _) = publisher_and_subscribers("one", "one/svc", 2000, "block", 1);
    let rt = runtime();
    rt.block_on(async {
        let mut sub = AsyncSubscriber::new(subs.pop().unwrap()).unwrap();
        let n = tokio::time::timeout(HANG, consume(&mut sub, 2000))
            .await
            .expect("hang")
            .unwrap();
        assert_eq!(n, 2000);
        assert_eq!(p.line(), "done");
        p.tell("exit");
        let end = tokio::time::timeout(HANG, sub.recv()).await.expect("hang");
        assert!(
            matches!(end, Err(Error::Disconnected | Error::PeerGone { .. })),
            "{end:?}"
        );
    });
    assert!(p.child.wait().unwrap().success());
    drop(g);
}

/// Eight subscriber tasks (eight domains of this process) on one current-thread
/// runtime, plus three client tasks calling a server process: every task gets all of
/// its messages, so no task's wait starves another's.
fn many_tasks_on_current_thread() {
    const SUBS: usize = 8;
    const N: u64 = 500;
    let (g, p, subs, name) = publisher_and_subscribers("many", "many/svc", N, "block", SUBS);
    let srv = Peer::spawn("server", &name, "many/rev");
    let clients: Vec<(Client, ferry::PathAllocator)> = (0..3)
        .map(|_| {
            let d = g.join().unwrap();
            let c = Client::open(&d, "many/rev", T).unwrap();
            (c, d.path(PathConfig::default()).unwrap())
        })
        .collect();
    let rt = runtime();
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        let local = tokio::task::LocalSet::new();
        for s in subs {
            let mut s = AsyncSubscriber::new(s).unwrap();
            tasks.spawn_local_on(async move { consume(&mut s, N).await.map(|_| ()) }, &local);
        }
        for (k, (c, path)) in clients.into_iter().enumerate() {
            let mut c = AsyncClient::new(c).unwrap();
            tasks.spawn_local_on(
                async move {
                    for i in 0..100u64 {
                        let body = format!("task {k} call {i}");
                        let mut m = path.alloc(body.len()).unwrap();
                        m.write_at(0, body.as_bytes());
                        let got = c.call(&m.freeze()).await.map_err(|e| e.to_string())?;
                        let mut want = body.into_bytes();
                        want.reverse();
                        if got.slice(0..want.len()).to_vec() != want {
                            return Err(format!("wrong answer to call {i}"));
                        }
                    }
                    Ok(())
                },
                &local,
            );
        }
        local
            .run_until(async {
                while let Some(r) = tokio::time::timeout(HANG, tasks.join_next())
                    .await
                    .expect("hang")
                {
                    r.unwrap().unwrap();
                }
            })
            .await;
    });
    finish(p);
    finish(srv);
    drop(g);
}

/// A publisher, a server and a receiver of a sender channel killed while a task awaits
/// them: each task gets PeerGone, none hangs.
fn peer_killed_while_awaiting() {
    // Subscriber.
    let (g, mut p, mut subs, name) = publisher_and_subscribers("kill", "kill/svc", 0, "drop", 1);
    let rt = runtime();
    rt.block_on(async {
        let mut sub = AsyncSubscriber::new(subs.pop().unwrap()).unwrap();
        let waiting = tokio::time::timeout(HANG, sub.recv());
        let killer = tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(100));
            p.kill9();
        });
        let r = waiting
            .await
            .expect("a dead publisher left the task hanging");
        assert!(matches!(r, Err(Error::PeerGone { .. })), "{r:?}");
        killer.await.unwrap();
    });

    // Client.
    let mut srv = Peer::spawn("server", &name, "kill/rev");
    let cd = g.join().unwrap();
    let client = Client::open(&cd, "kill/rev", T).unwrap();
    let path = cd.path(PathConfig::default()).unwrap();
    rt.block_on(async {
        let mut c = AsyncClient::new(client).unwrap();
        let mut m = path.alloc(5).unwrap();
        m.write_at(0, b"hello");
        let hello = m.freeze();
        let got = c.call(&hello).await.unwrap();
        assert!(got.slice(0..5).eq_bytes(b"olleh"));
        srv.kill9();
        let r = tokio::time::timeout(HANG, c.call(&hello))
            .await
            .expect("a dead server left the task hanging");
        assert!(
            matches!(r, Err(Error::PeerGone { .. } | Error::Disconnected)),
            "{r:?}"
        );
    });

    // Sender waiting for room.
    let d = g.join().unwrap();
    let (mut rxp, tx) = slow_receiver(&d, &name, 0);
    let path = d.path(PathConfig::default()).unwrap();
    rt.block_on(async {
        let tx = AsyncSender::new(tx).unwrap();
        for seed in 0..4 {
            tx.send(&fill(&path, seed, 64)).await.unwrap();
        }
        let m = fill(&path, 4, 64);
        let waiting = tokio::time::timeout(HANG, tx.send(&m));
        let killer = tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(100));
            rxp.kill9();
        });
        let r = waiting
            .await
            .expect("a dead receiver left the sender hanging");
        assert!(matches!(r, Err(Error::PeerGone { .. })), "{r:?}");
        killer.await.unwrap();
        assert_eq!(
            tx.get_ref().in_flight(),
            0,
            "the dead receiver's holds came back"
        );
    });
    drop(g);
}

/// Receives cancelled at random points (timeouts of 0 to 300 µs, many expiring while
/// the task waits) lose no message: the stream arrives whole and in order.
fn cancelled_recv_loses_nothing() {
    const N: u64 = 3000;
    let (g, p, mut subs, _) = publisher_and_subscribers("cancel", "cancel/svc", N, "block", 1);
    let mut rng = seed_rng();
    let rt = runtime();
    let cancelled = rt.block_on(async {
        let mut sub = AsyncSubscriber::new(subs.pop().unwrap()).unwrap();
        let (mut want, mut cancelled) = (0u64, 0u64);
        let give_up = tokio::time::Instant::now() + HANG;
        loop {
            assert!(tokio::time::Instant::now() < give_up, "hang");
            let t = Duration::from_micros(rng.below(300));
            match tokio::time::timeout(t, sub.recv()).await {
                Err(_) => cancelled += 1,
                Ok(d) => {
                    let seed = verify(&d.unwrap()).unwrap();
                    if seed == END {
                        break;
                    }
                    assert_eq!(seed, want, "a cancelled receive lost a message");
                    want += 1;
                }
            }
        }
        assert_eq!(want, N);
        cancelled
    });
    eprintln!("    ({cancelled} receives cancelled)");
    assert!(
        cancelled > 0,
        "no receive was cancelled: the test proved nothing"
    );
    finish(p);
    drop(g);
}

/// The subscriber's descriptor in a plain epoll loop (no tokio): messages wake it, and
/// the publisher's death wakes it too and surfaces as PeerGone.
fn raw_epoll_on_subscriber_fd() {
    const N: u64 = 1000;
    let (g, p, mut subs, _) = publisher_and_subscribers("epoll", "epoll/svc", N, "block", 1);
    let mut p = Some(p);
    let mut killer = None;
    let mut sub = subs.pop().unwrap();
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
    epoll::add(
        &ep,
        sub.as_fd(),
        epoll::EventData::new_u64(7),
        epoll::EventFlags::IN | epoll::EventFlags::ET,
    )
    .unwrap();
    let (mut want, mut waits) = (0u64, 0u64);
    let mut killed = false;
    let end = loop {
        match sub.try_recv() {
            Ok(Some(d)) => {
                let seed = verify(&d).unwrap();
                if seed == END {
                    assert_eq!(want, N);
                    let mut p = p.take().unwrap();
                    assert_eq!(p.line(), "done");
                    // Now the publisher dies while we wait in epoll.
                    killer = Some(std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(100));
                        p.kill9();
                    }));
                    killed = true;
                    continue;
                }
                assert_eq!(seed, want);
                want += 1;
                continue;
            }
            Ok(None) => {}
            Err(e) => break e,
        }
        if !sub.arm().unwrap() {
            continue;
        }
        waits += 1;
        let t = rustix::event::Timespec {
            tv_sec: HANG.as_secs() as i64,
            tv_nsec: 0,
        };
        let mut events = Vec::with_capacity(4);
        epoll::wait(&ep, rustix::buffer::spare_capacity(&mut events), Some(&t)).unwrap();
        assert!(!events.is_empty(), "epoll wait hung (killed: {killed})");
        assert_eq!(events[0].data.u64(), 7);
    };
    assert!(killed);
    killer.unwrap().join().unwrap();
    assert!(matches!(end, Error::PeerGone { .. }), "{end:?}");
    assert!(waits > 0, "never waited: the test proved nothing");
    drop(g);
}

/// An async server in this process serves three client processes to the end while a
/// fourth is killed mid-stream; the dead and departed clients are dropped while the
/// server's task awaits.
fn async_server_serves_client_processes() {
    let (g, d, name) = join("srv");
    let server = Server::offer(&d, "srv/rev", ServiceConfig::default()).unwrap();
    let rt = runtime();
    rt.block_on(async {
        let mut srv = AsyncServer::new(server).unwrap();
        let clients: Vec<Peer> = (0..3)
            .map(|_| Peer::spawn("client", &name, "srv/rev,200"))
            .collect();
        let mut victim = Peer::spawn("client", &name, "srv/rev,1000000000");
        let waiting = tokio::task::spawn_blocking(move || {
            assert_eq!(victim.line(), "calling");
            victim.kill9();
            for mut c in clients {
                assert_eq!(c.line(), "calling");
                assert_eq!(c.line(), "ok");
                c.tell("exit");
                assert!(c.child.wait().unwrap().success());
            }
        });
        tokio::pin!(waiting);
        let mut handler = Reverse { calls: 0 };
        loop {
            tokio::select! {
                done = &mut waiting => {
                    done.unwrap();
                    break;
                }
                req = tokio::time::timeout(HANG, srv.recv()) => {
                    let req = req.expect("hang").unwrap();
                    let resp = handler.handle(&req.data, srv.get_ref().path()).unwrap();
                    match srv.reply(&req, &resp) {
                        Ok(()) | Err(Error::PeerGone { .. } | Error::Disconnected) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }
        assert!(handler.calls >= 600);
        // Every client is gone now: each departure is noticed while the task awaits.
        let give_up = tokio::time::Instant::now() + HANG;
        while srv.get_ref().stats().departed < 4 {
            assert!(
                tokio::time::Instant::now() < give_up,
                "departures not noticed"
            );
            if let Ok(r) = tokio::time::timeout(Duration::from_millis(20), srv.recv()).await {
                panic!("a request from nowhere: {r:?}");
            }
        }
        assert!(srv.get_ref().clients().is_empty());
    });
    drop(g);
}

/// `arm()` never lets a caller sleep on a dead publisher: it returns false, and the next
/// `try_recv` reports PeerGone at once (not after the periodic liveness check).
fn arm_reports_dead_publisher() {
    let (g, mut p, mut subs, _) = publisher_and_subscribers("arm", "arm/svc", 0, "drop", 1);
    let mut sub = subs.pop().unwrap();
    assert!(sub.try_recv().unwrap().is_none());
    assert!(sub.arm().unwrap(), "nothing queued: arm should let us wait");
    p.kill9();
    assert!(!sub.arm().unwrap(), "arm let us sleep on a dead publisher");
    let r = sub.try_recv();
    assert!(matches!(r, Err(Error::PeerGone { .. })), "{r:?}");
    drop(g);
}

/// An async sender to a slow receiver in another process waits for room (capacity 4)
/// and gets everything across in order; an async receiver in this process receives
/// from a sender here (the channel-level wrappers).
fn async_sender_and_receiver() {
    const N: u64 = 300;
    let (g, d, name) = join("send");
    let (mut rxp, tx) = slow_receiver(&d, &name, N);
    let path = d.path(PathConfig::default()).unwrap();
    let rt = runtime();
    let sleeps = rt.block_on(async {
        let tx = AsyncSender::new(tx).unwrap();
        for seed in 0..N {
            tokio::time::timeout(HANG, tx.send(&fill(&path, seed, 100)))
                .await
                .expect("hang")
                .unwrap();
        }
        tx.get_ref().stats().sleeps
    });
    assert_eq!(rxp.line(), "ok");
    assert!(
        sleeps > 0,
        "the sender never waited for room: the test proved nothing"
    );
    finish(rxp);

    // In-process pair, async on the receiving side.
    let other = g.join().unwrap();
    let to = other.id();
    let dd = d.clone();
    let connecting = std::thread::spawn(move || dd.connect(to, T).unwrap());
    let rx = other.accept(T).unwrap();
    let tx = connecting.join().unwrap();
    rt.block_on(async {
        let mut rx = AsyncReceiver::new(rx).unwrap();
        let t = tokio::task::spawn_blocking(move || {
            for seed in 0..50 {
                std::thread::sleep(Duration::from_micros(200));
                tx.send(&fill(&path, seed, 64)).unwrap();
            }
        });
        for seed in 0..50u64 {
            let got = rx.recv().await.unwrap();
            let mut b = [0u8; 8];
            got.copy_range_to_slice(0..8, &mut b);
            assert_eq!(u64::from_le_bytes(b), seed);
        }
        t.await.unwrap();
        let r = tokio::time::timeout(HANG, rx.recv()).await.expect("hang");
        assert!(matches!(r, Err(Error::Disconnected)), "{r:?}");
    });
    drop(g);
}

/// A publisher (depth 8, hold-back policy) of service `svc` in `d`.
fn blocking_publisher(d: &Domain, svc: &str) -> Publisher {
    let config = ServiceConfig {
        depth: 8,
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    Publisher::offer(d, svc, config).unwrap()
}

/// Starts a "gated-sub" child of `svc`.
fn gated_subscriber(group: &str, svc: &str) -> Peer {
    let mut s = Peer::spawn("gated-sub", group, svc);
    assert_eq!(s.line(), "subscribed");
    s
}

/// An async publish waits for room in a full queue (hold-back policy, a subscriber
/// process that reads nothing until told) without holding the runtime's only thread:
/// another task runs meanwhile and is the one that lets the subscriber read. Every
/// message then arrives, intact and in order.
fn async_publish_awaits_room_and_the_runtime_runs_on() {
    const N: u64 = 300;
    let (g, d, name) = join("apub");
    let mut publisher = AsyncPublisher::new(blocking_publisher(&d, "apub/svc"));
    let mut sub = gated_subscriber(&name, "apub/svc");
    publisher.get_ref().wait_for_subscribers(1, T).unwrap();
    let path = d.path(PathConfig::default()).unwrap();
    let published = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let rt = runtime();
    let local = tokio::task::LocalSet::new();
    let (sub, at_go) = local.block_on(&rt, async {
        let counter = published.clone();
        let publishing = tokio::task::spawn_local(async move {
            for seed in (0..N).chain([END]) {
                let m = message(&path, seed, 100 + (seed % 5000) as usize, 2);
                assert_eq!(publisher.publish(&m).await.unwrap(), 1);
                counter.set(counter.get() + 1);
            }
            publisher
        });
        // Runs only if the waiting publish yields the thread.
        let gate = tokio::task::spawn_local(async move {
            let mut seen = 0;
            let mut ticks = 0u32;
            // Until the count stops moving for 200 turns: the 9th publish is waiting.
            while ticks < 200 {
                tokio::task::yield_now().await;
                let now = published.get();
                ticks = if now == seen { ticks + 1 } else { 0 };
                seen = now;
            }
            sub.tell("go");
            (sub, seen)
        });
        let publisher = tokio::time::timeout(HANG, publishing)
            .await
            .expect("hang")
            .unwrap();
        assert_eq!(publisher.get_ref().stats().published, N + 1);
        gate.await.unwrap()
    });
    assert_eq!(
        at_go, 8,
        "the publish that found the queue full did not wait"
    );
    let mut sub = sub;
    assert_eq!(sub.line(), format!("ok 0 {N}"));
    finish(sub);
    drop(g);
}

/// A subscriber killed while an async publish waits for room in its queue: the publish
/// goes on without it (the dead one is dropped, not counted) and the live subscriber
/// gets everything.
fn async_publish_survives_a_subscriber_killed_while_it_waits() {
    const N: u64 = 100;
    let (g, d, name) = join("apubkill");
    let mut publisher = AsyncPublisher::new(blocking_publisher(&d, "apubkill/svc"));
    let mut live = gated_subscriber(&name, "apubkill/svc");
    let mut stuck = gated_subscriber(&name, "apubkill/svc");
    publisher.get_ref().wait_for_subscribers(2, T).unwrap();
    live.tell("go");
    let path = d.path(PathConfig::default()).unwrap();
    let rt = runtime();
    let handed = rt.block_on(async {
        let killer = tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(200));
            stuck.kill9();
        });
        let mut handed = Vec::new();
        for seed in (0..N).chain([END]) {
            let m = fill(&path, seed, 4096 + 64);
            let r = tokio::time::timeout(HANG, publisher.publish(&m))
                .await
                .expect("a dead subscriber left the publish hanging");
            handed.push(r.unwrap());
        }
        killer.await.unwrap();
        assert_eq!(publisher.get_ref().subscriber_count(), 1);
        assert_eq!(publisher.get_ref().stats().departed, 1);
        handed
    });
    // Both got the first 8 (the stuck queue's depth); the waiting 9th reached only
    // the live one once the stuck one died, and so did the rest.
    assert!(handed[..8].iter().all(|&n| n == 2), "{handed:?}");
    assert!(handed[8..].iter().all(|&n| n == 1), "{handed:?}");
    assert_eq!(live.line(), format!("ok 0 {N}"));
    finish(live);
    drop(g);
}

/// A publish blocked on a full queue (plain, blocking call) does not hold back a
/// subscriber that joins meanwhile: it joins in bounded time, and gets the messages
/// published after it joined, from the next one on.
fn a_blocked_publish_lets_subscribers_join() {
    let (g, d, name) = join("joinblk");
    let mut publisher = blocking_publisher(&d, "joinblk/svc");
    let mut stuck = gated_subscriber(&name, "joinblk/svc");
    publisher.wait_for_subscribers(1, T).unwrap();
    let path = d.path(PathConfig::default()).unwrap();
    let (tx, started) = std::sync::mpsc::channel();
    let publishing = std::thread::spawn(move || {
        for seed in 0..9 {
            if seed == 8 {
                tx.send(()).unwrap();
            }
            // The 9th (seed 8) waits: the queue holds 8.
            assert_eq!(
                publisher
                    .publish_timeout(&fill(&path, seed, 64), HANG)
                    .unwrap(),
                1
            );
        }
        publisher
    });
    started.recv().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // Joins while the publish above waits (before the fix the publisher's door waited
    // for the list the publish held, and this timed out).
    let late_domain = g.join().unwrap();
    let mut late = Subscriber::open(&late_domain, "joinblk/svc", T)
        .expect("a blocked publish held back a joining subscriber");
    assert!(!publishing.is_finished(), "the 9th publish did not wait");
    stuck.tell("go");
    let mut publisher = publishing.join().unwrap();
    let path = d.path(PathConfig::default()).unwrap();
    // Seven more and END: the late queue (read below) holds all eight.
    for seed in (9..16).chain([END]) {
        assert_eq!(
            publisher
                .publish_timeout(&fill(&path, seed, 64), HANG)
                .unwrap(),
            2
        );
    }
    for want in (9..16).chain([END]) {
        assert_eq!(verify(&late.recv_timeout(HANG).unwrap()).unwrap(), want);
    }
    assert_eq!(stuck.line(), "ok 0 16");
    finish(stuck);
    drop(publisher);
    drop(g);
}

/// The wrappers and their futures can move to another thread (tokio::spawn on a
/// multi-thread runtime); checked at compile time.
#[allow(dead_code)]
fn wrappers_are_send(
    mut s: AsyncSubscriber,
    mut r: AsyncReceiver,
    mut c: AsyncClient,
    mut v: AsyncServer,
    t: AsyncSender,
    mut p: AsyncPublisher,
    d: ferry::IoData,
) {
    fn send<T: Send>(_: T) {}
    send(async move {
        let _ = s.recv().await;
        let _ = r.recv().await;
        let _ = c.call(&d).await;
        let _ = v.recv().await;
        let _ = t.send(&d).await;
        let _ = p.publish(&d).await;
    });
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[
        (
            "async_subscriber_across_processes",
            async_subscriber_across_processes,
        ),
        ("many_tasks_on_current_thread", many_tasks_on_current_thread),
        ("peer_killed_while_awaiting", peer_killed_while_awaiting),
        ("cancelled_recv_loses_nothing", cancelled_recv_loses_nothing),
        ("raw_epoll_on_subscriber_fd", raw_epoll_on_subscriber_fd),
        ("arm_reports_dead_publisher", arm_reports_dead_publisher),
        (
            "async_server_serves_client_processes",
            async_server_serves_client_processes,
        ),
        ("async_sender_and_receiver", async_sender_and_receiver),
        (
            "async_publish_awaits_room_and_the_runtime_runs_on",
            async_publish_awaits_room_and_the_runtime_runs_on,
        ),
        (
            "async_publish_survives_a_subscriber_killed_while_it_waits",
            async_publish_survives_a_subscriber_killed_while_it_waits,
        ),
        (
            "a_blocked_publish_lets_subscribers_join",
            a_blocked_publish_lets_subscribers_join,
        ),
    ]);
}
