//! Summaries of samples: median, 99th percentile, extremes, the spread of
//! per-trial medians, and a least-squares line.

use serde::Serialize;

/// Order statistics of one set of samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub median: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Summary {
    /// Summarises `samples`; all fields are NaN when there are none.
    pub fn of(samples: &[f64]) -> Summary {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return Summary {
                median: f64::NAN,
                p99: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
                n: 0,
            };
        }
        Summary {
            median: median_sorted(&v),
            p99: percentile_sorted(&v, 99.0),
            min: v[0],
            max: v[v.len() - 1],
            n: v.len(),
        }
    }
}

fn median_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Nearest-rank percentile of sorted samples.
fn percentile_sorted(v: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// The median of `v` (NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    Summary::of(v).median
}

/// The arithmetic mean of `v` (0 when empty).
pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// How far trials disagree: (max - min) / median of the per-trial values.
/// 0 for a single trial.
pub fn spread(per_trial: &[f64]) -> f64 {
    let s = Summary::of(per_trial);
    if s.n < 2 || s.median == 0.0 {
        0.0
    } else {
        (s.max - s.min) / s.median.abs()
    }
}

/// `y = slope * x + intercept`, least squares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    pub slope: f64,
    pub intercept: f64,
    /// Coefficient of determination (1 = every point on the line).
    pub r2: f64,
}

/// Fits a line through `points`; needs two distinct x values.
pub fn linear_fit(points: &[(f64, f64)]) -> Option<Fit> {
    weighted_fit(points, &vec![1.0; points.len()])
}

/// Fits a line through `points` minimising the *relative* squared error,
/// `sum(((y - (slope * x + intercept)) / y)^2)`: weighted least squares with weights
/// `1 / y^2`. For costs that span several orders of magnitude (a 4 KiB copy and a 16 MiB
/// one) a plain fit is ruled by the largest points and can predict small ones below
/// zero; this one is as good, relatively, at every size. `r2` is the weighted
/// coefficient of determination. Needs two distinct x values and every y non-zero.
pub fn relative_linear_fit(points: &[(f64, f64)]) -> Option<Fit> {
    if points.iter().any(|p| p.1 == 0.0 || !p.1.is_finite()) {
        return None;
    }
    weighted_fit(points, &relative_weights(points))
}

/// The weights of a relative fit: `1 / y^2`.
fn relative_weights(points: &[(f64, f64)]) -> Vec<f64> {
    points.iter().map(|p| 1.0 / (p.1 * p.1)).collect()
}

/// `sum(w * (y - my)^2)` around the weighted mean `my` of the `y`s.
fn weighted_syy(points: &[(f64, f64)], w: &[f64]) -> f64 {
    let my = points.iter().zip(w).map(|(p, w)| w * p.1).sum::<f64>() / w.iter().sum::<f64>();
    points
        .iter()
        .zip(w)
        .map(|(p, w)| w * (p.1 - my).powi(2))
        .sum()
}

/// Two lines through `points`, split at a size: `(lower, from, upper)`, where `upper`
/// applies from `from` on. Each side is a [`relative_linear_fit`] of at least two points;
/// the split is the one with the least relative squared error, and `from` is where the
/// two lines cross if that lies between the last point of the lower side and the first
/// of the upper (else that first point). `None` unless there are four points or more, one
/// line misses them by more than 2% (relative root mean square), and the two lines
/// leave under half the relative squared error of one, both rising with size: a knee (the copy
/// that leaves the cache), not noise. The returned `r2` (on `lower`) is the two lines'
/// together, weighted as [`relative_linear_fit`] weighs.
pub fn relative_two_line_fit(points: &[(f64, f64)]) -> Option<(Fit, f64, Fit)> {
    let mut pts = points.to_vec();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    if pts.len() < 4 {
        return None;
    }
    let err = |ps: &[(f64, f64)], f: &Fit| -> f64 {
        ps.iter()
            .map(|&(x, y)| ((y - (f.slope * x + f.intercept)) / y).powi(2))
            .sum()
    };
    let one = relative_linear_fit(&pts)?;
    let one_err = err(&pts, &one);
    // One line within 2% (root mean square, relative) of every point is good enough.
    if one_err / pts.len() as f64 <= 0.02 * 0.02 {
        return None;
    }
    let mut best: Option<(f64, usize, Fit, Fit)> = None;
    for k in 2..=pts.len() - 2 {
        let (lo, hi) = pts.split_at(k);
        let (Some(l), Some(u)) = (relative_linear_fit(lo), relative_linear_fit(hi)) else {
            continue;
        };
        // A cost that falls with size is noise on a flat one, not a knee (and would
        // extrapolate below zero).
        if l.slope < 0.0 || u.slope < 0.0 {
            continue;
        }
        let e = err(lo, &l) + err(hi, &u);
        if best.as_ref().map_or(true, |b| e < b.0) {
            best = Some((e, k, l, u));
        }
    }
    let (e, k, mut l, u) = best?;
    if e >= 0.5 * one_err {
        return None;
    }
    let (x0, x1) = (pts[k - 1].0, pts[k].0);
    let cross = (u.intercept - l.intercept) / (l.slope - u.slope);
    let from = if cross.is_finite() && cross > x0 && cross < x1 {
        cross.ceil()
    } else {
        x1
    };
    // r² of both lines together, with the relative weights 1/y².
    let sst = weighted_syy(&pts, &relative_weights(&pts));
    l.r2 = if sst == 0.0 {
        1.0
    } else {
        (1.0 - e / sst).max(0.0)
    };
    Some((l, from, u))
}

/// Weighted least squares: the line minimising `sum(w * (y - line(x))^2)`.
fn weighted_fit(points: &[(f64, f64)], w: &[f64]) -> Option<Fit> {
    if points.len() < 2 {
        return None;
    }
    let sw: f64 = w.iter().sum();
    let mx = points.iter().zip(w).map(|(p, w)| w * p.0).sum::<f64>() / sw;
    let my = points.iter().zip(w).map(|(p, w)| w * p.1).sum::<f64>() / sw;
    let sxx: f64 = points
        .iter()
        .zip(w)
        .map(|(p, w)| w * (p.0 - mx).powi(2))
        .sum();
    let sxy: f64 = points
        .iter()
        .zip(w)
        .map(|(p, w)| w * (p.0 - mx) * (p.1 - my))
        .sum();
    let syy = weighted_syy(points, w);
    if sxx == 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let r2 = if syy == 0.0 {
        1.0
    } else {
        (sxy * sxy) / (sxx * syy)
    };
    Some(Fit {
        slope,
        intercept: my - slope * mx,
        r2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_1_to_100() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&v);
        assert_eq!(
            (s.median, s.p99, s.min, s.max, s.n),
            (50.5, 99.0, 1.0, 100.0, 100)
        );
    }

    #[test]
    fn fit_recovers_a_line() {
        let pts: Vec<(f64, f64)> = [1.0, 4.0, 16.0]
            .iter()
            .map(|&x| (x, 3.0 * x + 2.0))
            .collect();
        let f = linear_fit(&pts).unwrap();
        assert!((f.slope - 3.0).abs() < 1e-9 && (f.intercept - 2.0).abs() < 1e-9);
        assert!((f.r2 - 1.0).abs() < 1e-12);
    }

    #[test]
    fn relative_fit_recovers_a_line_and_favours_small_points() {
        let pts: Vec<(f64, f64)> = [1.0, 10.0, 1000.0]
            .iter()
            .map(|&x| (x, 0.5 * x + 7.0))
            .collect();
        let f = relative_linear_fit(&pts).unwrap();
        assert!((f.slope - 0.5).abs() < 1e-9 && (f.intercept - 7.0).abs() < 1e-9);
        // A convex cost (cheap small, dear large): the plain fit's intercept goes
        // negative, the relative one stays near the small points.
        let convex = [(1.0, 1.0), (10.0, 10.0), (1000.0, 3000.0)];
        assert!(linear_fit(&convex).unwrap().intercept < 0.0);
        let r = relative_linear_fit(&convex).unwrap();
        assert!(r.slope * 1.0 + r.intercept > 0.0, "{r:?}");
        assert!(relative_linear_fit(&[(1.0, 0.0), (2.0, 1.0)]).is_none());
    }

    #[test]
    fn two_lines_follow_a_knee_and_not_a_line() {
        // 1 ns/B up to 1000, then 5 ns/B: the knee between 1000 and 4000.
        let knee: Vec<(f64, f64)> = [10.0, 100.0, 1000.0, 4000.0, 16000.0, 64000.0]
            .iter()
            .map(|&x: &f64| {
                (
                    x,
                    if x <= 1000.0 {
                        x + 50.0
                    } else {
                        5.0 * x - 3950.0
                    },
                )
            })
            .collect();
        let (l, from, u) = relative_two_line_fit(&knee).unwrap();
        assert!((l.slope - 1.0).abs() < 1e-9 && (u.slope - 5.0).abs() < 1e-9);
        assert!(from > 1000.0 && from <= 4000.0, "{from}");
        assert!(l.r2 > 0.999, "{l:?}");
        // Points on one line: no second line.
        let line: Vec<(f64, f64)> = [10.0, 100.0, 1000.0, 4000.0, 16000.0]
            .iter()
            .map(|&x: &f64| (x, 2.0 * x + 7.0))
            .collect();
        assert!(relative_two_line_fit(&line).is_none());
        assert!(relative_two_line_fit(&knee[..3]).is_none());
        // A flat cost with noise (one point low at the end): no falling second line.
        let flat = [
            (4e3, 22.0),
            (6.4e4, 30.7),
            (1e6, 31.7),
            (1.6e7, 31.6),
            (6.4e7, 22.1),
        ];
        if let Some((l, _, u)) = relative_two_line_fit(&flat) {
            assert!(l.slope >= 0.0 && u.slope >= 0.0, "{l:?} {u:?}");
        }
    }

    #[test]
    fn spread_of_trials() {
        assert_eq!(spread(&[9.0, 10.0, 11.0]), 0.2);
        assert_eq!(spread(&[5.0]), 0.0);
    }
}
