//! What each worker process does, generic over the transport.
//!
//! - `source`: the originator; writes one word per page, stamps the header, sends.
//! - `stage`: an intermediate domain; reads one word per page and passes the message on.
//! - `sink`: the final receiver; reads one word per page or every byte.
//! - `local`: the same chain as function calls inside one process.
//!
//! Every role records into memory while it runs and reports only at the end,
//! so printing never lands inside a timed loop.

use std::hint::black_box;
use std::io;

use super::touch::{read, read_words, write_words};
use crate::protocol::{Header, Pattern, Plan, Sample, SampleKind, Touch};
use crate::sys::now_ns;
use crate::transport::ack::Ack;
use crate::transport::{RxEnd, Transport, TxEnd};

/// Sends every message of the plan; in ping-pong, waits for each
/// acknowledgement and records the round trip.
pub fn source<T: Transport>(
    plan: &Plan,
    tx: &mut T::Tx,
    mut ack: Option<Ack>,
) -> io::Result<Vec<Sample>> {
    let mut out = Vec::new();
    for step in plan.steps() {
        let size = step.size;
        let mut rtt = Vec::with_capacity(step.timed as usize);
        let mut sys0 = None;
        for seq in 0..u64::from(step.total()) {
            if seq == u64::from(step.warmup) {
                sys0 = tx.syscalls();
            }
            let t_fill = now_ns();
            tx.send_new(
                size,
                // For the hand-over alone the source writes only the header, so that
                // the payload writes do not evict the caches and TLB before the send.
                &mut |off, frag| {
                    if plan.touch != Touch::Header {
                        write_words(off, frag, seq)
                    }
                },
                &mut |first| {
                    Header {
                        seq,
                        t_fill,
                        t_send: now_ns(),
                    }
                    .write(first)
                },
            )?;
            if let Some(ack) = ack.as_mut() {
                ack.wait()?;
                if seq >= u64::from(step.warmup) {
                    rtt.push(now_ns() - t_fill);
                }
            }
        }
        let syscalls = sys0.zip(tx.syscalls()).map(|(a, b)| b - a);
        if plan.pattern == Pattern::PingPong {
            out.push(Sample {
                kind: SampleKind::RoundTrip,
                size,
                trial: step.trial,
                bytes: size as u64,
                ns: rtt,
                syscalls,
            });
        }
    }
    Ok(out)
}

/// Passes every message on, reading one word per page of it.
pub fn stage<T: Transport>(plan: &Plan, rx: &mut T::Rx, tx: &mut T::Tx) -> io::Result<()> {
    for step in plan.steps() {
        for _ in 0..step.total() {
            T::forward(rx, tx, step.size, &mut |off, frag| {
                read_words(off, frag);
            })?;
        }
    }
    Ok(())
}

/// Receives every message, checks that it is the one expected, touches it,
/// and records throughput (stream) or one-way latency (ping-pong).
pub fn sink<T: Transport>(
    plan: &Plan,
    rx: &mut T::Rx,
    mut ack: Option<Ack>,
) -> io::Result<Vec<Sample>> {
    let mut out = Vec::new();
    for step in plan.steps() {
        let (size, trial, warmup) = (step.size, step.trial, u64::from(step.warmup));
        let mut t0 = 0;
        let mut one_way = Vec::with_capacity(step.timed as usize);
        let mut sys0 = None;
        for seq in 0..u64::from(step.total()) {
            if seq == warmup {
                sys0 = rx.syscalls();
            }
            let mut header = None;
            // With `HeaderAfterWrites` (calibrate's hand-over) the sink stamps once it
            // holds the message and before it reads the header, as genie's in-place
            // input does: reading the payload is the application's part (a copy out's
            // fit has it), and a line taken from the other CPU would count twice.
            let mut held = None;
            rx.recv(size, &mut |off, frag| {
                if off == 0 {
                    if plan.touch == Touch::HeaderAfterWrites {
                        held = Some(now_ns());
                    }
                    header = Some(Header::read(frag));
                }
                read(plan.touch, off, frag);
            })?;
            let now = held.unwrap_or_else(now_ns);
            let h = header.ok_or_else(|| bad("message without a first fragment"))?;
            if h.seq != seq {
                return Err(bad(&format!("expected message {seq}, got {}", h.seq)));
            }
            if seq == warmup {
                t0 = h.t_fill;
            }
            if seq >= warmup {
                one_way.push(now.saturating_sub(h.t_send));
            }
            if let Some(ack) = ack.as_mut() {
                ack.signal()?;
            }
        }
        let timed = u64::from(step.timed);
        let syscalls = sys0.zip(rx.syscalls()).map(|(a, b)| b - a);
        out.push(match plan.pattern {
            Pattern::Stream => Sample {
                kind: SampleKind::Stream,
                size,
                trial,
                bytes: size as u64 * timed,
                ns: vec![now_ns() - t0],
                syscalls,
            },
            Pattern::PingPong => Sample {
                kind: SampleKind::OneWay,
                size,
                trial,
                bytes: size as u64,
                ns: one_way,
                syscalls,
            },
        });
    }
    Ok(out)
}

/// The chain inside one process: source, `plan.hops` stages and sink are
/// function calls on one reused buffer, each touching it as its process would.
pub fn local(plan: &Plan) -> Vec<Sample> {
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    for step in plan.steps() {
        let (size, warmup) = (step.size, u64::from(step.warmup));
        if buf.len() < size {
            buf.resize(size, 0x5a);
        }
        let mut t0 = 0;
        for seq in 0..u64::from(step.total()) {
            let t_fill = now_ns();
            if seq == warmup {
                t0 = t_fill;
            }
            let msg = black_box(&mut buf[..size]);
            write_words(0, msg, seq);
            Header {
                seq,
                t_fill,
                t_send: now_ns(),
            }
            .write(msg);
            for _ in 0..plan.hops {
                read_words(0, black_box(&*msg));
            }
            read(plan.touch, 0, black_box(&*msg));
        }
        out.push(Sample {
            kind: SampleKind::Stream,
            size,
            trial: step.trial,
            bytes: size as u64 * u64::from(step.timed),
            ns: vec![now_ns() - t0],
            syscalls: None,
        });
    }
    out
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}
