//! The owner side of joining: a thread per offered service that waits on the entry's
//! `join` word and does the channel handshakes with new members, so that a member can
//! join while the owner is busy, idle or blocked elsewhere.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::table::Table;
use crate::error::Result;
use crate::region::group::Member;
use crate::region::{DomainId, Group};
use crate::sys::futex;

/// How long one handshake step may take before the member is given up (and retried
/// after [`RETRY`], if it is still listed).
pub(crate) const HANDSHAKE_PATIENCE: Duration = Duration::from_secs(2);
/// How long the door leaves a member alone after a failed handshake; doubled after each
/// further failure of the same member, up to [`RETRY_MAX`], so that a member whose
/// handshakes keep failing (broken or hostile) costs the door little of its time.
const RETRY: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(60);
/// How often the door looks at the table even without a wake-up (a member that died
/// while listed, a lost wake-up).
const PERIOD: Duration = Duration::from_millis(100);

/// What an owner does with its members.
pub(crate) trait Admit: Send + Sync + 'static {
    /// Domains connected now (the owner drops those whose channels closed).
    fn connected(&self) -> Vec<DomainId>;
    /// Does the handshake with a new member.
    fn admit(&self, m: Member) -> Result<()>;
}

/// The door thread of one service; stopped and joined on drop.
pub(crate) struct DoorThread {
    stop: Arc<AtomicBool>,
    group: Arc<Group>,
    index: usize,
    thread: Option<JoinHandle<()>>,
}

impl DoorThread {
    pub fn spawn(
        group: Arc<Group>,
        index: usize,
        me: DomainId,
        admit: Weak<dyn Admit>,
    ) -> std::io::Result<DoorThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let (g, s) = (group.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("ferry-service-door".into())
            .spawn(move || run(&g, index, me, &s, admit))?;
        Ok(DoorThread {
            stop,
            group,
            index,
            thread: Some(thread),
        })
    }
}

fn run(group: &Group, index: usize, me: DomainId, stop: &AtomicBool, admit: Weak<dyn Admit>) {
    let table = Table::new(group);
    let join = table.join_word(index);
    // Members whose handshake failed: when to try again, and how often it failed.
    let mut backoff: HashMap<DomainId, (Instant, u32)> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        let seq = join.load(Ordering::Acquire);
        let Some(a) = admit.upgrade() else { return };
        let have = a.connected();
        let members = table.members(index);
        backoff.retain(|id, _| members.iter().any(|m| m.id == *id));
        for m in members {
            if stop.load(Ordering::Acquire) {
                return;
            }
            let waiting = backoff
                .get(&m.id)
                .is_some_and(|(until, _)| *until > Instant::now());
            if m.id == me || have.contains(&m.id) || waiting {
                continue;
            }
            if a.admit(m).is_err() {
                let failed = backoff.get(&m.id).map_or(0, |b| b.1) + 1;
                let wait = (RETRY * 2u32.pow(failed.min(6) - 1)).min(RETRY_MAX);
                backoff.insert(m.id, (Instant::now() + wait, failed));
            } else {
                backoff.remove(&m.id);
            }
        }
        drop(a);
        futex::wait(join, seq, PERIOD);
    }
}

impl Drop for DoorThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let join = Table::new(&self.group).join_word(self.index);
        join.fetch_add(1, Ordering::AcqRel);
        futex::wake_all(join);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
