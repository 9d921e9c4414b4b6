//! Integration tests of the io_uring driver (`ferry::uring::driver`) with real files,
//! real TCP and UDP sockets, and a real peer process (this test binary re-executed in a
//! child role through an `#[ignore]`d entry point, run with `--ignored --exact`).
//!
//! Kernel features that may be missing are probed; a test without its feature prints
//! `skipped: ...` and returns.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;
use std::time::Duration;

use ferry::uring::{AlignedBuf, Target, Uring};
use ferry::uring::{Features, RingConfig};
use ferry::Error;

/// Skips the test (with a printed reason) unless `$cond` holds.
macro_rules! require {
    ($cond:expr, $why:expr) => {
        if !$cond {
            eprintln!("skipped: {}", $why);
            return;
        }
    };
}

fn features() -> &'static Features {
    Features::probe()
}

/// FNV-1a, 64 bits: the checksum both sides of a transfer compute.
fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `len` pseudo-random bytes from `seed` (xorshift64*).
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn temp_file(tag: &str, direct: bool) -> std::io::Result<std::fs::File> {
    let p = std::env::temp_dir().join(format!("ferry-uring-{tag}-{}", std::process::id()));
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true).create(true).truncate(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    let f = o.open(&p);
    let _ = std::fs::remove_file(&p);
    f
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Sends all of `data` in chunks of `chunk` bytes through the ring, plain or zero-copy,
/// resending the rest after a short send. Returns how many sends reported ZC_COPIED.
fn send_all(ring: &mut Uring, fd: i32, data: &[u8], chunk: usize, zc: bool) -> usize {
    let mut copied = 0;
    let mut at = 0;
    while at < data.len() {
        let end = (at + chunk).min(data.len());
        let buf = data[at..end].to_vec();
        let t = if zc {
            ring.submit_send_zc(fd, buf).unwrap()
        } else {
            ring.submit_send(fd, buf).unwrap()
        };
        let c = ring.wait(t).unwrap();
        let n = c.result.expect("send");
        assert!(n > 0, "send made no progress");
        copied += usize::from(c.zc_copied);
        at += n;
    }
    copied
}

/// Receives exactly `len` bytes through the ring.
fn recv_exact(ring: &mut Uring, fd: i32, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut buf = vec![0u8; 64 * 1024];
    while out.len() < len {
        let want = (len - out.len()).min(64 * 1024);
        buf.resize(want, 0);
        let (r, b) = ring.recv(fd, buf);
        let n = r.expect("recv");
        assert!(n > 0, "peer closed after {} of {len} bytes", out.len());
        out.extend_from_slice(&b[..n]);
        buf = b;
    }
    out
}

#[test]
fn file_blocks_survive_a_round_trip_with_checksums() {
    require!(features().ring, "no io_uring");
    let file = temp_file("blocks", false).unwrap();
    let fd = file.as_raw_fd();
    let mut ring = Uring::new(&RingConfig::new(32)).unwrap();
    let pool = if features().fixed_rw {
        Some(ring.register_pool(16 * 1024, 8).unwrap())
    } else {
        eprintln!("skipped part: no registered buffers");
        None
    };
    const BLOCK: usize = 16 * 1024;
    const BLOCKS: usize = 64;
    let data = random_bytes(7, BLOCK * BLOCKS);
    // Write in batches of 8 in flight at once, every other block from a registered buffer,
    // in a shuffled order so completions need not come back in submission order.
    let order: Vec<usize> = (0..BLOCKS).map(|i| (i * 37) % BLOCKS).collect();
    for batch in order.chunks(8) {
        let mut tickets_vec = Vec::new();
        let mut tickets_fixed = Vec::new();
        for &b in batch {
            let bytes = &data[b * BLOCK..(b + 1) * BLOCK];
            let off = (b * BLOCK) as u64;
            match (&pool, b % 2) {
                (Some(p), 0) => {
                    let mut fb = p.get().expect("8 slots for 8 ops");
                    fb.copy_from_slice(bytes);
                    tickets_fixed.push(ring.submit_write_at(fd, fb, off).unwrap());
                }
                _ => tickets_vec.push(ring.submit_write_at(fd, bytes.to_vec(), off).unwrap()),
            }
        }
        for t in tickets_fixed {
            assert_eq!(ring.wait(t).unwrap().result.unwrap(), BLOCK);
        }
        for t in tickets_vec {
            assert_eq!(ring.wait(t).unwrap().result.unwrap(), BLOCK);
        }
    }
    // Read back through the ring (fixed and plain buffers) and compare checksums.
    let mut back = vec![0u8; data.len()];
    for b in 0..BLOCKS {
        let off = (b * BLOCK) as u64;
        let dst = &mut back[b * BLOCK..(b + 1) * BLOCK];
        match (&pool, b % 3) {
            (Some(p), 0) => {
                let (r, fb) = ring.read_at(fd, p.get().unwrap(), off);
                assert_eq!(r.unwrap(), BLOCK);
                dst.copy_from_slice(&fb);
            }
            _ => {
                let (r, v) = ring.read_at(fd, vec![0u8; BLOCK], off);
                assert_eq!(r.unwrap(), BLOCK);
                dst.copy_from_slice(&v);
            }
        }
    }
    assert_eq!(fnv(&back), fnv(&data));
    // And through plain std reads, independent of the ring.
    let mut via_std = Vec::new();
    (&file).read_to_end(&mut via_std).unwrap();
    assert_eq!(fnv(&via_std), fnv(&data));
    let s = ring.stats();
    assert_eq!(s.submitted, s.completed);
    assert_eq!(ring.in_flight(), 0);
    if let Some(p) = &pool {
        assert!(s.fixed_ops >= (BLOCKS / 2 + BLOCKS / 3) as u64, "{s:?}");
        assert_eq!(p.free(), p.slots(), "every FixedBuf went back to the pool");
    }
}

#[test]
fn o_direct_file_io_with_aligned_and_fixed_buffers() {
    require!(features().ring, "no io_uring");
    let file = match temp_file("direct", true) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            eprintln!(
                "skipped: {} does not support O_DIRECT",
                std::env::temp_dir().display()
            );
            return;
        }
        Err(e) => panic!("open O_DIRECT: {e}"),
    };
    let fd = file.as_raw_fd();
    let mut ring = Uring::new(&RingConfig::new(8)).unwrap();
    let data = random_bytes(11, 64 * 1024);
    let mut a = AlignedBuf::zeroed(32 * 1024, 4096);
    a.copy_from_slice(&data[..32 * 1024]);
    let (r, _) = ring.write_at(fd, a, 0);
    match r {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            eprintln!("skipped: O_DIRECT write refused with EINVAL");
            return;
        }
        r => assert_eq!(r.unwrap(), 32 * 1024),
    }
    if features().fixed_rw {
        let pool = ring.register_pool(32 * 1024, 2).unwrap();
        let mut fb = pool.get().unwrap();
        fb.copy_from_slice(&data[32 * 1024..]);
        let (r, _) = ring.write_at(fd, fb, 32 * 1024);
        assert_eq!(r.unwrap(), 32 * 1024);
        let (r, fb) = ring.read_at(fd, pool.get().unwrap(), 0);
        assert_eq!(r.unwrap(), 32 * 1024);
        assert_eq!(fnv(&fb), fnv(&data[..32 * 1024]));
    } else {
        let mut b = AlignedBuf::zeroed(32 * 1024, 4096);
        b.copy_from_slice(&data[32 * 1024..]);
        assert_eq!(ring.write_at(fd, b, 32 * 1024).0.unwrap(), 32 * 1024);
    }
    let (r, all) = ring.read_at(fd, AlignedBuf::zeroed(64 * 1024, 4096), 0);
    assert_eq!(r.unwrap(), 64 * 1024);
    assert_eq!(fnv(&all), fnv(&data));
}

const PEER_ENV: &str = "FERRY_DRIVER_PEER";
const TO_PEER: usize = 4 << 20;
const FROM_PEER: usize = 3 << 20;

/// The peer process: receives `TO_PEER` bytes, replies with their checksum, then sends
/// `FROM_PEER` bytes of its own with zero-copy sends. Exits non-zero on any mismatch.
#[test]
#[ignore = "child role of tcp_stream_both_ways_with_a_peer_process; run by that test"]
fn peer_process_tcp() {
    let Ok(addr) = std::env::var(PEER_ENV) else {
        return;
    };
    let s = TcpStream::connect(addr).unwrap();
    let fd = s.as_raw_fd();
    let mut ring = Uring::new(&RingConfig::new(16)).unwrap();
    let got = recv_exact(&mut ring, fd, TO_PEER);
    assert_eq!(
        fnv(&got),
        fnv(&random_bytes(1, TO_PEER)),
        "peer saw corrupted data"
    );
    let (r, _) = ring.send(fd, fnv(&got).to_le_bytes().to_vec());
    assert_eq!(r.unwrap(), 8);
    send_all(&mut ring, fd, &random_bytes(2, FROM_PEER), 256 * 1024, true);
    let st = ring.stats();
    println!("peer stats: {st:?}");
    // Wait for the parent to close, so no data is lost to an early reset.
    let (r, _) = ring.recv(fd, vec![0u8; 1]);
    assert_eq!(r.unwrap(), 0);
}

#[test]
fn tcp_stream_both_ways_with_a_peer_process() {
    require!(features().ring, "no io_uring");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "peer_process_tcp",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PEER_ENV, listener.local_addr().unwrap().to_string())
        .spawn()
        .unwrap();
    let (s, _) = listener.accept().unwrap();
    let fd = s.as_raw_fd();
    let mut ring = Uring::new(&RingConfig::new(16)).unwrap();
    let data = random_bytes(1, TO_PEER);
    // First half with plain sends, second half with zero-copy sends.
    send_all(&mut ring, fd, &data[..TO_PEER / 2], 64 * 1024, false);
    let copied = send_all(&mut ring, fd, &data[TO_PEER / 2..], 256 * 1024, true);
    let echo = recv_exact(&mut ring, fd, 8);
    assert_eq!(u64::from_le_bytes(echo.try_into().unwrap()), fnv(&data));
    let back = recv_exact(&mut ring, fd, FROM_PEER);
    assert_eq!(fnv(&back), fnv(&random_bytes(2, FROM_PEER)));
    drop(s);
    let status = child.wait().unwrap();
    assert!(status.success(), "peer process failed: {status}");
    let st = ring.stats();
    eprintln!("parent stats: {st:?}");
    if features().send_zc {
        assert!(st.zc_sent > 0, "{st:?}");
        // Measured fact: loopback copies zero-copy payloads; the kernel reports it.
        assert!(
            st.zc_copied > 0,
            "loopback SEND_ZC should report ZC_COPIED: {st:?}"
        );
        assert_eq!(copied as u64, st.zc_copied);
        assert_eq!(st.zc_fallbacks, 0);
    } else {
        eprintln!("skipped part: no SEND_ZC, sends fell back");
        assert!(st.zc_fallbacks > 0);
    }
    assert_eq!(st.submitted, st.completed);
}

fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    (a, b)
}

#[test]
fn send_zc_from_a_registered_buffer_and_its_fallback() {
    require!(features().ring, "no io_uring");
    // A registered buffer sent with SEND_ZC (its buf_index form).
    if features().send_zc && features().fixed_rw {
        let (a, mut b) = tcp_pair();
        let mut ring = Uring::new(&RingConfig::new(8)).unwrap();
        let pool = ring.register_pool(4096, 2).unwrap();
        let mut fb = pool.get().unwrap();
        let data = random_bytes(5, 4096);
        fb.copy_from_slice(&data);
        let t = ring.submit_send_zc(&a, fb).unwrap();
        let c = ring.wait(t).unwrap();
        assert_eq!(*c.result.as_ref().unwrap(), 4096);
        assert!(c.zc_copied, "loopback copies");
        drop(c);
        let mut got = vec![0u8; 4096];
        b.read_exact(&mut got).unwrap();
        assert_eq!(got, data);
        let s = ring.stats();
        assert_eq!((s.fixed_ops, s.zc_sent, s.zc_copied), (1, 1, 1), "{s:?}");
        assert_eq!(pool.free(), 2);
    } else {
        eprintln!("skipped part: no SEND_ZC or registered buffers");
    }
    // The same send on a ring told the kernel lacks SEND_ZC: a counted plain send.
    let (a, mut b) = tcp_pair();
    let no_zc = Features {
        send_zc: false,
        ..features().clone()
    };
    let mut ring = Uring::with_features(&RingConfig::new(8), no_zc).unwrap();
    let (r, _) = ring.send_zc(&a, b"fallback".to_vec());
    assert_eq!(r.unwrap(), 8);
    let mut got = [0u8; 8];
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"fallback");
    let s = ring.stats();
    assert_eq!((s.zc_fallbacks, s.zc_sent, s.zc_copied), (1, 0, 0), "{s:?}");
}

#[test]
fn udp_send_to_and_recv_from_carry_addresses_and_report_truncation() {
    require!(features().ring, "no io_uring");
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (aa, ba): (SocketAddr, SocketAddr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let mut ring = Uring::new(&RingConfig::new(8)).unwrap();
    // Post the receive first, then send: the receive completes with the datagram.
    let rx = ring.submit_recv_from(&b, vec![0u8; 2048]).unwrap();
    let payload = random_bytes(3, 1400);
    let (r, _) = ring.send_to(&a, payload.clone(), ba);
    assert_eq!(r.unwrap(), 1400);
    let c = ring.wait(rx).unwrap();
    assert_eq!(c.result.unwrap(), 1400);
    assert_eq!(c.peer, Some(aa), "recv_from reports the sender");
    assert!(!c.truncated);
    assert_eq!(fnv(&c.buf[..1400]), fnv(&payload));
    // Reply to the reported address; std receives it from b.
    let (r, _) = ring.send_to(&b, b"pong".to_vec(), c.peer.unwrap());
    assert_eq!(r.unwrap(), 4);
    let mut got = [0u8; 16];
    let (n, from) = a.recv_from(&mut got).unwrap();
    assert_eq!((&got[..n], from), (&b"pong"[..], ba));
    // An oversize datagram is an error, not a silent cut; the socket keeps working.
    a.send_to(&[0xee; 500], ba).unwrap();
    let (r, _) = ring.recv_from(&b, vec![0u8; 64]);
    let e = r.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    a.send_to(b"after", ba).unwrap();
    let (r, buf) = ring.recv_from(&b, vec![0u8; 64]);
    let (n, from) = r.unwrap();
    assert_eq!((&buf[..n], from), (&b"after"[..], aa));
}

#[test]
fn sqpoll_thread_sleeps_when_idle_and_is_woken_by_a_submission() {
    require!(features().ring, "no io_uring");
    require!(
        features().sqpoll,
        format!("no SQPOLL: {:?}", features().why_not)
    );
    let mut ring = Uring::new(&RingConfig::new(8).sqpoll(10)).unwrap();
    assert!(ring.is_sqpoll());
    let t = ring.submit_nop().unwrap();
    assert_eq!(ring.wait(t).unwrap().result.unwrap(), 0);
    // Idle for well past the 10 ms idle time: the kernel thread goes to sleep.
    let mut asleep = false;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(20));
        if ring.sq_thread_asleep() {
            asleep = true;
            break;
        }
    }
    assert!(asleep, "SQPOLL thread never set IORING_SQ_NEED_WAKEUP");
    let before = ring.stats();
    let t = ring.submit_nop().unwrap();
    assert_eq!(ring.wait(t).unwrap().result.unwrap(), 0);
    let after = ring.stats();
    assert!(after.sqpoll_wakeups > before.sqpoll_wakeups, "{after:?}");
    assert!(
        after.enters > before.enters,
        "waking the thread costs an enter"
    );
    // Data flows through the woken ring too.
    let file = temp_file("sqpoll", false).unwrap();
    let (r, _) = ring.write_at(&file, b"sqpoll data".to_vec(), 0);
    assert_eq!(r.unwrap(), 11);
    let (r, back) = ring.read_at(&file, vec![0u8; 11], 0);
    assert_eq!(&back[..r.unwrap()], b"sqpoll data");
}

/// A receive buffer posted on socket `rx` that, when freed, checks that no receive is
/// still armed on `rx`: it writes a probe byte from `tx` and peeks for it on `rx`. Had the
/// kernel still held a receive, the byte would have gone into that (freed) buffer.
struct Tracked {
    bytes: Vec<u8>,
    rx: i32,
    tx: i32,
    freed: std::sync::Arc<std::sync::atomic::AtomicU8>,
}

const FREED_SAFELY: u8 = 1;
const FREED_EARLY: u8 = 2;

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut b = [0u8; 1];
        // SAFETY: plain send/recv on descriptors the test keeps open, with local buffers.
        let peeked = unsafe {
            libc::send(self.tx, b"p".as_ptr().cast(), 1, 0);
            let n = libc::recv(
                self.rx,
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            );
            if n == 1 {
                libc::recv(self.rx, b.as_mut_ptr().cast(), 1, 0); // consume the probe
            }
            n
        };
        let state = if peeked == 1 {
            FREED_SAFELY
        } else {
            FREED_EARLY
        };
        self.freed.store(state, std::sync::atomic::Ordering::SeqCst);
    }
}

// SAFETY: the bytes live in the Vec's heap block, which does not move with the value.
unsafe impl ferry::uring::IoBuf for Tracked {
    fn stable_ptr(&self) -> *const u8 {
        self.bytes.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.bytes.len()
    }
}

// SAFETY: the Vec is owned exclusively by this value.
unsafe impl ferry::uring::IoBufMut for Tracked {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.bytes.len()
    }
}

#[test]
#[ignore = "child role of drop_with_ops_in_flight_leaks_no_fds; run by that test"]
fn drop_child() {
    if std::env::var(PEER_ENV).as_deref() != Ok("drop") {
        return;
    }
    let before = open_fds();
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
    let freed = std::sync::Arc::new(std::sync::atomic::AtomicU8::new(0));
    {
        let mut ring = Uring::new(&RingConfig::new(8)).unwrap();
        let tracked = Tracked {
            bytes: vec![0u8; 512],
            rx: a.as_raw_fd(),
            tx: b.as_raw_fd(),
            freed: freed.clone(),
        };
        let _t0 = ring.submit_recv(&a, tracked).unwrap();
        // Two receives that will never get data, one of them on a registered file.
        let _t1 = ring.submit_recv(&a, vec![0u8; 4096]).unwrap();
        if features().fixed_files {
            ring.register_files(2).unwrap();
            ring.set_file(1, a.as_raw_fd()).unwrap();
            let _t2 = ring.submit_recv(Target::Fixed(1), vec![0u8; 4096]).unwrap();
        }
        ring.flush().unwrap();
        assert!(ring.in_flight() >= 1);
        assert_eq!(freed.load(std::sync::atomic::Ordering::SeqCst), 0);
        // Dropped here with the receives in flight (and their tickets dropped too).
    }
    {
        // close() is the same cancel-and-wait, with the final counters as evidence.
        let mut ring = Uring::new(&RingConfig::new(8)).unwrap();
        let _t = ring.submit_recv(&a, vec![0u8; 64]).unwrap();
        let _u = ring.submit_recv(&a, vec![0u8; 64]).unwrap();
        let st = ring.close();
        assert_eq!(
            (st.submitted, st.completed, st.cancelled),
            (2, 2, 2),
            "{st:?}"
        );
    }
    // The kernel answered the cancel, so the drop freed the buffer (did not leak it), and
    // only once no receive was armed on the socket any more.
    assert_eq!(
        freed.load(std::sync::atomic::Ordering::SeqCst),
        FREED_SAFELY
    );
    // The receives were cancelled: data written now stays in the socket for us.
    b.write_all(b"late").unwrap();
    let mut got = [0u8; 4];
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    a.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"late");
    drop((a, b));
    assert_eq!(
        open_fds(),
        before,
        "the ring and its registered files are closed"
    );
    println!("drop child ok");
}

#[test]
fn drop_with_ops_in_flight_leaks_no_fds() {
    require!(features().ring, "no io_uring");
    // In a child process, so no other test opens fds while this one counts them.
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "drop_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PEER_ENV, "drop")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("drop child ok"),
        "child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_descriptors_are_rejected() {
    require!(features().ring, "no io_uring");
    let mut ring = Uring::new(&RingConfig::new(8)).unwrap();
    // A descriptor that is not open: the kernel answers EBADF and the buffer comes back.
    let (r, buf) = ring.read_at(1 << 20, vec![7u8; 16], 0);
    assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EBADF));
    assert_eq!(buf, vec![7u8; 16]);
    let (r, _) = ring.send(1 << 20, b"x".to_vec());
    assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EBADF));
    // A negative descriptor never reaches the kernel.
    let before = ring.stats().submitted;
    let e = ring.submit_write_at(-1, vec![1u8], 0).unwrap_err();
    assert!(matches!(e.error, Error::InvalidArgument(_)));
    assert_eq!(ring.stats().submitted, before);

    require!(features().fixed_files, "no registered files");
    let mut file = temp_file("fixed", false).unwrap();
    file.write_all(b"registered file").unwrap();
    ring.register_files(4).unwrap();
    ring.set_file(0, file.as_raw_fd()).unwrap();
    let before = ring.stats().submitted;
    for idx in [4, 1000] {
        let e = ring
            .submit_read_at(Target::Fixed(idx), vec![0u8; 4], 0)
            .unwrap_err();
        assert!(
            matches!(e.error, Error::InvalidArgument(m) if m.contains("out of range")),
            "slot {idx}: {:?}",
            e.error
        );
    }
    let e = ring
        .submit_read_at(Target::Fixed(2), vec![0u8; 4], 0)
        .unwrap_err();
    assert!(
        matches!(e.error, Error::EmptySlot { index: 2 }),
        "{:?}",
        e.error
    );
    assert!(matches!(
        ring.register_files(4),
        Err(Error::AlreadyRegistered { .. })
    ));
    assert!(ring.set_file(4, file.as_raw_fd()).is_err());
    assert_eq!(ring.stats().submitted, before, "refused before submission");
    let (r, buf) = ring.read_at(Target::Fixed(0), vec![0u8; 15], 0);
    assert_eq!(&buf[..r.unwrap()], b"registered file");
    assert_eq!(ring.stats().fixed_file_ops, 1);

    // A registered buffer of another ring is refused too.
    if features().fixed_rw {
        let mut other = Uring::new(&RingConfig::new(8)).unwrap();
        let pool = other.register_pool(4096, 1).unwrap();
        let e = ring
            .submit_read_at(&file, pool.get().unwrap(), 0)
            .unwrap_err();
        assert!(matches!(e.error, Error::WrongRing));
        drop(e);
        assert_eq!(pool.free(), 1);
    }
}

#[test]
fn missing_features_give_clear_errors() {
    require!(features().ring, "no io_uring");
    let none = Features {
        fixed_files: false,
        fixed_rw: false,
        why_not: Some("pretend kernel".into()),
        ..features().clone()
    };
    let mut ring = Uring::with_features(&RingConfig::new(4), none).unwrap();
    match ring.register_files(4) {
        Err(Error::Unsupported { feature, why }) => {
            assert_eq!(feature, "registered files");
            assert_eq!(why, "pretend kernel");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    assert!(matches!(
        ring.register_pool(4096, 1),
        Err(Error::Unsupported {
            feature: "registered buffers",
            ..
        })
    ));
    if !features().sqpoll {
        assert!(matches!(
            Uring::new(&RingConfig::new(4).sqpoll(10)),
            Err(Error::Unsupported { .. })
        ));
    }
}

#[test]
fn cancel_and_wait_timeout() {
    require!(features().ring, "no io_uring");
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut ring = Uring::new(&RingConfig::new(8)).unwrap();
    let t = ring.submit_recv(&a, vec![0u8; 64]).unwrap();
    assert!(
        matches!(
            ring.wait_timeout(&t, Duration::from_millis(20)),
            Err(Error::Timeout)
        ),
        "nothing was sent, the receive is still pending"
    );
    assert!(!ring.is_done(&t).unwrap());
    ring.cancel(&t).unwrap();
    let c = ring.wait(t).unwrap();
    assert_eq!(c.result.unwrap_err().raw_os_error(), Some(libc::ECANCELED));
    assert_eq!(c.buf.len(), 64);
    assert_eq!(ring.stats().cancelled, 1);
    assert_eq!(ring.in_flight(), 0);
    // A finished operation: wait_timeout says so, and wait collects it without blocking.
    let t = ring.submit_nop().unwrap();
    ring.wait_timeout(&t, Duration::from_secs(10)).unwrap();
    assert!(ring.is_done(&t).unwrap());
    assert_eq!(ring.wait(t).unwrap().result.unwrap(), 0);
    assert_eq!(ring.in_flight(), 0);
}

#[test]
fn sqpoll_steady_state_makes_no_syscalls() {
    require!(features().ring, "no io_uring");
    require!(
        features().sqpoll,
        format!("no SQPOLL: {:?}", features().why_not)
    );
    // A long idle time keeps the kernel thread awake for the whole batch, and a long spin
    // makes wait() poll the completion queue instead of blocking in the kernel.
    let mut ring = Uring::new(&RingConfig::new(8).sqpoll(2000)).unwrap();
    ring.set_spin(Duration::from_secs(1));
    let t = ring.submit_nop().unwrap();
    ring.wait(t).unwrap().result.unwrap();
    let before = ring.stats();
    let sys_before = ferry::stats::thread_syscall_count();
    for _ in 0..200 {
        let t = ring.submit_nop().unwrap();
        assert_eq!(ring.wait(t).unwrap().result.unwrap(), 0);
    }
    let after = ring.stats();
    assert_eq!(after.completed - before.completed, 200);
    assert_eq!(after.enters, before.enters, "{after:?}");
    assert_eq!(ferry::stats::thread_syscall_count(), sys_before);
}
