//! Container shipping with real descriptors: files in a temp dir, pipes and Unix socket
//! pairs. Every test takes one lock: libtest runs tests on several threads of this process,
//! and the tests count descriptors and mappings process-wide.

use std::fs::File;
use std::io::{IoSlice, Read, Seek, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, MutexGuard};

use ferry::containers::{self, Container};
use ferry::{BadDescriptor, Error};
use rustix::fs::{memfd_create, MemfdFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn page() -> usize {
    rustix::param::page_size()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Mappings of pallet memfds in this process.
fn pallet_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd:ferry-pallet"))
        .count()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// An unlinked temp file holding `bytes`, positioned at 0.
fn temp_file(bytes: &[u8]) -> File {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let p = std::env::temp_dir().join(format!(
        "ferry-containers-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let mut f = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap();
    std::fs::remove_file(&p).unwrap();
    f.write_all(bytes).unwrap();
    f.rewind().unwrap();
    f
}

fn pipe() -> (File, File) {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
    (File::from(r), File::from(w))
}

/// Writes `bytes` into pallet `i` through a mapping and sets them valid at `at`.
fn put(c: &mut Container, i: usize, at: usize, bytes: &[u8]) {
    let mut p = c.unload(i).unwrap();
    p.as_mut_slice()[at..at + bytes.len()].copy_from_slice(bytes);
    p.reload(at..at + bytes.len()).unwrap();
}

fn valid_bytes(c: &mut Container, i: usize) -> Vec<u8> {
    c.view(i).unwrap().valid_bytes().to_vec()
}

#[test]
fn fresh_pallets_are_zero_page_multiples() {
    let _g = lock();
    let mut c = Container::alloc(&[1, page(), page() + 1, 3 * page() - 1]).unwrap();
    let sizes: Vec<usize> = c.pallets().iter().map(|p| p.size()).collect();
    assert_eq!(sizes, [page(), page(), 2 * page(), 3 * page()]);
    for i in 0..c.len() {
        let v = c.view(i).unwrap();
        assert!(v.as_slice().iter().all(|&b| b == 0));
        assert_eq!(v.valid(), 0..0);
    }
    let like = Container::alloc_like(&c).unwrap();
    let info = like.info().unwrap();
    assert_eq!(info.capacity(), 7 * page());
    assert!(info
        .pallets
        .iter()
        .all(|p| !p.sealed && !p.lent && !p.unloaded && p.valid.is_empty()));
    assert!(matches!(
        c.unload(9),
        Err(Error::NoSuchPallet { index: 9, count: 4 })
    ));
}

#[test]
fn fill_from_file_empty_to_file_edge_sizes() {
    let _g = lock();
    for len in [0, 1, page() - 1, page(), page() + 1, 3 * page()] {
        let data = pattern(len as u8, len);
        let src = temp_file(&data);
        let mut c = Container::alloc(&[len.max(1)]).unwrap();
        let before = pallet_mappings();
        assert_eq!(c.fill(0, &src, usize::MAX).unwrap(), len);
        assert_eq!(pallet_mappings(), before, "fill must not map the pallet");
        assert_eq!(c.pallet(0).unwrap().valid(), 0..len);
        let mut dst = temp_file(b"");
        assert_eq!(c.empty(0, &dst).unwrap(), len);
        assert!(!c.pallet(0).unwrap().is_lent(), "a file gets its own copy");
        dst.rewind().unwrap();
        let mut out = Vec::new();
        dst.read_to_end(&mut out).unwrap();
        assert_eq!(out, data, "len {len}");
    }
}

#[test]
fn fill_stops_at_len_and_pallet_size() {
    let _g = lock();
    let data = pattern(3, 3 * page());
    let mut src = temp_file(&data);
    let mut c = Container::alloc(&[page(), page()]).unwrap();
    assert_eq!(c.fill(0, &src, 100).unwrap(), 100);
    // The file position advanced: the next fill continues where the first stopped.
    assert_eq!(c.fill(1, &src, usize::MAX).unwrap(), page());
    assert_eq!(valid_bytes(&mut c, 0), &data[..100]);
    assert_eq!(valid_bytes(&mut c, 1), &data[100..100 + page()]);
    src.rewind().unwrap();
}

#[test]
fn fill_from_pipe_and_socket() {
    let _g = lock();
    let data = pattern(9, 300_000);
    // Pipe source: splice(pipe -> memfd).
    let (r, mut w) = pipe();
    let d = data.clone();
    let t = std::thread::spawn(move || w.write_all(&d).unwrap());
    let mut c = Container::alloc(&[200_000, 200_000]).unwrap();
    let n0 = c.fill(0, &r, usize::MAX).unwrap();
    let n1 = c.fill(1, &r, usize::MAX).unwrap();
    t.join().unwrap();
    assert_eq!(n0 + n1, data.len());
    let mut got = valid_bytes(&mut c, 0);
    got.extend(valid_bytes(&mut c, 1));
    assert_eq!(got, data);

    // Socket source: splice(socket -> pipe -> memfd).
    let (a, mut b) = UnixStream::pair().unwrap();
    let d = data.clone();
    let t = std::thread::spawn(move || {
        b.write_all(&d).unwrap();
        drop(b);
    });
    let mut c = Container::alloc(&[data.len()]).unwrap();
    assert_eq!(c.fill(0, &a, usize::MAX).unwrap(), data.len());
    t.join().unwrap();
    assert_eq!(valid_bytes(&mut c, 0), data);
}

#[test]
fn empty_sends_only_valid_bytes_to_socket_and_pipe() {
    let _g = lock();
    let mut c = Container::alloc(&[2 * page()]).unwrap();
    {
        let mut p = c.unload(0).unwrap();
        p.as_mut_slice().fill(b'x');
        p.as_mut_slice()[10..20].copy_from_slice(b"0123456789");
        p.reload(10..20).unwrap();
    }
    let (a, mut b) = UnixStream::pair().unwrap();
    assert_eq!(c.empty(0, &a).unwrap(), 10);
    assert!(c.pallet(0).unwrap().is_lent());
    drop(a);
    let mut out = Vec::new();
    b.read_to_end(&mut out).unwrap();
    assert_eq!(out, b"0123456789");

    let (mut r, w) = pipe();
    assert_eq!(c.empty(0, &w).unwrap(), 10);
    drop(w);
    let mut out = Vec::new();
    r.read_to_end(&mut out).unwrap();
    assert_eq!(out, b"0123456789");
}

#[test]
fn refilling_a_lent_pallet_never_changes_bytes_in_a_pipe() {
    let _g = lock();
    let len = 2 * page();
    let old = pattern(1, len);
    let mut c = Container::alloc(&[len]).unwrap();
    put(&mut c, 0, 0, &old);

    // The pipe now references the pallet's pages; nobody has read them yet.
    let (mut r, w) = pipe();
    assert_eq!(c.empty(0, &w).unwrap(), len);
    assert!(c.pallet(0).unwrap().is_lent());

    // Refill from a file, then overwrite through a writable unload.
    let new = pattern(200, len);
    assert_eq!(c.fill(0, temp_file(&new), usize::MAX).unwrap(), len);
    assert!(!c.pallet(0).unwrap().is_lent());
    assert_eq!(valid_bytes(&mut c, 0), new);
    put(&mut c, 0, 0, &pattern(77, len));

    drop(w);
    let mut out = Vec::new();
    r.read_to_end(&mut out).unwrap();
    assert_eq!(out, old, "bytes already in the pipe changed");
}

#[test]
fn unloading_a_lent_pallet_keeps_its_data_but_not_its_pages() {
    let _g = lock();
    let old = pattern(5, page());
    let mut c = Container::alloc(&[page()]).unwrap();
    put(&mut c, 0, 0, &old);
    let (mut r, w) = pipe();
    c.empty(0, &w).unwrap();
    {
        let mut p = c.unload(0).unwrap();
        // The valid bytes came along to the fresh memfd...
        assert_eq!(p.valid_bytes(), &old[..]);
        // ...but writing them does not reach the pipe.
        p.as_mut_slice().fill(0xee);
    }
    drop(w);
    let mut out = Vec::new();
    r.read_to_end(&mut out).unwrap();
    assert_eq!(out, old);
}

#[test]
fn ship_moves_everything_and_leaves_nothing_behind() {
    let _g = lock();
    let fds0 = open_fds();
    let maps0 = pallet_mappings();
    let (a, b) = UnixStream::pair().unwrap();
    let fds1 = open_fds();
    {
        let mut c = Container::alloc(&[page(), 3 * page(), 1]).unwrap();
        put(&mut c, 0, 5, b"first");
        put(&mut c, 1, page(), &pattern(4, page()));
        assert_eq!(open_fds(), fds1 + 3);
        c.ship(&a).unwrap();
        // The sender holds no fd and no mapping now (the pallets are in the socket).
        assert_eq!(open_fds(), fds1);
        assert_eq!(pallet_mappings(), maps0);

        let mut got = Container::receive(&b).unwrap();
        assert_eq!(open_fds(), fds1 + 3);
        let info = got.info().unwrap();
        assert_eq!(info.pallets.len(), 3);
        assert_eq!(info.pallets[0].valid, 5..10);
        assert_eq!(info.pallets[1].valid, page()..2 * page());
        assert_eq!(info.pallets[2].valid, 0..0);
        assert_eq!(valid_bytes(&mut got, 0), b"first");
        assert_eq!(valid_bytes(&mut got, 1), pattern(4, page()));
    }
    drop((a, b));
    assert_eq!(open_fds(), fds0);
    assert_eq!(pallet_mappings(), maps0);
}

#[test]
fn shipping_with_a_pallet_unloaded_is_an_error() {
    let _g = lock();
    let (a, b) = UnixStream::pair().unwrap();
    let mut c = Container::alloc(&[page(), page()]).unwrap();
    // A live guard borrows the container, so `ship` does not compile; a leaked guard is
    // caught at run time.
    std::mem::forget(c.unload(1).unwrap());
    assert!(matches!(c.seal(), Err(Error::PalletUnloaded { pallet: 1 })));
    let err = c.ship(&a).unwrap_err();
    assert!(matches!(err.error, Error::PalletUnloaded { pallet: 1 }));
    let c = err
        .container
        .expect("nothing was sent, so the container comes back");
    assert_eq!(c.len(), 2);
    assert!(c.info().unwrap().pallets[1].unloaded);
    // Nothing reached the peer.
    b.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(
        (&b).read(&mut buf).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
}

/// Something that writes a (bad) message into a socket.
type Sender<'a> = Box<dyn Fn(&UnixStream) + 'a>;

/// Sends a hand-made container message.
fn send_raw(sock: &UnixStream, count: u32, entries: &[[u64; 4]], fds: &[&dyn AsFd]) {
    let mut h = b"FERRYCT1".to_vec();
    h.extend_from_slice(&count.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    for e in entries {
        for v in e {
            h.extend_from_slice(&v.to_le_bytes());
        }
    }
    let fds: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(fds.is_empty() || control.push(SendAncillaryMessage::ScmRights(&fds)));
    let sent = rustix::net::sendmsg(sock, &[IoSlice::new(&h)], &mut control, SendFlags::NOSIGNAL);
    assert_eq!(sent.unwrap(), h.len());
}

#[test]
fn receive_rejects_bad_messages_and_closes_their_fds() {
    let _g = lock();
    let p = page() as u64;
    let memfd = move || -> OwnedFd {
        let fd = memfd_create("test", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, p).unwrap();
        fd
    };
    let baseline = open_fds();
    let cases: Vec<(&str, Sender<'_>)> = vec![
        (
            "bad magic",
            Box::new(|s| {
                (&*s).write_all(&[b'X'; 16]).unwrap();
            }),
        ),
        (
            "too many pallets",
            Box::new(|s| send_raw(s, 100_000, &[], &[])),
        ),
        (
            "regular file, not a memfd",
            Box::new(move |s| send_raw(s, 1, &[[p, 0, 0, 0]], &[&temp_file(&vec![0; p as usize])])),
        ),
        (
            "a pipe",
            Box::new(move |s| send_raw(s, 1, &[[p, 0, 0, 0]], &[&pipe().0])),
        ),
        (
            "size differs",
            Box::new(move |s| send_raw(s, 1, &[[2 * p, 0, 0, 0]], &[&memfd()])),
        ),
        (
            "size not a page multiple",
            Box::new(move |s| send_raw(s, 1, &[[p - 1, 0, 0, 0]], &[&memfd()])),
        ),
        (
            "valid range outside",
            Box::new(move |s| send_raw(s, 1, &[[p, 10, p + 1, 0]], &[&memfd()])),
        ),
        (
            "valid range reversed",
            Box::new(move |s| send_raw(s, 1, &[[p, 10, 5, 0]], &[&memfd()])),
        ),
        (
            "claims sealed",
            Box::new(move |s| send_raw(s, 1, &[[p, 0, 0, 1]], &[&memfd()])),
        ),
        (
            "unknown flags",
            Box::new(move |s| send_raw(s, 1, &[[p, 0, 0, 8]], &[&memfd()])),
        ),
        (
            "fewer fds than pallets",
            Box::new(move |s| send_raw(s, 2, &[[p, 0, 0, 0], [p, 0, 0, 0]], &[&memfd()])),
        ),
        (
            "more fds than pallets",
            Box::new(move |s| send_raw(s, 1, &[[p, 0, 0, 0]], &[&memfd(), &memfd()])),
        ),
        (
            "cut short",
            Box::new(move |s| {
                send_raw(s, 2, &[[p, 0, 0, 0]], &[&memfd(), &memfd()]);
                s.shutdown(std::net::Shutdown::Write).unwrap();
            }),
        ),
    ];
    for (what, send) in cases {
        let (a, b) = UnixStream::pair().unwrap();
        send(&a);
        match Container::receive(&b) {
            Err(Error::BadDescriptor(_)) => {}
            other => panic!("{what}: expected BadDescriptor, got {other:?}"),
        }
        drop((a, b));
        assert_eq!(open_fds(), baseline, "{what}: descriptors leaked");
    }
    // A closed socket is a disconnect, not bad input.
    let (a, b) = UnixStream::pair().unwrap();
    drop(a);
    assert!(matches!(Container::receive(&b), Err(Error::Disconnected)));
    // And a well-formed hand-made message is accepted.
    let (a, b) = UnixStream::pair().unwrap();
    send_raw(&a, 1, &[[p, 1, 2, 0]], &[&memfd()]);
    let c = Container::receive(&b).unwrap();
    assert_eq!(c.pallet(0).unwrap().valid(), 1..2);
    let _ = BadDescriptor::BadLength; // the error type is public for matching
}

#[test]
fn sealed_pallets_cannot_be_changed_by_a_producer_that_kept_the_fd() {
    let _g = lock();
    let (a, b) = UnixStream::pair().unwrap();
    let mut c = Container::alloc(&[page()]).unwrap();
    put(&mut c, 0, 0, b"trusted");
    let kept = c.pallet(0).unwrap().as_fd().try_clone_to_owned().unwrap();
    c.seal().unwrap();
    assert!(c.is_sealed().unwrap());
    c.ship(&a).unwrap();

    let mut got = Container::receive(&b).unwrap();
    assert!(got.is_sealed().unwrap());
    assert!(got.pallet(0).unwrap().is_sealed().unwrap());

    // The producer tries write(2)...
    let mut f = File::from(kept);
    f.rewind().unwrap();
    let e = f.write(b"TAMPER").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    // ...and a writable shared mapping.
    // SAFETY: a fresh mapping at a kernel-chosen address; it is expected to fail, and is
    // unmapped at once if it does not.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if m != libc::MAP_FAILED {
        // SAFETY: `m` is the mapping just made.
        unsafe { libc::munmap(m, page()) };
        panic!("writable mapping of a sealed pallet succeeded");
    }
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );
    assert!(f.set_len(0).is_err());
    assert_eq!(valid_bytes(&mut got, 0), b"trusted");

    // The receiver cannot write it or fill it either, but can read it.
    assert!(matches!(got.unload(0), Err(Error::Sealed { pallet: 0 })));
    assert!(matches!(
        got.fill(0, temp_file(b"x"), 1),
        Err(Error::Sealed { pallet: 0 })
    ));
}

#[test]
fn seal_fails_while_another_holder_maps_the_pallet_writable() {
    let _g = lock();
    let mut c = Container::alloc(&[page()]).unwrap();
    let fd = c.pallet(0).unwrap().as_fd().try_clone_to_owned().unwrap();
    let (prot, flags) = (ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED);
    // SAFETY: a null hint without MAP_FIXED cannot replace any existing mapping; nothing
    // reads or writes through `m`, which is unmapped below.
    let m = unsafe { mmap(std::ptr::null_mut(), page(), prot, flags, &fd, 0) }.unwrap();
    match c.seal() {
        Err(Error::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::EBUSY)),
        other => panic!("expected EBUSY, got {other:?}"),
    }
    // SAFETY: `m` is the page mapped above, and nothing refers to it.
    unsafe { munmap(m, page()) }.unwrap();
    c.seal().unwrap();
    assert!(c.info().unwrap().pallets[0].sealed);
}

#[test]
fn recirculated_pallets_map_at_the_same_address() {
    let _g = lock();
    let (a, b) = UnixStream::pair().unwrap();
    let mut c = Container::alloc(&[4 * page(), 4 * page()]).unwrap();
    let first = c.unload(0).unwrap().addr();
    let again = c.unload(0).unwrap().addr();
    assert_eq!(first, again);
    assert_eq!(c.map_stats().cold, 1);
    assert_eq!(c.map_stats().hits, 1);

    // Out to another domain and back: the process-wide table still knows the address.
    let global = containers::map_stats();
    c.ship(&a).unwrap();
    let there = Container::receive(&b).unwrap();
    there.ship(&b).unwrap();
    let mut home = Container::receive(&a).unwrap();
    assert_eq!(home.unload(0).unwrap().addr(), first);
    assert_eq!(home.map_stats().hits, 1);
    assert!(containers::map_stats().hits > global.hits);

    // Someone else takes the range: a miss, mapped elsewhere, nothing clobbered.
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
    let squat = unsafe {
        libc::mmap(
            first as *mut _,
            page(),
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_eq!(squat as usize, first);
    let elsewhere = home.unload(0).unwrap().addr();
    assert_ne!(elsewhere, first);
    assert_eq!(home.map_stats().misses, 1);
    // SAFETY: `squat` is our own anonymous page.
    unsafe { libc::munmap(squat, page()) };
    // The new address is remembered in turn.
    assert_eq!(home.unload(0).unwrap().addr(), elsewhere);
    assert!(home.map_stats().hit_rate() > 0.0);
}

#[test]
fn cleanse_zeroes_stale_bytes_outside_valid_data() {
    let _g = lock();
    let mut c = Container::alloc(&[4 * page()]).unwrap();
    c.unload(0).unwrap().as_mut_slice().fill(0xab);
    c.set_valid(0, page() + 1..2 * page() + 1).unwrap();
    c.cleanse(0).unwrap();
    let v = c.view(0).unwrap();
    let s = v.as_slice();
    assert!(s[..page()].iter().all(|&b| b == 0));
    assert!(s[page()..3 * page()].iter().all(|&b| b == 0xab));
    assert!(s[3 * page()..].iter().all(|&b| b == 0));
}
