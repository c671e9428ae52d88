//! Every metric dedupq exports: names, labels and buckets in one place.
//! Labels are low-cardinality by construction: never a key or a tenant.

use crate::message::Transport;
use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry,
};
use std::sync::Arc;

/// Every metric dedupq exports, in one registry. Clones share the same
/// metrics; the fields are reached through `Deref` to [`Inner`].
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

/// The metrics of a [`Metrics`], one field per family.
pub struct Inner {
    /// The registry /metrics renders: these families and `process_*`.
    pub registry: Registry,
    /// Every metric family name, labelled or not, sampled or not.
    pub names: Vec<String>,
    /// `dedupq_messages_total{transport, outcome}`: messages by outcome.
    pub messages: IntCounterVec,
    /// `dedupq_claims_total{result}`: claim results (won, takeover,
    /// duplicate, held, held_unknown, conflict, contended).
    pub claims: IntCounterVec,
    /// `dedupq_handler_duration_seconds{result}`: handler run time by
    /// result (success, permanent, transient, unknown, fault).
    pub handler_duration: HistogramVec,
    /// `dedupq_claim_batch_size`: messages per claim statement.
    pub claim_batch_size: Histogram,
    /// `dedupq_store_statement_duration_seconds{statement}`: round trips of
    /// the engine's key-table statements (claim, finish).
    pub store_duration: HistogramVec,
    /// `dedupq_lease_takeovers_total`: keys taken over after their owner's
    /// lease ended.
    pub takeovers: IntCounter,
    /// `dedupq_fenced_writes_total`: outcome writes refused for a stale
    /// epoch (another worker owns the key); nothing is committed on them.
    pub fenced_writes: IntCounter,
    /// `dedupq_lost_leases_total`: running handlers abandoned because their
    /// lease could not be renewed in time.
    pub lost_leases: IntCounter,
    /// `dedupq_keys{status}`: rows of the key table by status, sampled by
    /// the upkeep leader only.
    pub keys: IntGaugeVec,
    /// `dedupq_keys_abandoned`: `in_progress` keys whose lease ended over
    /// [`crate::store::ABANDONED_AFTER`] ago, sampled with `dedupq_keys` by the upkeep
    /// leader (0 elsewhere).
    pub keys_abandoned: IntGauge,
    /// `dedupq_keys_purged_total`: finished keys deleted by retention.
    pub keys_purged: IntCounter,
    /// `dedupq_store_errors_total{class}`: key-table statements that
    /// failed, by SQLSTATE class (`25` read-only, `57` timeouts, `53`
    /// resources, `55` lock not available, `22`/`23`/`54` a row refused) or
    /// `connection`, `pool`, `other` without one. Count with
    /// [`Metrics::store_error`].
    pub store_errors: IntCounterVec,
    /// `dedupq_dead_letters_total{reason}`: dead letters by reason.
    pub dead_letters: IntCounterVec,
    /// `dedupq_dead_letters_failed_total{transport}`: tries to publish a
    /// dead letter that the broker did not confirm (refused it, or was
    /// out of reach). The message waits: on Kafka its partition holds at
    /// it, on RabbitMQ it is parked in the delay queue or comes back.
    pub dead_letters_failed: IntCounterVec,
    /// `dedupq_kafka_consumer_lag{topic, partition}`: high watermark minus
    /// committed offset.
    pub consumer_lag: IntGaugeVec,
    /// `dedupq_broker_connected{transport}`: 1 while connected.
    pub broker_up: IntGaugeVec,
    /// `dedupq_end_to_end_seconds{transport}`: from receipt to a durable
    /// outcome.
    pub end_to_end: HistogramVec,
    /// `dedupq_amqp_blocked`: 1 while RabbitMQ blocks the connection (a
    /// memory or disk alarm): replies, dead letters and acks wait.
    pub amqp_blocked: IntGauge,
    /// `dedupq_stalled_lanes{transport}`: partitions or queues with waiting
    /// messages and no progress.
    pub stalled_lanes: IntGaugeVec,
    /// `dedupq_kafka_client_restarts_total`: consumers rebuilt after no
    /// broker was reached for `kafka.restart_after_down`.
    pub kafka_client_restarts: IntCounter,
    /// `dedupq_replies_failed_total{transport}`: replies that could not be
    /// delivered (the outcome stays stored).
    pub replies_failed: IntCounterVec,
    /// `dedupq_handler_faults_total{reason}`: handler answers that point at
    /// dedupq's configuration, not at the payment (unauthorized, forbidden,
    /// not_found, method_not_allowed, redirect, tls, other).
    pub handler_faults: IntCounterVec,
    /// `dedupq_handler_paused`: 1 while intake is paused because the
    /// provider is in an outage (failures across different keys, or a 429
    /// or 503 with `Retry-After`); one probe request at a time tests it.
    pub handler_paused: IntGauge,
    /// `dedupq_build_info{version, commit}`: always 1, so dashboards can
    /// join on it.
    pub build_info: IntGaugeVec,
    /// `dedupq_ready`: 1 while /readyz would answer 200 (updated every
    /// second).
    pub ready: IntGauge,
    /// `dedupq_upkeep_leader`: 1 on the one replica that runs retention and
    /// samples `dedupq_keys`.
    pub upkeep_leader: IntGauge,
}

/// Every reason a dead letter is counted under. Listed so the counters
/// exist at 0 from start-up: an alert on `rate(...) > 0` then has a series
/// to evaluate before the first dead letter, and a typo in a rule shows up
/// as "no data" in its test instead of silence in production.
pub const DEAD_LETTER_REASONS: [&str; 14] = [
    "too_large",
    "not_json",
    "duplicate_member",
    "bad_header",
    "duplicate_header",
    "bad_tenant",
    "bad_key",
    "conflict",
    "key_reused",
    "exhausted_retries",
    "outcome_unknown",
    "retry_limit",
    "store_rejected",
    "handler_fault",
];

/// Every reason a handler answer is counted as a configuration fault.
pub const HANDLER_FAULT_REASONS: [&str; 7] = [
    "tls",
    "unauthorized",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "redirect",
    "other",
];

/// The git commit dedupq was built from (build.rs): `DEDUPQ_GIT_COMMIT`
/// when the build sets it, else the checkout's short HEAD, else "unknown".
pub const GIT_COMMIT: &str = env!("DEDUPQ_BUILD_COMMIT");

impl std::ops::Deref for Metrics {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn seconds_buckets() -> Vec<f64> {
    // 0.5 ms .. ~65 s
    exponential_buckets(0.0005, 2.0, 18).expect("static buckets are valid")
}

impl Metrics {
    /// Every family in a registry of its own, with the series whose label
    /// values are known in advance at 0 and `dedupq_build_info` set.
    pub fn new() -> Self {
        let registry = Registry::new();
        let mut names = Vec::new();
        macro_rules! register {
            ($metric:expr) => {{
                let m = $metric.expect("static metric definition is valid");
                names.extend(
                    prometheus::core::Collector::desc(&m)
                        .iter()
                        .map(|d| d.fq_name.clone()),
                );
                registry
                    .register(Box::new(m.clone()))
                    .expect("metric names are unique");
                m
            }};
        }
        let inner = Inner {
            messages: register!(IntCounterVec::new(
                Opts::new("dedupq_messages_total", "Messages by transport and outcome"),
                &["transport", "outcome"]
            )),
            claims: register!(IntCounterVec::new(
                Opts::new("dedupq_claims_total", "Claim results by kind"),
                &["result"]
            )),
            handler_duration: register!(HistogramVec::new(
                HistogramOpts::new("dedupq_handler_duration_seconds", "Handler run time")
                    .buckets(seconds_buckets()),
                &["result"]
            )),
            claim_batch_size: register!(Histogram::with_opts(
                HistogramOpts::new("dedupq_claim_batch_size", "Messages per claim statement")
                    .buckets(exponential_buckets(1.0, 2.0, 12).expect("static buckets"))
            )),
            store_duration: register!(HistogramVec::new(
                HistogramOpts::new(
                    "dedupq_store_statement_duration_seconds",
                    "Round-trip time of key-table statements"
                )
                .buckets(seconds_buckets()),
                &["statement"]
            )),
            takeovers: register!(IntCounter::new(
                "dedupq_lease_takeovers_total",
                "Keys taken over after the previous owner's lease ended"
            )),
            fenced_writes: register!(IntCounter::new(
                "dedupq_fenced_writes_total",
                "Writes refused because the worker's epoch was stale"
            )),
            lost_leases: register!(IntCounter::new(
                "dedupq_lost_leases_total",
                "Running handlers whose lease could not be renewed"
            )),
            keys: register!(IntGaugeVec::new(
                Opts::new("dedupq_keys", "Rows in the key table by status (sampled)"),
                &["status"]
            )),
            keys_abandoned: register!(IntGauge::new(
                "dedupq_keys_abandoned",
                "in_progress keys whose lease ended over 15 minutes ago: no worker holds them, \
                 and no delivery has taken them over (sampled)"
            )),
            keys_purged: register!(IntCounter::new(
                "dedupq_keys_purged_total",
                "Finished keys deleted by retention"
            )),
            store_errors: register!(IntCounterVec::new(
                Opts::new(
                    "dedupq_store_errors_total",
                    "Key-table statements that failed, by SQLSTATE class"
                ),
                &["class"]
            )),
            dead_letters: register!(IntCounterVec::new(
                Opts::new(
                    "dedupq_dead_letters_total",
                    "Dead-lettered messages by reason"
                ),
                &["reason"]
            )),
            dead_letters_failed: register!(IntCounterVec::new(
                Opts::new(
                    "dedupq_dead_letters_failed_total",
                    "Dead-letter publishes the broker did not confirm; the message waits and is tried again"
                ),
                &["transport"]
            )),
            consumer_lag: register!(IntGaugeVec::new(
                Opts::new(
                    "dedupq_kafka_consumer_lag",
                    "High watermark minus committed offset"
                ),
                &["topic", "partition"]
            )),
            broker_up: register!(IntGaugeVec::new(
                Opts::new(
                    "dedupq_broker_connected",
                    "1 while the broker connection is up"
                ),
                &["transport"]
            )),
            end_to_end: register!(HistogramVec::new(
                HistogramOpts::new(
                    "dedupq_end_to_end_seconds",
                    "From receipt to a durable outcome"
                )
                .buckets(seconds_buckets()),
                &["transport"]
            )),
            amqp_blocked: register!(IntGauge::new(
                "dedupq_amqp_blocked",
                "1 while RabbitMQ blocks the connection (a resource alarm): replies, dead letters and acks wait"
            )),
            stalled_lanes: register!(IntGaugeVec::new(
                Opts::new(
                    "dedupq_stalled_lanes",
                    "Partitions or queues with waiting messages that made no progress lately"
                ),
                &["transport"]
            )),
            kafka_client_restarts: register!(IntCounter::new(
                "dedupq_kafka_client_restarts_total",
                "Kafka consumers rebuilt after no broker was reached for kafka.restart_after_down"
            )),
            replies_failed: register!(IntCounterVec::new(
                Opts::new(
                    "dedupq_replies_failed_total",
                    "Replies that could not be delivered; the outcome stays stored"
                ),
                &["transport"]
            )),
            handler_faults: register!(IntCounterVec::new(
                Opts::new(
                    "dedupq_handler_faults_total",
                    "Handler answers caused by configuration (401, 403, 404, 405, redirects, a refused TLS handshake), retried"
                ),
                &["reason"]
            )),
            handler_paused: register!(IntGauge::new(
                "dedupq_handler_paused",
                "1 while intake is paused for a provider outage"
            )),
            build_info: register!(IntGaugeVec::new(
                Opts::new(
                    "dedupq_build_info",
                    "Always 1; the labels name the running build"
                ),
                &["version", "commit"]
            )),
            ready: register!(IntGauge::new(
                "dedupq_ready",
                "1 while the process is ready (store reachable, configured brokers connected)"
            )),
            upkeep_leader: register!(IntGauge::new(
                "dedupq_upkeep_leader",
                "1 on the replica that runs retention purges and samples dedupq_keys"
            )),
            registry,
            names,
        };
        inner.initialise_known_labels();
        register_process_metrics(&inner.registry);
        Self(Arc::new(inner))
    }

    /// Counts a failed key-table statement under its SQLSTATE class.
    pub fn store_error(&self, e: &crate::store::StoreError) {
        self.store_errors.with_label_values(&[e.class()]).inc();
    }

    /// Failed key-table statements, every class together.
    pub fn store_errors_total(&self) -> u64 {
        use prometheus::core::Collector;
        self.store_errors
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .map(|m| m.get_counter().value() as u64)
            .sum()
    }

    /// The Prometheus text exposition of every metric, the `process_*`
    /// family (CPU, memory, file descriptors) included.
    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding of gathered metrics cannot fail");
        String::from_utf8(out).expect("the text encoder writes UTF-8")
    }
}

impl Inner {
    /// Makes every series whose label values are known in advance exist
    /// from start-up, at 0.
    fn initialise_known_labels(&self) {
        for reason in DEAD_LETTER_REASONS {
            self.dead_letters.with_label_values(&[reason]);
        }
        for reason in HANDLER_FAULT_REASONS {
            self.handler_faults.with_label_values(&[reason]);
        }
        for class in crate::store::STORE_ERROR_CLASSES {
            self.store_errors.with_label_values(&[class]);
        }
        for transport in Transport::BROKERS {
            self.replies_failed.with_label_values(&[transport.label()]);
            self.dead_letters_failed
                .with_label_values(&[transport.label()]);
            self.stalled_lanes.with_label_values(&[transport.label()]);
        }
        self.build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), GIT_COMMIT])
            .set(1);
    }
}

/// The standard `process_*` metrics of this process. They are not listed
/// in `names` (which holds dedupq's own families) and exist only on Linux.
fn register_process_metrics(registry: &Registry) {
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("process metric names are unique");
    #[cfg(not(target_os = "linux"))]
    let _ = registry;
}
