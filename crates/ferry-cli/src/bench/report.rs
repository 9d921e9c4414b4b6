//! The report folder: `report.md`, `results.json`, and one SVG per plot.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::ctx::BenchCtx;
use super::record::Record;
use super::{draw, write_json, Finished};

pub fn write(
    dir: &Path,
    ctx: &BenchCtx,
    done: &[Finished],
    records: &[Record],
    seconds: f64,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut md = String::new();
    let _ = writeln!(md, "# ferry benchmark report\n");
    let mode = if ctx.quick { "quick" } else { "default" };
    let _ = writeln!(
        md,
        "Run in {mode} mode in {seconds:.1} s. Every number below was measured in this run, between \
         real processes pinned to CPUs; ratios taken within the run are the figures to judge by, \
         absolute numbers explain them. Each benchmark's paper figures are printed beside ours.\n"
    );
    let _ = writeln!(md, "## Machine\n");
    md.push_str(&ctx.machine.markdown());
    if let Some(m) = ctx.memcpy_if_measured() {
        let _ = writeln!(md, "- {}", m.line());
    }
    let _ = writeln!(md, "\n| benchmark | what | seconds |\n|---|---|--:|");
    for f in done {
        let _ = writeln!(
            md,
            "| `{}` | {} | {:.1} |",
            f.def.name, f.def.about, f.seconds
        );
    }
    md.push('\n');
    for f in done {
        md.push_str(&f.output.markdown);
        for p in &f.output.plots {
            let file = format!("{}.svg", p.stem);
            draw(p, &dir.join(&file))?;
            let _ = writeln!(md, "![{}]({file})\n", p.title);
        }
    }
    let _ = writeln!(
        md,
        "Machine-readable: `results.json` holds one record per point ({} records).",
        records.len()
    );
    std::fs::write(dir.join("report.md"), md).context("writing report.md")?;
    write_json(&dir.join("results.json"), records)
}
