//! Error types of the ferry library.
//!
//! One enum for the whole crate, so callers can match on what went wrong whichever call
//! returned it; a failed syscall carries its [`std::io::Error`]. Why one enum and not a
//! type per operation: `docs/architecture.md`, "Errors".

use std::fmt;
use std::io;

/// Why a descriptor read from shared memory was refused.
///
/// Every descriptor another domain writes is validated before use; any of these means the
/// peer is buggy or hostile, and the message is dropped rather than trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadDescriptor {
    /// The descriptor names a lot this group does not know (or a stale generation of it).
    UnknownLot {
        /// Slot index named by the descriptor.
        slot: u16,
        /// Generation named by the descriptor.
        generation: u32,
    },
    /// An offset and length that do not lie inside the named lot.
    OutOfBounds {
        /// Slot index of the lot.
        slot: u16,
        /// Offset named by the descriptor.
        offset: u64,
        /// Length named by the descriptor.
        len: u64,
    },
    /// More fragments or continuation blocks than the protocol allows.
    TooManyFragments(u64),
    /// A fragment of length zero, or a message whose total length overflows.
    BadLength,
    /// The continuation chain visits the same block twice.
    Cycle,
    /// The fragment count promised by the header does not match the blocks found.
    CountMismatch {
        /// Count promised by the header.
        expected: u64,
        /// Count actually found.
        found: u64,
    },
    /// A release names a message that is not in flight.
    UnknownToken(u64),
    /// Other malformed field.
    Malformed(&'static str),
    /// A file descriptor a peer handed over (its lot, a channel's memory or eventfds, a
    /// container's pallet) is not what ferry can use safely: a FIFO, a directory, a
    /// socket, a device, a memfd that is not sealed against resizing or of the wrong
    /// size... It is refused before anything could block on it or map it.
    PeerFile {
        /// The peer's slot; for a container's pallet, the pallet's index.
        slot: u16,
        /// Generation of the peer's slot (0 for a pallet).
        generation: u32,
        /// The peer's process id (0 if unknown).
        pid: u32,
        /// Which descriptor: "lot", "channel memory", "eventfd", "pallet".
        what: &'static str,
        /// What is wrong with it.
        why: String,
    },
}

impl fmt::Display for BadDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownLot { slot, generation } => {
                write!(f, "unknown lot (slot {slot}, generation {generation})")
            }
            Self::OutOfBounds { slot, offset, len } => {
                write!(f, "span {offset}+{len} lies outside lot {slot}")
            }
            Self::TooManyFragments(n) => write!(f, "too many fragments or blocks ({n})"),
            Self::BadLength => write!(f, "zero or overflowing length"),
            Self::Cycle => write!(f, "continuation chain has a cycle"),
            Self::CountMismatch { expected, found } => {
                write!(f, "header promised {expected} fragments, found {found}")
            }
            Self::UnknownToken(t) => write!(f, "release of unknown message {t}"),
            Self::Malformed(what) => write!(f, "malformed descriptor: {what}"),
            Self::PeerFile {
                slot,
                pid,
                what: "pallet",
                why,
                ..
            } => write!(
                f,
                "peer process {pid}: its pallet {slot} descriptor is {why}"
            ),
            Self::PeerFile {
                slot,
                generation,
                pid,
                what,
                why,
            } => write!(
                f,
                "peer {slot}.{generation} (pid {pid}): its {what} descriptor is {why}"
            ),
        }
    }
}

/// Errors returned by ferry.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A syscall failed.
    Io(io::Error),
    /// The fixed address a lot must occupy is already mapped in this process.
    ///
    /// ferry never maps a lot elsewhere: every domain must see it at the same address.
    AddressInUse {
        /// The address that was taken.
        addr: usize,
        /// Length of the mapping that was asked for.
        len: usize,
    },
    /// The peer domain exited (or was killed) while the operation needed it.
    PeerGone {
        /// Process id of the peer.
        pid: u32,
    },
    /// The peer closed its end of the channel.
    Disconnected,
    /// The peer took the channel this domain offered, could not use it, and said why.
    Refused {
        /// Process id of the peer.
        pid: u32,
        /// What the peer found.
        why: String,
    },
    /// Another domain's lot cannot be mapped here: its address is still taken by the lot
    /// of an earlier domain of the same slot, which left, and whose messages something in
    /// this process still holds. Dropping them frees the address.
    LotAddressHeld {
        /// The slot.
        slot: u16,
        /// Generation of the domain whose lot was to be mapped.
        generation: u32,
        /// Its process id.
        pid: u32,
        /// Generation of the earlier domain whose lot is still mapped there.
        held: u32,
        /// The address.
        addr: usize,
    },
    /// A path allocator reached its quota: a receiver is holding too many of its fbufs.
    QuotaExceeded {
        /// Bytes outstanding on the path.
        outstanding: usize,
        /// The path's quota in bytes.
        quota: usize,
    },
    /// One message is larger than its path's quota allows, so no amount of releasing
    /// would make room for it: refused at once rather than reported as a full quota.
    MessageTooLarge {
        /// Bytes asked for.
        len: usize,
        /// Bytes of the span it needs (a power-of-two number of pages).
        span: usize,
        /// The path's quota in bytes.
        quota: usize,
    },
    /// The lot has no free span large enough.
    LotExhausted {
        /// Bytes that were asked for.
        requested: usize,
    },
    /// A lot of hugetlb pages (`Pages::HugeTlb`) could not reserve its
    /// huge pages: the administrator reserved too few (`vm.nr_hugepages`), or other
    /// processes took them.
    NoHugePages {
        /// Size of the lot, which it reserves whole.
        lot_size: usize,
        /// Huge pages free in the pool when it failed (`HugePages_Free`).
        free: u64,
    },
    /// The group has no free domain slot.
    GroupFull,
    /// The group cannot be opened: its named file stayed locked or kept being replaced,
    /// or its control block is not a ferry group of this version.
    BadGroup(String),
    /// A group's named file, or a process that would be a member, was refused for
    /// safety: a symbolic link, a file another user owns or made writable to others,
    /// a file that is not a door table and is not ours to remove, or a member running as
    /// a user the group's access policy does not admit. Nothing was changed.
    Untrusted {
        /// The group's named file.
        path: std::path::PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A descriptor from another domain failed validation.
    BadDescriptor(BadDescriptor),
    /// A channel's ring has no free slot: [`Sender::try_send`](crate::Sender::try_send)
    /// would have to wait. Not used for other tables (see [`Error::TableFull`]).
    Full,
    /// A blocking call's timeout passed before what it waited for happened.
    Timeout,
    /// A blocking call gave up because its caller's stop check said to (see
    /// [`Until::with_stop`](crate::Until::with_stop)).
    Interrupted,
    /// An argument was out of range, or does not name the kind of thing the call needs.
    ///
    /// Only for arguments: a state the call cannot proceed in has its own variant.
    InvalidArgument(&'static str),
    /// A table of fixed size has no free entry: a vcm endpoint's socket or command table,
    /// its submission queue, a domain's channel offers or its inbound-channel ledger.
    TableFull {
        /// Which table.
        table: &'static str,
    },
    /// The resource is used by an operation still in flight (a vcm socket, command or
    /// buffer range); try again once it completes.
    Busy {
        /// What is busy.
        what: &'static str,
    },
    /// An io_uring ticket whose operation its ring no longer holds: it was collected
    /// already.
    StaleTicket,
    /// A ticket or registered buffer that belongs to another io_uring ring.
    WrongRing,
    /// A handle that is not a live handle of this vcm endpoint: another endpoint's, or one
    /// released or removed since.
    UnknownHandle {
        /// What kind of handle.
        what: &'static str,
    },
    /// Something a ring registers once (its file table, its buffer pool) is registered
    /// already.
    AlreadyRegistered {
        /// What was registered.
        what: &'static str,
    },
    /// A registered-file slot that holds no file.
    EmptySlot {
        /// Index of the slot.
        index: u32,
    },
    /// A vcm loop command that was stopped; it cannot be activated again.
    Stopped,
    /// Channel memory a peer handed over is not a ferry channel this side can trust
    /// (wrong size, unsealed, bad magic or version, or a header that does not match the
    /// offer). The channel is refused.
    BadChannel(&'static str),
    /// A segment that is read-only where a writable one is needed.
    NotWritable,
    /// A container operation needs a pallet that is unloaded (mapped) right now.
    PalletUnloaded {
        /// Index of the pallet.
        pallet: usize,
    },
    /// The pallet is sealed against writing, so it cannot be filled or unloaded for write.
    Sealed {
        /// Index of the pallet.
        pallet: usize,
    },
    /// The running kernel lacks an io_uring (or userfaultfd) feature the operation needs.
    ///
    /// Found by probing (see `uring::Features`); where a fallback exists, ferry uses it
    /// and counts it in stats instead of returning this.
    Unsupported {
        /// The missing feature, e.g. `"SEND_ZC"` or `"SQPOLL"`.
        feature: &'static str,
        /// What the probe saw.
        why: String,
    },
    /// A service of this name is already offered in the group by a live domain.
    ServiceExists {
        /// The name asked for.
        name: String,
    },
    /// No live domain offers a service of this name (of the kind asked for).
    NoSuchService {
        /// The name asked for.
        name: String,
    },
    /// Every entry of the group's service table is in use by a live service.
    ServiceTableFull,
    /// The service already has its maximum of members (subscribers or clients).
    ServiceFull {
        /// The service's name.
        name: String,
    },
    /// This domain is already a member (subscriber or client) of the service.
    AlreadyMember {
        /// The service's name.
        name: String,
    },
    /// The service table in the control block is damaged or held: an entry failed
    /// validation, or its lock stayed taken (another member is buggy or hostile).
    BadServiceTable(&'static str),
    /// The server's handler failed this request (its status code, non-zero).
    RequestFailed {
        /// Status the server sent back.
        status: u32,
    },
    /// A calibration file (see `semantics::calibration`) has a line that cannot be read.
    BadCalibration {
        /// 1-based line number in the file's text.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// A data-passing operation was given a semantics of the other allocator (an
    /// application buffer with a system-allocated semantics, or the reverse).
    WrongSemantics {
        /// The semantics given (kebab-case name).
        semantics: &'static str,
        /// What the operation takes: `"application-allocated"`, `"system-allocated"`, or
        /// `"weak-integrity or system-allocated"` (input in place).
        needs: &'static str,
    },
    /// A received system buffer is the sender's pages, read-only: it cannot be output as a
    /// system buffer (forward its data, or make it writable first).
    ReceivedBuffer,
    /// A pallet index past the end of the container.
    NoSuchPallet {
        /// Index asked for.
        index: usize,
        /// Number of pallets in the container.
        count: usize,
    },
    /// A message was given more descriptors than one carries ([`crate::MAX_FDS`]).
    TooManyFds {
        /// Descriptors given.
        count: usize,
        /// Most one message carries.
        max: usize,
    },
    /// A received message carried a descriptor of a kind this receiver does not accept
    /// (see [`crate::FdKinds`]); the message was dropped and none of its descriptors kept.
    FdRefused {
        /// Its position in the message's descriptors.
        index: usize,
        /// What it is.
        kind: crate::FdKind,
    },
    /// The sender died before this receiver took the message's descriptors: the kernel
    /// closed the sender's copies, so they are gone. The message was dropped.
    FdsLost {
        /// Process id of the sender.
        pid: u32,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "system call failed: {e}"),
            Self::AddressInUse { addr, len } => write!(
                f,
                "address {addr:#x}..{:#x} is already mapped in this process; ferry maps lots only at their group-wide address",
                addr + len
            ),
            Self::PeerGone { pid } => write!(f, "peer process {pid} is gone"),
            Self::Disconnected => write!(f, "peer closed its end of the channel"),
            Self::Refused { pid, why } => {
                write!(f, "peer process {pid} refused the channel: {why}")
            }
            Self::LotAddressHeld {
                slot,
                generation,
                pid,
                held,
                addr,
            } => write!(
                f,
                "cannot map the lot of peer {slot}.{generation} (pid {pid}) at {addr:#x}: this process still holds messages of {slot}.{held}, an earlier domain of slot {slot} that left, whose lot is mapped there"
            ),
            Self::QuotaExceeded { outstanding, quota } => write!(
                f,
                "path quota exceeded: {outstanding} bytes outstanding of {quota}; a receiver is not releasing buffers"
            ),
            Self::MessageTooLarge { len, span, quota } => {
                if len > quota {
                    write!(f, "message of {len} bytes exceeds the path's quota of {quota} bytes")
                } else {
                    write!(
                        f,
                        "message of {len} bytes needs a span of {span} bytes (a power of two of pages), more than the path's quota of {quota} bytes"
                    )
                }
            }
            Self::LotExhausted { requested } => {
                write!(f, "lot exhausted: no free span of {requested} bytes")
            }
            Self::NoHugePages { lot_size, free } => write!(
                f,
                "a hugetlb lot of {} MiB needs {} huge pages of 2 MiB and the pool has {free} \
                 free (reserve more with sysctl vm.nr_hugepages, or use smaller lots)",
                lot_size >> 20,
                lot_size.div_ceil(2 << 20)
            ),
            Self::GroupFull => write!(f, "group has no free domain slot"),
            Self::BadGroup(why) => write!(f, "not a usable ferry group: {why}"),
            Self::Untrusted { path, why } => write!(f, "refusing {}: {why}", path.display()),
            Self::BadDescriptor(d) => write!(f, "bad descriptor from peer: {d}"),
            Self::Full => write!(f, "channel ring is full: sending now would have to wait"),
            Self::Timeout => write!(
                f,
                "timed out: the call's timeout passed before what it waited for happened"
            ),
            Self::Interrupted => write!(f, "interrupted: the caller's stop check ended the wait"),
            Self::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Self::TableFull { table } => write!(f, "the {table} is full"),
            Self::Busy { what } => write!(f, "{what} is in use by an operation in flight"),
            Self::StaleTicket => write!(f, "stale ticket: its operation was collected already"),
            Self::WrongRing => write!(f, "ticket or buffer belongs to another io_uring ring"),
            Self::UnknownHandle { what } => {
                write!(f, "{what} handle is not live in this endpoint")
            }
            Self::AlreadyRegistered { what } => write!(f, "{what} is already registered"),
            Self::EmptySlot { index } => write!(f, "registered-file slot {index} is empty"),
            Self::Stopped => write!(f, "the loop command was stopped"),
            Self::BadChannel(why) => write!(f, "not a usable ferry channel: {why}"),
            Self::NotWritable => write!(
                f,
                "segment is read-only where the operation needs a writable one"
            ),
            Self::PalletUnloaded { pallet } => {
                write!(f, "pallet {pallet} is unloaded (mapped); reload it first")
            }
            Self::Sealed { pallet } => write!(f, "pallet {pallet} is sealed against writing"),
            Self::Unsupported { feature, why } => {
                write!(f, "kernel feature {feature} is not available: {why}")
            }
            Self::ServiceExists { name } => {
                write!(f, "service {name:?} is already offered in this group")
            }
            Self::NoSuchService { name } => write!(f, "no live service named {name:?}"),
            Self::ServiceTableFull => write!(f, "the group's service table is full"),
            Self::ServiceFull { name } => write!(f, "service {name:?} has no room for a member"),
            Self::AlreadyMember { name } => {
                write!(f, "this domain is already a member of service {name:?}")
            }
            Self::BadServiceTable(why) => write!(f, "service table unusable: {why}"),
            Self::RequestFailed { status } => {
                write!(f, "the server's handler failed the request (status {status})")
            }
            Self::BadCalibration { line, why } => {
                write!(f, "calibration file, line {line}: {why}")
            }
            Self::WrongSemantics { semantics, needs } => {
                write!(f, "this operation takes a {needs} semantics, not {semantics}")
            }
            Self::ReceivedBuffer => write!(
                f,
                "a received buffer is the sender's pages and cannot be output as a system buffer"
            ),
            Self::NoSuchPallet { index, count } => {
                write!(f, "no pallet {index}: the container has {count}")
            }
            Self::TooManyFds { count, max } => write!(
                f,
                "{count} descriptors for one message; a message carries at most {max}"
            ),
            Self::FdRefused { index, kind } => write!(
                f,
                "the message's descriptor {index} ({kind}) is of a kind this receiver does not accept"
            ),
            Self::FdsLost { pid } => write!(
                f,
                "the sender (pid {pid}) died before its message's descriptors were taken"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<rustix::io::Errno> for Error {
    fn from(e: rustix::io::Errno) -> Self {
        Self::Io(e.into())
    }
}

impl From<BadDescriptor> for Error {
    fn from(e: BadDescriptor) -> Self {
        Self::BadDescriptor(e)
    }
}

/// Result alias used throughout ferry.
pub type Result<T, E = Error> = std::result::Result<T, E>;
