//! Small measuring helpers: percentiles, peak RSS, wall-clock stamps.

use std::time::{SystemTime, UNIX_EPOCH};

/// p50, p99 and the sample count of `samples` (milliseconds).
pub(super) fn percentiles(mut samples: Vec<f64>) -> Option<(f64, f64, usize)> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(f64::total_cmp);
    let at =
        |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    Some((at(0.50), at(0.99), samples.len()))
}

/// Peak resident set size of this process (VmHWM), kB.
pub(super) fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU seconds (user + system) this process used: a case that is slow
/// with little CPU is waiting (on PostgreSQL or the broker), not working.
pub(super) fn usage() -> String {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the
    // 12th and 13th of them, in clock ticks (100 per second on Linux).
    let after = stat.rsplit(')').next().unwrap_or_default();
    let ticks: u64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    format!("process CPU {:.1} s", ticks as f64 / 100.0)
}

/// Wall-clock microseconds since the epoch: comparable between the
/// producing parent and the consuming child on one host.
pub(super) fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::percentiles;

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentiles(samples), Some((50.0, 99.0, 100)));
        assert_eq!(percentiles(vec![7.0]), Some((7.0, 7.0, 1)));
        assert_eq!(percentiles(Vec::new()), None);
    }
}
