//! What a benchmark hands back: records, Markdown, and plots to draw.

use std::fmt::Write as _;

use super::plot::Series;
use super::record::Record;

/// The result of one benchmark.
#[derive(Default)]
pub struct BenchOutput {
    pub records: Vec<Record>,
    /// Markdown: tables with ours and the paper's numbers side by side.
    pub markdown: String,
    pub plots: Vec<PlotSpec>,
}

/// A plot to draw once the run is over.
pub struct PlotSpec {
    /// File name without `.svg`, unique within the report.
    pub stem: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub log_x: bool,
    pub log_y: bool,
}

/// A Markdown table whose columns are padded, so it also reads well in a terminal.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: AsRef<str>>(headers: &[S]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.as_ref().to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let width = |c: usize| {
            self.rows
                .iter()
                .filter_map(|r| r.get(c))
                .chain([&self.headers[c]])
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..cols).map(width).collect();
        // The first column (labels) is left-aligned, the others (numbers) right-aligned.
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (c, w) in widths.iter().enumerate() {
                let cell = cells.get(c).map(String::as_str).unwrap_or("");
                if c > 0 {
                    let _ = write!(s, " {cell:>w$} |");
                } else {
                    let _ = write!(s, " {cell:<w$} |");
                }
            }
            s.push('\n');
            s
        };
        let mut out = line(&self.headers);
        out.push('|');
        for (c, w) in widths.iter().enumerate() {
            let dashes = "-".repeat(*w);
            if c == 0 {
                let _ = write!(out, " {dashes} |");
            } else {
                let _ = write!(out, "-{dashes}:|");
            }
        }
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

/// A number with three significant digits (more for large integers' sake).
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.2e}")
    }
}

/// A ratio such as `12.3x`.
pub fn ratio(v: f64) -> String {
    if v.is_finite() {
        format!("{}x", num(v))
    } else {
        "n/a".into()
    }
}

/// A bar's verdict as the reports print it: `met` or `NOT met`.
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

/// A byte count with a binary suffix: `4 KiB`, `64 MiB`.
pub fn bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_pads_and_aligns() {
        let mut t = Table::new(&["name", "µs"]);
        t.row(vec!["pipe copy".into(), "1.5".into()]);
        let s = t.render();
        assert!(s.starts_with("| name      |  µs |\n| --------- |----:|\n"));
        assert!(s.ends_with("| pipe copy | 1.5 |\n"));
    }

    #[test]
    fn sizes_and_numbers() {
        assert_eq!(bytes(65536), "64 KiB");
        assert_eq!(bytes(64), "64 B");
        assert_eq!(num(316.2), "316");
        assert_eq!(num(0.5), "0.500");
        assert_eq!(ratio(2.0), "2.00x");
    }
}
