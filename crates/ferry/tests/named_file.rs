//! The group's named file in a `/dev/shm` other users share: what another user plants
//! there (a symbolic link, a file of their own, garbage, a file anyone may write, a
//! forged door) is refused with a clear error and left exactly as it was, and a door
//! that cannot be taken is an error rather than a second group of the same name.
//!
//! Tests that act as another user need root (children switch to an unused uid with
//! `setresuid`, which needs no account); without root they print why and pass.
//! Runs with its own small harness (`harness = false`) so that children are spawned
//! from a single-threaded process.

mod access_common;

use access_common::*;
use ferry::Group;

fn child_main(role: &str) {
    let name = std::env::var("FERRY_TEST_GROUP").unwrap();
    match role {
        // Opens and joins the group, says so with its control memfd's number, and
        // stays until told.
        "hold" => {
            let g = Group::open(&name).unwrap();
            let d = g.join().unwrap();
            println!("ready {}", control_fd(&name));
            wait_stdin();
            drop((d, g));
        }
        // A live process with nothing to do with ferry.
        "idle" => {
            println!("ready");
            wait_stdin();
        }
        _ => panic!("unknown role {role}"),
    }
}

fn gname(tag: &str) -> String {
    format!("nftest-{tag}-{}", std::process::id())
}

/// Another user plants `/dev/shm/ferry.NAME -> target`: opening refuses it (no file
/// is created or written through the link), whether the target exists or not.
fn planted_symlink_is_refused_and_its_target_untouched() {
    let name = gname("link");
    let path = shm(&name);
    let target = std::env::temp_dir().join(format!("ferry-nftest-target-{}", std::process::id()));
    plant(&target, b"precious bytes\n", 0o644, None);
    let _ = std::fs::remove_file(&path);
    std::os::unix::fs::symlink(&target, &path).unwrap();
    if is_root() {
        std::os::unix::fs::lchown(&path, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    }
    let (link_before, target_before) = (snap(&path), snap(&target));
    let err = Group::open(&name).expect_err("opened through a planted link");
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("symbolic link"),
        "{msg}"
    );
    assert_eq!(snap(&target), target_before, "the link's target changed");
    assert_eq!(snap(&path), link_before, "the link changed");

    // A link to nothing: nothing gets created there.
    std::fs::remove_file(&target).unwrap();
    let err = Group::open(&name).expect_err("opened through a dangling link");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(
        snap(&target).is_none(),
        "a file was created through the link"
    );
    assert_eq!(snap(&path), link_before);
    std::fs::remove_file(&path).unwrap();
}

/// A file another user made under the group's name (empty, or a door table with no
/// live door) is refused, naming its owner, and left as it was.
fn foreign_owned_file_is_refused_untouched() {
    if !need_root("foreign_owned_file_is_refused_untouched") {
        return;
    }
    let name = gname("foreign");
    let path = shm(&name);
    for (what, bytes) in [("empty", Vec::new()), ("table", door_table(&[]))] {
        plant(&path, &bytes, 0o600, Some(OTHER_UID));
        let before = snap(&path);
        let err = Group::open(&name).expect_err("joined another user's file");
        let msg = err.to_string();
        assert!(
            msg.contains(&path.display().to_string())
                && msg.contains(&format!("owned by uid {OTHER_UID}")),
            "{what}: {msg}"
        );
        assert_eq!(snap(&path), before, "{what}: the file changed");
    }
    std::fs::remove_file(&path).unwrap();
}

/// Garbage another user left under the group's name is refused and not removed.
fn foreign_garbage_is_refused_untouched() {
    if !need_root("foreign_garbage_is_refused_untouched") {
        return;
    }
    let name = gname("fgarbage");
    let path = shm(&name);
    let junk: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    plant(&path, &junk, 0o600, Some(OTHER_UID));
    let before = snap(&path);
    let err = Group::open(&name).expect_err("opened another user's garbage");
    assert!(
        err.to_string().contains(&format!("uid {OTHER_UID}")),
        "{err}"
    );
    assert_eq!(
        snap(&path),
        before,
        "another user's file was changed or removed"
    );
    std::fs::remove_file(&path).unwrap();
}

/// Our own file with permissions beyond owner-only (anyone may write its doors) is
/// refused, and left as it was.
fn permissive_mode_is_refused() {
    let name = gname("mode");
    let path = shm(&name);
    for mode in [0o666, 0o604, 0o620] {
        plant(&path, &door_table(&[]), mode, None);
        let before = snap(&path);
        let err = Group::open(&name).expect_err("opened a file others may write");
        assert!(
            err.to_string().contains(&format!("mode {mode:04o}")),
            "{err}"
        );
        assert_eq!(snap(&path), before, "mode {mode:04o}: the file changed");
    }
    std::fs::remove_file(&path).unwrap();
}

/// Root opening a live group another user runs is refused (it joins only when it asks
/// to), and the group's file is left as it was.
fn root_does_not_join_another_users_group() {
    if !need_root("root_does_not_join_another_users_group") {
        return;
    }
    let name = gname("rootjoin");
    let path = shm(&name);
    let mut kid = Kid::spawn("hold", &name, Some(OTHER_UID), &[], &[]);
    assert!(kid.line().starts_with("ready"));
    let before = snap(&path).expect("the other user's group file");
    assert_eq!(before.uid, OTHER_UID);
    let err = Group::open(&name).expect_err("root joined another user's group");
    assert!(
        err.to_string()
            .contains(&format!("owned by uid {OTHER_UID}")),
        "{err}"
    );
    assert_eq!(snap(&path), Some(before));
    kid.finish();
    assert!(
        snap(&path).is_none(),
        "the other user's group was left behind"
    );
}

/// A door naming a live process whose descriptor is not a control block: opening fails,
/// naming the process, and writes nothing (no second group, no door of ours).
fn failed_adopt_is_an_error_not_a_second_group() {
    let name = gname("adopt");
    let path = shm(&name);
    let mut kid = Kid::spawn("idle", &name, None, &[], &[]);
    assert_eq!(kid.line(), "ready");
    // Its stdin: alive, but a pipe, not a control memfd.
    plant(&path, &door_table(&[(kid.pid(), 0)]), 0o600, None);
    let before = snap(&path);
    let err = Group::open(&name).expect_err("started a second group beside a live door");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("member pid {}", kid.pid())) && msg.contains("second group"),
        "{msg}"
    );
    assert_eq!(snap(&path), before, "the door table was written");
    kid.finish();
    std::fs::remove_file(&path).unwrap();
}

/// Our own door table with a door forged to lead to another user's real control block:
/// that process runs as a user the group does not admit, so it is refused before its
/// descriptor is taken.
fn forged_door_to_another_users_process_is_refused() {
    if !need_root("forged_door_to_another_users_process_is_refused") {
        return;
    }
    let name = gname("forged");
    let path = shm(&name);
    let mut kid = Kid::spawn("hold", &name, Some(OTHER_UID), &[], &[]);
    let line = kid.line();
    let fd: u32 = line.strip_prefix("ready ").unwrap().parse().unwrap();
    // Replace its file with ours, whose one door leads to its control block.
    std::fs::remove_file(&path).unwrap();
    plant(&path, &door_table(&[(kid.pid(), fd)]), 0o600, None);
    let before = snap(&path);
    let err = Group::open(&name).expect_err("joined another user's control block");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("member pid {}", kid.pid()))
            && msg.contains(&format!("uid {OTHER_UID}")),
        "{msg}"
    );
    assert_eq!(snap(&path), before);
    kid.finish();
    std::fs::remove_file(&path).unwrap();
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[
        (
            "planted_symlink_is_refused_and_its_target_untouched",
            planted_symlink_is_refused_and_its_target_untouched,
        ),
        (
            "foreign_owned_file_is_refused_untouched",
            foreign_owned_file_is_refused_untouched,
        ),
        (
            "foreign_garbage_is_refused_untouched",
            foreign_garbage_is_refused_untouched,
        ),
        ("permissive_mode_is_refused", permissive_mode_is_refused),
        (
            "root_does_not_join_another_users_group",
            root_does_not_join_another_users_group,
        ),
        (
            "failed_adopt_is_an_error_not_a_second_group",
            failed_adopt_is_an_error_not_a_second_group,
        ),
        (
            "forged_door_to_another_users_process_is_refused",
            forged_door_to_another_users_process_is_refused,
        ),
    ]);
}
