//! `ferry pipeline`: moves a file, stdin or a TCP stream through N stages to a file, stdout
//! or a TCP stream, shipping containers of memfd pallets between the stages.
//!
//! ```text
//!            fill (sendfile/splice)                                  empty (sendfile/splice)
//!   input ──────────────▶ source ─▶ stage 1 ─▶ … ─▶ stage N ─▶ sink ──────────────▶ output
//!                           ▲        (SCM_RIGHTS over Unix sockets)         │
//!                           └────────── emptied containers come back ───────┘
//! ```
//!
//! The source and the sink are threads of the `ferry pipeline` process; the stages are
//! processes (`ferry __stage`, each handed its two sockets by descriptor inheritance) or,
//! with `--in-process`, threads of the same process running the same [`stage::run`] over
//! the same kind of socket pairs: modularity without protection boundaries.
//!
//! The end of the data is a container with no pallets. A stage that sees its neighbour's
//! socket close before that exits with [`EXIT_NEIGHBOUR_GONE`], so the pipeline can tell
//! the stage that failed from the ones that stopped because of it.

mod stage;
mod stream_spec;

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ferry::containers::Container;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use stage::{StageConfig, StageError};
use stream_spec::StreamSpec;

/// Exit status of a stage process that stopped because a neighbour went away first.
const EXIT_NEIGHBOUR_GONE: i32 = 3;

/// Arguments of `ferry pipeline`.
#[derive(Debug, clap::Args)]
pub struct PipelineArgs {
    /// Input: a file, `-` for stdin, `tcp:HOST:PORT` to connect, `tcp-listen:PORT` to
    /// accept one connection. Must be a file, pipe or socket (not a terminal).
    #[arg(value_parser = StreamSpec::parse)]
    input: StreamSpec,
    /// Output: a file, `-` for stdout, `tcp:HOST:PORT`, `tcp-listen:PORT`. A file is
    /// written under a temporary name in its directory and renamed into place only
    /// after a successful run (so an existing file is replaced whole or not at all, and
    /// other hard links to it keep the old contents); it must not be the input.
    #[arg(value_parser = StreamSpec::parse)]
    output: StreamSpec,
    /// Number of stages between the source and the sink.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
    stages: u16,
    /// Size of each pallet (K/KiB, M/MiB, G/GiB are powers of 1024; rounded up to pages).
    #[arg(long, default_value = "2MiB", value_parser = parse_size)]
    pallet_size: usize,
    /// Pallets per container.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pallets: u16,
    /// Containers in circulation (bounds the memory in use to containers x pallets x size).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1024))]
    containers: u16,
    /// Every stage unloads (maps) each pallet and reads and writes back this fraction of
    /// its valid bytes, 0 to 1. Without it (and without --xor) containers pass unmapped.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    touch: f64,
    /// Stage 1 XORs every byte with this constant (e.g. 0x5a), so the output is the input
    /// XOR the constant. Other stages are unaffected.
    #[arg(long, value_parser = parse_byte)]
    xor: Option<u8>,
    /// Run the stages as threads of this process instead of child processes (same code).
    #[arg(long)]
    in_process: bool,
    /// Print the stage pids and the pipeline's descriptor counts before and after the run.
    #[arg(short, long)]
    verbose: bool,
    /// Give up when no byte has reached the output for this many seconds, naming any stage
    /// that is stopped (SIGSTOP, a debugger); 0 waits for ever (an idle TCP input may be
    /// legitimate).
    #[arg(long, value_name = "SECS", default_value = "0", value_parser = crate::cli_util::parse_secs)]
    stall_timeout: Duration,
}

/// Arguments of `ferry __stage`, one stage process spawned by `ferry pipeline`.
#[derive(Debug, clap::Args)]
pub struct StageArgs {
    /// Stage number, 1-based.
    #[arg(long)]
    index: usize,
    /// Inherited descriptor of the socket containers arrive on.
    #[arg(long)]
    up_fd: i32,
    /// Inherited descriptor of the socket containers leave on.
    #[arg(long)]
    down_fd: i32,
    /// See `ferry pipeline --touch`.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    touch: f64,
    /// See `ferry pipeline --xor`.
    #[arg(long, value_parser = parse_byte)]
    xor: Option<u8>,
    /// See `ferry pipeline --verbose`.
    #[arg(long)]
    verbose: bool,
}

/// `ferry __stage`: runs one stage on the inherited sockets and exits: 0 after the end of
/// the data, [`EXIT_NEIGHBOUR_GONE`] if a neighbour went away, 1 on its own failure.
pub fn run_stage_process(args: StageArgs) -> Result<()> {
    let up = UnixStream::from(crate::sys::inherited_fd(args.up_fd)?);
    let down = UnixStream::from(crate::sys::inherited_fd(args.down_fd)?);
    let cfg = StageConfig {
        index: args.index,
        touch: args.touch,
        xor: args.xor,
        verbose: args.verbose,
    };
    match stage::run(&cfg, &up, &down) {
        Ok(_) => Ok(()),
        Err(StageError::NeighbourGone(_)) => std::process::exit(EXIT_NEIGHBOUR_GONE),
        Err(StageError::Failed(m)) => {
            eprintln!("ferry {m}");
            std::process::exit(1)
        }
    }
}

/// A stage as the pipeline sees it: a child process or a thread.
enum Stage {
    Process {
        index: usize,
        child: Child,
    },
    Thread {
        index: usize,
        handle: JoinHandle<Result<stage::StageReport, StageError>>,
    },
}

/// `ferry pipeline`.
pub fn run(args: PipelineArgs) -> Result<()> {
    let fds_before = FdCount::now();
    // A signal must not end the run before the temporary output is removed.
    ferry::stop::catch_signals().context("catching SIGINT and SIGTERM")?;
    let (input, input_len) = args.input.open_input()?;
    // Dropped on any early return: removes the temporary output.
    let (output, direct, replacement) = args.output.open_output(&input)?;

    // Socket k joins hop k: 0 is source -> stage 1, N is stage N -> sink.
    let n = args.stages as usize;
    let mut ups: Vec<Option<UnixStream>> = Vec::with_capacity(n + 1);
    let mut downs: Vec<Option<UnixStream>> = Vec::with_capacity(n + 1);
    for _ in 0..=n {
        let (tx, rx) = UnixStream::pair().context("socketpair")?;
        downs.push(Some(tx));
        ups.push(Some(rx));
    }
    let source_tx = downs[0].take().expect("hop 0");
    let sink_rx = ups[n].take().expect("hop n");

    let mut stages = Vec::with_capacity(n);
    for index in 1..=n {
        let up = ups[index - 1].take().expect("each hop once");
        let down = downs[index].take().expect("each hop once");
        let cfg = StageConfig {
            index,
            touch: args.touch,
            xor: if index == 1 { args.xor } else { None },
            verbose: args.verbose,
        };
        let s = if args.in_process {
            let handle = std::thread::Builder::new()
                .name(format!("stage {index}"))
                .spawn(move || stage::run(&cfg, &up, &down))
                .context("spawn a stage thread")?;
            Stage::Thread { index, handle }
        } else {
            match spawn_stage(&cfg, &up, &down) {
                Ok(child) => {
                    if args.verbose {
                        eprintln!("ferry pipeline: stage {index}: pid {}", child.id());
                    }
                    Stage::Process { index, child }
                }
                Err(e) => {
                    stop(&mut stages);
                    return Err(e);
                }
            }
        };
        // The parent's copies of this stage's ends close here (for a thread they moved).
        stages.push(s);
    }

    let moved = Arc::new(AtomicU64::new(0));
    let (back_tx, back_rx) = sync_channel(args.containers as usize);
    let sizes = vec![args.pallet_size; args.pallets as usize];
    let containers = args.containers as usize;
    let source = std::thread::Builder::new()
        .name("source".into())
        .spawn(move || source(input, source_tx, &sizes, containers, back_rx))
        .context("spawn the source thread")?;
    let sink = {
        let moved = moved.clone();
        std::thread::Builder::new()
            .name("sink".into())
            .spawn(move || sink(sink_rx, output, direct, back_tx, &moved))
            .context("spawn the sink thread")?
    };

    let bar = progress_bar(input_len);
    let start = Instant::now();
    let stall = (!args.stall_timeout.is_zero()).then_some(args.stall_timeout);
    let result = supervise(source, sink, &mut stages, &bar, &moved, stall);
    let secs = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    if args.verbose {
        let fds_after = FdCount::now();
        eprintln!(
            "ferry pipeline: descriptors before {} (memfds {}), after {} (memfds {})",
            fds_before.all, fds_before.memfds, fds_after.all, fds_after.memfds
        );
    }
    let bytes = match (result, &replacement) {
        (Ok(b), _) => b,
        (Err(e), Some(r)) if r.target().exists() => {
            return Err(e.context(format!("{} left as it was", r.target().display())))
        }
        (Err(e), _) => return Err(e),
    };
    if let Some(r) = replacement {
        r.commit()?;
    }
    eprintln!(
        "ferry pipeline: {bytes} bytes in {secs:.3} s, {:.2} GB/s ({n} stages, {})",
        bytes as f64 / secs.max(1e-9) / 1e9,
        if args.in_process {
            "threads"
        } else {
            "processes"
        }
    );
    Ok(())
}

/// Spawns `ferry __stage` with `up` and `down` inherited. Only the main thread spawns, so
/// clearing `FD_CLOEXEC` just before the spawn lets exactly this child inherit the two
/// descriptors; the caller closes its copies right after.
fn spawn_stage(cfg: &StageConfig, up: &UnixStream, down: &UnixStream) -> Result<Child> {
    crate::sys::inheritable(up)?;
    crate::sys::inheritable(down)?;
    let exe = std::env::current_exe().context("find the ferry executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("__stage")
        .args(["--index", &cfg.index.to_string()])
        .args(["--up-fd", &up.as_raw_fd().to_string()])
        .args(["--down-fd", &down.as_raw_fd().to_string()])
        .args(["--touch", &cfg.touch.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if let Some(k) = cfg.xor {
        cmd.args(["--xor", &k.to_string()]);
    }
    if cfg.verbose {
        cmd.arg("--verbose");
    }
    cmd.spawn()
        .with_context(|| format!("spawn stage {}", cfg.index))
}

/// Fills containers from `input` and ships them to stage 1 until the input ends, then
/// ships the end marker. Allocates up to `containers` containers, then reuses the ones the
/// sink sends back. Returns the bytes read.
fn source(
    input: File,
    down: UnixStream,
    sizes: &[usize],
    containers: usize,
    back: Receiver<Container>,
) -> Result<u64> {
    let mut made = 0;
    let mut total = 0u64;
    loop {
        let mut c = if made < containers {
            made += 1;
            Container::alloc(sizes).context("allocate a container")?
        } else {
            back.recv()
                .map_err(|_| anyhow!("the sink stopped before the end of the data"))?
        };
        let mut eof = false;
        let mut got = 0;
        for i in 0..c.len() {
            if eof {
                c.set_valid(i, 0..0)?;
                continue;
            }
            let size = c.pallet(i)?.size();
            let n = c.fill(i, &input, size).context("read the input")?;
            got += n;
            eof = n < size;
        }
        total += got as u64;
        if got > 0 {
            c.ship(&down)
                .map_err(|e| anyhow!("ship to stage 1: {}", e.error))?;
        }
        if eof {
            Container::alloc(&[])?
                .ship(&down)
                .map_err(|e| anyhow!("ship the end of the data to stage 1: {}", e.error))?;
            return Ok(total);
        }
    }
}

/// Receives containers from the last stage and empties them to `output` until the end
/// marker arrives; sends each emptied container back to the source. Returns the bytes
/// written.
fn sink(
    up: UnixStream,
    mut output: File,
    direct: bool,
    back: SyncSender<Container>,
    moved: &AtomicU64,
) -> Result<u64> {
    let mut total = 0u64;
    loop {
        let mut c = match Container::receive(&up) {
            Ok(c) => c,
            Err(ferry::Error::Disconnected) => {
                bail!("the last stage closed its socket before the end of the data")
            }
            Err(e) => return Err(e).context("receive from the last stage"),
        };
        if c.is_empty() {
            output.flush()?;
            return Ok(total);
        }
        for i in 0..c.len() {
            if c.pallet(i)?.valid().is_empty() {
                continue;
            }
            let n = if direct {
                c.empty(i, &output).context("write the output")?
            } else {
                let v = c.view(i)?;
                output
                    .write_all(v.valid_bytes())
                    .context("write the output")?;
                v.valid_bytes().len()
            };
            total += n as u64;
            moved.store(total, Ordering::Relaxed);
        }
        // The source may have finished; then the container is simply freed.
        let _ = back.try_send(c);
    }
}

/// Waits for the source and the sink while updating the progress bar, then reaps the
/// stages. On any failure, names the stage that caused it, kills and reaps the others.
fn supervise(
    source: JoinHandle<Result<u64>>,
    sink: JoinHandle<Result<u64>>,
    stages: &mut Vec<Stage>,
    bar: &ProgressBar,
    moved: &AtomicU64,
    stall: Option<Duration>,
) -> Result<u64> {
    let mut source = Some(source);
    let mut sink = Some(sink);
    let mut read = None;
    let (mut last, mut since) = (0, Instant::now());
    let failure = loop {
        let now = moved.load(Ordering::Relaxed);
        bar.set_position(now);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if let Some(limit) = stall.filter(|&l| since.elapsed() >= l) {
            break stalled(stages, limit);
        }
        if source.as_ref().is_some_and(|s| s.is_finished()) {
            match join(source.take().expect("checked"), "source") {
                Ok(n) => read = Some(n),
                Err(e) => break e,
            }
        }
        if sink.as_ref().is_some_and(|s| s.is_finished()) {
            match join(sink.take().expect("checked"), "sink") {
                Ok(written) => {
                    // The end marker came through, so the source has finished too.
                    if let Some(s) = source.take() {
                        read = Some(join(s, "source")?);
                    }
                    if read != Some(written) {
                        break anyhow!("read {read:?} bytes but wrote {written}");
                    }
                    match reap(stages, false) {
                        Some(e) => return Err(e),
                        None => return Ok(written),
                    }
                }
                Err(e) => break e,
            }
        }
        if let Some(sig) = ferry::stop::signal() {
            break anyhow!("interrupted by {}", signal_name(sig).unwrap_or("a signal"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Something failed. Prefer the stage that failed by itself over the I/O error it
    // caused. Once the stages are gone, both I/O threads see their sockets close and end,
    // unless the source is blocked reading its input (stdin, TCP): that one is left behind.
    let cause = reap(stages, true);
    let deadline = Instant::now() + Duration::from_secs(1);
    for h in [source, sink].into_iter().flatten() {
        while !h.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if h.is_finished() {
            let _ = h.join();
        }
    }
    // Interrupted, the stages that died of the same Ctrl-C are not the cause.
    let cause = match ferry::stop::signal() {
        Some(_) => failure,
        None => cause.unwrap_or(failure),
    };
    // As context, so that the cause's own errors stay in the chain (a closed stdout is
    // told from a failure by its EPIPE).
    Err(cause.context("pipeline stopped"))
}

/// The error for a pipeline that moved nothing for `limit`: names the stages that are
/// stopped (state `T` or `t` in `/proc/PID/stat`), if any.
fn stalled(stages: &[Stage], limit: Duration) -> anyhow::Error {
    let stopped: Vec<String> = stages
        .iter()
        .filter_map(|s| match s {
            Stage::Process { index, child } if is_stopped(child.id()) => {
                Some(format!("stage {index} (pid {})", child.id()))
            }
            _ => None,
        })
        .collect();
    let secs = limit.as_secs_f64();
    if stopped.is_empty() {
        anyhow!("no data reached the output for {secs} s (--stall-timeout); every stage was still running")
    } else {
        anyhow!(
            "no data reached the output for {secs} s (--stall-timeout): {} stopped (SIGSTOP or a debugger)",
            stopped.join(", ")
        )
    }
}

/// Whether process `pid` is stopped by a signal or a tracer.
fn is_stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name, which is in parentheses and may hold spaces.
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .is_some_and(|c| c == 'T' || c == 't')
}

fn join(h: JoinHandle<Result<u64>>, what: &str) -> Result<u64> {
    h.join()
        .map_err(|_| anyhow!("the {what} thread panicked"))?
}

/// Reaps every stage and returns the first real failure (a stage killed by a signal, or one
/// that exited with an error of its own). With `failing`, stages still running after a
/// short grace period are killed.
fn reap(stages: &mut Vec<Stage>, failing: bool) -> Option<anyhow::Error> {
    let grace = Instant::now() + Duration::from_millis(if failing { 500 } else { 10_000 });
    let mut cause = None;
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; stages.len()];
    // Let the stages run down: the ones downstream of a failure see their sockets close.
    loop {
        let mut running = false;
        for (s, st) in stages.iter_mut().zip(statuses.iter_mut()) {
            if let (Stage::Process { child, .. }, None) = (s, &st) {
                match child.try_wait() {
                    Ok(Some(x)) => *st = Some(x),
                    Ok(None) => running = true,
                    Err(_) => {}
                }
            }
        }
        if !running || Instant::now() > grace {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for (s, st) in stages.drain(..).zip(statuses) {
        match s {
            Stage::Process { index, mut child } => {
                let pid = child.id();
                let status = match st {
                    Some(x) => x,
                    None => {
                        let _ = child.kill();
                        match child.wait() {
                            Ok(x) => x,
                            Err(e) => {
                                cause.get_or_insert(anyhow!("wait for stage {index}: {e}"));
                                continue;
                            }
                        }
                    }
                };
                if st.is_none() {
                    if !failing {
                        cause.get_or_insert(anyhow!(
                            "stage {index} (pid {pid}) did not exit after the end of the data"
                        ));
                    }
                    continue;
                }
                if let Some(e) = describe(index, pid, status) {
                    cause.get_or_insert(e);
                }
            }
            Stage::Thread { index, handle } => {
                // Threads end by themselves once their sockets close. After a failure one
                // may be stuck (a stall): leave it to the process's exit rather than hang.
                if failing && !handle.is_finished() {
                    continue;
                }
                match handle.join() {
                    Ok(Ok(_)) | Ok(Err(StageError::NeighbourGone(_))) => {}
                    Ok(Err(StageError::Failed(m))) => {
                        cause.get_or_insert(anyhow!("{m}"));
                    }
                    Err(_) => {
                        cause.get_or_insert(anyhow!("stage {index} (thread) panicked"));
                    }
                }
            }
        }
    }
    cause
}

/// An error naming the stage if `status` is a failure of its own.
fn describe(index: usize, pid: u32, status: ExitStatus) -> Option<anyhow::Error> {
    if let Some(sig) = status.signal() {
        return Some(anyhow!(
            "stage {index} (pid {pid}) was killed by signal {sig}{}",
            signal_name(sig)
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        ));
    }
    match status.code() {
        Some(0) | Some(EXIT_NEIGHBOUR_GONE) => None,
        Some(c) => Some(anyhow!(
            "stage {index} (pid {pid}) failed with exit status {c}"
        )),
        None => Some(anyhow!(
            "stage {index} (pid {pid}) ended abnormally: {status}"
        )),
    }
}

fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        6 => "SIGABRT",
        7 => "SIGBUS",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => return None,
    })
}

/// Kills and reaps stages already started (after a later spawn failed).
fn stop(stages: &mut Vec<Stage>) {
    for s in stages.drain(..) {
        if let Stage::Process { mut child, .. } = s {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Threads end when their sockets close, which dropping the pipeline does.
    }
}

fn progress_bar(len: Option<u64>) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match len {
        Some(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()),
        None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
    };
    let template = if len.is_some() {
        "{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {elapsed}"
    } else {
        "{spinner} {binary_bytes} {binary_bytes_per_sec} {elapsed}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// Descriptors open in this process, and how many of them are memfds.
struct FdCount {
    all: usize,
    memfds: usize,
}

impl FdCount {
    fn now() -> Self {
        let mut c = FdCount { all: 0, memfds: 0 };
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            for e in dir.flatten() {
                c.all += 1;
                if std::fs::read_link(e.path())
                    .is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:"))
                {
                    c.memfds += 1;
                }
            }
        }
        c
    }
}

/// Parses a byte count: a number with an optional K, KiB, M, MiB, G or GiB (powers of 1024).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        _ => return Err(format!("bad unit in {s:?} (use K, M or G)")),
    };
    match n.checked_mul(mult) {
        Some(0) | None => Err(format!("size {s:?} must be positive and fit in memory")),
        Some(v) => Ok(v),
    }
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    let f: f64 = s.parse().map_err(|_| format!("bad fraction {s:?}"))?;
    if (0.0..=1.0).contains(&f) {
        Ok(f)
    } else {
        Err(format!("fraction {s:?} must be between 0 and 1"))
    }
}

fn parse_byte(s: &str) -> Result<u8, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u8::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("bad byte {s:?} (0..255 or 0x00..0xff)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_bytes_parse() {
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("0").is_err());
        assert!(parse_size("3 parsecs").is_err());
        assert_eq!(parse_byte("0x5a"), Ok(0x5a));
        assert_eq!(parse_byte("90"), Ok(90));
        assert!(parse_byte("0x100").is_err());
        assert!(parse_fraction("1.5").is_err());
    }
}
