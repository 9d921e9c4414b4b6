//! Every `unsafe` of the crate: the `bpf` system call, AF_XDP socket options and ring
//! mappings, the broker's temporary mapping of a UMEM, `recvmmsg`, and the lent frames.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

fn cvt(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `bpf(cmd, attr, size_of(attr))` for a command whose attribute struct is `A`, returning
/// a new descriptor.
fn bpf_fd<A>(cmd: u32, attr: &A) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a live, initialised `#[repr(C)]` attribute struct of the size we
    // pass; the kernel reads that many bytes and writes nothing back for these commands
    // except through the pointers inside (log buffer) that the caller keeps alive.
    let r = cvt(unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *const A,
            std::mem::size_of::<A>(),
        )
    })?;
    // SAFETY: the commands passed here return a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

fn bpf_cmd<A>(cmd: u32, attr: &A) -> io::Result<()> {
    // SAFETY: as in `bpf_fd`; these commands return 0 and create nothing.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *const A,
            std::mem::size_of::<A>(),
        )
    })
    .map(drop)
}

const BPF_MAP_CREATE: u32 = 0;
const BPF_MAP_UPDATE_ELEM: u32 = 2;
const BPF_MAP_DELETE_ELEM: u32 = 3;
const BPF_PROG_LOAD: u32 = 5;
const BPF_LINK_CREATE: u32 = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;

#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
}

#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// An XSKMAP of `max_entries` entries (u32 key, socket descriptor as value).
pub fn xskmap_create(max_entries: u32) -> io::Result<OwnedFd> {
    bpf_fd(
        BPF_MAP_CREATE,
        &MapCreate {
            map_type: BPF_MAP_TYPE_XSKMAP,
            key_size: 4,
            value_size: 4,
            max_entries,
        },
    )
}

/// Loads an XDP program of raw 8-byte instructions; on refusal the verifier's log is in
/// the error.
pub fn prog_load_xdp(insns: &[u64]) -> io::Result<OwnedFd> {
    let license = b"GPL\0";
    let mut log = vec![0u8; 16 << 10];
    let attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
    };
    bpf_fd(BPF_PROG_LOAD, &attr).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        io::Error::new(
            e.kind(),
            format!(
                "BPF_PROG_LOAD: {e}; verifier: {}",
                String::from_utf8_lossy(&log[..end]).trim()
            ),
        )
    })
}

/// Attaches an XDP program to interface `ifindex` with a BPF link (gone with the link's
/// last descriptor). `flags`: `XDP_FLAGS_SKB_MODE` (2) or `XDP_FLAGS_DRV_MODE` (4).
pub fn link_create_xdp(prog: BorrowedFd<'_>, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    bpf_fd(
        BPF_LINK_CREATE,
        &LinkCreate {
            prog_fd: prog.as_raw_fd() as u32,
            target_ifindex: ifindex,
            attach_type: BPF_XDP,
            flags,
        },
    )
}

/// `map[key] = value` for a map of u32 keys and values.
pub fn map_update(map: BorrowedFd<'_>, key: u32, value: u32) -> io::Result<()> {
    bpf_cmd(
        BPF_MAP_UPDATE_ELEM,
        &MapElem {
            map_fd: map.as_raw_fd() as u32,
            key: &key as *const u32 as u64,
            value: &value as *const u32 as u64,
            ..Default::default()
        },
    )
}

/// Removes `map[key]`.
pub fn map_delete(map: BorrowedFd<'_>, key: u32) -> io::Result<()> {
    bpf_cmd(
        BPF_MAP_DELETE_ELEM,
        &MapElem {
            map_fd: map.as_raw_fd() as u32,
            key: &key as *const u32 as u64,
            ..Default::default()
        },
    )
}

fn setsockopt<T>(fd: BorrowedFd<'_>, level: i32, name: i32, v: &T) -> io::Result<()> {
    // SAFETY: `v` is a live `T` of the size passed; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            v as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    cvt(r as libc::c_long).map(drop)
}

/// A new AF_XDP socket.
pub fn xsk_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); on success we own the descriptor.
    let r = cvt(
        unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) }
            as libc::c_long,
    )?;
    // SAFETY: a fresh descriptor owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// Registers `len` bytes at `offset` of `memfd` as the UMEM of `xsk`, in frames of
/// `frame` bytes. The memory is mapped here only for the registration: the kernel pins
/// its pages and keeps them, so the mapping goes again before returning.
pub fn umem_register(
    xsk: BorrowedFd<'_>,
    memfd: BorrowedFd<'_>,
    offset: u64,
    len: u64,
    frame: u32,
) -> io::Result<()> {
    // SAFETY: a fresh shared mapping of the memfd, placed by the kernel, touching no
    // existing memory; unmapped below and never dereferenced here.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            memfd.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let reg = libc::xdp_umem_reg {
        addr: p as u64,
        len,
        chunk_size: frame,
        headroom: 0,
        flags: 0,
        tx_metadata_len: 0,
    };
    let r = setsockopt(xsk, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg);
    // SAFETY: the mapping made above, of that length, which nothing else references (the
    // kernel holds the pages, not the mapping).
    unsafe { libc::munmap(p, len as usize) };
    r
}

/// Sets the sizes of the socket's fill, completion, RX and TX rings.
pub fn xsk_rings(xsk: BorrowedFd<'_>, size: u32) -> io::Result<()> {
    let n = size as i32;
    setsockopt(xsk, libc::SOL_XDP, libc::XDP_UMEM_FILL_RING, &n)?;
    setsockopt(xsk, libc::SOL_XDP, libc::XDP_UMEM_COMPLETION_RING, &n)?;
    setsockopt(xsk, libc::SOL_XDP, libc::XDP_RX_RING, &n)?;
    setsockopt(xsk, libc::SOL_XDP, libc::XDP_TX_RING, &n)
}

/// Binds `xsk` to queue `queue` of `ifindex`; `flags` is `XDP_COPY` or `XDP_ZEROCOPY`.
pub fn xsk_bind(xsk: BorrowedFd<'_>, ifindex: u32, queue: u32, flags: u16) -> io::Result<()> {
    // SAFETY: an all-zero sockaddr_xdp is valid; the fields are set below.
    let mut sa: libc::sockaddr_xdp = unsafe { std::mem::zeroed() };
    sa.sxdp_family = libc::AF_XDP as u16;
    sa.sxdp_ifindex = ifindex;
    sa.sxdp_queue_id = queue;
    sa.sxdp_flags = flags;
    // SAFETY: `sa` is a valid sockaddr_xdp of the size passed.
    let r = unsafe {
        libc::bind(
            xsk.as_raw_fd(),
            &sa as *const libc::sockaddr_xdp as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
        )
    };
    cvt(r as libc::c_long).map(drop)
}

/// The socket's drop counters: (dropped for want of fill-ring frames or RX space,
/// invalid fill descriptors).
pub fn xsk_stats(xsk: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    // SAFETY: an all-zero xdp_statistics is valid.
    let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
    // SAFETY: `st` is writable for `len` bytes; the kernel writes at most that.
    let r = unsafe {
        libc::getsockopt(
            xsk.as_raw_fd(),
            libc::SOL_XDP,
            libc::XDP_STATISTICS,
            &mut st as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    cvt(r as libc::c_long)?;
    Ok((st.rx_dropped + st.rx_ring_full, st.rx_invalid_descs))
}

/// One mapped ring of an AF_XDP socket: producer and consumer indices and `size`
/// entries of `T` (u64 frame addresses for fill/completion, `xdp_desc` for RX/TX).
pub struct Ring<T> {
    map: *mut libc::c_void,
    map_len: usize,
    prod: *const AtomicU32,
    cons: *const AtomicU32,
    desc: *mut T,
    mask: u32,
}

// SAFETY: the ring is a shared mapping owned by this value; only its owner (through
// `&mut self`) produces or consumes, and the indices are atomics.
unsafe impl<T> Send for Ring<T> {}

/// Which ring to map.
#[derive(Clone, Copy)]
pub enum RingKind {
    /// Frames given to the kernel for receiving.
    Fill,
    /// Frames received.
    Rx,
    /// Frames the kernel has sent, given back.
    Completion,
    /// Frames to send.
    Tx,
}

impl<T> Ring<T> {
    /// Maps ring `kind` of `xsk`, whose size is `size` (a power of two).
    pub fn map(xsk: BorrowedFd<'_>, kind: RingKind, size: u32) -> io::Result<Ring<T>> {
        // SAFETY: an all-zero xdp_mmap_offsets is valid.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off` is writable for `len` bytes.
        let r = unsafe {
            libc::getsockopt(
                xsk.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                &mut off as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        cvt(r as libc::c_long)?;
        let (o, pgoff) = match kind {
            RingKind::Fill => (off.fr, libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t),
            RingKind::Rx => (off.rx, libc::XDP_PGOFF_RX_RING),
            RingKind::Completion => (off.cr, libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t),
            RingKind::Tx => (off.tx, libc::XDP_PGOFF_TX_RING),
        };
        let map_len = o.desc as usize + size as usize * std::mem::size_of::<T>();
        // SAFETY: a fresh shared mapping of the socket's ring, placed by the kernel.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                xsk.as_raw_fd(),
                pgoff,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let at = |o: u64| (p as *mut u8).wrapping_add(o as usize);
        Ok(Ring {
            map: p,
            map_len,
            prod: at(o.producer) as *const AtomicU32,
            cons: at(o.consumer) as *const AtomicU32,
            desc: at(o.desc) as *mut T,
            mask: size - 1,
        })
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: inside the live mapping, 4-aligned (the kernel's layout); shared with
        // the kernel, hence atomic.
        unsafe { &*self.prod }
    }

    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as for `prod`.
        unsafe { &*self.cons }
    }
}

impl<T: Copy> Ring<T> {
    /// Free entries for the producer (us, on the fill and TX rings).
    pub fn free(&self) -> u32 {
        let size = self.mask + 1;
        let prod = self.prod().load(Ordering::Relaxed);
        let cons = self.cons().load(Ordering::Acquire);
        size - prod.wrapping_sub(cons)
    }

    /// Produces `addrs` (no more than [`free`](Self::free)).
    pub fn produce(&mut self, addrs: impl IntoIterator<Item = T>) {
        let mut prod = self.prod().load(Ordering::Relaxed);
        for a in addrs {
            // SAFETY: `prod & mask` indexes the ring's entries, which lie in the mapping;
            // the entry is ours until we publish the producer index (the caller produces
            // no more than `free`).
            unsafe { self.desc.add((prod & self.mask) as usize).write_volatile(a) };
            prod = prod.wrapping_add(1);
        }
        self.prod().store(prod, Ordering::Release);
    }
}

impl Ring<u64> {
    /// Takes up to `max` frame addresses the kernel gave back (completion ring).
    pub fn consume_addrs(&mut self, max: usize, out: &mut Vec<u64>) -> usize {
        let prod = self.prod().load(Ordering::Acquire);
        let mut cons = self.cons().load(Ordering::Relaxed);
        let mut n = 0;
        while cons != prod && n < max {
            // SAFETY: entries between consumer and producer are published by the kernel
            // (acquire above) and ours to read until we move the consumer index.
            out.push(unsafe { self.desc.add((cons & self.mask) as usize).read_volatile() });
            cons = cons.wrapping_add(1);
            n += 1;
        }
        self.cons().store(cons, Ordering::Release);
        n
    }
}

impl Ring<libc::xdp_desc> {
    /// Takes up to `max` received descriptors: (address in the UMEM, length).
    pub fn consume(&mut self, max: usize, out: &mut Vec<(u64, u32)>) -> usize {
        let prod = self.prod().load(Ordering::Acquire);
        let mut cons = self.cons().load(Ordering::Relaxed);
        let mut n = 0;
        while cons != prod && n < max {
            // SAFETY: entries between consumer and producer are published by the kernel
            // (acquire above) and ours to read until we move the consumer index.
            let d = unsafe { self.desc.add((cons & self.mask) as usize).read_volatile() };
            out.push((d.addr, d.len));
            cons = cons.wrapping_add(1);
            n += 1;
        }
        self.cons().store(cons, Ordering::Release);
        n
    }

    /// Whether the kernel has published descriptors we have not taken.
    pub fn ready(&self) -> bool {
        self.prod().load(Ordering::Acquire) != self.cons().load(Ordering::Relaxed)
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: our own mapping; nothing borrows it past `self`.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// Lends bytes `off..off + len` of the UMEM area as read-only data; see
/// [`ferry::AreaLender::lend`].
pub fn lend_frame(
    lender: &ferry::AreaLender,
    off: usize,
    len: usize,
    tag: u64,
) -> ferry::Result<ferry::IoData> {
    // SAFETY: the frame was just taken from the RX ring: the kernel has finished writing
    // it and gets it again only through the fill ring, to which the frame returns only
    // once the lender's sink is told it is released (`xsk::Returned`).
    unsafe { lender.lend(off, len, tag) }
}

/// A frame of the UMEM area to be filled and sent: writable only through this value,
/// which owns the frame from the TX free list until it is queued on the TX ring
/// ([`TxFrame::into_addr`]) or dropped (then it goes back to `back`).
pub struct TxFrame {
    ptr: std::ptr::NonNull<u8>,
    cap: usize,
    addr: u64,
    back: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    queued: bool,
    /// Keeps the area mapped and allocated.
    _keep: ferry::AreaLender,
}

// SAFETY: the frame's bytes are this value's alone (see `TxFrame::new`); the pointer is
// into the lot mapping, valid in every thread.
unsafe impl Send for TxFrame {}

impl TxFrame {
    /// The frame at `addr` (`cap` bytes) of the area whose first byte is `base`, kept by
    /// `keep`. Only `xsk::XskTx` calls this, for a frame it takes off its free list: a
    /// frame no ring holds and of which nothing is lent, so this value is its only user.
    pub fn new(
        keep: &ferry::AreaLender,
        base: usize,
        addr: u64,
        cap: usize,
        back: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    ) -> TxFrame {
        TxFrame {
            ptr: std::ptr::NonNull::new((base + addr as usize) as *mut u8).expect("non-null"),
            cap,
            addr,
            back,
            queued: false,
            _keep: keep.clone(),
        }
    }

    /// The frame's bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `cap` bytes in the area (XskTx hands out whole frames of it), which
        // `_keep` holds mapped; exclusively ours (see `new`), borrowed mutably from `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// The frame's address in the UMEM, giving up access to it (it goes on the TX ring).
    pub fn into_addr(mut self) -> u64 {
        self.queued = true;
        self.addr
    }
}

impl Drop for TxFrame {
    fn drop(&mut self) {
        if !self.queued {
            self.back
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(self.addr);
        }
    }
}

/// The hardware (MAC) address and the IPv4 address of interface `name` in the calling
/// thread's network namespace (no address: `0.0.0.0`).
pub fn if_addrs(name: &str) -> io::Result<([u8; 6], std::net::Ipv4Addr)> {
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )
    .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))?;
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let ask = |req: libc::c_ulong| -> io::Result<libc::ifreq> {
        // SAFETY: an all-zero ifreq is valid.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, &b) in ifr.ifr_name.iter_mut().zip(bytes) {
            *d = b as libc::c_char;
        }
        // SAFETY: `ifr` is a valid, writable ifreq for these two requests.
        let r = unsafe { libc::ioctl(sock.as_raw_fd(), req as _, &mut ifr) };
        cvt(r as libc::c_long).map(|_| ifr)
    };
    let hw = ask(libc::SIOCGIFHWADDR)?;
    // SAFETY: SIOCGIFHWADDR filled the `ifru_hwaddr` member.
    let sa = unsafe { hw.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (m, &b) in mac.iter_mut().zip(sa.sa_data.iter()) {
        *m = b as u8;
    }
    let ip = match ask(libc::SIOCGIFADDR) {
        Ok(a) => {
            // SAFETY: SIOCGIFADDR filled `ifru_addr` with a sockaddr_in (AF_INET).
            let sin: libc::sockaddr_in = unsafe {
                std::ptr::read_unaligned(
                    &a.ifr_ifru.ifru_addr as *const libc::sockaddr as *const libc::sockaddr_in,
                )
            };
            std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))
        }
        Err(_) => std::net::Ipv4Addr::UNSPECIFIED,
    };
    Ok((mac, ip))
}

/// `recvmmsg` into `bufs` (one datagram each); returns the lengths received.
pub fn recvmmsg(
    fd: BorrowedFd<'_>,
    bufs: &mut [&mut [u8]],
    lens: &mut Vec<usize>,
) -> io::Result<usize> {
    let n = bufs.len().min(64);
    let mut iov: [libc::iovec; 64] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 64];
    // SAFETY: an all-zero mmsghdr is valid (no name, no control).
    let mut msgs: [libc::mmsghdr; 64] = unsafe { std::mem::zeroed() };
    for i in 0..n {
        iov[i].iov_base = bufs[i].as_mut_ptr() as *mut libc::c_void;
        iov[i].iov_len = bufs[i].len();
        msgs[i].msg_hdr.msg_iov = &mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: every header points at one iovec over a live, writable buffer borrowed
    // mutably for this call.
    let r = unsafe {
        libc::recvmmsg(
            fd.as_raw_fd(),
            msgs.as_mut_ptr(),
            n as u32,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    let r = cvt(r as libc::c_long)? as usize;
    lens.clear();
    lens.extend(msgs[..r].iter().map(|m| m.msg_len as usize));
    Ok(r)
}

/// The index of interface `name`.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c =
        std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated string that lives across the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(i)
    }
}

/// Receives on a UDP socket with io_uring: `depth` receive requests kept in flight, each
/// into its own fbuf of the lot, reaped in batches.
#[cfg(feature = "uring")]
pub struct UringRecv {
    ring: io_uring::IoUring,
    /// Declared after the ring and dropped after the requests are cancelled (`Drop`).
    sock: std::net::UdpSocket,
    /// The buffer each slot's request receives into (`None`: no request in flight).
    slots: Vec<Option<ferry::IoDataMut>>,
    buf_len: usize,
}

#[cfg(feature = "uring")]
impl UringRecv {
    /// A ring of `depth` requests on `sock`, each into a buffer of `buf_len` bytes.
    pub fn new(sock: std::net::UdpSocket, depth: usize, buf_len: usize) -> io::Result<UringRecv> {
        let ring = io_uring::IoUring::new((depth as u32).next_power_of_two())?;
        Ok(UringRecv {
            ring,
            sock,
            slots: (0..depth).map(|_| None).collect(),
            buf_len,
        })
    }

    /// Puts a request in flight for every idle slot, with a fresh fbuf of `path`.
    fn arm(&mut self, path: &ferry::PathAllocator) -> io::Result<()> {
        use io_uring::{opcode, types};
        let fd = types::Fd(self.sock.as_raw_fd());
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            let mut b = path
                .alloc(self.buf_len)
                .map_err(|e| io::Error::other(format!("fbuf: {e}")))?;
            let (ptr, len) = {
                let f = b.fragments_mut().next().expect("one fragment");
                (f.as_mut_ptr(), f.len())
            };
            let sqe = opcode::Recv::new(fd, ptr, len as u32)
                .build()
                .user_data(i as u64);
            // SAFETY: the buffer is an fbuf of the lot that `slots[i]` owns until the
            // request's completion is reaped (or, at drop, cancelled and reaped): its
            // memory stays valid and is written by nothing else meanwhile.
            if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                break;
            }
            *slot = Some(b);
        }
        Ok(())
    }

    /// Receives up to `max` datagrams into `out`, waiting up to `timeout` for the first
    /// (`None`: for ever).
    pub fn recv(
        &mut self,
        path: &ferry::PathAllocator,
        out: &mut Vec<ferry::IoData>,
        max: usize,
        timeout: Option<std::time::Duration>,
    ) -> io::Result<usize> {
        self.arm(path)?;
        let ready = self.ring.completion().len();
        let r = if ready > 0 || timeout == Some(std::time::Duration::ZERO) {
            self.ring.submit()
        } else if let Some(t) = timeout {
            let ts = io_uring::types::Timespec::new()
                .sec(t.as_secs())
                .nsec(t.subsec_nanos());
            let args = io_uring::types::SubmitArgs::new().timespec(&ts);
            self.ring.submitter().submit_with_args(1, &args)
        } else {
            self.ring.submit_and_wait(1)
        };
        match r {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                ) => {}
            Err(e) => return Err(e),
        }
        let mut n = 0;
        let mut err = None;
        let mut cq = self.ring.completion();
        while n < max {
            let Some(c) = cq.next() else { break };
            let slot = &mut self.slots[c.user_data() as usize];
            let Some(mut b) = slot.take() else { continue };
            match c.result() {
                r if r >= 0 => {
                    b.truncate(r as usize);
                    out.push(b.freeze());
                    n += 1;
                }
                r if r == -libc::EAGAIN || r == -libc::EINTR => {}
                r => err = Some(io::Error::from_raw_os_error(-r)),
            }
        }
        drop(cq);
        match err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }
}

#[cfg(feature = "uring")]
impl Drop for UringRecv {
    fn drop(&mut self) {
        use io_uring::{opcode, types};
        // Every request in flight is cancelled and its completion reaped before the
        // buffers go back to the path: the kernel must not write them afterwards.
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(u64::MAX);
        // SAFETY: a cancel request carries no buffer.
        let _ = unsafe { self.ring.submission().push(&cancel) };
        let t0 = std::time::Instant::now();
        while self.slots.iter().any(Option::is_some)
            && t0.elapsed() < std::time::Duration::from_secs(5)
        {
            let ts = io_uring::types::Timespec::new().nsec(10_000_000);
            let args = io_uring::types::SubmitArgs::new().timespec(&ts);
            let _ = self.ring.submitter().submit_with_args(1, &args);
            for c in self.ring.completion() {
                if let Some(s) = self.slots.get_mut(c.user_data() as usize) {
                    *s = None;
                }
            }
        }
        // Requests that did not complete in time keep their buffers: leaked out of the
        // path rather than handed to someone else while the kernel may write them.
        for s in &mut self.slots {
            if let Some(b) = s.take() {
                std::mem::forget(b);
            }
        }
    }
}
