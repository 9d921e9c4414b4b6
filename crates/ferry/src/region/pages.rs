//! What pages back a lot or a path: 4 KiB, transparent huge pages or hugetlb.

/// Size of a huge page: a PMD mapping, a transparent huge page, a 2 MiB hugetlb page.
pub const HUGE_PAGE: usize = 2 << 20;

/// What pages back a group's lots ([`GroupConfig::pages`](super::GroupConfig)) or a
/// path's fbufs ([`PathConfig::pages`](super::PathConfig)).
///
/// A large payload written and read whole touches one page table entry (and one TLB
/// entry) per 4 KiB page; backed by 2 MiB pages it touches one per 2 MiB. See
/// `docs/hugepages.md`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pages {
    /// 4 KiB pages of a shmem memfd (the default).
    #[default]
    Normal,
    /// Shmem pages collapsed into 2 MiB transparent huge pages (`MADV_COLLAPSE`, which
    /// needs no administrator setting) when an fbuf of 2 MiB or more is first carved
    /// from the lot; fbufs of [`SHARE_HUGE_FROM`](super::SHARE_HUGE_FROM) (256 KiB) up
    /// to 2 MiB share a collapsed 2 MiB span, carved whole and kept on the path's free
    /// list. Receivers' read-only mappings, at the same 2 MiB-aligned address, then map
    /// them with 2 MiB entries too. Protection, moves and TCOW keep their 4 KiB
    /// granularity (the kernel splits the mapping where needed). Smaller fbufs, and
    /// spans the kernel refuses to collapse, stay 4 KiB: the path's stats count the
    /// latter ([`PathStats::collapse_fallbacks`](super::PathStats)). Needs lots of a
    /// 2 MiB multiple at 2 MiB-aligned addresses (as the default geometry is).
    Transparent,
    /// Lots that are hugetlbfs memfds (`MFD_HUGETLB`, 2 MiB pages) from the pool the
    /// administrator reserved (`vm.nr_hugepages`). A group setting: every member's lot
    /// is one, each reserving its whole size from the pool when it is created, and
    /// everything is 2 MiB-granular: the smallest fbuf is 2 MiB, protection is per
    /// 2 MiB, and Genie's page-granular semantics are refused. With too few huge pages
    /// free, joining fails with [`Error::NoHugePages`](crate::Error::NoHugePages).
    HugeTlb,
}

impl Pages {
    /// The value kept in the control block.
    pub(crate) fn raw(self) -> u32 {
        match self {
            Pages::Normal => 0,
            Pages::Transparent => 1,
            Pages::HugeTlb => 2,
        }
    }

    /// The value a control block holds, or `None` if no ferry writes it.
    pub(crate) fn from_raw(v: u32) -> Option<Pages> {
        match v {
            0 => Some(Pages::Normal),
            1 => Some(Pages::Transparent),
            2 => Some(Pages::HugeTlb),
            _ => None,
        }
    }

    /// A short name: `4k`, `thp`, `hugetlb`.
    pub fn name(self) -> &'static str {
        match self {
            Pages::Normal => "4k",
            Pages::Transparent => "thp",
            Pages::HugeTlb => "hugetlb",
        }
    }
}

impl std::fmt::Display for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
