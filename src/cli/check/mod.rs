//! `dedupq check`: a preflight before the first start and in CI/CD. Each
//! check reads, never writes: no key is claimed, no message consumed or
//! produced, and the provider is sent a `HEAD`, never a charge.

mod brokers;
mod files;
mod provider;
mod report;
mod store;

pub use report::{Check, Report, ReportFormat, Status};

use crate::config::{ConfigError, Settings};
use std::io::Write;

/// Runs every check that applies to `loaded` and prints the report;
/// `Ok(false)` when a check failed.
pub async fn run_check(
    loaded: Result<Settings, ConfigError>,
    format: ReportFormat,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    let report = checks(loaded).await;
    report.print(format, out)?;
    Ok(!report.failed())
}

/// The checks of `loaded`, in the order an operator fixes them.
pub async fn checks(loaded: Result<Settings, ConfigError>) -> Report {
    let mut report = Report::default();
    let settings = match loaded {
        Ok(s) => s,
        Err(e) => {
            report.push(Check::fail("config", e.problem.clone(), fix_of(&e)));
            return report;
        }
    };
    report.push(Check::ok("config", summary(&settings)));
    files::check(&settings, &mut report);
    report.push(open_files(&settings));
    store::check(&settings, &mut report).await;
    brokers::check_kafka(&settings, &mut report).await;
    brokers::check_amqp(&settings, &mut report).await;
    provider::check(&settings, &mut report).await;
    report
}

/// Whether the connections the configuration allows fit under the
/// open-files limit `dedupq run` raises itself to (the hard limit).
fn open_files(s: &Settings) -> Check {
    let name = "process.open_files";
    let Some(limits) = crate::open_files::limits() else {
        return Check::ok(name, "this platform does not tell its open-files limit");
    };
    match crate::open_files::fits(s, limits.hard) {
        Ok(()) => Check::ok(
            name,
            format!(
                "up to {} open at once; dedupq run raises its limit from {} to {}",
                crate::open_files::needed(s),
                limits.soft,
                limits.hard
            ),
        ),
        Err(e) => Check::fail(name, e.problem.clone(), fix_of(&e)),
    }
}

/// The fix of a configuration error, naming the setting and its variable.
pub(super) fn fix_of(e: &ConfigError) -> String {
    format!("{} (setting {}, env {})", e.fix, e.setting, e.env)
}

fn summary(s: &Settings) -> String {
    let mut ways = Vec::new();
    if !s.kafka.topics.is_empty() {
        ways.push(format!("Kafka topics {}", s.kafka.topics.join(", ")));
    }
    if !s.amqp.queues.is_empty() {
        ways.push(format!("RabbitMQ queues {}", s.amqp.queues.join(", ")));
    }
    if s.api.enabled {
        ways.push(format!("the HTTP API on {}", s.api.listen));
    }
    if ways.is_empty() {
        "valid; consumes nothing (no kafka.topics, amqp.queues or api.enabled)".into()
    } else {
        format!("valid; consumes {}", ways.join("; "))
    }
}
