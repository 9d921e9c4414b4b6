//! The access policy on `GroupConfig`: owner-only by default (mode 0600 whatever the
//! umask), a Unix group when asked (mode 0660 and that gid), members of that group
//! admitted and other users refused, and another user's group joined only when the
//! opener asks to.
//!
//! Tests that act as other users need root (children switch to unused uids and gids
//! with `setresuid`, which needs no account); without root they print why and pass.

mod access_common;

use std::os::unix::fs::MetadataExt;

use access_common::*;
use ferry::{Error, Group, GroupAccess, GroupConfig};

fn config_from_env() -> GroupConfig {
    let mut c = GroupConfig::default();
    if let Ok(g) = std::env::var("FERRY_TEST_GID") {
        c.access = GroupAccess::UnixGroup(g.parse().unwrap());
    }
    c.allow_foreign_owner = std::env::var("FERRY_TEST_FOREIGN").is_ok();
    c
}

fn child_main(role: &str) {
    let name = std::env::var("FERRY_TEST_GROUP").unwrap();
    match role {
        // Opens and joins the group, and stays until told.
        "hold" => {
            let g = Group::open_with(&name, config_from_env()).unwrap();
            let d = g.join().unwrap();
            println!("ready");
            wait_stdin();
            drop((d, g));
        }
        // Opens the group and reports the live members' pids, or the error.
        "open" => match Group::open_with(&name, config_from_env()) {
            Ok(g) => {
                let pids: Vec<String> = g.members().iter().map(|m| m.pid.to_string()).collect();
                println!("ok {}", pids.join(","));
            }
            Err(e) => println!("err {e}"),
        },
        _ => panic!("unknown role {role}"),
    }
}

fn gname(tag: &str) -> String {
    format!("aptest-{tag}-{}", std::process::id())
}

/// A new file gets exactly the policy's mode, whatever the umask, and the policy's
/// group.
fn new_files_get_the_policys_mode_and_group() {
    let name = gname("mode");
    // SAFETY: umask(2) has no memory-safety preconditions; this harness runs one test
    // at a time, on one thread.
    let old = unsafe { libc::umask(0) };
    let g = Group::open(&name).unwrap();
    let m = std::fs::metadata(shm(&name)).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600, "umask 0 widened the file");
    drop(g);
    let gid = rustix::process::getegid().as_raw();
    let config = GroupConfig {
        access: GroupAccess::UnixGroup(gid),
        ..GroupConfig::default()
    };
    let g = Group::open_with(&name, config.clone()).unwrap();
    let m = std::fs::metadata(shm(&name)).unwrap();
    assert_eq!((m.mode() & 0o7777, m.gid()), (0o660, gid));
    // An owner-only opener refuses the shared file; one with the same policy joins.
    let err = Group::open(&name).expect_err("owner-only opener took a shared file");
    assert!(err.to_string().contains("mode 0660"), "{err}");
    assert!(Group::open_with(&name, config).is_ok());
    drop(g);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    assert!(!shm(&name).exists());
}

/// A group shared with Unix group G: the file is 0660 and G's; root in G joins it and
/// sees its member; a user outside G and root outside G are refused; another user in G
/// passes the file's checks but cannot take the creator's descriptor (no ptrace rights
/// over another user's process), which is an error, not a second group.
fn group_policy_admits_its_members_and_refuses_others() {
    if !need_root("group_policy_admits_its_members_and_refuses_others") {
        return;
    }
    let name = gname("unixgroup");
    let path = shm(&name);
    let gid = [("FERRY_TEST_GID", SHARED_GID.to_string())];
    let mut owner = Kid::spawn("hold", &name, Some(OTHER_UID), &[SHARED_GID], &gid);
    assert_eq!(owner.line(), "ready");
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (m.uid(), m.gid(), m.mode() & 0o7777),
        (OTHER_UID, SHARED_GID, 0o660)
    );
    // Members that join write their doors; the file itself must stay the same file,
    // owner, group and mode.
    let meta = || snap(&path).map(|s| (s.ino, s.uid, s.gid, s.mode));
    let before = meta();
    let open_as = |uid: Option<u32>, groups: &[u32]| {
        let mut k = Kid::spawn("open", &name, uid, groups, &gid);
        let l = k.line();
        k.finish();
        l
    };
    // Root in G: admitted, and sees the owner.
    assert_eq!(open_as(None, &[SHARED_GID]), format!("ok {}", owner.pid()));
    // Another user outside G: the kernel refuses the open; the error says why.
    let l = open_as(Some(THIRD_UID), &[]);
    assert!(
        l.starts_with("err") && l.contains("permission denied"),
        "{l}"
    );
    // Another user in G: the file passes, the creator's descriptor cannot be taken.
    let l = open_as(Some(THIRD_UID), &[SHARED_GID]);
    assert!(
        l.contains(&format!("member pid {}", owner.pid()))
            && l.contains("ptrace")
            && l.contains("second group"),
        "{l}"
    );
    // Root outside G (this process): refused by the policy, though the kernel would let
    // it open the file.
    let config = GroupConfig {
        access: GroupAccess::UnixGroup(SHARED_GID),
        ..GroupConfig::default()
    };
    let err = Group::open_with(&name, config).expect_err("root outside G joined");
    assert!(
        matches!(err, Error::Untrusted { .. })
            && err
                .to_string()
                .contains(&format!("not in Unix group {SHARED_GID}")),
        "{err}"
    );
    assert_eq!(
        meta(),
        before,
        "the shared file was replaced or changed hands"
    );
    owner.finish();
    assert!(!path.exists());
}

/// Root joins another user's group only with `allow_foreign_owner`, and then sees its
/// member; leaving last does not remove or change the other user's file.
fn root_joins_another_users_group_only_when_asked() {
    if !need_root("root_joins_another_users_group_only_when_asked") {
        return;
    }
    let name = gname("consent");
    let path = shm(&name);
    let mut owner = Kid::spawn("hold", &name, Some(OTHER_UID), &[], &[]);
    assert_eq!(owner.line(), "ready");
    let err = Group::open(&name).expect_err("root joined without asking");
    assert!(matches!(err, Error::Untrusted { .. }), "{err}");
    let g = Group::open_with(
        &name,
        GroupConfig {
            allow_foreign_owner: true,
            ..GroupConfig::default()
        },
    )
    .unwrap();
    assert_eq!(
        g.members().iter().map(|m| m.pid).collect::<Vec<_>>(),
        vec![owner.pid()]
    );
    // The owner leaves first; root, last to leave, does not remove the other user's
    // file (it stays for its owner to reuse or clean).
    owner.finish();
    drop(g);
    let m = std::fs::metadata(&path).expect("root removed another user's file");
    assert_eq!((m.uid(), m.mode() & 0o7777), (OTHER_UID, 0o600));
    std::fs::remove_file(&path).unwrap();
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[
        (
            "new_files_get_the_policys_mode_and_group",
            new_files_get_the_policys_mode_and_group,
        ),
        (
            "group_policy_admits_its_members_and_refuses_others",
            group_policy_admits_its_members_and_refuses_others,
        ),
        (
            "root_joins_another_users_group_only_when_asked",
            root_joins_another_users_group_only_when_asked,
        ),
    ]);
}
