//! Who may use a group: the access policy of its named file and of the processes whose
//! descriptors a member takes.
//!
//! `/dev/shm` is shared by every user, so the named file `ferry.<name>` may be anything
//! another user planted there: a symbolic link to a file this process can write, a file
//! of their own (garbage, or a door table whose doors lead to their processes), a file
//! anyone may write. So the file is opened with `O_NOFOLLOW` (never created through a
//! link) and checked after the open with `fstat`: a regular file with one link, owned by
//! this process's user (or shared with an admitted Unix group, or another user's when
//! the caller asked for that), and with no permission beyond the policy's mode. Anything
//! else is refused with the path and the reason, and is never truncated or removed.
//!
//! The policy then follows the descriptors: a door (or a handshake peer) is only used if
//! its process runs as a user the group admits, read from `/proc/PID/status` after its
//! pidfd is open (if the pid is reused meanwhile, taking the descriptor through the
//! pidfd fails). Root's processes are always admitted: root can read and write any
//! member's memory anyway.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{fchmod, fchown, fstat, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// Who may open a group's named file and be one of its members.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum GroupAccess {
    /// Only the user who owns the group (the default): the named file is mode 0600, and
    /// a door or peer must run as that user (or as root).
    #[default]
    Owner,
    /// The owner and the members of the Unix group with this gid, for pipelines whose
    /// processes run as different users: the named file is mode 0660 and belongs to that
    /// group. Every process of the group must open it with this same policy. Taking a
    /// member's descriptors still needs ptrace rights over it (see
    /// [`Group::open_with`](crate::Group::open_with)).
    UnixGroup(u32),
}

impl GroupAccess {
    /// The named file's mode under this policy; a file with any other bit is refused.
    pub fn mode(self) -> u32 {
        match self {
            GroupAccess::Owner => 0o600,
            GroupAccess::UnixGroup(_) => 0o660,
        }
    }

    fn describe(self) -> String {
        match self {
            GroupAccess::Owner => "owner only, mode 0600".to_owned(),
            GroupAccess::UnixGroup(g) => format!("owner and Unix group {g}, mode 0660"),
        }
    }
}

/// This process's effective ids.
#[derive(Clone, Debug)]
pub(crate) struct Ids {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Ids {
    pub fn mine() -> io::Result<Ids> {
        Ok(Ids {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            groups: rustix::process::getgroups()?
                .into_iter()
                .map(|g| g.as_raw())
                .collect(),
        })
    }

    pub fn in_group(&self, g: u32) -> bool {
        self.gid == g || self.groups.contains(&g)
    }
}

/// The effective uid of process `pid` and all its gids (effective and supplementary),
/// from `/proc/PID/status`.
pub(crate) fn process_ids(pid: u32) -> io::Result<(u32, Vec<u32>)> {
    crate::sys::count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad /proc status");
    let field = |name: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| {
                v.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    // Uid: real, effective, saved, filesystem.
    let uid = *field("Uid:").get(1).ok_or_else(bad)?;
    let mut gids = field("Groups:");
    gids.push(*field("Gid:").get(1).ok_or_else(bad)?);
    Ok((uid, gids))
}

/// Who an open group admits as a door or a peer: root, this process's user, the named
/// file's owner, and the members of `gid` if the group is shared with one.
#[derive(Clone, Debug)]
pub(crate) struct Admission {
    pub me: u32,
    pub owner: u32,
    pub gid: Option<u32>,
}

impl Admission {
    /// Ok if process `pid` runs as a user this group admits; else why not.
    pub fn check(&self, pid: u32) -> std::result::Result<(), String> {
        let (uid, gids) =
            process_ids(pid).map_err(|e| format!("cannot read its credentials: {e}"))?;
        if uid == 0 || uid == self.me || uid == self.owner {
            return Ok(());
        }
        if let Some(g) = self.gid {
            if gids.contains(&g) {
                return Ok(());
            }
        }
        Err(format!(
            "it runs as uid {uid}, which this group does not admit (owner uid {}{})",
            self.owner,
            match self.gid {
                Some(g) => format!(", Unix group {g}"),
                None => ", no Unix group".to_owned(),
            }
        ))
    }
}

/// A refusal of the named file at `path`.
pub(crate) fn refused(path: &Path, why: impl Into<String>) -> Error {
    Error::Untrusted {
        path: path.to_owned(),
        why: why.into(),
    }
}

/// A short description of a file's type.
pub(crate) fn kind_of(st: &Stat) -> &'static str {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "a file of unknown type",
    }
}

/// Checks an opened named file's status against the policy: a regular file with one
/// link, ours (or shared with our admitted group, or another user's if `foreign_ok`),
/// and no permission bit beyond the policy's mode.
pub(crate) fn check_file(
    st: &Stat,
    me: &Ids,
    access: GroupAccess,
    foreign_ok: bool,
) -> std::result::Result<(), String> {
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(format!("it is {}, not a ferry door table", kind_of(st)));
    }
    if st.st_nlink != 1 {
        return Err(format!(
            "it has {} hard links (a group's file has exactly one; a link may point it at \
             another file)",
            st.st_nlink
        ));
    }
    let mode = st.st_mode & 0o7777;
    let shared_with_us = matches!(access, GroupAccess::UnixGroup(g)
        if st.st_gid == g && me.in_group(g));
    if st.st_uid != me.uid && !shared_with_us && !foreign_ok {
        let hint = match access {
            GroupAccess::UnixGroup(g) if st.st_gid == g => {
                format!("this process (uid {}) is not in Unix group {g}", me.uid)
            }
            _ => format!("not by this process's user (uid {})", me.uid),
        };
        return Err(format!(
            "it is owned by uid {} (mode {mode:04o}), {hint}: another user made it, so this \
             is their group or a squatter's file; remove it or pick another name \
             (GroupConfig::allow_foreign_owner joins it anyway)",
            st.st_uid
        ));
    }
    if mode & !access.mode() != 0 {
        return Err(format!(
            "it has mode {mode:04o}, which grants more than this opener's access policy ({})",
            access.describe()
        ));
    }
    if let GroupAccess::UnixGroup(g) = access {
        if mode & 0o060 != 0 && st.st_gid != g {
            return Err(format!(
                "it is shared with Unix group {}, not with {g} as this opener's policy says",
                st.st_gid
            ));
        }
    }
    Ok(())
}

/// How [`open_named`] found the file.
pub(crate) struct Named {
    pub fd: OwnedFd,
    pub st: Stat,
}

/// Opens (or creates, with the policy's mode and group) the named file at `path` for
/// reading and writing without following a symbolic link, and checks it.
pub(crate) fn open_named(
    path: &Path,
    me: &Ids,
    access: GroupAccess,
    foreign_ok: bool,
) -> Result<Named> {
    let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let io_err = |e: Errno, what: &str| {
        Error::Io(io::Error::new(
            io::Error::from(e).kind(),
            format!("{what} {}: {e}", path.display()),
        ))
    };
    let mut denied = 0;
    for _ in 0..100 {
        crate::sys::count();
        let err = match rustix::fs::open(path, flags, Mode::empty()) {
            Ok(fd) => {
                let st = fstat(&fd)?;
                check_file(&st, me, access, foreign_ok).map_err(|why| refused(path, why))?;
                return Ok(Named { fd, st });
            }
            Err(e) => e,
        };
        match err {
            Errno::NOENT => {}
            Errno::LOOP => {
                return Err(refused(
                    path,
                    "it is a symbolic link; ferry never follows one there (another user may \
                     have planted it to make this process write elsewhere)",
                ))
            }
            Errno::ACCESS => {
                // A member sharing the group with us may be between creating the file
                // and widening its mode: look again a few times.
                denied += 1;
                if denied < 20 {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    continue;
                }
                let what = match rustix::fs::lstat(path) {
                    Ok(st) => format!(
                        "permission denied: it is owned by uid {}, group {}, mode {:04o}",
                        st.st_uid,
                        st.st_gid,
                        st.st_mode & 0o7777
                    ),
                    Err(_) => "permission denied".to_owned(),
                };
                return Err(refused(path, what));
            }
            e => return Err(io_err(e, "opening")),
        }
        // Not there: create it, exclusively (O_EXCL never follows a link either).
        crate::sys::count();
        let fd = match rustix::fs::open(
            path,
            flags | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => fd,
            // Someone else made it (or planted a link) meanwhile: look at what is there.
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(io_err(e, "creating")),
        };
        if let Err(e) = prepare(&fd, access) {
            // Ours and empty: no one has used it yet (a joiner that opened it meanwhile
            // sees it replaced and starts over).
            crate::sys::count();
            let _ = std::fs::remove_file(path);
            return Err(refused(path, e));
        }
        let st = fstat(&fd)?;
        return Ok(Named { fd, st });
    }
    Err(Error::BadGroup(format!(
        "{} kept appearing and disappearing while opening",
        path.display()
    )))
}

/// Gives a new named file the policy's group and mode (the mode exactly, whatever the
/// umask took away at creation).
fn prepare(fd: &OwnedFd, access: GroupAccess) -> std::result::Result<(), String> {
    if let GroupAccess::UnixGroup(g) = access {
        crate::sys::count();
        fchown(fd.as_fd(), None, Some(rustix::fs::Gid::from_raw(g))).map_err(|e| {
            format!("cannot give it to Unix group {g}: {e} (is this user a member of it?)")
        })?;
    }
    crate::sys::count();
    fchmod(fd.as_fd(), Mode::from_raw_mode(access.mode()))
        .map_err(|e| format!("cannot set its mode to {:04o}: {e}", access.mode()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_ids_are_read_from_proc() {
        let me = Ids::mine().unwrap();
        let (uid, gids) = process_ids(std::process::id()).unwrap();
        assert_eq!(uid, me.uid);
        assert!(gids.contains(&me.gid));
    }
}
