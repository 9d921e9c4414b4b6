//! The memory layer: groups, domains, lots, and fbufs with their per-path allocators.

pub(crate) mod access;
pub(crate) mod activity;
pub(crate) mod domain;
pub(crate) mod group;
pub(crate) mod inspect;
pub(crate) mod layout;
pub(crate) mod ledger;
pub(crate) mod lot;
pub(crate) mod pages;
pub(crate) mod path;
pub(crate) mod rendezvous;

pub use access::GroupAccess;
pub use activity::{
    ActivityDamage, ChannelActivity, MemberActivity, PathActivity, MAX_CHANNELS, MAX_PATHS,
};
pub use domain::Domain;
pub use group::{DomainId, Group, GroupConfig, Member};
pub use inspect::{Cleaned, GroupFile, GroupFileState, GroupView};
pub use pages::{Pages, HUGE_PAGE};
pub use path::{PathAllocator, PathConfig, PathStats, SHARE_HUGE_FROM};
