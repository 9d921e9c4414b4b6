//! Test and benchmark support: two network namespaces joined by a veth pair, made with
//! `ip` (iproute2, needs root) and deleted on drop.
//!
//! The `rx` namespace holds `adc0` (`10.<net>.0.1`, MAC `02:00:00:<net>:00:01`), the
//! `tx` namespace `adc1` (`10.<net>.0.2`, MAC `02:00:00:<net>:00:02`). Each side knows
//! the other's MAC address permanently, so no datagram waits on ARP (which the redirect
//! programs pass up the stack anyway) and a raw frame sender can address the peer.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::Command;

/// Runs `args` (program first), failing with its stderr.
pub fn sh(args: &[&str]) -> io::Result<()> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", args[0])))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Why namespaces cannot be made here (not root, no `ip`), or `None` when they can.
pub fn unavailable() -> Option<&'static str> {
    if !rustix::process::geteuid().is_root() {
        return Some("needs root (network namespaces, BPF, AF_XDP)");
    }
    if sh(&["ip", "-V"]).is_err() {
        return Some("needs `ip` (iproute2)");
    }
    None
}

/// Two namespaces joined by a veth pair; see the module documentation.
#[derive(Debug)]
pub struct Net {
    /// The receiving namespace (`adc0`).
    pub rx: String,
    /// The sending namespace (`adc1`).
    pub tx: String,
    /// The second octet of the addresses.
    pub net: u8,
}

impl Net {
    /// Makes namespaces `<name>-rx` and `<name>-tx` on network `10.<net>.0.0/24`.
    pub fn new(name: &str, net: u8) -> io::Result<Net> {
        let n = Net {
            rx: format!("{name}-rx"),
            tx: format!("{name}-tx"),
            net,
        };
        // From here on, drop deletes whatever was made.
        let (rx, tx) = (n.rx.as_str(), n.tx.as_str());
        let (ip_rx, ip_tx) = (format!("{}/24", n.rx_ip()), format!("{}/24", n.tx_ip()));
        let (mac_rx, mac_tx) = (mac_str(n.rx_mac()), mac_str(n.tx_mac()));
        let (rx_ip, tx_ip) = (n.rx_ip().to_string(), n.tx_ip().to_string());
        for step in [
            vec!["ip", "netns", "add", rx],
            vec!["ip", "netns", "add", tx],
            vec![
                "ip", "-n", rx, "link", "add", "adc0", "type", "veth", "peer", "name", "adc1",
                "netns", tx,
            ],
            vec!["ip", "-n", rx, "link", "set", "adc0", "address", &mac_rx],
            vec!["ip", "-n", tx, "link", "set", "adc1", "address", &mac_tx],
            vec!["ip", "-n", rx, "addr", "add", &ip_rx, "dev", "adc0"],
            vec!["ip", "-n", tx, "addr", "add", &ip_tx, "dev", "adc1"],
            vec!["ip", "-n", rx, "link", "set", "adc0", "up"],
            vec!["ip", "-n", tx, "link", "set", "adc1", "up"],
            vec!["ip", "-n", rx, "link", "set", "lo", "up"],
            vec!["ip", "-n", tx, "link", "set", "lo", "up"],
            vec![
                "ip",
                "-n",
                tx,
                "neigh",
                "replace",
                &rx_ip,
                "lladdr",
                &mac_rx,
                "dev",
                "adc1",
                "nud",
                "permanent",
            ],
            vec![
                "ip",
                "-n",
                rx,
                "neigh",
                "replace",
                &tx_ip,
                "lladdr",
                &mac_tx,
                "dev",
                "adc0",
                "nud",
                "permanent",
            ],
        ] {
            sh(&step)?;
        }
        Ok(n)
    }

    /// `adc0`'s address.
    pub fn rx_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 0, 1)
    }

    /// `adc1`'s address.
    pub fn tx_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 0, 2)
    }

    /// `adc0`'s MAC address.
    pub fn rx_mac(&self) -> [u8; 6] {
        [2, 0, 0, self.net, 0, 1]
    }

    /// `adc1`'s MAC address.
    pub fn tx_mac(&self) -> [u8; 6] {
        [2, 0, 0, self.net, 0, 2]
    }

    /// A command that runs `exe` inside the `rx` namespace.
    pub fn cmd_rx(&self, exe: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.rx]).arg(exe);
        c
    }

    /// Runs `f` on a new thread inside namespace `ns` and returns its result.
    pub fn within<R: Send + 'static>(
        ns: &str,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> io::Result<R> {
        let ns = ns.to_owned();
        std::thread::spawn(move || {
            enter(&ns)?;
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("the thread in the namespace panicked"))?
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.rx]);
        let _ = sh(&["ip", "netns", "del", &self.tx]);
    }
}

/// Moves the calling thread into network namespace `ns` (made by `ip netns add`).
pub fn enter(ns: &str) -> io::Result<()> {
    let f = std::fs::File::open(format!("/run/netns/{ns}"))?;
    rustix::thread::move_into_link_name_space(
        f.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))
}

/// Deletes every namespace whose name starts with `prefix` (after a hang, when no
/// destructor runs).
pub fn cleanup(prefix: &str) {
    if let Ok(o) = Command::new("ip").args(["netns", "list"]).output() {
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            if let Some(n) = l
                .split_whitespace()
                .next()
                .filter(|n| n.starts_with(prefix))
            {
                let _ = sh(&["ip", "netns", "del", n]);
            }
        }
    }
}

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
