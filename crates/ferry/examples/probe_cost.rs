//! Software cost of one alloc/send/recv/release round, in one thread (no cross-core
//! cache traffic): where the hand-over's time goes besides moving cache lines.
use std::time::{Duration, Instant};

use ferry::{Group, PathConfig};

fn main() -> ferry::Result<()> {
    let g = Group::open(&format!("probe-{}", std::process::id()))?;
    let a = g.join()?;
    let b = g.join()?;
    let bid = b.id();
    let a2 = a.clone();
    let t = std::thread::spawn(move || a2.connect(bid, Duration::from_secs(5)));
    let mut rx = b.accept(Duration::from_secs(5))?;
    let tx = t.join().unwrap()?;
    let path = a.path(PathConfig::default())?;
    let n = 200_000;
    let (mut ta, mut ts, mut tr, mut td) = (0u128, 0u128, 0u128, 0u128);
    for i in 0..n {
        let t0 = Instant::now();
        let mut m = path.alloc(4096)?;
        m.write_at(0, &(i as u64).to_le_bytes());
        let d = m.freeze();
        let t1 = Instant::now();
        tx.try_send(&d)?;
        drop(d);
        let t2 = Instant::now();
        let got = rx.try_recv()?.expect("ready");
        let t3 = Instant::now();
        drop(got);
        let t4 = Instant::now();
        if i > 1000 {
            ta += (t1 - t0).as_nanos();
            ts += (t2 - t1).as_nanos();
            tr += (t3 - t2).as_nanos();
            td += (t4 - t3).as_nanos();
        }
    }
    let k = (n - 1001) as u128;
    println!(
        "ns per op: alloc+freeze {} send {} recv {} release {}",
        ta / k,
        ts / k,
        tr / k,
        td / k
    );
    Ok(())
}
