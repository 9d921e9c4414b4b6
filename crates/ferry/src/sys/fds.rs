//! The descriptors a message or a container carries as cargo, as the receiver holds
//! them: [`Fds`], and the kinds it tells apart ([`FdKind`], [`FdKinds`]). How they
//! travel is the channel's (`channel::fds`) and the containers' business.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::error::{Error, Result};

/// Most descriptors one message may carry as cargo.
pub const MAX_FDS: usize = 64;

/// What kind of file a descriptor received as cargo is, as the receiver finds it from
/// the kernel (never as the sender says).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FdKind {
    /// A memfd on shmem (`memfd_create(2)` without `MFD_HUGETLB`), sealed or not.
    Memfd,
    /// A dma-buf (its `/proc/self/fd` link reads `/dmabuf:...`); opaque to ferry.
    DmaBuf,
    /// A sync_file fence (`anon_inode:sync_file`).
    SyncFile,
    /// An eventfd.
    EventFd,
    /// A pipe or FIFO end.
    Pipe,
    /// A socket of any family.
    Socket,
    /// Anything else: a regular file, a directory, a device, a hugetlb memfd, a pidfd,
    /// an epoll set... Refused unless the receiver's [`FdKinds`] includes it.
    Other,
}

impl FdKind {
    const ALL: [FdKind; 7] = [
        FdKind::Memfd,
        FdKind::DmaBuf,
        FdKind::SyncFile,
        FdKind::EventFd,
        FdKind::Pipe,
        FdKind::Socket,
        FdKind::Other,
    ];

    fn bit(self) -> u8 {
        1 << self as u8
    }

    /// Its name, as in error messages (`"memfd"`, `"eventfd"`, ...).
    ///
    /// ```
    /// assert_eq!(ferry::FdKind::Memfd.name(), "memfd");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            FdKind::Memfd => "memfd",
            FdKind::DmaBuf => "dma-buf",
            FdKind::SyncFile => "sync_file",
            FdKind::EventFd => "eventfd",
            FdKind::Pipe => "pipe",
            FdKind::Socket => "socket",
            FdKind::Other => "other file",
        }
    }

    /// What the kernel says `fd` is. Reads only cached attributes (`statx(2)` with
    /// `AT_STATX_DONT_SYNC`) and the `/proc/self/fd` link: nothing that another process
    /// can make wait.
    ///
    /// ```
    /// let (r, _w) = std::io::pipe()?;
    /// assert_eq!(ferry::FdKind::of(std::os::fd::AsFd::as_fd(&r)), ferry::FdKind::Pipe);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn of(fd: BorrowedFd<'_>) -> FdKind {
        classify(fd)
    }
}

impl fmt::Display for FdKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The kinds of descriptor a receiver accepts as cargo. The default accepts every kind
/// but [`FdKind::Other`]; a receiver that handles only memfds says
/// `FdKinds::only(FdKind::Memfd)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FdKinds(u8);

impl FdKinds {
    /// Every kind, [`FdKind::Other`] included.
    pub const ANY: FdKinds = FdKinds(0x7f);

    /// Just `kind`.
    ///
    /// ```
    /// use ferry::{FdKind, FdKinds};
    /// let k = FdKinds::only(FdKind::Memfd);
    /// assert!(k.contains(FdKind::Memfd) && !k.contains(FdKind::EventFd));
    /// ```
    pub fn only(kind: FdKind) -> FdKinds {
        FdKinds(kind.bit())
    }

    /// These kinds and `kind`.
    ///
    /// ```
    /// use ferry::{FdKind, FdKinds};
    /// let k = FdKinds::only(FdKind::Memfd).with(FdKind::SyncFile);
    /// assert!(k.contains(FdKind::SyncFile));
    /// ```
    pub fn with(self, kind: FdKind) -> FdKinds {
        FdKinds(self.0 | kind.bit())
    }

    /// Whether `kind` is among these.
    ///
    /// ```
    /// use ferry::{FdKind, FdKinds};
    /// assert!(!FdKinds::default().contains(FdKind::Other));
    /// assert!(FdKinds::ANY.contains(FdKind::Other));
    /// ```
    pub fn contains(self, kind: FdKind) -> bool {
        self.0 & kind.bit() != 0
    }
}

impl Default for FdKinds {
    fn default() -> Self {
        FdKinds(FdKinds::ANY.0 & !FdKind::Other.bit())
    }
}

impl fmt::Debug for FdKinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(FdKind::ALL.iter().filter(|k| self.contains(**k)))
            .finish()
    }
}

/// The descriptors a received message carried: this process's own duplicates, closed
/// when the `Fds` drops, except those [taken](Self::take) out.
///
/// Each shares its open file description with the sender's (as with `SCM_RIGHTS`): the
/// file offset, the status flags (`O_NONBLOCK`) and, for a memfd, its access mode and
/// seals are the sender's. A sender that wants the bytes behind a memfd unchanged seals
/// it (`F_SEAL_WRITE`) before sending.
///
/// ```
/// # use std::time::Duration;
/// # use std::os::fd::AsFd;
/// # fn main() -> ferry::Result<()> {
/// # let group = ferry::Group::open(&format!("doc-fds-{}", std::process::id()))?;
/// # let (a, b) = (group.join()?, group.join()?);
/// # let (a2, to) = (a.clone(), b.id());
/// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
/// # let mut rx = b.accept(Duration::from_secs(5))?;
/// # let tx = connecting.join().unwrap()?;
/// let (r, mut w) = std::io::pipe()?;
/// let path = a.path(ferry::PathConfig::default())?;
/// tx.send_with_fds(&path.alloc(4)?.freeze(), &[r.as_fd()])?;
/// let (_bytes, mut fds) = rx.recv_with_fds_timeout(Duration::from_secs(5))?;
/// assert_eq!(fds.len(), 1);
/// assert_eq!(fds.kind(0), Some(ferry::FdKind::Pipe));
/// let mine: std::os::fd::OwnedFd = fds.take(0).expect("not taken yet");
/// std::io::Write::write_all(&mut w, b"hi")?;
/// let mut got = [0u8; 2];
/// std::io::Read::read_exact(&mut std::fs::File::from(mine), &mut got)?;
/// assert_eq!(&got, b"hi");
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct Fds {
    fds: Vec<(FdKind, Option<OwnedFd>)>,
}

impl fmt::Debug for Fds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(
                self.fds
                    .iter()
                    .map(|(k, fd)| (k, fd.as_ref().map(|f| f.as_raw_fd()))),
            )
            .finish()
    }
}

impl Fds {
    /// How many descriptors the message carried (taken ones included).
    ///
    /// ```
    /// assert_eq!(ferry::Fds::default().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.fds.len()
    }

    /// True if the message carried none.
    ///
    /// ```
    /// assert!(ferry::Fds::default().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }

    /// Descriptor `i`, borrowed; `None` if there is no such one or it was taken.
    ///
    /// ```
    /// assert!(ferry::Fds::default().get(0).is_none());
    /// ```
    pub fn get(&self, i: usize) -> Option<BorrowedFd<'_>> {
        self.fds.get(i)?.1.as_ref().map(|f| f.as_fd())
    }

    /// What descriptor `i` is (also once taken); `None` past the end.
    ///
    /// ```
    /// assert_eq!(ferry::Fds::default().kind(0), None);
    /// ```
    pub fn kind(&self, i: usize) -> Option<FdKind> {
        self.fds.get(i).map(|(k, _)| *k)
    }

    /// Takes descriptor `i` out: the caller owns it and it outlives the message.
    /// `None` if there is no such one or it was taken already.
    ///
    /// ```
    /// assert!(ferry::Fds::default().take(0).is_none());
    /// ```
    pub fn take(&mut self, i: usize) -> Option<OwnedFd> {
        self.fds.get_mut(i)?.1.take()
    }

    /// `fds` (this process's own, received some other way), each classified and
    /// refused unless of one of `kinds`; on refusal all of them are closed.
    pub(crate) fn checked(fds: Vec<OwnedFd>, kinds: FdKinds) -> Result<Fds> {
        let mut out = Fds {
            fds: Vec::with_capacity(fds.len()),
        };
        for (index, fd) in fds.into_iter().enumerate() {
            let kind = FdKind::of(fd.as_fd());
            if !kinds.contains(kind) {
                return Err(Error::FdRefused { index, kind });
            }
            out.fds.push((kind, Some(fd)));
        }
        Ok(out)
    }

    /// Every descriptor not taken yet, in order.
    ///
    /// ```
    /// assert!(ferry::Fds::default().into_vec().is_empty());
    /// ```
    pub fn into_vec(self) -> Vec<OwnedFd> {
        self.fds.into_iter().filter_map(|(_, f)| f).collect()
    }
}

/// What kind of file `fd` is, for descriptors received as cargo: from the kernel's cached
/// attributes ([`statx_cached`](super::fd::statx_cached)) and the `/proc/self/fd` link only, so that nothing the
/// file's owner does can make this wait.
pub fn classify(fd: BorrowedFd<'_>) -> FdKind {
    let Ok(st) = super::fd::statx_cached(fd) else {
        return FdKind::Other;
    };
    let mode = st.stx_mode as u32;
    match mode & libc::S_IFMT {
        libc::S_IFIFO => return FdKind::Pipe,
        libc::S_IFSOCK => return FdKind::Socket,
        libc::S_IFREG if super::fd::check_memfd(fd).is_ok() => return FdKind::Memfd,
        _ => {}
    }
    super::count();
    let Ok(link) = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
        return FdKind::Other;
    };
    let link = link.as_os_str().as_encoded_bytes();
    if link == b"anon_inode:[eventfd]" {
        FdKind::EventFd
    } else if link == b"anon_inode:sync_file" {
        FdKind::SyncFile
    } else if link.starts_with(b"/dmabuf:") {
        FdKind::DmaBuf
    } else {
        FdKind::Other
    }
}
