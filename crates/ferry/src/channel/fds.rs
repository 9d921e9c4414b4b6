//! Descriptors as cargo: a message may carry file descriptors besides bytes.
//!
//! The sender duplicates each descriptor it sends and keeps the copies with the message
//! in flight; the numbers of those copies travel in a small table in the sender's own
//! lot, named by the ring entry ([`RawDesc::nfds`](super::desc::RawDesc::nfds) and
//! [`cargo`](super::desc::RawDesc::cargo)). A receiver that asks for the cargo takes
//! its own duplicates with `pidfd_getfd(2)` through the sender's pidfd (which the
//! channel already holds), finds what each is from the kernel's cached attributes and
//! its `/proc/self/fd` link (nothing is opened, read or waited on), and refuses kinds it
//! did not accept. The sender closes its copies when the message is released, or when
//! it learns that the receiver died; the kernel closes them if the sender dies. So no
//! descriptor outlives the message on either side unless the receiver [takes](Fds::take)
//! it out.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use super::desc::{Lots, RawDesc, MAX_FDS};
use crate::error::{BadDescriptor, Error, Result};
use crate::region::group::DomainId;
use crate::sys::fd::{dup_from, wait_readable};
pub use crate::sys::fds::{FdKind, FdKinds, Fds};

/// How long a receiver waits, after the sender's descriptor table refused a number, for
/// the sender's pidfd to say it exited (its files are closed a little before that).
const EXIT_GRACE: Duration = Duration::from_millis(200);

/// Takes the cargo `d` names from the sender whose pidfd is `pidfd`: its descriptor
/// table in the sender's lot `sender` is checked and copied out, each number duplicated
/// into this process and classified. Nothing is kept on error (what was duplicated is
/// closed).
pub(super) fn take(
    d: &RawDesc,
    lots: &mut impl Lots,
    sender: DomainId,
    pidfd: BorrowedFd<'_>,
    pid: u32,
    kinds: FdKinds,
) -> Result<Fds> {
    let n = d.nfds as usize;
    if n > MAX_FDS {
        return Err(BadDescriptor::Malformed("more descriptors than a message carries").into());
    }
    if d.cargo % 4 != 0 {
        return Err(BadDescriptor::Malformed("unaligned descriptor table").into());
    }
    let mut table = [0u8; 4 * MAX_FDS];
    let table = &mut table[..4 * n];
    // The numbers mean something only in the sender's process: the table must be in its
    // own lot, not in one it forwarded.
    lots.check(sender.slot, sender.generation, d.cargo, table.len() as u64)?;
    lots.read(sender.slot, sender.generation, d.cargo, table);
    let mut out = Vec::with_capacity(n);
    for b in table.chunks_exact(4) {
        let num = i32::from_le_bytes(b.try_into().expect("4 bytes"));
        if num < 0 {
            return Err(BadDescriptor::Malformed("negative descriptor number").into());
        }
        let fd = match dup_from(pidfd, num) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => return Err(e.into()),
            Err(_) => {
                // The sender keeps every number open until the message is released, so
                // only its death (or a lie) makes one missing.
                return Err(
                    if matches!(wait_readable(&[pidfd], Some(EXIT_GRACE)), Ok(Some(0))) {
                        Error::FdsLost { pid }
                    } else {
                        BadDescriptor::Malformed("descriptor number not open in the sender").into()
                    },
                );
            }
        };
        out.push(fd);
    }
    Fds::checked(out, kinds)
}

/// Checks what a sender is asked to send: at most [`MAX_FDS`].
pub(crate) fn check_count(n: usize) -> Result<()> {
    if n > MAX_FDS {
        return Err(Error::TooManyFds {
            count: n,
            max: MAX_FDS,
        });
    }
    Ok(())
}
