//! Counters of this process that suites read around their timed blocks.

/// Minor page faults of this process so far (field 10 of `/proc/self/stat`, what
/// `getrusage` reports as `ru_minflt`).
pub fn minor_faults() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(7)?.parse().ok())
        })
        .unwrap_or(0)
}
