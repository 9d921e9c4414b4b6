//! A stall limit per benchmark. A benchmark that waits for a message that never comes (a
//! lost datagram, a peer that died without a word) must end the run with its name and
//! phase, not sit until the CI's own limit kills it with nothing to show.
//!
//! [`Watchdog::start`] spawns a thread that wakes every second. When the benchmark that
//! [`Watchdog::begin`] named has run past the limit, it prints the benchmark and its last
//! phase, kills this process's descendants (the workers, and what they started) with
//! SIGKILL, and exits with status 1. A run that finishes in time never sees it.

use std::fs;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

/// The benchmark running now, and since when.
type Current = Arc<Mutex<Option<(&'static str, Instant)>>>;

pub struct Watchdog {
    current: Current,
}

impl Watchdog {
    /// Starts the watchdog thread; `last_phase` is the progress line to print on a stall.
    pub fn start(limit: Duration, last_phase: Arc<Mutex<String>>) -> Watchdog {
        let current: Current = Arc::default();
        let seen = Arc::clone(&current);
        thread::Builder::new()
            .name("bench-watchdog".into())
            .spawn(move || loop {
                thread::sleep(Duration::from_secs(1));
                let over = match *seen.lock().unwrap_or_else(|e| e.into_inner()) {
                    Some((name, since)) if since.elapsed() > limit => Some(name),
                    _ => None,
                };
                if let Some(name) = over {
                    let phase = last_phase.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    eprintln!(
                        "\nferry-bench: benchmark {name} ran past its stall limit of {} s; \
                         its last phase: {phase}\nkilling its workers and giving up",
                        limit.as_secs()
                    );
                    kill_descendants(rustix::process::getpid());
                    std::process::exit(1);
                }
            })
            .expect("spawning the watchdog thread");
        Watchdog { current }
    }

    /// Starts the clock for benchmark `name`.
    pub fn begin(&self, name: &'static str) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((name, Instant::now()));
    }

    /// Stops the clock: the benchmark finished.
    pub fn end(&self) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// SIGKILLs every descendant of `pid`, children before their parent is gone (so that
/// none is re-parented out of reach first).
fn kill_descendants(pid: Pid) {
    for child in children(pid) {
        let _ = kill_process(child, Signal::STOP);
        kill_descendants(child);
        let _ = kill_process(child, Signal::KILL);
    }
}

/// The children of `pid`, from `/proc/PID/task/*/children`.
fn children(pid: Pid) -> Vec<Pid> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{}/task", pid.as_raw_nonzero())) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok().and_then(Pid::from_raw))
                .collect::<Vec<_>>()
        })
        .collect()
}
