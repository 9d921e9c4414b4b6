//! The library's layers hold: no module imports one above it. Each top-level module of
//! `src/` has a rank (the layers of `docs/architecture.md`, bottom up, as `lib.rs` lists them); a
//! file may name `crate::<module>` only for modules of a lower rank than its own (or its
//! own module). Reads the source, so it fails as soon as a wrong `use` is written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Rank of each top-level module: shared basics, syscall wrappers, memory and kernel
/// interfaces, handles, transports.
const RANKS: &[(&str, u32)] = &[
    ("error", 0),
    ("sync", 0),
    ("segment", 0),
    ("copy", 0),
    ("until", 1),
    ("sys", 1),
    ("region", 2),
    ("containers", 2),
    ("uring", 2),
    ("iodata", 3),
    ("vcm", 3),
    ("channel", 4),
    ("service", 5),
    ("semantics", 5),
    ("aio", 6),
    ("stats", 6),
    ("testing", 7),
];

fn rank(module: &str) -> Option<u32> {
    RANKS.iter().find(|(m, _)| *m == module).map(|&(_, r)| r)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The `crate::<module>` names a source text uses in code (comments, doc links among
/// them, may mention any module).
fn crate_refs(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.push(name);
        }
    }
    out
}

#[test]
fn no_module_imports_a_higher_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut bad: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap()
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib" {
            continue;
        }
        let own = rank(&top).unwrap_or_else(|| panic!("module {top} has no rank in RANKS"));
        for m in crate_refs(&std::fs::read_to_string(f).unwrap()) {
            // `testing` is test support (built only for tests and the `testing` feature):
            // a module's own unit tests may use its fixtures.
            if m == top || m == "testing" {
                continue;
            }
            if let Some(r) = rank(&m) {
                if r >= own {
                    bad.entry(rel.display().to_string())
                        .or_default()
                        .push(format!("{m} (rank {r} >= {own})"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "lower layers import higher ones: {bad:#?}");
}

#[test]
fn the_check_sees_a_wrong_import() {
    assert_eq!(crate_refs("use crate::channel::Sender;"), vec!["channel"]);
    assert!(crate_refs("/// see [`crate::channel`]").is_empty());
    assert!(rank("channel").unwrap() > rank("region").unwrap());
}
