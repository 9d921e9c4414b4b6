//! The broker protocol: one request and one reply per connection, as `SOCK_SEQPACKET`
//! messages, little-endian, fixed size.
//!
//! Request (56 bytes, with exactly one descriptor: the lot's memfd, `SCM_RIGHTS`):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `0x43444146` ("FADC") |
//! | 4 | 2 | version (1) |
//! | 6 | 2 | kind (1: open a receive channel) |
//! | 8 | 4 | queue, or `0xffffffff` for any the policy grants |
//! | 12 | 2 | UDP destination port |
//! | 14 | 2 | zero |
//! | 16 | 4 | frame size (2048 or 4096) |
//! | 20 | 4 | ring entries (a power of two) |
//! | 24 | 8 | UMEM offset in the memfd (page-aligned) |
//! | 32 | 8 | UMEM length (a multiple of the frame size) |
//! | 40 | 16 | interface name, NUL-padded |
//!
//! After a grant, the application maps its rings, stocks the fill ring and sends one byte
//! [`ARMED`]; the broker then inserts the map entry and answers with the same byte.
//! Any later byte, or closing the connection, ends the grant.
//!
//! Reply (16 bytes plus a UTF-8 message of at most 240 bytes; on success with the
//! AF_XDP socket as its one descriptor): magic, status (below), the queue granted, flags
//! (bit 0: zero-copy).

/// The one byte an application sends on its connection once its fill ring is
/// stocked, and the broker's answer once the flow is steered to the socket.
pub const ARMED: u8 = b'A';

/// "FADC".
pub const MAGIC: u32 = 0x4344_4146;
/// Protocol version.
pub const VERSION: u16 = 1;
/// Kind: open a receive channel.
pub const KIND_OPEN: u16 = 1;
/// Request size.
pub const REQUEST_LEN: usize = 56;
/// Most bytes of a reply.
pub const REPLY_MAX: usize = 256;

/// Reply status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// Granted; the socket is attached.
    Ok = 0,
    /// The request is not well-formed.
    Malformed = 1,
    /// The policy does not grant it to this user.
    Policy = 2,
    /// Every queue the policy would grant is taken.
    Busy = 3,
    /// The kernel refused (no AF_XDP, no memory, ...).
    Kernel = 4,
}

impl Status {
    fn from_u32(v: u32) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::Malformed,
            2 => Status::Policy,
            3 => Status::Busy,
            4 => Status::Kernel,
            _ => return None,
        })
    }
}

/// An open request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The queue wanted, or `None` for any.
    pub queue: Option<u32>,
    /// The UDP destination port.
    pub port: u16,
    /// Frame size.
    pub frame: u32,
    /// Ring entries.
    pub ring: u32,
    /// UMEM offset in the memfd.
    pub offset: u64,
    /// UMEM length.
    pub len: u64,
    /// Interface name.
    pub interface: String,
}

impl Request {
    /// The wire form.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&KIND_OPEN.to_le_bytes());
        b[8..12].copy_from_slice(&self.queue.unwrap_or(u32::MAX).to_le_bytes());
        b[12..14].copy_from_slice(&self.port.to_le_bytes());
        b[16..20].copy_from_slice(&self.frame.to_le_bytes());
        b[20..24].copy_from_slice(&self.ring.to_le_bytes());
        b[24..32].copy_from_slice(&self.offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        let name = self.interface.as_bytes();
        let n = name.len().min(15);
        b[40..40 + n].copy_from_slice(&name[..n]);
        b
    }

    /// Parses a request, saying what is wrong with a malformed one.
    pub fn decode(b: &[u8]) -> Result<Request, String> {
        if b.len() != REQUEST_LEN {
            return Err(format!(
                "a request is {REQUEST_LEN} bytes, this one {}",
                b.len()
            ));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u16_at = |i: usize| u16::from_le_bytes(b[i..i + 2].try_into().expect("2 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u32_at(0) != MAGIC {
            return Err("bad magic (not a ferry-adc request)".into());
        }
        if u16_at(4) != VERSION {
            return Err(format!(
                "protocol version {} (this broker speaks {VERSION})",
                u16_at(4)
            ));
        }
        if u16_at(6) != KIND_OPEN {
            return Err(format!("unknown request kind {}", u16_at(6)));
        }
        if u16_at(14) != 0 {
            return Err("reserved bytes are not zero".into());
        }
        let name = &b[40..56];
        let end = name.iter().position(|&c| c == 0).unwrap_or(16);
        if end == 0 || end == 16 || name[end..].iter().any(|&c| c != 0) {
            return Err("the interface name is empty, unterminated or not NUL-padded".into());
        }
        let interface = std::str::from_utf8(&name[..end])
            .map_err(|_| "the interface name is not UTF-8".to_string())?
            .to_string();
        let q = u32_at(8);
        Ok(Request {
            queue: (q != u32::MAX).then_some(q),
            port: u16_at(12),
            frame: u32_at(16),
            ring: u32_at(20),
            offset: u64_at(24),
            len: u64_at(32),
            interface,
        })
    }
}

/// A reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Outcome.
    pub status: Status,
    /// The queue granted.
    pub queue: u32,
    /// Whether the socket runs zero-copy.
    pub zerocopy: bool,
    /// Why, for a refusal; what was granted otherwise.
    pub message: String,
}

impl Reply {
    /// The wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(REPLY_MAX);
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&(self.status as u32).to_le_bytes());
        b.extend_from_slice(&self.queue.to_le_bytes());
        b.extend_from_slice(&(self.zerocopy as u32).to_le_bytes());
        let m = self.message.as_bytes();
        let mut n = m.len().min(REPLY_MAX - 16);
        while !self.message.is_char_boundary(n) {
            n -= 1;
        }
        b.extend_from_slice(&m[..n]);
        b
    }

    /// Parses a reply.
    pub fn decode(b: &[u8]) -> Result<Reply, String> {
        if b.len() < 16 || u32::from_le_bytes(b[0..4].try_into().expect("4")) != MAGIC {
            return Err("not a ferry-adc reply".into());
        }
        let at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Ok(Reply {
            status: Status::from_u32(at(4)).ok_or("unknown status")?,
            queue: at(8),
            zerocopy: at(12) & 1 != 0,
            message: String::from_utf8_lossy(&b[16..]).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let r = Request {
            queue: Some(0),
            port: 9000,
            frame: 4096,
            ring: 512,
            offset: 1 << 20,
            len: 4 << 20,
            interface: "veth0".into(),
        };
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        assert!(Request::decode(&r.encode()[..55]).is_err());
        let mut bad = r.encode();
        bad[0] ^= 1;
        assert!(Request::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = r.encode();
        bad[55] = b'x';
        assert!(Request::decode(&bad).is_err());
    }
}
