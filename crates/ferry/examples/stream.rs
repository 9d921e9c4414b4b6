//! Streams messages from this process to a child process through a ferry channel and
//! reports throughput and page faults on both sides.
//!
//! ```text
//! cargo run --release --example stream -- SIZE_BYTES COUNT
//! ```
//! The sender writes one word per page of every message; the receiver reads one word
//! per page (every byte with `READ_ALL=1`) and drops the message, which releases its fbuf
//! back to the sender. `DEPTH=N` bounds the sender's path to N fbufs in flight (it spins
//! on `QuotaExceeded`); without it the quota is 1 GiB and fresh fbufs are first-touched.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry::{DomainId, Group, PathConfig};

const T: Duration = Duration::from_secs(10);

fn minor_faults() -> i64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a full rusage into the buffer we pass.
    unsafe {
        libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr());
        u.assume_init().ru_minflt
    }
}

fn main() -> ferry::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let size: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(64 << 20);
    let count: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(50);
    let page = ferry::stats::page_size();
    if let Ok(group) = std::env::var("STREAM_GROUP") {
        // Receiver.
        let g = Group::open(&group)?;
        let d = g.join()?;
        println!("{}", d.id());
        let mut rx = d.accept(T)?;
        let f0 = minor_faults();
        let mut sum = 0u64;
        for _ in 0..count {
            let m = rx.recv()?;
            for f in m.fragments() {
                sum += f
                    .as_slice()
                    .iter()
                    .step_by(page)
                    .map(|&b| b as u64)
                    .sum::<u64>();
            }
        }
        eprintln!("receiver: {} minor faults ({sum})", minor_faults() - f0);
        return Ok(());
    }
    let name = format!("stream-{}", std::process::id());
    let g = Group::open(&name)?;
    let d = g.join()?;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(&args[1..])
        .env("STREAM_GROUP", &name)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let f0 = minor_faults();
    let sent = send_all(&d, &line, size, count, page);
    child.wait().unwrap();
    let (path, t0) = sent?;
    let dt = t0.elapsed();
    let _ = std::io::stdout().flush();
    println!(
        "{count} x {size} B in {:.3} s: {:.2} GB/s; sender {} minor faults; path {:?}",
        dt.as_secs_f64(),
        (size as u64 * count) as f64 / dt.as_secs_f64() / 1e9,
        minor_faults() - f0,
        path.stats()
    );
    Ok(())
}

/// Connects to the receiver whose id is `line` and sends `count` messages.
fn send_all(
    d: &ferry::Domain,
    line: &str,
    size: usize,
    count: u64,
    page: usize,
) -> ferry::Result<(ferry::PathAllocator, Instant)> {
    let peer: DomainId = line.trim().parse()?;
    let tx = d.connect(peer, T)?;
    let path = d.path(PathConfig {
        quota: std::env::var("DEPTH")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(1 << 30, |n| n * size.next_power_of_two().max(4096)),
        secure: false,
        ..PathConfig::default()
    })?;
    let t0 = Instant::now();
    for i in 0..count {
        let mut m = loop {
            match path.alloc(size) {
                Ok(m) => break m,
                Err(ferry::Error::QuotaExceeded { .. }) => std::hint::spin_loop(),
                Err(e) => return Err(e),
            }
        };
        for f in m.fragments_mut() {
            for w in f.iter_mut().step_by(page) {
                *w = i as u8;
            }
        }
        tx.send(&m.freeze())?;
    }
    Ok((path, t0))
}
