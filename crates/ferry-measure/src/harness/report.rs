//! The report folder: `report.md`, `results.json`, and one SVG per plot.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::ctx::BenchCtx;
use super::output::{BenchOutput, PlotSpec};
use super::plot;
use super::record::Record;
use super::BenchDef;

/// What one benchmark produced.
pub struct Finished {
    pub def: &'static BenchDef,
    pub output: BenchOutput,
    pub seconds: f64,
}

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

/// Draws `p` into the SVG file `file`.
pub fn draw(p: &PlotSpec, file: &Path) -> Result<()> {
    plot::line_plot(
        file, &p.title, &p.x_label, &p.y_label, &p.series, p.log_x, p.log_y,
    )
    .with_context(|| format!("drawing {}", file.display()))
}

/// Writes `records` to `path` as one pretty-printed JSON array.
pub fn write_json(path: &Path, records: &[Record]) -> Result<()> {
    let text = serde_json::to_string_pretty(records)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}
