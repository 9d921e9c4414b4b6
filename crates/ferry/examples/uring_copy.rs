//! Copies a file through io_uring with registered buffers, several blocks in flight, and
//! prints the driver's counters (syscalls per block included).
//!
//! ```text
//! cargo run --release -p ferry --example uring_copy [SRC DST] [--sqpoll]
//! ```
//!
//! Without SRC and DST it copies a generated 16 MiB file in the temp directory and checks
//! the copy byte for byte.

use std::os::fd::AsRawFd;
use std::time::Instant;

use ferry::uring::{Features, RingConfig};
use ferry::uring::{FixedBuf, Uring};

const BLOCK: usize = 256 * 1024;
const DEPTH: u16 = 8;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sqpoll = args.iter().any(|a| a == "--sqpoll");
    let paths: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let f = Features::probe();
    if !f.ring || !f.fixed_rw {
        eprintln!(
            "this kernel lacks io_uring or registered buffers: {:?}",
            f.why_not
        );
        return Ok(());
    }
    let tmp = std::env::temp_dir();
    let (src, dst, generated) = match paths.as_slice() {
        [s, d] => (s.into(), d.into(), false),
        _ => {
            let s = tmp.join(format!("ferry-copy-src-{}", std::process::id()));
            let data: Vec<u8> = (0..16usize << 20)
                .map(|i| (i * 31 + i / 4096) as u8)
                .collect();
            std::fs::write(&s, data)?;
            (
                s,
                tmp.join(format!("ferry-copy-dst-{}", std::process::id())),
                true,
            )
        }
    };
    let input = std::fs::File::open(&src)?;
    let output = std::fs::File::create(&dst)?;
    let len = input.metadata()?.len();

    let mut opts = RingConfig::new(2 * DEPTH as u32);
    if sqpoll {
        opts = opts.sqpoll(50);
    }
    let mut ring = Uring::new(&opts)?;
    let pool = ring.register_pool(BLOCK, DEPTH)?;
    let syscalls0 = ferry::stats::syscall_count();
    let start = Instant::now();
    let mut off = 0u64;
    while off < len {
        // Up to DEPTH reads in flight, then write each block back out from the same
        // registered buffer: no copy in user space.
        let mut reads = Vec::new();
        while reads.len() < DEPTH as usize && off < len {
            let buf = pool.get().expect("DEPTH buffers");
            reads.push((off, ring.submit_read_at(&input, buf, off)?));
            off += BLOCK as u64;
        }
        let mut writes = Vec::new();
        for (at, t) in reads {
            let c = ring.wait(t)?;
            let n = c.result?;
            let mut buf: FixedBuf = c.buf;
            buf.set_len(n);
            writes.push(ring.submit_write_at(output.as_raw_fd(), buf, at)?);
        }
        for t in writes {
            ring.wait(t)?.result?;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let syscalls = ferry::stats::syscall_count() - syscalls0;
    let s = ring.stats();
    let blocks = len.div_ceil(BLOCK as u64).max(1);
    println!(
        "copied {len} bytes in {:.1} ms ({:.2} GB/s), sqpoll={sqpoll}",
        secs * 1e3,
        len as f64 / secs / 1e9
    );
    println!(
        "ops {} (fixed {}), io_uring_enter {} ({:.2} per block), SQPOLL wake-ups {}, ferry syscalls {syscalls}",
        s.completed,
        s.fixed_ops,
        s.enters,
        s.enters as f64 / blocks as f64,
        s.sqpoll_wakeups
    );
    if generated {
        let same = std::fs::read(&src)? == std::fs::read(&dst)?;
        println!("copy identical: {same}");
        std::fs::remove_file(&src)?;
        std::fs::remove_file(&dst)?;
        if !same {
            return Err("the copy differs".into());
        }
    }
    Ok(())
}
