//! The READMEs' code is the examples' code, and the examples run.
//!
//! A fenced block in `README.md` or a binding's README that shows code names the file it
//! comes from in its info string: `file=PATH` (the block is the whole file, byte for
//! byte) or `excerpt=PATH` (the block's lines are consecutive lines of the file, compared
//! without indentation and without a comment leader such as ` * `, so that a build
//! command can be quoted from a C comment). Every `rust`, `python` or `c` block must carry
//! one, so a snippet cannot drift from code that is compiled and run. The Rust examples
//! the README quotes are then built with cargo and run as the processes a user would
//! start; the Python ones are run by the pytest suite (`tests/test_examples.py`), the C
//! one by `crates/ferry-c/tests/run_example.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The READMEs whose blocks are checked, relative to the repository's root.
const READMES: &[&str] = &["README.md", "crates/ferry-py/README.md"];

/// The Rust examples the README quotes, run here.
const RUN: &[&str] = &["quickstart_channel", "quickstart_pubsub"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Block {
    readme: &'static str,
    line: usize,
    lang: String,
    source: Option<(bool, String)>, // (whole file, path)
    text: String,
}

fn blocks(readme: &'static str) -> Vec<Block> {
    let text = std::fs::read_to_string(root().join(readme)).expect("README readable");
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match open.take() {
            Some(b) if fence => out.push(b),
            Some(mut b) => {
                b.text.push_str(line);
                b.text.push('\n');
                open = Some(b);
            }
            None if fence => {
                let info = line.trim_start().trim_start_matches('`');
                let mut words = info.split_whitespace();
                let lang = words.next().unwrap_or("").to_string();
                let source = words.find_map(|w| {
                    w.strip_prefix("file=")
                        .map(|p| (true, p.to_string()))
                        .or_else(|| w.strip_prefix("excerpt=").map(|p| (false, p.to_string())))
                });
                open = Some(Block {
                    readme,
                    line: i + 1,
                    lang,
                    source,
                    text: String::new(),
                });
            }
            None => {}
        }
    }
    assert!(open.is_none(), "{readme}: a fenced block is not closed");
    out
}

/// A line of a source file as an excerpt compares it: no indentation, no comment leader.
fn bare(line: &str) -> &str {
    let t = line.trim();
    for leader in ["//!", "///", "//", "* ", "#"] {
        if let Some(rest) = t.strip_prefix(leader) {
            return rest.trim();
        }
    }
    if t == "*" {
        return "";
    }
    t
}

#[test]
fn readme_snippets_are_the_example_files() {
    let mut checked = 0;
    for readme in READMES {
        for b in blocks(readme) {
            let at = format!("{}:{}", b.readme, b.line);
            let Some((whole, path)) = &b.source else {
                assert!(
                    !matches!(b.lang.as_str(), "rust" | "python" | "c"),
                    "{at}: a {} block must name its file (```{} file=PATH or excerpt=PATH)",
                    b.lang,
                    b.lang
                );
                continue;
            };
            let file = std::fs::read_to_string(root().join(path))
                .unwrap_or_else(|e| panic!("{at}: {path}: {e}"));
            if *whole {
                assert!(
                    b.text == file,
                    "{at}: the block differs from {path}; copy the file into the README"
                );
            } else {
                let want: Vec<&str> = b.text.lines().map(str::trim).collect();
                let have: Vec<&str> = file.lines().map(bare).collect();
                assert!(
                    !want.is_empty() && have.windows(want.len()).any(|w| w == &want[..]),
                    "{at}: the block is not an excerpt of {path}"
                );
            }
            checked += 1;
        }
    }
    // The README's three quick starts and its C build, and the Python README's example.
    assert!(checked >= 5, "only {checked} blocks name their file");
}

#[test]
fn readme_is_short() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = text.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines: details go to docs/"
    );
}

#[test]
fn readme_examples_run() {
    // The examples this test runs sit beside the test's own binary:
    // target/<profile>/deps/readme-* -> target/<profile>/examples/.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    build.current_dir(root()).args(["build", "-p", "ferry"]);
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    for ex in RUN {
        build.args(["--example", ex]);
    }
    let status = build.status().expect("cargo runs");
    assert!(status.success(), "building the examples failed");
    for ex in RUN {
        let out = Command::new(profile_dir.join("examples").join(ex))
            .output()
            .unwrap_or_else(|e| panic!("{ex}: {e}"));
        assert!(
            out.status.success(),
            "example {ex} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
