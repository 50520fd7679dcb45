//! Figures the benchmark harnesses print: percentiles, process memory, units.

use std::time::Duration;

/// Nearest-rank percentile `p` (0 to 100) of `sorted` durations; zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A `/proc/<pid>/status` figure in KiB (`VmRSS` now, `VmHWM` the peak), or `None` once the
/// process is gone.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `1.23 s`.
pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// `42 MiB` from KiB.
pub fn mib(kib: u64) -> String {
    format!("{:.0} MiB", kib as f64 / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_secs).collect();
        assert_eq!(percentile(&d, 50.0), Duration::from_secs(50));
        assert_eq!(percentile(&d, 99.0), Duration::from_secs(99));
        assert_eq!(percentile(&d, 100.0), Duration::from_secs(100));
        assert_eq!(percentile(&d, 0.0), Duration::from_secs(1));
        assert_eq!(percentile(&[], 99.0), Duration::ZERO);
    }
}
