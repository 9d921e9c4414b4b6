//! Spawning worker processes and collecting what they report.
//!
//! Each worker is `current_exe() __worker ...`, started with
//! `std::process::Command` (fork+exec done by the standard library, never a
//! bare `fork` of this multi-threaded process). Descriptors reach a worker by
//! inheritance: each is made inheritable just before that worker is spawned,
//! and the harness drops its copy right after, so every link end lives in
//! exactly one worker and a worker that dies shows up as EOF or EPIPE at its peers.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;

use crate::protocol::{Plan, Role, Sample, WorkerTransport};
use crate::sys;
use crate::transport::LinkEnd;

/// How one worker is started.
pub struct WorkerSpec {
    pub role: Role,
    pub cpu: usize,
    pub transport: WorkerTransport,
    pub tx: Option<LinkEnd>,
    pub rx: Option<LinkEnd>,
    pub ack: Option<LinkEnd>,
    /// The calibration file a genie worker loads its thresholds from.
    pub calibration: Option<std::path::PathBuf>,
}

impl WorkerSpec {
    pub fn new(role: Role, cpu: usize) -> WorkerSpec {
        WorkerSpec {
            role,
            cpu,
            transport: WorkerTransport::FdStream,
            tx: None,
            rx: None,
            ack: None,
            calibration: None,
        }
    }
}

struct Running {
    role: Role,
    child: Child,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
}

/// The workers of one run. Dropping a crew kills whatever is still running.
///
/// The harness never polls: each worker's stdout is drained by a thread that
/// reports on a channel when the worker closes it (at exit), so the harness
/// sleeps in one blocking receive and never competes with pinned workers for a CPU.
pub struct Crew {
    workers: Vec<Running>,
    closed_tx: Sender<usize>,
    closed_rx: Receiver<usize>,
}

impl Default for Crew {
    fn default() -> Crew {
        let (closed_tx, closed_rx) = mpsc::channel();
        Crew {
            workers: Vec::new(),
            closed_tx,
            closed_rx,
        }
    }
}

fn drain(
    r: Option<impl Read + Send + 'static>,
    done: Option<(Sender<usize>, usize)>,
) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut r) = r {
            let _ = r.read_to_string(&mut s);
        }
        if let Some((tx, i)) = done {
            let _ = tx.send(i);
        }
        s
    })
}

/// The command-line spelling of a value.
fn value_name<T: ValueEnum + std::fmt::Debug>(v: &T) -> String {
    v.to_possible_value()
        .map_or_else(|| format!("{v:?}"), |p| p.get_name().to_string())
}

impl Crew {
    /// Starts one worker following `plan`.
    pub fn spawn(&mut self, spec: WorkerSpec, plan: &Plan) -> Result<()> {
        let exe = std::env::current_exe().context("locating the ferry binary")?;
        let mut cmd = Command::new(exe);
        cmd.arg("__worker")
            .arg(value_name(&spec.role))
            .arg("--plan")
            .arg(serde_json::to_string(plan)?)
            .arg("--cpu")
            .arg(spec.cpu.to_string())
            .arg("--transport")
            .arg(value_name(&spec.transport));
        for (flag, end) in [("--tx", &spec.tx), ("--rx", &spec.rx), ("--ack", &spec.ack)] {
            if let Some(end) = end {
                cmd.arg(flag).arg(&end.spec);
                for fd in &end.fds {
                    sys::inheritable(fd)?;
                }
            }
        }
        if let Some(file) = &spec.calibration {
            cmd.arg("--calibration").arg(file);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let role = spec.role;
        let spawned = cmd.spawn();
        // The worker has its copies (or failed to start); dropping ours now
        // is what makes a dead peer visible as EOF or EPIPE.
        drop(spec);
        let mut child = spawned.with_context(|| format!("spawning worker {role:?}"))?;
        let index = self.workers.len();
        let stdout = drain(child.stdout.take(), Some((self.closed_tx.clone(), index)));
        let stderr = drain(child.stderr.take(), None);
        self.workers.push(Running {
            role,
            child,
            stdout,
            stderr,
        });
        Ok(())
    }

    /// Waits for every worker, at most `timeout`, and returns each one's
    /// samples in spawn order. If one fails, the rest are killed and the
    /// error carries what every worker said on stderr.
    pub fn finish(mut self, timeout: Duration) -> Result<Vec<Vec<Sample>>> {
        let deadline = Instant::now() + timeout;
        let mut failure = None;
        for _ in 0..self.workers.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            let i = match self.closed_rx.recv_timeout(left) {
                Ok(i) => i,
                Err(_) => {
                    failure = Some(format!("workers did not finish within {timeout:?}"));
                    break;
                }
            };
            // Its stdout is closed, so it is exiting: this wait is short.
            let w = &mut self.workers[i];
            let status = w.child.wait()?;
            if !status.success() {
                failure = Some(format!("worker {:?} exited with {status}", w.role));
                break;
            }
        }
        if let Some(first) = failure {
            // Give the peers of a failed worker a moment to report their side, then stop them.
            thread::sleep(Duration::from_millis(50));
            self.kill_all();
            let mut msg = first;
            for w in std::mem::take(&mut self.workers) {
                let err = w.stderr.join().unwrap_or_default();
                if !err.trim().is_empty() {
                    msg.push_str(&format!("\n  {:?}: {}", w.role, err.trim()));
                }
            }
            bail!(msg);
        }
        let mut out = Vec::new();
        for w in std::mem::take(&mut self.workers) {
            let text = w.stdout.join().unwrap_or_default();
            let samples = text
                .lines()
                .map(serde_json::from_str)
                .collect::<Result<Vec<Sample>, _>>()
                .with_context(|| format!("reading the samples of worker {:?}", w.role))?;
            out.push(samples);
        }
        Ok(out)
    }

    fn kill_all(&mut self) {
        for w in &mut self.workers {
            if let Ok(None) = w.child.try_wait() {
                let _ = w.child.kill();
                let _ = w.child.wait();
            }
        }
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        self.kill_all();
    }
}
