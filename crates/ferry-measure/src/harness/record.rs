//! One JSON record per measured point.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::stats::Summary;

/// A measured point: `{bench, series, params, unit, value, median, p99, min, max, trials, spread}`.
///
/// `value` is the headline number (usually the median); `median`, `p99`,
/// `min` and `max` summarise the underlying samples; `spread` is how far the
/// per-trial values disagree ((max - min) / median).
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub bench: String,
    pub series: String,
    pub params: BTreeMap<String, Value>,
    pub unit: String,
    pub value: f64,
    pub median: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
    pub trials: u32,
    pub spread: f64,
}

impl Record {
    /// A record whose value is `s.median`.
    pub fn new(
        bench: &str,
        series: &str,
        unit: &str,
        s: Summary,
        trials: u32,
        spread: f64,
    ) -> Self {
        Record {
            bench: bench.into(),
            series: series.into(),
            params: BTreeMap::new(),
            unit: unit.into(),
            value: s.median,
            median: s.median,
            p99: s.p99,
            min: s.min,
            max: s.max,
            trials,
            spread,
        }
    }

    /// Replaces the headline value (e.g. a fit over all medians).
    pub fn value(mut self, v: f64) -> Self {
        self.value = v;
        self
    }

    pub fn param(mut self, key: &str, v: impl Into<Value>) -> Self {
        self.params.insert(key.into(), v.into());
        self
    }
}
