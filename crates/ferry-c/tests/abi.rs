//! The C ABI called from Rust the way C calls it: status codes, out-pointers, NULL
//! handling, the error text, and a message outliving every other handle.
#![allow(unsafe_code)]

use std::ffi::{c_char, CStr, CString};
use std::ptr;

use ferry_c::*;

fn last_error() -> String {
    // SAFETY: ferry_last_error returns a NUL-terminated string owned by this thread.
    unsafe { CStr::from_ptr(ferry_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn name(tag: &str) -> CString {
    CString::new(format!("c-abi-{tag}-{}", std::process::id())).unwrap()
}

/// Opens group `n` and joins it twice: the group and its two domains.
///
/// # Safety
/// The caller closes the three handles as the header's ownership rules say.
unsafe fn group_of_two(n: &CStr) -> (*mut FerryGroup, *mut FerryDomain, *mut FerryDomain) {
    let mut g = ptr::null_mut();
    let (mut a, mut b) = (ptr::null_mut(), ptr::null_mut());
    // SAFETY: `n` is NUL-terminated and the out-pointers are writable.
    unsafe {
        assert_eq!(ferry_group_open(n.as_ptr(), &mut g), FERRY_OK);
        assert_eq!(ferry_group_join(g, &mut a), FERRY_OK);
        assert_eq!(ferry_group_join(g, &mut b), FERRY_OK);
    }
    (g, a, b)
}

#[test]
fn null_arguments_are_einval_not_crashes() {
    // SAFETY: NULL is accepted everywhere and reported as FERRY_EINVAL (or ignored by
    // the destroying calls).
    unsafe {
        let mut g: *mut FerryGroup = ptr::null_mut();
        assert_eq!(ferry_group_open(ptr::null(), &mut g), FERRY_EINVAL);
        assert!(g.is_null());
        assert!(last_error().contains("NULL"));
        let mut d: *mut FerryDomain = ptr::null_mut();
        assert_eq!(ferry_group_join(ptr::null_mut(), &mut d), FERRY_EINVAL);
        assert_eq!(ferry_msg_len(ptr::null_mut()), 0);
        assert!(ferry_buf_freeze(ptr::null_mut()).is_null());
        ferry_group_close(ptr::null_mut());
        ferry_msg_release(ptr::null_mut());
        ferry_receiver_close(ptr::null_mut());
    }
}

#[test]
fn send_receive_fragments_and_ownership() {
    let n = name("pair");
    // SAFETY: every handle below is used as the header's ownership rules say.
    unsafe {
        let (g, a, b) = group_of_two(&n);
        let mut id = [0 as c_char; 32];
        assert_eq!(ferry_domain_id(b, id.as_mut_ptr(), 2), FERRY_EINVAL);
        assert_eq!(ferry_domain_id(b, id.as_mut_ptr(), id.len()), FERRY_OK);

        // connect blocks until accepted: run it on a thread.
        let a_addr = a as usize;
        let peer = CStr::from_ptr(id.as_ptr()).to_owned();
        let t = std::thread::spawn(move || {
            let mut tx = ptr::null_mut();
            let rc = ferry_domain_connect(a_addr as *mut FerryDomain, peer.as_ptr(), 5000, &mut tx);
            (rc, tx as usize)
        });
        let mut rx = ptr::null_mut();
        assert_eq!(ferry_domain_accept(b, 5000, &mut rx), FERRY_OK);
        let (rc, tx) = t.join().unwrap();
        assert_eq!(rc, FERRY_OK);
        let tx = tx as *mut FerrySender;

        let mut none = ptr::null_mut();
        assert_eq!(ferry_recv(rx, 0, &mut none), FERRY_EMPTY);
        assert_eq!(ferry_recv(rx, 10, &mut none), FERRY_ETIMEOUT);
        assert!(none.is_null());

        let mut path = ptr::null_mut();
        assert_eq!(ferry_domain_path(a, 0, &mut path), FERRY_OK);
        let mut buf = ptr::null_mut();
        assert_eq!(ferry_path_alloc(path, 5000, &mut buf), FERRY_OK);
        assert_eq!(ferry_buf_len(buf), 5000);
        let p = ferry_buf_data(buf);
        for i in 0..5000 {
            p.add(i).write((i % 256) as u8);
        }
        let msg = ferry_buf_freeze(buf);
        assert_eq!(ferry_send(tx, msg, 1000), FERRY_OK);
        ferry_msg_release(msg);

        let mut got = ptr::null_mut();
        assert_eq!(ferry_recv(rx, 5000, &mut got), FERRY_OK);
        // Close everything but the message: it stays readable.
        ferry_receiver_close(rx);
        ferry_domain_close(b);
        assert_eq!(ferry_msg_len(got), 5000);
        assert_eq!(ferry_msg_fragment_count(got), 1);
        let (mut data, mut len) = (ptr::null(), 0usize);
        assert_eq!(ferry_msg_fragment(got, 0, &mut data, &mut len), FERRY_OK);
        assert_eq!(data, p.cast_const()); // the sender's pages
        assert_eq!(
            ferry_msg_fragment(got, 1, &mut data, &mut len),
            FERRY_EINVAL
        );
        let mut copy = vec![0u8; 5000];
        assert_eq!(
            ferry_msg_copy(got, copy.as_mut_ptr(), 10),
            i64::from(FERRY_EINVAL)
        );
        assert_eq!(ferry_msg_copy(got, copy.as_mut_ptr(), copy.len()), 5000);
        assert!(copy.iter().enumerate().all(|(i, &b)| b == (i % 256) as u8));
        assert!(ferry_path_outstanding(path) > 0);
        ferry_msg_release(got);
        assert_eq!(ferry_sender_in_flight(tx), 0);
        assert_eq!(ferry_path_outstanding(path), 0);

        // The receiver is gone: the sender learns it.
        let mut buf = ptr::null_mut();
        assert_eq!(ferry_path_alloc(path, 10, &mut buf), FERRY_OK);
        let msg = ferry_buf_freeze(buf);
        let rc = ferry_send(tx, msg, 1000);
        assert!(rc == FERRY_EDISCONNECTED || rc == FERRY_EPEER_GONE, "{rc}");
        assert!(!last_error().is_empty());
        ferry_msg_release(msg);
        ferry_sender_close(tx);
        ferry_path_close(path);
        ferry_domain_close(a);
        ferry_group_close(g);
    }
}

#[test]
fn publish_subscribe() {
    let n = name("pubsub");
    let svc = CString::new("frames").unwrap();
    // SAFETY: as in the test above.
    unsafe {
        let (g, a, b) = group_of_two(&n);
        let mut none = ptr::null_mut();
        assert_eq!(
            ferry_subscriber_open(b, svc.as_ptr(), 10, &mut none),
            FERRY_ENO_SUCH_SERVICE
        );
        let mut publ = ptr::null_mut();
        assert_eq!(
            ferry_publisher_offer(a, svc.as_ptr(), 0, 0, &mut publ),
            FERRY_OK
        );
        let mut sub = ptr::null_mut();
        assert_eq!(
            ferry_subscriber_open(b, svc.as_ptr(), 5000, &mut sub),
            FERRY_OK
        );
        assert_eq!(ferry_publisher_wait(publ, 1, 5000), FERRY_OK);
        let mut path = ptr::null_mut();
        assert_eq!(ferry_domain_path(a, 0, &mut path), FERRY_OK);
        let mut buf = ptr::null_mut();
        assert_eq!(ferry_path_alloc(path, 3, &mut buf), FERRY_OK);
        ferry_buf_data(buf).copy_from_nonoverlapping(b"abc".as_ptr(), 3);
        let msg = ferry_buf_freeze(buf);
        let mut delivered = 0usize;
        assert_eq!(ferry_publish(publ, msg, 1000, &mut delivered), FERRY_OK);
        assert_eq!(delivered, 1);
        let mut got = ptr::null_mut();
        assert_eq!(ferry_subscriber_recv(sub, 5000, &mut got), FERRY_OK);
        let mut out = [0u8; 3];
        assert_eq!(ferry_msg_copy(got, out.as_mut_ptr(), 3), 3);
        assert_eq!(&out, b"abc");
        ferry_msg_release(got);
        ferry_msg_release(msg);
        ferry_subscriber_close(sub);
        ferry_publisher_close(publ);
        ferry_path_close(path);
        ferry_domain_close(a);
        ferry_domain_close(b);
        ferry_group_close(g);
    }
}

#[test]
fn sender_loans() {
    let n = name("loan");
    // SAFETY: every handle below is used as the header's ownership rules say; each
    // loan ends on this thread before its sender is used again or closed.
    unsafe {
        let (g, a, b) = group_of_two(&n);
        let mut id = [0 as c_char; 32];
        assert_eq!(ferry_domain_id(b, id.as_mut_ptr(), id.len()), FERRY_OK);
        let a_addr = a as usize;
        let peer = CStr::from_ptr(id.as_ptr()).to_owned();
        let t = std::thread::spawn(move || {
            let mut tx = ptr::null_mut();
            let rc = ferry_domain_connect(a_addr as *mut FerryDomain, peer.as_ptr(), 5000, &mut tx);
            (rc, tx as usize)
        });
        let mut rx = ptr::null_mut();
        assert_eq!(ferry_domain_accept(b, 5000, &mut rx), FERRY_OK);
        let (rc, tx) = t.join().unwrap();
        assert_eq!(rc, FERRY_OK);
        let tx = tx as *mut FerrySender;
        let mut path = ptr::null_mut();
        assert_eq!(ferry_domain_path(a, 0, &mut path), FERRY_OK);

        let mut loan: *mut FerryLoan = ptr::null_mut();
        assert_eq!(
            ferry_sender_loan(ptr::null_mut(), path, 10, 0, &mut loan),
            FERRY_EINVAL
        );
        assert_eq!(
            ferry_loan_send(ptr::null_mut(), 0, ptr::null_mut()),
            FERRY_EINVAL
        );
        ferry_loan_discard(ptr::null_mut());
        assert_eq!(ferry_loan_len(ptr::null_mut()), 0);
        assert!(ferry_loan_data(ptr::null_mut()).is_null());

        // Written in place and sent.
        assert_eq!(ferry_sender_loan(tx, path, 3000, 0, &mut loan), FERRY_OK);
        assert_eq!(ferry_loan_len(loan), 3000);
        let p = ferry_loan_data(loan);
        std::slice::from_raw_parts_mut(p, 3000).fill(0x5a);
        let mut delivered = 0;
        assert_eq!(ferry_loan_send(loan, 0, &mut delivered), FERRY_OK);
        assert_eq!(delivered, 1);
        let mut got = ptr::null_mut();
        assert_eq!(ferry_recv(rx, 5000, &mut got), FERRY_OK);
        let mut copy = vec![0u8; 3000];
        assert_eq!(ferry_msg_copy(got, copy.as_mut_ptr(), 3000), 3000);
        assert!(copy.iter().all(|&b| b == 0x5a));
        let (mut data, mut len) = (ptr::null(), 0);
        assert_eq!(ferry_msg_fragment(got, 0, &mut data, &mut len), FERRY_OK);
        assert_eq!(
            data,
            p.cast_const(),
            "the receiver reads the loaned fbuf itself"
        );
        ferry_msg_release(got);

        // Discarded: nothing arrives, the fbuf is back at once.
        assert_eq!(ferry_sender_loan(tx, path, 5000, -1, &mut loan), FERRY_OK);
        assert!(ferry_path_outstanding(path) > 0);
        ferry_loan_discard(loan);
        assert_eq!(ferry_recv(rx, 0, &mut got), FERRY_EMPTY);
        assert_eq!(ferry_sender_in_flight(tx), 0);
        assert_eq!(ferry_path_outstanding(path), 0);

        // The sender's own path (NULL), and a full ring refused without waiting.
        let mut out = 0;
        loop {
            match ferry_sender_loan(tx, ptr::null_mut(), 64, 0, &mut loan) {
                FERRY_OK => {
                    assert_eq!(ferry_loan_send(loan, 0, ptr::null_mut()), FERRY_OK);
                    out += 1;
                }
                rc => {
                    assert_eq!(rc, FERRY_EFULL, "{}", last_error());
                    break;
                }
            }
        }
        assert_eq!(out, 256, "the default ring holds 256");
        assert_eq!(
            ferry_sender_loan(tx, ptr::null_mut(), 64, 20, &mut loan),
            FERRY_ETIMEOUT
        );

        ferry_sender_close(tx);
        ferry_receiver_close(rx);
        ferry_path_close(path);
        ferry_domain_close(a);
        ferry_domain_close(b);
        ferry_group_close(g);
    }
}

#[test]
fn publisher_loans() {
    let n = name("publoan");
    let svc = CString::new("frames").unwrap();
    // SAFETY: every handle below is used as the header's ownership rules say; each
    // loan ends on this thread before its publisher is used again or closed.
    unsafe {
        let (g, a, b) = group_of_two(&n);
        let mut publ = ptr::null_mut();
        assert_eq!(
            ferry_publisher_offer(a, svc.as_ptr(), 0, 0, &mut publ),
            FERRY_OK
        );
        let mut sub = ptr::null_mut();
        assert_eq!(
            ferry_subscriber_open(b, svc.as_ptr(), 5000, &mut sub),
            FERRY_OK
        );
        assert_eq!(ferry_publisher_wait(publ, 1, 5000), FERRY_OK);
        let mut path = ptr::null_mut();
        assert_eq!(ferry_domain_path(a, 0, &mut path), FERRY_OK);
        let mut loan: *mut FerryLoan = ptr::null_mut();
        assert_eq!(
            ferry_publisher_loan(ptr::null_mut(), path, 3, &mut loan),
            FERRY_EINVAL
        );
        // From the caller's path: written once, published, read in place.
        assert_eq!(ferry_publisher_loan(publ, path, 3, &mut loan), FERRY_OK);
        assert_eq!(ferry_loan_len(loan), 3);
        ferry_loan_data(loan).copy_from_nonoverlapping(b"abc".as_ptr(), 3);
        let mut delivered = 0usize;
        assert_eq!(ferry_loan_send(loan, 1000, &mut delivered), FERRY_OK);
        assert_eq!(delivered, 1);
        let mut got = ptr::null_mut();
        assert_eq!(ferry_subscriber_recv(sub, 5000, &mut got), FERRY_OK);
        let mut out = [0u8; 3];
        assert_eq!(ferry_msg_copy(got, out.as_mut_ptr(), 3), 3);
        assert_eq!(&out, b"abc");
        ferry_msg_release(got);
        // Discarded: nothing published, the fbuf back at once.
        assert_eq!(ferry_publisher_loan(publ, path, 5000, &mut loan), FERRY_OK);
        assert!(ferry_path_outstanding(path) > 0);
        ferry_loan_discard(loan);
        assert_eq!(ferry_subscriber_recv(sub, 0, &mut got), FERRY_EMPTY);
        // The publisher's own path (NULL).
        assert_eq!(
            ferry_publisher_loan(publ, ptr::null_mut(), 0, &mut loan),
            FERRY_OK
        );
        assert_eq!(ferry_loan_len(loan), 0);
        assert!(ferry_loan_data(loan).is_null());
        assert_eq!(ferry_loan_send(loan, 1000, &mut delivered), FERRY_OK);
        assert_eq!(ferry_subscriber_recv(sub, 5000, &mut got), FERRY_OK);
        assert_eq!(ferry_msg_len(got), 0);
        ferry_msg_release(got);
        ferry_subscriber_close(sub);
        ferry_publisher_close(publ);
        ferry_path_close(path);
        ferry_domain_close(a);
        ferry_domain_close(b);
        ferry_group_close(g);
    }
}

#[test]
fn max_fds_is_the_librarys() {
    assert_eq!(FERRY_MAX_FDS, ferry::MAX_FDS);
}
