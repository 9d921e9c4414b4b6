//! The iceoryx2 side of `ferry-bench services`: one ipc publish-subscribe service of
//! `[u8]` slices per subscriber count, one publisher per payload size (each with its own
//! data segment sized for that payload), N subscribers in the subscriber process, the
//! blocking policy (no safe overflow, `RetryUntilDelivered`), as ferry's service is set
//! up.
//!
//! What iceoryx2 0.10 does per subscriber on `send` (read from its sources,
//! `iceoryx2/src/port/details/sender.rs` and `iceoryx2-cal/src/zero_copy_connection/
//! common.rs`): it first drains every connection's completion queue
//! (`retrieve_returned_chunks`, on every send and loan), then for each connection checks
//! that the submission queue is not full, stores the sample size in the connection's
//! segment details, sets the chunk's bit in the connection's used-chunk list (shared
//! memory), pushes one 64-bit pointer offset into the subscriber's SPSC submission queue,
//! and increments the chunk's reference count, an atomic in the publisher's own memory
//! (`SegmentState::borrow_chunk`): one locked instruction per subscriber, on a line that
//! stays in the publisher's cache.

use std::mem::MaybeUninit;

use anyhow::{anyhow, bail, Result};
use iceoryx2::port::publisher::Publisher;
use iceoryx2::port::subscriber::Subscriber;
use iceoryx2::prelude::*;
use iceoryx2::service::port_factory::publish_subscribe::PortFactory as PubSub;

fn node() -> Result<Node<ipc::Service>> {
    set_log_level(LogLevel::Error);
    NodeBuilder::new()
        .create::<ipc::Service>()
        .map_err(|e| anyhow!("iceoryx2 node: {e:?}"))
}

fn service(
    node: &Node<ipc::Service>,
    name: &str,
    subs: usize,
    publishers: usize,
    depth: usize,
) -> Result<PubSub<ipc::Service, [u8], ()>> {
    let name: ServiceName = name
        .try_into()
        .map_err(|e| anyhow!("iceoryx2 service name {name:?}: {e:?}"))?;
    node.service_builder(&name)
        .publish_subscribe::<[u8]>()
        .max_publishers(publishers)
        .max_subscribers(subs)
        .history_size(0)
        .subscriber_max_buffer_size(depth)
        .subscriber_max_borrowed_samples(1)
        .enable_safe_overflow(false)
        .open_or_create()
        .map_err(|e| anyhow!("iceoryx2 service {name:?}: {e:?}"))
}

/// One iceoryx2 publisher of byte slices, by its payload size.
type IcePublisher = Publisher<ipc::Service, [u8], ()>;

/// The publishing side: one publisher per payload size.
pub struct Pub {
    publishers: Vec<(usize, IcePublisher)>,
    subs: usize,
    _service: PubSub<ipc::Service, [u8], ()>,
    _node: Node<ipc::Service>,
}

impl Pub {
    pub fn create(name: &str, subs: usize, sizes: &[usize], depth: usize) -> Result<Pub> {
        let node = node()?;
        let service = service(&node, name, subs, sizes.len(), depth)?;
        let mut publishers = Vec::new();
        for &size in sizes {
            let p = service
                .publisher_builder()
                .initial_max_slice_len(size)
                .allocation_strategy(AllocationStrategy::Static)
                .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
                .max_loaned_samples(1)
                .create()
                .map_err(|e| anyhow!("iceoryx2 publisher of {size} bytes: {e:?}"))?;
            publishers.push((size, p));
        }
        Ok(Pub {
            publishers,
            subs,
            _service: service,
            _node: node,
        })
    }

    /// Loans a sample of `size` bytes, lets `write` fill it (one byte per page and the
    /// header), and sends it; returns the send call's duration (ns, two clock reads).
    pub fn publish(&mut self, size: usize, write: impl FnOnce(&mut [u8])) -> Result<u64> {
        let Some((_, p)) = self.publishers.iter().find(|(s, _)| *s == size) else {
            bail!("no iceoryx2 publisher of {size} bytes");
        };
        let mut s = p
            .loan_slice_uninit(size)
            .map_err(|e| anyhow!("iceoryx2 loan of {size} bytes: {e:?}"))?;
        let raw = s.payload_mut();
        // SAFETY: the loaned chunk is shared memory that the kernel zero-filled when it
        // was first touched, or that earlier samples wrote: every byte holds a value, and
        // any value is a valid `u8` (iceoryx2's own benchmark sends uninitialised loans
        // the same way). `MaybeUninit<u8>` and `u8` have the same layout.
        let bytes = unsafe { &mut *(raw as *mut [MaybeUninit<u8>] as *mut [u8]) };
        write(bytes);
        // SAFETY: as above: every byte holds a value.
        let s = unsafe { s.assume_init() };
        let t0 = crate::sys::now_ns();
        let n = s.send();
        let t1 = crate::sys::now_ns();
        let n = n.map_err(|e| anyhow!("iceoryx2 send: {e:?}"))?;
        if n != self.subs {
            bail!("iceoryx2 delivered to {n} subscribers, not {}", self.subs);
        }
        Ok(t1 - t0)
    }
}

/// The subscribing side: the subscriber process's N subscribers.
pub struct Subs {
    pub subs: Vec<Subscriber<ipc::Service, [u8], ()>>,
    _service: PubSub<ipc::Service, [u8], ()>,
    _node: Node<ipc::Service>,
}

impl Subs {
    pub fn open(name: &str, n: usize, publishers: usize, depth: usize) -> Result<Subs> {
        let node = node()?;
        let service = service(&node, name, n, publishers, depth)?;
        let mut subs = Vec::new();
        for _ in 0..n {
            subs.push(
                service
                    .subscriber_builder()
                    .buffer_size(depth)
                    .create()
                    .map_err(|e| anyhow!("iceoryx2 subscriber: {e:?}"))?,
            );
        }
        Ok(Subs {
            subs,
            _service: service,
            _node: node,
        })
    }
}
