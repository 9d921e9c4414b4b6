//! Activity: what each domain publishes about its paths and sending channels in the
//! group's control block, so that a process that is not a member (`ferry stat`) can see
//! how many fbufs each path has out and how many messages each channel has in flight.
//!
//! Every slot has one `ActivityRaw`: a fixed number of path entries and channel
//! entries. Only the slot's owner writes it. A path or a sending channel takes a free
//! entry when it is made (one compare-and-swap) and frees it when it goes; with no entry
//! free it is counted as *unlisted* instead. The numbers themselves are plain relaxed
//! stores of values the owner computes anyway:
//!
//! * a path stores its outstanding bytes and fbufs on every allocation and every return
//!   of an fbuf, so its entry is current (two threads of one process racing on one path
//!   can leave the older of their two values until the path's next change);
//! * a sender stores its messages in flight and sent when it sends and when it collects
//!   releases. A release the receiver made shows once the sender collects it: on its
//!   next send, on an allocation whose free list ran dry, on `collect_releases`, or in a
//!   domain's idle wait. Fbufs come back to their path at the same moment.
//!
//! Readers (see [`Group::activity`](super::Group::activity)) trust nothing here: a
//! member runs as the same user and may write anything. Entries whose tag or counts are
//! out of range are reported as [`ActivityDamage`], never followed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::group::{DomainId, Group, Member};
use super::pages::Pages;

/// Most collapse fallbacks a path entry can show (24 bits).
const FALLBACKS_MAX: u32 = (1 << 24) - 1;
use super::layout::{ActivityRaw, EntryRaw, BUSY, CHANNEL, FREE, MAX_SLOTS, PATH};
pub use super::layout::{MAX_CHANNELS, MAX_PATHS};
use crate::segment::LotId;

/// Packs a channel's peer into its entry's fixed word.
fn pack_peer(peer: DomainId) -> u64 {
    (peer.slot as u64) << 32 | peer.generation as u64
}

impl ActivityRaw {
    /// Frees every entry: the slot was claimed again and its previous owner is dead.
    pub(crate) fn clear(&self) {
        self.unlisted_paths.store(0, Ordering::Relaxed);
        self.unlisted_channels.store(0, Ordering::Relaxed);
        for e in self.paths.iter().chain(&self.channels) {
            e.tag.store(FREE, Ordering::Relaxed);
        }
    }

    /// The entries and the unlisted count of `tag`'s kind.
    fn table(&self, tag: u32) -> (&[EntryRaw], &AtomicU32) {
        if tag == PATH {
            (&self.paths, &self.unlisted_paths)
        } else {
            (&self.channels, &self.unlisted_channels)
        }
    }
}

/// A path's or a sending channel's entry, held by it; frees the entry when dropped.
#[derive(Debug)]
pub(crate) struct Entry {
    group: Arc<Group>,
    slot: u16,
    /// `PATH` or `CHANNEL`.
    tag: u32,
    /// `None`: no entry was free (counted as unlisted).
    index: Option<u16>,
}

impl Entry {
    /// Takes an entry in slot `slot`'s area for a path with `quota` bytes.
    pub(crate) fn path(group: Arc<Group>, slot: u16, quota: usize) -> Self {
        Self::take(group, slot, PATH, quota as u64)
    }

    /// Takes an entry in slot `slot`'s area for a sending channel to `peer`.
    pub(crate) fn channel(group: Arc<Group>, slot: u16, peer: DomainId) -> Self {
        Self::take(group, slot, CHANNEL, pack_peer(peer))
    }

    fn take(group: Arc<Group>, slot: u16, tag: u32, fixed: u64) -> Self {
        let (entries, unlisted) = group.activity_area(slot).table(tag);
        // The first free entry, taken as BUSY (one compare-and-swap per path or channel).
        let index = entries.iter().position(|e| {
            e.tag.load(Ordering::Relaxed) == FREE
                && e.tag
                    .compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
        });
        match index {
            Some(i) => {
                let e = &entries[i];
                e.fixed.store(fixed, Ordering::Relaxed);
                e.pages.store(0, Ordering::Relaxed);
                e.first.store(0, Ordering::Relaxed);
                e.second.store(0, Ordering::Relaxed);
                // SYNC: pairs with the reader's Acquire load of the tag.
                e.tag.store(tag, Ordering::Release);
            }
            None => {
                unlisted.fetch_add(1, Ordering::Relaxed);
            }
        }
        let index = index.map(|i| i as u16);
        Entry {
            group,
            slot,
            tag,
            index,
        }
    }

    /// Publishes a path's pages and how many spans fell back to 4 KiB pages.
    pub(crate) fn set_pages(&self, pages: Pages, fallbacks: u64) {
        if let Some(i) = self.index {
            let e = &self.group.activity_area(self.slot).table(self.tag).0[i as usize];
            let n = fallbacks.min(FALLBACKS_MAX as u64) as u32;
            e.pages.store(pages.raw() | n << 8, Ordering::Relaxed);
        }
    }

    /// Publishes the two counters (relaxed stores): a path's outstanding bytes and
    /// fbufs, a channel's messages in flight and sent.
    pub(crate) fn set(&self, first: u64, second: u64) {
        if let Some(i) = self.index {
            let e = &self.group.activity_area(self.slot).table(self.tag).0[i as usize];
            e.first.store(first, Ordering::Relaxed);
            e.second.store(second, Ordering::Relaxed);
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let (entries, unlisted) = self.group.activity_area(self.slot).table(self.tag);
        match self.index {
            Some(i) => entries[i as usize].tag.store(FREE, Ordering::Release),
            None => {
                let _ = unlisted
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            }
        }
    }
}

// ---------------------------------------------------------------- reading

/// One path of a member, as published in the control block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathActivity {
    /// The entry's index in the member's area (stable while the path lives).
    pub entry: u16,
    /// Fbufs allocated from the path and not yet back.
    pub fbufs: u64,
    /// Bytes (in whole size-class spans) allocated and not yet back.
    pub bytes: u64,
    /// The path's quota in bytes.
    pub quota: u64,
    /// What pages back its fbufs.
    pub pages: Pages,
    /// Spans the kernel refused to collapse into transparent huge pages (they stay 4 KiB;
    /// saturates at 2^24 - 1).
    pub collapse_fallbacks: u32,
}

/// One sending channel of a member, as published in the control block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelActivity {
    /// The entry's index in the member's area (stable while the channel lives).
    pub entry: u16,
    /// The receiving domain.
    pub peer: DomainId,
    /// Messages sent and not yet released back (as of the sender's last collection).
    pub in_flight: u64,
    /// Messages sent on the channel so far.
    pub sent: u64,
}

/// An entry of a member's activity area that failed validation (someone wrote into it
/// what no ferry writes); it is left out of the listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivityDamage {
    /// Which entry: `"path 3"`, `"channel 12"`.
    pub entry: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// What a live member publishes: its paths and sending channels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberActivity {
    /// The member.
    pub member: Member,
    /// Its listed paths.
    pub paths: Vec<PathActivity>,
    /// Its listed sending channels.
    pub channels: Vec<ChannelActivity>,
    /// Paths that found no free entry (not listed).
    pub unlisted_paths: u32,
    /// Sending channels that found no free entry (not listed).
    pub unlisted_channels: u32,
    /// Entries that failed validation.
    pub damage: Vec<ActivityDamage>,
}

/// Most messages one channel can have in flight: its tokens number them with 32 bits.
const MAX_IN_FLIGHT: u64 = u32::MAX as u64;

/// Entries of `raw` tagged `tag`, as (index, fixed, first, second, pages word); entries
/// with a tag no owner writes are recorded in `damage` as `kind` entries.
fn tagged(
    raw: &[EntryRaw],
    tag: u32,
    kind: &'static str,
    damage: &mut Vec<ActivityDamage>,
) -> Vec<(usize, u64, u64, u64, u32)> {
    let mut out = Vec::new();
    for (i, e) in raw.iter().enumerate() {
        // SYNC: pairs with the owner's Release store of the tag after filling the entry.
        match e.tag.load(Ordering::Acquire) {
            FREE | BUSY => {}
            t if t == tag => out.push((
                i,
                e.fixed.load(Ordering::Relaxed),
                e.first.load(Ordering::Relaxed),
                e.second.load(Ordering::Relaxed),
                e.pages.load(Ordering::Relaxed),
            )),
            _ => damage.push(ActivityDamage {
                entry: format!("{kind} {i}"),
                why: "unknown tag",
            }),
        }
    }
    out
}

/// Reads member `m`'s area, checking every value against what its owner can write.
pub(crate) fn read(area: &ActivityRaw, m: Member, lot_size: u64) -> MemberActivity {
    let page = crate::sys::page_size() as u64;
    let mut damage = Vec::new();
    let mut paths = Vec::new();
    for (i, quota, bytes, fbufs, pages) in tagged(&area.paths, PATH, "path", &mut damage) {
        let kind = Pages::from_raw(pages & 0xff);
        let why = if bytes > lot_size || bytes % page != 0 {
            "outstanding bytes out of range"
        } else if fbufs > lot_size / page {
            "outstanding fbufs out of range"
        } else if let Some(kind) = kind {
            paths.push(PathActivity {
                entry: i as u16,
                fbufs,
                bytes,
                quota,
                pages: kind,
                collapse_fallbacks: pages >> 8,
            });
            continue;
        } else {
            "unknown page kind"
        };
        damage.push(ActivityDamage {
            entry: format!("path {i}"),
            why,
        });
    }
    let mut channels = Vec::new();
    for (i, peer, in_flight, sent, _) in tagged(&area.channels, CHANNEL, "channel", &mut damage) {
        let (slot, generation) = (peer >> 32, peer as u32);
        let why = if slot as usize >= MAX_SLOTS {
            "peer slot out of range"
        } else if in_flight > MAX_IN_FLIGHT {
            "messages in flight out of range"
        } else {
            channels.push(ChannelActivity {
                entry: i as u16,
                peer: DomainId {
                    slot: slot as u16,
                    generation,
                },
                in_flight,
                sent,
            });
            continue;
        };
        damage.push(ActivityDamage {
            entry: format!("channel {i}"),
            why,
        });
    }
    MemberActivity {
        member: m,
        paths,
        channels,
        unlisted_paths: area.unlisted_paths.load(Ordering::Relaxed),
        unlisted_channels: area.unlisted_channels.load(Ordering::Relaxed),
        damage,
    }
}

impl Group {
    /// What every live member publishes about its paths (fbufs outstanding, quota) and
    /// its sending channels (peer, messages in flight), read from the control block
    /// without joining. Values are checked before they are shown: entries that fail
    /// (a member may write anything there) are listed in
    /// [`MemberActivity::damage`] instead. Dead members are not shown; a member that
    /// left or died while being read is dropped from the result. See
    /// [`MemberActivity`](crate::stats::MemberActivity) for how fresh the numbers are.
    pub fn activity(&self) -> Vec<MemberActivity> {
        let lot_size = self.header().lot_size;
        self.members()
            .into_iter()
            .filter_map(|m| {
                let a = super::activity::read(self.activity_area(m.id.slot), m, lot_size);
                // The slot may have changed hands while we read it.
                let id = LotId {
                    slot: m.id.slot,
                    generation: m.id.generation,
                };
                self.domain_live(id).then_some(a)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The offsets `tests/activity.rs` writes garbage at.
    #[test]
    fn layout_is_stable() {
        assert_eq!(offset_of!(ActivityRaw, paths), 8);
        assert_eq!(size_of::<EntryRaw>(), 32);
        assert_eq!(offset_of!(EntryRaw, fixed), 8);
        assert_eq!(offset_of!(EntryRaw, first), 16);
        assert_eq!(offset_of!(EntryRaw, second), 24);
        assert_eq!(offset_of!(ActivityRaw, channels), 8 + 32 * MAX_PATHS);
        assert_eq!(
            pack_peer(DomainId {
                slot: 3,
                generation: 7
            }),
            3 << 32 | 7
        );
        assert_eq!((PATH, CHANNEL), (0x5041_5448, 0x4348_414e));
    }
}
