//! Progress on stderr: a spinner with the current phase on a terminal, and
//! one plain line per phase otherwise (not a TTY, or `CI=true`).

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
    start: Instant,
    /// The last phase announced, for `ferry-bench`'s watchdog.
    last: Arc<Mutex<String>>,
}

impl Default for Progress {
    fn default() -> Progress {
        Progress::new()
    }
}

impl Progress {
    pub fn new() -> Progress {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
        let bar = (std::io::stderr().is_terminal() && !ci).then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                    .expect("static template"),
            );
            // A slow tick: the ticker thread shares the CPUs with the benchmark.
            bar.enable_steady_tick(Duration::from_millis(250));
            bar
        });
        Progress {
            bar,
            start: Instant::now(),
            last: Arc::default(),
        }
    }

    /// Announces a phase: a line on stderr, and the spinner's message.
    pub fn phase(&self, msg: &str) {
        let line = format!("[{:6.1}s] {msg}", self.start.elapsed().as_secs_f64());
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = line.clone();
        match &self.bar {
            Some(bar) => {
                bar.println(&line);
                bar.set_message(msg.to_string());
            }
            None => eprintln!("{line}"),
        }
    }

    /// A handle on the last phase line, readable from another thread.
    pub fn last_phase(&self) -> Arc<Mutex<String>> {
        Arc::clone(&self.last)
    }

    /// Seconds since the run began.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
