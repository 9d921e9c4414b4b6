//! `ferry calibrate` end to end: real worker processes (the hand-over's, which the
//! `ferry` binary serves itself), the calibration file, and no group left behind.

use std::path::PathBuf;
use std::process::Command;

fn ferry() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.env("CI", "true");
    cmd
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferry-cli-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `ferry ARGS...`, asserts it succeeded, and returns its pid and stdout.
fn run_ok(args: &[&std::ffi::OsStr]) -> (u32, String) {
    let child = ferry()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (pid, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Groups a run of the `ferry` process `pid` left in /dev/shm.
fn groups_left(pid: u32) -> Vec<String> {
    let prefixes = [format!("ferry.bench-{pid}-"), format!("ferry.calib-{pid}-")];
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
        .collect()
}

#[test]
fn calibrate_writes_a_file_the_library_reads() {
    let dir = scratch("calibrate");
    let file = dir.join("sub").join("calibration");
    let (pid, stdout) = run_ok(&[
        "calibrate".as_ref(),
        "--quick".as_ref(),
        "--out".as_ref(),
        file.as_os_str(),
    ]);
    assert!(stdout.contains("Tables 6 and 7") && stdout.contains("TCOW-fault bar"));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("# ferry calibration, written by `ferry calibrate` on "));
    let cal = ferry::semantics::Calibration::parse(&text).unwrap();
    // The primitives that need no privilege or kernel option are always there.
    for p in [
        "copy_in",
        "copy_in_local",
        "copy_out",
        "handover",
        "protect_mprotect",
        "hide",
        "swap",
    ] {
        let f = cal.fits.get(p).unwrap_or_else(|| panic!("no fit for {p}"));
        assert!(
            f.r2.is_finite() && f.a.is_finite() && f.b.is_finite(),
            "{p}: {f:?}"
        );
    }
    // The model answers for every semantics whose primitives were measured.
    for s in ferry::semantics::Semantics::ALL {
        let terms = cal.recipe(s, 1 << 20);
        if terms.iter().all(|t| cal.fits.contains_key(t.primitive)) {
            assert!(cal.predict(s, 1 << 20).is_some(), "{s}");
        }
    }
    assert!(
        groups_left(pid).is_empty(),
        "left behind: {:?}",
        groups_left(pid)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_tool_has_no_benchmarks() {
    let help = ferry().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("calibrate") && text.contains("pipeline"),
        "{text}"
    );
    assert!(!text.contains("bench"), "{text}");
    for args in [
        &["bench", "all", "--quick"][..],
        &["__drain", "g", "s", "1", "0"],
    ] {
        let out = ferry().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand"),
            "{args:?}"
        );
    }
    // Its hidden worker serves the calibration's hand-over only.
    let plan = r#"{"pattern":"stream","wait":"block","touch":"word","sizes":[4096],"msgs":[1],"warmup":[0],"trials":1}"#;
    let out = ferry()
        .args(["__worker", "sink", "--plan", plan, "--rx", "987"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a worker role of `ferry`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The binary is built without the library's test hooks (`ferry::testing`): `ferry
/// calibrate` reaches ferry-measure, whose hooks only the benchmarks' feature `bench`
/// turns on. Asked of cargo, for the package alone as `cargo build -p ferry-cli` and
/// `cargo install` build it.
#[test]
fn the_tool_has_no_test_hooks() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root)
        .args([
            "tree",
            "--offline",
            "-p",
            "ferry-cli",
            "-e",
            "normal,features",
        ])
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && tree.contains("ferry feature \"semantics\""),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!tree.contains("ferry feature \"testing\""), "{tree}");
}
