//! Looking at groups without touching them, and removing the caller's stale named files.
//!
//! [`Group::inspect`] is what `ferry stat` shows. It never creates a file, never follows
//! a symbolic link, never takes a lock, never writes and never unlinks: the named file
//! is opened read-only with `O_NOFOLLOW`, its door table read with `pread`, and the
//! control block of the first live door (whose process runs as a user the file's owner
//! admits) is mapped read-only, so that nothing it does can write to it. Every
//! `/dev/shm/ferry.*` entry is reported as what it is: a live group, a stale table (no
//! live door), an empty file, garbage, or unreadable (a link, another user's file this
//! user cannot open, a door that cannot be taken), with the reason.
//!
//! [`Group::clean`] is `ferry clean`: it removes a named file only if this process's user
//! owns it, it is a regular file with one link, and under its lock it holds no live door
//! (a stale table, an empty file, or garbage). A group whose every member was killed
//! leaves such a file; so would a group whose members all lost their doors (a table
//! full with 255 doors), which this cannot tell from the file alone.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

use rustix::fs::{fstat, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use super::access::{kind_of, Admission};
use super::activity::MemberActivity;
use super::group::{named_path, pid_alive, read_table, DoorTable, Locked, TABLE_LEN};
use super::{Group, Member};
use crate::sys::fd::same_file;

/// A `/dev/shm/ferry.<name>` entry as [`Group::inspect`] found it.
#[derive(Debug)]
pub struct GroupFile {
    /// The group's name (the file's name without `ferry.`).
    pub name: String,
    /// The file's path.
    pub path: PathBuf,
    /// Owner uid of the entry itself (a link is not followed), if it exists.
    pub owner: Option<u32>,
    /// Its group id.
    pub gid: Option<u32>,
    /// Its permission bits.
    pub mode: Option<u32>,
    /// Its length in bytes.
    pub len: Option<u64>,
    /// True if another user owns it.
    pub foreign: bool,
    /// What it holds.
    pub state: GroupFileState,
}

impl GroupFile {
    /// True if the entry could be read: a live group, a stale table or an empty file.
    pub fn readable(&self) -> bool {
        matches!(
            self.state,
            GroupFileState::Live(_) | GroupFileState::Stale { .. } | GroupFileState::Empty
        )
    }
}

/// What a group's named file holds.
#[derive(Debug)]
pub enum GroupFileState {
    /// A group with a live member: its control block, mapped read-only.
    Live(GroupView),
    /// A door table in which no door is live: its members were killed (or lost their
    /// doors). `doors` is how many dead doors it names. [`Group::clean`] removes it.
    Stale {
        /// Dead doors in the table.
        doors: usize,
    },
    /// An empty file: a group being created, or its creator died before writing it.
    Empty,
    /// There is no such file.
    Missing,
    /// Not a door table: what is wrong with it.
    Garbage(String),
    /// It cannot be read: why (a symbolic link, not a regular file, permission denied,
    /// or live doors that cannot be taken).
    Unreadable(String),
}

/// A group opened to be looked at, never joined: its control block is mapped read-only,
/// and dropping it writes nothing.
#[derive(Debug)]
pub struct GroupView {
    group: Group,
}

impl GroupView {
    /// The group's name.
    pub fn name(&self) -> &str {
        self.group.name()
    }

    /// Size of every lot in the group.
    pub fn lot_size(&self) -> usize {
        self.group.lot_size()
    }

    /// What pages back the group's lots (see [`Group::pages`]).
    pub fn pages(&self) -> crate::Pages {
        self.group.pages()
    }

    /// The live members (see [`Group::members`]).
    pub fn members(&self) -> Vec<Member> {
        self.group.members()
    }

    /// What each member publishes about its paths and channels (see [`Group::activity`]).
    pub fn activity(&self) -> Vec<MemberActivity> {
        self.group.activity()
    }

    /// The group, read-only (for the layers above that read its control block; the
    /// service table's view is in `crate::service`).
    pub(crate) fn group(&self) -> &Group {
        &self.group
    }
}

/// What [`Group::clean`] did with one named file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cleaned {
    /// The group's name.
    pub name: String,
    /// The file's path.
    pub path: PathBuf,
    /// True if it was removed.
    pub removed: bool,
    /// Why it was removed or left.
    pub why: String,
}

/// The group names of every `/dev/shm/ferry.*` entry, sorted.
fn names() -> io::Result<Vec<String>> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")?
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_prefix("ferry.").map(str::to_owned)
        })
        .filter(|n| !n.is_empty())
        .collect();
    v.sort();
    Ok(v)
}

fn valid_name(name: &str) -> bool {
    !(name.is_empty() || name.contains('/') || name.contains('\0') || name.len() > 200)
}

const LOOK: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC)
    .union(OFlags::NONBLOCK);

impl Group {
    /// Looks at group `name` without changing anything (see [`GroupFileState`]).
    pub fn inspect(name: &str) -> GroupFile {
        let path = named_path(name);
        let mut f = GroupFile {
            name: name.to_owned(),
            path: path.clone(),
            owner: None,
            gid: None,
            mode: None,
            len: None,
            foreign: false,
            state: GroupFileState::Missing,
        };
        if !valid_name(name) {
            f.state = GroupFileState::Unreadable("not a valid group name".into());
            return f;
        }
        let me = rustix::process::geteuid().as_raw();
        let note = |f: &mut GroupFile, st: &Stat| {
            f.owner = Some(st.st_uid);
            f.gid = Some(st.st_gid);
            f.mode = Some(st.st_mode & 0o7777);
            f.len = Some(st.st_size as u64);
            f.foreign = st.st_uid != me;
        };
        crate::sys::count();
        let st = match rustix::fs::lstat(&path) {
            Ok(st) => st,
            Err(Errno::NOENT) => return f,
            Err(e) => {
                f.state = GroupFileState::Unreadable(format!("cannot stat it: {e}"));
                return f;
            }
        };
        note(&mut f, &st);
        let unreadable = |f: &mut GroupFile, why: String| {
            f.state = GroupFileState::Unreadable(why);
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Symlink => {
                let to = std::fs::read_link(&path)
                    .map(|t| t.display().to_string())
                    .unwrap_or_else(|_| "?".into());
                unreadable(
                    &mut f,
                    format!("it is a symbolic link (to {to}), not a group's file; not followed"),
                );
                return f;
            }
            _ => {
                unreadable(
                    &mut f,
                    format!("it is {}, not a group's file", kind_of(&st)),
                );
                return f;
            }
        }
        crate::sys::count();
        let file = match rustix::fs::open(&path, LOOK, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(Errno::NOENT) => return f,
            Err(Errno::ACCESS) => {
                unreadable(
                    &mut f,
                    format!(
                        "permission denied: it is owned by uid {}, mode {:04o} (another \
                         user's group)",
                        st.st_uid,
                        st.st_mode & 0o7777
                    ),
                );
                return f;
            }
            Err(Errno::LOOP) => {
                unreadable(&mut f, "it is a symbolic link; not followed".into());
                return f;
            }
            Err(e) => {
                unreadable(&mut f, format!("cannot open it: {e}"));
                return f;
            }
        };
        let st = match fstat(&file) {
            Ok(st) => st,
            Err(e) => {
                unreadable(&mut f, format!("cannot stat it: {e}"));
                return f;
            }
        };
        note(&mut f, &st);
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            unreadable(
                &mut f,
                format!("it is {}, not a group's file", kind_of(&st)),
            );
            return f;
        }
        if st.st_nlink != 1 {
            unreadable(
                &mut f,
                format!("it has {} hard links (a group's file has one)", st.st_nlink),
            );
            return f;
        }
        // Read without the lock; a table being written may not parse at first.
        let mut table = DoorTable::Invalid;
        for attempt in 0..3 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            table = match read_table(file.as_fd()) {
                Ok(t) => t,
                Err(e) => {
                    unreadable(&mut f, format!("cannot read it: {e}"));
                    return f;
                }
            };
            if table != DoorTable::Invalid {
                break;
            }
        }
        let doors = match table {
            DoorTable::Valid(doors) => doors,
            DoorTable::Empty => {
                f.state = GroupFileState::Empty;
                return f;
            }
            DoorTable::Invalid => {
                let len = fstat(&file).map(|s| s.st_size).unwrap_or(st.st_size);
                f.state = GroupFileState::Garbage(format!(
                    "{len} bytes that are not a ferry door table (a table is {TABLE_LEN} \
                     bytes and starts with FERRYDOR)"
                ));
                return f;
            }
        };
        let admission = Admission {
            me,
            owner: st.st_uid,
            gid: (st.st_mode & 0o060 != 0).then_some(st.st_gid),
        };
        f.state = match Group::look(name, path, file, admission) {
            Ok(Some(group)) => GroupFileState::Live(GroupView { group }),
            Ok(None) => GroupFileState::Stale {
                doors: doors.iter().filter(|d| d.pid != 0).count(),
            },
            Err(why) => GroupFileState::Unreadable(why),
        };
        f
    }

    /// [`inspect`](Self::inspect)s every `/dev/shm/ferry.*` entry, sorted by name.
    pub fn inspect_all() -> io::Result<Vec<GroupFile>> {
        Ok(names()?.iter().map(|n| Group::inspect(n)).collect())
    }

    /// Removes group `name`'s named file if it is this user's and has no live member
    /// (see [`GroupFileState`]); says what it did and why.
    pub fn clean(name: &str) -> Cleaned {
        let path = named_path(name);
        let (removed, why) = match clean_one(name, &path) {
            Ok(why) => (true, why),
            Err(why) => (false, why),
        };
        Cleaned {
            name: name.to_owned(),
            path,
            removed,
            why,
        }
    }

    /// [`clean`](Self::clean)s every `/dev/shm/ferry.*` entry, sorted by name.
    pub fn clean_all() -> io::Result<Vec<Cleaned>> {
        Ok(names()?.iter().map(|n| Group::clean(n)).collect())
    }
}

/// Removes the named file at `path` if it is ours and stale: `Ok(why)` if removed,
/// `Err(why)` if left.
fn clean_one(name: &str, path: &std::path::Path) -> Result<String, String> {
    if !valid_name(name) {
        return Err("not a valid group name".into());
    }
    let me = rustix::process::geteuid().as_raw();
    let check = |st: &Stat| -> Result<(), String> {
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(format!("it is {}, not a group's file", kind_of(st)));
        }
        if st.st_uid != me {
            return Err(format!(
                "it is owned by uid {}, not by you (uid {me})",
                st.st_uid
            ));
        }
        if st.st_nlink != 1 {
            return Err(format!("it has {} hard links", st.st_nlink));
        }
        Ok(())
    };
    crate::sys::count();
    match rustix::fs::lstat(path) {
        Ok(st) => check(&st)?,
        Err(Errno::NOENT) => return Err("no such file".into()),
        Err(e) => return Err(format!("cannot stat it: {e}")),
    }
    crate::sys::count();
    let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let file = match rustix::fs::open(path, flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(e) => return Err(format!("cannot open it: {e}")),
    };
    check(&fstat(&file).map_err(|e| format!("cannot stat it: {e}"))?)?;
    let Ok(Some(_lock)) = Locked::take(&file, Duration::from_secs(1)) else {
        return Err("it is locked by another process (a member opening or leaving)".into());
    };
    if !same_file(file.as_fd(), path).unwrap_or(false) {
        return Err("it was replaced while being cleaned".into());
    }
    let why = match read_table(file.as_fd()).map_err(|e| format!("cannot read it: {e}"))? {
        DoorTable::Valid(doors) => {
            let live: Vec<String> = doors
                .iter()
                .filter(|d| d.pid != 0 && pid_alive(d.pid, d.start))
                .map(|d| d.pid.to_string())
                .collect();
            if !live.is_empty() {
                return Err(format!(
                    "it has {} live member(s) (pid {})",
                    live.len(),
                    live.join(", ")
                ));
            }
            let dead = doors.iter().filter(|d| d.pid != 0).count();
            format!("stale: none of its {dead} door(s) is live")
        }
        DoorTable::Empty => "empty: its creator died before writing its table".to_owned(),
        DoorTable::Invalid => "garbage: not a ferry door table".to_owned(),
    };
    crate::sys::count();
    std::fs::remove_file(path).map_err(|e| format!("cannot remove it: {e}"))?;
    Ok(why)
}
