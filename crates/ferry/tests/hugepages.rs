//! Huge-page lots between real processes (this test binary re-executed in a child role,
//! `harness = false`): a path of transparent huge pages and a group of hugetlb lots each
//! carry a large message intact, and both ends map it with 2 MiB entries (read from
//! `/proc/self/smaps`); without reserved huge pages a hugetlb group's join fails with a
//! clear error; and the options refuse what the lots cannot do.
//!
//! The hugetlb tests set `vm.nr_hugepages` (root only; they print a SKIP reason and pass
//! otherwise) and put the old value back when they end, even if they fail.

mod common;

use common::*;
use ferry::{Error, Group, GroupConfig, Pages, PathConfig};

/// Bytes of each test message: four 2 MiB pages.
const LEN: usize = 8 << 20;

/// The value of `field` (in kB) in `/proc/self/smaps` for the mapping holding `addr`.
fn smaps_kb(addr: usize, field: &str) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let head = line.split(' ').next().unwrap_or("");
        if let Some((lo, hi)) = head.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix(field) {
                return v.trim().trim_end_matches("kB").trim().parse().ok();
            }
        }
    }
    None
}

/// Receives one message, checks every byte, and reports how its mapping here is backed:
/// `ok <ShmemPmdMapped kB> <KernelPageSize kB>`.
fn receive_and_report(domain: &ferry::Domain) {
    let mut rx = domain.accept(T).unwrap();
    let d = rx.recv_timeout(T).unwrap();
    verify(&d).unwrap();
    let addr = d.fragments()[0].as_slice().as_ptr() as usize;
    println!(
        "ok {} {}",
        smaps_kb(addr, "ShmemPmdMapped:").unwrap_or(0),
        smaps_kb(addr, "KernelPageSize:").unwrap_or(0)
    );
    let _ = read_line(&mut std::io::BufReader::new(std::io::stdin()));
}

fn child_main(role: &str) {
    let (_name, _group, domain, _arg, _stdin) = child_start();
    match role {
        "receiver" => receive_and_report(&domain),
        other => panic!("unknown role {other}"),
    }
}

/// Sends one `len`-byte message from `path` to a child receiver; returns its report.
fn send_to_child(
    name: &str,
    d: &ferry::Domain,
    path: &ferry::PathAllocator,
    len: usize,
) -> (ferry::IoData, String) {
    let mut p = Peer::spawn("receiver", name, "");
    let tx = d.connect(p.id, T).unwrap();
    let msg = fill(path, 0x5eed, len);
    tx.send(&msg).unwrap();
    let report = p.line();
    p.tell("exit");
    assert!(p.child.wait().unwrap().success());
    (msg, report)
}

/// The numbers of a child's `ok <pmd kB> <page kB>` report.
fn parse_report(report: &str) -> (u64, u64) {
    let v: Vec<&str> = report.split(' ').collect();
    assert_eq!(v.first(), Some(&"ok"), "child said {report:?}");
    (v[1].parse().unwrap(), v[2].parse().unwrap())
}

/// Whether this kernel collapses a memfd mapping into huge pages at all: a 2 MiB-aligned
/// shared mapping of a fresh memfd, one byte read, `MADV_COLLAPSE`. `Err` says why not.
fn kernel_collapses() -> Result<(), String> {
    use rustix::mm::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};
    const HUGE: usize = 2 << 20;
    let fd = rustix::fs::memfd_create("ferry-collapse-probe", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| e.to_string())?;
    rustix::fs::ftruncate(&fd, HUGE as u64).map_err(|e| e.to_string())?;
    // SAFETY: a fresh reservation chosen by the kernel, then a fixed mapping inside it
    // that replaces only that reservation; both are unmapped before returning.
    unsafe {
        let hole = mmap_anonymous(
            std::ptr::null_mut(),
            2 * HUGE,
            ProtFlags::empty(),
            MapFlags::PRIVATE,
        )
        .map_err(|e| e.to_string())?;
        let at = (hole as usize).next_multiple_of(HUGE) as *mut std::ffi::c_void;
        let p = mmap(
            at,
            HUGE,
            ProtFlags::READ,
            MapFlags::SHARED | MapFlags::FIXED,
            &fd,
            0,
        )
        .map_err(|e| e.to_string())?;
        p.cast::<u8>().read_volatile();
        let r = libc::madvise(p, HUGE, libc::MADV_COLLAPSE);
        let err = std::io::Error::last_os_error();
        let _ = munmap(hole, 2 * HUGE);
        if r != 0 {
            return Err(format!("MADV_COLLAPSE: {err}"));
        }
    }
    Ok(())
}

/// (a) A path of transparent huge pages in an ordinary group: its 8 MiB fbuf is
/// collapsed into huge pages when carved, carries the message intact to another
/// process, and both the sender's and the receiver's mappings hold it with 2 MiB entries
/// (`ShmemPmdMapped`). Skipped with the reason if the kernel refuses to collapse.
fn thp_path_carries_data_and_both_ends_map_2mib() {
    let (_g, d, name) = join("thp");
    let path = d
        .path(PathConfig {
            quota: 4 * LEN,
            pages: Some(Pages::Transparent),
            ..PathConfig::default()
        })
        .unwrap();
    // A small fbuf first, so that the large one does not start at the lot's (aligned)
    // start by chance.
    let small = fill(&path, 1, 4096);
    let (msg, report) = send_to_child(&name, &d, &path, LEN);
    assert_eq!(verify(&small), Ok(1));
    let st = path.stats();
    assert_eq!(st.pages, Pages::Transparent);
    if st.collapsed == 0 {
        assert_eq!(st.collapse_fallbacks, 1, "{st:?}");
        // Only a kernel that refuses everyone excuses the fallback.
        if let Err(why) = kernel_collapses() {
            println!("SKIP: the kernel does not collapse shmem ({why}); the span fell back");
            return;
        }
    }
    assert_eq!((st.collapsed, st.collapse_fallbacks), (1, 0), "{st:?}");
    let addr = msg.fragments()[0].as_slice().as_ptr() as usize;
    assert_eq!(addr % (2 << 20), 0, "the span is 2 MiB-aligned");
    let here = smaps_kb(addr, "ShmemPmdMapped:").unwrap();
    assert!(here >= (LEN >> 10) as u64, "sender's PMD-mapped kB {here}");
    let (there, _) = parse_report(&report);
    assert!(
        there >= (LEN >> 10) as u64,
        "receiver's PMD-mapped kB {there}"
    );
    eprintln!("    ShmemPmdMapped: sender {here} kB, receiver {there} kB");
}

/// (a') Fbufs under 2 MiB on a path of transparent huge pages: a 1 MiB message is
/// carried intact and mapped with 2 MiB entries by sender and receiver, and the next
/// 1 MiB fbuf is the other half of the same collapsed, 2 MiB-aligned span, taken from
/// the path's free list (one collapse; outstanding counts only what was handed out);
/// write-protecting one half (`IoData::secure`) leaves the other writable.
fn thp_path_shares_a_huge_page_between_1mib_fbufs() {
    const MIB: usize = 1 << 20;
    let (_g, d, name) = join("thp1m");
    let path = d
        .path(PathConfig {
            quota: 4 * MIB,
            pages: Some(Pages::Transparent),
            ..PathConfig::default()
        })
        .unwrap();
    // A small fbuf first, as in (a): it stays 4 KiB and moves the lot's bump pointer.
    let small = fill(&path, 1, 4096);
    let (msg, report) = send_to_child(&name, &d, &path, MIB);
    let st = path.stats();
    if st.collapsed == 0 && st.collapse_fallbacks == 1 {
        if let Err(why) = kernel_collapses() {
            println!("SKIP: the kernel does not collapse shmem ({why}); the span fell back");
            return;
        }
    }
    assert_eq!((st.collapsed, st.collapse_fallbacks), (1, 0), "{st:?}");
    assert_eq!(st.outstanding, 4096 + MIB, "{st:?}");
    let a = msg.fragments()[0].as_slice().as_ptr() as usize;
    assert_eq!(
        a % (2 << 20),
        0,
        "the 1 MiB fbuf starts a 2 MiB-aligned span"
    );
    let here = smaps_kb(a, "ShmemPmdMapped:").unwrap();
    assert!(here >= 2048, "sender's PMD-mapped kB {here}");
    let (there, _) = parse_report(&report);
    assert!(there >= 2048, "receiver's PMD-mapped kB {there}");
    let second = fill(&path, 2, MIB);
    let b = second.fragments()[0].as_slice().as_ptr() as usize;
    assert_eq!(
        b,
        a + MIB,
        "the second 1 MiB fbuf is the huge page's other half"
    );
    let st2 = path.stats();
    assert_eq!(st2.collapsed, 1, "no second collapse: {st2:?}");
    assert_eq!(
        st2.cached,
        st.cached + 1,
        "taken from the free list: {st2:?}"
    );
    assert_eq!(st2.outstanding, 4096 + 2 * MIB, "{st2:?}");
    assert_eq!(smaps_kb(a, "ShmemPmdMapped:").unwrap(), here);
    assert_eq!(verify(&small), Ok(1));
    assert_eq!(verify(&msg), Ok(0x5eed));
    assert_eq!(verify(&second), Ok(2));
    // Protecting one half of the huge page leaves the other writable: the second half,
    // reused, is written whole while the first is read-only; once released, the first
    // is writable again.
    msg.secure().unwrap();
    drop(second);
    let third = fill(&path, 3, MIB);
    assert_eq!(third.fragments()[0].as_slice().as_ptr() as usize, a + MIB);
    assert_eq!(verify(&third), Ok(3));
    assert_eq!(verify(&msg), Ok(0x5eed));
    drop(msg);
    let fourth = fill(&path, 4, MIB);
    assert_eq!(fourth.fragments()[0].as_slice().as_ptr() as usize, a);
    assert_eq!(verify(&fourth), Ok(4));
    assert_eq!(path.stats().collapsed, 1);
    drop((small, third, fourth));
    assert_eq!(path.outstanding(), 0);
    eprintln!("    ShmemPmdMapped: sender {here} kB, receiver {there} kB");
}

/// (b) The same with the default pages: neither end maps the message with 2 MiB entries
/// (the check (a) makes is not true of every mapping).
fn normal_path_is_not_pmd_mapped() {
    let (_g, d, name) = join("thp4k");
    let path = d
        .path(PathConfig {
            quota: 4 * LEN,
            ..PathConfig::default()
        })
        .unwrap();
    let (msg, report) = send_to_child(&name, &d, &path, LEN);
    let st = path.stats();
    assert_eq!((st.pages, st.collapsed), (Pages::Normal, 0));
    let addr = msg.fragments()[0].as_slice().as_ptr() as usize;
    assert_eq!(smaps_kb(addr, "ShmemPmdMapped:"), Some(0));
    assert_eq!(parse_report(&report).0, 0);
}

/// `vm.nr_hugepages`, put back when dropped.
struct HugePool {
    old: String,
}

const POOL: &str = "/proc/sys/vm/nr_hugepages";

impl HugePool {
    /// Takes the pool over, or says why not.
    fn take() -> Result<HugePool, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("not root: cannot set vm.nr_hugepages".into());
        }
        let old = std::fs::read_to_string(POOL).map_err(|e| format!("{POOL}: {e}"))?;
        Ok(HugePool {
            old: old.trim().to_owned(),
        })
    }

    /// Sets the pool to `n` pages; returns how many the kernel made.
    fn set(&self, n: u64) -> u64 {
        std::fs::write(POOL, n.to_string()).unwrap();
        std::fs::read_to_string(POOL)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for HugePool {
    fn drop(&mut self) {
        let _ = std::fs::write(POOL, &self.old);
    }
}

/// A group of hugetlb lots of `lot` bytes.
fn hugetlb_group(tag: &str, lot: usize) -> (std::sync::Arc<Group>, String) {
    let name = group_name(tag);
    let g = Group::open_with(
        &name,
        GroupConfig {
            lot_size: lot,
            pages: Pages::HugeTlb,
            ..GroupConfig::default()
        },
    )
    .unwrap();
    (g, name)
}

/// (c) With no huge page reserved, joining a group of hugetlb lots fails with
/// [`Error::NoHugePages`], whose message names the setting to change: no crash, no
/// `SIGBUS` later.
fn hugetlb_without_reserved_pages_is_a_clear_error() {
    let pool = match HugePool::take() {
        Ok(p) => p,
        Err(why) => return println!("SKIP: {why}"),
    };
    pool.set(0);
    let (g, _name) = hugetlb_group("hnone", 16 << 20);
    assert_eq!(g.pages(), Pages::HugeTlb);
    let e = g.join().expect_err("joined with no huge pages");
    let msg = e.to_string();
    assert!(
        matches!(e, Error::NoHugePages { lot_size, free: 0 } if lot_size == 16 << 20),
        "{e:?}"
    );
    assert!(msg.contains("vm.nr_hugepages"), "{msg}");
}

/// (d) With huge pages reserved, a group of hugetlb lots carries a message intact from
/// one process to another, whose mapping of it has 2 MiB pages; every fbuf is 2 MiB at
/// least; secured fbufs (2 MiB protection) work; and asking such a group for 4 KiB or
/// transparent paths, or for Genie's page-granular semantics, is refused.
fn hugetlb_lots_carry_data_and_refuse_page_granular_modes() {
    let pool = match HugePool::take() {
        Ok(p) => p,
        Err(why) => return println!("SKIP: {why}"),
    };
    // Two lots of 32 MiB (the child's and ours) and a spare.
    let lot = 32 << 20;
    let want = 2 * (lot >> 21) as u64 + 4;
    let got = pool.set(want);
    if got < want {
        return println!("SKIP: the kernel made only {got} of {want} huge pages");
    }
    let (g, name) = hugetlb_group("htlb", lot);
    let d = g.join().unwrap();
    let path = d
        .path(PathConfig {
            quota: lot,
            ..PathConfig::default()
        })
        .unwrap();
    assert_eq!(path.stats().pages, Pages::HugeTlb);
    // The smallest fbuf is a whole 2 MiB page.
    let small = path.alloc(100).unwrap().freeze();
    assert_eq!(path.outstanding(), 2 << 20);
    drop(small);
    let (msg, report) = send_to_child(&name, &d, &path, LEN);
    let addr = msg.fragments()[0].as_slice().as_ptr() as usize;
    assert_eq!(smaps_kb(addr, "KernelPageSize:"), Some(2048));
    assert_eq!(parse_report(&report).1, 2048, "receiver's page size");
    drop(msg);
    // Protection is per 2 MiB page: a secured path works.
    let secure = d
        .path(PathConfig {
            quota: 8 << 20,
            secure: true,
            ..PathConfig::default()
        })
        .unwrap();
    let mut b = secure.alloc(4096).unwrap();
    b.write_at(0, b"secured");
    let data = b.freeze();
    data.secure().unwrap();
    assert_eq!(&data.to_vec()[..7], b"secured");
    drop(data);
    for asked in [Pages::Normal, Pages::Transparent] {
        let e = d
            .path(PathConfig {
                pages: Some(asked),
                ..PathConfig::default()
            })
            .expect_err("a 4 KiB path in a hugetlb group");
        assert!(e.to_string().contains("hugetlb"), "{e}");
    }
    #[cfg(feature = "semantics")]
    {
        let e = ferry::semantics::Passing::new(&d, Default::default())
            .expect_err("page-granular semantics on hugetlb lots");
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().contains("4 KiB"), "{e}");
    }
}

/// (e) What the options cannot do is refused, with the reason: hugetlb pages for one
/// path of a shmem group, huge-page lots of a size or at an address that is not a
/// multiple of 2 MiB.
fn options_refuse_what_the_lots_cannot_do() {
    let (_g, d, _name) = join("hrefuse");
    let e = d
        .path(PathConfig {
            pages: Some(Pages::HugeTlb),
            ..PathConfig::default()
        })
        .expect_err("a hugetlb path in a shmem group");
    assert!(e.to_string().contains("group setting"), "{e}");
    for (pages, lot, base) in [
        (Pages::HugeTlb, 3 << 20, None),
        (Pages::Transparent, (1 << 30) + 4096, None),
        (Pages::HugeTlb, 4 << 20, Some(0x2000_0000_1000)),
    ] {
        let e = Group::open_with(
            &group_name("hbad"),
            GroupConfig {
                lot_size: lot,
                base_addr: base,
                pages,
                ..GroupConfig::default()
            },
        )
        .expect_err("a huge-page group of unaligned geometry");
        assert!(e.to_string().contains("2 MiB"), "{pages:?}: {e}");
    }
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[
        (
            "thp_path_carries_data_and_both_ends_map_2mib",
            thp_path_carries_data_and_both_ends_map_2mib,
        ),
        (
            "thp_path_shares_a_huge_page_between_1mib_fbufs",
            thp_path_shares_a_huge_page_between_1mib_fbufs,
        ),
        (
            "normal_path_is_not_pmd_mapped",
            normal_path_is_not_pmd_mapped,
        ),
        (
            "hugetlb_without_reserved_pages_is_a_clear_error",
            hugetlb_without_reserved_pages_is_a_clear_error,
        ),
        (
            "hugetlb_lots_carry_data_and_refuse_page_granular_modes",
            hugetlb_lots_carry_data_and_refuse_page_granular_modes,
        ),
        (
            "options_refuse_what_the_lots_cannot_do",
            options_refuse_what_the_lots_cannot_do,
        ),
    ]);
}
