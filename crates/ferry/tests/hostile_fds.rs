//! Members that put something other than their lot behind their lot's descriptor number
//! (a FIFO, a directory, /dev/zero, a socket, a memfd that is unsealed and keeps being
//! resized, one of the wrong size, a file of another file system, a hugetlb memfd in a
//! group of 4 KiB lots), and a server that
//! still holds messages of clients that left. Each child is this test binary re-executed
//! in a role (`harness = false`).
//!
//! Peers reopen a member's lot through `/proc/PID/fd/N`: a FIFO there used to make every
//! peer's open wait forever for a writer. Now the subscriber, or the server's door, gets
//! an error naming the member and what its descriptor is, within its timeout, and the
//! door goes on serving others.

mod common;

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::*;
use ferry::testing::LOT_WINDOWS;
use ferry::Request;
use ferry::{Client, Error, PathConfig, Publisher, Server, ServiceConfig, Subscriber};

/// What hostile members put behind their lot descriptor, and what a peer must say it is.
const MODES: &[(&str, &str)] = &[
    ("fifo", "a FIFO"),
    ("dir", "a directory"),
    ("devzero", "a character device"),
    ("socket", "a socket"),
    ("resizing", "not sealed against growing and shrinking"),
    ("small", "wrong size"),
    ("shmfile", "another file system"),
    // A hugetlb memfd, sealed and of the lot's size, in a group of 4 KiB lots: only a
    // group made with `Pages::HugeTlb` takes those (a reader's fault can find no page).
    ("hugetlb", "a hugetlb memfd"),
];

// ---------------------------------------------------------------- child roles

/// The descriptor number of this process's (only) lot.
fn lot_fd() -> i32 {
    for e in std::fs::read_dir("/proc/self/fd").unwrap() {
        let e = e.unwrap();
        if std::fs::read_link(e.path())
            .is_ok_and(|l| l.to_str() == Some("/memfd:ferry-lot (deleted)"))
        {
            return e.file_name().to_str().unwrap().parse().unwrap();
        }
    }
    panic!("no lot memfd");
}

/// Puts what `mode` names behind this process's lot descriptor (`dup2`). Returns what
/// must stay alive meanwhile.
fn sabotage(mode: &str, lot_size: usize) -> Vec<Box<dyn Send>> {
    use rustix::fs::{ftruncate, memfd_create, open, MemfdFlags, Mode, OFlags};
    let mut keep: Vec<Box<dyn Send>> = Vec::new();
    let fd: OwnedFd = match mode {
        "fifo" => {
            let path =
                std::env::temp_dir().join(format!("ferry-hostile-fifo-{}", std::process::id()));
            let _ = std::fs::remove_file(&path);
            rustix::fs::mkfifoat(rustix::fs::CWD, &path, Mode::RUSR | Mode::WUSR).unwrap();
            // A reader end opened without blocking: no writer ever comes.
            let fd = open(&path, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()).unwrap();
            std::fs::remove_file(&path).unwrap();
            fd
        }
        "dir" => open("/", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap(),
        "devzero" => open("/dev/zero", OFlags::RDONLY, Mode::empty()).unwrap(),
        "socket" => {
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            keep.push(Box::new(b));
            a.into()
        }
        "resizing" | "small" => {
            let fd =
                memfd_create("ferry-lot", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
            if mode == "small" {
                ftruncate(&fd, 4096).unwrap();
                rustix::fs::fcntl_add_seals(
                    &fd,
                    rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW,
                )
                .unwrap();
            } else {
                ftruncate(&fd, lot_size as u64).unwrap();
                // Grows and shrinks it for as long as this process lives.
                let dup = fd.try_clone().unwrap();
                std::thread::spawn(move || {
                    for k in 0u64.. {
                        let len = if k % 2 == 0 {
                            lot_size as u64 * 2
                        } else {
                            4096
                        };
                        let _ = ftruncate(&dup, len);
                        std::thread::sleep(Duration::from_millis(1));
                    }
                });
            }
            fd
        }
        "shmfile" => {
            let path = format!("/dev/shm/ferry-hostile-file-{}", std::process::id());
            let f = std::fs::File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .unwrap();
            f.set_len(lot_size as u64).unwrap();
            std::fs::remove_file(&path).unwrap();
            f.into()
        }
        "hugetlb" => {
            let fd = memfd_create(
                "ferry-lot",
                MemfdFlags::CLOEXEC
                    | MemfdFlags::ALLOW_SEALING
                    | MemfdFlags::HUGETLB
                    | MemfdFlags::HUGE_2MB,
            )
            .unwrap();
            ftruncate(&fd, lot_size as u64).unwrap();
            rustix::fs::fcntl_add_seals(
                &fd,
                rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW,
            )
            .unwrap();
            fd
        }
        other => panic!("unknown mode {other}"),
    };
    let target = lot_fd();
    // SAFETY: dup2(2) onto a descriptor this process owns (the lot's, which ferry keeps
    // open only for peers to reopen; the mapping stays).
    assert!(unsafe { libc::dup2(fd.as_raw_fd(), target) } >= 0);
    drop(fd);
    keep
}

fn child_main(role: &str) {
    let (_gname, group, domain, arg, mut stdin) = child_start();
    match role {
        // ARG "mode,service": sabotage the lot, offer a publisher, wait.
        "bad-pub" => {
            let (mode, svc) = arg.split_once(',').unwrap();
            let _keep = sabotage(mode, group.lot_size());
            let _p = Publisher::offer(&domain, svc, ServiceConfig::default()).unwrap();
            println!("offered");
            read_line(&mut stdin);
        }
        // ARG "mode,service": sabotage the lot, try to become a client; print "refused
        // <error>" or "joined".
        "bad-client" => {
            let (mode, svc) = arg.split_once(',').unwrap();
            let _keep = sabotage(mode, group.lot_size());
            match Client::open(&domain, svc, Duration::from_secs(5)) {
                Ok(_c) => println!("joined"),
                Err(e) => println!("refused {e}"),
            }
            read_line(&mut stdin);
        }
        // ARG "service,calls": make that many calls; print "joined", then "ok", or
        // "err <error>" for the first failure.
        "client" => {
            let (svc, calls) = arg.split_once(',').unwrap();
            let mut c = match Client::open(&domain, svc, T) {
                Ok(c) => c,
                Err(e) => {
                    println!("err {e}");
                    read_line(&mut stdin);
                    return;
                }
            };
            println!("joined");
            let path = domain.path(PathConfig::default()).unwrap();
            for i in 0..calls.parse::<u64>().unwrap() {
                let req = fill(&path, i + 1, 100);
                match c.call(&req, T) {
                    Ok(got) => assert_eq!(got.len(), req.len() + 8),
                    Err(e) => {
                        println!("err {e}");
                        read_line(&mut stdin);
                        return;
                    }
                }
            }
            println!("ok");
            read_line(&mut stdin);
        }
        _ => panic!("unknown role {role}"),
    }
}

// ---------------------------------------------------------------- helpers

/// Runs `f` on a thread and waits at most `bound` for it: a call that hangs fails the
/// test instead of hanging it (the thread is left behind).
fn bounded<T: Send + 'static>(
    what: &str,
    bound: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(bound)
        .unwrap_or_else(|_| panic!("{what}: still running after {} s", bound.as_secs()))
}

/// A server on `svc` of domain `d`, served on a thread until the returned flag is set;
/// `keep` decides which requests it keeps alive after answering them (the last one, or
/// all). The thread ends by dropping the server and returns it stats (departed count).
fn serve(
    d: &ferry::Domain,
    svc: &str,
    keep: fn(&mut Vec<Request>, Request),
) -> (
    Arc<AtomicBool>,
    Arc<std::sync::Mutex<Vec<Request>>>,
    mpsc::Receiver<()>,
) {
    let mut srv = Server::offer(d, svc, ServiceConfig::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let kept = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let (s, k) = (stop.clone(), kept.clone());
    std::thread::spawn(move || {
        let mut h = Reverse { calls: 0 };
        while !s.load(Ordering::Relaxed) {
            let req = match srv.recv_timeout(Duration::from_millis(50)) {
                Ok(r) => r,
                Err(Error::Timeout) => continue,
                Err(e) => panic!("server: {e}"),
            };
            let resp = ferry::Handler::handle(&mut h, &req.data, srv.path()).unwrap();
            let _ = srv.reply(&req, &resp);
            keep(&mut k.lock().unwrap(), req);
        }
        drop(srv);
        let _ = tx.send(());
    });
    (stop, kept, rx)
}

fn keep_last(v: &mut Vec<Request>, r: Request) {
    v.clear();
    v.push(r);
}

fn keep_all(v: &mut Vec<Request>, r: Request) {
    v.push(r);
}

/// Stops a server started by [`serve`]; its drop must return.
fn stop_server(stop: &AtomicBool, done: mpsc::Receiver<()>) {
    stop.store(true, Ordering::Relaxed);
    done.recv_timeout(Duration::from_secs(15))
        .expect("the server's drop returned");
}

// ---------------------------------------------------------------- tests

/// (a) A publisher whose lot descriptor is a FIFO, a directory, /dev/zero, a socket, a
/// resizing unsealed memfd, a memfd of the wrong size or a /dev/shm file: a subscriber
/// with a 3 s timeout gets, within it (plus margin), an error that names the publisher's
/// domain and pid and says what its lot descriptor is.
fn subscriber_of_a_hostile_publisher_gets_an_error_in_time() {
    let (_g, d, name) = join("hpub");
    for &(mode, says) in MODES {
        let svc = format!("hpub-{mode}");
        let mut p = Peer::spawn("bad-pub", &name, &format!("{mode},{svc}"));
        assert_eq!(p.line(), "offered");
        let (dd, s) = (d.clone(), svc.clone());
        let t0 = Instant::now();
        let r = bounded(
            &format!("subscribing to the {mode} publisher"),
            Duration::from_secs(3 + 5),
            move || Subscriber::open(&dd, &s, Duration::from_secs(3)).map(|_| ()),
        );
        let e = r.expect_err("a hostile publisher's lot was accepted");
        let msg = e.to_string();
        eprintln!("    {mode}: {msg} ({:.1} s)", t0.elapsed().as_secs_f64());
        let who = format!("peer {} (pid {})", p.id, p.child.id());
        assert!(
            msg.contains(&who) && msg.contains("lot") && msg.contains(says),
            "{mode}: {msg}"
        );
        p.tell("exit");
        p.child.wait().unwrap();
    }
}

/// (b) Clients whose lot descriptor is one of those things are refused, each with an
/// error naming what the server found; the server's door goes on and serves an honest
/// client after them; and the server's drop returns.
fn hostile_clients_are_refused_and_the_server_serves_on() {
    let (_g, d, name) = join("hcli");
    let (stop, _kept, done) = serve(&d, "hcli", keep_last);
    for &(mode, _) in MODES {
        let mut p = Peer::spawn("bad-client", &name, &format!("{mode},hcli"));
        let l = p.line();
        eprintln!("    {mode}: {l}");
        assert!(
            l.starts_with("refused") && l.contains("lot descriptor"),
            "{mode}: {l}"
        );
        p.tell("exit");
        p.child.wait().unwrap();
    }
    let mut honest = Peer::spawn("client", &name, "hcli,20");
    assert_eq!(honest.line(), "joined");
    assert_eq!(honest.line(), "ok");
    honest.tell("exit");
    honest.child.wait().unwrap();
    stop_server(&stop, done);
}

/// (c) A server that keeps the last request alive still maps the lot of a client that
/// left; the slot's next client gets another address window and is served. With every
/// request kept, the client that would need a window still held is refused with an error
/// that says what the server holds; once the server lets go, the next one is served.
fn next_client_of_a_slot_is_served_while_the_last_request_is_kept() {
    let (_g, d, name) = join("hold");
    let (stop, kept, done) = serve(&d, "hold", keep_last);
    let mut slot = None;
    for _ in 0..2 * LOT_WINDOWS + 1 {
        let mut c = Peer::spawn("client", &name, "hold,3");
        assert_eq!(
            *slot.get_or_insert(c.id.slot),
            c.id.slot,
            "clients share one slot"
        );
        assert_eq!(c.line(), "joined");
        assert_eq!(c.line(), "ok");
        c.tell("exit");
        c.child.wait().unwrap();
        assert_eq!(kept.lock().unwrap().len(), 1);
    }
    stop_server(&stop, done);
    kept.lock().unwrap().clear();

    let (stop, kept, done) = serve(&d, "hold-all", keep_all);
    let mut slot = None;
    for _ in 0..LOT_WINDOWS {
        let mut c = Peer::spawn("client", &name, "hold-all,1");
        assert_eq!(*slot.get_or_insert(c.id.slot), c.id.slot);
        assert_eq!(c.line(), "joined");
        assert_eq!(c.line(), "ok");
        c.tell("exit");
        c.child.wait().unwrap();
    }
    let mut c = Peer::spawn("client", &name, "hold-all,1");
    let l = c.line();
    eprintln!("    {l}");
    let held = format!("still holds messages of {}.", c.id.slot);
    assert!(l.starts_with("err") && l.contains(&held), "{l}");
    c.tell("exit");
    c.child.wait().unwrap();
    kept.lock().unwrap().clear();
    let mut c = Peer::spawn("client", &name, "hold-all,1");
    assert_eq!(c.line(), "joined");
    assert_eq!(c.line(), "ok");
    c.tell("exit");
    c.child.wait().unwrap();
    stop_server(&stop, done);
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        child_main(&role);
        return;
    }
    run(&[
        (
            "subscriber_of_a_hostile_publisher_gets_an_error_in_time",
            subscriber_of_a_hostile_publisher_gets_an_error_in_time,
        ),
        (
            "hostile_clients_are_refused_and_the_server_serves_on",
            hostile_clients_are_refused_and_the_server_serves_on,
        ),
        (
            "next_client_of_a_slot_is_served_while_the_last_request_is_kept",
            next_client_of_a_slot_is_served_while_the_last_request_is_kept,
        ),
    ]);
}
