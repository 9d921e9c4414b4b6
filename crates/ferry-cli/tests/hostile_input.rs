//! The `ferry` binary against bad input: every user subcommand run with values that are
//! not numbers, not finite, negative, zero, huge or empty, with garbage group files,
//! a closed stdout and a tiny descriptor limit, must end within its time with a
//! message that says what is wrong and no panic, abort or signal. Then, as separate
//! tests: `ferry pipeline` never damages an existing file (an output that is its input
//! is refused; a run killed midway leaves the old file), `ferry sub` and `ferry pub`
//! leave their group cleanly on SIGINT and SIGTERM, and under the default policy a
//! stopped subscriber stalls neither the publisher nor the other subscriber.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long any one command may take before the test kills it and fails.
const LIMIT: Duration = Duration::from_secs(20);

fn ferry() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    // The messages are checked as a user sees them, whatever the caller's environment.
    cmd.env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .env_remove("FERRY_PIPELINE_KILL_STAGE");
    cmd
}

/// A group name of this test process, so that nothing here touches another's files.
fn group(tag: &str) -> String {
    format!("clihostile-{tag}-{}", std::process::id())
}

fn shm(group: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ferry.{group}"))
}

/// The write end of a pipe whose read end is already closed: writing to it fails with
/// EPIPE, as stdout does under `| head -1` once `head` has exited.
fn closed_pipe() -> OwnedFd {
    let (r, w) = rustix::pipe::pipe().unwrap();
    drop(r);
    w
}

/// Sets the soft descriptor limit of the child about to be executed.
fn limit_descriptors(cmd: &mut Command, n: u64) {
    // SAFETY: the closure runs in the child between fork and exec, where it only calls
    // setrlimit(2), which is async-signal-safe, with a value on its own stack.
    unsafe {
        cmd.pre_exec(move || {
            let mut r = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            r.rlim_cur = n as libc::rlim_t;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes the child about to be executed run as user and group `nobody` (65534).
fn run_as_nobody(cmd: &mut Command) {
    // SAFETY: the closure runs in the child between fork and exec, where it only calls
    // setgroups(2), setgid(2) and setuid(2), which are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Waits up to `limit` for `child`; kills it and returns `None` if it is still running.
fn wait_for(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn read_all(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut s);
        }
        String::from_utf8_lossy(&s).into_owned()
    })
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

// ---------------------------------------------------------------- the table

/// What a case must end with.
#[derive(Clone, Debug)]
enum Expect {
    /// A failure: a status other than 0, and stderr containing this text.
    Fails(&'static str),
    /// As `Fails`, with a text made at run time (a path).
    FailsNaming(String),
    /// Success (status 0), e.g. a closed stdout.
    Quiet,
    /// Any status, as long as it is not a crash (a command that reports on stdout).
    NoCrash,
}

struct Case {
    args: Vec<String>,
    expect: Expect,
    /// Stdin is one line of this many bytes with no newline, written until the reader
    /// goes (else /dev/null).
    long_line: Option<usize>,
    closed_stdout: bool,
    nofile: Option<u64>,
    /// A `ferry pub GROUP s` runs while the case does.
    publisher: Option<String>,
    /// Written to this file (a group's) just before the case runs.
    garbage: Option<(PathBuf, Vec<u8>)>,
    /// Run as user and group `nobody` (65534); skipped unless the test runs as root.
    as_nobody: bool,
}

fn case(args: &[&str], expect: Expect) -> Case {
    Case {
        args: args.iter().map(|s| s.to_string()).collect(),
        expect,
        long_line: None,
        closed_stdout: false,
        nofile: None,
        publisher: None,
        garbage: None,
        as_nobody: false,
    }
}

impl Case {
    fn long_line(mut self, n: usize) -> Case {
        self.long_line = Some(n);
        self
    }
    fn closed_stdout(mut self) -> Case {
        self.closed_stdout = true;
        self
    }
    fn nofile(mut self, n: u64) -> Case {
        self.nofile = Some(n);
        self
    }
    fn publisher(mut self, group: &str) -> Case {
        self.publisher = Some(group.to_owned());
        self
    }
    fn by_nobody(mut self) -> Case {
        self.as_nobody = true;
        self
    }
    fn garbage(mut self, group: &str, bytes: &[u8]) -> Case {
        self.garbage = Some((shm(group), bytes.to_vec()));
        self
    }
}

/// Starts `ferry pub GROUP s` (stdin kept open) and waits until it offers `s`.
fn start_publisher(group: &str) -> Child {
    let p = ferry()
        .args(["pub", group, "s"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A subscriber that takes no message ends as soon as the service is there.
    let mut probe = ferry()
        .args(["sub", group, "s", "--count", "0", "--timeout", "20"])
        .spawn()
        .unwrap();
    let st = wait_for(&mut probe, LIMIT).expect("the probe subscriber hung");
    assert!(st.success(), "the publisher never offered its service");
    p
}

/// Runs one case; returns what was wrong with its outcome, if anything.
fn run(c: &Case, dir: &Path) -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if c.as_nobody && unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped (needs root to become nobody): ferry {:?}", c.args);
        return None;
    }
    if let Some((path, bytes)) = &c.garbage {
        std::fs::write(path, bytes).unwrap();
        // Owner-only, as a file of ours is: a file others may write is refused before its
        // contents are looked at (that case has rows of its own).
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    }
    let mut publisher = c.publisher.as_deref().map(start_publisher);
    let mut cmd = ferry();
    cmd.args(&c.args)
        .current_dir(dir)
        .stdin(if c.long_line.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(if c.closed_stdout {
            Stdio::from(closed_pipe())
        } else {
            Stdio::piped()
        })
        .stderr(Stdio::piped());
    if let Some(n) = c.nofile {
        limit_descriptors(&mut cmd, n);
    }
    if c.as_nobody {
        run_as_nobody(&mut cmd);
    }
    let mut child = cmd.spawn().unwrap();
    let feeder = c.long_line.map(|n| {
        let mut w = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            let block = vec![b'x'; 1 << 20];
            let mut sent = 0;
            while sent < n && w.write_all(&block).is_ok() {
                sent += block.len();
            }
        })
    });
    let out = read_all(child.stdout.take());
    let err = read_all(child.stderr.take());
    let status = wait_for(&mut child, LIMIT);
    if let Some(f) = feeder {
        let _ = f.join();
    }
    let (_out, err) = (out.join().unwrap(), err.join().unwrap());
    if let Some(mut p) = publisher.take() {
        drop(p.stdin.take());
        let _ = wait_for(&mut p, LIMIT);
    }
    let Some(status) = status else {
        return Some(format!("still running after {LIMIT:?}; stderr: {err}"));
    };
    let mut wrong = Vec::new();
    if let Some(sig) = status.signal() {
        wrong.push(format!("killed by signal {sig}"));
    }
    if matches!(status.code(), Some(101 | 134)) {
        wrong.push(format!("status {status} (a panic or an abort)"));
    }
    for bad in ["panicked", "RUST_BACKTRACE", "stack backtrace"] {
        if err.contains(bad) {
            wrong.push(format!("stderr says {bad:?}"));
        }
    }
    let must_say = match &c.expect {
        Expect::Fails(w) => Some(*w),
        Expect::FailsNaming(w) => Some(w.as_str()),
        Expect::Quiet | Expect::NoCrash => None,
    };
    if let Some(what) = must_say {
        if status.success() {
            wrong.push("succeeded".into());
        }
        if err.trim().is_empty() {
            wrong.push("said nothing on stderr".into());
        } else if !err.contains(what) {
            wrong.push(format!("stderr lacks {what:?}"));
        }
    }
    if matches!(c.expect, Expect::Quiet) && !status.success() {
        wrong.push(format!("status {status}"));
    }
    (!wrong.is_empty()).then(|| format!("{}; stderr: {err}", wrong.join(", ")))
}

/// Every user subcommand with bad values, garbage group files, a closed stdout and too
/// few descriptors: each ends within [`LIMIT`] with a clear message, no panic, no abort
/// and no signal, and leaves no file of its (fresh, private) group behind.
#[test]
fn bad_input_never_panics_aborts_or_hangs() {
    use Expect::*;
    let dir = std::env::temp_dir().join(format!("ferry-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let g = group("table");
    let with_pub = group("table-pub");
    // Garbage where group files are expected: random bytes, zeros, one byte, nothing.
    let garbage = group("garbage");
    let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ std::process::id() as u64;
    let random: Vec<u8> = (0..65536)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    let junk: [&[u8]; 4] = [&random, &[0; 4096], &[0xff], &[]];
    let long_name = "n".repeat(300);
    let input = dir.join("input");
    std::fs::write(&input, vec![7u8; 100_000]).unwrap();
    let input = input.to_str().unwrap();

    let mut cases = vec![
        // sub
        case(&["sub", &g, "s", "--timeout", "nan"], Fails("finite")),
        case(&["sub", &g, "s", "--timeout", "inf"], Fails("finite")),
        case(&["sub", &g, "s", "--timeout=-1"], Fails("negative")),
        case(&["sub", &g, "s", "--timeout", "1e300"], Fails("at most")),
        case(&["sub", &g, "s", "--timeout", ""], Fails("not a number")),
        case(
            &["sub", &g, "s", "--timeout", "soon"],
            Fails("not a number"),
        ),
        case(&["sub", &g, "s", "--count=-5"], Fails("--count")),
        case(
            &["sub", &g, "s", "--timeout", "0"],
            Fails("no live service"),
        ),
        case(&["sub", &g, "", "--timeout", "0"], Fails("service name")),
        case(
            &["sub", &g, &long_name, "--timeout", "0"],
            Fails("service name"),
        ),
        case(&["sub", "", "s", "--timeout", "0"], Fails("group name")),
        case(&["sub", "a/b", "s", "--timeout", "0"], Fails("group name")),
        case(
            &["sub", &long_name, "s", "--timeout", "0"],
            Fails("group name"),
        ),
        case(
            &["sub", &g, "s", "--timeout", "0"],
            Fails("file descriptors"),
        )
        .nofile(4),
        case(
            &["sub", &g, "s", "--timeout", "0"],
            Fails("file descriptors"),
        )
        .nofile(5),
        case(
            &["sub", &with_pub, "s", "--timeout", "5"],
            Fails("too few file descriptors (ulimit -n is 8)"),
        )
        .nofile(8)
        .publisher(&with_pub),
        // pub
        case(
            &["pub", &g, "s", "--chunk", "99999999999999"],
            Fails("the path's quota of 536870912 bytes"),
        ),
        case(&["pub", &g, "s", "--chunk", "0"], Fails("at least 1")),
        case(&["pub", &g, "s", "--chunk=-1"], Fails("--chunk")),
        case(&["pub", &g, "s", "--chunk", "nan"], Fails("--chunk")),
        case(&["pub", &g, "s", "--depth", "3"], Fails("depth")),
        case(&["pub", &g, "s", "--depth", "0"], Fails("depth")),
        case(&["pub", &g, "s", "--depth", "4294967295"], Fails("depth")),
        case(
            &["pub", &g, "s", "--depth", "99999999999"],
            Fails("--depth"),
        ),
        case(
            &["pub", &g, "s", "--wait-subscribers", "99999999999"],
            Fails("at most"),
        ),
        case(
            &["pub", &g, "s", "--policy", "sometimes"],
            Fails("--policy"),
        ),
        case(&["pub", &g, ""], Fails("service name")),
        case(&["pub", "", "s"], Fails("group name")),
        case(&["pub", &g, "s"], Fails("file descriptors")).nofile(5),
        // One line larger than the path's quota (512 MiB).
        case(
            &["pub", &g, "s"],
            Fails("the path's quota of 536870912 bytes"),
        )
        .long_line(600 << 20),
        // stat
        case(&["stat"], Quiet).closed_stdout(),
        case(&["stat", &g], Quiet).closed_stdout(),
        case(&["stat", &g], NoCrash).nofile(3),
        // pipeline
        case(
            &["pipeline", input, "out", "--stall-timeout", "inf"],
            Fails("finite"),
        ),
        case(
            &["pipeline", input, "out", "--stall-timeout", "nan"],
            Fails("finite"),
        ),
        case(
            &["pipeline", input, "out", "--stall-timeout=-1"],
            Fails("negative"),
        ),
        case(
            &["pipeline", input, "out", "--stall-timeout", "1e300"],
            Fails("at most"),
        ),
        case(
            &["pipeline", input, "out", "--pallet-size", "0"],
            Fails("positive"),
        ),
        case(
            &["pipeline", input, "out", "--pallet-size", "99999999999G"],
            Fails("fit"),
        ),
        case(
            &["pipeline", input, "out", "--pallet-size", "lots"],
            Fails("bad size"),
        ),
        case(
            &["pipeline", input, "out", "--stages", "0"],
            Fails("--stages"),
        ),
        case(
            &["pipeline", input, "out", "--stages", "100000"],
            Fails("--stages"),
        ),
        case(
            &["pipeline", input, "out", "--touch", "nan"],
            Fails("fraction"),
        ),
        case(
            &["pipeline", input, "out", "--xor", "0x100"],
            Fails("bad byte"),
        ),
        case(
            &["pipeline", "/nonexistent/in", "out"],
            Fails("/nonexistent/in"),
        ),
        case(
            &["pipeline", input, "/nonexistent/dir/out"],
            Fails("/nonexistent/dir"),
        ),
        case(&["pipeline", "/", "out"], Fails("regular file")),
        case(&["pipeline", "", "out"], Fails("empty path")),
        case(&["pipeline", input, "."], Fails("directory")),
        case(&["pipeline", input, input], Fails("same file")),
        case(&["pipeline", input, "tcp-listen:99999"], Fails("bad port")),
        case(&["pipeline", input, "tcp:127.0.0.1:1"], Fails("connect")),
        case(&["pipeline", input, "-"], Quiet).closed_stdout(),
        case(&["pipeline", input, "out"], Fails("file descriptors")).nofile(6),
        case(
            &[
                "__stage",
                "--index",
                "1",
                "--up-fd",
                "999",
                "--down-fd",
                "998",
            ],
            Fails("not open"),
        ),
        // calibrate (nothing is measured: the arguments are refused first); the
        // benchmarks are not part of this tool
        case(&["bench", "handover"], Fails("bench")),
        case(&["calibrate", "--no-such-flag"], Fails("--no-such-flag")),
        case(&["calibrate", "--out"], Fails("--out")),
        case(&["no-such-command"], Fails("no-such-command")),
    ];
    // Files this user may not open: each error names the file.
    let private = group("private");
    let secret = dir.join("secret");
    std::fs::write(&secret, b"not for nobody").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let shm_private = shm(&private).display().to_string();
    let (secret, out_in_dir) = (
        secret.display().to_string(),
        dir.join("out").display().to_string(),
    );
    let dir_text = dir.display().to_string();
    cases.extend([
        case(
            &["sub", &private, "s", "--timeout", "0"],
            FailsNaming(shm_private.clone()),
        )
        .garbage(&private, b"")
        .by_nobody(),
        case(&["pub", &private, "s"], FailsNaming(shm_private))
            .garbage(&private, b"")
            .by_nobody(),
        case(&["stat", &private], NoCrash)
            .garbage(&private, b"")
            .by_nobody(),
        case(&["pipeline", &secret, "-"], FailsNaming(secret.clone())).by_nobody(),
        // The scratch directory is root's, 0755: no temporary file can be made there.
        case(&["pipeline", input, &out_in_dir], FailsNaming(dir_text)).by_nobody(),
    ]);
    for bytes in junk {
        let gb = garbage.as_str();
        cases.push(
            case(
                &["sub", gb, "s", "--timeout", "0"],
                Fails("no live service"),
            )
            .garbage(gb, bytes),
        );
        cases.push(case(&["pub", gb, "s", "--depth", "3"], Fails("depth")).garbage(gb, bytes));
        cases.push(case(&["stat", gb], NoCrash).garbage(gb, bytes));
        cases.push(case(&["stat"], NoCrash).garbage(gb, bytes));
    }

    let mut failures = Vec::new();
    for c in &cases {
        if let Some(why) = run(c, &dir) {
            failures.push(format!("ferry {:?}: {why}", c.args));
        }
        for name in [&g, &with_pub] {
            if shm(name).exists() {
                failures.push(format!("ferry {:?} left {}", c.args, shm(name).display()));
                let _ = std::fs::remove_file(shm(name));
            }
        }
    }
    let _ = std::fs::remove_file(shm(&garbage));
    let _ = std::fs::remove_file(shm(&private));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failures.is_empty(),
        "{} of {} cases went wrong:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------- pipeline outputs

/// A scratch directory of this test, removed when it ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("ferry-hostile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    /// Names in the directory other than `keep`.
    fn others(&self, keep: &[&str]) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !keep.contains(&n.as_str()))
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `ferry pipeline F F`, and F named otherwise (a symlink, a hard link, its
/// `/proc/self/fd` path, stdin and stdout redirected to it): refused, and F stays byte
/// for byte what it was, with nothing left beside it.
#[test]
fn pipeline_refuses_an_output_that_is_its_input() {
    let s = Scratch::new("same");
    let f = s.0.join("F");
    let want: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    std::fs::write(&f, &want).unwrap();
    std::os::unix::fs::symlink("F", s.0.join("L")).unwrap();
    std::fs::hard_link(&f, s.0.join("H")).unwrap();
    let runs: Vec<(&str, Vec<&str>, bool, bool)> = vec![
        // (what, args, stdin from F, stdout appended to F)
        ("F F", vec!["F", "F"], false, false),
        ("a symlink", vec!["F", "L"], false, false),
        ("a hard link", vec!["H", "F"], false, false),
        ("/proc/self/fd", vec!["-", "/proc/self/fd/0"], true, false),
        ("stdin", vec!["-", "F"], true, false),
        ("stdout", vec!["F", "-"], false, true),
    ];
    for (what, args, stdin_f, stdout_f) in runs {
        let mut cmd = ferry();
        cmd.arg("pipeline")
            .args(&args)
            .current_dir(&s.0)
            .stdin(if stdin_f {
                Stdio::from(File::open(&f).unwrap())
            } else {
                Stdio::null()
            })
            .stdout(if stdout_f {
                Stdio::from(File::options().append(true).open(&f).unwrap())
            } else {
                Stdio::null()
            })
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let err = read_all(child.stderr.take());
        let st = wait_for(&mut child, LIMIT).unwrap_or_else(|| panic!("{what}: hung"));
        let err = err.join().unwrap();
        assert!(!st.success(), "{what}: succeeded");
        assert!(err.contains("same file as the input"), "{what}: {err}");
        assert!(std::fs::read(&f).unwrap() == want, "{what}: F changed");
        assert_eq!(s.others(&["F", "L", "H"]), Vec::<String>::new(), "{what}");
    }
}

/// `ferry pipeline - OUT` stopped midway, with bytes already written, by SIGINT,
/// SIGTERM or SIGKILL: OUT keeps its old contents byte for byte; after SIGINT and
/// SIGTERM (statuses 130 and 143) no temporary file is left either (SIGKILL leaves one
/// that nothing renames).
#[test]
fn interrupted_pipeline_leaves_the_old_output() {
    let s = Scratch::new("interrupt");
    let out = s.0.join("OUT");
    let old = b"the old contents, which must survive\n".repeat(1000);
    for (sig, name) in [
        (libc::SIGINT, "SIGINT"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGKILL, "SIGKILL"),
    ] {
        std::fs::write(&out, &old).unwrap();
        let mut child = ferry()
            .args([
                "pipeline",
                "-",
                "OUT",
                "--pallet-size",
                "64K",
                "--pallets",
                "1",
            ])
            .current_dir(&s.0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = read_all(child.stderr.take());
        let mut stdin = child.stdin.take().unwrap();
        // Feed until some bytes have reached the output being written (the old file,
        // or a file beside it), keeping stdin open so the run cannot finish.
        let deadline = Instant::now() + LIMIT;
        let block = vec![0x5au8; 256 << 10];
        loop {
            stdin.write_all(&block).unwrap();
            let written: u64 = std::fs::read_dir(&s.0)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum::<u64>()
                .saturating_sub(old.len() as u64);
            if written > 0 || std::fs::read(&out).unwrap() != old {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: no byte was ever written"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        signal(child.id(), sig);
        let st = wait_for(&mut child, LIMIT).unwrap_or_else(|| panic!("{name}: hung"));
        drop(stdin);
        let err = err.join().unwrap();
        assert!(
            std::fs::read(&out).unwrap() == old,
            "{name}: the old output was changed ({err})"
        );
        if sig == libc::SIGKILL {
            assert_eq!(st.signal(), Some(libc::SIGKILL));
            for n in s.others(&["OUT"]) {
                std::fs::remove_file(s.0.join(n)).unwrap();
            }
        } else {
            assert_eq!(st.code(), Some(128 + sig), "{name}: {st} {err}");
            assert!(
                err.contains(&format!("interrupted by {name}")),
                "{name}: {err}"
            );
            assert_eq!(s.others(&["OUT"]), Vec::<String>::new(), "{name}");
        }
    }
}

// ---------------------------------------------------------------- signals and groups

/// Waits until process `pid` holds the file of `group` open (it has opened the group).
fn wait_until_in_group(pid: u32, group: &str) {
    let want = shm(group);
    let deadline = Instant::now() + LIMIT;
    loop {
        let held = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.flatten()
                    .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == want))
            })
            .unwrap_or(false);
        if held {
            return;
        }
        assert!(Instant::now() < deadline, "{pid} never opened {group}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `ferry sub`, the only member of its group and waiting for a service, stopped by
/// SIGINT or SIGTERM: it exits with 128 + the signal (not killed by it) and its group's
/// file is gone. Then with a publisher: SIGTERM ends the receiving subscriber, SIGINT
/// the publisher waiting for stdin, and the last one out removes the file.
#[test]
fn sub_and_pub_leave_their_group_on_sigint_and_sigterm() {
    for (sig, name) in [(libc::SIGINT, "int"), (libc::SIGTERM, "term")] {
        let g = group(&format!("alone-{name}"));
        let mut sub = ferry()
            .args(["sub", &g, "s", "--timeout", "3600"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        wait_until_in_group(sub.id(), &g);
        signal(sub.id(), sig);
        let st = wait_for(&mut sub, LIMIT).expect("sub did not stop");
        let left = shm(&g).exists();
        let _ = std::fs::remove_file(shm(&g));
        assert_eq!(st.code(), Some(128 + sig), "{st}");
        assert!(!left, "SIG{name}: /dev/shm/ferry.{g} was left behind");
    }

    let g = group("pair");
    let mut publisher = ferry()
        .args(["pub", &g, "s"])
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut sub = ferry()
        .args(["sub", &g, "s", "--timeout", "20"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // A line through both shows that the subscriber is receiving (one published before
    // it joined is not seen: keep sending).
    let lines = lines_of(sub.stdout.take().unwrap());
    let deadline = Instant::now() + LIMIT;
    loop {
        writeln!(publisher.stdin.as_mut().unwrap(), "ping").unwrap();
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(100)) {
            assert_eq!(l, "ping");
            break;
        }
        assert!(Instant::now() < deadline, "the subscriber never got a line");
    }
    signal(sub.id(), libc::SIGTERM);
    let st = wait_for(&mut sub, LIMIT).expect("sub did not stop");
    assert_eq!(st.code(), Some(128 + libc::SIGTERM), "sub: {st}");
    signal(publisher.id(), libc::SIGINT);
    let st = wait_for(&mut publisher, LIMIT).expect("pub did not stop");
    let left = shm(&g).exists();
    let _ = std::fs::remove_file(shm(&g));
    assert_eq!(st.code(), Some(128 + libc::SIGINT), "pub: {st}");
    assert!(!left, "/dev/shm/ferry.{g} was left behind");
}

/// `ferry sub` whose stdout reader has gone ends quietly with status 0 once it has a
/// message to write, and leaves the group.
#[test]
fn sub_with_a_closed_stdout_ends_quietly() {
    let g = group("closedout");
    let mut publisher = ferry()
        .args(["pub", &g, "s"])
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut sub = ferry()
        .args(["sub", &g, "s", "--timeout", "20"])
        .stdout(Stdio::from(closed_pipe()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = read_all(sub.stderr.take());
    let deadline = Instant::now() + LIMIT;
    let st = loop {
        writeln!(publisher.stdin.as_mut().unwrap(), "hello").unwrap();
        if let Some(st) = sub.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "sub never ended");
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(publisher.stdin.take());
    let _ = wait_for(&mut publisher, LIMIT);
    let left = shm(&g).exists();
    let _ = std::fs::remove_file(shm(&g));
    let err = err.join().unwrap();
    assert!(st.success(), "{st}: {err}");
    assert_eq!(err, "");
    assert!(!left, "/dev/shm/ferry.{g} was left behind");
}

/// Forwards each line `r` reads to the returned channel.
fn lines_of(r: impl Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Under `ferry pub`'s default policy, one subscriber stopped with SIGSTOP (its queue
/// full long before the end) holds up neither the publisher, which reads all of its
/// stdin and exits, nor the other subscriber, which gets every line. The lines go in
/// batches, each one once the running subscriber has printed the one before, so that it
/// never falls behind by a queue's worth.
#[test]
fn a_stopped_subscriber_stalls_no_one_by_default() {
    let g = group("stopped");
    const LINES: usize = 1000;
    const BATCH: usize = 20;
    let spawn_sub = || {
        ferry()
            .args(["sub", &g, "s", "--timeout", "20"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (mut running, mut stopped) = (spawn_sub(), spawn_sub());
    let mut publisher = ferry()
        .args(["pub", &g, "s", "--wait-subscribers", "2"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pub_err = read_all(publisher.stderr.take());
    let running_lines = lines_of(running.stdout.take().unwrap());
    let stopped_lines = lines_of(stopped.stdout.take().unwrap());
    let mut stdin = publisher.stdin.take().unwrap();
    // The first line reaches both: they are connected and receiving.
    writeln!(stdin, "line 0").unwrap();
    for rx in [&running_lines, &stopped_lines] {
        assert_eq!(rx.recv_timeout(LIMIT).as_deref(), Ok("line 0"));
    }
    signal(stopped.id(), libc::SIGSTOP);
    let mut outcome = Ok(());
    'feed: for start in (1..LINES).step_by(BATCH) {
        let end = (start + BATCH).min(LINES);
        for i in start..end {
            writeln!(stdin, "line {i}").unwrap();
        }
        for i in start..end {
            match running_lines.recv_timeout(LIMIT) {
                Ok(l) if l == format!("line {i}") => {}
                other => {
                    outcome = Err(format!("line {i}: the running subscriber got {other:?}"));
                    break 'feed;
                }
            }
        }
    }
    drop(stdin);
    let pub_status = wait_for(&mut publisher, LIMIT);
    signal(stopped.id(), libc::SIGCONT);
    for c in [&mut running, &mut stopped] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = std::fs::remove_file(shm(&g));
    let pub_err = pub_err.join().unwrap();
    outcome.unwrap();
    assert!(
        pub_status.is_some_and(|s| s.success()),
        "the publisher did not finish: {pub_status:?} {pub_err}"
    );
}
