//! What the harness tells a worker to do, and what a worker reports back: the
//! one module that the harness, the transports and the workers all import.
//!
//! The harness spawns `current_exe() __worker <role> --plan JSON ...`
//! ([`WorkerArgs`]), hands it descriptors, and reads its [`Sample`]s, one JSON
//! line each, from its stdout once it exits.
//!
//! Both sides derive the same message schedule from one [`Plan`], so a byte
//! stream needs no framing: message `k` of size `s` is exactly `s` bytes.

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

/// What one worker process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    Source,
    Stage,
    Sink,
    Local,
    Memcpy,
    /// One domain of `ferry-bench container` (`ferry-bench`'s `suites::container::domain`).
    Domain,
    /// The echo peer of `ferry-bench vcm` (`ferry-bench`'s `suites::vcm::echo`).
    VcmEcho,
    /// The output side of `ferry-bench genie` ([`crate::suites::genie::worker`]).
    GenieSource,
    /// The input side of `ferry-bench genie`.
    GenieSink,
    /// The sender of `ferry-bench handover` (`ferry-bench`'s `suites::handover::worker`).
    HandoverSend,
    /// The receiver of `ferry-bench handover`.
    HandoverRecv,
}

/// Worker-side implementation of a transport, named on the worker's command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkerTransport {
    /// Any byte-stream descriptor: pipes and stream sockets.
    FdStream,
    /// ferry channels carrying fbufs.
    Ferry,
}

/// The command line of a worker process (`ferry-bench __worker`, or `ferry __worker` for the calibration's hand-over).
#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(value_enum)]
    pub role: Role,
    /// The schedule, as JSON.
    #[arg(long)]
    pub plan: String,
    /// Pin this process to one CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    #[arg(long, value_enum, default_value = "fd-stream")]
    pub transport: WorkerTransport,
    /// Spec of the sending link end.
    #[arg(long)]
    pub tx: Option<String>,
    /// Spec of the receiving link end.
    #[arg(long)]
    pub rx: Option<String>,
    /// Spec of this worker's end of the acknowledgement pipe (ping-pong).
    #[arg(long)]
    pub ack: Option<String>,
    /// The calibration file whose thresholds a genie worker gives its `Passing`
    /// (without it, the library's defaults).
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<std::path::PathBuf>,
}

/// How messages flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Back to back; the sink reports bytes and elapsed time per trial.
    Stream,
    /// One message at a time: the sink acknowledges each one on a return pipe
    /// before the source fills the next. The sink reports one-way latencies,
    /// the source reports round trips (the cost of one call).
    PingPong,
}

/// How a blocked end waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Wait {
    /// Nonblocking descriptors, retried in a tight loop.
    Spin,
    /// Ordinary blocking system calls.
    Block,
}

/// What the final receiver reads of each message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Touch {
    /// One word in every 4 KiB page.
    Word,
    /// Every byte.
    All,
    /// Only the header (the hand-over itself, without touching the pages).
    Header,
    /// Only the header, but the source wrote one word in every page before the send, as
    /// an application producing the message does: the hand-over in the cache and TLB
    /// state those writes leave (what `ferry-bench genie`'s messages see). The sink
    /// stamps as soon as it holds the message, before it reads the header (the stamps
    /// still come from the header): the hand-over alone, as genie's in-place input.
    HeaderAfterWrites,
}

impl Touch {
    pub fn label(self) -> &'static str {
        match self {
            Touch::Word => "word/page",
            Touch::All => "every byte",
            Touch::Header => "the header only",
            Touch::HeaderAfterWrites => "the header only, after one word per page written",
        }
    }
}

/// The schedule every process of one run follows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub pattern: Pattern,
    pub wait: Wait,
    /// What the sink reads; the source always writes and a stage always reads one word per page.
    pub touch: Touch,
    /// Message sizes in bytes, each at least [`Header::LEN`].
    pub sizes: Vec<usize>,
    /// Timed messages per trial, one entry per size.
    pub msgs: Vec<u32>,
    /// Untimed messages at the start of each trial, one entry per size.
    pub warmup: Vec<u32>,
    pub trials: u32,
    /// Stages between source and sink; used by the single-process chain.
    #[serde(default)]
    pub hops: u32,
}

/// One trial at one size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub size: usize,
    pub trial: u32,
    /// Untimed messages first ...
    pub warmup: u32,
    /// ... then this many timed ones.
    pub timed: u32,
}

impl Step {
    /// Messages in this step, warm-up included.
    pub fn total(&self) -> u32 {
        self.warmup + self.timed
    }
}

impl Plan {
    /// Every trial of every size, in the order all processes run them.
    pub fn steps(&self) -> impl Iterator<Item = Step> + '_ {
        (0..self.sizes.len()).flat_map(move |i| {
            (0..self.trials).map(move |trial| Step {
                size: self.sizes[i],
                trial,
                warmup: self.warmup.get(i).copied().unwrap_or(0),
                timed: self.msgs.get(i).copied().unwrap_or(1).max(1),
            })
        })
    }
}

/// The first bytes of every message (in the first page, so they count as
/// that page's word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message number within its trial.
    pub seq: u64,
    /// When the source began filling the message.
    pub t_fill: u64,
    /// When the source handed the filled message to the transport.
    pub t_send: u64,
}

impl Header {
    pub const LEN: usize = 24;

    pub fn write(&self, buf: &mut [u8]) {
        buf[0..8].copy_from_slice(&self.seq.to_ne_bytes());
        buf[8..16].copy_from_slice(&self.t_fill.to_ne_bytes());
        buf[16..24].copy_from_slice(&self.t_send.to_ne_bytes());
    }

    pub fn read(buf: &[u8]) -> Header {
        let word = |i: usize| u64::from_ne_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
        Header {
            seq: word(0),
            t_fill: word(8),
            t_send: word(16),
        }
    }
}

/// What a worker measured in one trial of one size: one JSON line on its stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub kind: SampleKind,
    pub size: usize,
    pub trial: u32,
    /// Bytes moved in the timed part (stream and memcpy samples).
    pub bytes: u64,
    /// Nanoseconds: one value per message (ping-pong, memcpy) or one per trial (stream).
    pub ns: Vec<u64>,
    /// System calls the transport's library made on this worker's thread
    /// during the timed messages, where the transport counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscalls: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SampleKind {
    /// Elapsed time of a whole trial of back-to-back messages.
    Stream,
    /// Source-side round trip: fill, send, receiver's touch, acknowledgement.
    RoundTrip,
    /// Receiver-side one-way latency: from hand-over to fully received.
    OneWay,
    /// One memcpy of `size` bytes.
    Memcpy,
    /// `CLOCK_MONOTONIC` stamps, one per message (the harness pairs a sender's with a
    /// receiver's to get one-way latencies).
    Stamp,
    /// CPU time of this side's operation call (its thread's), one per message.
    CpuTime,
    /// A counter of the worker's library (`trial` says which, `bytes` holds its value).
    Counter,
    /// Sender-side cost of one send call alone (`ferry-bench handover`).
    SendCall,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = Header {
            seq: 7,
            t_fill: 11,
            t_send: 13,
        };
        let mut buf = [0u8; 64];
        h.write(&mut buf);
        assert_eq!(Header::read(&buf), h);
    }

    #[test]
    fn steps_follow_sizes_then_trials() {
        let plan = Plan {
            pattern: Pattern::Stream,
            wait: Wait::Block,
            touch: Touch::Word,
            sizes: vec![64, 128],
            msgs: vec![3, 5],
            warmup: vec![1, 0],
            trials: 2,
            hops: 0,
        };
        let steps: Vec<_> = plan.steps().map(|s| (s.size, s.trial, s.total())).collect();
        assert_eq!(
            steps,
            vec![(64, 0, 4), (64, 1, 4), (128, 0, 5), (128, 1, 5)]
        );
    }
}
