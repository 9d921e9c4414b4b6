//! Multicast on `DatagramSocket`, inside a network namespace this test creates.
//!
//! The test thread enters a new network namespace (`unshare(CLONE_NEWNET)`, which needs
//! root or CAP_SYS_ADMIN), brings its loopback up with multicast on and routes
//! 224.0.0.0/4 to it (with `ip`), then drives a sender process started from the same
//! thread, so it shares the namespace: join, receive, leave, and no more delivery.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::Duration;

use ferry::uring::Features;
use ferry::vcm::DatagramSocket;
use ferry::Error;

const GROUP: Ipv4Addr = Ipv4Addr::new(239, 7, 7, 7);

/// Entry point of the sender process, not a test of its own: without
/// `FERRY_VCM_MCAST_SENDER` it returns at once. Reads `<port> <text>` lines from stdin and
/// sends each text to the group, answering "sent" on stdout.
#[test]
fn sender_entry() {
    if std::env::var("FERRY_VCM_MCAST_SENDER").is_err() {
        return;
    }
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut out = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let (port, text) = line.split_once(' ').unwrap();
        let to = SocketAddr::from((GROUP, port.parse::<u16>().unwrap()));
        s.send_to(text.as_bytes(), to).unwrap();
        writeln!(out, "sent").unwrap();
        out.flush().unwrap();
    }
    std::process::exit(0);
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    match Command::new(cmd).args(args).status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{cmd} {args:?}: {s}")),
        Err(e) => Err(format!("{cmd}: {e}")),
    }
}

#[test]
fn join_receive_leave_in_a_private_network_namespace() {
    if !Features::probe().ring {
        eprintln!("skipped: no io_uring here");
        return;
    }
    // The namespace belongs to this thread only; the harness runs each test on a thread
    // of its own, which ends with the test.
    std::thread::spawn(in_namespace).join().unwrap();
}

fn in_namespace() {
    // SAFETY: unshare(2) with CLONE_NEWNET changes only this thread's network namespace;
    // no memory is involved.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        eprintln!(
            "skipped: cannot create a network namespace: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    if let Err(e) = run("ip", &["link", "set", "lo", "up", "multicast", "on"])
        .and_then(|_| run("ip", &["route", "add", "224.0.0.0/4", "dev", "lo"]))
    {
        eprintln!("skipped: cannot set up loopback multicast in the namespace: {e}");
        return;
    }
    let mut rx = DatagramSocket::bind("0.0.0.0:0").unwrap();
    let port = rx.local_addr().unwrap().port();
    rx.join_multicast_v4(&GROUP, &Ipv4Addr::LOCALHOST).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(10)));

    let mut sender = Command::new(std::env::current_exe().unwrap())
        .args([
            "sender_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("FERRY_VCM_MCAST_SENDER", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_sender = sender.stdin.take().unwrap();
    let mut from_sender = BufReader::new(sender.stdout.take().unwrap()).lines();
    let mut send = |text: &str| {
        writeln!(to_sender, "{port} {text}").unwrap();
        to_sender.flush().unwrap();
        loop {
            let l = from_sender.next().expect("sender exited").unwrap();
            if l == "sent" {
                break;
            }
        }
    };

    let mut buf = [0u8; 64];
    for i in 0..3 {
        let text = format!("member-{i}");
        send(&text);
        let (n, from) = rx.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], text.as_bytes());
        assert_eq!(from.ip(), Ipv4Addr::LOCALHOST);
    }
    rx.leave_multicast_v4(&GROUP, &Ipv4Addr::LOCALHOST).unwrap();
    send("after-leave");
    // Delivery on loopback happens inside the sender's sendto, so 300 ms is ample.
    rx.set_read_timeout(Some(Duration::from_millis(300)));
    match rx.recv_from(&mut buf) {
        Err(Error::Timeout) => {}
        other => panic!("datagram delivered after leaving the group: {other:?}"),
    }
    // Joining again delivers again (the receive armed above is still in place).
    rx.join_multicast_v4(&GROUP, &Ipv4Addr::LOCALHOST).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(10)));
    send("rejoined");
    let (n, _) = rx.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"rejoined");
    drop(to_sender);
    assert!(sender.wait().unwrap().success());
}
