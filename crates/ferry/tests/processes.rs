//! Multi-process tests: real processes (this test binary re-executed in a child role),
//! many transfers with checksums, `kill -9` at random points, and leak checks.
//!
//! Runs with its own small harness (`harness = false`) so that children can be spawned
//! from a single-threaded, clean process image rather than forked from libtest threads.

mod common;

use std::io::{BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use ferry::{DomainId, Error, Group, PathConfig};

// ---------------------------------------------------------------- child roles

fn child_main(role: &str) {
    // Children that race each other open the group at one agreed moment (spinning, so
    // that a sleep's slack does not stagger them).
    if let Ok(at) = std::env::var("FERRY_TEST_START_AT") {
        let at = Duration::from_nanos(at.parse().unwrap());
        while std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            < at
        {
            std::hint::spin_loop();
        }
    }
    let group = Group::open(&std::env::var("FERRY_TEST_GROUP").unwrap()).unwrap();
    let domain = group.join().unwrap();
    let arg = std::env::var("FERRY_TEST_ARG").unwrap_or_default();
    println!("{}", domain.id());
    let mut stdin = BufReader::new(std::io::stdin());
    match role {
        // Offer RACE_THREADS services, then wait for a line on stdin.
        "offer" => {
            let _p: Vec<_> = (0..RACE_THREADS)
                .map(|i| {
                    let name = format!("{RACE_SERVICE}/{i}");
                    ferry::Publisher::offer(&domain, &name, Default::default()).unwrap()
                })
                .collect();
            println!("offered");
            read_line(&mut stdin);
        }
        // Offer RACE_THREADS services, each from its own thread as a bridge's imports
        // are, wait for one subscriber on each, then publish its index on each.
        "offer-each" => {
            let threads: Vec<_> = (0..RACE_THREADS)
                .map(|i| {
                    let domain = domain.clone();
                    std::thread::spawn(move || {
                        let name = format!("{RACE_SERVICE}/{i}");
                        let mut p =
                            ferry::Publisher::offer(&domain, &name, Default::default()).unwrap();
                        p.wait_for_subscribers(1, T).unwrap();
                        for _ in 0..20 {
                            let mut m = p.loan(8).unwrap();
                            m.as_mut_slice()[0] = i as u8;
                            m.send().unwrap();
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        p
                    })
                })
                .collect();
            let _p: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            println!("sent");
            read_line(&mut stdin);
        }
        // Offer RACE_THREADS servers, each from its own thread, each answering
        // RACE_CALLS requests with its index.
        "serve-each" => {
            let threads: Vec<_> = (0..RACE_THREADS)
                .map(|i| {
                    let domain = domain.clone();
                    std::thread::spawn(move || {
                        let name = format!("{RACE_SERVICE}/{i}");
                        let mut s =
                            ferry::Server::offer(&domain, &name, Default::default()).unwrap();
                        let path = domain.path(PathConfig::default()).unwrap();
                        for _ in 0..RACE_CALLS {
                            let req = s.recv_timeout(T).unwrap();
                            let mut m = path.alloc(1).unwrap();
                            m.fragments_mut().next().unwrap()[0] = i as u8;
                            s.reply(&req, &m.freeze()).unwrap();
                        }
                        s
                    })
                })
                .collect();
            let _s: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            println!("served");
            read_line(&mut stdin);
        }
        // Receive until the sender closes; verify every byte; report the count.
        "verify" => {
            let mut rx = domain.accept(T).unwrap();
            let mut held = Vec::new();
            let mut n = 0u64;
            loop {
                match rx.recv() {
                    Ok(d) => {
                        verify(&d).unwrap();
                        n += 1;
                        // Hold a few for a while, so releases arrive out of order.
                        held.push(d);
                        if held.len() > 5 {
                            held.remove((n % 5) as usize);
                        }
                    }
                    Err(Error::Disconnected) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            println!("ok {n}");
        }
        // Receive and hold everything, forever (until killed).
        "hoard" => {
            let mut rx = domain.accept(T).unwrap();
            let mut held = Vec::new();
            while let Ok(d) = rx.recv() {
                verify(&d).unwrap();
                held.push(d);
            }
            std::thread::sleep(Duration::from_secs(3600));
        }
        // Connect to the domain named on stdin and stream messages until killed.
        "stream" => {
            let peer: DomainId = read_line(&mut stdin).parse().unwrap();
            let tx = domain.connect(peer, T).unwrap();
            let path = domain.path(PathConfig::default()).unwrap();
            for seed in 1.. {
                let d = message(
                    &path,
                    seed,
                    1000 + (seed as usize * 977) % 50_000,
                    1 + seed as usize % 7,
                );
                if tx.send(&d).is_err() {
                    break;
                }
            }
        }
        // Connect, send a few messages, and exit at once, dropping everything.
        "send-and-exit" => {
            let peer: DomainId = read_line(&mut stdin).parse().unwrap();
            let tx = domain.connect(peer, T).unwrap();
            let path = domain.path(PathConfig::default()).unwrap();
            for seed in 0..3 {
                tx.send(&message(&path, seed, 50_000, 2)).unwrap();
            }
            std::process::exit(0);
        }
        // Wait for a line, then report how many members the group has.
        "count-members" => {
            read_line(&mut stdin);
            println!("{}", group.members().len());
            read_line(&mut stdin);
        }
        // Exit at once, still a member: no domain or group is dropped.
        "exit-holding" => std::process::exit(0),
        // Receive a container over the Unix socket at FERRY_TEST_ARG, XOR every valid
        // byte with 0x5a through a mapping, and ship it back.
        "container-xor" => {
            let sock = std::os::unix::net::UnixStream::connect(&arg).unwrap();
            let mut c = ferry::containers::Container::receive(&sock).unwrap();
            for i in 0..c.len() {
                let mut p = c.unload(i).unwrap();
                let valid = p.valid();
                for b in &mut p.as_mut_slice()[valid.clone()] {
                    *b ^= 0x5a;
                }
                p.reload(valid).unwrap();
            }
            c.ship(&sock).unwrap();
            println!("shipped back");
        }
        // Send one secured message, wait for a go, then try to overwrite it.
        "secure-writer" => {
            let peer: DomainId = read_line(&mut stdin).parse().unwrap();
            let tx = domain.connect(peer, T).unwrap();
            let path = domain
                .path(PathConfig {
                    secure: true,
                    ..PathConfig::default()
                })
                .unwrap();
            let d = fill(&path, 42, 8192);
            tx.send(&d).unwrap();
            read_line(&mut stdin);
            let p = d.fragments()[0].as_slice().as_ptr() as *mut u8;
            // Deliberately write through the frozen, secured fbuf: the page is
            // write-protected, so this must fault (SIGSEGV) rather than change bytes
            // the receiver is reading.
            // SAFETY: not sound on purpose: the page is write-protected, and the test
            // expects this process to die of SIGSEGV right here.
            unsafe { p.add(100).write_volatile(0xAA) };
            println!("wrote");
        }
        _ => panic!("unknown role {role}"),
    }
    let _ = arg;
}

// ---------------------------------------------------------------- tests

/// Thousands of multi-fragment messages to a checking child; afterwards every fbuf is
/// back on the free list and no descriptor leaked.
fn transfers_with_checksums() {
    let fds0 = fd_count();
    let (g, d, name) = join("xfer");
    let mut peer = Peer::spawn("verify", &name, "");
    let tx = d.connect(peer.id, T).unwrap();
    let path = d.path(PathConfig::default()).unwrap();
    let mut rng = seed_rng();
    let n = 3000;
    for seed in 0..n {
        let len = 8 + rng.below(200_000) as usize;
        let pieces = 1 + rng.below(20) as usize;
        tx.send(&message(&path, seed, len, pieces)).unwrap();
    }
    drop(tx);
    assert_eq!(peer.line(), format!("ok {n}"));
    assert!(peer.child.wait().unwrap().success());
    // The child released everything before exiting (or died holding it): either way
    // the fbufs come back.
    d.collect_releases();
    assert_eq!(path.outstanding(), 0);
    assert_eq!(d.parked_senders(), 0);
    drop((path, d, g, peer));
    assert_eq!(fd_count(), fds0, "file descriptors leaked");
    assert!(!std::path::Path::new(&format!("/dev/shm/ferry.{name}")).exists());
}

/// The receiver is killed at a random point; the sender gets PeerGone within a bounded
/// time and reclaims every fbuf the receiver held.
fn receiver_killed_at_random_points() {
    let mut rng = seed_rng();
    let fds0 = fd_count();
    let (g, d, name) = join("killrx");
    let path = d.path(PathConfig::default()).unwrap();
    for _ in 0..6 {
        let mut peer = Peer::spawn("hoard", &name, "");
        let tx = d.connect(peer.id, T).unwrap();
        let k = rng.below(300);
        for seed in 0..k {
            tx.send(&message(&path, seed, 100 + rng.below(20_000) as usize, 3))
                .unwrap();
        }
        if rng.below(2) == 0 {
            std::thread::sleep(Duration::from_millis(rng.below(20)));
        }
        peer.kill9();
        let t0 = Instant::now();
        let err = loop {
            match tx.send(&message(&path, 7, 4096, 1)) {
                Ok(()) => assert!(
                    t0.elapsed() < Duration::from_secs(2),
                    "no PeerGone after 2 s"
                ),
                Err(e) => break e,
            }
        };
        assert!(matches!(err, Error::PeerGone { .. }), "{err}");
        assert_eq!(tx.in_flight(), 0);
        assert_eq!(
            path.outstanding(),
            0,
            "fbufs held by the dead receiver were not reclaimed"
        );
        drop(tx);
        assert_eq!(d.parked_senders(), 0);
    }
    drop((path, d, g));
    assert_eq!(fd_count(), fds0, "file descriptors leaked");
}

/// The sender is killed mid-stream; the receiver drains what was sent, gets PeerGone,
/// can still read the messages it holds, and unmaps the dead lot once they are dropped.
fn sender_killed_at_random_points() {
    let mut rng = seed_rng();
    let fds0 = fd_count();
    let (g, d, name) = join("killtx");
    for _ in 0..6 {
        let mut peer = Peer::spawn("stream", &name, "");
        let peer_lot = g.lot_addr(peer.id.slot);
        let mut rx = accept_from(&d, &mut peer);
        let mut held = Vec::new();
        let k = 1 + rng.below(500);
        for _ in 0..k {
            let m = rx.recv().unwrap();
            verify(&m).unwrap();
            if rng.below(4) == 0 {
                held.push(m);
            }
        }
        peer.kill9();
        let t0 = Instant::now();
        let err = loop {
            match rx.recv_timeout(Duration::from_secs(2)) {
                Ok(m) => verify(&m).map(|_| ()).unwrap(),
                Err(Error::Timeout) => panic!("no PeerGone within 2 s"),
                Err(e) => break e,
            }
        };
        assert!(matches!(err, Error::PeerGone { .. }), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(2));
        // The dead sender's memory stays readable while we hold it.
        for m in &held {
            verify(m).unwrap();
        }
        assert!(maps_contain(peer_lot));
        drop(held);
        drop(rx);
        assert!(!maps_contain(peer_lot), "dead peer's lot still mapped");
        assert_eq!(d.mapped_peers(), 0);
    }
    drop((d, g));
    assert_eq!(fd_count(), fds0, "file descriptors leaked");
}

/// A sender that exits right after sending: its messages still arrive intact.
fn sender_exiting_after_send_loses_nothing() {
    let (_g, d, name) = join("exit");
    for _ in 0..5 {
        let mut peer = Peer::spawn("send-and-exit", &name, "");
        let mut rx = accept_from(&d, &mut peer);
        assert!(peer.child.wait().unwrap().success());
        for seed in 0..3 {
            let m = rx.recv().unwrap();
            assert_eq!(verify(&m).unwrap(), seed);
        }
        let e = rx.recv().unwrap_err();
        assert!(
            matches!(e, Error::PeerGone { .. } | Error::Disconnected),
            "{e}"
        );
    }
}

/// A container goes to another process and comes back: the sender holds nothing while it
/// is away, the bytes are transformed where they were mapped, and when it returns it maps
/// at the same addresses as before.
fn containers_ship_between_processes() {
    use ferry::containers::Container;
    use std::os::unix::net::UnixListener;
    let dir = std::env::temp_dir().join(format!("ferry-ct-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock_path = dir.join("sock");
    let listener = UnixListener::bind(&sock_path).unwrap();
    let (_g, _d, name) = join("ship");
    let mut peer = Peer::spawn("container-xor", &name, sock_path.to_str().unwrap());
    let (sock, _) = listener.accept().unwrap();
    // Three pallets filled from a file, never mapped here until we look.
    let src = dir.join("src");
    let data: Vec<u8> = (0..3 * 2 * 4096 + 100)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let mut c = Container::alloc(&[2 * 4096, 2 * 4096, 2 * 4096 + 4096]).unwrap();
    let f = std::fs::File::open(&src).unwrap();
    let mut filled = 0;
    for i in 0..3 {
        filled += c.fill(i, &f, data.len() - filled).unwrap();
    }
    assert_eq!(filled, data.len());
    // Map each pallet once, so the process remembers where.
    let addrs: Vec<usize> = (0..3)
        .map(|i| c.view(i).unwrap().as_slice().as_ptr() as usize)
        .collect();
    let fds_before_ship = fd_count();
    c.ship(&sock).unwrap();
    assert_eq!(
        fd_count(),
        fds_before_ship - 3,
        "the sender keeps no pallet descriptor"
    );
    let mut back = Container::receive(&sock).unwrap();
    assert_eq!(peer.line(), "shipped back");
    assert!(peer.child.wait().unwrap().success());
    let mut got = Vec::new();
    for (i, &addr) in addrs.iter().enumerate() {
        let v = back.view(i).unwrap();
        assert_eq!(
            v.as_slice().as_ptr() as usize,
            addr,
            "pallet {i} maps where it did"
        );
        got.extend_from_slice(&v.as_slice()[v.valid()]);
    }
    let want: Vec<u8> = data.iter().map(|b| b ^ 0x5a).collect();
    assert!(got == want, "transformed bytes differ");
    assert!(back.map_stats().hits >= 3);
    drop(back);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A secured fbuf cannot be changed by its originator while a receiver holds it.
fn secured_fbufs_are_write_protected() {
    let (_g, d, name) = join("secure");
    let mut peer = Peer::spawn("secure-writer", &name, "");
    let mut rx = accept_from(&d, &mut peer);
    let m = rx.recv().unwrap();
    assert_eq!(verify(&m).unwrap(), 42);
    peer.tell("go");
    let status = peer.child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGSEGV),
        "write to a secured fbuf did not fault: {status:?}"
    );
    assert_eq!(verify(&m).unwrap(), 42);
}

/// Waits until child `pid` has exited, without reaping it (`waitid` with `WNOWAIT`): it
/// stays a zombie until someone waits for it.
fn wait_exited_not_reaped(pid: u32) {
    // SAFETY: siginfo_t is plain data, for which all zeros is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable siginfo_t for the duration of the call.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT,
        )
    };
    assert_eq!(r, 0, "waitid: {}", std::io::Error::last_os_error());
}

/// The state letter of process `pid` (field 3 of /proc/PID/stat): 'Z' for a zombie.
fn proc_state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    rest.trim_start().chars().next().unwrap()
}

/// A member that exits without leaving and that no one has reaped (a zombie) is dead to
/// the group: a new joiner can take its slot, and the last live member's leaving removes
/// the named file. (Liveness from /proc start times alone counted zombies as alive.)
fn zombie_member_does_not_leak_the_group() {
    let (g, d, name) = join("zombie");
    let file = std::path::PathBuf::from(format!("/dev/shm/ferry.{name}"));
    let mut peer = Peer::spawn("exit-holding", &name, "");
    let pid = peer.child.id();
    wait_exited_not_reaped(pid);
    assert_eq!(proc_state(pid), 'Z');
    assert_eq!(
        g.members().iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![d.id()],
        "the zombie still counts as a member"
    );
    // A new joiner reclaims the zombie's slot (slots are taken lowest first).
    let d2 = g.join().unwrap();
    assert_eq!(
        d2.id().slot,
        peer.id.slot,
        "the zombie's slot was not reclaimed"
    );
    assert!(d2.id().generation > peer.id.generation);
    drop(d2);
    drop((d, g));
    assert_eq!(
        proc_state(pid),
        'Z',
        "the child was reaped before the check"
    );
    assert!(!file.exists(), "{} left behind", file.display());
    assert!(peer.child.wait().unwrap().success());
}

/// Processes that open a group that does not exist yet, all at once, race to create it:
/// they must all end up in the same one, and the last to leave removes the file.
fn concurrent_creators_share_one_group() {
    let name = group_name("race");
    let file = std::path::PathBuf::from(format!("/dev/shm/ferry.{name}"));
    for _ in 0..5 {
        let n = 8;
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            + Duration::from_millis(300);
        let mut kids: Vec<Child> = (0..n)
            .map(|_| {
                Command::new(std::env::current_exe().unwrap())
                    .env("FERRY_TEST_ROLE", "count-members")
                    .env("FERRY_TEST_GROUP", &name)
                    .env("FERRY_TEST_START_AT", at.as_nanos().to_string())
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut outs: Vec<_> = kids
            .iter_mut()
            .map(|c| BufReader::new(c.stdout.take().unwrap()))
            .collect();
        let ids: Vec<DomainId> = outs
            .iter_mut()
            .map(|o| read_line(o).parse().unwrap())
            .collect();
        let mut slots: Vec<u16> = ids.iter().map(|i| i.slot).collect();
        slots.sort();
        slots.dedup();
        assert_eq!(slots.len(), n, "two members share a slot: {ids:?}");
        for (k, o) in kids.iter_mut().zip(&mut outs) {
            writeln!(k.stdin.as_mut().unwrap(), "count").unwrap();
            assert_eq!(read_line(o), n.to_string(), "members split into groups");
        }
        for k in &mut kids {
            writeln!(k.stdin.as_mut().unwrap(), "bye").unwrap();
        }
        for k in &mut kids {
            assert!(k.wait().unwrap().success());
        }
        assert!(!file.exists(), "{} left behind", file.display());
    }
}

/// Damages the named file of a group while two processes are members and pass messages:
/// nobody gets SIGBUS (members map the sealed control memfd, not the file), the messages
/// keep flowing and verify, the members still see each other and can open new channels,
/// and a new `Group::open` of the name does not crash.
fn damage_named_file_while_in_use(tag: &str, damage: fn(&std::path::Path)) {
    let (g, d, name) = join(tag);
    let file = std::path::PathBuf::from(format!("/dev/shm/ferry.{name}"));
    let mut peer = Peer::spawn("verify", &name, "");
    let tx = d.connect(peer.id, T).unwrap();
    let path = d.path(PathConfig::default()).unwrap();
    let n = 600;
    for seed in 0..n {
        if seed == n / 3 {
            damage(&file);
        }
        tx.send(&message(
            &path,
            seed,
            1000 + (seed as usize * 977) % 30_000,
            3,
        ))
        .unwrap();
    }
    // The control block is intact: both members are there, and a new channel (offered
    // through the control block) opens between two domains of this process.
    let mut ids: Vec<_> = g.members().iter().map(|m| m.id).collect();
    ids.sort_by_key(|i| i.slot);
    assert_eq!(ids, vec![d.id(), peer.id]);
    let d2 = g.join().unwrap();
    let to = d2.id();
    let dc = d.clone();
    let connecting = std::thread::spawn(move || dc.connect(to, T));
    let mut rx2 = d2.accept(T).unwrap();
    let tx2 = connecting.join().unwrap().unwrap();
    tx2.send(&message(&path, 7, 5000, 2)).unwrap();
    assert_eq!(verify(&rx2.recv().unwrap()).unwrap(), 7);
    drop((tx2, rx2, d2));
    // A new opener cannot find this group through the damaged file: it gets a new,
    // empty group of the same name (a fresh control block, with its door in a fresh
    // table), and no crash. Dropping it removes that file again.
    let g2 = Group::open(&name).unwrap();
    assert!(g2.members().is_empty());
    drop(g2);
    drop(tx);
    assert_eq!(peer.line(), format!("ok {n}"));
    let status = peer.child.wait().unwrap();
    assert!(status.success(), "the other member died: {status:?}");
    d.collect_releases();
    assert_eq!(path.outstanding(), 0);
    drop((path, d, g));
    assert!(!file.exists(), "{} left behind", file.display());
}

fn truncated_named_file_harms_no_member() {
    damage_named_file_while_in_use("trunc", |f| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(f)
            .unwrap()
            .set_len(0)
            .unwrap();
    });
}

fn garbage_in_named_file_harms_no_member() {
    damage_named_file_while_in_use("garbage", |f| {
        // 3000 bytes of garbage in place of whatever was there (so the file also
        // shrinks, as it would under a careless `echo > /dev/shm/ferry.NAME`).
        let mut rng = Rng(0x5eed_1234_abcd_ef01);
        let junk: Vec<u8> = (0..3000).map(|_| rng.next() as u8).collect();
        std::fs::write(f, junk).unwrap();
    });
}

/// Receivers map other domains' lots read-only, through a read-only descriptor.
fn receivers_cannot_write_peer_lots() {
    let (g, d, name) = join("rolot");
    let mut peer = Peer::spawn("stream", &name, "");
    let mut rx = accept_from(&d, &mut peer);
    let m = rx.recv().unwrap();
    let addr = g.lot_addr(peer.id.slot);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps
        .lines()
        .find(|l| l.starts_with(&format!("{addr:x}-")))
        .expect("peer lot mapped");
    assert!(
        line.split_whitespace().nth(1).unwrap().starts_with("r--s"),
        "{line}"
    );
    // mprotect to writable must fail: the descriptor was opened read-only.
    // SAFETY: asks for more rights on our own mapping; the kernel refuses (checked).
    let r = unsafe { libc::mprotect(addr as *mut _, 4096, libc::PROT_READ | libc::PROT_WRITE) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EACCES)
    );
    drop(m);
    peer.kill9();
}

const RACE_SERVICE: &str = "race/lot";
const RACE_THREADS: usize = 6;

/// Several domains of one process that subscribe at once to a peer's services (each
/// service admits on its own thread) all map its lot through one shared mapping: none
/// is refused the lot's address as if an earlier domain of the peer's slot still held
/// it (as in a process that runs one subscriber per thread, each in its own domain).
fn domains_of_one_process_map_a_peer_lot_at_once() {
    for round in 0..30 {
        let (g, _d, name) = join(&format!("lotrace{round}"));
        let mut peer = Peer::spawn("offer", &name, "");
        assert_eq!(peer.line(), "offered");
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(RACE_THREADS));
        let threads: Vec<_> = (0..RACE_THREADS)
            .map(|i| {
                let (g, barrier) = (g.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let domain = g.join().unwrap();
                    barrier.wait();
                    let service = format!("{RACE_SERVICE}/{i}");
                    ferry::Subscriber::open(&domain, &service, T).map(drop)
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        peer.tell("end");
        peer.child.wait().unwrap();
        for r in results {
            if let Err(e) = r {
                panic!("round {round}: a subscriber was refused: {e}");
            }
        }
    }
}

/// Subscribers of a peer's services (offered from several threads at once), opened at
/// once from several threads, each get only their own service's messages: in one
/// domain (as a bridge subscribes to every service it exports) or each in its own.
fn subscribers_opened_at_once_get_their_own_services() {
    each_gets_its_own(
        "svcmix",
        "offer-each",
        "sent",
        "subscriber",
        |domain, service, _| {
            let mut s = ferry::Subscriber::open(domain, service, T).unwrap();
            (0..20)
                .map(|_| {
                    let d = s.recv_timeout(T).unwrap();
                    let mut b = [0u8; 1];
                    d.copy_range_to_slice(0..1, &mut b);
                    b[0]
                })
                .collect()
        },
    );
}

/// Twenty rounds of a peer in `role` with RACE_THREADS services (it prints `done` once
/// it served them all) and RACE_THREADS threads that open service `i` at once, in one
/// domain (even rounds) or each in its own, and run `use_service(domain, name, i)`:
/// every byte it returns must be `i`, the index the peer's service `i` sends.
fn each_gets_its_own(
    prefix: &str,
    role: &str,
    done: &str,
    what: &str,
    use_service: fn(&ferry::Domain, &str, usize) -> Vec<u8>,
) {
    for round in 0..20 {
        let one_domain = round % 2 == 0;
        let (g, d, name) = join(&format!("{prefix}{round}"));
        let mut peer = Peer::spawn(role, &name, "");
        let threads: Vec<_> = (0..RACE_THREADS)
            .map(|i| {
                let (g, d) = (g.clone(), d.clone());
                std::thread::spawn(move || {
                    let domain = if one_domain { d } else { g.join().unwrap() };
                    let service = format!("{RACE_SERVICE}/{i}");
                    (i, use_service(&domain, &service, i))
                })
            })
            .collect();
        for t in threads {
            let (i, got) = t.join().unwrap();
            assert!(
                got.iter().all(|&b| b as usize == i),
                "round {round} (one domain: {one_domain}): the {what} of service {i} got {got:?}"
            );
        }
        assert_eq!(peer.line(), done);
        peer.tell("end");
        peer.child.wait().unwrap();
    }
}

const RACE_CALLS: usize = 10;

/// Clients of a peer's servers (offered from several threads at once), opened at once
/// from several threads, each reach their own server: in one domain (as a bridge opens
/// a client for every server it imports) or each in its own. A server takes a client's
/// channel by its peer alone, so two clients of one domain connecting to two servers of
/// one owner at once could each be answered by the other's server.
fn clients_opened_at_once_reach_their_own_servers() {
    each_gets_its_own(
        "srvmix",
        "serve-each",
        "served",
        "client",
        |domain, service, i| {
            let mut c = ferry::Client::open(domain, service, T).unwrap();
            let path = domain.path(PathConfig::default()).unwrap();
            (0..RACE_CALLS)
                .map(|_| {
                    let mut m = path.alloc(1).unwrap();
                    m.fragments_mut().next().unwrap()[0] = i as u8;
                    let r = c.call(&m.freeze(), T).unwrap();
                    let mut b = [0u8; 1];
                    r.copy_range_to_slice(0..1, &mut b);
                    b[0]
                })
                .collect()
        },
    );
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    let tests: &[(&str, fn())] = &[
        ("transfers_with_checksums", transfers_with_checksums),
        (
            "receiver_killed_at_random_points",
            receiver_killed_at_random_points,
        ),
        (
            "sender_killed_at_random_points",
            sender_killed_at_random_points,
        ),
        (
            "containers_ship_between_processes",
            containers_ship_between_processes,
        ),
        (
            "sender_exiting_after_send_loses_nothing",
            sender_exiting_after_send_loses_nothing,
        ),
        (
            "secured_fbufs_are_write_protected",
            secured_fbufs_are_write_protected,
        ),
        (
            "receivers_cannot_write_peer_lots",
            receivers_cannot_write_peer_lots,
        ),
        (
            "zombie_member_does_not_leak_the_group",
            zombie_member_does_not_leak_the_group,
        ),
        (
            "concurrent_creators_share_one_group",
            concurrent_creators_share_one_group,
        ),
        (
            "truncated_named_file_harms_no_member",
            truncated_named_file_harms_no_member,
        ),
        (
            "garbage_in_named_file_harms_no_member",
            garbage_in_named_file_harms_no_member,
        ),
        (
            "domains_of_one_process_map_a_peer_lot_at_once",
            domains_of_one_process_map_a_peer_lot_at_once,
        ),
        (
            "subscribers_opened_at_once_get_their_own_services",
            subscribers_opened_at_once_get_their_own_services,
        ),
        (
            "clients_opened_at_once_reach_their_own_servers",
            clients_opened_at_once_reach_their_own_servers,
        ),
    ];
    run(tests);
}
