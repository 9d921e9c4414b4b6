//! Reliability under dead and misbehaving peers, between real processes: one test per
//! failure an independent torture test found (see the README's "Guarantees and limits").
//! Each child is this test binary re-executed in a role (`harness = false`).

mod common;

use std::io::BufReader;
use std::time::{Duration, Instant};

use common::*;
use ferry::{DomainId, Error, Group, PathConfig};

// ---------------------------------------------------------------- child roles

/// Descriptors of this process's memfds whose name starts with `prefix`.
fn own_memfds(prefix: &str) -> Vec<i32> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let link = std::fs::read_link(e.path()).ok()?;
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            link.to_str()?
                .starts_with(&format!("/memfd:{prefix}"))
                .then_some(fd)
        })
        .collect()
}

/// `ftruncate(fd, len)`: "ok" or the errno's name.
fn try_truncate(fd: i32, len: i64) -> &'static str {
    // SAFETY: ftruncate(2) on a descriptor number has no memory-safety preconditions.
    if unsafe { libc::ftruncate(fd, len) } == 0 {
        return "ok";
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EPERM) => "EPERM",
        _ => "other",
    }
}

fn child_main(role: &str) {
    let group = Group::open(&std::env::var("FERRY_TEST_GROUP").unwrap()).unwrap();
    let domain = group.join().unwrap();
    println!("{}", domain.id());
    let mut stdin = BufReader::new(std::io::stdin());
    match role {
        // Send three messages, then on "truncate" try to shrink and grow every lot and
        // channel memfd this process owns, report what the kernel said, and send a fourth.
        "truncator" => {
            let peer: DomainId = read_line(&mut stdin).parse().unwrap();
            let tx = domain.connect(peer, T).unwrap();
            let path = domain.path(PathConfig::default()).unwrap();
            let mut keep = Vec::new();
            for seed in 1..=3 {
                let d = message(&path, seed, 3 * 4096 + 100, 2);
                tx.send(&d).unwrap();
                keep.push(d);
            }
            read_line(&mut stdin);
            let mut report = Vec::new();
            for kind in ["ferry-lot", "ferry-channel"] {
                let fds = own_memfds(kind);
                assert!(!fds.is_empty(), "no {kind} memfd found");
                for fd in fds {
                    report.push(format!(
                        "{kind}:{}:{}",
                        try_truncate(fd, 0),
                        try_truncate(fd, 1 << 40)
                    ));
                }
            }
            println!("{}", report.join(" "));
            tx.send(&message(&path, 4, 5000, 1)).unwrap();
            read_line(&mut stdin);
        }
        // Accept from upstream, connect to the domain named on stdin, and forward every
        // message without copying, blocked in `recv` between messages.
        "stage" => {
            let mut rx = domain.accept(T).unwrap();
            let down: DomainId = read_line(&mut stdin).parse().unwrap();
            let tx = domain.connect(down, T).unwrap();
            println!("connected");
            loop {
                match rx.recv() {
                    Ok(m) => {
                        if let Err(e) = tx.send(&m) {
                            println!("send: {e}");
                            break;
                        }
                    }
                    Err(e) => {
                        println!("recv: {e}");
                        break;
                    }
                }
            }
            std::thread::sleep(Duration::from_secs(3600));
        }
        // Receive and verify N messages (N on stdin), hold them, say "held"; on "check"
        // verify them again byte by byte; on "release" drop them and drain the channel.
        "sink" => {
            let mut rx = domain.accept(T).unwrap();
            println!("accepted");
            let n: usize = read_line(&mut stdin).parse().unwrap();
            let mut held = Vec::new();
            while held.len() < n {
                let m = rx.recv().unwrap();
                verify(&m).unwrap();
                held.push(m);
            }
            println!("held");
            loop {
                match read_line(&mut stdin).as_str() {
                    "check" => {
                        let bad: Vec<String> =
                            held.iter().filter_map(|m| verify(m).err()).collect();
                        if bad.is_empty() {
                            println!("intact");
                        } else {
                            println!("torn {}: {}", bad.len(), bad[0]);
                        }
                    }
                    "release" => {
                        held.clear();
                        // The stage is dead: this ends with PeerGone once the ring is
                        // empty, and our ledger entry for the channel goes.
                        let r = rx.recv();
                        println!("released {}", r.is_err());
                    }
                    _ => return,
                }
            }
        }
        // Receive and hold everything until killed.
        "hoard" => {
            let mut rx = domain.accept(T).unwrap();
            println!("accepted");
            let mut held = Vec::new();
            while let Ok(m) = rx.recv() {
                held.push(m);
            }
            std::thread::sleep(Duration::from_secs(3600));
        }
        // Connect to the domain named on stdin, send three messages and exit at once.
        "send-and-exit" => {
            let peer: DomainId = read_line(&mut stdin).parse().unwrap();
            let tx = domain.connect(peer, T).unwrap();
            let path = domain.path(PathConfig::default()).unwrap();
            for seed in 1..=3 {
                tx.send(&message(&path, seed, 10_000, 2)).unwrap();
            }
            std::process::exit(0);
        }
        // Connect to the domain named on stdin, send three messages, wait for a line.
        "send-and-wait" => {
            let peer: DomainId = read_line(&mut stdin).parse().unwrap();
            let tx = domain.connect(peer, T).unwrap();
            let path = domain.path(PathConfig::default()).unwrap();
            for seed in 1..=3 {
                tx.send(&message(&path, seed, 10_000, 2)).unwrap();
            }
            read_line(&mut stdin);
        }
        // Wait for a line, then exit at once, dropping nothing (the group, the domain
        // and a message it sent itself stay alive to the end).
        "exit-holding" => {
            let path = domain.path(PathConfig::default()).unwrap();
            let kept = message(&path, 1, 5000, 1);
            read_line(&mut stdin);
            std::mem::forget((kept, group, domain));
            std::process::exit(0);
        }
        _ => panic!("unknown role {role}"),
    }
}

/// Starts source (this process) -> stage -> `sink_role`; returns the sender to the stage.
fn chain(d: &ferry::Domain, name: &str, sink_role: &str) -> (ferry::Sender, Peer, Peer) {
    let mut stage = Peer::spawn("stage", name, "");
    let mut sink = Peer::spawn(sink_role, name, "");
    let tx = d.connect(stage.id, T).unwrap();
    stage.tell(&sink.id.to_string());
    assert_eq!(sink.line(), "accepted");
    assert_eq!(stage.line(), "connected");
    (tx, stage, sink)
}

/// Waits up to `secs` for `f` to hold, calling `collect` between tries.
fn within(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

// ---------------------------------------------------------------- tests

/// A member cannot shrink (or grow) its own lot or channel memory under its peers: both
/// are sealed, and the peer reading them takes no SIGBUS. Before the seals, the parent
/// died of SIGBUS re-reading the held messages.
fn owner_cannot_truncate_its_lot_or_channel() {
    let (_g, d, name) = join("trunc");
    let mut peer = Peer::spawn("truncator", &name, "");
    let mut rx = accept_from(&d, &mut peer);
    let held: Vec<_> = (0..3).map(|_| rx.recv().unwrap()).collect();
    for m in &held {
        verify(m).unwrap();
    }
    peer.tell("truncate");
    let report = peer.line();
    for entry in report.split(' ') {
        assert!(
            entry.ends_with(":EPERM:EPERM"),
            "a member resized its shared memory: {report}"
        );
    }
    // The held messages read as before (this process would die of SIGBUS otherwise).
    for (i, m) in held.iter().enumerate() {
        assert_eq!(verify(m).unwrap(), i as u64 + 1);
    }
    assert_eq!(verify(&rx.recv().unwrap()).unwrap(), 4);
    peer.tell("bye");
    assert!(peer.child.wait().unwrap().success());
}

/// source -> stage -> sink: the sink holds messages the stage forwarded (spans of the
/// source's lot); the stage is killed; the source takes back what the stage held and
/// allocates and overwrites again and again. The sink's held messages must stay intact
/// byte by byte, and the source gets its fbufs back only after the sink lets go. Before
/// the ledger, the source reused the spans at once and the sink read later messages' bytes.
fn forwarded_fragments_survive_the_forwarders_death() {
    let (_g, d, name) = join("fwdkill");
    let path = d
        .path(PathConfig {
            quota: 64 * 65536,
            ..PathConfig::default()
        })
        .unwrap();
    let (tx, mut stage, mut sink) = chain(&d, &name, "sink");
    const N: u64 = 12;
    sink.tell(&N.to_string());
    for seed in 1..=N {
        tx.send(&message(&path, seed, 65536, 1 + seed as usize % 3))
            .unwrap();
    }
    assert_eq!(sink.line(), "held");
    stage.kill9();
    assert!(
        within(5, || matches!(tx.check_peer(), Err(Error::PeerGone { .. }))),
        "the source never saw the stage die"
    );
    // Allocate and overwrite everything the path will give us, many times over.
    for round in 0..20u64 {
        let mut got = Vec::new();
        while let Ok(mut m) = path.alloc(65536) {
            m.fill_from(&vec![(round as u8) ^ 0xa5; 65536]);
            got.push(m.freeze());
        }
        assert!(!got.is_empty());
    }
    assert!(d.quarantined() > 0, "nothing quarantined");
    sink.tell("check");
    assert_eq!(sink.line(), "intact");
    // Once the sink lets go, the source gets every fbuf back.
    sink.tell("release");
    assert_eq!(sink.line(), "released true");
    assert!(
        within(5, || {
            d.collect_releases();
            path.outstanding() == 0
        }),
        "{} bytes never came back, {} fragments quarantined",
        path.outstanding(),
        d.quarantined()
    );
    assert_eq!(d.quarantined(), 0);
    sink.tell("bye");
    assert!(sink.child.wait().unwrap().success());
}

/// source -> stage -> sink: the sink hoards everything until the source is at its quota,
/// with the stage asleep in `recv`; then the sink is killed. The stage must notice (it
/// sleeps on its downstream's pidfd too), take back what the sink held and release it
/// upstream, so the source can allocate again. Before the fix, the stage slept forever.
fn a_stage_blocked_in_recv_learns_its_sink_died() {
    let (_g, d, name) = join("sinkkill");
    let path = d
        .path(PathConfig {
            quota: 16 * 65536,
            ..PathConfig::default()
        })
        .unwrap();
    let (tx, mut stage, mut sink) = chain(&d, &name, "hoard");
    let mut seed = 1;
    loop {
        match path.alloc(65536) {
            Ok(mut m) => {
                m.fill_from(&vec![seed as u8; 65536]);
                tx.send(&m.freeze()).unwrap();
                seed += 1;
            }
            Err(Error::QuotaExceeded { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    // Give the stage time to forward everything and fall asleep in recv.
    std::thread::sleep(Duration::from_millis(200));
    assert!(path.alloc(65536).is_err());
    sink.kill9();
    assert!(
        within(5, || path.alloc(65536).is_ok()),
        "the source is still at its quota: the stage never noticed its sink died"
    );
    assert!(within(5, || {
        d.collect_releases();
        path.outstanding() == 0
    }));
    stage.kill9();
}

/// A quarantine does not wait for a receiver that never looks at its channel from an
/// unrelated dead sender. This process keeps, unread, a receiver from a child that sent and
/// exited; a second child hoards our fbufs and is killed. Its fbufs must come back: the
/// dead sender never had any of them (its ledger says so). Before, the idle receiver held
/// every quarantine in the group, and a source waiting for its quota hung.
fn an_idle_receiver_from_an_unrelated_dead_sender_does_not_hold_the_quarantine() {
    let (_g, d, name) = join("idlerx");
    let mut other = Peer::spawn("send-and-exit", &name, "");
    let idle = accept_from(&d, &mut other);
    assert!(other.child.wait().unwrap().success());
    let path = d.path(PathConfig::default()).unwrap();
    let mut hoard = Peer::spawn("hoard", &name, "");
    let tx = d.connect(hoard.id, T).unwrap();
    assert_eq!(hoard.line(), "accepted");
    for seed in 1..=5 {
        tx.send(&message(&path, seed, 100_000, 3)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    hoard.kill9();
    assert!(within(5, || matches!(
        tx.check_peer(),
        Err(Error::PeerGone { .. })
    )));
    assert!(
        within(5, || {
            d.collect_releases();
            path.outstanding() == 0
        }),
        "{} bytes stayed in quarantine ({} fragments)",
        path.outstanding(),
        d.quarantined()
    );
    drop(idle);
}

/// A peer's lot is unmapped as soon as nothing here reads it, whether the peer lives or
/// dies later. Before, a lot whose channel closed while its owner lived stayed mapped
/// after the owner died, until someone called `forget_dead_peers`.
fn a_lot_is_unmapped_once_nothing_reads_it() {
    let (g, d, name) = join("unmap");
    let mut peer = Peer::spawn("send-and-wait", &name, "");
    let mut rx = accept_from(&d, &mut peer);
    let addr = g.lot_addr(peer.id.slot);
    let got: Vec<_> = (0..3).map(|_| rx.recv().unwrap()).collect();
    assert!(maps_contain(addr));
    drop(rx);
    assert!(maps_contain(addr), "messages still read it");
    drop(got);
    assert!(!maps_contain(addr), "the peer's lot is still mapped");
    assert_eq!(d.mapped_peers(), 0);
    peer.tell("bye");
    assert!(peer.child.wait().unwrap().success());
    assert!(!maps_contain(addr));
}

/// Members that exit normally without dropping their group (or while still holding their
/// lot), even two at the same moment, leave no control file behind: each leaves the group
/// as it exits. Before, no destructor ran at exit, so the file stayed.
fn members_exiting_together_leave_no_control_file() {
    for round in 0..5 {
        let name = group_name(&format!("exit{round}"));
        let mut a = Peer::spawn("exit-holding", &name, "");
        let mut b = Peer::spawn("exit-holding", &name, "");
        assert!(control_file_exists(&name));
        a.tell("go");
        b.tell("go");
        assert!(a.child.wait().unwrap().success());
        assert!(b.child.wait().unwrap().success());
        assert!(
            !control_file_exists(&name),
            "round {round}: /dev/shm/ferry.{name} outlived both members"
        );
    }
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[
        (
            "owner_cannot_truncate_its_lot_or_channel",
            owner_cannot_truncate_its_lot_or_channel,
        ),
        (
            "forwarded_fragments_survive_the_forwarders_death",
            forwarded_fragments_survive_the_forwarders_death,
        ),
        (
            "a_stage_blocked_in_recv_learns_its_sink_died",
            a_stage_blocked_in_recv_learns_its_sink_died,
        ),
        (
            "members_exiting_together_leave_no_control_file",
            members_exiting_together_leave_no_control_file,
        ),
        (
            "a_lot_is_unmapped_once_nothing_reads_it",
            a_lot_is_unmapped_once_nothing_reads_it,
        ),
        (
            "an_idle_receiver_from_an_unrelated_dead_sender_does_not_hold_the_quarantine",
            an_idle_receiver_from_an_unrelated_dead_sender_does_not_hold_the_quarantine,
        ),
    ]);
}
