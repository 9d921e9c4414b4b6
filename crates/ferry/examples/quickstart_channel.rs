//! One message between two processes, written in place through a loan.
//! Run it with `cargo run --release -p ferry --example quickstart_channel`.
use std::process::Command;
use std::time::Duration;

use ferry::{DomainId, Group, PathConfig};

fn main() -> ferry::Result<()> {
    if let (Some(group), Some(id)) = (std::env::args().nth(1), std::env::args().nth(2)) {
        return sender(&group, id.parse()?);
    }
    // The receiver joins a group (no daemon: a file in /dev/shm and a memfd), then starts
    // the sender, this same program, with the group's name and its own domain id.
    let name = format!("quickstart-{}", std::process::id());
    let domain = Group::open(&name)?.join()?;
    let me = std::env::current_exe()?;
    let mut child = Command::new(me)
        .args([name, domain.id().to_string()])
        .spawn()?;
    let mut rx = domain.accept(Duration::from_secs(10))?;
    let frame = rx.recv()?; // the sender's pages, mapped read-only here: no copy
    assert!(frame.slice(..7).eq_bytes(b"frame 1"));
    println!("received {} bytes", frame.len());
    assert!(child.wait()?.success());
    Ok(()) // dropping `frame` releases it: the fbuf goes back to the sender's path
}

fn sender(group: &str, receiver: DomainId) -> ferry::Result<()> {
    let domain = Group::open(group)?.join()?;
    let path = domain.path(PathConfig::default())?; // allocates fbufs in our lot
    let tx = domain.connect(receiver, Duration::from_secs(10))?;
    // A loan: a 1 MiB fbuf and a place in the ring. We write the payload in place, and
    // the send is one store that publishes its descriptor.
    let mut loan = tx.loan(path.alloc(1 << 20)?)?;
    loan.as_mut_slice().expect("one fbuf")[..7].copy_from_slice(b"frame 1");
    loan.send()?;
    Ok(()) // the receiver mapped our lot when it accepted: it may read after we exit
}
