//! Publish-subscribe by name: a publisher process and two subscriber processes.
//! Run it with `cargo run --release -p ferry --example quickstart_pubsub`.
use std::process::Command;
use std::time::Duration;

use ferry::{Error, Group, PathConfig, Publisher, ServiceConfig, Subscriber};

fn main() -> ferry::Result<()> {
    if let Some(group) = std::env::args().nth(1) {
        return subscriber(&group);
    }
    let name = format!("quickstart-pubsub-{}", std::process::id());
    let domain = Group::open(&name)?.join()?;
    let mut publisher = Publisher::offer(&domain, "camera/front", ServiceConfig::default())?;
    let me = std::env::current_exe()?;
    let subs = [
        Command::new(&me).arg(&name).spawn()?,
        Command::new(&me).arg(&name).spawn()?,
    ];
    publisher.wait_for_subscribers(2, Duration::from_secs(10))?;
    let path = domain.path(PathConfig::default())?;
    for n in 0..10u64 {
        let mut frame = path.alloc(64 * 1024)?;
        frame.write_at(0, &n.to_le_bytes());
        publisher.publish(&frame.freeze())?; // a descriptor to each subscriber, no copy
    }
    drop(publisher); // withdraws the service: subscribers see `Disconnected`
    for mut sub in subs {
        assert!(sub.wait()?.success());
    }
    Ok(())
}

fn subscriber(group: &str) -> ferry::Result<()> {
    let domain = Group::open(group)?.join()?;
    let mut sub = Subscriber::open(&domain, "camera/front", Duration::from_secs(10))?;
    for n in 0..10u64 {
        let frame = sub.recv_timeout(Duration::from_secs(10))?; // the publisher's pages
        assert!(frame.slice(..8).eq_bytes(&n.to_le_bytes()));
    }
    assert!(matches!(
        sub.recv_timeout(Duration::from_secs(10)),
        Err(Error::Disconnected)
    ));
    println!("subscriber {}: 10 frames, in order", std::process::id());
    Ok(())
}
