//! What the dependency tests share: the `dedupq run` configurations on
//! each transport, a run on a Kafka topic of its own, and reads of the key
//! table and the provider.

use crate::support::kafka::{self, headers, produce};
use crate::support::pg_faults::{
    charged_once_and_stored_whole, read_status, FaultyRole, StagedFault, StoreFault, LONG_ANSWER,
};
use crate::support::process::{base_config, metric_value, Dedupq, Provider};
use crate::support::{amqp, rabbit_management};
use crate::support::{eventually, unique};
use dedupq::config::StoreSettings;
use dedupq::store::Store;
use dedupq::transport::amqp::{AmqpSettings, QueueType};
use dedupq_provider::Knobs;
use rdkafka::producer::FutureProducer;
use std::time::Duration;

pub const TENANT: &str = "t1";

pub fn body(n: usize) -> String {
    format!(
        r#"{{"amount":{},"currency":"EUR","recipient":"r-{n}"}}"#,
        100 + n
    )
}

/// A `dedupq run` consuming a Kafka topic of its own, ready, and a
/// producer of payments for it.
pub struct KafkaRun {
    pub dedupq: Dedupq,
    pub topic: String,
    pub group: String,
    pub partitions: i32,
    producer: FutureProducer,
}

impl KafkaRun {
    /// Creates a topic (named after `name`) of `partitions` and starts
    /// `base` on it; returns once /readyz says ready.
    pub async fn start(name: &str, partitions: i32, base: &toml::Table) -> Self {
        let (topic, _) = kafka::topics(name, partitions).await;
        let group = unique("g");
        let dedupq = started(&kafka::with_kafka(base, &topic, &group, "")).await;
        Self {
            dedupq,
            topic,
            group,
            partitions,
            producer: kafka::producer(),
        }
    }

    /// Produces payment `n` (its body) under `tenant`'s `key` to `partition`.
    pub async fn pay(&self, partition: i32, tenant: &str, key: &str, n: usize) {
        produce(
            &self.producer,
            &self.topic,
            partition,
            &headers(tenant, key),
            body(n).as_bytes(),
        )
        .await;
    }

    /// The group's committed offsets, one per partition (-1: none).
    pub async fn committed(&self) -> Vec<i64> {
        kafka::committed(&self.group, &self.topic, self.partitions).await
    }

    /// Waits until every message produced so far is committed.
    pub async fn wait_committed_to_end(&self, limit: Duration) {
        kafka::wait_committed_to_end(&self.group, &self.topic, self.partitions, limit).await;
    }
}

/// Handler calls `dedupq` made (every answer, whatever it was).
pub async fn calls(dedupq: &Dedupq) -> f64 {
    dedupq.metric("dedupq_handler_duration_seconds_count").await
}

impl KafkaRun {
    /// For `for_`, while `fault` lasts, checks every half second that
    /// nothing is committed and that `key`'s outcome is not stored: its
    /// answer is held in memory.
    pub async fn held_uncommitted(
        &self,
        store: &Store,
        fault: &StagedFault,
        key: &str,
        for_: Duration,
    ) {
        let until = tokio::time::Instant::now() + for_;
        while tokio::time::Instant::now() < until {
            assert_eq!(
                self.committed().await,
                vec![-1],
                "nothing committed while the outcome is not stored"
            );
            assert_eq!(
                fault.status(store.pool(), TENANT, key).await.as_deref(),
                Some("in_progress"),
                "{key}: not stored yet"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Once the fault is over: every message committed, each of `keys`
    /// stored `done` with one charge (and no other charge made), the
    /// process ready again, nothing dead-lettered.
    pub async fn settled_once_each(&mut self, store: &Store, provider: &Provider, keys: &[&str]) {
        self.wait_committed_to_end(Duration::from_secs(60)).await;
        for k in keys {
            assert_eq!(status(store, k).await.as_deref(), Some("done"), "{k}");
            let charges = provider.charges_for(&format!("{TENANT}:{k}")).await;
            assert_eq!(charges.len(), 1, "{k}: one charge");
        }
        assert_eq!(
            provider.stats().await.charges,
            keys.len() as i64,
            "one provider charge each"
        );
        self.dedupq
            .wait_ready(Duration::from_secs(20))
            .await
            .expect("ready again once the fault is over");
        assert_eq!(self.dedupq.metric("dedupq_dead_letters_total").await, 0.0);
    }
}

/// Checks that no payment was given up so far (none dead-lettered, none
/// counted invalid); returns the metrics read, for the fault's own checks.
pub async fn nothing_given_up(dedupq: &Dedupq) -> String {
    let metrics = dedupq.metrics().await;
    let metric = |s: &str| crate::support::process::metric_value(&metrics, s);
    assert_eq!(
        metric("dedupq_dead_letters_total"),
        0.0,
        "nothing dead-lettered"
    );
    assert_eq!(
        metric(r#"dedupq_messages_total{outcome="invalid"}"#),
        0.0,
        "no payment counted invalid"
    );
    metrics
}

/// Waits until /readyz is 503 and its body holds each of `words`.
pub async fn not_ready_naming(dedupq: &Dedupq, words: &[&str]) {
    eventually(
        Duration::from_secs(30),
        &format!("/readyz not ready, naming {words:?}"),
        || async {
            let (ok, body) = dedupq.readyz().await;
            (!ok && words.iter().all(|w| body.contains(w))).then_some(())
        },
    )
    .await;
}

/// The provider of [`answers_in_1s`], and a run logged in as `role` on a
/// topic of its own (named after `name`): the window in which a fault
/// meets an answer on its way.
pub async fn run_as(name: &str, role: &FaultyRole, store: &StoreSettings) -> (Provider, KafkaRun) {
    let provider = Provider::start(answers_in_1s()).await;
    let base = base_config(&role.store_settings(store), &provider);
    let run = KafkaRun::start(name, 1, &base).await;
    (provider, run)
}

/// The provider of the fault tests: it answers 1 s after it charges, with
/// a receipt of [`LONG_ANSWER`] bytes (storing it needs a new page). With
/// the tests' lease (3 s, renewed every second) an answer is cut off if it
/// comes later than ~2 s after the claim while no renewal works, and the
/// handler gives up at 2 s: then its outcome would be `unknown`, resolved
/// by a takeover's second call, and the test would no longer show the
/// answer kept through the fault.
pub fn answers_in_1s() -> Knobs {
    Knobs {
        latency: Duration::from_secs(1),
        answer_padding: LONG_ANSWER,
        ..Knobs::default()
    }
}

/// Waits until the provider has made `n` charges.
pub async fn charged(provider: &Provider, n: i64) {
    eventually(Duration::from_secs(20), "the provider charged", || async {
        (provider.stats().await.charges == n).then_some(())
    })
    .await;
}

/// `base` plus an `[amqp]` section for a fresh quorum queue.
pub fn with_amqp(base: &toml::Table) -> (toml::Table, AmqpSettings) {
    let settings = AmqpSettings {
        max_redeliveries: 1000,
        ..amqp::settings(QueueType::Quorum)
    };
    let mut config = base.clone();
    config.insert("amqp".into(), amqp::config_section(&settings));
    (config, settings)
}

/// The key's status, or None if it has no row.
pub async fn status(store: &Store, key: &str) -> Option<String> {
    read_status(store.pool(), TENANT, key).await
}

/// Sets `[section] key = value` in a configuration, adding what is missing.
pub fn set(config: &mut toml::Table, section: &str, key: &str, value: impl Into<toml::Value>) {
    let table = config
        .entry(section)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .expect("a table");
    table.insert(key.to_string(), value.into());
}

/// The AMQP side of a fault of PostgreSQL's: a delivery charged, its
/// answer (longer than a page) 1 s away ([`answers_in_1s`]), when `fault`
/// begins; another published meanwhile. For `for_` (longer than the
/// lease) the first stays claimed and unacked, nothing is dead-lettered or
/// counted invalid, the second is run at most once (not at all if the
/// fault refuses claims), and /readyz names the fault; once it ends, each
/// is stored done, its answer whole, with one charge, and only then acked.
pub async fn amqp_charge_answered_during(fault: StoreFault, for_: Duration) {
    let (store, store_settings) = crate::support::isolated_store().await;
    let fault = StagedFault::stage(fault, &store_settings).await;
    let provider = Provider::start(answers_in_1s()).await;
    let run = AmqpRun::start(&base_config(
        &fault.store_settings(&store_settings),
        &provider,
    ))
    .await;

    run.pay(TENANT, "pay-0", 0).await;
    charged(&provider, 1).await;
    fault.begin().await;
    readiness_during(&run.dedupq, &fault).await;
    run.pay(TENANT, "pay-1", 1).await;

    let until = tokio::time::Instant::now() + for_;
    while tokio::time::Instant::now() < until {
        assert_eq!(
            fault.status(store.pool(), TENANT, "pay-0").await.as_deref(),
            Some("in_progress"),
            "claimed, its answer not stored yet"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    run.holds(2).await;
    nothing_given_up_during(&run.dedupq, &provider, &fault).await;

    fault.end().await;
    for k in ["pay-0", "pay-1"] {
        eventually(Duration::from_secs(60), "stored done", || async {
            (status(&store, k).await.as_deref() == Some("done")).then_some(())
        })
        .await;
        charged_once_and_stored_whole(&store, &provider, TENANT, k).await;
    }
    run.wait_acked(Duration::from_secs(30)).await;
    assert_eq!(provider.stats().await.charges, 2);
    run.stop().await;
    drop(store);
    fault.remove().await;
}

/// The Kafka side of [`amqp_charge_answered_during`]: nothing committed
/// (instead of acked) until each outcome is stored.
pub async fn kafka_charge_answered_during(fault: StoreFault, for_: Duration) {
    let (store, store_settings) = crate::support::isolated_store().await;
    let fault = StagedFault::stage(fault, &store_settings).await;
    let provider = Provider::start(answers_in_1s()).await;
    let base = base_config(&fault.store_settings(&store_settings), &provider);
    let mut run = KafkaRun::start("storefault", 1, &base).await;

    run.pay(0, TENANT, "pay-0", 0).await;
    charged(&provider, 1).await;
    fault.begin().await;
    readiness_during(&run.dedupq, &fault).await;
    run.pay(0, TENANT, "pay-1", 1).await;

    run.held_uncommitted(&store, &fault, "pay-0", for_).await;
    nothing_given_up_during(&run.dedupq, &provider, &fault).await;

    fault.end().await;
    run.settled_once_each(&store, &provider, &["pay-0", "pay-1"])
        .await;
    for k in ["pay-0", "pay-1"] {
        charged_once_and_stored_whole(&store, &provider, TENANT, k).await;
    }
    run.dedupq.kill();
    drop(store);
    fault.remove().await;
}

/// Once `fault` has begun: /readyz names it, or says ready if the fault
/// is not one it reports.
async fn readiness_during(dedupq: &Dedupq, fault: &StagedFault) {
    match fault.named_as() {
        Some(words) => not_ready_naming(dedupq, words).await,
        None => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert!(dedupq.readyz().await.0, "still ready");
        }
    }
}

/// While `fault` lasts: nothing given up, its failed statements counted,
/// and the payment that arrived meanwhile (pay-1) not run if the
/// fault refuses claims, else run at most once.
async fn nothing_given_up_during(dedupq: &Dedupq, provider: &Provider, fault: &StagedFault) {
    let metrics = nothing_given_up(dedupq).await;
    let counter = fault.counted_as();
    assert!(metric_value(&metrics, &counter) > 0.0, "{counter} counted");
    let meanwhile = provider.charges_for(&format!("{TENANT}:pay-1")).await;
    if fault.refuses_claims() {
        assert!(
            meanwhile.is_empty(),
            "the payment that arrived meanwhile is not run before it can be claimed"
        );
    } else {
        assert!(meanwhile.len() <= 1, "pay-1 charged at most once");
    }
    fault.still_holds().await;
}

/// `dedupq run` with `config`, once /readyz says ready.
async fn started(config: &toml::Table) -> Dedupq {
    let mut dedupq = Dedupq::start(config).await;
    dedupq
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("ready");
    dedupq
}

/// A `dedupq run` on a RabbitMQ quorum queue of its own.
pub struct AmqpRun {
    pub dedupq: Dedupq,
    pub settings: AmqpSettings,
    client: amqp::Client,
}

impl AmqpRun {
    pub async fn start(base: &toml::Table) -> Self {
        let (config, settings) = with_amqp(base);
        let dedupq = started(&config).await;
        Self {
            dedupq,
            settings,
            client: amqp::Client::connect().await,
        }
    }

    /// Publishes payment `n` (its body) under `tenant`'s `key`.
    pub async fn pay(&self, tenant: &str, key: &str, n: usize) {
        let queue = &self.settings.queues[0];
        self.client
            .publish(queue, &amqp::Msg::new(tenant, key, &body(n)))
            .await;
    }

    /// Deliveries in the queue, ready or unacked (the management API's
    /// counts lag by up to 5 s).
    async fn held(&self) -> serde_json::Value {
        rabbit_management::queue_info(&self.settings.queues[0]).await["messages"].clone()
    }

    /// Checks that the queue holds `n` deliveries (ready or unacked), none
    /// acked: the count the management API gives settles there (it lags
    /// by 5 s or more on a busy machine), and an ack would keep it below.
    pub async fn holds(&self, n: usize) {
        eventually(
            Duration::from_secs(20),
            &format!("{n} deliveries held"),
            || async { (self.held().await == n).then_some(()) },
        )
        .await;
    }

    /// Waits until every delivery is acked; then nothing is dead-lettered.
    pub async fn wait_acked(&self, limit: Duration) {
        eventually(limit, "every delivery acked", || async {
            (self.held().await == 0).then_some(())
        })
        .await;
        assert!(
            self.client
                .drain(&self.settings.dead_letter_queue)
                .await
                .is_empty(),
            "nothing in the dead-letter queue"
        );
    }

    pub async fn stop(mut self) {
        self.dedupq.kill();
        self.client.cleanup(&self.settings).await;
    }
}

/// A run on either transport, for the tests that hold on both.
pub enum Run {
    Kafka(Box<KafkaRun>),
    Amqp(Box<AmqpRun>),
}

#[derive(Clone, Copy, Debug)]
pub enum Transport {
    Kafka,
    Amqp,
}

impl Run {
    /// A run of `base` (Kafka: on a topic of two partitions named after
    /// `name`).
    pub async fn start(transport: Transport, name: &str, base: &toml::Table) -> Self {
        match transport {
            Transport::Kafka => Run::Kafka(Box::new(KafkaRun::start(name, 2, base).await)),
            Transport::Amqp => Run::Amqp(Box::new(AmqpRun::start(base).await)),
        }
    }

    pub fn dedupq(&self) -> &Dedupq {
        match self {
            Run::Kafka(run) => &run.dedupq,
            Run::Amqp(run) => &run.dedupq,
        }
    }

    /// Sends payment `pay-{n}` (Kafka: to partition n % 2).
    pub async fn pay(&self, n: usize) {
        let key = format!("pay-{n}");
        match self {
            Run::Kafka(run) => run.pay((n % 2) as i32, TENANT, &key, n).await,
            Run::Amqp(run) => run.pay(TENANT, &key, n).await,
        }
    }

    /// Once a provider that paused intake answers again: every message
    /// committed or acked, payments `pay-0` … `pay-{n-1}` stored `done`
    /// with one charge each, nothing dead-lettered or stored failed,
    /// intake resumed and the process ready.
    pub async fn charged_once_after_the_pause(
        &mut self,
        store: &Store,
        provider: &Provider,
        n: usize,
    ) {
        match self {
            Run::Kafka(run) => run.wait_committed_to_end(Duration::from_secs(60)).await,
            Run::Amqp(run) => run.wait_acked(Duration::from_secs(60)).await,
        }
        let dedupq = self.dedupq();
        for k in 0..n {
            let key = format!("pay-{k}");
            assert_eq!(status(store, &key).await.as_deref(), Some("done"), "{key}");
            assert_eq!(
                provider.charges_for(&format!("{TENANT}:{key}")).await.len(),
                1,
                "{key}: charged once"
            );
        }
        for series in [
            "dedupq_dead_letters_total",
            r#"dedupq_messages_total{outcome="failed"}"#,
            "dedupq_handler_paused",
        ] {
            assert_eq!(dedupq.metric(series).await, 0.0, "{series}");
        }
        eventually(Duration::from_secs(20), "ready again", || async {
            dedupq.readyz().await.0.then_some(())
        })
        .await;
    }

    pub async fn stop(self) {
        match self {
            Run::Kafka(mut run) => run.dedupq.kill(),
            Run::Amqp(run) => run.stop().await,
        }
    }
}
