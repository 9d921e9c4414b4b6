//! The iceoryx2 side of `ferry-bench handover`: an ipc publish-subscribe service of
//! `[u8]` slices (dynamic: the publisher's data segment grows by powers of two as the
//! slices do), one publisher, one subscriber, and the same protocol as ferry's.
//!
//! How iceoryx2 hands a sample over (read from its 0.10 sources): the publisher loans a
//! chunk from its own data segment (shared memory that every subscriber maps once), and
//! `send` pushes one 64-bit pointer offset (segment id and offset) into the subscriber's
//! lock-free SPSC submission queue in shared memory, after noting the chunk in a bitset of
//! chunks in use; the subscriber pops the offset, and on drop pushes it back on a
//! completion queue that the publisher drains on its next send or loan. A sample is a
//! value on the stack: nothing is allocated per message, and one small word crosses.

use std::mem::MaybeUninit;

use anyhow::{anyhow, Context, Result};
use iceoryx2::port::publisher::Publisher;
use iceoryx2::port::subscriber::Subscriber;
use iceoryx2::prelude::*;
use iceoryx2::service::port_factory::publish_subscribe::PortFactory as PubSub;

use super::stamp::{read_header, write_header};
use crate::sys::now_ns;

fn node() -> Result<Node<ipc::Service>> {
    set_log_level(LogLevel::Error);
    NodeBuilder::new()
        .create::<ipc::Service>()
        .map_err(|e| anyhow!("iceoryx2 node: {e:?}"))
}

fn service(node: &Node<ipc::Service>, name: &str) -> Result<PubSub<ipc::Service, [u8], ()>> {
    let name: ServiceName = name
        .try_into()
        .map_err(|e| anyhow!("iceoryx2 service name {name:?}: {e:?}"))?;
    node.service_builder(&name)
        .publish_subscribe::<[u8]>()
        .max_publishers(1)
        .max_subscribers(1)
        .history_size(0)
        .subscriber_max_buffer_size(1)
        .subscriber_max_borrowed_samples(1)
        .open_or_create()
        .map_err(|e| anyhow!("iceoryx2 service {name:?}: {e:?}"))
}

/// The publishing side.
pub struct Tx {
    publisher: Publisher<ipc::Service, [u8], ()>,
    _service: PubSub<ipc::Service, [u8], ()>,
    _node: Node<ipc::Service>,
}

impl Tx {
    pub fn open(name: &str, max: usize) -> Result<Tx> {
        let node = node()?;
        let service = service(&node, name)?;
        let publisher = service
            .publisher_builder()
            .initial_max_slice_len(max)
            .allocation_strategy(AllocationStrategy::PowerOfTwo)
            .max_loaned_samples(1)
            .create()
            .map_err(|e| anyhow!("iceoryx2 publisher: {e:?}"))?;
        Ok(Tx {
            publisher,
            _service: service,
            _node: node,
        })
    }

    /// Loans, writes one byte per page, stamps and sends; returns (t0, send call ns).
    pub fn send(&mut self, size: usize, seq: u64) -> Result<(u64, u64)> {
        let mut s = self
            .publisher
            .loan_slice_uninit(size)
            .map_err(|e| anyhow!("iceoryx2 loan of {size} bytes: {e:?}"))?;
        let p = s.payload_mut();
        for i in (0..p.len()).step_by(4096) {
            p[i] = MaybeUninit::new(seq as u8);
        }
        super::stamp::settle();
        let t0 = now_ns();
        let mut head = [0u8; 16];
        write_header(&mut head, seq, t0);
        for (d, b) in p.iter_mut().zip(head) {
            *d = MaybeUninit::new(b);
        }
        // SAFETY: the loaned chunk is shared memory that the kernel zero-filled when it
        // was first touched, or that earlier samples wrote: every byte holds a value, and
        // any value is a valid `u8`. (iceoryx2's own benchmark sends uninitialised loans
        // the same way.) The receiver reads only the header written above.
        let s = unsafe { s.assume_init() };
        s.send()
            .map_err(|e| anyhow!("iceoryx2 send: {e:?}"))
            .context("no subscriber received the sample")
            .and_then(|n| {
                if n == 1 {
                    Ok(())
                } else {
                    Err(anyhow!("iceoryx2 delivered to {n} subscribers, not 1"))
                }
            })?;
        let t1 = now_ns();
        Ok((t0, t1 - t0))
    }
}

impl Tx {
    /// Loans, stamps, writes every byte, writes the header and sends (`ferry-bench
    /// hugepages`: a frame written whole); returns the stamp.
    pub fn send_full(&mut self, size: usize, seq: u64) -> Result<u64> {
        let mut s = self
            .publisher
            .loan_slice_uninit(size)
            .map_err(|e| anyhow!("iceoryx2 loan of {size} bytes: {e:?}"))?;
        let p = s.payload_mut();
        let t0 = now_ns();
        // SAFETY: `p` is the loaned slice, `p.len()` bytes of our own chunk; writing
        // bytes into `MaybeUninit<u8>`s initialises them.
        unsafe { std::ptr::write_bytes(p.as_mut_ptr().cast::<u8>(), seq as u8, p.len()) };
        let mut head = [0u8; 16];
        write_header(&mut head, seq, t0);
        for (d, b) in p.iter_mut().zip(head) {
            *d = MaybeUninit::new(b);
        }
        // SAFETY: every byte was written just above.
        let s = unsafe { s.assume_init() };
        let n = s.send().map_err(|e| anyhow!("iceoryx2 send: {e:?}"))?;
        if n != 1 {
            return Err(anyhow!("iceoryx2 delivered to {n} subscribers, not 1"));
        }
        Ok(t0)
    }
}

/// The subscribing side.
pub struct Rx {
    subscriber: Subscriber<ipc::Service, [u8], ()>,
    _service: PubSub<ipc::Service, [u8], ()>,
    _node: Node<ipc::Service>,
}

impl Rx {
    pub fn open(name: &str) -> Result<Rx> {
        let node = node()?;
        let service = service(&node, name)?;
        let subscriber = service
            .subscriber_builder()
            .create()
            .map_err(|e| anyhow!("iceoryx2 subscriber: {e:?}"))?;
        Ok(Rx {
            subscriber,
            _service: service,
            _node: node,
        })
    }

    /// Busy-polls for the next sample, calling `check` every 65536 empty polls.
    fn next(
        &self,
        check: &mut dyn FnMut() -> Result<()>,
    ) -> Result<iceoryx2::sample::Sample<ipc::Service, [u8], ()>> {
        let mut n = 0u32;
        loop {
            if let Some(s) = self
                .subscriber
                .receive()
                .map_err(|e| anyhow!("iceoryx2 receive: {e:?}"))?
            {
                return Ok(s);
            }
            n = n.wrapping_add(1);
            if n % 65536 == 0 {
                check()?;
            }
            std::hint::spin_loop();
        }
    }

    /// Busy-polls for the next sample; returns (sequence, t0, t1) and drops the sample.
    pub fn recv(
        &self,
        size: usize,
        check: &mut dyn FnMut() -> Result<()>,
    ) -> Result<(u64, u64, u64)> {
        let s = self.next(check)?;
        let (seq, t0) = read_header(s.payload());
        let t1 = now_ns();
        if s.payload().len() != size {
            return Err(anyhow!(
                "iceoryx2: expected {size} bytes, got {}",
                s.payload().len()
            ));
        }
        Ok((seq, t0, t1))
    }
}

impl Rx {
    /// Busy-polls for the next sample, reads every byte of it, stamps; returns
    /// (sequence, t0, t1) and drops the sample (`ferry-bench hugepages`).
    pub fn recv_full(
        &self,
        size: usize,
        check: &mut dyn FnMut() -> Result<()>,
    ) -> Result<(u64, u64, u64)> {
        let s = self.next(check)?;
        let p = s.payload();
        if p.len() != size {
            return Err(anyhow!("iceoryx2: expected {size} bytes, got {}", p.len()));
        }
        std::hint::black_box(crate::harness::chain::touch::read_all(p));
        let (seq, t0) = read_header(p);
        if p[size - 1] != seq as u8 {
            return Err(anyhow!("iceoryx2 message {seq}: wrong last byte"));
        }
        Ok((seq, t0, now_ns()))
    }
}

/// Whether iceoryx2 works here: one sample through a fresh service in this process.
/// `Err` carries the reason, printed in the report.
pub fn probe(name: &str) -> Result<()> {
    let rx = Rx::open(name)?;
    let mut tx = Tx::open(name, 64)?;
    tx.send(64, 1)?;
    let (seq, _, _) = rx.recv(64, &mut || Ok(()))?;
    if seq != 1 {
        return Err(anyhow!("iceoryx2 probe: got message {seq}, sent 1"));
    }
    Ok(())
}
