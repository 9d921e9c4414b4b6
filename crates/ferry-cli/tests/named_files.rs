//! `ferry stat`, `ferry clean` and `--group-access` against what `/dev/shm` may hold:
//! garbage, links, other users' files, stale tables, empty files, live groups and names
//! that do not exist. `stat` changes none of it and fails on what it cannot read;
//! `clean` removes only this user's files that no live member uses.
//!
//! Other users' files are made by chowning to an unused uid, which needs root; without
//! root those cases are left out (and say so).

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const OTHER_UID: u32 = 54321;

fn ferry() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
    c.env("RUST_BACKTRACE", "0");
    c
}

fn run(args: &[&str]) -> Output {
    ferry().args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn shm(name: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ferry.{name}"))
}

/// Writes `bytes` to a new file at `path`, mode 0600, owned by `uid` if given.
fn plant(path: &Path, bytes: &[u8], uid: Option<u32>) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    if let Some(u) = uid {
        std::os::unix::fs::chown(path, Some(u), None).unwrap();
    }
}

/// A door table (the format of ferry's `region::group`) whose one door names this
/// process with a start time it never had: a dead door.
fn stale_table() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&u64::from_le_bytes(*b"FERRYDOR").to_ne_bytes());
    b.extend_from_slice(&1u32.to_ne_bytes());
    b.extend_from_slice(&255u32.to_ne_bytes());
    b.extend_from_slice(&std::process::id().to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&1u64.to_ne_bytes());
    b.resize(16 + 255 * 16, 0);
    b
}

/// Name, owner, group, mode, size, mtime, inode, link target and contents of every
/// `/dev/shm/ferry.<prefix>*` entry and of `extra` paths (a link is not followed).
fn snapshot(prefix: &str, extra: &[&Path]) -> Vec<String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&format!("ferry.{prefix}")))
        })
        .map(|e| e.path())
        .collect();
    paths.extend(extra.iter().map(|p| p.to_path_buf()));
    paths.sort();
    paths
        .iter()
        .map(|p| match std::fs::symlink_metadata(p) {
            Err(_) => format!("{}: absent", p.display()),
            Ok(m) => format!(
                "{}: uid {} gid {} mode {:o} len {} mtime {}.{} ino {} link {:?} bytes {:?}",
                p.display(),
                m.uid(),
                m.gid(),
                m.mode(),
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
                m.ino(),
                std::fs::read_link(p).ok(),
                m.is_file().then(|| {
                    std::fs::read(p)
                        .unwrap()
                        .iter()
                        .fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
                            (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
                        })
                })
            ),
        })
        .collect()
}

/// `ferry stat` on garbage (ours and another user's), links (to a file and to
/// nothing), another user's stale table, our stale table, an empty file, a live group
/// and a name that does not exist: /dev/shm is byte-for-byte the same afterwards, and
/// it exits non-zero, with the reason, for each it cannot read.
#[test]
fn stat_changes_nothing_and_fails_on_what_it_cannot_read() {
    let prefix = format!("clistat-{}-", std::process::id());
    let name = |t: &str| format!("{prefix}{t}");
    let dir = std::env::temp_dir();
    let target = dir.join(format!("ferry-clistat-target-{}", std::process::id()));
    let nothing = dir.join(format!("ferry-clistat-nothing-{}", std::process::id()));
    std::fs::write(&target, b"precious\n").unwrap();
    plant(&shm(&name("garbage")), &[0x5a; 100], None);
    std::os::unix::fs::symlink(&target, shm(&name("link"))).unwrap();
    std::os::unix::fs::symlink(&nothing, shm(&name("dangling"))).unwrap();
    plant(&shm(&name("stale")), &stale_table(), None);
    plant(&shm(&name("empty")), b"", None);
    let root = is_root();
    if root {
        plant(&shm(&name("fgarbage")), &[0xa5; 3000], Some(OTHER_UID));
        plant(&shm(&name("fstale")), &stale_table(), Some(OTHER_UID));
    } else {
        println!("not root: another user's files left out");
    }
    let live = ferry::Group::open(&name("live")).unwrap();
    let member = live.join().unwrap();
    let before = snapshot(&prefix, &[&target, &nothing]);

    // (name, readable, what the listing says)
    let mut cases = vec![
        ("garbage", false, "garbage, left alone"),
        ("link", false, "symbolic link"),
        ("dangling", false, "symbolic link"),
        ("missing", false, "no such group"),
        ("stale", true, "stale"),
        ("empty", true, "empty file"),
        ("live", true, "1 members"),
    ];
    if root {
        cases.push(("fgarbage", false, "garbage (owned by uid 54321"));
        cases.push(("fstale", true, "stale (owned by uid 54321"));
    }
    for (t, readable, says) in &cases {
        let out = run(&["stat", &name(t)]);
        let all = text(&out);
        assert_eq!(out.status.success(), *readable, "{t}: {all}");
        assert!(all.contains(says), "{t}: {all}");
        if !readable {
            assert!(all.contains("cannot be read"), "{t}: {all}");
        }
    }
    // Listing everything reads the same files, and fails for the unreadable ones.
    let out = run(&["stat"]);
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    for (t, _, _) in cases.iter().filter(|c| c.0 != "missing") {
        assert!(all.contains(&format!("group {}", name(t))), "{t}: {all}");
    }

    assert_eq!(snapshot(&prefix, &[&target, &nothing]), before);
    assert!(!nothing.exists());
    drop((member, live));
    for t in [
        "garbage", "link", "dangling", "stale", "empty", "fgarbage", "fstale",
    ] {
        let _ = std::fs::remove_file(shm(&name(t)));
    }
    std::fs::remove_file(&target).unwrap();
}

/// `ferry clean NAME` removes our stale table, our garbage and our empty file, and
/// leaves a live group, a link (and its target), and another user's stale table,
/// saying why for each.
#[test]
fn clean_removes_only_our_stale_files() {
    let prefix = format!("cliclean-{}-", std::process::id());
    let name = |t: &str| format!("{prefix}{t}");
    let target = std::env::temp_dir().join(format!("ferry-cliclean-target-{}", std::process::id()));
    std::fs::write(&target, b"precious\n").unwrap();
    plant(&shm(&name("stale")), &stale_table(), None);
    plant(&shm(&name("garbage")), &[0x5a; 100], None);
    plant(&shm(&name("empty")), b"", None);
    std::os::unix::fs::symlink(&target, shm(&name("link"))).unwrap();
    let root = is_root();
    if root {
        plant(&shm(&name("fstale")), &stale_table(), Some(OTHER_UID));
    } else {
        println!("not root: another user's file left out");
    }
    let live = ferry::Group::open(&name("live")).unwrap();
    let member = live.join().unwrap();
    let kept = snapshot(&format!("{prefix}l"), &[&target]);

    let mut cases = vec![
        ("stale", true, "stale"),
        ("garbage", true, "garbage"),
        ("empty", true, "empty"),
        ("link", false, "symbolic link"),
        ("live", false, "live member"),
    ];
    if root {
        cases.push(("fstale", false, "owned by uid 54321"));
    }
    for (t, removed, says) in &cases {
        let out = run(&["clean", &name(t)]);
        let all = text(&out);
        assert!(out.status.success(), "{t}: {all}");
        let verb = if *removed { "removed" } else { "left" };
        assert!(
            all.starts_with(&format!("{verb} {}", shm(&name(t)).display())) && all.contains(says),
            "{t}: {all}"
        );
        assert_eq!(
            std::fs::symlink_metadata(shm(&name(t))).is_ok(),
            !removed,
            "{t}: {all}"
        );
    }
    // The live group and the link are exactly as they were.
    assert_eq!(snapshot(&format!("{prefix}l"), &[&target]), kept);
    drop((member, live));
    let _ = std::fs::remove_file(shm(&name("link")));
    let _ = std::fs::remove_file(shm(&name("fstale")));
    std::fs::remove_file(&target).unwrap();
}

/// `ferry pub --group-access G` makes the group's file mode 0660 and G's; a `ferry sub`
/// without the flag refuses that file, clearly; one with it (G by name where it has
/// one) receives.
#[test]
fn group_access_shares_the_group_file() {
    let group = format!("cliaccess-{}", std::process::id());
    let gid = rustix::process::getegid().as_raw();
    let by_name = std::fs::read_to_string("/etc/group")
        .ok()
        .and_then(|g| {
            g.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 2 && f[2] == gid.to_string()).then(|| f[0].to_owned())
            })
        })
        .unwrap_or_else(|| gid.to_string());
    let mut publisher = ferry()
        .args(["pub", &group, "news", "--wait-subscribers", "1"])
        .args(["--group-access", &gid.to_string()])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let path = shm(&group);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "the publisher made no group file"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!((m.mode() & 0o7777, m.gid()), (0o660, gid));

    let out = run(&["sub", &group, "news", "--timeout", "1"]);
    let all = text(&out);
    assert!(!out.status.success() && all.contains("mode 0660"), "{all}");

    let sub = ferry()
        .args([
            "sub",
            &group,
            "news",
            "--count",
            "1",
            "--group-access",
            &by_name,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = publisher.stdin.take().unwrap();
    stdin.write_all(b"shared\n").unwrap();
    drop(stdin);
    let out = sub.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "shared\n");
    assert!(publisher.wait().unwrap().success());
    assert!(!path.exists());
}
