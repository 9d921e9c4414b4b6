//! Conversions between `std::net::SocketAddr` and the C `sockaddr_storage` that
//! `sendmsg(2)` / `recvmsg(2)` (and their io_uring forms) read and write. The storage
//! lives in state the caller keeps alive until the kernel is done with it.

use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Writes `a` into `st` and returns the length to give the kernel.
pub fn write_sockaddr(st: &mut libc::sockaddr_storage, a: SocketAddr) -> libc::socklen_t {
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe {
                (st as *mut libc::sockaddr_storage)
                    .cast::<libc::sockaddr_in>()
                    .write(sin)
            };
            mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe {
                (st as *mut libc::sockaddr_storage)
                    .cast::<libc::sockaddr_in6>()
                    .write(sin6)
            };
            mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Reads the IPv4 or IPv6 address the kernel wrote into `st` (`len` bytes of it); `None`
/// for another family or a length too short for the family.
pub fn read_sockaddr(st: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match st.ss_family as libc::c_int {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, and it is big enough.
            let sin =
                unsafe { &*(st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6, and it is big enough.
            let s6 =
                unsafe { &*(st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s6.sin6_addr.s6_addr),
                u16::from_be(s6.sin6_port),
                s6.sin6_flowinfo,
                s6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trips() {
        for a in [
            "127.0.0.1:4242".parse::<SocketAddr>().unwrap(),
            "239.1.2.3:4000".parse().unwrap(),
            "[::1]:9".parse().unwrap(),
            "[fe80::1%2]:65535".parse().unwrap(),
        ] {
            // SAFETY: all-zero is a valid sockaddr_storage.
            let mut st: libc::sockaddr_storage = unsafe { mem::zeroed() };
            let len = write_sockaddr(&mut st, a);
            assert_eq!(read_sockaddr(&st, len), Some(a));
            assert_eq!(read_sockaddr(&st, 2), None, "short lengths are refused");
        }
    }
}
