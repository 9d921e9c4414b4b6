//! The memory layer: groups, domains, lots, and fbufs with their per-path allocators.

pub mod activity;
pub mod domain;
pub mod group;
pub(crate) mod ledger;
pub(crate) mod lot;
pub mod path;
pub(crate) mod rendezvous;

pub use activity::{ActivityDamage, ChannelActivity, MemberActivity, PathActivity};
pub use domain::Domain;
pub use group::{DomainId, Group, GroupConfig, Member};
pub use path::{PathAllocator, PathConfig, PathStats};
