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
    let deadline = Instant::now() + Duration::from_secs(20);
    let listing = loop {
        let out = ferry().args(["stat", &group]).output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        if text.contains(&format!("pid {}, 2 members", publisher.id())) {
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
