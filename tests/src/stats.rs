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

/// Linux reports `/proc` CPU times in `USER_HZ` ticks, 100 a second on every architecture's
/// user-space ABI.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time used so far by every process on the machine, and by the machine as a whole: taken
/// before and after a measured window, the difference says who used the cores, which is what
/// tells a run bound by round trips from one bound by CPU.
#[derive(Debug, Clone, Default)]
pub struct CpuTimes {
    /// Per process: its name (`comm`) and user + system ticks, its threads included.
    processes: std::collections::HashMap<u32, (String, u64)>,
    /// `/proc/stat`'s busy ticks (all but idle and iowait) summed over the cores.
    busy: u64,
    /// ... and all its ticks.
    total: u64,
}

impl CpuTimes {
    /// Reads `/proc` now. Processes that end meanwhile are skipped.
    pub fn take() -> Self {
        let mut processes = std::collections::HashMap::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(figures) = proc_stat_cpu(pid) {
                processes.insert(pid, figures);
            }
        }
        let (busy, total) = machine_ticks().unwrap_or_default();
        Self { processes, busy, total }
    }

    /// Seconds of CPU used between `self` and `later`, summed per role: `role(pid, comm)` names
    /// it, `None` leaves the process out. Processes started in between count from zero.
    pub fn used_since(
        &self,
        later: &Self,
        role: impl Fn(u32, &str) -> Option<String>,
    ) -> std::collections::BTreeMap<String, f64> {
        let mut used = std::collections::BTreeMap::new();
        for (pid, (comm, ticks)) in &later.processes {
            let Some(role) = role(*pid, comm) else { continue };
            let before = match self.processes.get(pid) {
                Some((earlier, t)) if earlier == comm => *t,
                _ => 0,
            };
            *used.entry(role).or_insert(0.0) += ticks.saturating_sub(before) as f64 / TICKS_PER_SECOND;
        }
        used
    }

    /// The share of all cores' time that was busy between `self` and `later` (0 to 1).
    pub fn machine_busy_since(&self, later: &Self) -> f64 {
        let total = later.total.saturating_sub(self.total);
        later.busy.saturating_sub(self.busy) as f64 / total.max(1) as f64
    }
}

/// `(comm, utime + stime)` of `/proc/<pid>/stat`.
fn proc_stat_cpu(pid: u32) -> Option<(String, u64)> {
    parse_proc_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `(comm, utime + stime)` of one `/proc/<pid>/stat` text.
fn parse_proc_stat(stat: &str) -> Option<(String, u64)> {
    // The name is in parentheses and may hold spaces and parentheses itself.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    // After the name: state is field 3; utime and stime are fields 14 and 15.
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    let utime: u64 = rest.nth(11)?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some((comm, utime + stime))
}

/// `(busy, total)` ticks of `/proc/stat`'s `cpu` line (busy: all but idle and iowait).
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line.split_whitespace().skip(1).filter_map(|t| t.parse().ok()).collect();
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
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
    fn own_cpu_time_is_counted() {
        let me = std::process::id();
        let mine = |pid: u32, _: &str| (pid == me).then(|| "me".to_owned());
        let before = CpuTimes::take();
        // Busy until /proc has counted a tenth of a second of this process's CPU: bounded by CPU
        // used, not wall time, so that a loaded machine (other suites in parallel) cannot fail it.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut x = 0u64;
        let used = loop {
            for _ in 0..1_000_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            let used = before
                .used_since(&CpuTimes::take(), mine)
                .get("me")
                .copied()
                .unwrap_or(0.0);
            if used >= 0.1 || std::time::Instant::now() > deadline {
                break used;
            }
        };
        std::hint::black_box(x);
        assert!(used >= 0.1, "only {used} s of this process's CPU counted in 60 s");
        let after = CpuTimes::take();
        let busy = before.machine_busy_since(&after);
        assert!(busy > 0.0 && busy <= 1.0, "{busy}");
        // Nothing is counted for a role no process has.
        assert!(before.used_since(&after, |_, _| None).is_empty());
    }

    #[test]
    fn proc_stat_names_with_parentheses() {
        let stat = "4242 (tokio) (rt worker) S 1 4242 4242 0 -1 4194560 1 0 0 0 \
                    120 35 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_proc_stat(stat), Some(("tokio) (rt worker".to_owned(), 155)));
        assert_eq!(parse_proc_stat("4242 (short) S 1 2"), None);
        assert!(proc_stat_cpu(std::process::id()).is_some(), "own /proc/<pid>/stat");
    }

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
