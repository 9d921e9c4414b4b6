//! The xlate registration cache on real files, real sockets and a real second process:
//! data integrity through hits, misses, bounces and evictions; the unmap/remap cases;
//! the fallback paths; the rate limit; no leaked descriptors.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::{Mutex, MutexGuard};

use ferry::uring::xlate::{Invalidation, Miss, Mode, SendOp, Xlate, XlateConfig};
use ferry::uring::Features;

/// Tests run one at a time, so descriptor counts and stats are not disturbed.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn have_xlate() -> bool {
    let f = Features::probe();
    if !(f.ring && f.fixed_rw && f.sparse_buffers) {
        eprintln!("skipped: no io_uring fixed buffers here ({:?})", f.why_not);
        return false;
    }
    true
}

/// Serialises the test and checks that it can run here: `None` (the skip printed) if not.
fn begin() -> Option<MutexGuard<'static, ()>> {
    let g = serial();
    have_xlate().then_some(g)
}

fn watching(x: &Xlate) -> bool {
    match x.invalidation() {
        Invalidation::Userfaultfd => true,
        Invalidation::Off(why) => {
            eprintln!("skipped (cache part): unmaps not watched: {why}");
            false
        }
    }
}

/// A cache of `table_slots` entries that bounces a miss and registers its range while
/// the copy runs.
fn serve_every_miss(table_slots: u32) -> XlateConfig {
    XlateConfig {
        table_slots,
        mode: Mode::Cache(Miss::Fallback { rate_limit: None }),
        ..XlateConfig::default()
    }
}

/// An `Xlate` built with `cfg`, if it watches unmaps (`None`, the skip printed, if not).
fn watched(cfg: XlateConfig) -> Option<Xlate> {
    let x = Xlate::new(cfg).unwrap();
    watching(&x).then_some(x)
}

fn temp_file(tag: &str) -> File {
    let p = std::env::temp_dir().join(format!("ferry-xlate-{tag}-{}", std::process::id()));
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    std::fs::remove_file(&p).unwrap();
    f
}

fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Deterministic pseudo-random bytes.
fn fill(buf: &mut [u8], seed: u64) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in buf {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *b = s as u8;
    }
}

fn read_back(f: &File, off: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut v = vec![0u8; len];
    f.read_exact_at(&mut v, off).unwrap();
    v
}

/// Anonymous private mapping (page-aligned), unmapped by the test itself.
fn anon(len: usize) -> *mut u8 {
    // SAFETY: a fresh mapping wherever the kernel likes.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

/// Fresh read-write anonymous memory at `addr`, placed by `fixed` (`MAP_FIXED` or
/// `MAP_FIXED_NOREPLACE`).
fn anon_fixed(addr: *mut u8, len: usize, fixed: libc::c_int) -> *mut libc::c_void {
    // SAFETY: the callers map only over a range this test owns (`MAP_FIXED`) or over a
    // gap (`MAP_FIXED_NOREPLACE`, which never replaces a mapping).
    unsafe {
        libc::mmap(
            addr.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed,
            -1,
            0,
        )
    }
}

/// `MAP_FIXED` over a range this test owns (mapped by `anon`).
fn anon_at(addr: *mut u8, len: usize) {
    assert_eq!(anon_fixed(addr, len, libc::MAP_FIXED).cast(), addr);
}

/// Another thread mapped something into a gap this test had just unmapped.
#[derive(Debug)]
struct HoleTaken;

/// Maps fresh memory into the gap at `addr` that this test just unmapped, with
/// `MAP_FIXED_NOREPLACE`: in the instant between the unmap and this call another thread
/// (the allocator, the monitor, the test harness) may have mapped something there, and a
/// plain `MAP_FIXED` would clobber that mapping, whose owner would later unmap "its"
/// range from under us (seen as a SIGSEGV in the fill, under load). Then the case is
/// run again on fresh memory.
fn refill_hole(addr: *mut u8, len: usize) -> Result<(), HoleTaken> {
    let p = anon_fixed(addr, len, libc::MAP_FIXED_NOREPLACE);
    if p == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{e}");
        return Err(HoleTaken);
    }
    assert_eq!(p.cast(), addr);
    Ok(())
}

/// Runs `case` (which unmaps and refills an address) up to three times, each on a fresh
/// cache and fresh memory, until no other thread took the gap.
fn with_fresh_holes(case: impl Fn() -> Result<(), HoleTaken>) {
    for attempt in 1..=3 {
        match case() {
            Ok(()) => return,
            Err(HoleTaken) => eprintln!(
                "attempt {attempt}: another thread mapped the unmapped gap first; again on fresh memory"
            ),
        }
    }
    panic!("three attempts in a row lost the unmapped gap to another thread");
}

fn modes() -> Vec<(&'static str, Mode)> {
    vec![
        (
            "cache, fallback, no limit",
            Mode::Cache(Miss::Fallback { rate_limit: None }),
        ),
        (
            "cache, fallback, 16 KiB limit",
            Mode::Cache(Miss::Fallback {
                rate_limit: Some(16 << 10),
            }),
        ),
        ("cache, register first", Mode::Cache(Miss::RegisterFirst)),
        ("bounce only", Mode::BounceOnly),
        ("register every I/O", Mode::RegisterEveryIo),
    ]
}

#[test]
fn file_data_survives_hits_misses_bounces_and_evictions() {
    let Some(_g) = begin() else { return };
    // 12 distinct buffers, 4 slots: eviction is constant. Sizes cross the 16 KiB bounce
    // size, so large I/Os also run in chunks.
    let sizes = [512usize, 2048, 4096, 5000, 40_000, 70_000];
    for (name, mode) in modes() {
        let mut x = Xlate::new(XlateConfig {
            table_slots: 4,
            bounce_buffers: 2,
            bounce_size: 16 << 10,
            mode,
            watch_unmaps: true,
            ..XlateConfig::default()
        })
        .unwrap();
        let f = temp_file("integrity");
        let mut bufs: Vec<Vec<u8>> = (0..12).map(|i| vec![0u8; sizes[i % sizes.len()]]).collect();
        let mut off = 0u64;
        let mut expect = Vec::new();
        for round in 0..4u64 {
            for (i, b) in bufs.iter_mut().enumerate() {
                fill(b, round * 100 + i as u64);
                let n = x.write_at(&f, b, off).unwrap();
                assert_eq!(n, b.len(), "{name}");
                expect.push((off, fnv(b), b.len()));
                off += b.len() as u64;
            }
        }
        for &(o, sum, len) in &expect {
            assert_eq!(fnv(&read_back(&f, o, len)), sum, "{name}: file at {o}");
        }
        // And back through xlate, into the same (cached) buffers.
        // Each read twice: six buffers cycling through four LRU slots would hit only where
        // the allocator happened to put two buffers in one page, so the second read is the
        // hit that does not depend on heap layout.
        for &(o, sum, len) in expect.iter().rev().take(24) {
            let b = bufs.iter_mut().find(|b| b.len() == len).unwrap();
            for _ in 0..2 {
                b.fill(0);
                assert_eq!(x.read_at(&f, b, o).unwrap(), len);
                assert_eq!(fnv(b), sum, "{name}: read_at {o}");
            }
        }
        let s = x.stats();
        eprintln!("{name}: {s:?}");
        let written: u64 = expect.iter().map(|e| e.2 as u64).sum();
        assert_eq!(s.bytes, written + read_bytes(&expect), "{name}");
        match mode {
            Mode::BounceOnly => {
                assert_eq!(s.fallbacks, s.ios);
                assert_eq!(s.registrations, 0);
            }
            Mode::RegisterEveryIo => assert_eq!(s.registrations, s.ios),
            Mode::Cache(_) if watching(&x) => {
                assert!(s.hits > 0, "{name}: {s:?}");
                assert!(s.misses > 0, "{name}: {s:?}");
                assert!(s.evictions > 0, "{name}: 12 buffers in 4 slots must evict");
                assert_eq!(s.hits + s.misses, s.ios);
                assert!(x.cached() <= 4);
            }
            Mode::Cache(_) => assert_eq!(s.uncached, s.ios),
        }
    }
}

fn read_bytes(expect: &[(u64, u64, usize)]) -> u64 {
    2 * expect
        .iter()
        .rev()
        .take(24)
        .map(|e| e.2 as u64)
        .sum::<u64>()
}

/// The hard case: a cached range is unmapped and new memory appears at the same address.
/// Each way of doing that must make the next I/O carry the new bytes, not the pinned
/// old pages.
#[test]
fn unmap_and_remap_never_send_stale_bytes() {
    let Some(_g) = begin() else { return };
    with_fresh_holes(remap_cases);
}

fn remap_cases() -> Result<(), HoleTaken> {
    let Some(mut x) = watched(serve_every_miss(8)) else {
        return Ok(());
    };
    let len = 2 * rustix::param::page_size();
    let f = temp_file("remap");
    let p = anon(len);
    let buf = |v: u8| {
        // SAFETY: `p..p+len` is mapped read-write by this test whenever a slice is made,
        // and no slice outlives the next remapping.
        let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
        s.fill(v);
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(p, len) }
    };
    let mut off = 0u64;
    let mut check = |x: &mut Xlate, v: u8, what: &str| {
        let b = buf(v);
        assert_eq!(x.write_at(&f, b, off).unwrap(), len);
        let got = read_back(&f, off, len);
        assert!(
            got.iter().all(|&c| c == v),
            "{what}: stale bytes {:?}",
            &got[..4]
        );
        off += len as u64;
    };

    // Register (miss, then served) and hit.
    check(&mut x, b'a', "first write");
    check(&mut x, b'b', "cached write");
    let s0 = x.stats();
    assert_eq!(s0.hits, 1, "{s0:?}");
    assert_eq!(x.cached(), 1);

    // 1. munmap, then mmap fresh memory at the same address.
    // SAFETY: the range is ours and no slice into it is alive.
    assert_eq!(unsafe { libc::munmap(p.cast(), len) }, 0);
    refill_hole(p, len)?;
    assert_eq!(
        x.cached(),
        0,
        "munmap must have dropped the entry before returning"
    );
    check(&mut x, b'c', "after munmap + mmap");
    check(&mut x, b'd', "re-registered after munmap");

    // 2. mmap(MAP_FIXED) straight over the cached range.
    anon_at(p, len);
    check(&mut x, b'e', "after MAP_FIXED over");
    check(&mut x, b'f', "re-registered after MAP_FIXED");

    // 3. madvise(MADV_DONTNEED): the pages are replaced by zero pages on next touch.
    // SAFETY: the range is ours.
    let rc = unsafe { libc::madvise(p.cast(), len, libc::MADV_DONTNEED) };
    assert_eq!(rc, 0);
    check(&mut x, b'g', "after MADV_DONTNEED");
    check(&mut x, b'h', "re-registered after MADV_DONTNEED");

    // 4. mremap the range away, then map new memory where it was.
    let q = anon(len);
    // SAFETY: moves our mapping onto `q` (also ours); nothing refers to either.
    let r = unsafe {
        libc::mremap(
            p.cast(),
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            q.cast::<libc::c_void>(),
        )
    };
    assert_eq!(r.cast(), q);
    if let Err(taken) = refill_hole(p, len) {
        // SAFETY: `q` is ours (the moved mapping); `p` is no longer.
        unsafe { libc::munmap(q.cast(), len) };
        return Err(taken);
    }
    check(&mut x, b'i', "after mremap away + mmap");

    let s = x.stats();
    eprintln!("remap: {s:?}");
    assert!(s.invalidations >= 4, "{s:?}");
    assert!(
        s.hits >= 4,
        "the cache was actually used between remaps: {s:?}"
    );
    // SAFETY: both ranges are ours.
    unsafe {
        libc::munmap(p.cast(), len);
        libc::munmap(q.cast(), len);
    }
    Ok(())
}

/// Two caches in one process hold the same buffer: both cache it (they share the
/// process's one userfaultfd), and an unmap invalidates it in both.
#[test]
fn two_caches_share_the_watcher() {
    let Some(_g) = begin() else { return };
    let cfg = XlateConfig {
        mode: Mode::Cache(Miss::RegisterFirst),
        ..XlateConfig::default()
    };
    let mut a = Xlate::new(cfg.clone()).unwrap();
    let mut b = Xlate::new(cfg).unwrap();
    if !watching(&a) {
        return;
    }
    let len = rustix::param::page_size();
    let f = temp_file("two");
    let p = anon(len);
    for (v, off) in [(b'x', 0u64), (b'y', 4096)] {
        // SAFETY: `p` is mapped read-write for `len` bytes here.
        let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
        s.fill(v);
        a.write_at(&f, s, off).unwrap();
        b.write_at(&f, s, off + 8192).unwrap();
    }
    assert_eq!((a.stats().hits, b.stats().hits), (1, 1));
    assert_eq!(
        (a.stats().register_failures, b.stats().register_failures),
        (0, 0)
    );
    anon_at(p, len);
    assert_eq!((a.cached(), b.cached()), (0, 0), "both invalidated");
    // SAFETY: as above, fresh memory at the same address.
    let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
    s.fill(b'z');
    a.write_at(&f, s, 16384).unwrap();
    b.write_at(&f, s, 20480).unwrap();
    assert!(read_back(&f, 16384, 2 * len).iter().all(|&c| c == b'z'));
    // SAFETY: ours.
    unsafe { libc::munmap(p.cast(), len) };
}

/// The allocator's own reuse: buffers are allocated, cached, freed and allocated again
/// (often at the same address, after glibc has trimmed or unmapped the memory in
/// between), on heap and mmap-backed sizes. Every write must carry the current bytes, and
/// nothing may deadlock (a watchdog aborts the test after 60 s).
#[test]
fn allocator_reuse_never_goes_stale_or_deadlocks() {
    let Some(_g) = begin() else { return };
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = std::sync::Arc::clone(&done);
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(60));
        if !d.load(std::sync::atomic::Ordering::Acquire) {
            eprintln!("allocator_reuse: deadlocked");
            std::process::abort();
        }
    });
    let mut x = Xlate::new(serve_every_miss(16)).unwrap();
    let f = temp_file("reuse");
    let sizes = [4096usize, 20_000, 150_000, 300_000, 1 << 20];
    let mut seen = std::collections::HashSet::new();
    let mut reused = 0;
    for i in 0..300u64 {
        let len = sizes[i as usize % sizes.len()];
        let mut v = vec![0u8; len];
        fill(&mut v, i);
        if !seen.insert(v.as_ptr() as usize) {
            reused += 1;
        }
        assert_eq!(x.write_at(&f, &v, 0).unwrap(), len);
        assert_eq!(fnv(&read_back(&f, 0, len)), fnv(&v), "iteration {i}");
        // Twice, so the second write is a hit when the first registered.
        fill(&mut v, i + 1000);
        assert_eq!(x.write_at(&f, &v, 0).unwrap(), len);
        assert_eq!(fnv(&read_back(&f, 0, len)), fnv(&v), "iteration {i}, again");
        drop(v);
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let s = x.stats();
    eprintln!("allocator reuse: {reused} of 300 allocations reused an address; {s:?}");
    if watching(&x) {
        assert!(s.hits > 0, "{s:?}");
    }
    assert!(
        reused > 0,
        "the allocator never reused an address: the test proves nothing"
    );
}

#[test]
fn without_a_watcher_nothing_is_cached_and_every_io_bounces() {
    let Some(_g) = begin() else { return };
    let mut x = Xlate::new(XlateConfig {
        watch_unmaps: false,
        ..serve_every_miss(256)
    })
    .unwrap();
    assert!(matches!(x.invalidation(), Invalidation::Off(_)));
    let f = temp_file("nowatch");
    let mut b = vec![0u8; 8192];
    for i in 0..10u64 {
        fill(&mut b, i);
        x.write_at(&f, &b, i * 8192).unwrap();
        assert_eq!(fnv(&read_back(&f, i * 8192, 8192)), fnv(&b));
    }
    let s = x.stats();
    assert_eq!(
        (s.uncached, s.fallbacks, s.hits, s.registrations),
        (10, 10, 0, 0),
        "{s:?}"
    );
    assert_eq!(x.cached(), 0);
}

#[test]
fn memory_that_cannot_be_registered_bounces_and_is_counted() {
    let Some(_g) = begin() else { return };
    let Some(mut x) = watched(serve_every_miss(256)) else {
        return;
    };
    // A shared mapping of a file on the temp directory's disk filesystem: neither
    // userfaultfd nor io_uring accept it.
    let backing = temp_file("backing");
    let len = 4 * rustix::param::page_size();
    backing.set_len(len as u64).unwrap();
    // SAFETY: maps the file just created; unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            backing.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping is `len` bytes, read-write, alive until the munmap below.
    let b = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
    let f = temp_file("fileback");
    for i in 0..5u64 {
        fill(b, i);
        assert_eq!(x.write_at(&f, b, i * len as u64).unwrap(), len);
        assert_eq!(fnv(&read_back(&f, i * len as u64, len)), fnv(b));
    }
    let s = x.stats();
    eprintln!("file-backed: {s:?}");
    assert_eq!(s.hits, 0, "{s:?}");
    assert_eq!(s.fallbacks, 5);
    assert_eq!(s.register_failures, 5, "every miss tried and failed: {s:?}");
    // SAFETY: mapped above.
    unsafe { libc::munmap(p, len) };
}

#[test]
fn rate_limit_bounds_registrations() {
    let Some(_g) = begin() else { return };
    let page = rustix::param::page_size();
    let n = 64usize << 10;
    for limit in [Some(n), None] {
        let mut x = Xlate::new(XlateConfig {
            table_slots: 8,
            mode: Mode::Cache(Miss::Fallback { rate_limit: limit }),
            ..XlateConfig::default()
        })
        .unwrap();
        if !watching(&x) {
            return;
        }
        let f = temp_file("rate");
        // 200 distinct one-page buffers, each in its own page, cycled twice.
        let region = vec![7u8; 201 * page];
        let base = region.as_ptr().align_offset(page);
        for round in 0..2 {
            for i in 0..200 {
                let b = &region[base + i * page..base + (i + 1) * page];
                x.write_at(&f, b, ((round * 200 + i) * page) as u64)
                    .unwrap();
            }
        }
        let s = x.stats();
        eprintln!("rate limit {limit:?}: {s:?}");
        match limit {
            Some(n) => {
                assert!(
                    s.registrations <= s.bytes / n as u64 + 1,
                    "{} registrations for {} bytes at one per {n}",
                    s.registrations,
                    s.bytes
                );
                assert!(s.registrations >= 2, "misses are served: {s:?}");
            }
            None => assert_eq!(s.registrations, s.misses, "every miss served: {s:?}"),
        }
        assert_eq!(s.fallbacks, s.misses);
    }
}

#[test]
fn no_descriptors_leak() {
    let Some(_g) = begin() else { return };
    let count = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    // The process-wide userfaultfd is opened once, by the first cache; open it first.
    drop(Xlate::new(XlateConfig::default()).unwrap());
    let before = count();
    for _ in 0..3 {
        let mut x = Xlate::new(XlateConfig::default()).unwrap();
        let f = temp_file("leak");
        x.write_at(&f, &[1u8; 4096], 0).unwrap();
        x.write_at(&f, &[1u8; 4096], 0).unwrap();
    }
    assert_eq!(count(), before);
}

/// A socket peer in a forked child: the parent sends many buffers (hits, misses,
/// evictions) through an `Xlate` built from `cfg`, and the child answers with the
/// checksum of everything it read, which the parent receives through xlate too. Returns
/// the cache and the number of `send` calls made.
fn socket_to_a_child(cfg: XlateConfig) -> (Xlate, u64) {
    let sizes = [512usize, 2048, 65536, 100_000];
    let mut bufs: Vec<Vec<u8>> = (0..10).map(|i| vec![0u8; sizes[i % 4]]).collect();
    let rounds = 3;
    // Each round sends every buffer once and the last one again: ten buffers cycling
    // through four LRU slots hit only where the allocator put two in one page, so the
    // repeat is the hit that does not depend on heap layout.
    let order: Vec<usize> = (0..bufs.len()).chain([bufs.len() - 1]).collect();
    let total: usize = order.iter().map(|&i| bufs[i].len()).sum::<usize>() * rounds;
    let (mut conn, pid) = fork_sink(total);
    let mut x = Xlate::new(cfg).unwrap();
    let mut calls = 0u64;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for round in 0..rounds {
        for (k, &i) in order.iter().enumerate() {
            let b = &mut bufs[i];
            if k + 1 < order.len() {
                fill(b, (round * 10 + i) as u64);
            }
            for &c in b.iter() {
                h ^= c as u64;
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            let mut sent = 0;
            while sent < b.len() {
                sent += x.send(&conn, &b[sent..]).unwrap();
                calls += 1;
            }
        }
    }
    let mut answer = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        let n = x.recv(&conn, &mut answer[got..]).unwrap();
        assert!(n > 0, "child closed early");
        got += n;
    }
    let mut rest = Vec::new();
    conn.read_to_end(&mut rest).unwrap();
    reap_sink(pid);
    assert_eq!(u64::from_le_bytes(answer), h, "checksum of {total} bytes");
    let s = x.stats();
    assert_eq!(s.direct, 1);
    if watching(&x) {
        assert!(s.hits > 0 && s.evictions > 0, "{s:?}");
    }
    (x, calls)
}

fn socket_cfg() -> XlateConfig {
    serve_every_miss(4)
}

/// The default send path: `WRITE_FIXED` on the socket from the registered buffer (hits)
/// and the bounce buffers (misses) carries every byte, with one completion per write and
/// no zero-copy notification.
#[test]
fn fixed_write_send_to_a_child_process_keeps_every_byte() {
    let Some(_g) = begin() else { return };
    let f = Features::probe();
    if !f.socket_write_fixed {
        eprintln!("skipped: WRITE_FIXED on a socket refused here");
        return;
    }
    let (x, _) = socket_to_a_child(socket_cfg());
    let s = x.stats();
    eprintln!("socket, WRITE_FIXED: {s:?}");
    assert_eq!(x.send_op(), SendOp::WriteFixed);
    assert_eq!((s.send_fallbacks, s.zc_copied), (0, 0), "{s:?}");
}

/// `zero_copy_send`: `SEND_ZC` from the fixed buffer, waiting for notifications.
#[test]
fn zero_copy_send_to_a_child_process_keeps_every_byte() {
    let Some(_g) = begin() else { return };
    if !Features::probe().send_zc {
        eprintln!("skipped: no SEND_ZC here");
        return;
    }
    let (x, _) = socket_to_a_child(XlateConfig {
        zero_copy_send: true,
        ..socket_cfg()
    });
    let s = x.stats();
    eprintln!(
        "socket, SEND_ZC: {s:?} (loopback copies even zero-copy sends: {} reported ZC_COPIED)",
        s.zc_copied
    );
    assert_eq!(x.send_op(), SendOp::SendZc);
    assert_eq!(s.send_fallbacks, 0, "{s:?}");
}

/// With `WRITE_FIXED` forced off, sends take the fallback a kernel without it would
/// (`SEND_ZC`, else a plain `SEND`), still carry every byte, and every call is counted.
#[test]
fn send_fallback_is_taken_and_counted_when_fixed_write_is_off() {
    let Some(_g) = begin() else { return };
    let (x, calls) = socket_to_a_child(XlateConfig {
        socket_write_fixed: false,
        ..socket_cfg()
    });
    let s = x.stats();
    eprintln!("socket, fallback: {s:?}");
    let want = if Features::probe().send_zc {
        SendOp::SendZc
    } else {
        SendOp::Plain
    };
    assert_eq!(x.send_op(), want);
    assert_eq!(s.send_fallbacks, calls, "{s:?}");
    assert!(calls >= 30, "{calls}");
}

/// Forks a child that connects to a fresh listener here, reads `total` bytes and sends
/// back their FNV-1a hash ([`child_sink`]); returns the accepted connection and its pid.
fn fork_sink(total: usize) -> (std::net::TcpStream, libc::pid_t) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // SAFETY: the child calls only async-signal-safe libc functions on stack memory and
    // leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: plain socket calls on stack memory.
        unsafe { child_sink(port, total) };
    }
    (listener.accept().unwrap().0, pid)
}

/// Waits for the child of [`fork_sink`] and checks that it exited cleanly.
fn reap_sink(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status}"
    );
}

/// Runs in the forked child: connects, reads `total` bytes, sends back their FNV-1a hash.
unsafe fn child_sink(port: u16, total: usize) -> ! {
    // SAFETY: socket calls on stack memory; the caller is the freshly forked child.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as _;
        sa.sin_port = port.to_be();
        sa.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        if libc::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        ) != 0
        {
            libc::_exit(2);
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut buf = [0u8; 16384];
        let mut left = total;
        while left > 0 {
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len().min(left));
            if n <= 0 {
                libc::_exit(3);
            }
            for &c in &buf[..n as usize] {
                h ^= c as u64;
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            left -= n as usize;
        }
        let out = h.to_le_bytes();
        if libc::write(fd, out.as_ptr().cast(), 8) != 8 {
            libc::_exit(4);
        }
        libc::close(fd);
        libc::_exit(0);
    }
}

/// The socket send path (`WRITE_FIXED` from the registered pages by default) also never
/// sends the pinned old pages after the range is unmapped and mapped anew.
#[test]
fn socket_send_after_remap_carries_the_new_bytes() {
    let Some(_g) = begin() else { return };
    with_fresh_holes(socket_remap_case);
}

fn socket_remap_case() -> Result<(), HoleTaken> {
    let Some(mut x) = watched(serve_every_miss(8)) else {
        return Ok(());
    };
    let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
    let len = 2 * rustix::param::page_size();
    let p = anon(len);
    let mut send_and_check = |x: &mut Xlate, v: u8, what: &str| {
        // SAFETY: `p..p+len` is mapped read-write by this test whenever a slice is made,
        // and no slice outlives the next remapping.
        let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
        s.fill(v);
        let mut sent = 0;
        while sent < len {
            sent += x.send(&a, &s[sent..]).unwrap();
        }
        let mut got = vec![0u8; len];
        b.read_exact(&mut got).unwrap();
        assert!(
            got.iter().all(|&c| c == v),
            "{what}: stale bytes {:?}",
            &got[..4]
        );
    };
    send_and_check(&mut x, 1, "first send (miss)");
    send_and_check(&mut x, 2, "second send (hit)");
    assert_eq!(x.stats().hits, 1, "{:?}", x.stats());
    // SAFETY: the test's own mapping; nothing refers to it across this call.
    assert_eq!(unsafe { libc::munmap(p.cast(), len) }, 0);
    refill_hole(p, len)?;
    send_and_check(&mut x, 3, "after munmap + mmap");
    let s = x.stats();
    assert!(s.invalidations >= 1, "{s:?}");
    assert_eq!(s.hits, 1, "the remapped range must not hit: {s:?}");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::munmap(p.cast(), len) }, 0);
    Ok(())
}

/// An `Xlate` can move to another thread (it owns its ring and shares only locked state).
#[test]
fn xlate_is_send() {
    fn send<T: Send>() {}
    send::<Xlate>();
}

/// Bounced stream sends with several chunks in flight (`SEND_ZC`, linked): a chunk that
/// the kernel sends only in part does not break an io_uring link, so the chunks after it
/// must not be in flight, or the stream loses bytes and order. A tiny send buffer makes
/// short sends common; the child checks every byte.
#[test]
fn bounced_zero_copy_sends_through_a_small_send_buffer_keep_every_byte() {
    let Some(_g) = begin() else { return };
    if !Features::probe().send_zc {
        eprintln!("skipped: no SEND_ZC here");
        return;
    }
    let total = 4 << 20;
    // A mapping of its own, not the heap: freeing 4 MiB through malloc raises glibc's mmap
    // threshold and changes where later tests' buffers land (their hit counts depend on it).
    let mem = anon(total);
    // SAFETY: `mem` is a fresh private mapping of `total` bytes, unmapped at the end.
    let data = unsafe { std::slice::from_raw_parts_mut(mem, total) };
    fill(data, 4242);
    let (mut conn, pid) = fork_sink(total);
    let small: libc::c_int = 4096;
    // SAFETY: setsockopt reads one c_int from the stack.
    let rc = unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&small as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    let mut x = Xlate::new(XlateConfig {
        mode: Mode::BounceOnly,
        bounce_buffers: 4,
        zero_copy_send: true,
        ..XlateConfig::default()
    })
    .unwrap();
    let mut sent = 0;
    while sent < total {
        let n = x
            .send(&conn, &data[sent..])
            .unwrap_or_else(|e| panic!("send after {sent} of {total} bytes: {e}"));
        assert!(n > 0);
        sent += n;
    }
    let mut answer = [0u8; 8];
    conn.read_exact(&mut answer).unwrap();
    reap_sink(pid);
    assert_eq!(
        u64::from_le_bytes(answer),
        fnv(data),
        "checksum of {total} bytes"
    );
    // SAFETY: the mapping made above; `data` is not used after this.
    assert_eq!(unsafe { libc::munmap(mem.cast(), total) }, 0);
}
