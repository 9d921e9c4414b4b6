//! What machine the numbers come from.

use serde::Serialize;

/// Facts about the machine printed at the top of every report.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub kernel: String,
    pub cpu_model: String,
    pub online_cpus: usize,
    /// The two CPUs that the processes of a pair are pinned to.
    pub pinned_cpus: [usize; 2],
    /// `/proc/sys/fs/pipe-max-size`, the largest pipe an unprivileged process may ask for.
    pub pipe_max_size: Option<usize>,
}

impl Machine {
    pub fn probe(pinned_cpus: [usize; 2]) -> Machine {
        let kernel = rustix::system::uname()
            .release()
            .to_string_lossy()
            .into_owned();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let online_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pipe_max_size = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
            .ok()
            .and_then(|s| s.trim().parse().ok());
        Machine {
            kernel,
            cpu_model,
            online_cpus,
            pinned_cpus,
            pipe_max_size,
        }
    }

    /// The Markdown list printed at the top of a report.
    pub fn markdown(&self) -> String {
        format!(
            "- kernel: {}\n- CPU: {} ({} online)\n- pinning: source on CPU {}, sink on CPU {}; in a 3-process chain the stage runs on CPU {} and the sink joins the source on CPU {}\n- pipe-max-size: {}\n",
            self.kernel,
            self.cpu_model,
            self.online_cpus,
            self.pinned_cpus[0],
            self.pinned_cpus[1],
            self.pinned_cpus[1],
            self.pinned_cpus[0],
            self.pipe_max_size.map_or("unknown".into(), |n| format!("{n} bytes")),
        )
    }
}
