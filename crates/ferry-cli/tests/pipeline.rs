//! `ferry pipeline` end to end: real stage processes (and the in-process mode), byte-exact
//! output for awkward sizes up to 1 GiB, the XOR transform, stdin to stdout, a stage
//! that dies mid-run, and one that is stopped.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const MIB: usize = 1 << 20;

fn ferry() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.env("RUST_BACKTRACE", "0");
    cmd
}

/// Spawns `ferry pipeline - - ARGS` reading a piped stdin, with stderr piped and stdout
/// piped (`capture_stdout`) or discarded.
fn spawn_stdio_pipeline(args: &[&str], capture_stdout: bool) -> std::process::Child {
    ferry()
        .args(["pipeline", "-", "-"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(if capture_stdout {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ferry-pipeline-{}-{name}", std::process::id()))
}

/// Removes the file when the test ends, pass or fail.
struct Temp(PathBuf);

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Deterministic bytes that differ at every offset and from block to block: an xorshift
/// stream seeded by `seed`, written in 1 MiB blocks.
fn pattern(seed: u64, block: usize, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (block as u64 + 1);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn write_pattern(path: &Path, seed: u64, len: usize) -> Temp {
    let mut w = BufWriter::with_capacity(MIB, File::create(path).unwrap());
    let mut at = 0;
    let mut block = 0;
    while at < len {
        let n = MIB.min(len - at);
        w.write_all(&pattern(seed, block, n)).unwrap();
        at += n;
        block += 1;
    }
    w.flush().unwrap();
    Temp(path.to_path_buf())
}

/// Streams `path` and checks it equals the pattern XOR `xor`, without holding it in memory.
fn assert_pattern(path: &Path, seed: u64, len: usize, xor: u8) {
    let mut f = File::open(path).unwrap();
    assert_eq!(f.metadata().unwrap().len() as usize, len, "output length");
    let mut buf = vec![0u8; MIB];
    let mut at = 0;
    let mut block = 0;
    while at < len {
        let n = MIB.min(len - at);
        f.read_exact(&mut buf[..n]).unwrap();
        let mut want = pattern(seed, block, n);
        want.iter_mut().for_each(|b| *b ^= xor);
        if buf[..n] != want[..] {
            let i = (0..n).find(|&i| buf[i] != want[i]).unwrap();
            panic!("output differs at byte {}", at + i);
        }
        at += n;
        block += 1;
    }
}

fn ok(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "ferry failed: {err}");
    err
}

fn run_file(name: &str, len: usize, args: &[&str], xor: u8) -> String {
    let input = scratch(&format!("{name}-in"));
    let output = scratch(&format!("{name}-out"));
    let _i = write_pattern(&input, len as u64, len);
    let _o = Temp(output.clone());
    let out = ferry()
        .arg("pipeline")
        .arg(&input)
        .arg(&output)
        .args(args)
        .output()
        .unwrap();
    let err = ok(&out);
    assert_pattern(&output, len as u64, len, xor);
    err
}

#[test]
fn awkward_sizes_come_out_byte_identical() {
    for len in [0, 1, 4095, 4097, 10 * MIB] {
        let err = run_file(&format!("size{len}"), len, &["--pallet-size", "64K"], 0);
        assert!(
            err.contains(&format!("{len} bytes in")),
            "summary line: {err}"
        );
    }
}

#[test]
fn one_gib_comes_out_byte_identical() {
    let err = run_file("gib", 1 << 30, &[], 0);
    assert!(err.contains("1073741824 bytes in"), "{err}");
    eprintln!("{err}");
}

#[test]
fn xor_transform_is_applied_once() {
    // Stage 1 XORs everything; the others touch a quarter of each pallet and change nothing.
    run_file(
        "xor",
        3 * MIB + 5,
        &["--xor", "0x5a", "--touch", "0.25", "--pallet-size", "256K"],
        0x5a,
    );
}

#[test]
fn in_process_stages_run_the_same_code() {
    let err = run_file(
        "inproc",
        5 * MIB + 1,
        &[
            "--in-process",
            "--touch",
            "0.5",
            "--xor",
            "0xff",
            "--stages",
            "4",
        ],
        0xff,
    );
    assert!(err.contains("threads"), "{err}");
}

#[test]
fn stdin_to_stdout() {
    let len = 2 * MIB + 17;
    let input = scratch("stdio-in");
    let _i = write_pattern(&input, 7, len);
    // stdin is a pipe, so the source splices rather than sendfiles.
    let mut child = spawn_stdio_pipeline(&["--stages", "2", "--pallet-size", "16K"], true);
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let mut f = File::open(input).unwrap();
        std::io::copy(&mut f, &mut stdin).unwrap();
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    ok(&out);
    assert_eq!(out.stdout.len(), len);
    let mut want = Vec::new();
    for (b, at) in (0..len).step_by(MIB).enumerate() {
        want.extend(pattern(7, b, MIB.min(len - at)));
    }
    assert!(out.stdout == want, "stdout differs from stdin");
}

/// Pids of the stages, from the `-v` lines `stage K: pid P`.
fn stage_pids(stderr: &str) -> Vec<u32> {
    stderr
        .lines()
        .filter_map(|l| {
            l.split_once(": pid ")
                .map(|(_, p)| p.trim().parse().unwrap())
        })
        .collect()
}

/// Spawns `ferry pipeline - - ARGS -v` and reads its stderr on a thread, handing over each
/// line, so the stage pids arrive while the pipeline runs. Returns the child, the line
/// channel and its reader thread, the stderr read so far, and the three stage pids.
fn spawn_with_pids(
    args: &[&str],
) -> (
    std::process::Child,
    std::sync::mpsc::Receiver<String>,
    std::thread::JoinHandle<()>,
    String,
    Vec<u32>,
) {
    let mut all = args.to_vec();
    all.push("-v");
    let mut child = spawn_stdio_pipeline(&all, false);
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut err = String::new();
    let mut pids = Vec::new();
    while pids.len() < 3 {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no stage pids: {err}"));
        err.push_str(&line);
        err.push('\n');
        pids = stage_pids(&err);
    }
    (child, rx, reader, err, pids)
}

#[test]
fn killed_stage_stops_the_pipeline_cleanly() {
    let (mut child, rx, reader, mut err, pids) =
        spawn_with_pids(&["--stages", "3", "--pallet-size", "64K"]);
    // Data in flight (stdin still open, so the run cannot have ended by itself), then
    // stage 2 dies the way a crashing process does. Closing stdin after that lets the
    // source thread end too (one blocked reading an open input is left behind by design).
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&pattern(3, 0, MIB)).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pids[1] as i32).unwrap(),
        rustix::process::Signal::ABORT,
    )
    .unwrap();
    drop(stdin);
    let status = wait_bounded(&mut child, 60);
    reader.join().unwrap();
    err.extend(rx.try_iter().map(|l| l + "\n"));
    assert!(!status.success(), "should fail: {err}");
    let culprit = format!("stage 2 (pid {}) was killed by signal 6 (SIGABRT)", pids[1]);
    assert!(err.contains(&culprit), "no {culprit:?} in: {err}");
    // No stage is left running or unreaped (a zombie would still have a /proc entry).
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            !stat.contains("(ferry)"),
            "stage pid {pid} still exists: {stat}"
        );
    }
    // The pipeline process closed every descriptor it opened, memfds included.
    let fds = err
        .lines()
        .find(|l| l.contains("descriptors before"))
        .unwrap_or_else(|| panic!("no descriptor line: {err}"));
    let nums: Vec<usize> = fds
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(nums.len(), 4, "{fds}");
    assert_eq!((nums[2], nums[3]), (nums[0], 0), "{fds}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let out = ferry()
        .args(["pipeline", "/nonexistent/ferry-input", "-"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("open input"));
}

/// Waits up to `secs` for the child to exit; kills it and fails if it does not.
fn wait_bounded(child: &mut std::process::Child, secs: u64) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the pipeline did not stop within {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn stopped_stage_is_named_after_the_stall_timeout() {
    let mut child = spawn_stdio_pipeline(
        &[
            "--stages",
            "3",
            "--pallet-size",
            "64K",
            "-v",
            "--stall-timeout",
            "1",
        ],
        false,
    );
    // Read stderr on a thread, handing over each line, so the stage pids arrive while the
    // pipeline runs.
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut err = String::new();
    let mut pids = Vec::new();
    while pids.len() < 3 {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no stage pids: {err}"));
        err.push_str(&line);
        err.push('\n');
        pids = stage_pids(&err);
    }
    // Stop stage 2, then feed data (and keep stdin open): nothing can reach the output.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pids[1] as i32).unwrap(),
        rustix::process::Signal::STOP,
    )
    .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&pattern(5, 0, MIB)).unwrap();
    let status = wait_bounded(&mut child, 60);
    drop(stdin);
    reader.join().unwrap();
    err.extend(rx.try_iter().map(|l| l + "\n"));
    assert!(!status.success(), "should fail: {err}");
    let culprit = format!("stage 2 (pid {}) stopped", pids[1]);
    assert!(err.contains(&culprit), "no {culprit:?} in: {err}");
    assert!(err.contains("--stall-timeout"), "{err}");
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            !stat.contains("(ferry)"),
            "stage pid {pid} still exists: {stat}"
        );
    }
}

#[test]
fn idle_input_without_a_stopped_stage_says_so() {
    let mut child = spawn_stdio_pipeline(&["--stages", "2", "--stall-timeout", "0.5"], false);
    let stdin = child.stdin.take().unwrap(); // open, and silent
    let status = wait_bounded(&mut child, 60);
    drop(stdin);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "should fail: {err}");
    assert!(err.contains("every stage was still running"), "{err}");
}
