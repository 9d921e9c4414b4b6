//! What a program may observe of ferry while it runs: the counters of channels, paths,
//! servers and publishers, the per-member activity areas any member can read, what a
//! group's named file says, and the count of system calls ferry has made.
//!
//! None of these types is needed to pass data; they are what a call such as
//! [`Sender::stats`](crate::Sender::stats), [`PathAllocator::stats`](crate::PathAllocator::stats),
//! [`Group::activity`](crate::Group::activity) or [`Group::inspect`](crate::Group::inspect)
//! returns.
//!
//! ferry's syscall wrappers are private to the crate; the counters below let callers check
//! that a steady-state path makes no system call, and [`page_size`] is the size fbuf,
//! pallet and region sizes are rounded to.
//!
//! ```
//! let before = ferry::stats::thread_syscall_count();
//! let page = ferry::stats::page_size();       // no ferry system call
//! assert!(page.is_power_of_two());
//! assert_eq!(ferry::stats::thread_syscall_count(), before);
//! assert!(ferry::stats::syscall_count() >= ferry::stats::thread_syscall_count());
//! ```

pub use crate::channel::ChannelStats;
pub use crate::region::{
    ActivityDamage, ChannelActivity, Cleaned, GroupFile, GroupFileState, GroupView, MemberActivity,
    PathActivity, PathStats, MAX_CHANNELS, MAX_PATHS,
};
pub use crate::service::{PublisherStats, ServerStats, SubscriberInfo};
pub use crate::sys::{page_size, syscall_count, thread_syscall_count};
