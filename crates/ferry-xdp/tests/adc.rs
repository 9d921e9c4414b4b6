//! Application device channels between real processes, in network namespaces this test
//! makes (two of them, joined by a veth pair): frames into a lot, the broker's grants,
//! forwarding a frame in place, the fallback, kill -9, malformed requests.
//!
//! Needs root and `ip` (iproute2); prints SKIP and passes otherwise. Runs with its own
//! harness (`harness = false`) so that children are re-executions of this binary.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ferry::{Group, PathConfig};
use ferry_xdp::bpf::{AttachMode, Redirect, Steer};
use ferry_xdp::proto::{Reply, Request, Status};
use ferry_xdp::xsk::{Geometry, XskRx};
use ferry_xdp::{testnet, AdcConfig, AdcRx, RxPath};

const RX_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const T: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------- namespaces

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Two network namespaces joined by a veth pair (`ferry_xdp::testnet`): `rx` (interface
/// `adc0`, 10.77.0.1) and `tx` (`adc1`, 10.77.0.2). Deleted on drop, also when a test
/// fails.
struct Net(testnet::Net);

impl std::ops::Deref for Net {
    type Target = testnet::Net;
    fn deref(&self) -> &testnet::Net {
        &self.0
    }
}

impl Net {
    fn new() -> Net {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        Net(testnet::Net::new(&format!("ferryadc-{}-{n}", std::process::id()), 77).unwrap())
    }

    /// Runs `f` on a thread inside namespace `ns`.
    fn within<R: Send + 'static>(ns: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
        testnet::Net::within(ns, f).unwrap()
    }

    /// Sends `count` patterned datagrams of `len` bytes to `port` from the `tx` side.
    fn send(&self, port: u16, count: u32, len: usize) {
        Net::within(&self.tx, move || {
            let s = UdpSocket::bind("10.77.0.2:0").unwrap();
            for i in 0..count {
                s.send_to(&pattern(i, len), SocketAddrV4::new(RX_IP, port))
                    .unwrap();
                if i % 8 == 7 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        })
    }
}

fn pattern(i: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|j| (j as u32).wrapping_mul(31).wrapping_add(i) as u8)
        .collect();
    v[..4].copy_from_slice(&i.to_le_bytes());
    v[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    v
}

/// The datagram's number if its bytes are intact.
fn check(b: &[u8]) -> Option<u32> {
    if b.len() < 8 {
        return None;
    }
    let i = u32::from_le_bytes(b[..4].try_into().unwrap());
    let len = u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
    (len == b.len() && pattern(i, len) == b).then_some(i)
}

// ---------------------------------------------------------------- processes

/// A child process killed on drop.
struct Kid {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Kid {
    fn line(&mut self) -> String {
        let mut s = String::new();
        self.out.read_line(&mut s).unwrap();
        s.trim().to_owned()
    }

    /// Reads lines until one starts with `prefix`; returns the rest of it.
    fn expect(&mut self, prefix: &str) -> String {
        loop {
            let l = self.line();
            if l.is_empty() {
                panic!("child ended before {prefix:?}");
            }
            if let Some(rest) = l.strip_prefix(prefix) {
                return rest.trim().to_owned();
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(mut c: Command) -> Kid {
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    Kid { child, out }
}

/// The broker, in the `rx` namespace, with its log in a file.
struct BrokerProc {
    kid: Kid,
    socket: PathBuf,
    log: PathBuf,
    dir: PathBuf,
}

impl BrokerProc {
    fn start(net: &Net, policy: &str) -> BrokerProc {
        let dir = std::env::temp_dir().join(format!("{}-broker", net.rx));
        std::fs::create_dir_all(&dir).unwrap();
        let policy_file = dir.join("policy");
        std::fs::write(&policy_file, policy).unwrap();
        let socket = dir.join("sock");
        let log = dir.join("log");
        let mut c = net.cmd_rx(Path::new(env!("CARGO_BIN_EXE_ferry-adc")));
        c.arg("--policy")
            .arg(&policy_file)
            .arg("--socket")
            .arg(&socket)
            .stderr(std::fs::File::create(&log).unwrap());
        let mut kid = spawn(c);
        let ready = kid.line();
        assert!(
            ready.contains("ready"),
            "broker: {ready:?} {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        BrokerProc {
            kid,
            socket,
            log,
            dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `what`.
    fn wait_log(&self, what: &str) {
        let t0 = Instant::now();
        while !self.log().contains(what) {
            assert!(
                t0.elapsed() < T,
                "broker log lacks {what:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Descriptors the broker process holds (the `ip netns exec` wrapper execs it).
    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.kid.pid()))
            .unwrap()
            .count()
    }

    fn alive(&mut self) -> bool {
        self.kid.child.try_wait().unwrap().is_none()
    }
}

impl Drop for BrokerProc {
    fn drop(&mut self) {
        let _ = self.kid.child.kill();
        let _ = self.kid.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn policy(grants: &str) -> String {
    format!("interface adc0\nattach drv\nsteer udp-port\nmax-umem 16M\n{grants}\n")
}

fn app(
    net: &Net,
    broker: Option<&BrokerProc>,
    group: &str,
    port: u16,
    count: u32,
    extra: &[(&str, String)],
) -> Kid {
    let mut c = net.cmd_rx(&std::env::current_exe().unwrap());
    c.arg("--child").arg("app");
    c.env("ADC_GROUP", group)
        .env("ADC_PORT", port.to_string())
        .env("ADC_COUNT", count.to_string());
    if let Some(b) = broker {
        c.env("ADC_SOCKET", &b.socket);
    }
    for (k, v) in extra {
        c.env(k, v);
    }
    spawn(c)
}

fn group_name(tag: &str) -> String {
    format!("adctest-{tag}-{}", std::process::id())
}

// ---------------------------------------------------------------- child roles

fn child_app() {
    let group = Group::open(&std::env::var("ADC_GROUP").unwrap()).unwrap();
    let domain = group.join().unwrap();
    let path = domain.path(PathConfig::default()).unwrap();
    let port: u16 = std::env::var("ADC_PORT").unwrap().parse().unwrap();
    let count: u32 = std::env::var("ADC_COUNT").unwrap().parse().unwrap();
    let forward = std::env::var("ADC_FORWARD_TO").ok();
    let tx = forward.map(|to| domain.connect(to.parse().unwrap(), T).unwrap());
    if std::env::var("ADC_DROP").is_ok() {
        // SAFETY: plain system calls; no other thread of this process runs code that
        // depends on the ids.
        unsafe {
            assert_eq!(libc::setresgid(65534, 65534, 65534), 0);
            assert_eq!(libc::setresuid(65534, 65534, 65534), 0);
        }
        // Unprivileged, this process cannot make an AF_XDP socket of its own.
        let own = ferry_xdp::direct::make_socket(
            1,
            0,
            path.area(4096 * 16).unwrap().lot_fd(),
            0,
            4096 * 16,
            Geometry {
                frame: 4096,
                ring: 16,
            },
            false,
        );
        println!("own-socket {}", if own.is_ok() { "ok" } else { "refused" });
    }
    // SAFETY: getuid cannot fail.
    println!("uid {}", unsafe { libc::getuid() });
    let mut cfg = AdcConfig::new(
        std::env::var("ADC_SOCKET").ok().map(PathBuf::from),
        "adc0",
        port,
    );
    cfg.frames = 256;
    let tx_spec = std::env::var("ADC_TX").ok();
    if tx_spec.is_some() {
        cfg.tx_frames = 64;
    }
    #[cfg(feature = "uring")]
    if std::env::var("ADC_FALLBACK").as_deref() == Ok("uring") {
        cfg.fallback = ferry_xdp::Fallback::Uring;
    }
    let mut rx = AdcRx::open(&path, &cfg).unwrap();
    match rx.path() {
        RxPath::Xdp { queue, zerocopy } => println!("path xdp queue={queue} zerocopy={zerocopy}"),
        RxPath::Udp { reason, refused } => println!("path udp {refused:?} {reason}"),
    }
    println!("ready");
    let lot = domain.lot_addr()..domain.lot_addr() + group.lot_size();
    if let Some(spec) = tx_spec {
        // "count len port": `count` patterned datagrams (0: for ever) to the tx side.
        let v: Vec<usize> = spec.split(' ').map(|w| w.parse().unwrap()).collect();
        let (count, len, port) = (v[0] as u32, v[1], v[2] as u16);
        let mut tx = rx.take_tx().expect("a sender");
        let s = tx.stats();
        println!("tx-path {}", s.path);
        let to = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 2), port);
        let parent = rustix::process::getppid();
        let mut i = 0u32;
        while count == 0 || i < count {
            // A test that failed without killing us (a hang exits the harness): stop.
            if rustix::process::getppid() != parent {
                std::process::exit(1);
            }
            let Some(mut b) = tx.alloc(len).unwrap() else {
                tx.complete();
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            let p = b.payload_mut();
            let ptr = p.as_ptr() as usize;
            assert!(lot.contains(&ptr), "the payload is written in the lot");
            p.copy_from_slice(&pattern(i, len));
            tx.send(b, to).unwrap();
            i += 1;
            if i % 8 == 0 {
                std::thread::sleep(Duration::from_millis(1));
                tx.complete();
            }
        }
        let t0 = Instant::now();
        while tx.stats().path == "xdp" && tx.stats().completed < i as u64 && t0.elapsed() < T {
            tx.complete();
            std::thread::sleep(Duration::from_millis(1));
        }
        println!("tx-done {i} completed={}", tx.stats().completed);
    }
    let mut got = vec![false; count as usize];
    let mut n = 0;
    let mut pkts = Vec::new();
    let t0 = Instant::now();
    while n < count && t0.elapsed() < T {
        pkts.clear();
        rx.recv(&mut pkts, 64, Some(Duration::from_millis(100)))
            .unwrap();
        for p in pkts.drain(..) {
            let pl = p.payload();
            let frag = &pl.fragments()[0];
            let bytes = frag.as_slice();
            let i = check(bytes).unwrap_or_else(|| {
                panic!("a corrupt datagram: {:?}", &bytes[..bytes.len().min(16)])
            });
            let ptr = bytes.as_ptr() as usize;
            assert!(
                lot.contains(&ptr),
                "payload at {ptr:#x} is not in the lot {lot:x?}"
            );
            if !got[i as usize] {
                got[i as usize] = true;
                n += 1;
            }
            if let Some(tx) = &tx {
                tx.send(&pl).unwrap();
                println!("sent {ptr:#x} {}", bytes.len());
            }
        }
    }
    let s = rx.stats();
    println!("ok {n} path={} lent={}", s.path, s.lent);
    if let Some(tx) = &tx {
        // The sink releases as it goes: every frame comes back to the fill list.
        let t0 = Instant::now();
        loop {
            tx.collect_releases().ok();
            let mut none = Vec::new();
            let _ = rx.recv(&mut none, 1, Some(Duration::ZERO));
            drop(none);
            if rx.stats().lent == 0 || t0.elapsed() > T {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        println!("lent {}", rx.stats().lent);
    }
    // Keep the grant until the test closes our stdin (or kills us).
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

fn child_sink() {
    let group = Group::open(&std::env::var("ADC_GROUP").unwrap()).unwrap();
    let domain = group.join().unwrap();
    let count: u32 = std::env::var("ADC_COUNT").unwrap().parse().unwrap();
    println!("id {}", domain.id());
    let mut rx = domain.accept(T).unwrap();
    for _ in 0..count {
        let d = rx.recv_timeout(T).unwrap();
        let f = &d.fragments()[0];
        let span = f.lot_span().expect("a descriptor into a lot");
        assert_ne!(
            span.lot.slot,
            domain.id().slot,
            "the frame is in the sender's lot"
        );
        let b = f.as_slice();
        let i = check(b).expect("intact in place");
        println!("got {:#x} {} {i}", b.as_ptr() as usize, b.len());
    }
    println!("done");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

// ---------------------------------------------------------------- tests

/// Without a broker: the program, map and socket made here, frames from the peer
/// namespace read in place in an area of this domain's lot.
fn frames_arrive_intact_in_the_lot() {
    let net = Net::new();
    let rxns = net.rx.clone();
    let group = Group::open(&group_name("direct")).unwrap();
    let domain = group.join().unwrap();
    let path = domain.path(PathConfig::default()).unwrap();
    let geometry = Geometry {
        frame: 4096,
        ring: 256,
    };
    let area = path.area(512 * 4096).unwrap();
    let area_range = area.as_ptr() as usize..area.as_ptr() as usize + area.len();
    let (redirect, fd): (Redirect, OwnedFd) = {
        let memfd = area.lot_fd().try_clone_to_owned().unwrap();
        let off = area.lot_offset();
        Net::within(&rxns, move || {
            let ifindex = rustix::net::netdevice::name_to_index(
                rustix::net::socket(
                    rustix::net::AddressFamily::INET,
                    rustix::net::SocketType::DGRAM,
                    None,
                )
                .unwrap(),
                "adc0",
            )
            .unwrap();
            let r = Redirect::attach(ifindex, Steer::UdpPort, AttachMode::Drv).unwrap();
            let (fd, _zc) = ferry_xdp::direct::make_socket(
                ifindex,
                0,
                memfd.as_fd(),
                off,
                512 * 4096,
                geometry,
                true,
            )
            .unwrap();
            r.insert(7001, fd.as_fd()).unwrap();
            (r, fd)
        })
    };
    let mut rx = XskRx::new(fd, area, geometry).unwrap();
    let sizes = [18usize, 64, 500, 1472];
    let per = 25u32;
    for (k, &len) in sizes.iter().enumerate() {
        let _ = k;
        net.send(7001, per, len);
    }
    let mut seen = std::collections::HashSet::new();
    let mut frames = Vec::new();
    let t0 = Instant::now();
    while seen.len() < sizes.len() * per as usize && t0.elapsed() < T {
        frames.clear();
        rx.recv(&mut frames, 64, Some(Duration::from_millis(100)))
            .unwrap();
        for f in &frames {
            let s = f.fragments()[0].as_slice();
            let ptr = s.as_ptr() as usize;
            assert!(
                area_range.contains(&ptr),
                "frame at {ptr:#x} outside the area {area_range:x?}"
            );
            let pl = ferry_xdp::xsk::udp_payload(s).expect("a UDP frame");
            let i = check(&s[pl.clone()]).expect("intact payload");
            seen.insert((pl.len(), i));
        }
    }
    assert_eq!(
        seen.len(),
        sizes.len() * per as usize,
        "every datagram arrived once, intact"
    );
    drop(frames);
    // Released frames went back: receiving again puts them on the fill ring.
    let mut none = Vec::new();
    rx.recv(&mut none, 1, Some(Duration::ZERO)).unwrap();
    assert_eq!(rx.stats().lent, 0);
    // A port with no socket stays on the normal stack.
    let got = {
        let ns = net.rx.clone();
        let h = std::thread::spawn(move || {
            Net::within(&ns, || {
                let s = UdpSocket::bind("10.77.0.1:7002").unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut b = [0u8; 2048];
                s.recv(&mut b).map(|n| check(&b[..n]))
            })
        });
        std::thread::sleep(Duration::from_millis(200));
        net.send(7002, 1, 100);
        h.join().unwrap()
    };
    assert_eq!(got.ok().flatten(), Some(0), "other ports go up the stack");
    drop(redirect);
}

/// An unprivileged process (nobody) receives through the broker; it could not make a
/// socket itself.
fn unprivileged_receives_through_broker() {
    let net = Net::new();
    let broker = BrokerProc::start(&net, &policy("grant uid=65534 queues=0 ports=7100-7199"));
    let g = group_name("unpriv");
    let mut a = app(
        &net,
        Some(&broker),
        &g,
        7150,
        60,
        &[("ADC_DROP", "1".into())],
    );
    assert_eq!(a.expect("own-socket"), "refused");
    assert_eq!(a.expect("uid"), "65534");
    let p = a.expect("path");
    assert!(p.starts_with("xdp queue=0"), "{p}");
    a.expect("ready");
    net.send(7150, 60, 1000);
    let ok = a.expect("ok");
    assert!(ok.starts_with("60 path=xdp"), "{ok}");
    broker.wait_log("granted pid");
}

/// A frame received through the broker goes to a second process as a descriptor and is
/// read there in place: the same address, in the receiver's lot.
fn forwarded_frame_is_read_in_place() {
    let net = Net::new();
    let broker = BrokerProc::start(&net, &policy("grant uid=0 queues=0 ports=7200"));
    let g = group_name("fwd");
    let count = 40u32;
    let mut c = net.cmd_rx(&std::env::current_exe().unwrap());
    c.arg("--child")
        .arg("sink")
        .env("ADC_GROUP", &g)
        .env("ADC_COUNT", count.to_string());
    let mut sink = spawn(c);
    let id = sink.expect("id");
    let mut a = app(
        &net,
        Some(&broker),
        &g,
        7200,
        count,
        &[("ADC_FORWARD_TO", id)],
    );
    assert!(a.expect("path").starts_with("xdp"));
    a.expect("ready");
    net.send(7200, count, 1472);
    let mut sent = std::collections::HashSet::new();
    for _ in 0..count {
        sent.insert(a.expect("sent"));
    }
    let mut got = std::collections::HashSet::new();
    for _ in 0..count {
        let l = sink.expect("got");
        let mut w = l.split_whitespace();
        got.insert(format!("{} {}", w.next().unwrap(), w.next().unwrap()));
    }
    sink.expect("done");
    assert_eq!(
        sent, got,
        "every frame read at the address it was received at"
    );
    assert!(a.expect("ok").starts_with(&format!("{count} path=xdp")));
    assert_eq!(
        a.expect("lent"),
        "0",
        "released frames returned to the fill list"
    );
}

/// The one queue is taken: a second application is refused and falls back to UDP,
/// through the same API, and still receives; with no broker at all, too.
fn fallback_when_no_queue() {
    let net = Net::new();
    let broker = BrokerProc::start(&net, &policy("grant uid=0 queues=0 ports=7300-7399"));
    let g = group_name("fallback");
    let mut a = app(&net, Some(&broker), &g, 7301, 20, &[]);
    assert!(a.expect("path").starts_with("xdp"));
    a.expect("ready");
    let mut b = app(&net, Some(&broker), &g, 7302, 20, &[]);
    let p = b.expect("path");
    assert!(p.starts_with("udp Some(Busy)"), "{p}");
    b.expect("ready");
    let mut c = app(&net, None, &g, 7303, 20, &[]);
    let p = c.expect("path");
    assert!(p.starts_with("udp None no broker"), "{p}");
    c.expect("ready");
    net.send(7301, 20, 200);
    net.send(7302, 20, 200);
    net.send(7303, 20, 200);
    assert!(a.expect("ok").starts_with("20 path=xdp"));
    assert!(b.expect("ok").starts_with("20 path=udp"));
    assert!(c.expect("ok").starts_with("20 path=udp"));
}

/// The fallback receiving with io_uring: every datagram arrives intact in an fbuf of the
/// lot (checked in the child), through the same API.
#[cfg(feature = "uring")]
fn fallback_with_io_uring() {
    let net = Net::new();
    let g = group_name("uring");
    let mut c = app(
        &net,
        None,
        &g,
        7304,
        50,
        &[("ADC_FALLBACK", "uring".into())],
    );
    let p = c.expect("path");
    assert!(p.starts_with("udp None no broker"), "{p}");
    c.expect("ready");
    net.send(7304, 50, 1000);
    let ok = c.expect("ok");
    assert!(ok.starts_with("50 path=uring"), "{ok}");
}

/// kill -9 of the application: the broker revokes (the port's traffic returns to the
/// normal stack), holds no more descriptors than before, and grants the queue again.
fn kill9_returns_the_queue() {
    let net = Net::new();
    let broker = BrokerProc::start(&net, &policy("grant uid=0 queues=0 ports=7400"));
    std::thread::sleep(Duration::from_millis(100));
    let before = broker.fds();
    let g = group_name("kill");
    let mut a = app(&net, Some(&broker), &g, 7400, 10, &[]);
    assert!(a.expect("path").starts_with("xdp"));
    a.expect("ready");
    net.send(7400, 10, 300);
    assert!(a.expect("ok").starts_with("10 path=xdp"));
    // While granted, a normal socket on the port hears nothing.
    let quiet = udp_hears(&net, 7400, 3);
    assert_eq!(quiet, None, "the port is steered to the application");
    let pid = a.pid();
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    );
    let _ = a.child.wait();
    broker.wait_log("revoked pid");
    assert_eq!(
        udp_hears(&net, 7400, 3),
        Some(0),
        "the port is back on the normal stack"
    );
    let t0 = Instant::now();
    while broker.fds() != before && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        broker.fds(),
        before,
        "the broker holds nothing of the dead application"
    );
    let mut b = app(&net, Some(&broker), &g, 7400, 5, &[]);
    let p = b.expect("path");
    assert!(p.starts_with("xdp queue=0"), "the queue is free again: {p}");
    b.expect("ready");
    net.send(7400, 5, 300);
    assert!(b.expect("ok").starts_with("5 path=xdp"));
}

/// A UDP socket on `port` in the tx namespace, bound before this returns: the numbers of
/// the intact datagrams it hears until `want` distinct ones came or it heard nothing for
/// 3 s; any corrupt one fails the test.
fn tx_listener(net: &Net, port: u16, want: usize) -> std::thread::JoinHandle<Vec<u32>> {
    let ns = net.tx.clone();
    let (tx, rxc) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        Net::within(&ns, move || {
            let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 2), port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            tx.send(()).unwrap();
            let mut seen = std::collections::BTreeSet::new();
            let mut b = [0u8; 2048];
            while seen.len() < want {
                let Ok(k) = s.recv(&mut b) else { break };
                let i = check(&b[..k])
                    .unwrap_or_else(|| panic!("a corrupt datagram: {:?}", &b[..k.min(16)]));
                seen.insert(i);
            }
            seen.into_iter().collect()
        })
    });
    rxc.recv().unwrap();
    h
}

/// Datagrams written in place in the lot and sent (through the AF_XDP socket the broker
/// granted, and on the UDP fallback) arrive intact at a UDP socket on the other side.
fn tx_from_the_lot_arrives_intact() {
    let net = Net::new();
    let broker = BrokerProc::start(&net, &policy("grant uid=0 queues=0 ports=7600"));
    let g = group_name("tx");
    let count = 100u32;
    for (port, with_broker, path) in [(7610u16, true, "xdp"), (7611, false, "udp")] {
        let l = tx_listener(&net, port, count as usize);
        let mut a = app(
            &net,
            with_broker.then_some(&broker),
            &g,
            7600,
            0,
            &[("ADC_TX", format!("{count} 700 {port}"))],
        );
        assert!(a.expect("path").starts_with(path));
        assert_eq!(a.expect("tx-path"), path);
        let done = a.expect("tx-done");
        if path == "xdp" {
            assert_eq!(
                done,
                format!("{count} completed={count}"),
                "every frame back"
            );
        }
        let got = l.join().unwrap();
        assert_eq!(
            got,
            (0..count).collect::<Vec<_>>(),
            "{path}: every datagram, intact"
        );
    }
}

/// kill -9 of an application while it sends from the lot: the broker revokes, holds no
/// more descriptors than before, and the queue is granted again to a sender whose
/// datagrams arrive intact.
fn kill9_mid_send_leaks_nothing() {
    let net = Net::new();
    let broker = BrokerProc::start(&net, &policy("grant uid=0 queues=0 ports=7700"));
    std::thread::sleep(Duration::from_millis(100));
    let before = broker.fds();
    let g = group_name("txkill");
    let l = tx_listener(&net, 7710, 30);
    let mut a = app(
        &net,
        Some(&broker),
        &g,
        7700,
        0,
        &[("ADC_TX", "0 300 7710".into())],
    );
    assert_eq!(a.expect("tx-path"), "xdp");
    assert!(l.join().unwrap().len() >= 30, "the sender is sending");
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(a.pid() as i32).unwrap(),
        rustix::process::Signal::KILL,
    );
    let _ = a.child.wait();
    broker.wait_log("revoked pid");
    let t0 = Instant::now();
    while broker.fds() != before && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        broker.fds(),
        before,
        "the broker holds nothing of the dead sender"
    );
    let l = tx_listener(&net, 7711, 40);
    let mut b = app(
        &net,
        Some(&broker),
        &g,
        7700,
        0,
        &[("ADC_TX", "40 300 7711".into())],
    );
    let p = b.expect("path");
    assert!(p.starts_with("xdp queue=0"), "the queue is free again: {p}");
    assert_eq!(b.expect("tx-done"), "40 completed=40");
    assert_eq!(l.join().unwrap(), (0..40).collect::<Vec<_>>());
}

/// A normal UDP socket on `port` in the rx namespace: the number of the first datagram
/// it hears while `n` are sent, or `None`.
fn udp_hears(net: &Net, port: u16, n: u32) -> Option<u32> {
    let ns = net.rx.clone();
    let (tx, rxc) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        Net::within(&ns, move || {
            let s = UdpSocket::bind(SocketAddrV4::new(RX_IP, port)).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(1500)))
                .unwrap();
            tx.send(()).unwrap();
            let mut b = [0u8; 2048];
            s.recv(&mut b).ok().and_then(|k| check(&b[..k]))
        })
    });
    rxc.recv().unwrap();
    net.send(port, n, 100);
    h.join().unwrap()
}

/// Malformed requests are refused with a reason; a silent connection does not stall the
/// broker; a good request still succeeds afterwards.
fn malformed_requests_refused() {
    let net = Net::new();
    let broker = BrokerProc::start(&net, &policy("grant uid=0 queues=0 ports=7500"));
    let group = Group::open(&group_name("malformed")).unwrap();
    let domain = group.join().unwrap();
    let path = domain.path(PathConfig::default()).unwrap();
    let area = path.area(64 * 4096).unwrap();
    let good = Request {
        queue: Some(0),
        port: 7500,
        frame: 4096,
        ring: 64,
        offset: area.lot_offset(),
        len: 64 * 4096,
        interface: "adc0".into(),
    };
    // A silent connection, held open throughout.
    let silent = connect(&broker.socket);
    let raw = |bytes: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]| -> Reply {
        let c = connect(&broker.socket);
        send_with(&c, bytes, fds);
        recv_reply(&c)
    };
    let lotfd = area.lot_fd();
    let (p0, p1) = rustix::pipe::pipe().unwrap();
    let mut cases: Vec<(&str, Reply)> = Vec::new();
    cases.push(("short", raw(&good.encode()[..20], &[lotfd])));
    let mut m = good.encode();
    m[0] ^= 0xff;
    cases.push(("magic", raw(&m, &[lotfd])));
    let mut m = good.encode();
    m[4] = 9;
    cases.push(("version", raw(&m, &[lotfd])));
    cases.push(("no fd", raw(&good.encode(), &[])));
    cases.push(("two fds", raw(&good.encode(), &[lotfd, lotfd])));
    cases.push(("a pipe", raw(&good.encode(), &[p0.as_fd()])));
    let bad = |f: &dyn Fn(&mut Request)| {
        let mut r = good.clone();
        f(&mut r);
        r.encode()
    };
    cases.push(("beyond", raw(&bad(&|r| r.offset = 1 << 40), &[lotfd])));
    cases.push(("ring", raw(&bad(&|r| r.ring = 100), &[lotfd])));
    cases.push(("frame", raw(&bad(&|r| r.frame = 1000), &[lotfd])));
    cases.push(("unaligned", raw(&bad(&|r| r.offset += 1), &[lotfd])));
    cases.push(("zero", raw(&bad(&|r| r.len = 0), &[lotfd])));
    cases.push(("garbage", raw(&[0xa5; 300], &[])));
    for (what, r) in &cases {
        assert_eq!(r.status, Status::Malformed, "{what}: {r:?}");
        assert!(!r.message.is_empty(), "{what}: a reason");
    }
    let too_big = raw(&bad(&|r| r.len = 64 << 20), &[lotfd]);
    assert_eq!(too_big.status, Status::Policy, "{too_big:?}");
    let other_if = raw(&bad(&|r| r.interface = "lo".into()), &[lotfd]);
    assert_eq!(other_if.status, Status::Policy);
    let wrong_port = raw(&bad(&|r| r.port = 7501), &[lotfd]);
    assert_eq!(wrong_port.status, Status::Policy);
    // Still serving, with the silent connection open: a good request is granted.
    let t0 = Instant::now();
    let (reply, got) =
        ferry_xdp::ask(&broker.socket, &good, lotfd, Duration::from_secs(10)).unwrap();
    assert_eq!(reply.status, Status::Ok, "{reply:?}");
    assert!(t0.elapsed() < ferry_xdp::broker::REQUEST_TIMEOUT);
    assert!(got.is_some());
    drop((p0, p1, silent));
    let mut broker = broker;
    assert!(broker.alive());
}

fn connect(p: &Path) -> OwnedFd {
    let c = rustix::net::socket(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        None,
    )
    .unwrap();
    rustix::net::connect(&c, &rustix::net::SocketAddrUnix::new(p).unwrap()).unwrap();
    c
}

fn send_with(c: &OwnedFd, bytes: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    rustix::net::sendmsg(
        c,
        &[std::io::IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .unwrap();
}

fn recv_reply(c: &OwnedFd) -> Reply {
    let mut fds = [rustix::event::PollFd::new(c, rustix::event::PollFlags::IN)];
    let ts = rustix::time::Timespec {
        tv_sec: 10,
        tv_nsec: 0,
    };
    assert_eq!(
        rustix::event::poll(&mut fds, Some(&ts)).unwrap(),
        1,
        "a reply in time"
    );
    let mut b = [0u8; 512];
    let n = rustix::net::recv(c, &mut b, rustix::net::RecvFlags::empty())
        .unwrap()
        .0;
    Reply::decode(&b[..n]).unwrap()
}

// ---------------------------------------------------------------- main

/// Deletes every namespace this process made (after a hang, when no destructor runs).
fn cleanup_namespaces() {
    testnet::cleanup(&format!("ferryadc-{}-", std::process::id()));
}

/// The groups' control files outlive children that were killed: removes this run's.
fn remove_group_files() {
    let suffix = format!("-{}", std::process::id());
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("ferry.adctest-") && n.ends_with(&suffix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        match args[2].as_str() {
            "app" => child_app(),
            "sink" => child_sink(),
            r => panic!("unknown role {r}"),
        }
        return;
    }
    if let Some(why) = testnet::unavailable() {
        println!("SKIP adc: {why}");
        return;
    }
    let tests: &[(&str, fn())] = &[
        (
            "frames_arrive_intact_in_the_lot",
            frames_arrive_intact_in_the_lot,
        ),
        (
            "unprivileged_receives_through_broker",
            unprivileged_receives_through_broker,
        ),
        (
            "forwarded_frame_is_read_in_place",
            forwarded_frame_is_read_in_place,
        ),
        ("fallback_when_no_queue", fallback_when_no_queue),
        #[cfg(feature = "uring")]
        ("fallback_with_io_uring", fallback_with_io_uring),
        ("kill9_returns_the_queue", kill9_returns_the_queue),
        (
            "tx_from_the_lot_arrives_intact",
            tx_from_the_lot_arrives_intact,
        ),
        ("kill9_mid_send_leaks_nothing", kill9_mid_send_leaks_nothing),
        ("malformed_requests_refused", malformed_requests_refused),
    ];
    let filter: Vec<String> = args[1..]
        .iter()
        .filter(|a| !a.starts_with('-'))
        .cloned()
        .collect();
    // A test that hangs fails, and its namespaces go all the same.
    let current = std::sync::Arc::new(std::sync::Mutex::new((String::new(), Instant::now())));
    {
        let current = current.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            let (name, since) = current.lock().unwrap().clone();
            if !name.is_empty() && since.elapsed() > Duration::from_secs(120) {
                println!("test {name} ... FAILED (hung for 120 s)");
                cleanup_namespaces();
                remove_group_files();
                std::process::exit(1);
            }
        });
    }
    let mut failed = 0;
    for (name, f) in tests {
        *current.lock().unwrap() = (name.to_string(), Instant::now());
        if !filter.is_empty() && !filter.iter().any(|p| name.contains(p.as_str())) {
            continue;
        }
        let t0 = Instant::now();
        match std::panic::catch_unwind(f) {
            Ok(()) => println!("test {name} ... ok ({:.1} s)", t0.elapsed().as_secs_f64()),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    remove_group_files();
    std::io::stdout().flush().unwrap();
    if failed > 0 {
        std::process::exit(1);
    }
}
