//! Publish-subscribe between processes, by name.
//!
//! ```text
//! cargo run --release -p ferry --example pubsub            # a publisher and 3 subscriber processes
//! cargo run --release -p ferry --example pubsub -- pub G   # the publisher of group G alone
//! cargo run --release -p ferry --example pubsub -- sub G   # one subscriber of group G
//! ```
//!
//! With no arguments the example starts three subscriber processes (itself, as `sub`)
//! and publishes to them: each frame is 256 KiB, written once by the publisher and read
//! in place by every subscriber, which checks a checksum.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry::{Group, PathConfig, Publisher, ServiceConfig, SlowSubscriber, Subscriber};

const SERVICE: &str = "camera/front";
const FRAMES: u64 = 1000;
const FRAME: usize = 256 * 1024;

fn checksum(bytes: impl Iterator<Item = u8>) -> u64 {
    bytes.fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn publisher(group: &str, subscribers: usize) -> ferry::Result<()> {
    let group = Group::open(group)?;
    let domain = group.join()?;
    let config = ServiceConfig {
        depth: 32,
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    let mut publisher = Publisher::offer(&domain, SERVICE, config)?;
    publisher.wait_for_subscribers(subscribers, Duration::from_secs(30))?;
    for s in group.services() {
        println!(
            "service {:?}: publisher pid {}, subscriber pids {:?}",
            s.name,
            s.owner.pid,
            s.subscribers.iter().map(|m| m.pid).collect::<Vec<_>>()
        );
    }
    let path = domain.path(PathConfig::default())?;
    let t0 = Instant::now();
    for n in 0..FRAMES {
        let mut frame = path.alloc(FRAME)?;
        frame.write_at(0, &n.to_le_bytes());
        // One byte per page, as a camera filling the frame would touch it.
        for page in (4096..FRAME).step_by(4096) {
            frame.write_at(page, &[(n as usize ^ page) as u8]);
        }
        let frame = frame.freeze();
        let sum = checksum(frame.iter_bytes());
        let mut tagged = path.alloc(16)?;
        tagged.write_at(0, &sum.to_le_bytes());
        let mut msg = tagged.freeze();
        msg.append(frame);
        publisher.publish(&msg)?;
    }
    let dt = t0.elapsed();
    println!(
        "published {FRAMES} frames of {} KiB to {} subscribers in {:.1} ms ({:.2} us each, including writing and checksumming the frame; {} payload bytes copied)",
        FRAME / 1024,
        publisher.subscriber_count(),
        dt.as_secs_f64() * 1e3,
        dt.as_secs_f64() * 1e6 / FRAMES as f64,
        publisher.stats().copied_bytes
    );
    Ok(())
}

fn subscriber(group: &str) -> ferry::Result<()> {
    let group = Group::open(group)?;
    let domain = group.join()?;
    let mut sub = Subscriber::open(&domain, SERVICE, Duration::from_secs(30))?;
    let mut got = 0;
    loop {
        match sub.recv_timeout(Duration::from_secs(30)) {
            Ok(msg) => {
                let mut sum = [0u8; 8];
                msg.copy_range_to_slice(0..8, &mut sum);
                let frame = msg.slice(16..);
                assert_eq!(
                    u64::from_le_bytes(sum),
                    checksum(frame.iter_bytes()),
                    "frame corrupted"
                );
                got += 1;
            }
            Err(ferry::Error::Disconnected | ferry::Error::PeerGone { .. }) => break,
            Err(e) => return Err(e),
        }
    }
    println!(
        "subscriber {}: {got} frames, checksums right",
        std::process::id()
    );
    Ok(())
}

fn main() -> ferry::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["pub", group] => publisher(group, 1),
        ["sub", group] => subscriber(group),
        [] => {
            let group = format!("example-pubsub-{}", std::process::id());
            let me = std::env::current_exe()?;
            let children: Vec<_> = (0..3)
                .map(|_| {
                    Command::new(&me)
                        .args(["sub", &group])
                        .stdout(Stdio::inherit())
                        .spawn()
                })
                .collect::<Result<_, _>>()?;
            publisher(&group, 3)?;
            for mut c in children {
                c.wait()?;
            }
            Ok(())
        }
        _ => Err(ferry::Error::InvalidArgument(
            "usage: pubsub [pub|sub GROUP]",
        )),
    }
}
