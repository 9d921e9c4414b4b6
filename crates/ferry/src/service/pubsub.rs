//! Publish-subscribe: one [`Publisher`] per service name, up to
//! [`MAX_MEMBERS`](super::MAX_MEMBERS) [`Subscriber`]s, each reached through a channel of
//! its own from the publisher's domain.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::door::{Admit, HANDSHAKE_PATIENCE};
use super::table::Kind;
use super::{Membership, Offering, ServiceConfig, SlowSubscriber};
use crate::channel::{
    ChannelConfig, ChannelStats, Claimed, Draft, FdKinds, Fds, Receiver, Sender, FAN,
};
use crate::error::{Error, Result};
use crate::iodata::{IoData, IoDataMut};
use crate::region::group::Member;
use crate::region::{Domain, DomainId, PathAllocator, PathConfig};
use crate::sync::lock;
use crate::until::Until;

/// A loan of at least this many bytes collects every subscriber's releases first (see
/// `Publisher::collect_all`).
const COLLECT_ALL_FROM: usize = 256 << 10;

/// Loans between two collections of one subscriber's releases, at least (see
/// `Publisher::collect_turn`).
const COLLECT_SPAN: usize = 4;

/// One subscriber as the publisher sees it.
struct Sub {
    member: Member,
    /// Shared with a publish that waits for room in this queue without the list's lock.
    /// Its counters say how many messages it was handed (including those later evicted):
    /// every push on it is one.
    tx: Arc<Sender>,
    dropped: u64,
}

struct PubShared {
    domain: Domain,
    config: ServiceConfig,
    subs: Mutex<Vec<Sub>>,
}

impl Admit for PubShared {
    fn connected(&self) -> Vec<DomainId> {
        let mut subs = lock(&self.subs);
        // A subscriber that left and may be joining again: drop its channel. (No system
        // call under the lock, which `publish` takes; a dead subscriber is dropped by
        // `publish` or `collect_releases`.)
        subs.retain(|s| !s.tx.is_closed());
        subs.iter().map(|s| s.member.id).collect()
    }

    fn admit(&self, m: Member) -> Result<()> {
        let tx =
            self.domain
                .connect_with(m.id, self.config.channel_config(), HANDSHAKE_PATIENCE)?;
        #[cfg(any(test, feature = "testing"))]
        if let Some(d) = crate::testing::admit_delay() {
            std::thread::sleep(d);
        }
        let mut subs = lock(&self.subs);
        // Each publish collects one subscriber's releases, in turn (see `publish_start`),
        // and a sender collects by itself every 16th send; with more than 16
        // subscribers, those collections are spread over the subscribers (5 is coprime
        // with 16), so that one publish seldom collects for more than one of them.
        tx.stagger_collection(5 * subs.len() as u32);
        let tx = Arc::new(tx);
        subs.push(Sub {
            member: m,
            tx: tx.clone(),
            dropped: 0,
        });
        // Listed: whatever is published from now on goes to it too. Only now may the
        // subscriber's open return (it waits for this), or a message published right
        // after it returned could miss it.
        tx.confirm_listed();
        Ok(())
    }
}

/// A publish under way ([`Publisher::begin_publish`]): its first pass is done, and the
/// queues that were full under [`SlowSubscriber::Block`] are still to be waited on
/// ([`Publisher::wait_publish`]) before [`Publisher::end_publish`].
#[derive(Debug)]
pub struct Publishing {
    pending: Pending,
    /// The full queues before this one were settled.
    next: usize,
    /// Duplicates of the cargo, for the full queues: the caller's descriptors are only
    /// borrowed for [`Publisher::begin_publish_with_fds`].
    fds: Vec<OwnedFd>,
}

impl Publishing {
    /// Full queues still waited on.
    pub fn waiting(&self) -> usize {
        self.pending.full.len() - self.next
    }
}

/// A publish under way: its first pass is done, and the queues that were full under
/// [`SlowSubscriber::Block`] are still to be waited on.
#[derive(Debug)]
pub(crate) struct Pending {
    /// The message, every fragment in a lot.
    pub(crate) data: IoData,
    /// Subscribers handed the message so far.
    pub(crate) delivered: usize,
    /// The full queues, in the order the list had them.
    pub(crate) full: Vec<Arc<Sender>>,
    timed_out: bool,
}

/// Counters of a publisher.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Calls to publish that reached their end (every subscriber served or dropped).
    pub published: u64,
    /// Messages handed to subscribers (one per subscriber per message), including those
    /// later evicted from a full queue.
    pub delivered: u64,
    /// Queued messages evicted (the oldest first) to make room in a full subscriber's
    /// queue under [`SlowSubscriber::Drop`]; their subscribers never see them.
    pub dropped: u64,
    /// Bytes copied into the publisher's lot because a message had fragments outside
    /// any lot (copied once per message, however many subscribers).
    pub copied_bytes: u64,
    /// Subscribers removed because they died or left.
    pub departed: u64,
}

/// One subscriber's counters, as seen by the publisher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriberInfo {
    /// The subscriber's domain and process.
    pub member: Member,
    /// Messages it was handed (including those later evicted).
    pub delivered: u64,
    /// Its oldest queued messages evicted to make room (drop policy): it never sees
    /// them, and their fbufs are back with the publisher.
    pub dropped: u64,
    /// Messages it holds or has queued, not yet released.
    pub in_flight: usize,
}

/// The publishing end of a named service.
///
/// One [`publish`](Self::publish) hands the same fbufs to every subscriber: each gets a
/// descriptor in its own bounded queue (a channel of
/// [`ServiceConfig::depth`] entries), never a copy. The fbufs go back to the publisher's
/// path once the last subscriber drops its [`IoData`]. A full queue is handled by the
/// service's [`SlowSubscriber`] policy. Subscribers join through a thread the publisher
/// starts (the *door*), so they may join at any time; dead subscribers are found by their
/// pidfds and everything they held is reclaimed by the channel machinery.
///
/// # Naming and discovery
///
/// Every group's control block has a service table, with no daemon: up to
/// [`MAX_SERVICES`](crate::MAX_SERVICES) entries, each a name (1 to
/// [`MAX_NAME`](crate::MAX_NAME) bytes of UTF-8), the offering domain (the *owner*: a
/// publisher or a [`Server`](crate::Server)), the kind, the queue depth and slow-subscriber
/// policy, and up to [`MAX_MEMBERS`](crate::MAX_MEMBERS) members. [`offer`](Self::offer)
/// claims an entry under the table's lock, so a name is offered at most once in a group
/// ([`Error::ServiceExists`]); the entry of an owner that died is free again.
/// [`Subscriber::open`] waits up to its timeout for the name to appear
/// ([`Error::NoSuchService`] if it does not) and records itself in a member word, which
/// wakes the owner's door; the door then makes the subscriber's channel with the ordinary
/// handshake, so every guarantee of a [`Sender`] holds per subscriber (validated
/// descriptors, releases that flow back, a dead peer found by its pidfd and what it held
/// reclaimed). [`Group::services`](crate::Group::services) lists the table.
///
/// # Slow subscribers
///
/// Each subscriber's queue holds [`ServiceConfig::depth`] messages. When it is full,
/// [`SlowSubscriber::Block`] makes the publish wait for room (with an optional timeout),
/// and [`SlowSubscriber::Drop`] makes that subscriber lose the *oldest* message of its
/// queue to make room for the new one (counted per subscriber): a slow or stopped
/// subscriber never holds up the publisher or the others, and one that resumes finds the
/// latest `depth` messages, in order. The evicted message's fbufs return to the
/// publisher's path as if released. Fragments outside any lot are copied once into the
/// publisher's lot ([`PublisherStats::copied_bytes`]), whatever the number of subscribers.
///
/// # What a hostile member can do
///
/// Any member maps the service table writable. Readers check every field and skip
/// entries that fail (counted in
/// [`Group::service_table_damage`](crate::Group::service_table_damage)); a scribbled table
/// makes opening fail with [`Error::NoSuchService`] or [`Error::BadServiceTable`], or
/// connect to the wrong live domain, where the handshake's checks fail or time out.
/// Channels already open do not read the table and go on.
pub struct Publisher {
    /// First: on drop the door stops and the name is withdrawn before the channels
    /// close, so a subscriber that sees its channel close finds the name gone.
    offering: Offering,
    shared: Arc<PubShared>,
    copy_path: PathAllocator,
    stats: PublisherStats,
    /// The subscriber (its place in the list) whose releases were collected last.
    turn: usize,
    /// Loans since one last collected (see [`collect_turn`](Self::collect_turn)).
    skipped: usize,
    /// A loan collected them since the last publish (which then does not).
    collected: bool,
    /// Kept between loans so that a loan allocates nothing (see [`Claims`]).
    claims: Claims,
}

/// A loan's claims on its subscribers' ring places (see [`Sender::claim`]), given back
/// if the loan is dropped unsent.
#[derive(Default)]
struct Claims {
    /// The subscribers' senders as the list had them at the last loan, kept between
    /// loans: a claim names its sender by its place here instead of taking a reference
    /// to it (a locked increment, and a decrement at its end, per subscriber and loan),
    /// and these references keep every claimed sender (and its ring's mapping) alive
    /// until its claim ends. Compared with the list at each loan, and taken again when
    /// a subscriber joined or left.
    senders: Vec<Arc<Sender>>,
    /// Each subscriber whose ring place was claimed (its place in `senders`), in the
    /// list's order.
    ahead: Vec<(usize, Claimed)>,
    /// The subscribers whose place could not be claimed (a full queue): the send hands
    /// them the message after the others.
    later: Vec<Arc<Sender>>,
}

impl Claims {
    /// Gives every claim back.
    fn unclaim(&mut self) {
        for (i, c) in self.ahead.drain(..) {
            c.unclaim(&self.senders[i]);
        }
        self.later.clear();
    }

    /// Makes `senders` the list's, unless it is already (same senders, same order).
    fn sync(&mut self, subs: &[Sub]) {
        debug_assert!(self.ahead.is_empty());
        let same = self.senders.len() == subs.len()
            && self
                .senders
                .iter()
                .zip(subs)
                .all(|(a, s)| Arc::ptr_eq(a, &s.tx));
        if !same {
            self.senders.clear();
            self.senders.extend(subs.iter().map(|s| s.tx.clone()));
        }
    }
}

impl Drop for Claims {
    fn drop(&mut self) {
        self.unclaim();
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("name", &self.offering.entry.name)
            .field("subscribers", &self.subscriber_count())
            .finish()
    }
}

impl Publisher {
    /// Offers publish-subscribe service `name` from `domain`.
    ///
    /// # Errors
    /// [`Error::ServiceExists`] if a live domain of the group offers `name`,
    /// [`Error::ServiceTableFull`], [`Error::InvalidArgument`] for a bad name or depth,
    /// [`Error::BadServiceTable`] if the table lock stayed held.
    pub fn offer(domain: &Domain, name: &str, config: ServiceConfig) -> Result<Publisher> {
        let shared = Arc::new(PubShared {
            domain: domain.clone(),
            config,
            subs: Mutex::new(Vec::new()),
        });
        let weak: std::sync::Weak<dyn Admit> = Arc::downgrade(&shared) as _;
        let offering = Offering::start(domain, name, Kind::PubSub, &shared.config, weak)?;
        Ok(Publisher {
            copy_path: domain.path(PathConfig::default())?,
            shared,
            stats: PublisherStats::default(),
            turn: 0,
            skipped: 0,
            collected: false,
            claims: Claims::default(),
            offering,
        })
    }

    /// A message of `len` bytes to write in place and then publish to every subscriber
    /// ([`PublisherLoan::send`]), as iceoryx2's loan, write, send: one fbuf from the
    /// publisher's [`path`](Self::path), written once, then handed to each subscriber
    /// exactly as [`publish`](Self::publish) hands a message (one descriptor per
    /// subscriber's queue, the fbuf shared, back to the path once the last subscriber
    /// released it). A loan dropped unsent publishes nothing and its fbuf goes back at
    /// once.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-pub-loan-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// let mut msg = publisher.loan(64)?;
    /// msg.as_mut_slice()[..7].copy_from_slice(b"frame 1");
    /// assert_eq!(msg.send()?, 1);                             // subscribers reached
    /// let got = sub.recv_timeout(Duration::from_secs(5))?;
    /// assert!(got.slice(0..7).eq_bytes(b"frame 1"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The path's allocation errors ([`Error::QuotaExceeded`] while subscribers hold its
    /// quota).
    pub fn loan(&mut self, len: usize) -> Result<PublisherLoan<'_>> {
        self.collect_for(len);
        let data = self.copy_path.alloc(len)?;
        Ok(self.lend(data))
    }

    /// Like [`loan`](Self::loan), with the fbuf from `path` (a path of the caller's, whose
    /// counters then show the loans' fbufs).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-pub-loan-from-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// let path = camera.path(ferry::PathConfig::default())?;
    /// let mut msg = publisher.loan_from(&path, 5)?;
    /// msg.as_mut_slice().copy_from_slice(b"hello");
    /// assert_eq!(msg.send()?, 1);
    /// let got = sub.recv_timeout(Duration::from_secs(5))?;
    /// assert!(got.eq_bytes(b"hello"));
    /// drop(got);
    /// publisher.collect_releases();
    /// assert_eq!(path.outstanding(), 0);                      // back once released
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `path`'s allocation errors.
    pub fn loan_from(&mut self, path: &PathAllocator, len: usize) -> Result<PublisherLoan<'_>> {
        self.collect_for(len);
        let data = path.alloc(len)?;
        Ok(self.lend(data))
    }

    /// What a loan of `len` bytes collects before it takes its fbuf: every subscriber's
    /// releases for a large one ([`collect_all`](Self::collect_all)), one subscriber's
    /// in turn otherwise ([`collect_turn`](Self::collect_turn)).
    fn collect_for(&mut self, len: usize) {
        if len >= COLLECT_ALL_FROM {
            self.collect_all();
        } else {
            self.collect_turn();
        }
    }

    /// Collects every subscriber's releases (without the liveness check of
    /// [`collect_releases`](Self::collect_releases)): a large loan's fbuf is then the
    /// one released last, whose pages are still in the caches and the TLB, rather than
    /// one of the many that a collection in turn leaves waiting for their last release.
    fn collect_all(&mut self) {
        let subs = lock(&self.shared.subs);
        for s in subs.iter() {
            s.tx.collect_some();
        }
        self.collected = !subs.is_empty();
    }

    /// Collects the releases of the subscriber whose turn it is (see
    /// [`publish_start`](Self::publish_start)), here where a loan takes an fbuf, so that
    /// its send only hands the message over.
    ///
    /// With fewer than [`COLLECT_SPAN`] subscribers, not every loan collects: each
    /// subscriber's releases are collected every `COLLECT_SPAN` loans, as with that many
    /// subscribers. A collection's own cost (the reverse ring's first line brought over
    /// from the subscriber's core, its head store and fence) is then paid for several
    /// releases instead of one, and a collection still takes at most a few.
    fn collect_turn(&mut self) {
        let subs = lock(&self.shared.subs);
        if subs.is_empty() {
            return;
        }
        self.skipped += 1;
        if self.skipped * subs.len() < COLLECT_SPAN {
            return;
        }
        self.skipped = 0;
        self.turn = self.turn.wrapping_add(1) % subs.len();
        subs[self.turn].tx.collect_some();
        self.collected = true;
    }

    /// A loan of `data`, one fbuf fresh from a path. Under [`SlowSubscriber::Block`],
    /// every subscriber's ring place and token are claimed now, so that the send only
    /// writes and publishes each descriptor, in its slot's first cache line (see
    /// [`Claimed::publish`]). The subscribers are those of now: one that joins while the
    /// loan is written gets the messages after it.
    fn lend(&mut self, data: IoDataMut) -> PublisherLoan<'_> {
        let draft = Draft::new(data);
        let mut claims = std::mem::take(&mut self.claims);
        if self.shared.config.slow == SlowSubscriber::Block {
            claims.sync(&lock(&self.shared.subs));
            let Claims {
                senders,
                ahead,
                later,
            } = &mut claims;
            for (i, tx) in senders.iter().enumerate() {
                match tx.claim(draft.get()) {
                    Some(c) => ahead.push((i, c)),
                    None => later.push(tx.clone()),
                }
            }
        }
        if claims.ahead.is_empty() {
            // Nothing claimed: the send takes the general path for everyone.
            claims.later.clear();
        }
        PublisherLoan {
            draft,
            claims,
            publisher: self,
        }
    }

    /// The send of a loan whose claims were all just published (`data` is the message
    /// they describe): each claimed subscriber's message goes on record, one fence wakes
    /// those that sleep, then the subscribers whose queues were full get it as
    /// [`publish_until`](Self::publish_until) hands it to full queues.
    fn send_claimed(
        &mut self,
        mut claims: Claims,
        data: IoData,
        deadline: Option<Instant>,
    ) -> Result<usize> {
        let mut ok = 0u64;
        let mut failed = 0u64;
        for (i, (k, c)) in claims.ahead.iter().enumerate() {
            match c.record(&claims.senders[*k], &data) {
                Ok(()) => ok |= 1 << i,
                Err(_) => failed |= 1 << i,
            }
        }
        Sender::wake_after_unfenced(
            claims
                .ahead
                .iter()
                .enumerate()
                .filter(|(i, _)| ok & 1 << i != 0)
                .map(|(_, (k, _))| &*claims.senders[*k]),
        );
        let delivered = ok.count_ones() as usize;
        if failed != 0 {
            // The list's order is the claims' (the door only appends and removes).
            let mut subs = lock(&self.shared.subs);
            let mut at = 0;
            let before = subs.len();
            subs.retain(|s| {
                let Some(k) = claims.ahead[at..]
                    .iter()
                    .position(|(k, _)| Arc::ptr_eq(&claims.senders[*k], &s.tx))
                else {
                    return true;
                };
                let i = at + k;
                at = i + 1;
                failed & 1 << i == 0
            });
            self.stats.departed += (before - subs.len()) as u64;
        }
        // Ended: nothing to give back.
        claims.ahead.clear();
        let full = std::mem::take(&mut claims.later);
        self.claims = claims;
        self.collected = false;
        self.stats.delivered += delivered as u64;
        let mut p = Pending {
            data,
            delivered,
            full,
            timed_out: false,
        };
        for i in 0..p.full.len() {
            let r = p.full[i].send_until(&p.data, &[], deadline);
            self.settle(&mut p, i, r)?;
        }
        self.publish_end(p)
    }

    /// The path [`loan`](Self::loan) allocates from (a message published with fragments
    /// outside any lot is copied into it too). Its counters show the loans' fbufs.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-pub-path-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// drop(publisher.loan(100)?);                  // dropped unsent
    /// assert_eq!(publisher.path().outstanding(), 0);   // its fbuf is back
    /// # drop(sub);
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &PathAllocator {
        &self.copy_path
    }

    /// Publishes `data` to every subscriber. Under [`SlowSubscriber::Block`] waits (as
    /// long as it takes) for room in full queues; under [`SlowSubscriber::Drop`] never
    /// blocks. Returns how many subscribers were handed the message. Subscribers may join
    /// while it waits; they get the messages published after this one.
    pub fn publish(&mut self, data: &IoData) -> Result<usize> {
        self.publish_until(data, None)
    }

    /// Like [`publish`](Self::publish), waiting for room at most `timeout` under
    /// [`SlowSubscriber::Block`].
    ///
    /// # Errors
    /// [`Error::Timeout`] if a blocking subscriber's queue stayed full past the timeout:
    /// the subscribers that had room got the message, the full ones did not.
    pub fn publish_timeout(&mut self, data: &IoData, timeout: Duration) -> Result<usize> {
        self.publish_until(data, Some(Instant::now() + timeout))
    }

    /// Like [`publish`](Self::publish), waiting for room under
    /// [`SlowSubscriber::Block`] until `deadline` (`None`: for as long as it takes). For
    /// callers that hold an optional limit, such as the C and Python bindings.
    ///
    /// # Errors
    /// As [`publish_timeout`](Self::publish_timeout) once `deadline` has passed.
    pub fn publish_until(&mut self, data: &IoData, deadline: Option<Instant>) -> Result<usize> {
        self.publish_with_fds_until(data, &[], deadline)
    }

    /// Like [`publish`](Self::publish), with `fds` as cargo: each subscriber gets its own
    /// duplicates (see [`Subscriber::recv_with_fds_timeout`] and [`Fds`]), and the
    /// publisher keeps one set of duplicates per subscriber until that subscriber
    /// releases the message.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use std::os::fd::AsFd;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-pub-fds-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "frames/fds", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "frames/fds", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// let (r, _w) = std::io::pipe()?;
    /// let meta = publisher.path().alloc(8)?.freeze();
    /// assert_eq!(publisher.publish_with_fds(&meta, &[r.as_fd()])?, 1);
    /// let (_, fds) = sub.recv_with_fds_timeout(Duration::from_secs(5))?;
    /// assert_eq!(fds.kind(0), Some(ferry::FdKind::Pipe));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`publish`](Self::publish); [`Error::TooManyFds`] past
    /// [`MAX_FDS`](crate::MAX_FDS).
    pub fn publish_with_fds(&mut self, data: &IoData, fds: &[BorrowedFd<'_>]) -> Result<usize> {
        self.publish_with_fds_until(data, fds, None)
    }

    /// Like [`publish_with_fds`](Self::publish_with_fds), waiting for room under
    /// [`SlowSubscriber::Block`] until `deadline` (`None`: for as long as it takes), as
    /// [`publish_until`](Self::publish_until).
    ///
    /// ```
    /// # use std::time::{Duration, Instant};
    /// # use std::os::fd::AsFd;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-pub-fds-until-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "frames/fds2", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "frames/fds2", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// let (r, _w) = std::io::pipe()?;
    /// let meta = publisher.path().alloc(8)?.freeze();
    /// let deadline = Some(Instant::now() + Duration::from_secs(1));
    /// assert_eq!(publisher.publish_with_fds_until(&meta, &[r.as_fd()], deadline)?, 1);
    /// # drop(sub);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`publish_with_fds`](Self::publish_with_fds) and
    /// [`publish_until`](Self::publish_until).
    pub fn publish_with_fds_until(
        &mut self,
        data: &IoData,
        fds: &[BorrowedFd<'_>],
        deadline: Option<Instant>,
    ) -> Result<usize> {
        let mut p = self.publish_start(data, fds)?;
        // The waits happen without the subscriber list's lock, so subscribers keep
        // joining (and the door keeps serving them) while a full queue holds us back.
        for i in 0..p.full.len() {
            let r = p.full[i].send_until(&p.data, fds, deadline);
            self.settle(&mut p, i, r)?;
        }
        self.publish_end(p)
    }

    /// [`publish_until`](Self::publish_until) in three steps, for a caller that must
    /// do something between its waits (look for interrupts, as the Python binding
    /// does): this first pass hands the message to every queue with room (evicting
    /// under [`SlowSubscriber::Drop`]) and returns the publish with the full queues of
    /// [`SlowSubscriber::Block`] still to be waited on.
    ///
    /// # Errors
    /// As [`publish`](Self::publish).
    pub fn begin_publish(&mut self, data: &IoData) -> Result<Publishing> {
        self.begin_publish_with_fds(data, &[])
    }

    /// [`begin_publish`](Self::begin_publish) with `fds` as cargo, as
    /// [`publish_with_fds`](Self::publish_with_fds): the publish keeps its own
    /// duplicates of them for the queues still full, so the caller's may be closed
    /// before [`wait_publish`](Self::wait_publish).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use std::os::fd::AsFd;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-begin-fds-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "frames/begin-fds", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "frames/begin-fds", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// let (r, _w) = std::io::pipe()?;
    /// let meta = publisher.path().alloc(8)?.freeze();
    /// let mut p = publisher.begin_publish_with_fds(&meta, &[r.as_fd()])?;
    /// drop(r);
    /// publisher.wait_publish(&mut p, Duration::from_secs(1))?;
    /// assert_eq!(publisher.end_publish(p)?, 1);
    /// let (_, fds) = sub.recv_with_fds_timeout(Duration::from_secs(5))?;
    /// assert_eq!(fds.kind(0), Some(ferry::FdKind::Pipe));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`publish_with_fds`](Self::publish_with_fds); [`Error::Io`] if the
    /// duplicates cannot be made (out of descriptors).
    pub fn begin_publish_with_fds(
        &mut self,
        data: &IoData,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Publishing> {
        crate::channel::check_fd_count(fds.len())?;
        // Made before the first pass, which cannot be undone if they then failed.
        let owned = fds
            .iter()
            .map(|f| f.try_clone_to_owned())
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Publishing {
            pending: self.publish_start(data, fds)?,
            next: 0,
            fds: owned,
        })
    }

    /// Waits up to `timeout` in all for room in `p`'s full queues, handing the message
    /// to each as it gets room: `Ok` once none is left. A queue whose subscriber died or
    /// left meanwhile is dropped.
    ///
    /// # Errors
    /// [`Error::Timeout`] if a queue is still full (call again, or
    /// [`end_publish`](Self::end_publish) to give up on it); others end the publish.
    pub fn wait_publish(&mut self, p: &mut Publishing, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while p.next < p.pending.full.len() {
            let i = p.next;
            let fds: Vec<BorrowedFd<'_>> = p.fds.iter().map(|f| f.as_fd()).collect();
            match p.pending.full[i].send_until(&p.pending.data, &fds, Some(deadline)) {
                Err(Error::Timeout) => return Err(Error::Timeout),
                r => self.settle(&mut p.pending, i, r)?,
            }
            p.next += 1;
        }
        Ok(())
    }

    /// Ends `p`: how many subscribers got the message, or [`Error::Timeout`] if a full
    /// queue was given up on (it did not get it; the others did).
    ///
    /// # Errors
    /// As above.
    pub fn end_publish(&mut self, mut p: Publishing) -> Result<usize> {
        if p.next < p.pending.full.len() {
            p.pending.timed_out = true;
        }
        self.publish_end(p.pending)
    }

    /// A publish's first pass, under the subscriber list's lock: every queue with room
    /// gets the message (one fence for all of them), full ones evict their oldest under
    /// [`SlowSubscriber::Drop`], and under [`SlowSubscriber::Block`] the full ones are
    /// returned in [`Pending::full`] for the caller to wait on (with [`settle`](Self::settle)
    /// after each) and then [`publish_end`](Self::publish_end). Subscribers that join after
    /// this pass do not get the message; dead ones are dropped here.
    pub(crate) fn publish_start(
        &mut self,
        data: &IoData,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Pending> {
        crate::channel::check_fd_count(fds.len())?;
        let data = self.shareable(data)?;
        let block = self.shared.config.slow == SlowSubscriber::Block;
        let mut subs = lock(&self.shared.subs);
        let (mut gone, mut sent) = (0u64, 0u64);
        let mut full = Vec::new();
        let mut delivered = 0;
        let mut failed = None;
        // Releases: one subscriber's per publish, in turn, so that every publish collects
        // about one release per subscriber (those of the one whose turn it is) and none
        // collects many; each collection with one fence. A loan collected already when
        // it took its fbuf; otherwise this publish collects, once its descriptor is out
        // and with the releases' first cache line loaded while the descriptor's store
        // travels (see `Sender::try_send_unfenced`).
        let turn = if std::mem::take(&mut self.collected) {
            usize::MAX
        } else {
            self.turn = self.turn.wrapping_add(1) % subs.len().max(1);
            self.turn
        };
        // Each queue gets the message without its own fence; the one fence after the
        // loop serves them all (see `Sender::try_send_unfenced`). With several
        // subscribers, their descriptors are stored together (see `Sender::fan_out`), unless
        // the message carries descriptors of its own.
        let fan = subs.len() > 1 && fds.is_empty();
        let mut outcome: [Result<bool>; FAN] = [const { Ok(false) }; FAN];
        for (k, chunk) in subs.chunks_mut(FAN).enumerate() {
            let n = chunk.len();
            if fan {
                let mut senders: [&Sender; FAN] = [&*chunk[0].tx; FAN];
                for (at, s) in senders.iter_mut().zip(chunk.iter()) {
                    *at = &*s.tx;
                }
                Sender::fan_out(&senders[..n], &data, &mut outcome[..n]);
            } else {
                for (j, (o, s)) in outcome.iter_mut().zip(chunk.iter()).enumerate() {
                    *o = s.tx.try_send_unfenced(&data, fds, k * FAN + j == turn);
                }
            }
            for (j, (s, r)) in chunk.iter_mut().zip(&mut outcome).enumerate() {
                let i = k * FAN + j;
                match std::mem::replace(r, Ok(false)) {
                    Ok(evicted) => {
                        sent |= 1 << i;
                        delivered += 1;
                        if evicted {
                            s.dropped += 1;
                            self.stats.dropped += 1;
                        }
                    }
                    Err(Error::Full) if block => full.push(s.tx.clone()),
                    Err(Error::Full) => {
                        s.dropped += 1;
                        self.stats.dropped += 1;
                    }
                    Err(Error::PeerGone { .. } | Error::Disconnected) => gone |= 1 << i,
                    Err(e) => failed = failed.or(Some(e)),
                }
            }
            if failed.is_some() {
                break;
            }
        }
        // Every queue that took the message wakes its subscriber if it sleeps, even if a
        // later one failed.
        Sender::wake_after_unfenced(
            subs.iter()
                .enumerate()
                .filter(|(i, _)| sent & 1 << i != 0)
                .map(|(_, s)| &*s.tx),
        );
        if fan && turn < subs.len() {
            subs[turn].tx.collect_some();
        }
        if gone != 0 {
            let mut i = 0;
            subs.retain(|_| {
                i += 1;
                gone & 1 << (i - 1) == 0
            });
            self.stats.departed += gone.count_ones() as u64;
        }
        // A departed subscriber's sender is let go here too, not only at the next loan.
        self.claims.sync(&subs);
        drop(subs);
        self.stats.delivered += delivered as u64;
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(Pending {
            data,
            delivered,
            full,
            timed_out: false,
        })
    }

    /// Records how the wait for room in `p.full[i]` ended. Errors other than a timeout
    /// or a departed subscriber end the publish (returned).
    pub(crate) fn settle(&mut self, p: &mut Pending, i: usize, r: Result<()>) -> Result<()> {
        let tx = &p.full[i];
        match r {
            Ok(()) => {
                p.delivered += 1;
                self.stats.delivered += 1;
                Ok(())
            }
            Err(Error::Timeout) => {
                p.timed_out = true;
                Ok(())
            }
            Err(Error::PeerGone { .. } | Error::Disconnected) => {
                let mut subs = lock(&self.shared.subs);
                let before = subs.len();
                subs.retain(|s| !Arc::ptr_eq(&s.tx, tx));
                self.stats.departed += (before - subs.len()) as u64;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Ends a publish whose waits were all settled: how many subscribers got it, or
    /// [`Error::Timeout`] if a wait timed out.
    pub(crate) fn publish_end(&mut self, p: Pending) -> Result<usize> {
        if p.timed_out {
            return Err(Error::Timeout);
        }
        self.stats.published += 1;
        Ok(p.delivered)
    }

    /// `data` with every fragment in a lot: fragments outside any lot are copied once
    /// into the publisher's lot here (counted), rather than once per subscriber.
    fn shareable(&mut self, data: &IoData) -> Result<IoData> {
        let (data, copied) = data.in_lots(&self.copy_path)?;
        self.stats.copied_bytes += copied as u64;
        Ok(data)
    }

    /// Takes back now every fbuf subscribers have released (publishing and allocating
    /// do this too), and checks (one `poll(2)` per subscriber) that each subscriber
    /// lives: one that died or left is dropped and everything it held is reclaimed.
    pub fn collect_releases(&mut self) {
        let mut subs = lock(&self.shared.subs);
        let before = subs.len();
        subs.retain(|s| {
            let _ = s.tx.collect_releases();
            s.tx.check_peer().is_ok()
        });
        self.stats.departed += (before - subs.len()) as u64;
        // A departed subscriber's sender is let go here too, not only at the next loan.
        self.claims.sync(&subs);
    }

    /// Subscribers connected now.
    pub fn subscriber_count(&self) -> usize {
        lock(&self.shared.subs).len()
    }

    /// Waits up to `timeout` until at least `n` subscribers are connected.
    ///
    /// # Errors
    /// [`Error::Timeout`] if fewer joined in time.
    pub fn wait_for_subscribers(&self, n: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.subscriber_count() < n {
            if Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Each connected subscriber and its counters.
    pub fn subscribers(&self) -> Vec<SubscriberInfo> {
        lock(&self.shared.subs)
            .iter()
            .map(|s| SubscriberInfo {
                member: s.member,
                delivered: s.tx.stats().messages,
                dropped: s.dropped,
                in_flight: s.tx.in_flight(),
            })
            .collect()
    }

    /// The publisher's counters.
    pub fn stats(&self) -> PublisherStats {
        self.stats.clone()
    }

    /// The service's name.
    pub fn name(&self) -> &str {
        &self.offering.entry.name
    }

    /// Records that this service is imported from another host, `far` naming it (its
    /// host name and zenoh id, at most [`MAX_FAR`](crate::MAX_FAR) bytes, no control
    /// characters): [`ServiceInfo::origin`](crate::ServiceInfo::origin) then says
    /// [`Origin::Bridged`](crate::Origin::Bridged), as `ferry stat` shows. `""` clears
    /// it. For bridges; a claim shown to people, never used to decide anything (see
    /// [`Origin`](crate::Origin)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a description too long or with control
    /// characters, [`Error::BadServiceTable`] if the service's entry was taken over.
    pub fn set_bridged_from(&self, far: &str) -> Result<()> {
        self.offering.set_bridged_from(far)
    }
}

/// A message being written in place for every subscriber of a [`Publisher`] (see
/// [`Publisher::loan`]): write it through [`as_mut_slice`](Self::as_mut_slice), then
/// [`send`](Self::send). It borrows the publisher, so nothing else is published while it
/// is written. Dropped unsent, it publishes nothing and its fbuf goes back to the
/// publisher's path.
#[must_use = "a loan publishes nothing until `send` is called"]
pub struct PublisherLoan<'a> {
    publisher: &'a mut Publisher,
    /// One fbuf of the publisher's path: one run of bytes, always.
    draft: Draft,
    /// Its subscribers' ring places, claimed at the loan (given back if it is dropped).
    claims: Claims,
}

impl std::fmt::Debug for PublisherLoan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherLoan")
            .field("service", &self.publisher.name())
            .field("len", &self.len())
            .finish()
    }
}

impl PublisherLoan<'_> {
    /// The message's bytes, to write (all of them: [`len`](Self::len) bytes, one run in
    /// the fbuf that every subscriber will read, zero copy). An fbuf is not zeroed when
    /// recycled: bytes not written hold what an earlier message left there.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-pub-loan-slice-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// let mut msg = publisher.loan(4)?;
    /// msg.as_mut_slice().copy_from_slice(b"ping");
    /// msg.send()?;
    /// assert!(sub.recv_timeout(Duration::from_secs(5))?.eq_bytes(b"ping"));
    /// # Ok(()) }
    /// ```
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.draft
            .as_mut_slice()
            .expect("a publisher's loan is one fbuf")
    }

    /// The message's length in bytes.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-pub-loan-len-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// let msg = publisher.loan(1000)?;
    /// assert_eq!(msg.len(), 1000);
    /// assert!(!msg.is_empty());
    /// # drop(sub);
    /// # Ok(()) }
    /// ```
    pub fn len(&self) -> usize {
        self.draft.get().len()
    }

    /// True for a loan of zero bytes.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-pub-loan-empty-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// assert!(publisher.loan(0)?.is_empty());
    /// # drop(sub);
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shortens the message to its first `len` bytes (no effect if it is not longer):
    /// for a message whose size is known only once written. The fbuf keeps its size
    /// until it goes back.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-pub-loan-truncate-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// let mut msg = publisher.loan(4096)?;
    /// msg.as_mut_slice()[..5].copy_from_slice(b"short");
    /// msg.truncate(5);
    /// msg.send()?;
    /// assert!(sub.recv_timeout(Duration::from_secs(5))?.eq_bytes(b"short"));
    /// # Ok(()) }
    /// ```
    pub fn truncate(&mut self, len: usize) {
        self.draft.data().truncate(len);
    }

    /// Publishes the message to every subscriber, as [`Publisher::publish`] does (under
    /// [`SlowSubscriber::Block`] waits, as long as it takes, for room in full queues);
    /// returns how many subscribers were handed it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-pub-loan-send-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// let mut msg = publisher.loan(3)?;
    /// msg.as_mut_slice().copy_from_slice(b"abc");
    /// assert_eq!(msg.send()?, 1);
    /// assert!(sub.recv_timeout(Duration::from_secs(5))?.eq_bytes(b"abc"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Publisher::publish`].
    pub fn send(self) -> Result<usize> {
        self.send_until(None)
    }

    /// Like [`send`](Self::send), waiting for room at most `timeout` under
    /// [`SlowSubscriber::Block`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-pub-loan-send-timeout-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// let mut msg = publisher.loan(3)?;
    /// msg.as_mut_slice().copy_from_slice(b"abc");
    /// assert_eq!(msg.send_timeout(Duration::from_secs(1))?, 1);
    /// # drop(sub);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Publisher::publish_timeout`].
    pub fn send_timeout(self, timeout: Duration) -> Result<usize> {
        self.send_until(Some(Instant::now() + timeout))
    }

    /// Like [`send`](Self::send), waiting for room under [`SlowSubscriber::Block`] until
    /// `deadline` (`None`: for as long as it takes). For callers that hold an optional
    /// limit, such as the C and Python bindings.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-pub-loan-send-until-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// let mut msg = publisher.loan(3)?;
    /// msg.as_mut_slice().copy_from_slice(b"abc");
    /// assert_eq!(msg.send_until(None)?, 1);
    /// # drop(sub);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Publisher::publish_until`].
    pub fn send_until(self, deadline: Option<Instant>) -> Result<usize> {
        let PublisherLoan {
            publisher: p,
            draft,
            mut claims,
        } = self;
        let data = draft.into_data();
        if claims.ahead.is_empty() || !claims.ahead.iter().all(|(_, c)| c.describes(&data)) {
            // Nothing claimed, or the message is no longer the one described.
            claims.unclaim();
            p.claims = claims;
            return p.publish_until(&data.freeze(), deadline);
        }
        // Every descriptor published first, one store each, before anything else is
        // touched: those stores travel to the subscribers' cores together, and with the
        // payload's.
        // Each claim is published once, with nothing pushed since it was made: the loan
        // borrows the publisher, the only one to push on its subscribers' senders, and
        // only this send or the loan's drop ends the claims.
        // `claims.senders` keeps every claimed sender alive throughout.
        for (_, c) in &claims.ahead {
            c.publish();
        }
        p.send_claimed(claims, data.freeze(), deadline)
    }
}

/// The subscribing end of a named service: a bounded queue of the publisher's messages.
///
/// Its [`AsFd`] is the receiver's wait descriptor (readable on a message or when the publisher
/// dies): call [`arm`](Self::arm), then wait for it to
/// turn readable (epoll, async runtimes), then [`try_recv`](Self::try_recv).
pub struct Subscriber {
    rx: Receiver,
    member: Membership,
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("name", &self.member.entry.name)
            .field("publisher", &self.member.entry.owner)
            .finish()
    }
}

impl Subscriber {
    /// Subscribes `domain` to publish-subscribe service `name`, waiting up to `timeout`
    /// for the service to be offered and for the publisher to connect.
    ///
    /// # Errors
    /// [`Error::NoSuchService`] if no live domain offered `name` (as publish-subscribe)
    /// within `timeout`, [`Error::ServiceFull`], [`Error::AlreadyMember`],
    /// [`Error::Timeout`] if the publisher did not connect in time, [`Error::PeerGone`]
    /// if it died meanwhile.
    pub fn open(domain: &Domain, name: &str, timeout: Duration) -> Result<Subscriber> {
        Self::open_until(domain, name, Until::timeout(timeout))
    }

    /// Like [`open`](Self::open), waiting as `until` says: up to its deadline (none: for
    /// as long as it takes), and only while its stop check lets it
    /// ([`Error::Interrupted`]; the membership is given back as on a timeout).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_until(domain: &Domain, name: &str, mut until: Until<'_>) -> Result<Subscriber> {
        let (member, turn) = Membership::join(domain, name, Kind::PubSub, until.part())?;
        let rx = domain.accept_from_until(member.entry.owner.id, until.part())?;
        // The publisher's door made the channel before listing it: wait for the listing,
        // so that a message published once this returns reaches us.
        rx.wait_listed(&mut until)?;
        drop(turn);
        Ok(Subscriber { rx, member })
    }

    /// Takes the next message if one is queued, never blocking (`Ok(None)` if none).
    ///
    /// # Errors
    /// As [`Receiver::try_recv`]: [`Error::PeerGone`] once the publisher died and its
    /// queued messages were taken, [`Error::Disconnected`] once it withdrew the service.
    pub fn try_recv(&mut self) -> Result<Option<IoData>> {
        self.rx.try_recv()
    }

    /// Receives the next message, blocking until one arrives.
    pub fn recv(&mut self) -> Result<IoData> {
        self.rx.recv()
    }

    /// Receives the next message, blocking at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`] if none arrived in time; otherwise as [`try_recv`](Self::try_recv).
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<IoData> {
        self.rx.recv_timeout(timeout)
    }

    /// Takes the next message and its descriptors if one is queued, never blocking, as
    /// [`Receiver::try_recv_with_fds`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-sub-try-fds-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// # let publisher = Publisher::offer(&camera, "frames/try-fds", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "frames/try-fds", Duration::from_secs(5))?;
    /// assert!(sub.try_recv_with_fds()?.is_none());
    /// # drop(publisher);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Receiver::try_recv_with_fds`].
    pub fn try_recv_with_fds(&mut self) -> Result<Option<(IoData, Fds)>> {
        self.rx.try_recv_with_fds()
    }

    /// Receives the next message and its descriptors, blocking at most `timeout`, as
    /// [`Receiver::recv_with_fds_timeout`] (see
    /// [`Publisher::publish_with_fds`] for an example).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-sub-fds-to-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// # let publisher = Publisher::offer(&camera, "frames/fds-to", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "frames/fds-to", Duration::from_secs(5))?;
    /// let r = sub.recv_with_fds_timeout(Duration::from_millis(10));
    /// assert!(matches!(r, Err(ferry::Error::Timeout)));
    /// # drop(publisher);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Receiver::recv_with_fds_timeout`].
    pub fn recv_with_fds_timeout(&mut self, timeout: Duration) -> Result<(IoData, Fds)> {
        self.rx.recv_with_fds_timeout(timeout)
    }

    /// Sets the kinds of descriptor this subscriber accepts, as
    /// [`Receiver::set_fd_kinds`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{FdKind, FdKinds, Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-sub-kinds-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// # let publisher = Publisher::offer(&camera, "frames/kinds", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "frames/kinds", Duration::from_secs(5))?;
    /// sub.set_fd_kinds(FdKinds::only(FdKind::Memfd));
    /// # drop(publisher);
    /// # Ok(()) }
    /// ```
    pub fn set_fd_kinds(&mut self, kinds: FdKinds) {
        self.rx.set_fd_kinds(kinds);
    }

    /// Busy-polls for the next message (no system call while the publisher lives and
    /// messages keep coming), for at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`] if none arrived in time.
    pub fn recv_spin(&mut self, timeout: Duration) -> Result<IoData> {
        self.rx.recv_spin(timeout)
    }

    /// Makes [`recv`](Self::recv) and [`recv_timeout`](Self::recv_timeout) busy-poll
    /// for up to `spin` before they sleep, as [`Receiver::set_spin`] does. Zero (the
    /// default) sleeps at once.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-sub-set-spin-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// sub.set_spin(Duration::from_micros(50));
    /// let mut msg = publisher.loan(2)?;
    /// msg.as_mut_slice().copy_from_slice(b"hi");
    /// msg.send()?;
    /// assert!(sub.recv_timeout(Duration::from_secs(5))?.eq_bytes(b"hi"));
    /// # Ok(()) }
    /// ```
    pub fn set_spin(&mut self, spin: Duration) {
        self.rx.set_spin(spin);
    }

    /// Asks the publisher to wake this subscriber, when several sleep, after the
    /// subscribers that did not ask the same: for a subscriber that only relays the
    /// messages elsewhere (`ferry-bridge` to other hosts), so that it does not delay the
    /// hand-over to the consumers on this host. Off by default; see
    /// [`Receiver::set_wake_last`](crate::Receiver::set_wake_last).
    pub fn set_wake_last(&mut self, last: bool) {
        self.rx.set_wake_last(last);
    }

    /// How long a blocking receive busy-polls before it sleeps (see
    /// [`set_spin`](Self::set_spin)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ferry::{Publisher, ServiceConfig, Subscriber};
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-sub-spin-{}", std::process::id()))?;
    /// # let (camera, viewer) = (group.join()?, group.join()?);
    /// let mut publisher = Publisher::offer(&camera, "camera/front", ServiceConfig::default())?;
    /// let mut sub = Subscriber::open(&viewer, "camera/front", Duration::from_secs(5))?;
    /// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
    /// assert_eq!(sub.spin(), Duration::ZERO);
    /// # Ok(()) }
    /// ```
    pub fn spin(&self) -> Duration {
        self.rx.spin()
    }

    /// Prepares to wait on [`as_fd`](AsFd::as_fd); false if a message is already queued
    /// (do not wait). See [`Receiver::arm`].
    pub fn arm(&mut self) -> Result<bool> {
        self.rx.arm()
    }

    /// The publisher's domain and process.
    pub fn publisher(&self) -> Member {
        self.member.entry.owner
    }

    /// The service's name.
    pub fn name(&self) -> &str {
        &self.member.entry.name
    }

    /// Records that this member carries the service to other hosts, `far` naming them
    /// (at most [`MAX_FAR`](crate::MAX_FAR) bytes, no control characters):
    /// [`ServiceInfo::origin`](crate::ServiceInfo::origin) then says
    /// [`Origin::Carried`](crate::Origin::Carried), as `ferry stat` shows, until this
    /// member leaves. `""` clears it. For bridges; a claim shown to people, never used to
    /// decide anything (see [`Origin`](crate::Origin)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a description too long or with control characters.
    pub fn set_carried_to(&self, far: &str) -> Result<()> {
        self.member.set_carried_to(far)
    }

    /// The queue's counters.
    pub fn stats(&self) -> ChannelStats {
        self.rx.stats()
    }
}

impl AsFd for Subscriber {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

impl AsRawFd for Subscriber {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.rx.as_raw_fd()
    }
}

impl ServiceConfig {
    pub(crate) fn channel_config(&self) -> ChannelConfig {
        ChannelConfig {
            capacity: self.depth,
            release_capacity: self.depth.max(1024),
            // Drop: a full queue loses its oldest message (the publisher takes it back).
            lossy: self.slow == SlowSubscriber::Drop,
        }
    }
}
