//! The C ABI of ferry.
//!
//! Every object is an opaque handle created by a `ferry_*_open`/`_join`/`_alloc`/...
//! call and destroyed by exactly one matching `_close`/`_release`/`_freeze`/`_discard`
//! call. Fallible calls return a status ([`FERRY_OK`] or a negative `FERRY_E*` code) and
//! write their result through an out-pointer only on success; [`ferry_last_error`] gives
//! the message of the calling thread's last failure. The header `include/ferry.h` is
//! generated from this file by cbindgen (see `build.rs`); the ownership rules below are
//! repeated there.
//!
//! # Ownership rules (also in the header)
//!
//! - A handle is owned by the caller until passed to its destroying call; passing it to
//!   any call afterwards is undefined behaviour. Destroying calls accept NULL.
//! - Handles may be destroyed in any order: a message keeps alive what it needs (the
//!   mapping of a peer's lot, the group) however long it is held, even after its
//!   channel, domain and group handles are closed, and even after the peer died.
//! - Pointers returned by [`ferry_buf_data`] are valid, and writable, until the buffer
//!   is frozen or discarded. Pointers returned by [`ferry_msg_fragment`] are valid,
//!   read-only, until the message is released; in a receiver the pages are mapped
//!   read-only, so writing through them faults.
//! - `ferry_send` and `ferry_publish` do not take the message: the caller still
//!   releases it (the fbuf returns to its path once every holder released it).
//! - A loan ([`ferry_sender_loan`], [`ferry_publisher_loan`]) is destroyed by
//!   [`ferry_loan_send`] or [`ferry_loan_discard`]. It borrows its sender or publisher:
//!   end it before closing that handle, on the thread that took it, and make no other
//!   call on that sender or publisher meanwhile (a sender's loan holds the sender's
//!   lock: such a call would wait for ever). [`ferry_loan_data`] is writable until then.
//! - A handle may be used from any thread, but not from two threads at once.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr};
use std::ptr;
use std::time::{Duration, Instant};

use ferry::{
    DomainId, Error, IoData, IoDataMut, PathAllocator, PathConfig, Publisher, Receiver, Sender,
    ServiceConfig, SlowSubscriber, Subscriber,
};

/// The deadline `timeout_ms` from now (< 0: none).
fn deadline(timeout_ms: i64) -> Option<Instant> {
    timeout(timeout_ms).and_then(|d| Instant::now().checked_add(d))
}

/// Success.
pub const FERRY_OK: c_int = 0;
/// A receive with timeout 0 found no message waiting.
pub const FERRY_EMPTY: c_int = 1;
/// A system call failed (see `ferry_last_error`).
pub const FERRY_EIO: c_int = -1;
/// An argument was NULL, not UTF-8 or out of range.
pub const FERRY_EINVAL: c_int = -2;
/// The peer process died.
pub const FERRY_EPEER_GONE: c_int = -3;
/// The peer closed its end.
pub const FERRY_EDISCONNECTED: c_int = -4;
/// The path's quota is used up: receivers hold its fbufs.
pub const FERRY_EQUOTA: c_int = -5;
/// The timeout expired.
pub const FERRY_ETIMEOUT: c_int = -6;
/// The ring is full (non-blocking send).
pub const FERRY_EFULL: c_int = -7;
/// The peer wrote a descriptor that failed validation.
pub const FERRY_EBAD_DESCRIPTOR: c_int = -8;
/// No live domain offers the named service.
pub const FERRY_ENO_SUCH_SERVICE: c_int = -9;
/// The named service is already offered.
pub const FERRY_ESERVICE_EXISTS: c_int = -10;
/// More descriptors than one message carries (`FERRY_MAX_FDS`), or than the caller's
/// array holds.
pub const FERRY_ETOO_MANY_FDS: c_int = -11;
/// A received message carried a descriptor of a kind the receiver did not accept.
pub const FERRY_EFD_REFUSED: c_int = -12;
/// The sender died before the message's descriptors were taken.
pub const FERRY_EFDS_LOST: c_int = -13;
/// Any other error (see `ferry_last_error`).
pub const FERRY_EOTHER: c_int = -100;

/// Most descriptors one message carries (`ferry::MAX_FDS`; a test checks they agree).
pub const FERRY_MAX_FDS: usize = 64;
/// Descriptor kinds, as `ferry_fd_kind` returns them and as a mask of accepted kinds in
/// `ferry_recv_fds` (0 there: every kind but `FERRY_FD_OTHER`).
pub const FERRY_FD_MEMFD: u32 = 1;
/// A dma-buf (opaque to ferry).
pub const FERRY_FD_DMABUF: u32 = 2;
/// A sync_file fence.
pub const FERRY_FD_SYNC_FILE: u32 = 4;
/// An eventfd.
pub const FERRY_FD_EVENTFD: u32 = 8;
/// A pipe or FIFO end.
pub const FERRY_FD_PIPE: u32 = 16;
/// A socket.
pub const FERRY_FD_SOCKET: u32 = 32;
/// Anything else (a regular file, a directory, a device, a pidfd, ...).
pub const FERRY_FD_OTHER: u32 = 64;

const FD_KINDS: [(u32, ferry::FdKind); 7] = [
    (FERRY_FD_MEMFD, ferry::FdKind::Memfd),
    (FERRY_FD_DMABUF, ferry::FdKind::DmaBuf),
    (FERRY_FD_SYNC_FILE, ferry::FdKind::SyncFile),
    (FERRY_FD_EVENTFD, ferry::FdKind::EventFd),
    (FERRY_FD_PIPE, ferry::FdKind::Pipe),
    (FERRY_FD_SOCKET, ferry::FdKind::Socket),
    (FERRY_FD_OTHER, ferry::FdKind::Other),
];

/// An open group (`/dev/shm/ferry.<name>`).
pub struct FerryGroup(std::sync::Arc<ferry::Group>);
/// This process's membership of a group.
pub struct FerryDomain(ferry::Domain);
/// A per-path fbuf allocator.
pub struct FerryPath(PathAllocator);
/// An fbuf in its write phase.
pub struct FerryBuf(IoDataMut);
/// An immutable message of one or more read-only fragments.
pub struct FerryMsg(IoData);
/// The sending end of a channel.
pub struct FerrySender(Sender);
/// The receiving end of a channel.
pub struct FerryReceiver(Receiver);
/// The publishing end of a named publish-subscribe service.
pub struct FerryPublisher(Publisher);
/// The subscribing end of a named publish-subscribe service.
pub struct FerrySubscriber(Subscriber);
/// A message being written in place for a sender or a publisher, sent by
/// `ferry_loan_send` or given back by `ferry_loan_discard`.
pub struct FerryLoan(LoanOf);

/// What a loan was taken on. The lifetimes are the C caller's promise: a loan ends
/// before its sender or publisher is closed (see the ownership rules).
enum LoanOf {
    Sender(ferry::Loan<'static>),
    Publisher(ferry::PublisherLoan<'static>),
}

thread_local! {
    static LAST_ERROR: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn set_error(msg: String) {
    LAST_ERROR.with(|e| {
        let mut e = e.borrow_mut();
        e.clear();
        e.extend(msg.bytes().filter(|&b| b != 0));
        e.push(0);
    });
}

fn code(e: Error) -> c_int {
    set_error(e.to_string());
    match e {
        Error::Io(_) => FERRY_EIO,
        Error::InvalidArgument(_) => FERRY_EINVAL,
        Error::PeerGone { .. } => FERRY_EPEER_GONE,
        Error::Disconnected => FERRY_EDISCONNECTED,
        Error::QuotaExceeded { .. } => FERRY_EQUOTA,
        // No release can make room for it: the caller's argument is at fault.
        Error::MessageTooLarge { .. } => FERRY_EINVAL,
        Error::Timeout => FERRY_ETIMEOUT,
        Error::Full => FERRY_EFULL,
        Error::BadDescriptor(_) => FERRY_EBAD_DESCRIPTOR,
        Error::TooManyFds { .. } => FERRY_ETOO_MANY_FDS,
        Error::FdRefused { .. } => FERRY_EFD_REFUSED,
        Error::FdsLost { .. } => FERRY_EFDS_LOST,
        Error::NoSuchService { .. } => FERRY_ENO_SUCH_SERVICE,
        Error::ServiceExists { .. } => FERRY_ESERVICE_EXISTS,
        _ => FERRY_EOTHER,
    }
}

fn einval(what: &str) -> c_int {
    set_error(format!("invalid argument: {what}"));
    FERRY_EINVAL
}

/// `timeout_ms` < 0 means no limit.
fn timeout(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// The handshakes and service opening take a finite timeout; "no limit" is a day.
fn finite(ms: i64) -> Duration {
    timeout(ms).unwrap_or(Duration::from_secs(86_400))
}

/// Stores `value` boxed in `*out`.
///
/// # Safety
/// `out` is NULL or valid for a write of a pointer.
unsafe fn put<T>(out: *mut *mut T, value: T) -> c_int {
    if out.is_null() {
        return einval("NULL out-pointer");
    }
    // SAFETY: non-null, and the caller vouches that it is writable.
    unsafe { out.write(Box::into_raw(Box::new(value))) };
    FERRY_OK
}

/// The handle behind `p`.
///
/// # Safety
/// `p` is NULL or a live handle of type `T` that no other thread uses now.
unsafe fn handle<'a, T>(p: *mut T) -> Result<&'a mut T, c_int> {
    // SAFETY: the caller vouches for liveness and exclusive use.
    unsafe { p.as_mut() }.ok_or_else(|| einval("NULL handle"))
}

/// A UTF-8 string argument.
///
/// # Safety
/// `s` is NULL or a NUL-terminated string valid for reads.
unsafe fn string<'a>(s: *const c_char) -> Result<&'a str, c_int> {
    if s.is_null() {
        return Err(einval("NULL string"));
    }
    // SAFETY: non-null and NUL-terminated, as the caller vouches.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| einval("string is not UTF-8"))
}

/// Destroys a boxed handle.
///
/// # Safety
/// `p` is NULL or a live handle of type `T`, not used afterwards.
unsafe fn destroy<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: made by `put` with Box::into_raw; the caller gives it up.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// Runs `f` on the handle, turning errors into status codes.
macro_rules! with {
    ($p:expr, |$h:ident| $body:expr) => {{
        // SAFETY: the caller of the exported function vouches for the handle (see the
        // ownership rules).
        match unsafe { handle($p) } {
            Ok($h) => match $body {
                Ok(()) => FERRY_OK,
                Err(e) => code(e),
            },
            Err(c) => c,
        }
    }};
}

/// Runs `make` on the handle behind `p` and stores its result, wrapped by `wrap`, in
/// `*out`; a failure becomes a status code.
///
/// # Safety
/// `p` is NULL or a live handle of type `H` that no other thread uses now; `out` is NULL
/// or valid for a write of a pointer.
unsafe fn create<H, T, U>(
    p: *mut H,
    out: *mut *mut U,
    make: impl FnOnce(&mut H) -> ferry::Result<T>,
    wrap: impl FnOnce(T) -> U,
) -> c_int {
    // SAFETY: as the caller vouches.
    match unsafe { handle(p) }.map(make) {
        // SAFETY: `out` is NULL or writable, as the caller vouches.
        Ok(Ok(x)) => unsafe { put(out, wrap(x)) },
        Ok(Err(e)) => code(e),
        Err(c) => c,
    }
}

/// A handle that receives messages: a channel's receiver or a subscriber.
trait Recv {
    fn try_recv(&mut self) -> ferry::Result<Option<IoData>>;
    fn recv_timeout(&mut self, limit: Duration) -> ferry::Result<IoData>;
    fn recv(&mut self) -> ferry::Result<IoData>;
}

macro_rules! impl_recv {
    ($($t:ty),*) => {$(
        impl Recv for $t {
            fn try_recv(&mut self) -> ferry::Result<Option<IoData>> {
                self.0.try_recv()
            }
            fn recv_timeout(&mut self, limit: Duration) -> ferry::Result<IoData> {
                self.0.recv_timeout(limit)
            }
            fn recv(&mut self) -> ferry::Result<IoData> {
                self.0.recv()
            }
        }
    )*};
}
impl_recv!(FerryReceiver, FerrySubscriber);

/// Receives the next message on `h`, waiting at most `timeout_ms` (< 0: no limit; 0: do
/// not wait, `FERRY_EMPTY` if none); `*out` receives it.
///
/// # Safety
/// `h` is NULL or a live handle no other thread uses now; `out` is NULL or writable.
unsafe fn receive<H: Recv>(h: *mut H, timeout_ms: i64, out: *mut *mut FerryMsg) -> c_int {
    let limit = timeout(timeout_ms);
    // SAFETY: as the caller vouches.
    let got = unsafe { handle(h) }.map(|h| match limit {
        Some(Duration::ZERO) => h.try_recv(),
        Some(d) => h.recv_timeout(d).map(Some),
        None => h.recv().map(Some),
    });
    match got {
        // SAFETY: `out` is NULL or writable, as the caller vouches.
        Ok(Ok(Some(d))) => unsafe { put(out, FerryMsg(d)) },
        Ok(Ok(None)) => FERRY_EMPTY,
        Ok(Err(e)) => code(e),
        Err(c) => c,
    }
}

/// The message of the calling thread's last failed call (NUL-terminated, valid until
/// the thread's next failing call), or an empty string.
#[no_mangle]
pub extern "C" fn ferry_last_error() -> *const c_char {
    LAST_ERROR.with(|e| {
        let mut e = e.borrow_mut();
        if e.is_empty() {
            e.push(0);
        }
        e.as_ptr().cast()
    })
}

/// Opens (creating if needed) the group `name`; `*out` receives the handle.
///
/// # Safety
/// `name` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_group_open(name: *const c_char, out: *mut *mut FerryGroup) -> c_int {
    // SAFETY: as the caller vouches.
    let name = match unsafe { string(name) } {
        Ok(n) => n,
        Err(c) => return c,
    };
    match ferry::Group::open(name) {
        // SAFETY: `out` is writable, as the caller vouches.
        Ok(g) => unsafe { put(out, FerryGroup(g)) },
        Err(e) => code(e),
    }
}

/// Closes a group handle (NULL is ignored). Domains and messages keep the group open.
///
/// # Safety
/// `group` is NULL or a live group handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferry_group_close(group: *mut FerryGroup) {
    // SAFETY: as the caller vouches.
    unsafe { destroy(group) }
}

/// Joins the group: claims a slot and creates this process's lot.
///
/// # Safety
/// `group` is a live group handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_group_join(
    group: *mut FerryGroup,
    out: *mut *mut FerryDomain,
) -> c_int {
    // SAFETY: as the caller vouches.
    unsafe { create(group, out, |g| g.0.join(), FerryDomain) }
}

/// Closes a domain handle (NULL is ignored).
///
/// # Safety
/// `domain` is NULL or a live domain handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferry_domain_close(domain: *mut FerryDomain) {
    // SAFETY: as the caller vouches.
    unsafe { destroy(domain) }
}

/// Writes the domain's id (`"SLOT.GENERATION"`, NUL-terminated) into `buf` of `len`
/// bytes (32 is always enough).
///
/// # Safety
/// `domain` is a live domain handle; `buf` is writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferry_domain_id(
    domain: *mut FerryDomain,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    // SAFETY: as the caller vouches.
    let d = match unsafe { handle(domain) } {
        Ok(d) => d,
        Err(c) => return c,
    };
    let id = d.0.id().to_string();
    if buf.is_null() || len < id.len() + 1 {
        return einval("id buffer is NULL or too short");
    }
    // SAFETY: `buf` holds `len` >= id.len() + 1 writable bytes, as the caller vouches.
    unsafe {
        ptr::copy_nonoverlapping(id.as_ptr(), buf.cast::<u8>(), id.len());
        buf.add(id.len()).write(0);
    }
    FERRY_OK
}

/// A new path allocator on the domain's lot. `quota` bounds the bytes the path may
/// have out at once (0: the default, 512 MiB).
///
/// # Safety
/// `domain` is a live domain handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_domain_path(
    domain: *mut FerryDomain,
    quota: usize,
    out: *mut *mut FerryPath,
) -> c_int {
    let mut config = PathConfig::default();
    if quota > 0 {
        config.quota = quota;
    }
    // SAFETY: as the caller vouches.
    unsafe { create(domain, out, |d| d.0.path(config), FerryPath) }
}

/// Closes a path handle (NULL is ignored); fbufs still out return to the lot later.
///
/// # Safety
/// `path` is NULL or a live path handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferry_path_close(path: *mut FerryPath) {
    // SAFETY: as the caller vouches.
    unsafe { destroy(path) }
}

/// Bytes allocated on the path and not yet returned (0 for NULL).
///
/// # Safety
/// `path` is NULL or a live path handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_path_outstanding(path: *mut FerryPath) -> usize {
    // SAFETY: as the caller vouches.
    unsafe { handle(path) }.map_or(0, |p| p.0.outstanding())
}

/// Allocates an fbuf of `len` bytes in its write phase: fill it through
/// `ferry_buf_data`, then `ferry_buf_freeze` it.
///
/// # Safety
/// `path` is a live path handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_path_alloc(
    path: *mut FerryPath,
    len: usize,
    out: *mut *mut FerryBuf,
) -> c_int {
    // SAFETY: as the caller vouches.
    unsafe { create(path, out, |p| p.0.alloc(len), FerryBuf) }
}

/// The writable bytes of a buffer (`ferry_buf_len` of them), valid until the buffer is
/// frozen or discarded. NULL for an empty buffer.
///
/// # Safety
/// `buf` is a live buffer handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_buf_data(buf: *mut FerryBuf) -> *mut u8 {
    // SAFETY: as the caller vouches.
    match unsafe { handle(buf) } {
        Ok(b) => {
            b.0.fragments_mut()
                .next()
                .map_or(ptr::null_mut(), |f| f.as_mut_ptr())
        }
        Err(_) => ptr::null_mut(),
    }
}

/// Length of a buffer in bytes.
///
/// # Safety
/// `buf` is a live buffer handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_buf_len(buf: *mut FerryBuf) -> usize {
    // SAFETY: as the caller vouches.
    unsafe { handle(buf) }.map_or(0, |b| b.0.len())
}

/// Ends the write phase: consumes `buf` and returns a message over the same pages
/// (NULL if `buf` is NULL). Pointers from `ferry_buf_data` must not be used afterwards.
///
/// # Safety
/// `buf` is NULL or a live buffer handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferry_buf_freeze(buf: *mut FerryBuf) -> *mut FerryMsg {
    if buf.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: made by `put`; the caller gives it up.
    let b = unsafe { Box::from_raw(buf) };
    Box::into_raw(Box::new(FerryMsg(b.0.freeze())))
}

/// Gives a buffer back unsent (NULL is ignored).
///
/// # Safety
/// `buf` is NULL or a live buffer handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferry_buf_discard(buf: *mut FerryBuf) {
    // SAFETY: as the caller vouches.
    unsafe { destroy(buf) }
}

/// Total length of a message in bytes.
///
/// # Safety
/// `msg` is a live message handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_msg_len(msg: *mut FerryMsg) -> usize {
    // SAFETY: as the caller vouches.
    unsafe { handle(msg) }.map_or(0, |m| m.0.len())
}

/// Number of fragments of a message.
///
/// # Safety
/// `msg` is a live message handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_msg_fragment_count(msg: *mut FerryMsg) -> usize {
    // SAFETY: as the caller vouches.
    unsafe { handle(msg) }.map_or(0, |m| m.0.num_fragments())
}

/// Fragment `index` of a message: `*data` and `*len` receive its read-only bytes, valid
/// until the message is released.
///
/// # Safety
/// `msg` is a live message handle; `data` and `len` are writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_msg_fragment(
    msg: *mut FerryMsg,
    index: usize,
    data: *mut *const u8,
    len: *mut usize,
) -> c_int {
    // SAFETY: as the caller vouches.
    let m = match unsafe { handle(msg) } {
        Ok(m) => m,
        Err(c) => return c,
    };
    let Some(f) = m.0.fragments().get(index) else {
        return einval("fragment index out of range");
    };
    if data.is_null() || len.is_null() {
        return einval("NULL out-pointer");
    }
    // SAFETY: both non-null and writable, as the caller vouches.
    unsafe {
        data.write(f.as_slice().as_ptr());
        len.write(f.len());
    }
    FERRY_OK
}

/// Copies the message into `dst` of `cap` bytes (an explicit copy); returns the bytes
/// copied, or a negative status if `cap` is too small.
///
/// # Safety
/// `msg` is a live message handle; `dst` is writable for `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferry_msg_copy(msg: *mut FerryMsg, dst: *mut u8, cap: usize) -> i64 {
    // SAFETY: as the caller vouches.
    let m = match unsafe { handle(msg) } {
        Ok(m) => m,
        Err(c) => return c.into(),
    };
    let n = m.0.len();
    if n > cap || (dst.is_null() && n > 0) {
        return einval("destination too small").into();
    }
    if n > 0 {
        // SAFETY: `dst` is non-null and writable for `cap` >= n bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(dst, n) };
        m.0.copy_range_to_slice(.., out);
    }
    n as i64
}

/// Releases a message (NULL is ignored): its fbufs go back once no one else holds them.
///
/// # Safety
/// `msg` is NULL or a live message handle, not used afterwards (nor pointers into it).
#[no_mangle]
pub unsafe extern "C" fn ferry_msg_release(msg: *mut FerryMsg) {
    // SAFETY: as the caller vouches.
    unsafe { destroy(msg) }
}

/// Opens a channel to the domain `peer` (`"SLOT.GENERATION"`), which must be in
/// `ferry_domain_accept`; waits at most `timeout_ms` (< 0: a day).
///
/// # Safety
/// `domain` is a live domain handle; `peer` a NUL-terminated string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_domain_connect(
    domain: *mut FerryDomain,
    peer: *const c_char,
    timeout_ms: i64,
    out: *mut *mut FerrySender,
) -> c_int {
    // SAFETY: as the caller vouches.
    let peer: DomainId = match unsafe { string(peer) }.map(str::parse) {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return code(e),
        Err(c) => return c,
    };
    // SAFETY: as the caller vouches.
    unsafe {
        create(
            domain,
            out,
            |d| d.0.connect(peer, finite(timeout_ms)),
            FerrySender,
        )
    }
}

/// Waits at most `timeout_ms` (< 0: a day) for a peer to connect.
///
/// # Safety
/// `domain` is a live domain handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_domain_accept(
    domain: *mut FerryDomain,
    timeout_ms: i64,
    out: *mut *mut FerryReceiver,
) -> c_int {
    // SAFETY: as the caller vouches.
    unsafe {
        create(
            domain,
            out,
            |d| d.0.accept(finite(timeout_ms)),
            FerryReceiver,
        )
    }
}

/// Sends `msg` (which stays the caller's), waiting at most `timeout_ms` for room
/// (< 0: no limit; 0: do not wait, `FERRY_EFULL` if full).
///
/// # Safety
/// `tx` is a live sender handle; `msg` a live message handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_send(
    tx: *mut FerrySender,
    msg: *mut FerryMsg,
    timeout_ms: i64,
) -> c_int {
    // SAFETY: as the caller vouches.
    let m = match unsafe { handle(msg) } {
        Ok(m) => m.0.clone(),
        Err(c) => return c,
    };
    with!(tx, |t| match timeout(timeout_ms) {
        Some(Duration::ZERO) => t.0.try_send(&m),
        Some(d) => t.0.send_timeout(&m, d),
        None => t.0.send(&m),
    })
}

/// The caller's descriptors `fds[0..nfds]`, borrowed for one call.
///
/// # Safety
/// `fds` is NULL with `nfds` 0, or points to `nfds` descriptors open for the whole call.
unsafe fn borrowed_fds<'a>(
    fds: *const c_int,
    nfds: usize,
) -> Result<Vec<std::os::fd::BorrowedFd<'a>>, c_int> {
    if nfds == 0 {
        return Ok(Vec::new());
    }
    if fds.is_null() {
        return Err(einval("NULL descriptor array"));
    }
    // SAFETY: `nfds` readable ints, as the caller vouches.
    let raw = unsafe { std::slice::from_raw_parts(fds, nfds) };
    raw.iter()
        .map(|&n| {
            if n < 0 {
                return Err(einval("negative descriptor"));
            }
            // SAFETY: open for the whole call, as the caller vouches.
            Ok(unsafe { std::os::fd::BorrowedFd::borrow_raw(n) })
        })
        .collect()
}

/// Like `ferry_send`, with `fds[0..nfds]` as cargo: the receiver gets its own
/// duplicates (`ferry_recv_fds`); the caller keeps its descriptors. At most
/// `FERRY_MAX_FDS` (`FERRY_ETOO_MANY_FDS`).
///
/// # Safety
/// `tx` is a live sender handle; `msg` a live message handle; `fds` as `nfds` open
/// descriptors (NULL if `nfds` is 0).
#[no_mangle]
pub unsafe extern "C" fn ferry_send_fds(
    tx: *mut FerrySender,
    msg: *mut FerryMsg,
    fds: *const c_int,
    nfds: usize,
    timeout_ms: i64,
) -> c_int {
    // SAFETY: as the caller vouches.
    let m = match unsafe { handle(msg) } {
        Ok(m) => m.0.clone(),
        Err(c) => return c,
    };
    // SAFETY: as the caller vouches.
    let fds = match unsafe { borrowed_fds(fds, nfds) } {
        Ok(f) => f,
        Err(c) => return c,
    };
    with!(tx, |t| match timeout(timeout_ms) {
        Some(Duration::ZERO) => t.0.try_send_with_fds(&m, &fds),
        _ => t.0.send_with_fds_until(&m, &fds, deadline(timeout_ms)),
    })
}

/// The kinds mask `kinds` (0: the default) as `FdKinds`.
fn fd_kinds(kinds: u32) -> Result<ferry::FdKinds, c_int> {
    if kinds == 0 {
        return Ok(ferry::FdKinds::default());
    }
    if kinds & !0x7f != 0 {
        return Err(einval("unknown descriptor kind bits"));
    }
    let mut out: Option<ferry::FdKinds> = None;
    for (bit, k) in FD_KINDS {
        if kinds & bit != 0 {
            out = Some(out.map_or(ferry::FdKinds::only(k), |o| o.with(k)));
        }
    }
    Ok(out.expect("a non-zero mask names a kind"))
}

/// What receives messages with descriptors: a channel's receiver or a subscriber.
trait RecvFds {
    fn set_fd_kinds(&mut self, kinds: ferry::FdKinds);
    fn try_recv_with_fds(&mut self) -> ferry::Result<Option<(IoData, ferry::Fds)>>;
    fn recv_with_fds_timeout(&mut self, limit: Duration) -> ferry::Result<(IoData, ferry::Fds)>;
    fn recv_with_fds(&mut self) -> ferry::Result<(IoData, ferry::Fds)> {
        loop {
            match self.recv_with_fds_timeout(Duration::from_secs(86_400)) {
                Err(Error::Timeout) => {}
                other => return other,
            }
        }
    }
}

macro_rules! impl_recv_fds {
    ($($t:ty),*) => {$(
        impl RecvFds for $t {
            fn set_fd_kinds(&mut self, kinds: ferry::FdKinds) {
                <$t>::set_fd_kinds(self, kinds)
            }
            fn try_recv_with_fds(&mut self) -> ferry::Result<Option<(IoData, ferry::Fds)>> {
                <$t>::try_recv_with_fds(self)
            }
            fn recv_with_fds_timeout(
                &mut self,
                limit: Duration,
            ) -> ferry::Result<(IoData, ferry::Fds)> {
                <$t>::recv_with_fds_timeout(self, limit)
            }
        }
    )*};
}
impl_recv_fds!(Receiver, Subscriber);

/// Receives `rx`'s next message with its descriptors, as `receive`; the descriptors go
/// to `fds` (the caller's to close) and their count to `*nfds`.
///
/// # Safety
/// As `receive`; `fds` is writable for `cap` ints; `nfds` is writable.
unsafe fn receive_fds(
    rx: &mut impl RecvFds,
    timeout_ms: i64,
    kinds: u32,
    out: *mut *mut FerryMsg,
    fds: *mut c_int,
    cap: usize,
    nfds: *mut usize,
) -> c_int {
    use std::os::fd::IntoRawFd;
    if nfds.is_null() || (cap > 0 && fds.is_null()) {
        return einval("NULL descriptor array or count");
    }
    let kinds = match fd_kinds(kinds) {
        Ok(k) => k,
        Err(c) => return c,
    };
    rx.set_fd_kinds(kinds);
    let got = match timeout(timeout_ms) {
        Some(Duration::ZERO) => rx.try_recv_with_fds(),
        Some(d) => rx.recv_with_fds_timeout(d).map(Some),
        None => rx.recv_with_fds().map(Some),
    };
    match got {
        Ok(Some((d, f))) => {
            if f.len() > cap {
                // Closed with `f`; the message goes too.
                return code(Error::TooManyFds {
                    count: f.len(),
                    max: cap,
                });
            }
            let all = f.into_vec();
            // SAFETY: `nfds` is writable and `fds` holds `cap` >= `all.len()` ints, as the
            // caller vouches.
            unsafe {
                nfds.write(all.len());
                for (i, fd) in all.into_iter().enumerate() {
                    fds.add(i).write(fd.into_raw_fd());
                }
                put(out, FerryMsg(d))
            }
        }
        Ok(None) => FERRY_EMPTY,
        Err(e) => code(e),
    }
}

/// Like `ferry_recv`, and takes the descriptors the message carried: up to `cap` are
/// written to `fds` (each the caller's to close) and their count to `*nfds` (0 if none).
/// `kinds` is a mask of `FERRY_FD_*` accepted (0: all but `FERRY_FD_OTHER`); a message
/// carrying another kind is dropped with `FERRY_EFD_REFUSED`, one carrying more than
/// `cap` with `FERRY_ETOO_MANY_FDS`, and one whose sender died before its descriptors
/// were taken with `FERRY_EFDS_LOST` (nothing is kept of a dropped message).
///
/// # Safety
/// `rx` is a live receiver handle; `out` and `nfds` are writable; `fds` is writable for
/// `cap` ints (NULL if `cap` is 0).
#[no_mangle]
pub unsafe extern "C" fn ferry_recv_fds(
    rx: *mut FerryReceiver,
    timeout_ms: i64,
    kinds: u32,
    out: *mut *mut FerryMsg,
    fds: *mut c_int,
    cap: usize,
    nfds: *mut usize,
) -> c_int {
    // SAFETY: as the caller vouches.
    match unsafe { handle(rx) } {
        // SAFETY: as the caller vouches.
        Ok(r) => unsafe { receive_fds(&mut r.0, timeout_ms, kinds, out, fds, cap, nfds) },
        Err(c) => c,
    }
}

/// What descriptor `fd` is: one of `FERRY_FD_*` (from the kernel's cached attributes;
/// nothing is opened or read), or `FERRY_EINVAL` for a negative number.
///
/// # Safety
/// `fd` is an open descriptor.
#[no_mangle]
pub unsafe extern "C" fn ferry_fd_kind(fd: c_int) -> i64 {
    if fd < 0 {
        return i64::from(einval("negative descriptor"));
    }
    // SAFETY: open for the call, as the caller vouches.
    let k = ferry::FdKind::of(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) });
    FD_KINDS
        .iter()
        .find(|(_, kind)| *kind == k)
        .map_or(i64::from(FERRY_FD_OTHER), |(bit, _)| i64::from(*bit))
}

/// The path a loan's fbuf comes from: `path`, or (NULL) the sender's or publisher's
/// own.
///
/// # Safety
/// `path` is NULL or a live path handle.
unsafe fn loan_path(path: *mut FerryPath, own: &PathAllocator) -> &PathAllocator {
    // SAFETY: as the caller vouches.
    match unsafe { path.as_ref() } {
        Some(p) => &p.0,
        None => own,
    }
}

/// Lends a fresh fbuf of `len` bytes from `path` (NULL: the sender's own path), its
/// place in the ring held: write it through `ferry_loan_data`, then `ferry_loan_send`
/// (which publishes the descriptor made here with one store) or `ferry_loan_discard`.
/// Waits at most `timeout_ms` for room in the ring (< 0: no limit; 0: do not wait,
/// `FERRY_EFULL` if full); allocation never waits (`FERRY_EQUOTA`). Until the loan
/// ends, make no other call on `tx` (see the ownership rules).
///
/// # Safety
/// `tx` is a live sender handle that outlives the loan; `path` is NULL or a live path
/// handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_sender_loan(
    tx: *mut FerrySender,
    path: *mut FerryPath,
    len: usize,
    timeout_ms: i64,
    out: *mut *mut FerryLoan,
) -> c_int {
    // SAFETY: the caller vouches that `tx` is live and outlives the loan (the ownership
    // rules), which is what the borrow's 'static stands for.
    let t: &'static FerrySender = match unsafe { handle(tx) } {
        Ok(t) => t,
        Err(c) => return c,
    };
    // SAFETY: as the caller vouches.
    let data = match unsafe { loan_path(path, t.0.path()) }.alloc(len) {
        Ok(d) => d,
        Err(e) => return code(e),
    };
    let got = match timeout(timeout_ms) {
        Some(Duration::ZERO) => t.0.loan(data),
        _ => t.0.loan_until(data, deadline(timeout_ms)),
    };
    match got {
        // SAFETY: `out` is writable, as the caller vouches.
        Ok(l) => unsafe { put(out, FerryLoan(LoanOf::Sender(l))) },
        Err(e) => code(e),
    }
}

/// Messages sent on `tx` and not yet released by the receiver (after draining
/// releases).
///
/// # Safety
/// `tx` is a live sender handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_sender_in_flight(tx: *mut FerrySender) -> usize {
    // SAFETY: as the caller vouches.
    unsafe { handle(tx) }.map_or(0, |t| {
        let _ = t.0.collect_releases();
        t.0.in_flight()
    })
}

/// Closes a sender (NULL is ignored); the receiver sees `FERRY_EDISCONNECTED` once it
/// drained the ring.
///
/// # Safety
/// `tx` is NULL or a live sender handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferry_sender_close(tx: *mut FerrySender) {
    // SAFETY: as the caller vouches.
    unsafe { destroy(tx) }
}

/// Receives the next message, waiting at most `timeout_ms` (< 0: no limit; 0: do not
/// wait, `FERRY_EMPTY` if none). `*out` receives a message the caller must release.
///
/// # Safety
/// `rx` is a live receiver handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_recv(
    rx: *mut FerryReceiver,
    timeout_ms: i64,
    out: *mut *mut FerryMsg,
) -> c_int {
    // SAFETY: as the caller vouches.
    unsafe { receive(rx, timeout_ms, out) }
}

/// The receiver's eventfd, for poll/epoll: call `ferry_receiver_arm` first; it turns
/// readable when the next message arrives.
///
/// # Safety
/// `rx` is a live receiver handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_receiver_fd(rx: *mut FerryReceiver) -> c_int {
    use std::os::fd::AsRawFd;
    // SAFETY: as the caller vouches.
    unsafe { handle(rx) }.map_or(-1, |r| r.0.as_raw_fd())
}

/// Prepares to wait on `ferry_receiver_fd`: returns 1 if the fd will turn readable for
/// the next message, 0 if one is already waiting (receive it instead), or a negative
/// status.
///
/// # Safety
/// `rx` is a live receiver handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_receiver_arm(rx: *mut FerryReceiver) -> c_int {
    // SAFETY: as the caller vouches.
    match unsafe { handle(rx) } {
        Ok(r) => match r.0.arm() {
            Ok(armed) => c_int::from(armed),
            Err(e) => code(e),
        },
        Err(c) => c,
    }
}

/// Closes a receiver (NULL is ignored). Messages received stay readable.
///
/// # Safety
/// `rx` is NULL or a live receiver handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferry_receiver_close(rx: *mut FerryReceiver) {
    // SAFETY: as the caller vouches.
    unsafe { destroy(rx) }
}

/// Offers publish-subscribe service `name` from `domain`. Each subscriber's queue holds
/// `depth` messages (0: the default, 64); when one is full, `block` != 0 makes
/// `ferry_publish` wait, otherwise that subscriber misses the message.
///
/// # Safety
/// `domain` is a live domain handle; `name` a NUL-terminated string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_publisher_offer(
    domain: *mut FerryDomain,
    name: *const c_char,
    depth: u32,
    block: c_int,
    out: *mut *mut FerryPublisher,
) -> c_int {
    // SAFETY: as the caller vouches.
    let name = match unsafe { string(name) } {
        Ok(n) => n,
        Err(c) => return c,
    };
    let mut config = ServiceConfig::default();
    if depth > 0 {
        config.depth = depth;
    }
    if block != 0 {
        config.slow = SlowSubscriber::Block;
    }
    // SAFETY: as the caller vouches.
    unsafe {
        create(
            domain,
            out,
            |d| Publisher::offer(&d.0, name, config),
            FerryPublisher,
        )
    }
}

/// Waits at most `timeout_ms` (< 0: a day) until `n` subscribers are connected.
///
/// # Safety
/// `publisher` is a live publisher handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_publisher_wait(
    publisher: *mut FerryPublisher,
    n: usize,
    timeout_ms: i64,
) -> c_int {
    with!(publisher, |p| p
        .0
        .wait_for_subscribers(n, finite(timeout_ms)))
}

/// Publishes `msg` (which stays the caller's) to every subscriber; `*delivered`
/// (if not NULL) receives how many were handed it. Under the blocking policy waits at
/// most `timeout_ms` (< 0: no limit) for room.
///
/// # Safety
/// `publisher` is a live publisher handle; `msg` a live message handle; `delivered`
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_publish(
    publisher: *mut FerryPublisher,
    msg: *mut FerryMsg,
    timeout_ms: i64,
    delivered: *mut usize,
) -> c_int {
    // SAFETY: as the caller vouches.
    let m = match unsafe { handle(msg) } {
        Ok(m) => m.0.clone(),
        Err(c) => return c,
    };
    let deadline = timeout(timeout_ms).map(|d| Instant::now() + d);
    with!(publisher, |p| p.0.publish_until(&m, deadline).map(|n| {
        if !delivered.is_null() {
            // SAFETY: non-null and writable, as the caller vouches.
            unsafe { delivered.write(n) };
        }
    }))
}

/// Like `ferry_publish`, with `fds[0..nfds]` as cargo: each subscriber gets its own
/// duplicates (`ferry_subscriber_recv_fds`).
///
/// # Safety
/// As `ferry_publish`; `fds` as `nfds` open descriptors (NULL if `nfds` is 0).
#[no_mangle]
pub unsafe extern "C" fn ferry_publish_fds(
    publisher: *mut FerryPublisher,
    msg: *mut FerryMsg,
    fds: *const c_int,
    nfds: usize,
    timeout_ms: i64,
    delivered: *mut usize,
) -> c_int {
    // SAFETY: as the caller vouches.
    let m = match unsafe { handle(msg) } {
        Ok(m) => m.0.clone(),
        Err(c) => return c,
    };
    // SAFETY: as the caller vouches.
    let fds = match unsafe { borrowed_fds(fds, nfds) } {
        Ok(f) => f,
        Err(c) => return c,
    };
    let deadline = timeout(timeout_ms).map(|d| Instant::now() + d);
    with!(publisher, |p| p
        .0
        .publish_with_fds_until(&m, &fds, deadline)
        .map(|n| {
            if !delivered.is_null() {
                // SAFETY: non-null and writable, as the caller vouches.
                unsafe { delivered.write(n) };
            }
        }))
}

/// Lends a fresh fbuf of `len` bytes from `path` (NULL: the publisher's own path), to
/// write once through `ferry_loan_data` and publish to every subscriber with
/// `ferry_loan_send` (one fbuf, one descriptor per subscriber, as `ferry_publish`), or
/// give back with `ferry_loan_discard`. Never waits (`FERRY_EQUOTA` if the path's
/// quota is used up). Until the loan ends, make no other call on `publisher` (see the
/// ownership rules).
///
/// # Safety
/// `publisher` is a live publisher handle that outlives the loan; `path` is NULL or a
/// live path handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_publisher_loan(
    publisher: *mut FerryPublisher,
    path: *mut FerryPath,
    len: usize,
    out: *mut *mut FerryLoan,
) -> c_int {
    // SAFETY: the caller vouches that `publisher` is live, outlives the loan and is not
    // used meanwhile (the ownership rules), which is what the borrow's 'static stands for.
    let p: &'static mut FerryPublisher = match unsafe { handle(publisher) } {
        Ok(p) => p,
        Err(c) => return c,
    };
    let own = p.0.path().clone();
    // SAFETY: as the caller vouches.
    let path = unsafe { loan_path(path, &own) };
    match p.0.loan_from(path, len) {
        // SAFETY: `out` is writable, as the caller vouches.
        Ok(l) => unsafe { put(out, FerryLoan(LoanOf::Publisher(l))) },
        Err(e) => code(e),
    }
}

/// The writable bytes of a loan (`ferry_loan_len` of them), valid until the loan is
/// sent or discarded. NULL for an empty loan.
///
/// # Safety
/// `loan` is a live loan handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_loan_data(loan: *mut FerryLoan) -> *mut u8 {
    // SAFETY: as the caller vouches.
    let bytes = match unsafe { handle(loan) } {
        Ok(FerryLoan(LoanOf::Sender(l))) => l.as_mut_slice(),
        Ok(FerryLoan(LoanOf::Publisher(l))) => Some(l.as_mut_slice()),
        Err(_) => None,
    };
    bytes
        .filter(|b| !b.is_empty())
        .map_or(ptr::null_mut(), |b| b.as_mut_ptr())
}

/// Length of a loan in bytes (0 for NULL).
///
/// # Safety
/// `loan` is NULL or a live loan handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_loan_len(loan: *mut FerryLoan) -> usize {
    // SAFETY: as the caller vouches.
    match unsafe { handle(loan) } {
        Ok(FerryLoan(LoanOf::Sender(l))) => l.len(),
        Ok(FerryLoan(LoanOf::Publisher(l))) => l.len(),
        Err(_) => 0,
    }
}

/// Sends a loan's message and ends the loan (always, even when the send fails: the
/// fbuf then goes back). A sender's loan needs no wait (its place was held at the loan)
/// and reaches its one receiver; a publisher's loan reaches every subscriber, waiting
/// under the blocking policy at most `timeout_ms` (< 0: no limit) for room.
/// `*delivered` (if not NULL) receives how many it reached.
///
/// # Safety
/// `loan` is a live loan handle, not used afterwards (nor pointers into it), ended on
/// the thread that took it; `delivered` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_loan_send(
    loan: *mut FerryLoan,
    timeout_ms: i64,
    delivered: *mut usize,
) -> c_int {
    if loan.is_null() {
        return einval("NULL handle");
    }
    // SAFETY: made by `put`; the caller gives it up.
    let l = unsafe { Box::from_raw(loan) };
    let sent = match l.0 {
        LoanOf::Sender(l) => l.send().map(|()| 1),
        LoanOf::Publisher(l) => l.send_until(deadline(timeout_ms)),
    };
    match sent {
        Ok(n) => {
            if !delivered.is_null() {
                // SAFETY: non-null and writable, as the caller vouches.
                unsafe { delivered.write(n) };
            }
            FERRY_OK
        }
        Err(e) => code(e),
    }
}

/// Ends a loan unsent (NULL is ignored): nothing is sent, the fbuf goes back to its
/// path at once.
///
/// # Safety
/// `loan` is NULL or a live loan handle, not used afterwards (nor pointers into it),
/// ended on the thread that took it.
#[no_mangle]
pub unsafe extern "C" fn ferry_loan_discard(loan: *mut FerryLoan) {
    // SAFETY: as the caller vouches.
    unsafe { destroy(loan) }
}

/// Withdraws the service (NULL is ignored).
///
/// # Safety
/// `publisher` is NULL or a live publisher handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferry_publisher_close(publisher: *mut FerryPublisher) {
    // SAFETY: as the caller vouches.
    unsafe { destroy(publisher) }
}

/// Subscribes `domain` to service `name`, waiting at most `timeout_ms` (< 0: a day) for
/// it to be offered and for the publisher to connect.
///
/// # Safety
/// `domain` is a live domain handle; `name` a NUL-terminated string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_subscriber_open(
    domain: *mut FerryDomain,
    name: *const c_char,
    timeout_ms: i64,
    out: *mut *mut FerrySubscriber,
) -> c_int {
    // SAFETY: as the caller vouches.
    let name = match unsafe { string(name) } {
        Ok(n) => n,
        Err(c) => return c,
    };
    // SAFETY: as the caller vouches.
    unsafe {
        create(
            domain,
            out,
            |d| Subscriber::open(&d.0, name, finite(timeout_ms)),
            FerrySubscriber,
        )
    }
}

/// Receives the next published message, waiting at most `timeout_ms` (< 0: no limit;
/// 0: do not wait, `FERRY_EMPTY` if none).
///
/// # Safety
/// `sub` is a live subscriber handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_subscriber_recv(
    sub: *mut FerrySubscriber,
    timeout_ms: i64,
    out: *mut *mut FerryMsg,
) -> c_int {
    // SAFETY: as the caller vouches.
    unsafe { receive(sub, timeout_ms, out) }
}

/// Leaves the service (NULL is ignored). Messages received stay readable.
///
/// # Safety
/// `sub` is NULL or a live subscriber handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferry_subscriber_close(sub: *mut FerrySubscriber) {
    // SAFETY: as the caller vouches.
    unsafe { destroy(sub) }
}

/// Like `ferry_subscriber_recv`, and takes the descriptors the message carried, as
/// `ferry_recv_fds`.
///
/// # Safety
/// As `ferry_recv_fds`, with a live subscriber handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_subscriber_recv_fds(
    sub: *mut FerrySubscriber,
    timeout_ms: i64,
    kinds: u32,
    out: *mut *mut FerryMsg,
    fds: *mut c_int,
    cap: usize,
    nfds: *mut usize,
) -> c_int {
    // SAFETY: as the caller vouches.
    match unsafe { handle(sub) } {
        // SAFETY: as the caller vouches.
        Ok(s) => unsafe { receive_fds(&mut s.0, timeout_ms, kinds, out, fds, cap, nfds) },
        Err(c) => c,
    }
}
