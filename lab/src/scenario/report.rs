//! The figures of a scenario run, and its verdict.

use super::profile::{Fault, Profile};
use super::run::Names;
use super::verify::ChargeCheck;
use super::workload::{Kind, Workload};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

#[derive(Debug, Default)]
pub struct Report {
    pub profile: String,
    pub run_id: String,
    pub messages: usize,
    pub unique_payments: usize,
    pub duplicates_injected: usize,
    pub conflicts_injected: usize,
    pub invalid_injected: usize,
    /// Hostile messages by the dead-letter reason they must end with.
    pub hostile_injected: BTreeMap<&'static str, usize>,
    pub published_kafka: usize,
    pub published_amqp: usize,
    pub amqp_republished: usize,
    pub kills: usize,
    pub postgres_restarts: usize,
    pub kafka_restarts: usize,
    pub amqp_closes: usize,
    pub provider_stretches: usize,
    pub pg_read_only: usize,
    pub pg_no_connections: usize,
    pub pg_timeouts: usize,
    pub pg_row_locks: usize,
    /// SIGSTOPs past the lease (each followed by a SIGCONT).
    pub freezes: usize,
    /// See `Profile::settle_every_key`.
    pub settle_every_key: bool,
    /// The provider's ledger records requests in the order they arrive:
    /// no PostgreSQL restart stalls it (requests waiting for it are then
    /// recorded in any order).
    pub ledger_in_order: bool,
    pub charges: usize,
    pub check: ChargeCheck,
    pub commits_ahead: Vec<String>,
    pub uncommitted: i64,
    pub amqp_left: usize,
    pub kafka_dead_letters: BTreeMap<String, usize>,
    pub amqp_dead_letters: BTreeMap<String, usize>,
    /// Dead letters (not conflicts) of payments the provider charged, as
    /// `reason key`.
    pub charged_dead_letters: Vec<String>,
    pub publish_seconds: f64,
    pub run_seconds: f64,
    pub quiesced: bool,
    pub timeline: Vec<String>,
    /// `dedupq_messages_total` by outcome, summed over the instances
    /// (since each one's last start).
    pub outcomes: BTreeMap<String, f64>,
    pub metrics_urls: Vec<String>,
    /// `dedupq_stalled_lanes` and `dedupq_replies_failed_total`, summed
    /// over the instances at the end.
    pub stalled_lanes: f64,
    pub replies_failed: f64,
    /// Instances whose /readyz did not answer 200 at the end, and why.
    pub not_ready: Vec<String>,
    pub violations: Vec<String>,
}

impl Report {
    pub fn new(profile: &Profile, names: &Names, workload: &Workload, unique: usize) -> Self {
        Self {
            profile: profile.name.to_string(),
            run_id: names.run_id.clone(),
            messages: workload.messages.len(),
            unique_payments: unique,
            duplicates_injected: workload
                .messages
                .iter()
                .filter(|m| m.kind.is_duplicate())
                .count(),
            conflicts_injected: workload.count(Kind::Conflict),
            invalid_injected: workload.count(Kind::Invalid),
            hostile_injected: workload.hostile_reasons(),
            settle_every_key: profile.settle_every_key,
            ledger_in_order: !profile
                .faults
                .iter()
                .any(|(_, f)| matches!(f, Fault::RestartPostgres)),
            ..Self::default()
        }
    }

    /// Adds one instance's message counts by outcome, stalled lanes and
    /// refused replies.
    pub fn add_metrics(&mut self, exposition: &str) {
        let sum = |name: &str| -> f64 {
            exposition
                .lines()
                .filter(|l| l.starts_with(name))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        self.stalled_lanes += sum("dedupq_stalled_lanes{");
        self.replies_failed += sum("dedupq_replies_failed_total{");
        for line in exposition
            .lines()
            .filter(|l| l.starts_with("dedupq_messages_total{"))
        {
            let outcome = line
                .split("outcome=\"")
                .nth(1)
                .and_then(|r| r.split('"').next());
            let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
            if let (Some(o), Some(v)) = (outcome, value) {
                *self.outcomes.entry(o.to_string()).or_default() += v;
            }
        }
    }

    pub fn note(&mut self, at: Duration, what: &str) {
        self.timeline
            .push(format!("{:>6.1}s {what}", at.as_secs_f64()));
    }

    fn dead_letters(&self, reason: &str) -> usize {
        self.kafka_dead_letters.get(reason).copied().unwrap_or(0)
            + self.amqp_dead_letters.get(reason).copied().unwrap_or(0)
    }

    pub fn total_dead_letters(&self) -> usize {
        self.kafka_dead_letters.values().sum::<usize>()
            + self.amqp_dead_letters.values().sum::<usize>()
    }

    /// Fills `violations` from the figures.
    pub fn judge(&mut self) {
        let mut v = Vec::new();
        for d in self.check.double_charged.iter().take(10) {
            v.push(format!("double charge: {d}"));
        }
        if !self.check.missing.is_empty() {
            v.push(format!(
                "{} payments never charged, e.g. {:?}",
                self.check.missing.len(),
                &self.check.missing[..self.check.missing.len().min(5)]
            ));
        }
        let mut listed = vec![
            ("stored failed but charged", &self.check.failed_but_charged),
            (
                "stored done but not charged",
                &self.check.done_but_not_charged,
            ),
            (
                "stored done without the provider's answer",
                &self.check.answer_lost,
            ),
            (
                "stored failed, neither charged nor refused by the provider",
                &self.check.failed_not_refused,
            ),
            (
                "charged by a frozen process's call on an ended lease",
                &self.check.calls_after_freeze,
            ),
        ];
        if self.ledger_in_order {
            listed.push((
                "charged by a call on an ended lease (after a later attempt's charge)",
                &self.check.calls_out_of_order,
            ));
        }
        if self.settle_every_key {
            listed.push(("held unknown, not settled", &self.check.held));
            listed.push(("charged and dead-lettered", &self.charged_dead_letters));
        }
        for (what, list) in listed {
            if !list.is_empty() {
                v.push(format!(
                    "{} payments {what}, e.g. {:?}",
                    list.len(),
                    &list[..list.len().min(5)]
                ));
            }
        }
        for (reason, injected) in &self.hostile_injected {
            let dead = self.dead_letters(reason);
            if dead < *injected {
                v.push(format!(
                    "{injected} hostile messages must be dead-lettered {reason}, found {dead}"
                ));
            }
        }
        if self.stalled_lanes > 0.0 {
            v.push(format!("{} lanes stalled at the end", self.stalled_lanes));
        }
        for n in &self.not_ready {
            v.push(format!("not ready at the end: {n}"));
        }
        if !self.check.unfinished.is_empty() {
            v.push(format!(
                "{} payments unfinished, e.g. {:?}",
                self.check.unfinished.len(),
                &self.check.unfinished[..self.check.unfinished.len().min(5)]
            ));
        }
        for c in self.commits_ahead.iter().take(10) {
            v.push(format!(
                "offset committed ahead of an unfinished message: {c}"
            ));
        }
        if self.uncommitted != 0 {
            v.push(format!(
                "{} Kafka messages never committed",
                self.uncommitted
            ));
        }
        if self.amqp_left != 0 {
            v.push(format!(
                "{} RabbitMQ messages left in the work and delay queues",
                self.amqp_left
            ));
        }
        let invalid: usize = ["not_json", "bad_key", "bad_tenant", "too_large"]
            .iter()
            .map(|r| self.dead_letters(r))
            .sum();
        if invalid < self.invalid_injected {
            v.push(format!(
                "{} invalid messages injected, only {invalid} dead-lettered",
                self.invalid_injected
            ));
        }
        if self.conflicts_injected > 0 && self.dead_letters("conflict") == 0 {
            v.push("conflicting messages were not dead-lettered".into());
        }
        if let Some(n) = self
            .kafka_dead_letters
            .get("<no reason>")
            .or(self.amqp_dead_letters.get("<no reason>"))
        {
            v.push(format!("{n} dead letters without a reason"));
        }
        self.violations.extend(v);
    }

    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let row = |f: &mut fmt::Formatter<'_>, name: &str, value: String| {
            writeln!(f, "  {name:<44} {value:>12}")
        };
        writeln!(
            f,
            "\n== dedupq scenario '{}' (run {}) ==",
            self.profile, self.run_id
        )?;
        row(f, "messages published", self.messages.to_string())?;
        row(
            f,
            "  via Kafka / via RabbitMQ",
            format!("{} / {}", self.published_kafka, self.published_amqp),
        )?;
        row(f, "unique payments", self.unique_payments.to_string())?;
        row(
            f,
            "duplicates injected",
            self.duplicates_injected.to_string(),
        )?;
        row(
            f,
            "  RabbitMQ re-publishes after a lost connection",
            self.amqp_republished.to_string(),
        )?;
        row(
            f,
            "conflicting / invalid messages injected",
            format!("{} / {}", self.conflicts_injected, self.invalid_injected),
        )?;
        row(
            f,
            "dedupq SIGKILLs (each restarted)",
            self.kills.to_string(),
        )?;
        row(
            f,
            "PostgreSQL / Kafka restarts",
            format!("{} / {}", self.postgres_restarts, self.kafka_restarts),
        )?;
        row(
            f,
            "RabbitMQ connection force-closes",
            self.amqp_closes.to_string(),
        )?;
        row(
            f,
            "provider slow/failing/hanging stretches",
            self.provider_stretches.to_string(),
        )?;
        row(
            f,
            "PostgreSQL read-only / no-connection / timeout / row-lock stretches",
            format!(
                "{} / {} / {} / {}",
                self.pg_read_only, self.pg_no_connections, self.pg_timeouts, self.pg_row_locks
            ),
        )?;
        row(
            f,
            "dedupq SIGSTOPs past the lease",
            self.freezes.to_string(),
        )?;
        row(f, "charges at the provider", self.charges.to_string())?;
        row(f, "payments charged", self.check.charged_keys.to_string())?;
        row(
            f,
            "double charges",
            self.check.double_charged.len().to_string(),
        )?;
        row(f, "missing charges", self.check.missing.len().to_string())?;
        row(
            f,
            "stored failed but charged",
            self.check.failed_but_charged.len().to_string(),
        )?;
        row(
            f,
            "stored done but not charged",
            self.check.done_but_not_charged.len().to_string(),
        )?;
        row(
            f,
            "stored done without the provider's answer",
            self.check.answer_lost.len().to_string(),
        )?;
        row(
            f,
            "stored failed, declined (provider agrees)",
            self.check.failed_declined.to_string(),
        )?;
        row(
            f,
            "stored failed, neither charged nor refused",
            self.check.failed_not_refused.len().to_string(),
        )?;
        row(
            f,
            "charged but not stored done",
            self.check.charged_not_done.to_string(),
        )?;
        row(
            f,
            "charged by a call on an ended lease (2)",
            format!(
                "{} / {}",
                self.check.calls_out_of_order.len(),
                self.check.calls_after_freeze.len()
            ),
        )?;
        row(
            f,
            "held unknown for an operator",
            self.check.held.len().to_string(),
        )?;
        for h in &self.check.held {
            writeln!(f, "    {h}")?;
        }
        row(
            f,
            "repeats after an abandoned attempt (1)",
            self.check.repeated_after_abandoned_attempt.to_string(),
        )?;
        row(
            f,
            "  of which the attempt's process was SIGKILLed",
            self.check.repeated_by_killed_process.to_string(),
        )?;
        row(
            f,
            "duplicates suppressed",
            self.messages
                .saturating_sub(self.unique_payments + self.total_dead_letters())
                .to_string(),
        )?;
        row(
            f,
            "dead letters (Kafka + RabbitMQ)",
            self.total_dead_letters().to_string(),
        )?;
        row(
            f,
            "  of payments the provider charged (no conflict)",
            self.charged_dead_letters.len().to_string(),
        )?;
        for (transport, letters) in [
            ("Kafka", &self.kafka_dead_letters),
            ("RabbitMQ", &self.amqp_dead_letters),
        ] {
            for (reason, n) in letters {
                row(f, &format!("  {transport}: {reason}"), n.to_string())?;
            }
        }
        for (reason, n) in &self.hostile_injected {
            row(
                f,
                &format!("hostile input injected: {reason}"),
                n.to_string(),
            )?;
        }
        row(
            f,
            "replies refused by reply_to (counted, acked)",
            format!("{:.0}", self.replies_failed),
        )?;
        row(
            f,
            "stalled lanes at the end",
            format!("{:.0}", self.stalled_lanes),
        )?;
        row(
            f,
            "offsets committed ahead of open messages",
            self.commits_ahead.len().to_string(),
        )?;
        row(
            f,
            "uncommitted / unacked at the end",
            format!("{} / {}", self.uncommitted, self.amqp_left),
        )?;
        row(f, "run time (s)", format!("{:.1}", self.run_seconds))?;
        row(
            f,
            "messages/s (paced by the publisher)",
            format!("{:.0}", self.messages as f64 / self.run_seconds.max(0.001)),
        )?;
        if !self.outcomes.is_empty() {
            writeln!(
                f,
                "  dedupq_messages_total by outcome (all instances, since their last start):"
            )?;
            for (outcome, n) in &self.outcomes {
                row(f, &format!("    {outcome}"), format!("{n:.0}"))?;
            }
        }
        for url in &self.metrics_urls {
            writeln!(
                f,
                "  metrics were served at {url} (Prometheus text; see docs/metrics.md)"
            )?;
        }
        writeln!(f, "  (1) the attempt was killed after the provider charged, or got no answer; dedupq retried")?;
        writeln!(f, "      with the same derived key, which a provider that honours keys answers with the first charge")?;
        writeln!(f, "  (2) after a later attempt's charge / by a process frozen past its lease, once it ended")?;
        if !self.timeline.is_empty() {
            writeln!(f, "  faults:")?;
            for t in &self.timeline {
                writeln!(f, "    {t}")?;
            }
        }
        if self.violations.is_empty() {
            writeln!(f, "RESULT: all invariants hold")
        } else {
            writeln!(f, "RESULT: {} violation(s):", self.violations.len())?;
            for v in &self.violations {
                writeln!(f, "  - {v}")?;
            }
            Ok(())
        }
    }
}
