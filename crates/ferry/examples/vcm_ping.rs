//! A VCM request loop: one `Request` command (a send linked to the receive of the reply)
//! stays armed and is re-activated for every ping with a new length, and its status word
//! is polled without a system call. The echo side is a plain `std::net::UdpSocket` in a
//! thread. With SQPOLL (`-- --sqpoll`) the pings make no system call at all once the
//! kernel thread is awake.
//!
//! ```text
//! cargo run --release -p ferry --example vcm_ping [-- --sqpoll]
//! ```

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use ferry::vcm::{BufRange, Command, Endpoint, EndpointConfig, Status, Vector};

fn main() -> ferry::Result<()> {
    let sqpoll = std::env::args().any(|a| a == "--sqpoll");
    let echo = UdpSocket::bind("127.0.0.1:0")?;
    let to = echo.local_addr()?;
    let echoer = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = echo.recv_from(&mut buf) {
            if &buf[..n] == b"quit" {
                break;
            }
            let _ = echo.send_to(&buf[..n], from);
        }
    });

    let mut opts = EndpointConfig::new(64 * 1024);
    if sqpoll {
        // Spin on the status word for up to 1 ms before blocking in io_uring_enter: a
        // round trip through a thread woken on the other CPU takes tens of µs here.
        opts = opts.sqpoll(1000);
        opts.spin = Duration::from_millis(1);
    }
    let mut ep = Endpoint::new(opts)?;
    let sock = ep.add_socket(UdpSocket::bind("127.0.0.1:0")?.into())?;
    let reply = BufRange::new(32 * 1024, 2048);
    let mut v = Vector::new();
    // Dormant: placed now, activated per ping with the request's offset and length.
    v.push_dormant(Command::Request {
        sock,
        send: BufRange::new(0, 0),
        to: Some(to),
        reply,
    });
    let req = ep.submit(&v)?[0];

    let pings = 10_000u32;
    let calls = ferry::stats::thread_syscall_count();
    let start = Instant::now();
    for i in 0..pings {
        let body = i.to_le_bytes();
        ep.buf_mut(BufRange::new(0, 4))?.copy_from_slice(&body);
        ep.activate(req, BufRange::new(0, 4))?;
        let got = ep.wait(req, Some(Duration::from_secs(5)))?;
        assert_eq!(got, Status::Done(4), "ping {i}");
        assert_eq!(ep.buf(BufRange::new(reply.offset, 4))?, body);
    }
    let secs = start.elapsed().as_secs_f64();
    let calls = ferry::stats::thread_syscall_count() - calls;
    println!(
        "{pings} pings: {:.1} µs per round trip, {:.4} system calls per ping ({})",
        secs * 1e6 / f64::from(pings),
        calls as f64 / f64::from(pings),
        if sqpoll {
            "SQPOLL"
        } else {
            "one io_uring_enter per activation"
        }
    );
    println!("{:?}", ep.stats());

    ep.buf_mut(BufRange::new(0, 4))?.copy_from_slice(b"quit");
    let mut v = Vector::new();
    v.push(Command::Send {
        sock,
        buf: BufRange::new(0, 4),
        to: Some(to),
    });
    let q = ep.submit(&v)?[0];
    ep.wait(q, Some(Duration::from_secs(5)))?;
    echoer.join().expect("echo thread");
    Ok(())
}
