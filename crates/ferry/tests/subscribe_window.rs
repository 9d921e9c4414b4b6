//! A subscriber's open returns only once its publisher lists it: a message published
//! right after `Subscriber::open` returned reaches it, even when the publisher's door
//! thread is slow to list the new subscriber after the channel's handshake. (Its own
//! binary: the delay it sets is process-wide.)

use std::time::Duration;

use ferry::{Group, PathConfig, Publisher, ServiceConfig, Subscriber};

const T: Duration = Duration::from_secs(10);

#[test]
fn a_message_published_right_after_open_returned_arrives() {
    // The door thread makes the channel, then waits this long before it lists the
    // subscriber: the window in which an open that returned at the handshake would
    // miss what is published.
    ferry::testing::set_admit_delay(Duration::from_millis(300));
    let g = Group::open(&format!("svc-window-{}", std::process::id())).unwrap();
    let (pubd, subd) = (g.join().unwrap(), g.join().unwrap());
    let mut p = Publisher::offer(&pubd, "window", ServiceConfig::default()).unwrap();
    let path = pubd.path(PathConfig::default()).unwrap();
    for round in 0..3u8 {
        let mut sub = Subscriber::open(&subd, "window", T).unwrap();
        let mut m = path.alloc(64).unwrap();
        m.write_at(0, &[round; 64]);
        let reached = p.publish(&m.freeze()).unwrap();
        assert_eq!(
            reached, 1,
            "round {round}: published to {reached} subscribers"
        );
        let got = sub.recv_timeout(Duration::from_secs(2)).unwrap();
        assert_eq!(got.to_vec(), vec![round; 64]);
        // Leave, so that the next round's open is a new subscriber again.
        drop(sub);
        p.collect_releases();
    }
}
