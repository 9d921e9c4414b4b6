//! Named services: publish-subscribe and request-response between the domains of a
//! group, found by name through the group's control block, with no daemon.
//!
//! ```
//! use std::time::Duration;
//! use ferry::{Publisher, ServiceConfig, Subscriber};
//! use ferry::{Group, PathConfig};
//!
//! # fn main() -> ferry::Result<()> {
//! # let name = format!("doc-svc-{}", std::process::id());
//! let group = Group::open(&name)?;
//! let (camera, viewer) = (group.join()?, group.join()?);   // two processes, in real use
//! let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
//! let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
//! publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
//!
//! let path = camera.path(PathConfig::default())?;
//! let mut frame = path.alloc(64 * 1024)?;
//! frame.write_at(0, b"frame 1");
//! let frame = frame.freeze();
//! assert_eq!(publisher.publish(&frame)?, 1);             // one descriptor per subscriber
//! let got = sub.recv_timeout(Duration::from_secs(5))?;
//! assert!(got.slice(0..7).eq_bytes(b"frame 1"));
//! assert_eq!(group.services()[0].subscribers.len(), 1);
//! drop((got, frame));
//! publisher.collect_releases();
//! assert_eq!(path.outstanding(), 0);                     // the fbuf came back
//! # Ok(()) }
//! ```
//!
//! How names are found, how members join, slow subscribers and hostile members: the docs
//! of [`Publisher`]; request-response: [`Server`]. Each owner runs a *door* thread
//! (`door.rs`) that sleeps on its table entry's join word and makes a joining member's
//! channels with the point-to-point handshake (for a subscriber the owner connects and the
//! subscriber waits in [`Domain::accept_from`]; for a client the server connects for
//! responses and accepts the client's channel for requests); the table's layout and
//! checks are in `table.rs`.

mod door;
mod local;
mod pubsub;
mod reqresp;
mod table;

use std::sync::{Arc, Weak};
use std::time::Duration;

pub use local::{run_server, Caller, Handler, Placement};
pub use pubsub::{
    Publisher, PublisherLoan, PublisherStats, Publishing, Subscriber, SubscriberInfo,
};
pub use reqresp::{Client, Request, Response, Server, ServerStats, STATUS_HANDLER_FAILED};
pub use table::{Kind as ServiceKind, MAX_FAR, MAX_MEMBERS, MAX_NAME, MAX_SERVICES};

use door::{Admit, DoorThread};
use table::{check_far, EntryView, Kind, Note, Role, Table};

use crate::error::{Error, Result};
use crate::region::group::Member;
use crate::region::{Domain, DomainId, Group};
use crate::until::Until;

/// What a publisher does when a subscriber's queue is full.
///
/// The default, in [`ServiceConfig::default`] and in `ferry pub`, is [`Drop`](Self::Drop),
/// as in iceoryx2 (its "safe overflow"): one subscriber that stops reading (stopped by
/// SIGSTOP or a debugger, swapped out, wedged) must not stop the publisher and, through
/// it, every other subscriber. A slow subscriber pays for its own slowness by missing
/// its oldest messages, which [`PublisherStats::dropped`] and
/// [`SubscriberInfo::dropped`] count. The alternative default considered, blocking for a
/// bounded time and then disconnecting the stuck subscriber, still stalls every other
/// subscriber for that time on each stuck one, and turns a pause into a lost
/// subscription; dropping the oldest stalls no one and loses only what the slow one
/// could not keep up with.
///
/// [`Block`](Self::Block) stays available for streams where every subscriber must see
/// every message and the publisher should slow down to the slowest reader instead; use
/// [`Publisher::publish_timeout`] with it to bound the wait.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SlowSubscriber {
    /// That subscriber loses the oldest message in its queue; the publisher never waits.
    /// The default.
    Drop,
    /// The publisher waits for room (see [`Publisher::publish_timeout`]), so one
    /// subscriber that stops reading stops the publisher and every other subscriber.
    Block,
}

/// Settings of a service, chosen by its owner.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// Messages each member's queue holds (a power of two, 2..=65536).
    pub depth: u32,
    /// What a full subscriber queue does to the publisher (publish-subscribe only);
    /// [`SlowSubscriber::Drop`] by default.
    pub slow: SlowSubscriber,
    /// How long a server waits for room in a client's response queue.
    pub reply_timeout: Duration,
}

impl Default for ServiceConfig {
    /// Depth 64, [`SlowSubscriber::Drop`] (a stuck subscriber holds up no one; see
    /// [`SlowSubscriber`] for why), a reply timeout of 5 s.
    fn default() -> Self {
        ServiceConfig {
            depth: 64,
            slow: SlowSubscriber::Drop,
            reply_timeout: Duration::from_secs(5),
        }
    }
}

/// Where a service lives, as [`ServiceInfo::origin`] says: here, or on another host
/// whose messages a bridge (`ferry-bridge`) republishes here.
///
/// What a bridge records about a service is a claim for people to read (`ferry stat`),
/// never used to decide anything: any member of the group can write the service table,
/// so a note is only counted while its writer is alive and entitled to it (the owner
/// for [`Bridged`](Self::Bridged), a member for [`Carried`](Self::Carried)), and one
/// that fails the checks (length, UTF-8, control characters) reads as
/// [`Damaged`](Self::Damaged).
///
/// The owner of an imported service says where it comes from
/// ([`Publisher::set_bridged_from`], [`Server::set_bridged_from`]); a member that
/// carries a service to other hosts says to which ([`Subscriber::set_carried_to`],
/// [`Client::set_carried_to`]):
///
/// ```
/// use std::time::Duration;
/// use ferry::{Group, Origin, Publisher, ServiceConfig, Subscriber};
///
/// # fn main() -> ferry::Result<()> {
/// # let name = format!("doc-origin-{}", std::process::id());
/// let group = Group::open(&name)?;
/// let (bridge, viewer) = (group.join()?, group.join()?);   // two processes, in real use
/// let publisher = Publisher::offer(&bridge, "camera/front", ServiceConfig::default())?;
/// assert_eq!(group.services()[0].origin, Origin::Local);
///
/// publisher.set_bridged_from("host-a (zenoh 1f2e)")?;
/// let info = &group.services()[0];
/// assert_eq!(info.origin, Origin::Bridged { far: "host-a (zenoh 1f2e)".into() });
///
/// let sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
/// publisher.set_bridged_from("")?;                       // local again
/// sub.set_carried_to("host-b")?;
/// let Origin::Carried { by, to } = &group.services()[0].origin else { panic!() };
/// assert_eq!((by.id, to.as_str()), (viewer.id(), "host-b"));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Offered on this host, and no bridge says it carries it elsewhere.
    Local,
    /// Offered here by a bridge that imports it from another host: `far` is how the
    /// bridge names that host (its host name and zenoh id).
    Bridged {
        /// The far end, as the owner recorded it (at most [`MAX_FAR`] bytes).
        far: String,
    },
    /// Offered on this host; the bridge `by`, one of its members, carries it to other
    /// hosts.
    Carried {
        /// The member that carries it.
        by: Member,
        /// The far ends, as that member recorded them (at most [`MAX_FAR`] bytes).
        to: String,
    },
    /// The service's bridge note fails validation (a buggy or hostile member wrote
    /// it): where the service lives is not known.
    Damaged,
}

/// A service as listed by [`Group::services`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceInfo {
    /// Its name.
    pub name: String,
    /// Publish-subscribe or request-response.
    pub kind: Kind,
    /// The publisher or server.
    pub owner: Member,
    /// Live subscribers or clients that joined (recorded in the table; the owner may
    /// still be connecting the newest).
    pub subscribers: Vec<Member>,
    /// Queue depth per member.
    pub depth: u32,
    /// Slow-subscriber policy.
    pub slow: SlowSubscriber,
    /// Whether it lives here or a bridge imports it from another host, or carries it to
    /// others (see [`Origin`]).
    pub origin: Origin,
}

impl Group {
    /// The services offered in this group by live domains, with their members. Entries
    /// that fail validation are left out (see [`service_table_damage`](Self::service_table_damage)).
    pub fn services(&self) -> Vec<ServiceInfo> {
        let t = Table::new(self);
        t.entries()
            .0
            .into_iter()
            .map(|e| {
                let subscribers = t.members(e.index);
                let origin = match t.note(&e, &subscribers) {
                    Note::None => Origin::Local,
                    Note::Imported { far } => Origin::Bridged { far },
                    Note::Carried { by, to } => Origin::Carried { by, to },
                    Note::Damaged => Origin::Damaged,
                };
                ServiceInfo {
                    subscribers,
                    name: e.name,
                    kind: e.kind,
                    owner: e.owner,
                    depth: e.depth,
                    slow: if e.block {
                        SlowSubscriber::Block
                    } else {
                        SlowSubscriber::Drop
                    },
                    origin,
                }
            })
            .collect()
    }

    /// Entries of the service table that are in use but fail validation (a buggy or
    /// hostile member wrote them); 0 in a healthy group.
    pub fn service_table_damage(&self) -> usize {
        Table::new(self).entries().1
    }
}

impl crate::region::GroupView {
    /// The services offered in the group by live domains, with their members (see
    /// [`Group::services`]).
    pub fn services(&self) -> Vec<ServiceInfo> {
        self.group().services()
    }

    /// Entries of the service table that fail validation (see
    /// [`Group::service_table_damage`]).
    pub fn service_table_damage(&self) -> usize {
        self.group().service_table_damage()
    }
}

/// Where service `name`'s bridge note lies in the control memfd, and its entry's
/// version (for `ferry::testing`).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn note_at(group: &Group, name: &str) -> Option<(usize, u32)> {
    let e = Table::new(group).find(name)?;
    let (area, _) = crate::region::layout::service_area_span();
    Some((area + 4 * table::note_offset(e.index), e.version))
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME || name.contains('\0') {
        return Err(Error::InvalidArgument(
            "service name must be 1..=64 bytes, no NUL",
        ));
    }
    Ok(())
}

/// An owner's entry in the table and its door thread: dropping it stops the door,
/// then withdraws the name.
struct Offering {
    group: Arc<Group>,
    entry: EntryView,
    me: DomainId,
    door: Option<DoorThread>,
}

impl Offering {
    /// Claims the table entry of a new service and starts its door, which hands new
    /// members to `admit`.
    fn start(
        domain: &Domain,
        name: &str,
        kind: Kind,
        config: &ServiceConfig,
        admit: Weak<dyn Admit>,
    ) -> Result<Offering> {
        check_name(name)?;
        if !config.depth.is_power_of_two() || !(2..=1 << 16).contains(&config.depth) {
            return Err(Error::InvalidArgument(
                "service depth must be a power of two in 2..=65536",
            ));
        }
        let me = domain.id();
        let block = config.slow == SlowSubscriber::Block;
        let (index, version) =
            Table::new(domain.group()).offer(me, name, kind, block, config.depth)?;
        let mut o = Offering {
            group: domain.group().clone(),
            entry: EntryView {
                index,
                version,
                owner: Member {
                    id: me,
                    pid: std::process::id(),
                },
                kind,
                block,
                depth: config.depth,
                name: name.to_owned(),
            },
            me,
            door: None,
        };
        // On failure, dropping `o` withdraws the entry.
        o.door = Some(DoorThread::spawn(o.group.clone(), index, me, admit)?);
        Ok(o)
    }

    /// Records (or, with `""`, clears) that the owner imports this service from `far`.
    fn set_bridged_from(&self, far: &str) -> Result<()> {
        check_far(far)?;
        let t = Table::new(&self.group);
        if !t.owned(self.entry.index, self.entry.version, self.me) {
            return Err(Error::BadServiceTable("the service's entry was taken over"));
        }
        let role = if far.is_empty() {
            Role::None
        } else {
            Role::Imported
        };
        t.write_note(self.entry.index, self.entry.version, self.me, role, far);
        Ok(())
    }
}

impl Drop for Offering {
    fn drop(&mut self) {
        // Stop admitting first, then take the name back; the members' channels close as
        // the owner's endpoints drop.
        drop(self.door.take());
        Table::new(&self.group).withdraw(self.entry.index, self.entry.version, self.me);
    }
}

/// A member's word in a service's entry; dropping it leaves the service.
struct Membership {
    domain: Domain,
    entry: EntryView,
    index: usize,
}

impl Membership {
    /// Waits as `until` says for service `name` of `kind` and records `domain` as a
    /// member ([`Error::NoSuchService`] once its deadline passed). The guard returned
    /// with it is the domain's turn to join: hold it until the owner's channel is taken
    /// (see `DomainInner::joining`).
    fn join<'d>(
        domain: &'d Domain,
        name: &str,
        kind: Kind,
        mut until: Until<'_>,
    ) -> Result<(Membership, std::sync::MutexGuard<'d, ()>)> {
        check_name(name)?;
        let t = Table::new(domain.group());
        loop {
            let seq = t.seq();
            if let Some(e) = t.find(name) {
                if e.kind != kind {
                    return Err(Error::NoSuchService {
                        name: name.to_owned(),
                    });
                }
                if e.owner.id == domain.id() {
                    return Err(Error::InvalidArgument(
                        "a domain cannot join its own service",
                    ));
                }
                // Taken once the service exists, so that waiting for one service never
                // holds up joining another.
                let turn = crate::sync::lock(&domain.inner.joining);
                let index = t.join(&e, domain.id())?;
                let member = Membership {
                    domain: domain.clone(),
                    entry: e,
                    index,
                };
                return Ok((member, turn));
            }
            match until.check() {
                Err(Error::Timeout) => {
                    return Err(Error::NoSuchService {
                        name: name.to_owned(),
                    })
                }
                other => other?,
            }
            t.wait_seq(seq, until.slice().min(Duration::from_millis(50)));
        }
    }
}

impl Membership {
    /// Records (or, with `""`, clears) that this member carries the service to `far`.
    fn set_carried_to(&self, far: &str) -> Result<()> {
        check_far(far)?;
        let role = if far.is_empty() {
            Role::None
        } else {
            Role::Carried
        };
        let t = Table::new(self.domain.group());
        // An entry claimed again (the owner died) is no longer ours to write on.
        if t.current(self.entry.index, self.entry.version) {
            t.write_note(
                self.entry.index,
                self.entry.version,
                self.domain.id(),
                role,
                far,
            );
        }
        Ok(())
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        let t = Table::new(self.domain.group());
        // Before leaving: a member that left has no say about the service.
        t.clear_note(self.entry.index, self.entry.version, self.domain.id());
        t.leave(self.entry.index, self.index, self.domain.id());
    }
}
