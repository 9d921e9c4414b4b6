//! Line plots as SVG (plotters, SVG backend only: text is left to the
//! viewer's fonts, so no font library is needed at build or run time).
//!
//! Log axes are drawn by plotting `log10(v)` on a linear axis and labelling
//! the ticks with `v`; that gives full control over where ticks go
//! (powers of two for sizes, 1-2-5 steps for values).

use std::path::Path;

use std::ops::Range;

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, KeyPointWeight, Ranged};
use plotters::prelude::*;

/// One named line: `(x, y)` points in data units.
pub type Series = (String, Vec<(f64, f64)>);

/// Draws `series` as lines with markers into an SVG file at `path`.
/// Points that cannot be shown (non-finite, or not positive on a log axis) are skipped.
pub fn line_plot(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_x: bool,
    log_y: bool,
) -> Result<()> {
    let to_plot = |v: f64, log: bool| -> Option<f64> {
        match (log, v.is_finite()) {
            (_, false) => None,
            (true, _) if v <= 0.0 => None,
            (true, _) => Some(v.log10()),
            (false, _) => Some(v),
        }
    };
    let lines: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(name, pts)| {
            let pts = pts
                .iter()
                .filter_map(|&(x, y)| Some((to_plot(x, log_x)?, to_plot(y, log_y)?)))
                .collect();
            (name.as_str(), pts)
        })
        .collect();
    let xs: Vec<f64> = lines.iter().flat_map(|l| l.1.iter().map(|p| p.0)).collect();
    let ys: Vec<f64> = lines.iter().flat_map(|l| l.1.iter().map(|p| p.1)).collect();
    if xs.is_empty() {
        return Err(anyhow!("plot {title:?} has no points to draw"));
    }
    let x_pow2 = series
        .iter()
        .flat_map(|s| s.1.iter())
        .all(|&(x, _)| x >= 1.0 && (x as u64).is_power_of_two() && x.fract() == 0.0);
    let (x0, x1) = padded(&xs, log_x);
    let (y0, mut y1) = padded(&ys, log_y);
    let x_min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let x_keys = ticks(x0, x1, log_x, (log_x && x_pow2).then_some(x_min));
    let (mut corner, covered, legend_h) = legend_corner(&lines, (x0, x1), (y0, y1));
    if covered > 0 {
        // No free corner: raise the top so the legend sits above every line.
        y1 += (y1 - y0) * legend_h / (1.0 - legend_h) * 1.05;
        corner = SeriesLabelPosition::UpperLeft;
    }
    let y_keys = ticks(y0, y1, log_y, None);

    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(Axis::new(x0, x1, x_keys), Axis::new(y0, y1, y_keys))?;
    let x_fmt = |v: &f64| label(if log_x { 10f64.powf(*v) } else { *v }, x_pow2);
    let y_fmt = |v: &f64| label(if log_y { 10f64.powf(*v) } else { *v }, false);
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(WHITE)
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;
    for (i, (name, pts)) in lines.into_iter().enumerate() {
        let color = COLORS[i % COLORS.len()].to_rgba();
        let style = ShapeStyle::from(color).stroke_width(2);
        chart
            .draw_series(LineSeries::new(pts.clone(), style))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(corner)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}

/// Ten colours that stay apart on white (the Tableau 10 palette).
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The corner whose legend-sized box covers the fewest points of the lines
/// (each segment sampled along its length), how many it covers, and the
/// legend's height as a fraction of the plot.
fn legend_corner(
    lines: &[(&str, Vec<(f64, f64)>)],
    xr: (f64, f64),
    yr: (f64, f64),
) -> (SeriesLabelPosition, usize, f64) {
    let h = (0.05 + 0.045 * lines.len() as f64).min(0.9);
    let w = 0.5;
    let mut norm = Vec::new();
    for (_, pts) in lines {
        for pair in pts.windows(2) {
            for k in 0..=16 {
                let t = f64::from(k) / 16.0;
                let x = pair[0].0 + t * (pair[1].0 - pair[0].0);
                let y = pair[0].1 + t * (pair[1].1 - pair[0].1);
                norm.push(((x - xr.0) / (xr.1 - xr.0), (y - yr.0) / (yr.1 - yr.0)));
            }
        }
        norm.extend(
            pts.iter()
                .map(|&(x, y)| ((x - xr.0) / (xr.1 - xr.0), (y - yr.0) / (yr.1 - yr.0))),
        );
    }
    let corners = [
        (SeriesLabelPosition::UpperLeft, false, true),
        (SeriesLabelPosition::UpperRight, true, true),
        (SeriesLabelPosition::LowerRight, true, false),
        (SeriesLabelPosition::LowerLeft, false, false),
    ];
    let covered = |right: bool, upper: bool| {
        norm.iter()
            .filter(|&&(u, v)| {
                let in_x = if right { u > 1.0 - w } else { u < w };
                let in_y = if upper { v > 1.0 - h } else { v < h };
                in_x && in_y
            })
            .count()
    };
    let (pos, n) = corners
        .into_iter()
        .map(|(pos, right, upper)| (pos, covered(right, upper)))
        .min_by_key(|c| c.1)
        .unwrap_or((SeriesLabelPosition::UpperLeft, 0));
    (pos, n, h)
}

/// A linear axis in plot units whose ticks sit exactly where we say.
struct Axis {
    lo: f64,
    hi: f64,
    keys: Vec<f64>,
}

impl Axis {
    fn new(lo: f64, hi: f64, keys: Vec<f64>) -> Axis {
        Axis { lo, hi, keys }
    }
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let r = (v - self.lo) / (self.hi - self.lo);
        limit.0 + (r * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        match hint.weight() {
            KeyPointWeight::Bold if hint.max_num_points() > 0 => self.keys.clone(),
            _ => Vec::new(),
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// The data range with a margin (in plot units, so multiplicative on log axes).
fn padded(vals: &[f64], log: bool) -> (f64, f64) {
    let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let span = (hi - lo).max(if log { 0.5 } else { hi.abs().max(1.0) * 0.1 });
    let lo = lo - span * 0.06;
    let lo = if !log && lo < 0.0 && vals.iter().all(|&v| v >= 0.0) {
        0.0
    } else {
        lo
    };
    (lo, hi + span * 0.08)
}

/// Tick positions in plot units: on log axes, powers of two counted from
/// the smallest value `pow2_from` (a size sweep) or 1-2-5 steps; on linear
/// ones, about eight evenly spaced round numbers.
fn ticks(lo: f64, hi: f64, log: bool, pow2_from: Option<f64>) -> Vec<f64> {
    if let (true, Some(first)) = (log, pow2_from) {
        let l2 = 2f64.log10();
        let (a, b) = ((lo / l2).ceil() as i64, (hi / l2).floor() as i64);
        let step = ((b - a) as f64 / 10.0).ceil().max(1.0) as i64;
        let step = if step > 2 { step + step % 2 } else { step };
        let origin = (first / l2).round() as i64;
        return (a..=b)
            .filter(|e| (e - origin).rem_euclid(step) == 0)
            .map(|e| e as f64 * l2)
            .collect();
    }
    if log {
        let decades = hi - lo;
        let mults: &[f64] = if decades < 2.5 {
            &[1.0, 2.0, 5.0]
        } else {
            &[1.0]
        };
        let step = if decades > 10.0 { 2.0 } else { 1.0 };
        let mut out = Vec::new();
        let mut d = lo.floor();
        while d <= hi.ceil() {
            for m in mults {
                let v = d + m.log10();
                if v >= lo && v <= hi {
                    out.push(v);
                }
            }
            d += step;
        }
        return out;
    }
    let raw = (hi - lo) / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(raw);
    let mut v = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while v <= hi {
        out.push(v);
        v += step;
    }
    out
}

/// A short tick label: binary suffixes for sizes, SI-ish otherwise.
pub fn label(v: f64, binary: bool) -> String {
    if binary {
        let v = v.round() as u64;
        return match v {
            v if v >= 1 << 30 && v % (1 << 30) == 0 => format!("{}G", v >> 30),
            v if v >= 1 << 20 && v % (1 << 20) == 0 => format!("{}M", v >> 20),
            v if v >= 1 << 10 && v % (1 << 10) == 0 => format!("{}K", v >> 10),
            v => v.to_string(),
        };
    }
    let a = v.abs();
    let (scaled, suffix) = match a {
        a if a >= 1e9 => (v / 1e9, "G"),
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e4 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    format!("{}{suffix}", sig3(scaled))
}

/// Up to three significant digits, without trailing zeros.
fn sig3(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let digits = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_short() {
        assert_eq!(label(4096.0, true), "4K");
        assert_eq!(label(64.0 * 1048576.0, true), "64M");
        assert_eq!(label(0.25, false), "0.25");
        assert_eq!(label(20000.0, false), "20k");
        assert_eq!(label(316.0, false), "316");
    }

    #[test]
    fn draws_a_readable_svg() {
        let dir = std::env::temp_dir().join(format!("ferry-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.svg");
        let s = vec![("a".to_string(), vec![(4096.0, 1.0), (65536.0, 3.0)])];
        line_plot(&path, "t", "bytes", "GB/s", &s, true, true).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("<svg") && svg.contains("64K"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
