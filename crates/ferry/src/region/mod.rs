//! The memory layer: groups, domains, lots, and fbufs with their per-path allocators.

pub mod access;
pub mod activity;
pub mod domain;
pub mod group;
pub mod inspect;
pub(crate) mod ledger;
pub(crate) mod lot;
pub mod path;
pub(crate) mod rendezvous;

pub use access::GroupAccess;
pub use activity::{ActivityDamage, ChannelActivity, MemberActivity, PathActivity};
pub use domain::Domain;
pub use group::{DomainId, Group, GroupConfig, Member};
pub use inspect::{Cleaned, GroupFile, GroupFileState, GroupView};
pub use path::{PathAllocator, PathConfig, PathStats};
