//! Reliability under dead and misbehaving peers, between real processes: one test per
//! failure an independent torture test found (see the README's "Guarantees and limits").
//! Each child is this test binary re-executed in a role (`harness = false`).

mod common;

use std::io::BufReader;
use std::time::Duration;

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
        _ => panic!("unknown role {role}"),
    }
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

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[(
        "owner_cannot_truncate_its_lot_or_channel",
        owner_cannot_truncate_its_lot_or_channel,
    )]);
}
