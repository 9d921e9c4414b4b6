//! A tokio task consuming a publish-subscribe service from another process, whose
//! publisher is async too.
//!
//! Run it with `cargo run --release -p ferry --example tokio_subscriber`. It starts
//! itself a second time as the publisher (`--publisher`), which offers
//! `"sensors/temperature"` and publishes a few readings from a tokio task through an
//! [`AsyncPublisher`] (under the hold-back policy a full queue is awaited, not blocked
//! on); this process subscribes by
//! name, wraps the subscriber in an [`AsyncSubscriber`], and a tokio task awaits the
//! readings next to a ticker task, on one current-thread runtime. The readings are read
//! in place in the publisher's pages (no copy); when the publisher withdraws, the
//! subscriber's `recv()` returns `Disconnected` and the task ends.

use std::time::Duration;

use ferry::aio::{AsyncPublisher, AsyncSubscriber};
use ferry::{Error, Group, PathConfig};
use ferry::{Publisher, ServiceConfig, SlowSubscriber, Subscriber};

const SERVICE: &str = "sensors/temperature";
const READINGS: u32 = 10;

async fn publisher(group: &str) -> ferry::Result<()> {
    let group = Group::open(group)?;
    let domain = group.join()?;
    let config = ServiceConfig {
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    let mut publisher = AsyncPublisher::new(Publisher::offer(&domain, SERVICE, config)?);
    publisher
        .get_ref()
        .wait_for_subscribers(1, Duration::from_secs(10))?;
    let path = domain.path(PathConfig::default())?;
    for i in 0..READINGS {
        let text = format!("reading {i}: {:.1} C", 20.0 + f64::from(i) * 0.25);
        let mut buf = path.alloc(text.len())?;
        buf.write_at(0, text.as_bytes());
        publisher.publish(&buf.freeze()).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Dropping the publisher withdraws the service: the subscriber sees Disconnected
    // once it has taken every reading.
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ferry::Result<()> {
    let mut args = std::env::args().skip(1);
    if let Some("--publisher") = args.next().as_deref() {
        return publisher(&args.next().expect("group name")).await;
    }

    let group_name = format!("tokio-example-{}", std::process::id());
    let group = Group::open(&group_name)?;
    let domain = group.join()?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["--publisher", &group_name])
        .spawn()?;

    // Opening blocks (briefly) until the service is offered and the publisher has
    // connected; nothing else runs on this runtime yet, so that is fine here.
    let sub = Subscriber::open(&domain, SERVICE, Duration::from_secs(10))?;
    let mut sub = AsyncSubscriber::new(sub)?;

    let local = tokio::task::LocalSet::new();
    let got = local
        .run_until(async move {
            // Another task on the same thread keeps running while the consumer waits.
            let ticker = tokio::task::spawn_local(async {
                let mut tick = tokio::time::interval(Duration::from_millis(200));
                loop {
                    tick.tick().await;
                    println!("(tick)");
                }
            });
            let consumer = tokio::task::spawn_local(async move {
                let mut got = 0;
                loop {
                    match tokio::time::timeout(Duration::from_secs(5), sub.recv()).await {
                        Err(_elapsed) => println!("no reading for 5 s"),
                        Ok(Ok(reading)) => {
                            println!("{}", String::from_utf8_lossy(&reading.to_vec()));
                            got += 1;
                        }
                        Ok(Err(Error::Disconnected | Error::PeerGone { .. })) => break,
                        Ok(Err(e)) => return Err(e),
                    }
                }
                Ok::<_, Error>(got)
            });
            let got = consumer.await.expect("consumer task");
            ticker.abort();
            got
        })
        .await?;
    println!("{got} readings, then the publisher withdrew");
    child.wait()?;
    Ok(())
}
