//! Descriptors as cargo between real processes: each kind this machine can make
//! (memfd sealed and not, eventfd, pipe end, unix socket, and a regular file standing in
//! for an opaque dma-buf) through a channel, publish-subscribe and request-response;
//! the receiver's duplicate works (it reads the memfd, signals the eventfd, writes the
//! pipe and the socket, and the sender sees it); the limit per message; a receiver that
//! accepts only memfds refuses an eventfd; a sender that dies before its descriptors
//! are taken; and kill -9 at random points with descriptors in flight, counting
//! `/proc/self/fd` of every survivor. Each child is this test binary re-executed in a
//! role (`harness = false`).
//!
//! sync_file and dma-buf descriptors are made by device drivers (a GPU, a camera,
//! `/dev/udmabuf`, `/dev/dma_heap`); where none is present they cannot be made, and the
//! test says so. ferry treats both as opaque descriptors, which the regular file here
//! stands in for.

mod common;

use std::io::BufRead;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use common::*;
use ferry::{
    Client, Error, FdKind, FdKinds, Fds, IoData, Publisher, Request, Server, ServiceConfig,
    Subscriber, MAX_FDS,
};
use rustix::fs::{MemfdFlags, SealFlags};

// ---------------------------------------------------------------- descriptors

fn memfd(content: &[u8], seal: bool) -> OwnedFd {
    let fd = rustix::fs::memfd_create(
        "fdcargo-test",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .unwrap();
    rustix::io::pwrite(&fd, content, 0).unwrap();
    if seal {
        rustix::fs::fcntl_add_seals(&fd, SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW)
            .unwrap();
    }
    fd
}

fn eventfd() -> OwnedFd {
    rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )
    .unwrap()
}

fn pipe() -> (OwnedFd, OwnedFd) {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap()
}

fn socketpair() -> (OwnedFd, OwnedFd) {
    rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .unwrap()
}

/// A regular file (unlinked): an opaque descriptor, as a dma-buf is to ferry.
fn opaque(content: &[u8]) -> OwnedFd {
    let f = tempfile_in_tmp();
    rustix::io::pwrite(&f, content, 0).unwrap();
    f
}

fn tempfile_in_tmp() -> OwnedFd {
    rustix::fs::open(
        "/tmp",
        rustix::fs::OFlags::TMPFILE | rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap()
}

fn read_at(fd: BorrowedFd<'_>, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    let n = rustix::io::pread(fd, &mut b, 0).unwrap();
    b.truncate(n);
    b
}

fn read_n(fd: BorrowedFd<'_>, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    let mut at = 0;
    while at < len {
        at += rustix::io::read(fd, &mut b[at..]).unwrap();
    }
    b
}

fn bytes(d: &ferry::Domain, b: &[u8]) -> IoData {
    let mut m = d
        .path(ferry::PathConfig::default())
        .unwrap()
        .alloc(b.len())
        .unwrap();
    m.fill_from(b);
    m.freeze()
}

/// What each open descriptor of this process is (`/proc/self/fd` links), for messages.
fn fd_links() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            Some(format!(
                "{}->{}",
                e.file_name().to_string_lossy(),
                std::fs::read_link(e.path()).ok()?.display()
            ))
        })
        .collect();
    v.sort();
    v
}

fn to_vec(d: &IoData) -> Vec<u8> {
    d.iter_bytes().collect()
}

/// What this machine can make of the device-made kinds.
fn device_kinds_note() {
    let devices = ["/dev/udmabuf", "/dev/dma_heap", "/dev/dri"];
    let present: Vec<_> = devices
        .iter()
        .filter(|p| std::path::Path::new(p).exists())
        .collect();
    if present.is_empty() {
        eprintln!(
            "    SKIP dma-buf and sync_file as themselves: no exporter here (none of {devices:?}); \
             an opaque regular file stands in for them"
        );
    } else {
        eprintln!(
            "    note: {present:?} present, but dma-buf and sync_file are still tested as opaque \
             descriptors only"
        );
    }
}

// ---------------------------------------------------------------- child roles

/// The sending end of [`kinds_through`]: over `arg` (channel, pubsub or reqresp), tries
/// one message past the limit, then sends a sealed memfd, an eventfd, a pipe's write end
/// and a socket; on "check" reads what the receiver did through its duplicates, on
/// "count" waits for its copies to close.
fn send_kinds(arg: &str, domain: &ferry::Domain, stdin: &mut impl BufRead) {
    enum End {
        Chan(ferry::Sender),
        Pub(Publisher),
        Srv(Server, Request),
    }
    let mut end = match arg {
        "channel" => {
            let peer = read_line(stdin).parse().unwrap();
            End::Chan(domain.connect(peer, T).unwrap())
        }
        "pubsub" => {
            let p = Publisher::offer(domain, "fd-cargo", ServiceConfig::default()).unwrap();
            p.wait_for_subscribers(1, T).unwrap();
            End::Pub(p)
        }
        "reqresp" => {
            let mut s = Server::offer(domain, "fd-cargo", ServiceConfig::default()).unwrap();
            s.set_fd_kinds(FdKinds::only(FdKind::Memfd));
            let (req, mut fds) = s.recv_with_fds_timeout(T).unwrap();
            assert_eq!(fds.kind(0), Some(FdKind::Memfd));
            let m = fds.take(0).unwrap();
            assert_eq!(read_at(m.as_fd(), 7), b"request");
            drop((m, fds));
            End::Srv(s, req)
        }
        _ => unreachable!(),
    };
    let mfd = memfd(b"memfd-cargo", true);
    let efd = eventfd();
    let (pr, pw) = pipe();
    let (sa, sb) = socketpair();
    let base = fd_count();
    let data = bytes(domain, b"cargo");
    let fds = [mfd.as_fd(), efd.as_fd(), pw.as_fd(), sb.as_fd()];
    let over = vec![mfd.as_fd(); MAX_FDS + 1];
    let mut send = |fds: &[BorrowedFd<'_>]| match &mut end {
        End::Chan(tx) => tx.send_with_fds(&data, fds),
        End::Pub(p) => p.publish_with_fds(&data, fds).map(|n| assert_eq!(n, 1)),
        End::Srv(s, req) => s.reply_with_fds(req, &data, fds),
    };
    let refused = send(&over);
    println!(
        "limit {} {}",
        matches!(refused, Err(Error::TooManyFds { count, max }) if count == MAX_FDS + 1 && max == MAX_FDS),
        fd_count() == base
    );
    send(&fds).unwrap();
    assert_eq!(read_line(stdin), "check");
    let mut n = [0u8; 8];
    rustix::io::read(&efd, &mut n).unwrap();
    println!(
        "efd={} pipe={} sock={}",
        u64::from_ne_bytes(n),
        String::from_utf8(read_n(pr.as_fd(), 4)).unwrap(),
        String::from_utf8(read_n(sa.as_fd(), 4)).unwrap()
    );
    assert_eq!(read_line(stdin), "count");
    within(10, || {
        domain.collect_releases();
        fd_count() == base
    });
    println!("{} {base}", fd_count());
    read_line(stdin);
}

/// The sending end of [`a_receiver_refuses_kinds_it_did_not_accept`].
fn send_mixed(domain: &ferry::Domain, stdin: &mut impl BufRead) {
    let peer = read_line(stdin).parse().unwrap();
    let tx = domain.connect(peer, T).unwrap();
    let efd = eventfd();
    let mfd = memfd(b"plain memfd", false);
    let file = opaque(b"pixels");
    // What a dma-buf's user metadata would be: format, stride, modifier.
    let meta = bytes(domain, b"NV12 3840 0x0100000000000001");
    tx.send_with_fds(&bytes(domain, b"efd"), &[efd.as_fd()])
        .unwrap();
    tx.send_with_fds(&bytes(domain, b"memfd"), &[mfd.as_fd()])
        .unwrap();
    tx.send_with_fds(&meta, &[file.as_fd()]).unwrap();
    tx.send_with_fds(&meta, &[file.as_fd()]).unwrap();
    read_line(stdin);
}

/// Sends one message carrying a memfd, says so, and waits to be killed.
fn send_and_wait(domain: &ferry::Domain, stdin: &mut impl BufRead) {
    let peer = read_line(stdin).parse().unwrap();
    let tx = domain.connect(peer, T).unwrap();
    let mfd = memfd(b"lost", false);
    tx.send_with_fds(&bytes(domain, b"orphan"), &[mfd.as_fd()])
        .unwrap();
    println!("sent");
    read_line(stdin);
}

/// Sends messages carrying a memfd and a pipe end until it is killed or its receiver
/// goes away.
fn stream(domain: &ferry::Domain, stdin: &mut impl BufRead) {
    let peer = read_line(stdin).parse().unwrap();
    let tx = domain.connect(peer, T).unwrap();
    let mfd = memfd(b"stream", false);
    let (_pr, pw) = pipe();
    println!("streaming");
    let mut i = 0u64;
    loop {
        let d = bytes(domain, &i.to_le_bytes());
        if tx.send_with_fds(&d, &[mfd.as_fd(), pw.as_fd()]).is_err() {
            break;
        }
        i += 1;
    }
}

/// Receives with descriptors and holds a random share of them, until killed; or, given
/// "count" (a subscriber that survives), drops what it holds and reports its descriptor
/// count against the one it had once subscribed.
fn sink(arg: &str, domain: &ferry::Domain) {
    let mut rng = Rng(std::process::id() as u64 | 1);
    let mut held: Vec<(IoData, Fds)> = Vec::new();
    let mut recv: Box<dyn FnMut() -> ferry::Result<(IoData, Fds)>> = match arg {
        "channel" => {
            let mut rx = domain.accept(T).unwrap();
            Box::new(move || rx.recv_with_fds_timeout(T))
        }
        _ => {
            let mut sub = Subscriber::open(domain, "fd-cargo-kill", T).unwrap();
            Box::new(move || sub.recv_with_fds_timeout(Duration::from_millis(200)))
        }
    };
    let base = fd_count();
    println!("ready");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        while tx.send(read_line(&mut stdin)).is_ok() {}
    });
    loop {
        match recv() {
            Ok(m) => {
                assert_eq!(m.1.len(), 2);
                if rng.below(3) == 0 {
                    held.push(m);
                }
                if held.len() > 8 {
                    held.swap_remove(rng.below(held.len() as u64) as usize);
                }
            }
            Err(Error::Timeout) => {}
            Err(e) => panic!("{e}"),
        }
        if lines.try_recv().is_ok() {
            break;
        }
    }
    held.clear();
    println!("{} {base}", fd_count());
}

/// The receiving end of [`containers_carry_every_kind`]: takes a container with cargo
/// over the abstract socket `arg`, uses every duplicate, then refuses an eventfd when
/// it accepts only memfds, and reports its descriptor count.
fn container_recv(arg: &str) {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(arg).unwrap();
    let sock = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    let base = fd_count();
    println!("connected");
    let (mut c, mut fds) =
        ferry::containers::Container::receive_with_fds(&sock, FdKinds::default()).unwrap();
    let kinds: Vec<_> = (0..fds.len()).map(|i| fds.kind(i).unwrap()).collect();
    assert_eq!(
        kinds,
        [FdKind::Memfd, FdKind::EventFd, FdKind::Pipe, FdKind::Socket]
    );
    let v = c.view(0).unwrap();
    assert_eq!(v.valid_bytes(), b"pallet");
    drop(v);
    assert_eq!(read_at(fds.get(0).unwrap(), 64), b"memfd-cargo");
    rustix::io::write(fds.get(1).unwrap(), &5u64.to_ne_bytes()).unwrap();
    rustix::io::write(fds.get(2).unwrap(), b"pong").unwrap();
    rustix::io::write(fds.get(3).unwrap(), b"sock").unwrap();
    let _ = fds.take(3);
    drop((c, fds));
    println!("used {}", fd_count() == base);
    let refused =
        ferry::containers::Container::receive_with_fds(&sock, FdKinds::only(FdKind::Memfd));
    println!(
        "refused {} {}",
        matches!(
            refused,
            Err(Error::FdRefused {
                index: 0,
                kind: FdKind::EventFd
            })
        ),
        fd_count() == base
    );
}

fn child_main(role: &str) {
    let (_gname, _group, domain, arg, mut stdin) = child_start();
    match role {
        "send-kinds" => send_kinds(&arg, &domain, &mut stdin),
        "send-mixed" => send_mixed(&domain, &mut stdin),
        "send-and-wait" => send_and_wait(&domain, &mut stdin),
        "stream" => stream(&domain, &mut stdin),
        "sink" => sink(&arg, &domain),
        "container-recv" => container_recv(&arg),
        _ => panic!("unknown role {role}"),
    }
}

// ---------------------------------------------------------------- tests

/// Every testable kind through `path`; the receiver's duplicates work; the limit; no
/// descriptor left open on either side once the message and its `Fds` are dropped.
fn kinds_through(path: &str) {
    device_kinds_note();
    let (_g, d, name) = join(&format!("fdk-{path}"));
    let mut peer = Peer::spawn("send-kinds", &name, path);
    enum End {
        Chan(ferry::Receiver),
        Sub(Subscriber),
        Client(Client),
    }
    let mut end = match path {
        "channel" => End::Chan(accept_from(&d, &mut peer)),
        "pubsub" => End::Sub(Subscriber::open(&d, "fd-cargo", T).unwrap()),
        _ => End::Client(Client::open(&d, "fd-cargo", T).unwrap()),
    };
    let request = memfd(b"request", true);
    let base = fd_count();
    let (data, mut fds) = match &mut end {
        End::Chan(rx) => rx.recv_with_fds_timeout(T).unwrap(),
        End::Sub(s) => s.recv_with_fds_timeout(T).unwrap(),
        End::Client(c) => c
            .call_with_fds(&bytes(&d, b"req"), &[request.as_fd()], T)
            .unwrap(),
    };
    assert_eq!(
        peer.line(),
        "limit true true",
        "the limit, and no copy left"
    );
    assert_eq!(to_vec(&data), b"cargo");
    let kinds: Vec<_> = (0..fds.len()).map(|i| fds.kind(i).unwrap()).collect();
    assert_eq!(
        kinds,
        [FdKind::Memfd, FdKind::EventFd, FdKind::Pipe, FdKind::Socket]
    );
    // A client's sender keeps its copy of the request's memfd until the server lets go
    // of the request (after its reply).
    let extra = usize::from(path == "reqresp");
    assert_eq!(
        fd_count(),
        base + 4 + extra,
        "four duplicates, nothing else: {:?}",
        fd_links()
    );
    // The duplicates work: read the memfd (sealed by the sender), signal the eventfd,
    // write the pipe and the socket.
    let m = fds.get(0).unwrap();
    assert_eq!(read_at(m, 64), b"memfd-cargo");
    assert!(rustix::fs::fcntl_get_seals(m)
        .unwrap()
        .contains(SealFlags::WRITE));
    rustix::io::write(fds.get(1).unwrap(), &5u64.to_ne_bytes()).unwrap();
    rustix::io::write(fds.get(2).unwrap(), b"pong").unwrap();
    rustix::io::write(fds.get(3).unwrap(), b"sock").unwrap();
    peer.tell("check");
    assert_eq!(peer.line(), "efd=5 pipe=pong sock=sock");
    // One taken out outlives the message; the others close with it.
    let kept = fds.take(2).unwrap();
    assert!(fds.get(2).is_none() && fds.take(2).is_none());
    drop((data, fds));
    assert_eq!(fd_count(), base + 1 + extra);
    drop(kept);
    assert_eq!(fd_count(), base + extra);
    peer.tell("count");
    let line = peer.line();
    let (now, then) = line.split_once(' ').unwrap();
    assert_eq!(now, then, "the sender closed its copies once released");
    peer.tell("exit");
    peer.child.wait().unwrap();
    // `wait` closed our end of the child's stdin.
    assert!(
        within(10, || {
            d.collect_releases();
            fd_count() == base - 1
        }),
        "{:?}",
        fd_links()
    );
    drop(end);
}

fn channel_carries_every_kind() {
    kinds_through("channel");
}

fn pubsub_carries_every_kind() {
    kinds_through("pubsub");
}

fn reqresp_carries_every_kind_both_ways() {
    kinds_through("reqresp");
}

/// A receiver that accepts only memfds refuses an eventfd with a clear error, keeping
/// nothing; the default refuses an opaque file, which `FdKinds::ANY` lets through with
/// its metadata bytes.
fn a_receiver_refuses_kinds_it_did_not_accept() {
    let (_g, d, name) = join("fdk-refuse");
    let mut peer = Peer::spawn("send-mixed", &name, "");
    let mut rx = accept_from(&d, &mut peer);
    let base = fd_count();
    rx.set_fd_kinds(FdKinds::only(FdKind::Memfd));
    match rx.recv_with_fds_timeout(T) {
        Err(
            e @ Error::FdRefused {
                index: 0,
                kind: FdKind::EventFd,
            },
        ) => assert!(e.to_string().contains("eventfd"), "{e}"),
        other => panic!("expected the eventfd refused, got {other:?}"),
    }
    assert_eq!(fd_count(), base, "nothing kept of a refused message");
    let (data, fds) = rx.recv_with_fds_timeout(T).unwrap();
    assert_eq!(to_vec(&data), b"memfd");
    assert_eq!(read_at(fds.get(0).unwrap(), 64), b"plain memfd");
    drop((data, fds));
    rx.set_fd_kinds(FdKinds::default());
    assert!(matches!(
        rx.recv_with_fds_timeout(T),
        Err(Error::FdRefused {
            kind: FdKind::Other,
            ..
        })
    ));
    rx.set_fd_kinds(FdKinds::ANY);
    let (meta, fds) = rx.recv_with_fds_timeout(T).unwrap();
    assert_eq!(to_vec(&meta), b"NV12 3840 0x0100000000000001");
    assert_eq!(fds.kind(0), Some(FdKind::Other));
    assert_eq!(read_at(fds.get(0).unwrap(), 64), b"pixels");
    drop((meta, fds));
    assert_eq!(fd_count(), base);
    assert_eq!(rx.stats().bad_from_peer, 0);
    peer.tell("exit");
    peer.child.wait().unwrap();
}

/// A sender that dies before its descriptors were taken: the receiver gets `FdsLost`
/// (no hang), keeps nothing, and then learns the sender is gone.
fn a_sender_dead_before_the_take_is_reported() {
    let (_g, d, name) = join("fdk-lost");
    let mut peer = Peer::spawn("send-and-wait", &name, "");
    let mut rx = accept_from(&d, &mut peer);
    assert_eq!(peer.line(), "sent");
    peer.kill9();
    let base = fd_count();
    let t0 = std::time::Instant::now();
    match rx.recv_with_fds_timeout(T) {
        Err(e @ Error::FdsLost { .. }) => assert!(e.to_string().contains("died"), "{e}"),
        other => panic!("expected FdsLost, got {other:?}"),
    }
    assert!(t0.elapsed() < T + Duration::from_secs(5));
    assert_eq!(fd_count(), base);
    assert!(matches!(
        rx.recv_with_fds_timeout(T),
        Err(Error::PeerGone { .. })
    ));
    drop(rx);
}

/// kill -9 of the sender at a random point while messages with descriptors stream in:
/// the receiver, holding a random share of them, ends with exactly the descriptors it
/// had before the channel.
fn killing_the_sender_leaks_nothing_in_the_receiver() {
    let mut rng = seed_rng();
    for round in 0..4 {
        let (_g, d, name) = join(&format!("fdk-ks{round}"));
        let base = fd_count();
        let mut peer = Peer::spawn("stream", &name, "");
        let mut rx = accept_from(&d, &mut peer);
        assert_eq!(peer.line(), "streaming");
        let before_kill = rng.below(200);
        let mut held = Vec::new();
        let mut got = 0u64;
        let mut killed = false;
        loop {
            if !killed && got >= before_kill {
                peer.kill9();
                killed = true;
            }
            match rx.recv_with_fds_timeout(T) {
                Ok((data, fds)) => {
                    assert_eq!(fds.len(), 2);
                    assert_eq!(fds.kind(0), Some(FdKind::Memfd));
                    got += 1;
                    if rng.below(2) == 0 {
                        held.push((data, fds));
                    }
                }
                Err(Error::FdsLost { .. }) => assert!(killed),
                Err(Error::PeerGone { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        drop(held);
        drop(rx);
        drop(peer);
        assert!(
            within(10, || fd_count() == base),
            "round {round}: {} descriptors, {base} before: {:?}",
            fd_count(),
            fd_links()
        );
    }
}

/// kill -9 of the receiver at a random point, with messages and descriptors in flight:
/// the sender's copies all close once it learns the receiver died.
fn killing_the_receiver_leaks_nothing_in_the_sender() {
    let mut rng = seed_rng();
    let mfd = memfd(b"fan", false);
    let (_pr, pw) = pipe();
    for round in 0..4 {
        let (_g, d, name) = join(&format!("fdk-kr{round}"));
        let base = fd_count();
        let mut peer = Peer::spawn("sink", &name, "channel");
        let config = ferry::ChannelConfig {
            capacity: 32,
            ..Default::default()
        };
        let tx = d.connect_with(peer.id, config, T).unwrap();
        assert_eq!(peer.line(), "ready");
        let kill_at = rng.below(300);
        let mut i = 0u64;
        loop {
            if i == kill_at {
                peer.kill9();
            }
            match tx.send_with_fds(&bytes(&d, &i.to_le_bytes()), &[mfd.as_fd(), pw.as_fd()]) {
                Ok(()) => i += 1,
                Err(Error::PeerGone { .. } | Error::Disconnected) => break,
                Err(e) => panic!("{e}"),
            }
            if i > kill_at && tx.check_peer().is_err() {
                break;
            }
        }
        assert_eq!(
            tx.in_flight(),
            0,
            "everything reclaimed from the dead receiver"
        );
        drop(tx);
        drop(peer);
        assert!(
            within(10, || fd_count() == base),
            "round {round}: {} descriptors, {base} before: {:?}",
            fd_count(),
            fd_links()
        );
    }
}

/// Three processes: a publisher (this one) sends descriptors to two subscribers and one
/// is killed at a random point. The publisher and the surviving subscriber end with the
/// descriptors they had before.
fn killing_a_subscriber_leaks_nothing_in_the_others() {
    let mut rng = seed_rng();
    let mfd = memfd(b"fan", false);
    let (_pr, pw) = pipe();
    for round in 0..3 {
        let (_g, d, name) = join(&format!("fdk-ps{round}"));
        let base = fd_count();
        let config = ServiceConfig {
            depth: 32,
            ..Default::default()
        };
        let mut p = Publisher::offer(&d, "fd-cargo-kill", config).unwrap();
        let mut victim = Peer::spawn("sink", &name, "pubsub");
        let mut survivor = Peer::spawn("sink", &name, "pubsub");
        assert_eq!(victim.line(), "ready");
        assert_eq!(survivor.line(), "ready");
        p.wait_for_subscribers(2, T).unwrap();
        let kill_at = rng.below(300);
        for i in 0..400u64 {
            if i == kill_at {
                victim.kill9();
            }
            p.publish_with_fds(&bytes(&d, &i.to_le_bytes()), &[mfd.as_fd(), pw.as_fd()])
                .unwrap();
        }
        survivor.tell("count");
        let line = survivor.line();
        let (now, then) = line.split_once(' ').unwrap();
        assert_eq!(now, then, "round {round}: the survivor's descriptors");
        survivor.child.wait().unwrap();
        assert!(within(10, || {
            p.collect_releases();
            p.subscriber_count() == 0
        }));
        drop(p);
        drop((victim, survivor));
        assert!(
            within(10, || fd_count() == base),
            "round {round}: {} descriptors, {base} before: {:?}",
            fd_count(),
            fd_links()
        );
    }
}

/// A hostile sender's descriptor tables are refused with `BadDescriptor`, and nothing
/// is kept: too many entries, unaligned, outside its lot, a number it has not open, a
/// negative number.
fn a_hostile_descriptor_table_is_refused() {
    use ferry::testing::{push_raw, RawDesc};
    let (_g, a, _name) = join("fdk-hostile");
    let b = _g.join().unwrap();
    let (a2, to) = (a.clone(), b.id());
    let connecting = std::thread::spawn(move || a2.connect(to, T).unwrap());
    let mut rx = b.accept(T).unwrap();
    let tx = connecting.join().unwrap();
    let path = a.path(ferry::PathConfig::default()).unwrap();
    let table = |n: i32| {
        let mut m = path.alloc(8).unwrap();
        m.write_at(0, &n.to_le_bytes());
        m.write_at(4, &n.to_le_bytes());
        let d = m.freeze();
        let at = d.fragments()[0].lot_span().unwrap().offset;
        (d, at)
    };
    let (_keep1, not_open) = table(1 << 20);
    let (_keep2, negative) = table(-1);
    let base = fd_count();
    let cases: [(u16, u64); 5] = [
        (MAX_FDS as u16 + 1, not_open),
        (1, not_open + 2),
        (1, u64::MAX - 3),
        (1, not_open),
        (1, negative),
    ];
    for (i, (nfds, cargo)) in cases.into_iter().enumerate() {
        let d = RawDesc {
            token: i as u64,
            nfds,
            cargo,
            ..RawDesc::default()
        };
        push_raw(&tx, d).unwrap();
        match rx.recv_with_fds_timeout(T) {
            Err(Error::BadDescriptor(_)) => {}
            other => panic!("case {i}: expected BadDescriptor, got {other:?}"),
        }
        assert_eq!(fd_count(), base, "case {i}: nothing kept");
    }
    assert_eq!(rx.stats().bad_from_peer, cases.len() as u64);
}

/// Under `SlowSubscriber::Drop` a stuck subscriber's oldest messages are evicted; the
/// publisher's duplicates of their descriptors close with them, so a publisher that
/// keeps publishing with cargo to a subscriber that never receives holds at most a
/// queue's worth of descriptors, and none once both are gone.
fn lossy_eviction_closes_the_evicted_cargo() {
    let (g, a, _name) = join("fdk-evict");
    let b = g.join().unwrap();
    let config = ServiceConfig {
        depth: 4,
        ..ServiceConfig::default()
    };
    let base = fd_count();
    let mut p = Publisher::offer(&a, "evict", config.clone()).unwrap();
    let sub = Subscriber::open(&b, "evict", T).unwrap();
    p.wait_for_subscribers(1, T).unwrap();
    let with_both = fd_count();
    let (r, _w) = pipe();
    for i in 0..200u32 {
        let mut m = p.path().alloc(4).unwrap();
        m.write_at(0, &i.to_le_bytes());
        assert_eq!(p.publish_with_fds(&m.freeze(), &[r.as_fd()]).unwrap(), 1);
    }
    // The pipe's two ends, and one duplicate per queued message at most.
    let held = fd_count() - with_both;
    assert!(
        held <= 2 + config.depth as usize,
        "{held} descriptors held after 200 evicting publishes into a queue of {}: {:?}",
        config.depth,
        fd_links()
    );
    drop(sub);
    drop(p);
    drop(r);
    drop(_w);
    assert!(
        within(10, || fd_count() == base),
        "{} descriptors, {base} before: {:?}",
        fd_count(),
        fd_links()
    );
}

/// A container ships with cargo of every kind to another process, whose duplicates
/// work; the limit; a receiver that accepts only memfds refuses an eventfd; neither side
/// keeps a descriptor it should not.
fn containers_carry_every_kind() {
    use ferry::containers::Container;
    use std::os::linux::net::SocketAddrExt;
    let (_g, _d, name) = join("fdk-ct");
    let sname = format!("ferry-fdcargo-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&sname).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let mut peer = Peer::spawn("container-recv", &name, &sname);
    let (sock, _) = listener.accept().unwrap();
    assert_eq!(peer.line(), "connected");
    let mfd = memfd(b"memfd-cargo", true);
    let efd = eventfd();
    let (pr, pw) = pipe();
    let (sa, sb) = socketpair();
    let base = fd_count();
    let mut c = Container::alloc(&[4096]).unwrap();
    {
        let mut u = c.unload(0).unwrap();
        u.as_mut_slice()[..6].copy_from_slice(b"pallet");
        u.reload(0..6).unwrap();
    }
    let over = vec![mfd.as_fd(); MAX_FDS + 1];
    let e = c.ship_with_fds(&sock, &over).unwrap_err();
    assert!(matches!(e.error, Error::TooManyFds { .. }));
    let c = e.container.expect("the container comes back");
    c.ship_with_fds(&sock, &[mfd.as_fd(), efd.as_fd(), pw.as_fd(), sb.as_fd()])
        .unwrap();
    assert_eq!(peer.line(), "used true");
    let mut n = [0u8; 8];
    rustix::io::read(&efd, &mut n).unwrap();
    assert_eq!(u64::from_ne_bytes(n), 5);
    assert_eq!(read_n(pr.as_fd(), 4), b"pong");
    assert_eq!(read_n(sa.as_fd(), 4), b"sock");
    Container::alloc(&[4096])
        .unwrap()
        .ship_with_fds(&sock, &[efd.as_fd()])
        .unwrap();
    assert_eq!(peer.line(), "refused true true");
    assert_eq!(fd_count(), base, "{:?}", fd_links());
    peer.child.wait().unwrap();
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[
        ("channel_carries_every_kind", channel_carries_every_kind),
        ("pubsub_carries_every_kind", pubsub_carries_every_kind),
        (
            "reqresp_carries_every_kind_both_ways",
            reqresp_carries_every_kind_both_ways,
        ),
        (
            "a_receiver_refuses_kinds_it_did_not_accept",
            a_receiver_refuses_kinds_it_did_not_accept,
        ),
        (
            "a_sender_dead_before_the_take_is_reported",
            a_sender_dead_before_the_take_is_reported,
        ),
        (
            "killing_the_sender_leaks_nothing_in_the_receiver",
            killing_the_sender_leaks_nothing_in_the_receiver,
        ),
        (
            "killing_the_receiver_leaks_nothing_in_the_sender",
            killing_the_receiver_leaks_nothing_in_the_sender,
        ),
        (
            "killing_a_subscriber_leaks_nothing_in_the_others",
            killing_a_subscriber_leaks_nothing_in_the_others,
        ),
        (
            "lossy_eviction_closes_the_evicted_cargo",
            lossy_eviction_closes_the_evicted_cargo,
        ),
        ("containers_carry_every_kind", containers_carry_every_kind),
        (
            "a_hostile_descriptor_table_is_refused",
            a_hostile_descriptor_table_is_refused,
        ),
    ]);
}
