//! Helpers shared by the multi-process tests: payloads whose bytes follow a seed, a
//! child-process harness (the test binary re-executed in a role), fd and mapping counts,
//! and a small runner for `harness = false` test binaries.
#![allow(dead_code)]

#[path = "../runner/mod.rs"]
mod runner;
// Not every binary that shares these helpers has a runner of its own.
#[allow(unused_imports)]
pub use runner::run;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry::{Domain, DomainId, Group, IoData, PathAllocator};

/// Generous timeout for set-up steps (connect, accept) on a loaded machine.
pub const T: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- payload checks

/// Fills `len` bytes: an 8-byte seed, then a pattern derived from it.
pub fn fill(path: &PathAllocator, seed: u64, len: usize) -> IoData {
    let mut m = path.alloc(len).unwrap();
    let bytes: Vec<u8> = (0..len).map(|i| byte_at(seed, i)).collect();
    m.fill_from(&bytes);
    m.freeze()
}

pub fn byte_at(seed: u64, i: usize) -> u8 {
    if i < 8 {
        seed.to_le_bytes()[i]
    } else {
        (seed
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left((i % 61) as u32) as u8)
            ^ (i as u8)
    }
}

/// A message of several fragments (from several fbufs) whose bytes follow `seed`.
pub fn message(path: &PathAllocator, seed: u64, len: usize, pieces: usize) -> IoData {
    let whole = fill(path, seed, len.max(8));
    let mut out = IoData::new();
    let step = (whole.len() / pieces.max(1)).max(1);
    let mut at = 0;
    while at < whole.len() {
        let end = (at + step).min(whole.len());
        // Re-slicing one fbuf gives several fragments without copying.
        out.append(whole.slice(at..end));
        at = end;
    }
    out
}

pub fn verify(d: &IoData) -> Result<u64, String> {
    if d.len() < 8 {
        return Err(format!("short message {}", d.len()));
    }
    let mut seed = [0u8; 8];
    d.copy_range_to_slice(0..8, &mut seed);
    let seed = u64::from_le_bytes(seed);
    for (i, b) in d.iter_bytes().enumerate() {
        if b != byte_at(seed, i) {
            return Err(format!(
                "byte {i} of message {seed} is {b}, want {}",
                byte_at(seed, i)
            ));
        }
    }
    Ok(seed)
}

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn seed_rng() -> Rng {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let s = std::env::var("FERRY_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(t | 1);
    eprintln!("    (seed {s}; rerun with FERRY_TEST_SEED={s})");
    Rng(s)
}

// ---------------------------------------------------------------- process helpers

/// Waits up to `secs` for `f` to hold, trying every 2 ms.
pub fn within(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    f()
}

pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

pub fn maps_contain(addr: usize) -> bool {
    let needle = format!("{addr:x}-");
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .any(|l| l.starts_with(&needle))
}

pub struct Peer {
    pub child: Child,
    pub out: BufReader<std::process::ChildStdout>,
    pub id: DomainId,
}

impl Peer {
    pub fn spawn(role: &str, group: &str, arg: &str) -> Peer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("FERRY_TEST_ROLE", role)
            .env("FERRY_TEST_GROUP", group)
            .env("FERRY_TEST_ARG", arg)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let id = read_line(&mut out)
            .parse()
            .expect("child prints its domain id first");
        Peer { child, out, id }
    }

    pub fn tell(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    pub fn line(&mut self) -> String {
        read_line(&mut self.out)
    }

    pub fn kill9(&mut self) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        self.child.wait().unwrap();
    }
}

/// The start of a child spawned by [`Peer::spawn`]: joins the group named by
/// `FERRY_TEST_GROUP`, prints the domain id (the first line `Peer::spawn` reads) and
/// returns the group's name, the group, the domain, `FERRY_TEST_ARG` and stdin.
pub fn child_start() -> (
    String,
    Arc<Group>,
    Domain,
    String,
    BufReader<std::io::Stdin>,
) {
    let gname = std::env::var("FERRY_TEST_GROUP").unwrap();
    let group = Group::open(&gname).unwrap();
    let domain = group.join().unwrap();
    println!("{}", domain.id());
    let arg = std::env::var("FERRY_TEST_ARG").unwrap();
    (gname, group, domain, arg, BufReader::new(std::io::stdin()))
}

/// Tells `peer` (a child that connects to the domain id it reads on stdin) our id, and
/// accepts its channel.
pub fn accept_from(d: &Domain, peer: &mut Peer) -> ferry::Receiver {
    let accept = {
        let d = d.clone();
        std::thread::spawn(move || d.accept(T).unwrap())
    };
    peer.tell(&d.id().to_string());
    accept.join().unwrap()
}

pub fn read_line(r: &mut impl BufRead) -> String {
    let mut s = String::new();
    r.read_line(&mut s).unwrap();
    s.trim().to_owned()
}

pub fn group_name(tag: &str) -> String {
    format!("ptest-{tag}-{}", std::process::id())
}

/// Opens a fresh group named after `tag` and this process, and joins it.
pub fn join(tag: &str) -> (Arc<Group>, Domain, String) {
    let name = group_name(tag);
    let g = Group::open(&name).unwrap();
    let d = g.join().unwrap();
    (g, d, name)
}

/// True if `/dev/shm/ferry.<name>` exists.
pub fn control_file_exists(name: &str) -> bool {
    std::path::Path::new(&format!("/dev/shm/ferry.{name}")).exists()
}

// ---------------------------------------------------------------- hostile members

/// Maps this process's copy of group `name`'s control memfd read-write, as a hostile
/// member could.
pub fn map_control_block(name: &str) -> (*mut u8, usize) {
    let want = format!("/memfd:ferry.{name} (deleted)");
    for e in std::fs::read_dir("/proc/self/fd").unwrap() {
        let e = e.unwrap();
        let Ok(link) = std::fs::read_link(e.path()) else {
            continue;
        };
        if link.to_str() != Some(want.as_str()) {
            continue;
        }
        let fd: i32 = e.file_name().to_str().unwrap().parse().unwrap();
        // SAFETY: fstat and mmap on a descriptor we found open; the mapping is used
        // only through volatile writes below.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            assert_eq!(libc::fstat(fd, &mut st), 0);
            let len = st.st_size as usize;
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            return (p.cast(), len);
        }
    }
    panic!("no control memfd for group {name}");
}

pub fn write_word(map: &(*mut u8, usize), off: usize, v: u32) {
    assert!(off + 4 <= map.1);
    // SAFETY: inside the mapping (checked above), 4-aligned (the area is 64-aligned);
    // the words are atomics in the other processes, a volatile store is what a hostile
    // writer does.
    unsafe { map.0.add(off).cast::<u32>().write_volatile(v) };
}

pub fn write_u64(map: &(*mut u8, usize), off: usize, v: u64) {
    assert!(off + 8 <= map.1 && off % 8 == 0);
    // SAFETY: as in `write_word`, 8-aligned (checked).
    unsafe { map.0.add(off).cast::<u64>().write_volatile(v) };
}

// ---------------------------------------------------------------- service handlers

/// The handler the location-transparency tests run: reverses the payload into a new
/// fbuf and appends a count of calls, so that its state shows in the answers. An empty
/// request is an error.
pub struct Reverse {
    pub calls: u64,
}

impl ferry::Handler for Reverse {
    fn handle(&mut self, request: &IoData, out: &PathAllocator) -> ferry::Result<IoData> {
        self.calls += 1;
        if request.is_empty() {
            return Err(ferry::Error::InvalidArgument("empty request"));
        }
        let mut bytes = request.to_vec();
        bytes.reverse();
        bytes.extend_from_slice(&self.calls.to_le_bytes());
        let mut m = out.alloc(bytes.len())?;
        m.write_at(0, &bytes);
        Ok(m.freeze())
    }
}
