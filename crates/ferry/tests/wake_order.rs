//! The order in which a publisher wakes its sleeping subscribers, between real
//! processes: a subscriber that asked to be woken last (`Subscriber::set_wake_last`, as
//! `ferry-bridge` asks for the services it carries to other hosts) is woken after the
//! others, even when it subscribed first. Each child is this test binary re-executed in
//! a role (`harness = false`).
//!
//! The order of the wake-ups is made observable without timing: the publisher's thread
//! and both subscriber processes share one CPU, and the subscribers run under
//! `SCHED_FIFO`, so each wake-up preempts the publisher at once and the woken subscriber
//! records its arrival before the publisher wakes the next one. Where `SCHED_FIFO` or
//! the pinning is not allowed, the test says SKIP and passes.

mod common;

use std::io::Write;
use std::time::Duration;

use common::*;
use ferry::{PathConfig, Publisher, ServiceConfig, SlowSubscriber, Subscriber};

const SERVICE: &str = "wake/order";
/// The seed of the last message.
const END: u64 = u64::MAX;
const MESSAGES: u64 = 20;

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes within it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t and `cpu` is below CPU_SETSIZE (checked by the
    // caller, which takes it from the allowed set).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid, initialised cpu_set_t of the size passed.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The first CPU this thread may run on.
fn first_cpu() -> usize {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    assert_eq!(r, 0, "sched_getaffinity");
    // SAFETY: `set` was filled above; CPU_ISSET reads within it.
    (0..libc::CPU_SETSIZE as usize)
        .find(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .expect("some CPU is allowed")
}

/// Puts the calling thread under `SCHED_FIFO` (priority 1), or back under
/// `SCHED_OTHER`.
fn fifo(on: bool) -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: on as i32,
    };
    let policy = if on {
        libc::SCHED_FIFO
    } else {
        libc::SCHED_OTHER
    };
    // SAFETY: `param` is a valid sched_param for the policy.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn child_main(role: &str) {
    let (_gname, _group, domain, arg, _stdin) = child_start();
    if role == "echo-sub" {
        // ARG "last|first": print "got <seed>" for each message until END.
        let mut sub = Subscriber::open(&domain, SERVICE, T).unwrap();
        sub.set_wake_last(arg == "last");
        println!("joined");
        loop {
            let d = sub.recv_timeout(Duration::from_secs(60)).unwrap();
            let seed = verify(&d).unwrap();
            if seed == END {
                break;
            }
            println!("got {seed}");
        }
        println!("done");
        return;
    }
    assert_eq!(role, "order-sub");
    // ARG "tag,last|first,cpu,file": subscribe (asking to be woken last or not), then
    // append "<tag> <seed>" to the file for each message until END.
    let parts: Vec<&str> = arg.split(',').collect();
    let (tag, last, cpu, file) = (parts[0], parts[1] == "last", parts[2], parts[3]);
    pin(cpu.parse().unwrap()).unwrap();
    fifo(true).unwrap();
    let mut sub = Subscriber::open(&domain, SERVICE, T).unwrap();
    sub.set_wake_last(last);
    let mut out = std::fs::OpenOptions::new().append(true).open(file).unwrap();
    println!("joined");
    loop {
        let d = sub.recv_timeout(Duration::from_secs(30)).unwrap();
        let seed = verify(&d).unwrap();
        if seed == END {
            break;
        }
        out.write_all(format!("{tag} {seed}\n").as_bytes()).unwrap();
    }
    println!("done");
}

/// A subscriber that asked to be woken last and joined first is woken after one that
/// joined later: for every message, the plain subscriber records it first.
fn relay_subscriber_is_woken_last() {
    let cpu = first_cpu();
    // Whether this machine lets us run under SCHED_FIFO at all (a probe thread).
    if let Err(e) = std::thread::spawn(|| fifo(true)).join().unwrap() {
        println!("SKIP relay_subscriber_is_woken_last: SCHED_FIFO not allowed ({e})");
        return;
    }
    let (_g, d, name) = join("wakeorder");
    let file = std::env::temp_dir().join(format!("ferry-wake-order-{}", std::process::id()));
    std::fs::write(&file, b"").unwrap();
    let f = file.to_str().unwrap().to_owned();
    let config = ServiceConfig {
        depth: 8,
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    let mut p = Publisher::offer(&d, SERVICE, config).unwrap();
    // The relay first, so that without the order it would be woken first.
    let mut relay = Peer::spawn("order-sub", &name, &format!("relay,last,{cpu},{f}"));
    assert_eq!(relay.line(), "joined");
    p.wait_for_subscribers(1, T).unwrap();
    let mut local = Peer::spawn("order-sub", &name, &format!("local,first,{cpu},{f}"));
    assert_eq!(local.line(), "joined");
    p.wait_for_subscribers(2, T).unwrap();
    let path = d.path(PathConfig::default()).unwrap();
    // The publishing thread on the subscribers' CPU.
    std::thread::spawn(move || {
        pin(cpu).unwrap();
        for seed in 0..MESSAGES {
            // Both subscribers asleep before each message.
            std::thread::sleep(Duration::from_millis(50));
            p.publish(&fill(&path, seed, 64)).unwrap();
        }
        p.publish(&fill(&path, END, 64)).unwrap();
    })
    .join()
    .unwrap();
    assert_eq!(relay.line(), "done");
    assert_eq!(local.line(), "done");
    relay.child.wait().unwrap();
    local.child.wait().unwrap();
    let log = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2 * MESSAGES as usize, "arrivals: {log}");
    for seed in 0..MESSAGES {
        let at = |tag: &str| {
            lines
                .iter()
                .position(|l| *l == format!("{tag} {seed}"))
                .unwrap_or_else(|| panic!("{tag} never got {seed}: {log}"))
        };
        assert!(
            at("local") < at("relay"),
            "message {seed}: the relay was woken before the local subscriber:\n{log}"
        );
    }
}

/// A subscriber that asked to be woken last is still woken for every message, however
/// the two subscribers are placed: each message reaches both before the next is sent.
fn relay_subscriber_is_woken() {
    let (_g, d, name) = join("wakeall");
    let config = ServiceConfig {
        depth: 8,
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    let mut p = Publisher::offer(&d, SERVICE, config).unwrap();
    let mut relay = Peer::spawn("echo-sub", &name, "last");
    assert_eq!(relay.line(), "joined");
    p.wait_for_subscribers(1, T).unwrap();
    let mut local = Peer::spawn("echo-sub", &name, "first");
    assert_eq!(local.line(), "joined");
    p.wait_for_subscribers(2, T).unwrap();
    let path = d.path(PathConfig::default()).unwrap();
    for seed in 0..MESSAGES {
        // Both subscribers asleep before each message.
        std::thread::sleep(Duration::from_millis(20));
        p.publish(&fill(&path, seed, 64)).unwrap();
        // Each blocks for up to 60 s: a subscriber not woken shows as a failure here.
        assert_eq!(local.line(), format!("got {seed}"));
        assert_eq!(relay.line(), format!("got {seed}"));
    }
    p.publish(&fill(&path, END, 64)).unwrap();
    assert_eq!(relay.line(), "done");
    assert_eq!(local.line(), "done");
    relay.child.wait().unwrap();
    local.child.wait().unwrap();
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[
        (
            "relay_subscriber_is_woken_last",
            relay_subscriber_is_woken_last,
        ),
        ("relay_subscriber_is_woken", relay_subscriber_is_woken),
    ]);
}
