//! `ferry pub`, `ferry sub` and `ferry stat` from a shell's point of view: two
//! subscriber processes print what a publisher process read from its stdin, and `stat`
//! lists the service with its publisher while it runs.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ferry() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
}

#[test]
fn pub_feeds_two_subs_and_stat_lists_the_service() {
    let group = format!("clitest-{}", std::process::id());
    let subs: Vec<_> = (0..2)
        .map(|_| {
            ferry()
                .args(["sub", &group, "news", "--count", "3"])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut publisher = ferry()
        .args(["pub", &group, "news", "--wait-subscribers", "2"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While the publisher waits for its stdin, `stat` shows it offering the service.
    // (Until the first process has made the group, `stat` says there is no such group
    // and fails.)
    let deadline = Instant::now() + Duration::from_secs(20);
    let listing = loop {
        let out = ferry().args(["stat", &group]).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        if text.contains(&format!("pid {}, 2 members", publisher.id())) {
            assert!(out.status.success(), "{text}");
            break text;
        }
        assert!(Instant::now() < deadline, "stat never showed it: {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(listing.contains("service \"news\": pub-sub"), "{listing}");
    let mut stdin = publisher.stdin.take().unwrap();
    stdin.write_all(b"hello\nworld\nthird line\n").unwrap();
    drop(stdin);
    let out = publisher.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("3 messages"));
    for s in subs {
        let out = s.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "hello\nworld\nthird line\n"
        );
    }
}

#[test]
fn sub_to_an_unknown_service_fails_clearly() {
    let group = format!("clitest-unknown-{}", std::process::id());
    let out = ferry()
        .args(["sub", &group, "nothing", "--timeout", "0.1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no live service named \"nothing\""));
}

/// The columns `ferry stat` prints for a member's line in a table: the first line that
/// starts with `who` after the header line starting with `table`.
fn row(listing: &str, table: &str, who: &str) -> Vec<String> {
    listing
        .lines()
        .map(str::trim)
        .skip_while(|l| !l.starts_with(table))
        .find(|l| l.split_whitespace().next() == Some(who))
        .unwrap_or_else(|| panic!("no {table} row for {who}: {listing}"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// `ferry stat` (another process, not a member) shows a path's fbufs out and a
/// channel's messages in flight as this process holds them, and the numbers after the
/// receiver lets go.
#[test]
fn stat_shows_fbufs_out_and_messages_in_flight() {
    let name = format!("clitest-activity-{}", std::process::id());
    let g = ferry::Group::open(&name).unwrap();
    let (a, b) = (g.join().unwrap(), g.join().unwrap());
    let path = a.path(ferry::PathConfig::default()).unwrap();
    let (bid, a2) = (b.id(), a.clone());
    let t = std::thread::spawn(move || a2.connect(bid, Duration::from_secs(10)).unwrap());
    let mut rx = b.accept(Duration::from_secs(10)).unwrap();
    let tx = t.join().unwrap();
    let kept = path.alloc(100).unwrap().freeze();
    for _ in 0..2 {
        tx.send(&path.alloc(100).unwrap().freeze()).unwrap();
    }
    let held: Vec<_> = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    let stat = || {
        let out = ferry().args(["stat", &name]).output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let (aid, bid) = (a.id().to_string(), b.id().to_string());
    let listing = stat();
    assert!(
        listing.contains(&format!("group {name}: 2 members")),
        "{listing}"
    );
    assert!(
        listing.contains(&format!(
            "group {name}: 2 members, lots of 1024 MiB, 4k pages"
        )),
        "{listing}"
    );
    // paths: member, pid, path, fbufs out, MiB out/quota, pages
    let p = row(&listing, "paths:", &aid);
    assert_eq!(p[1], std::process::id().to_string());
    assert_eq!(p[3], "3", "{listing}");
    assert_eq!(p[4], "0.01/512", "{listing}");
    assert_eq!(p[5], "4k", "{listing}");
    // channels: member, pid, chan, to, in flight, sent
    let c = row(&listing, "channels", &aid);
    assert_eq!(c[3..], [bid.clone(), "2".into(), "2".into()], "{listing}");

    drop(held);
    tx.collect_releases().unwrap();
    let listing = stat();
    assert_eq!(row(&listing, "paths:", &aid)[3], "1", "{listing}");
    assert_eq!(
        row(&listing, "channels", &aid)[3..],
        [bid, "0".into(), "2".into()]
    );
    drop((kept, tx, rx, path, a, b, g));
    assert!(!std::path::Path::new(&format!("/dev/shm/ferry.{name}")).exists());
}

/// `ferry stat` says which pages back each path: a path of transparent huge pages whose
/// 4 MiB fbuf was collapsed shows `thp`.
#[test]
fn stat_shows_each_paths_pages() {
    let name = format!("clitest-pages-{}", std::process::id());
    let g = ferry::Group::open(&name).unwrap();
    let a = g.join().unwrap();
    let path = a
        .path(ferry::PathConfig {
            pages: Some(ferry::Pages::Transparent),
            ..ferry::PathConfig::default()
        })
        .unwrap();
    let kept = path.alloc(4 << 20).unwrap().freeze();
    let out = ferry().args(["stat", &name]).output().unwrap();
    assert!(out.status.success());
    let listing = String::from_utf8(out.stdout).unwrap();
    let p = row(&listing, "paths:", &a.id().to_string());
    let st = path.stats();
    if st.collapse_fallbacks == 0 {
        assert_eq!(p[5], "thp", "{listing}");
    } else {
        // The kernel would not collapse: the listing says how many spans stayed 4 KiB.
        assert_eq!(p[5..], ["thp", "(1", "spans", "4k)"], "{listing}");
    }
    drop((kept, path, a, g));
}
