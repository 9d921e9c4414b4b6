//! Two hosts bridged by `ferry-bridge` over zenoh, with real processes.
//!
//! Each "host" is a network namespace, the two joined by a veth pair that the test makes
//! (root and `ip netns` needed; otherwise both bridges run on loopback, and the test says
//! so). A ferry group is a file in /dev/shm, which every namespace of one machine
//! shares, so the two hosts are also two different groups (A and B) whose bridges share
//! one scope: exactly what two machines running a group of the same name look like.
//! The bridges listen and connect on explicit addresses with multicast scouting off, so
//! concurrent runs do not see each other.
//!
//! Publishers, subscribers, servers and clients are this test binary re-executed in a
//! role (`harness = false`); each checks every byte it receives.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// The same runner as the core crate's re-executing tests (`harness = false`).
#[path = "../../ferry/tests/runner/mod.rs"]
mod runner;

use ferry::{
    Client, Error, Group, IoData, Origin, Publisher, Server, ServiceConfig, ServiceInfo,
    SlowSubscriber, Subscriber,
};

/// Long enough for set-up steps on a loaded machine; a hang shows as a failure after it.
const T: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------- payloads

/// Byte `j` of message `seq`.
fn byte(seq: u64, j: usize) -> u8 {
    (seq.wrapping_mul(131) as usize ^ j.wrapping_mul(7) ^ (j >> 9)) as u8
}

fn pattern(seq: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| byte(seq, j)).collect()
}

/// `size*count,...` as one (seq, size) per message, seq from 0.
fn expand(spec: &str) -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    for part in spec.split(',') {
        let (size, count) = part.split_once('*').unwrap();
        for _ in 0..count.parse::<usize>().unwrap() {
            out.push((out.len() as u64, size.parse().unwrap()));
        }
    }
    out
}

/// A stream message: its sequence number, then the pattern.
const STREAM_LEN: usize = 1024;

fn stream_message(seq: u64) -> Vec<u8> {
    let mut m = pattern(seq, STREAM_LEN);
    m[..8].copy_from_slice(&seq.to_le_bytes());
    m
}

fn check_stream(d: &IoData) -> u64 {
    assert_eq!(d.len(), STREAM_LEN, "stream message of the wrong size");
    let v = d.to_vec();
    let seq = u64::from_le_bytes(v[..8].try_into().unwrap());
    assert_eq!(v, stream_message(seq), "stream message {seq} damaged");
    seq
}

// ---------------------------------------------------------------- child roles

fn stdin_lines() -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines() {
            let Ok(l) = l else { break };
            if tx.send(l.trim().to_owned()).is_err() {
                break;
            }
        }
    });
    rx
}

fn child_main(role: &str) {
    let group = Group::open(&std::env::var("FZ_GROUP").unwrap()).unwrap();
    let domain = group.join().unwrap();
    let arg = std::env::var("FZ_ARG").unwrap();
    let parts: Vec<&str> = arg.split('|').collect();
    let stdin = stdin_lines();
    let end = |e: Error| {
        println!(
            "end {}",
            format!("{e:?}").split([' ', '{', '(']).next().unwrap()
        );
    };
    match role {
        // name|policy|spec: publish the spec's messages (or a stream) once told "go".
        "pub" => {
            let slow = match parts[1] {
                "block" => SlowSubscriber::Block,
                _ => SlowSubscriber::Drop,
            };
            let config = ServiceConfig {
                depth: 8,
                slow,
                ..ServiceConfig::default()
            };
            let mut p = Publisher::offer(&domain, parts[0], config).unwrap();
            println!("offered");
            if parts[2] == "stream" {
                for seq in 0.. {
                    let mut m = p.loan(STREAM_LEN).unwrap();
                    m.as_mut_slice().copy_from_slice(&stream_message(seq));
                    m.send().unwrap();
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            assert_eq!(stdin.recv().unwrap(), "go");
            for (seq, size) in expand(parts[2]) {
                let mut m = p.loan(size).unwrap();
                m.as_mut_slice().copy_from_slice(&pattern(seq, size));
                m.send().unwrap();
            }
            println!("done");
            let _ = stdin.recv();
        }
        // name|spec|open-timeout-s: receive the spec's messages (or a stream) and check
        // every byte; print how it ended.
        "sub" => {
            let open = Duration::from_secs(parts[2].parse().unwrap());
            let mut sub = match Subscriber::open(&domain, parts[0], open) {
                Ok(s) => s,
                Err(e) => return end(e),
            };
            println!("joined");
            if parts[1] == "stream" {
                let mut n = 0u64;
                let mut last = None;
                loop {
                    match sub.recv_timeout(T) {
                        Ok(d) => {
                            let seq = check_stream(&d);
                            assert!(last.map_or(true, |l| seq > l), "reordered");
                            last = Some(seq);
                            n += 1;
                            if n == 1 || n % 50 == 0 {
                                println!("got {n}");
                            }
                        }
                        Err(e) => return end(e),
                    }
                }
            }
            let want = expand(parts[1]);
            let mut bytes = 0usize;
            for &(seq, size) in &want {
                let d = match sub.recv_timeout(T) {
                    Ok(d) => d,
                    Err(e) => return end(e),
                };
                if d.len() != size || !d.eq_bytes(&pattern(seq, size)) {
                    println!("bad message {seq}: {} bytes, want {size}", d.len());
                    return;
                }
                bytes += size;
            }
            println!("ok {} {bytes}", want.len());
            let _ = stdin.recv();
        }
        // name: answer each request with its bytes reversed; "fail..." fails (status 7).
        "server" => {
            let mut s = Server::offer(&domain, parts[0], ServiceConfig::default()).unwrap();
            println!("offered");
            loop {
                match stdin.try_recv() {
                    Ok(_) | Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
                    Err(std::sync::mpsc::TryRecvError::Empty) => {}
                }
                let req = match s.recv_timeout(Duration::from_millis(100)) {
                    Ok(r) => r,
                    Err(Error::Timeout) => continue,
                    Err(e) => panic!("{e}"),
                };
                let mut v = req.data.to_vec();
                if v.starts_with(b"fail") {
                    s.fail(&req, 7).unwrap();
                    continue;
                }
                v.reverse();
                let mut m = s.path().alloc(v.len()).unwrap();
                m.write_at(0, &v);
                s.reply(&req, &m.freeze()).unwrap();
            }
        }
        // name|n: n calls of several sizes, each answer checked, then a failing one.
        "client" => {
            let mut c = Client::open(&domain, parts[0], T).unwrap();
            println!("joined");
            let n: u64 = parts[1].parse().unwrap();
            let sizes = [1usize, 100, 65536, 1 << 20, 8 << 20];
            for k in 0..n {
                let size = sizes[k as usize % sizes.len()];
                let req = IoData::from_vec(pattern(k + 1000, size));
                let got = c.call(&req, T).unwrap();
                let mut want = pattern(k + 1000, size);
                want.reverse();
                assert!(got.eq_bytes(&want), "answer {k} of {size} bytes damaged");
            }
            match c.call(&IoData::from_vec(b"fail please".to_vec()), T) {
                Err(Error::RequestFailed { status: 7 }) => {}
                other => panic!("a failing call gave {other:?}"),
            }
            println!("ok {n}");
        }
        other => panic!("unknown role {other}"),
    }
}

// ---------------------------------------------------------------- processes

/// A child process whose stdout lines arrive on a channel (and are echoed to stderr).
struct Proc {
    child: Child,
    lines: Receiver<String>,
    seen: Arc<Mutex<Vec<String>>>,
    what: String,
}

impl Proc {
    fn start(mut cmd: Command, what: &str) -> Proc {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, w) = (seen.clone(), what.to_owned());
        std::thread::spawn(move || {
            for l in out.lines() {
                let Ok(l) = l else { break };
                eprintln!("    [{w}] {l}");
                s.lock().unwrap().push(l.clone());
                if tx.send(l).is_err() {
                    // Nobody waits for lines any more; keep draining so the child never
                    // blocks on a full pipe.
                }
            }
        });
        Proc {
            child,
            lines,
            seen,
            what: what.to_owned(),
        }
    }

    fn role(role: &str, group: &str, arg: &str) -> Proc {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.env("FZ_ROLE", role)
            .env("FZ_GROUP", group)
            .env("FZ_ARG", arg);
        Proc::start(cmd, &format!("{role} {arg}"))
    }

    /// The next line starting with `prefix` (or, for a bridge's lines, whose message
    /// does), waiting at most `within`.
    fn expect(&mut self, prefix: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) || l.contains(&format!("]: {prefix}")) => return l,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{}: no line {prefix:?} within {within:?}", self.what)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("{}: ended before printing {prefix:?}", self.what)
                }
            }
        }
    }

    fn saw(&self, needle: &str) -> bool {
        self.seen.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    fn tell(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        let _ = writeln!(stdin, "{line}");
        let _ = stdin.flush();
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our child's,
        // not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        self.child.wait().unwrap();
    }

    /// Waits for the child to exit on its own, at most `within`; its exit status.
    fn wait(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                self.kill9();
                panic!("{} did not exit within {within:?}", self.what);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, as Ctrl-C would: the bridge must end cleanly and promptly.
    fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        let s = self.wait(Duration::from_secs(30));
        assert!(s.success(), "{} ended with {s} after SIGTERM", self.what);
    }

    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------- the two hosts

/// Two hosts: their group names, the bridges' scope and endpoints, and their network
/// namespaces if the test could make them.
struct Hosts {
    a: String,
    b: String,
    scope: String,
    ns: Option<(String, String)>,
    a_listen: String,
    b_connect: String,
}

fn run_ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn make_namespaces(a: &str, b: &str) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    run_ip(&["netns", "add", a])?;
    run_ip(&["netns", "add", b])?;
    run_ip(&["link", "add", a, "type", "veth", "peer", "name", b])?;
    for (ns, addr) in [(a, "10.99.0.1/24"), (b, "10.99.0.2/24")] {
        run_ip(&["link", "set", ns, "netns", ns])?;
        run_ip(&["-n", ns, "addr", "add", addr, "dev", ns])?;
        run_ip(&["-n", ns, "link", "set", ns, "up"])?;
        run_ip(&["-n", ns, "link", "set", "lo", "up"])?;
    }
    Ok(())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Hosts {
    fn new(tag: &str) -> Hosts {
        let id = format!("{}{tag}", std::process::id());
        let (na, nb) = (format!("fz{id}a"), format!("fz{id}b"));
        let ns = match make_namespaces(&na, &nb) {
            Ok(()) => Some((na, nb)),
            Err(why) => {
                let _ = run_ip(&["netns", "del", &na]);
                let _ = run_ip(&["netns", "del", &nb]);
                eprintln!("    note: no network namespaces ({why}): both bridges on loopback");
                None
            }
        };
        let (a_listen, b_connect) = if ns.is_some() {
            (
                "tcp/10.99.0.1:7447".to_owned(),
                "tcp/10.99.0.1:7447".to_owned(),
            )
        } else {
            let p = free_port();
            (format!("tcp/127.0.0.1:{p}"), format!("tcp/127.0.0.1:{p}"))
        };
        Hosts {
            a: format!("fzA-{id}"),
            b: format!("fzB-{id}"),
            scope: format!("fz{id}"),
            ns,
            a_listen,
            b_connect,
        }
    }

    /// Starts host `h`'s bridge (A listens, B connects), with `extra` flags.
    fn bridge(&self, h: char, extra: &[&str]) -> Proc {
        self.bridge_on(h, None, extra)
    }

    /// As [`Hosts::bridge`], the bridge's process limited to `cpus` (a `taskset -c`
    /// list) if given.
    fn bridge_on(&self, h: char, cpus: Option<&str>, extra: &[&str]) -> Proc {
        let bin = env!("CARGO_BIN_EXE_ferry-bridge");
        let (group, ns, ep) = match h {
            'A' => (
                &self.a,
                self.ns.as_ref().map(|n| &n.0),
                ["--listen", &self.a_listen],
            ),
            _ => (
                &self.b,
                self.ns.as_ref().map(|n| &n.1),
                ["--connect", &self.b_connect],
            ),
        };
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]);
                c
            }
            None => Command::new("env"),
        };
        if let Some(cpus) = cpus {
            cmd.args(["taskset", "-c", cpus]);
        }
        cmd.arg(bin);
        cmd.args(["--group", group, "--scope", &self.scope])
            .args(ep)
            .args(extra);
        let p = Proc::start(cmd, &format!("bridge {h}"));
        p
    }

    /// The group of host `h`.
    fn group(&self, h: char) -> &str {
        if h == 'A' {
            &self.a
        } else {
            &self.b
        }
    }

    /// Once every process of the test has ended, neither group may leave a file in
    /// /dev/shm.
    fn assert_no_leftovers(&self) {
        for g in [&self.a, &self.b] {
            let f = format!("/dev/shm/ferry.{g}");
            let gone = (0..250).any(|_| {
                std::thread::sleep(Duration::from_millis(20));
                !std::path::Path::new(&f).exists()
            });
            assert!(gone, "{f} left behind");
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // A test that failed killed its processes (their `Proc`s dropped first): their
        // groups' files have no live member left and go.
        if std::thread::panicking() {
            for g in [&self.a, &self.b] {
                let _ = Group::clean(g);
            }
        }
        if let Some((a, b)) = &self.ns {
            let _ = run_ip(&["netns", "del", a]);
            let _ = run_ip(&["netns", "del", b]);
        }
    }
}

// ---------------------------------------------------------------- tests

/// Two services published on A, each with a subscriber on A and one on B; every message
/// (1 B to 64 MiB) arrives byte-identical and in order on both hosts; both bridges stop
/// cleanly on SIGTERM and nothing is left in /dev/shm.
fn pubsub_reaches_both_hosts_byte_identical() {
    let h = Hosts::new("p");
    let mut ba = h.bridge('A', &[]);
    let mut bb = h.bridge('B', &[]);
    let services = [
        (
            "cam/front",
            "1*2,7*2,64*2,4096*3,65536*3,1048576*3,16777216*2,67108864*1",
        ),
        ("imu", "64*300,1000*100"),
    ];
    let mut pubs = Vec::new();
    let mut subs = Vec::new();
    for (name, spec) in services {
        let mut p = Proc::role("pub", h.group('A'), &format!("{name}|block|{spec}"));
        p.expect("offered", T);
        pubs.push(p);
        for host in ['A', 'B'] {
            let mut s = Proc::role("sub", h.group(host), &format!("{name}|{spec}|60"));
            s.expect("joined", T);
            subs.push(s);
        }
    }
    for p in &mut pubs {
        p.tell("go");
    }
    for (i, s) in subs.iter_mut().enumerate() {
        let (_, spec) = services[i / 2];
        let want = expand(spec);
        let bytes: usize = want.iter().map(|w| w.1).sum();
        assert_eq!(
            s.expect("", Duration::from_secs(180)),
            format!("ok {} {bytes}", want.len()),
            "subscriber {i}"
        );
    }
    for p in &mut pubs {
        p.expect("done", T);
    }
    // As the bridge decides: its affinity and its cgroup's quota.
    if std::thread::available_parallelism().is_ok_and(|n| n.get() > 1) {
        assert!(
            ba.saw("exporting cam/front (ps-block-") && ba.saw("B in chunks)"),
            "A's bridge, free to use several CPUs, did not chunk"
        );
    }
    drop((pubs, subs));
    ba.stop();
    bb.stop();
    h.assert_no_leftovers();
}

/// An exporting bridge that may use one CPU only sends a blocking service's large
/// messages whole, not in chunks (its chunk puts and the far side's receiving would take
/// turns on that CPU), and says so; the far bridge takes them whole, and every message
/// arrives byte-identical and in order.
fn one_cpu_bridge_sends_large_messages_whole() {
    if Command::new("taskset").arg("-V").output().is_err() {
        eprintln!("    SKIP: no taskset to limit the bridge to one CPU");
        return;
    }
    let h = Hosts::new("1");
    let cpu = ferry_measure::sys::allowed_cpus()[0].to_string();
    let mut ba = h.bridge_on('A', Some(&cpu), &[]);
    let mut bb = h.bridge('B', &[]);
    let spec = "64*2,65536*2,1048576*4,4194304*2";
    let mut p = Proc::role("pub", h.group('A'), &format!("cam/one|block|{spec}"));
    p.expect("offered", T);
    let mut s = Proc::role("sub", h.group('B'), &format!("cam/one|{spec}|60"));
    s.expect("joined", T);
    p.tell("go");
    let want = expand(spec);
    let bytes: usize = want.iter().map(|w| w.1).sum();
    assert_eq!(
        s.expect("", Duration::from_secs(180)),
        format!("ok {} {bytes}", want.len())
    );
    p.expect("done", T);
    assert!(
        ba.saw("exporting cam/one (ps-block-") && ba.saw("large messages whole: one CPU)"),
        "A's bridge, limited to one CPU, did not send large messages whole"
    );
    drop((p, s));
    ba.stop();
    bb.stop();
    h.assert_no_leftovers();
}

/// A server on A answers a client on B (several sizes, up to 8 MiB); a failing request's
/// status arrives as it would locally.
fn request_response_a_to_b() {
    let h = Hosts::new("r");
    let mut ba = h.bridge('A', &[]);
    let mut bb = h.bridge('B', &[]);
    let mut srv = Proc::role("server", h.group('A'), "calc");
    srv.expect("offered", T);
    let mut cli = Proc::role("client", h.group('B'), "calc|10");
    cli.expect("joined", T);
    cli.expect("ok 10", T);
    srv.tell("exit");
    srv.wait(T);
    drop(cli);
    ba.stop();
    bb.stop();
    h.assert_no_leftovers();
}

/// A publisher SIGKILLed mid-stream: the subscriber on B sees an end (an error, not a
/// hang), as the one on A does; a new publisher of the same name reaches a new
/// subscriber on B; the bridges' descriptors do not grow from one round to the next.
fn publisher_killed_midstream() {
    let h = Hosts::new("k");
    let mut ba = h.bridge('A', &[]);
    let mut bb = h.bridge('B', &[]);
    let mut fds = Vec::new();
    for round in 0..3 {
        let mut p = Proc::role("pub", h.group('A'), "tel|drop|stream");
        p.expect("offered", T);
        let mut sa = Proc::role("sub", h.group('A'), "tel|stream|60");
        let mut sb = Proc::role("sub", h.group('B'), "tel|stream|60");
        sa.expect("got 50", T);
        sb.expect("got 50", T);
        p.kill9();
        let ea = sa.expect("end", T);
        let eb = sb.expect("end", T);
        for e in [&ea, &eb] {
            assert!(
                e == "end PeerGone" || e == "end Disconnected",
                "round {round}: {e}"
            );
        }
        sa.wait(T);
        sb.wait(T);
        // The bridges notice the end before the subscribers do; let them settle.
        let settled = |b: &Proc| {
            let n = b
                .seen
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains("tel: "))
                .count();
            n
        };
        assert!(
            (0..500).any(|_| {
                std::thread::sleep(Duration::from_millis(20));
                settled(&ba) > round && settled(&bb) > round
            }),
            "round {round}: the bridges did not report the end"
        );
        std::thread::sleep(Duration::from_millis(300));
        fds.push((ba.fds(), bb.fds()));
    }
    eprintln!("    bridge descriptors after each round (A, B): {fds:?}");
    assert!(
        fds[2].0 <= fds[1].0 && fds[2].1 <= fds[1].1,
        "the bridges' descriptors grew: {fds:?}"
    );
    ba.stop();
    bb.stop();
    h.assert_no_leftovers();
}

/// A bridge SIGKILLed mid-stream, first A's then B's: the subscriber on B sees an end,
/// A's local subscriber keeps receiving throughout, B's bridge reports that it cannot
/// reach A and retries, and a restarted bridge resumes delivery to a new subscriber.
fn bridge_killed_midstream_and_restarted() {
    let h = Hosts::new("b");
    let mut ba = h.bridge('A', &[]);
    let mut bb = h.bridge('B', &[]);
    let mut p = Proc::role("pub", h.group('A'), "tel|drop|stream");
    p.expect("offered", T);
    let mut sa = Proc::role("sub", h.group('A'), "tel|stream|60");
    sa.expect("got 50", T);

    // A's bridge dies.
    let mut sb = Proc::role("sub", h.group('B'), "tel|stream|60");
    sb.expect("got 50", T);
    ba.kill9();
    let e = sb.expect("end", T);
    assert!(e == "end Disconnected" || e == "end PeerGone", "{e}");
    sb.wait(T);
    bb.expect("no peer reachable", T);
    sa.expect("got", T);
    sa.expect("got", T);
    ba = h.bridge('A', &[]);
    let mut sb = Proc::role("sub", h.group('B'), "tel|stream|60");
    sb.expect("got 50", T);

    // B's bridge dies: B's subscriber loses its publisher (the bridge's domain).
    bb.kill9();
    let e = sb.expect("end", T);
    assert!(e == "end PeerGone" || e == "end Disconnected", "{e}");
    sb.wait(T);
    sa.expect("got", T);
    sa.expect("got", T);
    bb = h.bridge('B', &[]);
    let mut sb = Proc::role("sub", h.group('B'), "tel|stream|60");
    sb.expect("got 50", T);

    p.kill9();
    sa.expect("end", T);
    sb.expect("end", T);
    drop((sa, sb));
    ba.stop();
    bb.stop();
    h.assert_no_leftovers();
}

/// A's bridge denies `secret/*`: `open/x` arrives on B, `secret/x` never does (B's
/// subscriber finds no such service), and neither bridge carries it.
fn denied_service_never_arrives() {
    let h = Hosts::new("d");
    let mut ba = h.bridge('A', &["--deny", "secret/*"]);
    let mut bb = h.bridge('B', &[]);
    let mut po = Proc::role("pub", h.group('A'), "open/x|drop|stream");
    let mut ps = Proc::role("pub", h.group('A'), "secret/x|drop|stream");
    po.expect("offered", T);
    ps.expect("offered", T);
    let mut local = Proc::role("sub", h.group('A'), "secret/x|stream|60");
    local.expect("got 50", T);
    let mut so = Proc::role("sub", h.group('B'), "open/x|stream|60");
    so.expect("got 50", T);
    let mut ss = Proc::role("sub", h.group('B'), "secret/x|stream|5");
    assert_eq!(ss.expect("", T), "end NoSuchService");
    assert!(
        !ba.saw("exporting secret/x"),
        "A's bridge exported a denied service"
    );
    assert!(
        !bb.saw("importing secret/x"),
        "B's bridge imported a denied service"
    );
    po.kill9();
    ps.kill9();
    drop((local, so, ss));
    ba.stop();
    bb.stop();
    h.assert_no_leftovers();
}

/// A's bridge subscribes to A's publisher only while a far bridge imports the service:
/// with no other bridge it exports the service (token, configuration) without
/// subscribing, so the publisher stores to and wakes no queue of its; B's import makes
/// it subscribe; once B's bridge is gone (killed, or stopped) it leaves again.
fn bridge_subscribes_only_for_far_subscribers() {
    let h = Hosts::new("m");
    let group = Group::open(h.group('A')).unwrap();
    let domain = group.join().unwrap();
    let mut p = Publisher::offer(&domain, "lazy/x", ServiceConfig::default()).unwrap();
    let mut ba = h.bridge('A', &[]);
    ba.expect("exporting lazy/x", T);
    // Several of the bridge's scans later, still no subscriber.
    std::thread::sleep(Duration::from_millis(500));
    p.collect_releases();
    assert_eq!(
        p.subscriber_count(),
        0,
        "A's bridge subscribed with no far bridge importing the service"
    );
    let mut bb = h.bridge('B', &[]);
    bb.expect("importing lazy/x", T);
    p.wait_for_subscribers(1, T)
        .expect("A's bridge never subscribed for B's import");
    let left = |p: &mut Publisher| {
        (0..1500).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            p.collect_releases();
            p.subscriber_count() == 0
        })
    };
    bb.kill9();
    assert!(
        left(&mut p),
        "A's bridge stayed subscribed after B's bridge died"
    );
    // A restarted B subscribes it again; B stopping cleanly lets it go again.
    let mut bb = h.bridge('B', &[]);
    bb.expect("importing lazy/x", T);
    p.wait_for_subscribers(1, T)
        .expect("A's bridge never subscribed for the restarted B");
    bb.stop();
    assert!(
        left(&mut p),
        "A's bridge stayed subscribed after B's bridge stopped"
    );
    drop((p, domain, group));
    ba.stop();
    h.assert_no_leftovers();
}

/// The bridge's zid, from its first line (`scope S zid Z host H ...`).
fn bridge_zid(b: &mut Proc) -> String {
    let l = b.expect("scope", T);
    let words: Vec<&str> = l.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "zid").unwrap();
    words[at + 1].to_owned()
}

/// Group `g`'s services as `ferry stat` reads them: through a read-only view, not as a
/// member.
fn inspected(g: &str) -> Vec<ServiceInfo> {
    match Group::inspect(g).state {
        ferry::stats::GroupFileState::Live(v) => v.services(),
        _ => Vec::new(),
    }
}

/// `ferry stat GROUP`'s output, if the `ferry` binary (ferry-cli) was built beside
/// `ferry-bridge`, as `cargo test --workspace` does.
fn ferry_stat(g: &str) -> Option<String> {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ferry-bridge")).with_file_name("ferry");
    if !bin.exists() {
        return None;
    }
    let out = Command::new(&bin).args(["stat", g]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "ferry stat {g} failed: {text}");
    Some(text)
}

/// Our groups' files in /dev/shm.
fn our_files(h: &Hosts) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains(&h.a) || n.contains(&h.b))
        .collect();
    v.sort();
    v
}

/// `ferry stat` on B shows the services B's bridge imports as bridged from A (A's host
/// and zenoh id), and on A the bridge carrying them to B; once B's bridge is gone, A's
/// services are local again. `stat` stays read-only throughout: it joins neither group
/// (the members are the same before and after) and makes no file.
fn stat_shows_bridged_services_and_their_far_end() {
    let h = Hosts::new("s");
    let mut ba = h.bridge('A', &[]);
    let zid_a = bridge_zid(&mut ba);
    let mut bb = h.bridge('B', &[]);
    let zid_b = bridge_zid(&mut bb);
    let mut p = Proc::role("pub", h.group('A'), "cam/stat|drop|stream");
    p.expect("offered", T);
    let mut srv = Proc::role("server", h.group('A'), "calc/stat");
    srv.expect("offered", T);
    let mut sb = Proc::role("sub", h.group('B'), "cam/stat|stream|60");
    sb.expect("got 50", T);
    let origin = |g: &str, name: &str| {
        inspected(g)
            .into_iter()
            .find(|s| s.name == name)
            .map(|s| s.origin)
    };
    let settle = |what: &str, ok: &dyn Fn() -> bool| {
        assert!(
            (0..1500).any(|_| {
                std::thread::sleep(Duration::from_millis(20));
                ok()
            }),
            "{what}"
        );
    };
    for name in ["cam/stat", "calc/stat"] {
        settle(&format!("B never showed {name} bridged from A"), &|| {
            matches!(origin(h.group('B'), name),
                Some(Origin::Bridged { far }) if far.contains(&zid_a))
        });
        settle(&format!("A never showed {name} carried to B"), &|| {
            matches!(origin(h.group('A'), name),
                Some(Origin::Carried { by, to }) if to.contains(&zid_b) && by.pid == ba.child.id())
        });
    }
    let members = |g: &str| match Group::inspect(g).state {
        ferry::stats::GroupFileState::Live(v) => v.members(),
        _ => Vec::new(),
    };
    let before = (members(h.group('A')), members(h.group('B')), our_files(&h));
    match (ferry_stat(h.group('A')), ferry_stat(h.group('B'))) {
        (Some(a), Some(b)) => {
            let line = |text: &str, name: &str| {
                text.lines()
                    .find(|l| l.contains(&format!("service {name:?}")))
                    .unwrap_or_else(|| panic!("no line for {name}: {text}"))
                    .to_owned()
            };
            for name in ["cam/stat", "calc/stat"] {
                let lb = line(&b, name);
                assert!(
                    lb.contains("bridged from") && lb.contains(&zid_a),
                    "stat on B: {lb}"
                );
                let la = line(&a, name);
                assert!(
                    la.contains("carried to")
                        && la.contains(&zid_b)
                        && la.contains(&format!("pid {}", ba.child.id())),
                    "stat on A: {la}"
                );
                eprintln!("    stat on A: {la}\n    stat on B: {lb}");
            }
        }
        _ => eprintln!(
            "    note: no `ferry` binary beside ferry-bridge (cargo build --release -p \
             ferry-cli): checked through the library's read-only view only"
        ),
    }
    let after = (members(h.group('A')), members(h.group('B')), our_files(&h));
    assert_eq!(before, after, "ferry stat changed the members or the files");

    // B's bridge gone: nothing is carried to B any more.
    sb.kill9();
    bb.stop();
    for name in ["cam/stat", "calc/stat"] {
        settle(&format!("A still shows {name} carried"), &|| {
            origin(h.group('A'), name) == Some(Origin::Local)
        });
    }
    p.kill9();
    srv.tell("exit");
    srv.wait(T);
    ba.stop();
    h.assert_no_leftovers();
}

fn main() {
    if let Ok(role) = std::env::var("FZ_ROLE") {
        child_main(&role);
        return;
    }
    let tests: &[(&str, fn())] = &[
        (
            "pubsub_reaches_both_hosts_byte_identical",
            pubsub_reaches_both_hosts_byte_identical,
        ),
        (
            "one_cpu_bridge_sends_large_messages_whole",
            one_cpu_bridge_sends_large_messages_whole,
        ),
        ("request_response_a_to_b", request_response_a_to_b),
        ("publisher_killed_midstream", publisher_killed_midstream),
        (
            "bridge_killed_midstream_and_restarted",
            bridge_killed_midstream_and_restarted,
        ),
        ("denied_service_never_arrives", denied_service_never_arrives),
        (
            "bridge_subscribes_only_for_far_subscribers",
            bridge_subscribes_only_for_far_subscribers,
        ),
        (
            "stat_shows_bridged_services_and_their_far_end",
            stat_shows_bridged_services_and_their_far_end,
        ),
    ];
    runner::run(tests);
}
