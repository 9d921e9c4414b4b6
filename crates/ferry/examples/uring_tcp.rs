//! Sends 64 MiB over loopback TCP through the io_uring driver, with plain sends and with
//! zero-copy sends (SEND_ZC), and prints throughput, `io_uring_enter` calls per send, and
//! how many zero-copy sends the kernel reported as copied (all of them, on loopback).
//!
//! ```text
//! cargo run --release -p ferry --example uring_tcp
//! ```

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use ferry::uring::Uring;
use ferry::uring::{Features, RingConfig};

const TOTAL: usize = 64 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !Features::probe().ring {
        eprintln!("no io_uring here: {:?}", Features::probe().why_not);
        return Ok(());
    }
    println!(
        "{:>9} {:>8} {:>9} {:>12} {:>10}",
        "chunk", "mode", "GB/s", "enters/send", "zc_copied"
    );
    for chunk in [64 * 1024, 1 << 20] {
        for zc in [false, true] {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let tx = TcpStream::connect(l.local_addr()?)?;
            let (mut rx, _) = l.accept()?;
            let reader = std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                let mut got = 0;
                loop {
                    match rx.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n,
                    }
                }
                got
            });
            let mut ring = Uring::new(&RingConfig::new(16))?;
            let mut buf = vec![0xa5u8; chunk];
            let start = Instant::now();
            let mut sent = 0;
            let mut sends = 0u64;
            while sent < TOTAL {
                buf.truncate(TOTAL - sent);
                let (r, b) = if zc {
                    ring.send_zc(&tx, buf)
                } else {
                    ring.send(&tx, buf)
                };
                sent += r?;
                sends += 1;
                buf = b;
            }
            drop(tx);
            let got = reader.join().expect("reader");
            let secs = start.elapsed().as_secs_f64();
            assert_eq!(got, TOTAL);
            let s = ring.stats();
            println!(
                "{:>9} {:>8} {:>9.2} {:>12.2} {:>10}",
                chunk,
                if zc { "send_zc" } else { "send" },
                TOTAL as f64 / secs / 1e9,
                s.enters as f64 / sends as f64,
                if zc {
                    format!("{}/{}", s.zc_copied, s.zc_sent)
                } else {
                    "-".into()
                }
            );
        }
    }
    println!("(loopback always copies: SEND_ZC reports IORING_NOTIF_USAGE_ZC_COPIED)");
    Ok(())
}
