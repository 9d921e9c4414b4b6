//! Two processes started by hand: run it once without arguments (the receiver), then
//! again, in another terminal, with the id the receiver prints (the sender).
//! (`quickstart_channel` starts both itself.)

use std::time::Duration;

use ferry::{DomainId, Group, PathConfig};

/// The receiver: start it first, with no argument.
fn receiver() -> ferry::Result<()> {
    let group = Group::open("camera")?; // creates or opens /dev/shm/ferry.camera
    let domain = group.join()?; // claims a slot and creates this process's lot
    println!("run: example {}", domain.id()); // e.g. "1.1"
    let mut rx = domain.accept(Duration::from_secs(30))?;
    let frame = rx.recv()?; // the sender's pages, mapped read-only here
    assert_eq!(frame.slice(..7).to_vec(), b"frame 1");
    Ok(()) // dropping `frame` sends a release: the fbuf goes back to the sender's path
}

/// The sender: run it with the receiver's id.
fn sender(peer: DomainId) -> ferry::Result<()> {
    let group = Group::open("camera")?;
    let domain = group.join()?;
    let path = domain.path(PathConfig::default())?; // a per-path fbuf allocator
    let tx = domain.connect(peer, Duration::from_secs(5))?;
    let mut buf = path.alloc(1 << 20)?; // a 1 MiB fbuf in its write phase
    buf.write_at(0, b"frame 1");
    let frame = buf.freeze(); // immutable from here on
    tx.send(&frame)?; // only a descriptor crosses the ring
    Ok(()) // the receiver mapped our lot when it accepted: it may read after we exit
}

fn main() -> ferry::Result<()> {
    match std::env::args().nth(1) {
        Some(id) => sender(id.parse()?),
        None => receiver(),
    }
}
