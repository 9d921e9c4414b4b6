//! Helpers shared by the named-file and access-policy tests: other users' processes
//! (this test binary re-executed under another uid, which needs no account), snapshots
//! of files, and hand-written door tables.
#![allow(dead_code)]

#[path = "../runner/mod.rs"]
mod runner;
// Not every binary that shares these helpers has a runner of its own.
#[allow(unused_imports)]
pub use runner::run;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

/// A uid no account uses, for "another user".
pub const OTHER_UID: u32 = 54321;
/// A second such uid.
pub const THIRD_UID: u32 = 54322;
/// A gid no group uses, for the shared Unix group.
pub const SHARED_GID: u32 = 54320;

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Prints why a test that needs root does nothing, and says whether to go on.
pub fn need_root(test: &str) -> bool {
    if !is_root() {
        println!("    {test}: skipped: needs root to act as other users");
    }
    is_root()
}

pub fn shm(name: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ferry.{name}"))
}

/// Everything about a path that a write, a chmod, a chown, an unlink or a replacement
/// would change (the entry itself: a link is not followed).
#[derive(Debug, PartialEq, Eq)]
pub struct Snap {
    pub ino: u64,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub len: u64,
    pub mtime: (i64, i64),
    pub link: Option<PathBuf>,
    /// A hash of the contents (FNV-1a), so that a failed comparison prints briefly.
    pub bytes: Option<u64>,
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// A snapshot of `path`, or `None` if there is nothing there.
pub fn snap(path: &Path) -> Option<Snap> {
    let m = std::fs::symlink_metadata(path).ok()?;
    let link = m
        .file_type()
        .is_symlink()
        .then(|| std::fs::read_link(path).unwrap());
    Some(Snap {
        ino: m.ino(),
        uid: m.uid(),
        gid: m.gid(),
        mode: m.mode(),
        len: m.len(),
        mtime: (m.mtime(), m.mtime_nsec()),
        bytes: m
            .file_type()
            .is_file()
            .then(|| fnv(&std::fs::read(path).unwrap())),
        link,
    })
}

/// Writes `bytes` to a new file at `path` with `mode`, owned by `uid` (if given).
pub fn plant(path: &Path, bytes: &[u8], mode: u32, uid: Option<u32>) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    if let Some(u) = uid {
        std::os::unix::fs::chown(path, Some(u), None).unwrap();
    }
}

/// Start time of process `pid` (field 22 of /proc/PID/stat), as a door records it.
pub fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

/// A door table (format of `region::group`) holding `doors` as (pid, fd).
pub fn door_table(doors: &[(u32, u32)]) -> Vec<u8> {
    const DOORS: usize = 255;
    let mut b = Vec::new();
    b.extend_from_slice(&u64::from_le_bytes(*b"FERRYDOR").to_ne_bytes());
    b.extend_from_slice(&1u32.to_ne_bytes());
    b.extend_from_slice(&(DOORS as u32).to_ne_bytes());
    for &(pid, fd) in doors {
        b.extend_from_slice(&pid.to_ne_bytes());
        b.extend_from_slice(&fd.to_ne_bytes());
        b.extend_from_slice(&start_time(pid).to_ne_bytes());
    }
    b.resize(16 + DOORS * 16, 0);
    b
}

/// A child process: this test binary in a role, as `uid` (if given) with exactly the
/// supplementary `groups`.
pub struct Kid {
    pub child: Child,
    pub out: BufReader<ChildStdout>,
}

impl Kid {
    pub fn spawn(
        role: &str,
        group: &str,
        uid: Option<u32>,
        groups: &[u32],
        env: &[(&str, String)],
    ) -> Kid {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.env("FERRY_TEST_ROLE", role)
            .env("FERRY_TEST_GROUP", group)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let groups: Vec<libc::gid_t> = groups.to_vec();
        // SAFETY: between fork and exec only async-signal-safe calls (setgroups,
        // setresgid, setresuid) on values prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(u) = uid {
                    // Its primary group: the first supplementary one, or its uid.
                    let g = groups.first().copied().unwrap_or(u);
                    if libc::setresgid(g, g, g) != 0 || libc::setresuid(u, u, u) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Kid { child, out }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn line(&mut self) -> String {
        let mut s = String::new();
        self.out.read_line(&mut s).unwrap();
        s.trim().to_owned()
    }

    /// Tells it to finish, and waits.
    pub fn finish(mut self) {
        if let Some(mut i) = self.child.stdin.take() {
            let _ = writeln!(i, "bye");
        }
        let _ = self.child.wait();
    }
}

/// The descriptor number of this process's copy of group `name`'s control memfd.
pub fn control_fd(name: &str) -> u32 {
    let want = format!("/memfd:ferry.{name} (deleted)");
    for e in std::fs::read_dir("/proc/self/fd").unwrap() {
        let e = e.unwrap();
        if std::fs::read_link(e.path())
            .ok()
            .and_then(|l| l.to_str().map(str::to_owned))
            == Some(want.clone())
        {
            return e.file_name().to_str().unwrap().parse().unwrap();
        }
    }
    panic!("no control memfd of {name}");
}

/// Waits for a line on stdin (or its end).
pub fn wait_stdin() {
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
}
