//! The table, the ratios against the targets, and the notes.

use super::case::{Case, Kind, Measured};
use super::plan::MIX_PARTITIONS;
use std::fmt::Write;

/// One case: its throughput run and, if any, its paced latency run.
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
        let m = self.latency.as_ref().or(self.throughput.as_ref())?;
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

pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:>8} {:>9} {:>8} {:>8} {:>9} {:>8}",
        "case", "messages", "msg/s", "p50 ms", "p99 ms", "at msg/s", "RSS MB"
    );
    for r in rows {
        let msgs = r.throughput.as_ref().map_or(0, |m| m.messages);
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
            "{:<24} {msgs:>8} {rate:>9} {p50:>8} {p99:>8} {at:>9} {rss:>8}",
            r.case.label
        );
    }
    out
}

pub fn notes(rows: &[Row]) -> String {
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

struct Check {
    what: String,
    measured: Option<f64>,
    target: f64,
    /// true: measured must be at least target; false: below it.
    at_least: bool,
    unit: &'static str,
}

/// The targets, computed from this run's rows.
pub fn ratios(rows: &[Row]) -> String {
    let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
    let best = |kind: Kind| {
        rows.iter()
            .filter(|r| r.case.kind == kind && !r.case.duplicates && r.case.schema.is_none())
            .filter(|r| r.case.buffered_per_partition.is_none())
            .filter_map(Row::rate)
            .reduce(f64::max)
    };
    let dedupq_rows = || {
        rows.iter()
            .filter(|r| matches!(r.case.kind, Kind::Dedupq | Kind::DedupqAmqp))
            .filter(|r| r.case.buffered_per_partition.is_none())
    };
    let mut checks = Vec::new();
    for (p, target) in [(1, 10.0), (4, 5.0), (16, 5.0)] {
        checks.push(Check {
            what: format!("(a) / (b) at {p} partition(s)"),
            measured: ratio(
                rate(rows, &format!("a dedupq {p}p")),
                rate(rows, &format!("b naive {p}p")),
            ),
            target,
            at_least: true,
            unit: "x",
        });
    }
    checks.push(Check {
        what: "best (a) / best (d)".into(),
        measured: ratio(best(Kind::Dedupq), best(Kind::PgLimit)).map(|r| r * 100.0),
        target: 60.0,
        at_least: true,
        unit: "%",
    });
    checks.push(Check {
        what: "RabbitMQ: dedupq / raw".into(),
        measured: ratio(rate(rows, "e dedupq amqp"), rate(rows, "e raw amqp")).map(|r| r * 100.0),
        target: 50.0,
        at_least: true,
        unit: "%",
    });
    checks.push(Check {
        what: format!("10M stored keys / empty table ({MIX_PARTITIONS}p)"),
        measured: ratio(
            rate(rows, &format!("a dedupq {MIX_PARTITIONS}p 10M keys")),
            rate(rows, &format!("a dedupq {MIX_PARTITIONS}p")),
        )
        .map(|r| r * 100.0),
        target: 80.0,
        at_least: true,
        unit: "%",
    });
    checks.push(Check {
        what: "worst dedupq p99 at half peak".into(),
        measured: dedupq_rows()
            .filter_map(|r| r.latency.as_ref()?.latency.map(|l| l.1))
            .reduce(f64::max),
        target: 20.0,
        at_least: false,
        unit: " ms",
    });
    checks.push(Check {
        what: "largest dedupq peak RSS".into(),
        measured: dedupq_rows().filter_map(Row::peak_rss_mb).reduce(f64::max),
        target: 200.0,
        at_least: false,
        unit: " MB",
    });
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<40} {:>10} {:>10}  verdict",
        "target", "measured", "target"
    );
    for c in checks {
        let cmp = if c.at_least { ">=" } else { "<" };
        let (measured, verdict) = match c.measured {
            None => ("-".to_string(), "not measured".to_string()),
            Some(m) => {
                let met = if c.at_least {
                    m >= c.target
                } else {
                    m < c.target
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
        let _ = writeln!(
            out,
            "{:<40} {measured:>10} {:>10}  {verdict}",
            c.what,
            format!("{cmp} {}{}", c.target, c.unit)
        );
    }
    out
}
