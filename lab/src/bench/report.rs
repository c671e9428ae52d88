//! The table, the ratios against the targets, and the notes.

use super::case::{Case, Measured};
use super::plan::{LATENCY_RATES, MIX_PARTITIONS};
use std::fmt::Write;

/// One case: its throughput run, or (a latency row) its paced run.
#[derive(Debug, Clone)]
pub struct Row {
    pub case: Case,
    pub throughput: Option<Measured>,
    pub latency: Option<Measured>,
    pub error: Option<String>,
}

impl Row {
    pub fn rate(&self) -> Option<f64> {
        self.throughput.as_ref().map(Measured::rate)
    }

    /// p50/p99 and the rate they were measured at: the paced run's, or
    /// (PostgreSQL alone) the batch round trips of the throughput run.
    fn latency(&self) -> Option<((f64, f64, usize), f64)> {
        if let Some(m) = &self.latency {
            return Some((m.latency?, self.case.rate.unwrap_or_default()));
        }
        let m = self.throughput.as_ref()?;
        Some((m.latency?, m.rate()))
    }

    pub fn peak_rss_mb(&self) -> Option<f64> {
        let kb = [&self.throughput, &self.latency]
            .iter()
            .filter_map(|m| m.as_ref().map(|m| m.peak_rss_kb))
            .max()?;
        Some(kb as f64 / 1024.0)
    }
}

pub(super) fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<26} {:>8} {:>9} {:>8} {:>8} {:>9} {:>8}",
        "case", "messages", "msg/s", "p50 ms", "p99 ms", "at msg/s", "RSS MB"
    );
    for r in rows {
        let msgs = r
            .throughput
            .as_ref()
            .or(r.latency.as_ref())
            .map_or(0, |m| m.messages);
        let rate = r.rate().map_or("-".into(), |v| format!("{v:.0}"));
        let (p50, p99, at) = match r.latency() {
            Some(((p50, p99, _), at)) => {
                (format!("{p50:.1}"), format!("{p99:.1}"), format!("{at:.0}"))
            }
            None => ("-".into(), "-".into(), "-".into()),
        };
        let rss = r.peak_rss_mb().map_or("-".into(), |v| format!("{v:.0}"));
        let _ = writeln!(
            out,
            "{:<26} {msgs:>8} {rate:>9} {p50:>8} {p99:>8} {at:>9} {rss:>8}",
            r.case.label
        );
    }
    out
}

pub(super) fn notes(rows: &[Row]) -> String {
    let mut out = String::new();
    for r in rows {
        if let Some(e) = &r.error {
            let _ = writeln!(out, "{}: FAILED: {e}", r.case.label);
        }
        for (phase, m) in [("throughput", &r.throughput), ("latency", &r.latency)] {
            for n in m.iter().flat_map(|m| &m.notes) {
                let _ = writeln!(out, "{} ({phase}): {n}", r.case.label);
            }
        }
    }
    out
}

fn find<'a>(rows: &'a [Row], label: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.case.label == label)
}

fn rate(rows: &[Row], label: &str) -> Option<f64> {
    find(rows, label)?.rate()
}

/// p50 and p99 of a row: its paced run's, or its throughput run's.
fn percentiles(rows: &[Row], label: &str) -> Option<(f64, f64)> {
    let ((p50, p99, _), _) = find(rows, label)?.latency()?;
    Some((p50, p99))
}

struct Check {
    what: String,
    measured: Option<f64>,
    target: f64,
    /// true: measured must be at least target; false: at most.
    at_least: bool,
    unit: &'static str,
}

impl Check {
    fn at_least(what: String, measured: Option<f64>, target: f64, unit: &'static str) -> Self {
        Self {
            what,
            measured,
            target,
            at_least: true,
            unit,
        }
    }

    /// A ratio printed beside the targets, with none of its own.
    fn reading(what: String, measured: Option<f64>, unit: &'static str) -> Self {
        Self::at_least(what, measured, f64::NAN, unit)
    }

    fn at_most(what: String, measured: Option<f64>, target: f64, unit: &'static str) -> Self {
        Self {
            at_least: false,
            ..Self::at_least(what, measured, target, unit)
        }
    }
}

/// The targets, computed from this run's rows.
pub(super) fn ratios(rows: &[Row]) -> String {
    let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
    let percent = |a: Option<f64>, b: Option<f64>| ratio(a, b).map(|r| r * 100.0);
    let mut checks = Vec::new();
    for (p, conns) in [(1, "1 conn"), (4, "4 conns")] {
        checks.push(Check::at_least(
            format!("(a) / (f) at {p} partition(s)"),
            percent(
                rate(rows, &format!("a dedupq {p}p")),
                rate(rows, &format!("f minimal claim {conns}")),
            ),
            80.0,
            "%",
        ));
    }
    for r in LATENCY_RATES {
        let p = percentiles(rows, &format!("g dedupq {r}/s"));
        checks.push(Check::at_most(
            format!("latency p50 at {r} msg/s"),
            p.map(|p| p.0),
            5.0,
            " ms",
        ));
        checks.push(Check::at_most(
            format!("latency p99 at {r} msg/s"),
            p.map(|p| p.1),
            25.0,
            " ms",
        ));
    }
    checks.push(Check::reading(
        format!("10M keys after a checkpoint / empty ({MIX_PARTITIONS}p)"),
        percent(
            rate(rows, &format!("a dedupq {MIX_PARTITIONS}p 10M checkpoint")),
            rate(rows, &format!("a dedupq {MIX_PARTITIONS}p")),
        ),
        "%",
    ));
    checks.push(Check::at_least(
        format!("10M stored keys / empty table ({MIX_PARTITIONS}p)"),
        percent(
            rate(rows, &format!("a dedupq {MIX_PARTITIONS}p 10M keys")),
            rate(rows, &format!("a dedupq {MIX_PARTITIONS}p")),
        ),
        80.0,
        "%",
    ));
    checks.push(Check::at_least(
        "RabbitMQ: dedupq / raw".into(),
        percent(rate(rows, "e dedupq amqp"), rate(rows, "e raw amqp")),
        60.0,
        "%",
    ));
    checks.push(Check::at_most(
        "peak RSS at 16 partitions".into(),
        find(rows, "a dedupq 16p").and_then(Row::peak_rss_mb),
        150.0,
        " MB",
    ));
    for (p, target) in [(1, 10.0), (4, 5.0), (16, 5.0)] {
        checks.push(Check::at_least(
            format!("(a) / (b) at {p} partition(s)"),
            ratio(
                rate(rows, &format!("a dedupq {p}p")),
                rate(rows, &format!("b naive {p}p")),
            ),
            target,
            "x",
        ));
    }
    let dedupq = |p: i32| rate(rows, &format!("a dedupq {p}p"));
    let best_a = [1, 4, 16].into_iter().filter_map(dedupq).reduce(f64::max);
    let best_d = [rate(rows, "d pg 1 conn"), rate(rows, "d pg 4 conns")]
        .into_iter()
        .flatten()
        .reduce(f64::max);
    checks.push(Check::at_least(
        "best (a) / best (d)".into(),
        percent(best_a, best_d),
        60.0,
        "%",
    ));
    let sync_100c = rate(rows, "h http sync 100c");
    for (what, of) in [
        ("HTTP sync 100c / direct 100c", "h http direct 100c"),
        ("HTTP sync 100c / a dedupq 1p", "a dedupq 1p"),
    ] {
        checks.push(Check::at_least(
            what.into(),
            percent(sync_100c, rate(rows, of)),
            35.0,
            "%",
        ));
    }
    checks.push(Check::reading(
        "HTTP sync 100c / the seed's recipe".into(),
        ratio(sync_100c, rate(rows, "h http seed 100c")),
        "x",
    ));
    checks.push(Check::at_most(
        "HTTP sync p99 at 100c".into(),
        percentiles(rows, "h http sync 100c").map(|p| p.1),
        25.0,
        " ms",
    ));
    checks.push(Check::at_most(
        "HTTP sync 1c p50 - direct 1c p50".into(),
        percentiles(rows, "h http sync 1c")
            .zip(percentiles(rows, "h http direct 1c"))
            .map(|(sync, direct)| sync.0 - direct.0),
        2.0,
        " ms",
    ));
    checks.push(Check::reading(
        "HTTP sync 1000c peak RSS".into(),
        find(rows, "h http sync 1000c").and_then(Row::peak_rss_mb),
        " MB",
    ));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<40} {:>10} {:>10}  verdict",
        "target", "measured", "target"
    );
    for c in checks {
        let cmp = if c.at_least { ">=" } else { "<=" };
        let (measured, verdict) = match c.measured {
            None => ("-".to_string(), "not measured".to_string()),
            Some(m) if c.target.is_nan() => (format!("{m:.1}{}", c.unit), "no target".into()),
            Some(m) => {
                let met = if c.at_least {
                    m >= c.target
                } else {
                    m <= c.target
                };
                let by = (m - c.target).abs();
                (
                    format!("{m:.1}{}", c.unit),
                    if met {
                        "met".into()
                    } else {
                        format!("MISSED by {by:.1}{}", c.unit)
                    },
                )
            }
        };
        let target = if c.target.is_nan() {
            "-".to_string()
        } else {
            format!("{cmp} {}{}", c.target, c.unit)
        };
        let _ = writeln!(out, "{:<40} {measured:>10} {target:>10}  {verdict}", c.what);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{ratios, Row};
    use crate::bench::{Measured, Plan};

    /// A throughput row of the plan with the rate and percentiles given.
    fn row(label: &str, rate: f64, p50: f64, p99: f64) -> Row {
        let case = Plan::new(false)
            .cases
            .into_iter()
            .find(|c| c.label == label)
            .expect("a row of the plan");
        Row {
            case,
            throughput: Some(Measured {
                messages: rate as usize,
                seconds: 1.0,
                latency: Some((p50, p99, 100)),
                peak_rss_kb: 120 * 1024,
                notes: Vec::new(),
            }),
            latency: None,
            error: None,
        }
    }

    #[test]
    fn the_http_rows_are_weighed_against_their_targets() {
        let rows = [
            row("a dedupq 1p", 40_000.0, 0.0, 0.0),
            row("h http sync 1c", 500.0, 3.0, 4.0),
            row("h http direct 1c", 8_000.0, 0.1, 0.2),
            row("h http sync 100c", 10_000.0, 8.0, 30.0),
            row("h http direct 100c", 25_000.0, 2.0, 5.0),
            row("h http seed 100c", 2_500.0, 40.0, 60.0),
            row("h http sync 1000c", 12_000.0, 80.0, 150.0),
        ];
        let out = ratios(&rows);
        let line = |what: &str| {
            out.lines()
                .find(|l| l.starts_with(what))
                .unwrap_or_else(|| panic!("no line {what:?} in\n{out}"))
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert!(line("HTTP sync 100c / direct 100c").ends_with("40.0% >= 35% met"));
        assert!(line("HTTP sync 100c / a dedupq 1p").ends_with("25.0% >= 35% MISSED by 10.0%"));
        assert!(line("HTTP sync 100c / the seed's recipe").ends_with("4.0x - no target"));
        assert!(line("HTTP sync p99 at 100c").ends_with("30.0 ms <= 25 ms MISSED by 5.0 ms"));
        assert!(
            line("HTTP sync 1c p50 - direct 1c p50").ends_with("2.9 ms <= 2 ms MISSED by 0.9 ms")
        );
        assert!(line("HTTP sync 1000c peak RSS").ends_with("120.0 MB - no target"));
    }
}
