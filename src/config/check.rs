//! Start-up validation of the configuration tree. Each rule names the
//! setting and the fix.

use crate::config::{redact_url, ConfigError, Settings, TenantSource};
use crate::identity::Tenant;

pub(super) fn validate(s: &Settings) -> Result<(), ConfigError> {
    s.store.validate()?;
    check_handler(s)?;
    check_engine(s)?;
    check_identity(s)?;
    check_retention(s)?;
    check_log(s)?;
    s.http.validate()?;
    if !s.kafka.topics.is_empty() {
        s.kafka.validate()?;
    }
    if !s.amqp.queues.is_empty() {
        s.amqp.validate()?;
        check_amqp_outlasts_lease(s)?;
    }
    if s.api.enabled {
        super::api::check(s)?;
    }
    s.telemetry.validate()
}

/// The handler URL is checked here, where the error can hide its
/// credentials, before the handler is built from it.
fn check_handler(s: &Settings) -> Result<(), ConfigError> {
    let url = &s.handler.url;
    // Unset is allowed here (a library user may bring its own handler);
    // `dedupq run` and `dedupq config` refuse it (`check_handler_url`).
    let ok = url.is_empty()
        || url::Url::parse(url).is_ok_and(|u| matches!(u.scheme(), "http" | "https"));
    if !ok {
        return Err(ConfigError::new(
            "handler.url",
            format!("'{}' is not an http(s) URL", redact_url(url)),
            "use http(s)://host:port/path",
        ));
    }
    // A route whose source is nothing dedupq consumes would silently never
    // match, and its payments would go to handler.url.
    for (i, route) in s.handler.routes.iter().enumerate() {
        let Some(source) = &route.source else {
            continue;
        };
        let known = s.kafka.topics.contains(source)
            || s.amqp.queues.contains(source)
            || (s.api.enabled && s.api.routes.iter().any(|r| r.name == *source));
        if !known {
            return Err(ConfigError::new(
                &format!("handler.routes[{i}].source"),
                format!("'{source}' is not a configured Kafka topic, RabbitMQ queue or API route"),
                "name one of kafka.topics, amqp.queues or api.routes, or leave source out",
            ));
        }
    }
    Ok(())
}

/// Whether anything consumes payments: a Kafka topic, a RabbitMQ queue or
/// the HTTP API.
fn consumes(s: &Settings) -> bool {
    !s.kafka.topics.is_empty() || !s.amqp.queues.is_empty() || s.api.enabled
}

/// The built-in HTTP handler needs `handler.url` once anything consumes
/// payments: with the URL forgotten, nothing may be claimed.
pub(super) fn check_handler_url(s: &Settings) -> Result<(), ConfigError> {
    if consumes(s) && s.handler.url.is_empty() {
        return Err(ConfigError::new(
            "handler.url",
            "is not set, and a transport is enabled (kafka.topics, amqp.queues or api.enabled): \
             payments would have nowhere to go",
            "set handler.url (or handler.url_file) to the provider's charge endpoint, \
             e.g. https://psp.example/v1/charges (the bundled simulator: \
             http://127.0.0.1:8081/charges)",
        ));
    }
    Ok(())
}

/// A filter the log cannot use would silently fall back to `info`.
fn check_log(s: &Settings) -> Result<(), ConfigError> {
    tracing_subscriber::EnvFilter::try_new(&s.log.filter)
        .map(drop)
        .map_err(|e| {
            ConfigError::new(
                "log.filter",
                format!("'{}' is not a log filter: {e}", s.log.filter),
                "use tracing directives, e.g. \"info\" or \"warn,dedupq=debug\"",
            )
        })
}

fn check_engine(s: &Settings) -> Result<(), ConfigError> {
    let e = &s.engine;
    if e.renew_every.is_zero() || e.renew_every * 2 > e.lease {
        return Err(ConfigError::new(
            "engine.renew_every",
            format!(
                "{:?} leaves no margin inside the {:?} lease",
                e.renew_every, e.lease
            ),
            "renew at most every lease/2 (lease/3 is a good choice)",
        ));
    }
    if s.handler.timeout >= e.lease {
        return Err(ConfigError::new(
            "handler.timeout",
            format!(
                "{:?} is not shorter than the {:?} lease",
                s.handler.timeout, e.lease
            ),
            "make the handler timeout shorter than engine.lease",
        ));
    }
    if e.concurrency == 0 || e.max_batch == 0 || e.max_attempts == 0 {
        return Err(ConfigError::new(
            "engine.concurrency",
            "engine.concurrency, engine.max_batch and engine.max_attempts must be at least 1",
            "set positive values",
        ));
    }
    if e.max_batch > MAX_CLAIM_BATCH {
        return Err(ConfigError::new(
            "engine.max_batch",
            format!("{} is more than {MAX_CLAIM_BATCH}", e.max_batch),
            "past it a claim statement's written rows outgrow PostgreSQL's hash_mem and each row is \
             checked on its own; the default 500 is near the fastest",
        ));
    }
    if s.handler.retry_for.is_zero() || s.handler.outage_after == 0 {
        return Err(ConfigError::new(
            "handler.retry_for",
            "handler.retry_for and handler.outage_after must be more than zero",
            "the defaults are 20h and 3",
        ));
    }
    if e.retry_backoff_min > e.retry_backoff_max {
        return Err(ConfigError::new(
            "engine.retry_backoff_min",
            "is larger than engine.retry_backoff_max",
            "make the minimum backoff at most the maximum",
        ));
    }
    Ok(())
}

fn check_identity(s: &Settings) -> Result<(), ConfigError> {
    let id = &s.identity;
    match &id.tenant {
        TenantSource::Header { name } if name.is_empty() => {
            return Err(ConfigError::new(
                "identity.tenant.name",
                "is empty",
                "name the header that carries the tenant, e.g. client-id",
            ))
        }
        TenantSource::Fixed { tenant } if Tenant::parse(tenant.as_bytes()).is_err() => {
            return Err(ConfigError::new(
                "identity.tenant.tenant",
                format!("'{tenant}' is not a valid tenant"),
                "use 1..=128 visible ASCII characters without ':'",
            ))
        }
        TenantSource::Body { pointer } if !pointer.starts_with('/') => {
            return Err(ConfigError::new(
                "identity.tenant.pointer",
                format!("'{pointer}' is not a JSON pointer"),
                "start it with '/', e.g. /client_id",
            ))
        }
        _ => {}
    }
    if crate::identity::DerivedKeyFormat::parse(&id.derived_key).is_none() {
        return Err(ConfigError::new(
            "identity.derived_key",
            format!("'{}' is not a derived-key format", id.derived_key),
            "use \"tenant:key\" or \"sha256:<32..=64>\", e.g. \"sha256:40\"",
        ));
    }
    if id.max_body_bytes == 0 {
        return Err(ConfigError::new(
            "identity.max_body_bytes",
            "must be at least 1",
            "the default is 1048576 (1 MiB)",
        ));
    }
    id.fingerprint.validate().map_err(|problem| {
        ConfigError::new("identity.fingerprint", problem, "fix the pointer list")
    })
}

impl Settings {
    /// The longest a message can come back after its key finished: a key
    /// purged sooner than this could see a redelivery and charge again.
    /// The start-up check and `dedupq keys purge` both hold retention to it.
    pub fn redelivery_horizon(&self) -> std::time::Duration {
        // A message may be retried for as long as handler.retry_for (a
        // faulting one uses no attempts: the time alone bounds it).
        self.retention
            .redelivery_horizon
            .max(self.handler.retry_for)
            .max(self.amqp.redelivery_span())
    }
}

/// A delivery whose worker died mid-call comes back at once, finds its
/// key held until the dead worker's lease ends, and waits in the delay
/// queue, one counted trip after another. If `amqp.max_redeliveries` trips
/// can end before the lease does, it is dead-lettered `retry_limit` instead
/// of taken over, and the payment waits for an operator. Twice the lease
/// leaves room for trips the delivery had made before.
fn check_amqp_outlasts_lease(s: &Settings) -> Result<(), ConfigError> {
    let span = s.amqp.least_redelivery_span();
    let lease = s.engine.lease;
    if span >= lease.saturating_mul(2) {
        return Ok(());
    }
    Err(ConfigError::new(
        "amqp.max_redeliveries",
        format!(
            "{} trips through the delay queue (waits from amqp.retry_delay_min {} up to \
             amqp.retry_delay_max {}) can end after {}, before twice engine.lease ({}): \
             a delivery whose worker died would be dead-lettered `retry_limit` while its \
             key is still held, instead of taken over when the lease ends",
            s.amqp.max_redeliveries,
            humantime::format_duration(s.amqp.retry_delay_min),
            humantime::format_duration(s.amqp.retry_delay_max),
            humantime::format_duration(span),
            humantime::format_duration(lease.saturating_mul(2)),
        ),
        "raise amqp.max_redeliveries or amqp.retry_delay_max, or shorten engine.lease",
    ))
}

fn check_retention(s: &Settings) -> Result<(), ConfigError> {
    let r = &s.retention;
    let horizon = s.redelivery_horizon();
    // `auto` is resolved at start-up, above the horizon (retention::keep).
    if let Some(keep) = r.keep.fixed().filter(|keep| *keep <= horizon) {
        return Err(ConfigError::new(
            "retention.keep",
            format!(
                "{} is not longer than the redelivery horizon {} (retention.redelivery_horizon, \
                 handler.retry_for, or amqp.retry_delay_max x \
                 amqp.max_redeliveries): a redelivered message \
                 could find its key purged and charge again",
                humantime::format_duration(keep),
                humantime::format_duration(horizon)
            ),
            "keep finished keys longer than the longest redelivery delay",
        ));
    }
    if r.purge_every.is_zero() {
        return Err(ConfigError::new(
            "retention.purge_every",
            "must be longer than 0s",
            "the default is 1m",
        ));
    }
    if r.purge_batch <= 0 {
        return Err(ConfigError::new(
            "retention.purge_batch",
            "must be at least 1",
            "the default is 1000",
        ));
    }
    Ok(())
}

/// Most messages one claim statement may take. The claim tells unwritten
/// keys apart with a hashed SubPlan over the rows it wrote; PostgreSQL
/// falls back to a per-row subplan once those outgrow `hash_mem` (about
/// 50 000 keys at the default work_mem), so the bound keeps a fifth of that.
pub(crate) const MAX_CLAIM_BATCH: usize = 10_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HandlerRoute;

    #[test]
    fn a_handler_route_for_a_source_nothing_consumes_is_refused() {
        let mut s = Settings::default();
        s.kafka.topics = vec!["payments".into()];
        s.handler.routes = vec![HandlerRoute {
            source: Some("payments".into()),
            tenant: None,
            url: "https://eu.example/charges".into(),
        }];
        assert!(validate(&s).is_ok());
        s.handler.routes[0].source = Some("paymnets".into());
        let e = validate(&s).unwrap_err();
        assert_eq!(e.setting, "handler.routes[0].source");
        assert!(e.problem.contains("paymnets"), "{e}");
    }

    #[test]
    fn a_delay_queue_that_gives_up_before_a_dead_workers_lease_ends_is_refused() {
        let mut s = Settings::default();
        s.amqp.queues = vec!["payments".into()];
        // The defaults: ~13 min of trips against a 30 s lease.
        assert!(validate(&s).is_ok());
        s.engine.lease = std::time::Duration::from_secs(391);
        s.engine.renew_every = std::time::Duration::from_secs(60);
        assert!(validate(&s).is_ok(), "783.75 s of trips, 782 s needed");
        s.engine.lease = std::time::Duration::from_secs(392);
        let e = validate(&s).unwrap_err();
        assert_eq!(e.setting, "amqp.max_redeliveries");
        assert!(e.problem.contains("13m 3s 750ms"), "{e}");
        s.amqp.max_redeliveries = 21;
        assert!(validate(&s).is_ok(), "one more trip of 60 s");
        // Without a RabbitMQ queue, nothing travels through a delay queue.
        s.amqp.queues.clear();
        s.amqp.max_redeliveries = 1;
        assert!(validate(&s).is_ok());
    }

    #[test]
    fn a_claim_batch_past_what_one_hash_holds_is_refused() {
        let mut s = Settings::default();
        s.engine.max_batch = MAX_CLAIM_BATCH;
        assert!(validate(&s).is_ok());
        s.engine.max_batch = MAX_CLAIM_BATCH + 1;
        let e = validate(&s).unwrap_err();
        assert_eq!(e.setting, "engine.max_batch");
        assert!(e.problem.contains("10001"), "{e}");
    }
}
