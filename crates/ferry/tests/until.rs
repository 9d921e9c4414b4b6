//! `Until`: blocking calls that give up when their caller's stop check says so
//! (`Error::Interrupted`), undoing what they had set up as a timeout would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry::{
    ChannelConfig, Client, Error, Group, IoData, Publisher, Server, ServiceConfig, SlowSubscriber,
    Subscriber, Until,
};

fn group(tag: &str) -> Arc<Group> {
    Group::open(&format!("until-{tag}-{}", std::process::id())).unwrap()
}

/// A stop check that says stop from its `n`th run on, counting its runs.
fn stop_after(n: usize, runs: &mut usize) -> impl FnMut() -> bool + '_ {
    move || {
        *runs += 1;
        *runs >= n
    }
}

const LONG: Duration = Duration::from_secs(60);

#[test]
fn connect_stops_and_withdraws_its_offer() {
    let g = group("connect");
    let (a, b) = (g.join().unwrap(), g.join().unwrap());
    let mut runs = 0;
    let mut stop = stop_after(3, &mut runs);
    let start = Instant::now();
    let r = a.connect_until(
        b.id(),
        ChannelConfig::default(),
        Until::timeout(LONG).with_stop(&mut stop),
    );
    assert!(matches!(r, Err(Error::Interrupted)), "{r:?}");
    assert!(start.elapsed() < LONG);
    drop(stop);
    assert_eq!(runs, 3);
    // Withdrawn: nothing is left for the peer to accept.
    assert!(matches!(
        b.accept(Duration::from_millis(200)),
        Err(Error::Timeout)
    ));
}

#[test]
fn accept_and_accept_from_stop() {
    let g = group("accept");
    let (a, b) = (g.join().unwrap(), g.join().unwrap());
    let mut runs = 0;
    let mut stop = stop_after(2, &mut runs);
    let r = a.accept_until(Until::deadline(None).with_stop(&mut stop));
    assert!(matches!(r, Err(Error::Interrupted)), "{r:?}");
    let mut runs = 0;
    let mut stop = stop_after(2, &mut runs);
    let r = a.accept_from_until(b.id(), Until::deadline(None).with_stop(&mut stop));
    assert!(matches!(r, Err(Error::Interrupted)), "{r:?}");
    // Without a stop check the deadline still holds.
    assert!(matches!(
        a.accept_until(Until::timeout(Duration::from_millis(50))),
        Err(Error::Timeout)
    ));
}

#[test]
fn opening_a_service_stops_and_a_timeout_is_still_no_such_service() {
    let g = group("open");
    let d = g.join().unwrap();
    let mut runs = 0;
    let mut stop = stop_after(2, &mut runs);
    let r = Subscriber::open_until(&d, "nobody", Until::timeout(LONG).with_stop(&mut stop));
    assert!(matches!(r, Err(Error::Interrupted)), "{r:?}");
    let mut runs = 0;
    let mut stop = stop_after(2, &mut runs);
    let r = Client::open_until(&d, "nobody", Until::deadline(None).with_stop(&mut stop));
    assert!(matches!(r, Err(Error::Interrupted)), "{r:?}");
    assert!(matches!(
        Subscriber::open(&d, "nobody", Duration::from_millis(50)),
        Err(Error::NoSuchService { .. })
    ));
}

#[test]
fn an_interrupted_call_is_abandoned_and_its_late_answer_dropped() {
    let g = group("call");
    let (sd, cd) = (g.join().unwrap(), g.join().unwrap());
    let mut server = Server::offer(&sd, "echo", ServiceConfig::default()).unwrap();
    let mut client = Client::open(&cd, "echo", LONG).unwrap();
    let mut runs = 0;
    let mut stop = stop_after(2, &mut runs);
    let r = client.call_until(
        &IoData::from_vec(b"first".to_vec()),
        Until::deadline(None).with_stop(&mut stop),
    );
    assert!(matches!(r, Err(Error::Interrupted)), "{r:?}");
    // The server answers the abandoned request late, then the next one.
    let t = std::thread::spawn(move || {
        for _ in 0..2 {
            let req = server.recv_timeout(LONG).unwrap();
            server.reply(&req, &req.data).unwrap();
        }
        server
    });
    let got = client
        .call(&IoData::from_vec(b"second".to_vec()), LONG)
        .unwrap();
    assert!(got.eq_bytes(b"second"));
    drop(t.join().unwrap());
}

#[test]
fn stepwise_publish_waits_in_parts() {
    let g = group("publish");
    let (pd, sd) = (g.join().unwrap(), g.join().unwrap());
    let config = ServiceConfig {
        depth: 2,
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    let mut p = Publisher::offer(&pd, "steps", config).unwrap();
    let mut s = Subscriber::open(&sd, "steps", LONG).unwrap();
    p.wait_for_subscribers(1, LONG).unwrap();
    let m = |b: &[u8]| IoData::from_vec(b.to_vec());
    assert_eq!(p.publish(&m(b"0")).unwrap(), 1);
    assert_eq!(p.publish(&m(b"1")).unwrap(), 1);
    // Full: the publish waits on the queue.
    let mut publishing = p.begin_publish(&m(b"2")).unwrap();
    assert_eq!(publishing.waiting(), 1);
    assert!(matches!(
        p.wait_publish(&mut publishing, Duration::from_millis(20)),
        Err(Error::Timeout)
    ));
    assert_eq!(publishing.waiting(), 1);
    assert!(s.recv_timeout(LONG).unwrap().eq_bytes(b"0"));
    p.wait_publish(&mut publishing, LONG).unwrap();
    assert_eq!(publishing.waiting(), 0);
    assert_eq!(p.end_publish(publishing).unwrap(), 1);
    // Given up on: the full queue does not get it.
    let publishing = p.begin_publish(&m(b"3")).unwrap();
    assert_eq!(publishing.waiting(), 1);
    assert!(matches!(p.end_publish(publishing), Err(Error::Timeout)));
    assert!(s.recv_timeout(LONG).unwrap().eq_bytes(b"1"));
    assert!(s.recv_timeout(LONG).unwrap().eq_bytes(b"2"));
    assert!(matches!(
        s.recv_timeout(Duration::from_millis(50)),
        Err(Error::Timeout)
    ));
}

/// A stepwise publish with descriptors: the queue that was full gets them too, though
/// the caller closed its own before the wait.
#[test]
fn stepwise_publish_carries_descriptors_to_the_full_queue() {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    let g = group("publish-fds");
    let (pd, sd) = (g.join().unwrap(), g.join().unwrap());
    let config = ServiceConfig {
        depth: 2,
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    let mut p = Publisher::offer(&pd, "steps-fds", config).unwrap();
    let mut s = Subscriber::open(&sd, "steps-fds", LONG).unwrap();
    p.wait_for_subscribers(1, LONG).unwrap();
    let m = |b: &[u8]| IoData::from_vec(b.to_vec());
    assert_eq!(p.publish(&m(b"0")).unwrap(), 1);
    assert_eq!(p.publish(&m(b"1")).unwrap(), 1);
    let (mut r, w) = std::io::pipe().unwrap();
    let mut publishing = p.begin_publish_with_fds(&m(b"2"), &[w.as_fd()]).unwrap();
    assert_eq!(publishing.waiting(), 1);
    drop(w);
    assert!(s.recv_timeout(LONG).unwrap().eq_bytes(b"0"));
    p.wait_publish(&mut publishing, LONG).unwrap();
    assert_eq!(p.end_publish(publishing).unwrap(), 1);
    assert!(s.recv_timeout(LONG).unwrap().eq_bytes(b"1"));
    let (d, mut fds) = s.recv_with_fds_timeout(LONG).unwrap();
    assert!(d.eq_bytes(b"2"));
    assert_eq!(fds.len(), 1, "the full queue got the descriptor");
    let mut w = std::fs::File::from(fds.take(0).unwrap());
    drop(fds);
    drop(d);
    w.write_all(b"x").unwrap();
    // One byte, not to the end: the publisher keeps its duplicates until it collects
    // the subscriber's release.
    let mut got = [0u8; 1];
    r.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"x", "the received duplicate is the pipe's write end");
}
