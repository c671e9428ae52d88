//! Drives one scenario: services' endpoints in, a report out.

use super::dead_letters;
use super::faults::{set_knobs, Injector, Targets};
use super::fleet::{Binaries, Fleet};
use super::pg_faults::RunRole;
use super::profile::{Fault, Profile};
use super::publish::{AmqpPublisher, Coordinates, KafkaPublisher};
use super::report::Report;
use super::verify;
use super::workload::{Kind, Planned, Route, Workload};
use anyhow::Context;
use dedupq::config::{SecretUrl, StoreSettings};
use dedupq::store::Store;
use rand::Rng;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Where the services are, and where to keep logs.
#[derive(Debug, Clone)]
pub struct Options {
    pub database_url: String,
    pub brokers: String,
    pub amqp_url: String,
    /// `scripts/services`, used to restart PostgreSQL and Kafka.
    pub services: PathBuf,
    pub workdir: PathBuf,
    pub progress: bool,
    /// The binaries the fleet runs.
    pub binaries: Binaries,
}

pub struct Names {
    pub run_id: String,
    pub schema: String,
    pub provider_schema: String,
    pub topic: String,
    pub group: String,
    pub queue: String,
    pub dlx: String,
    pub dlq: String,
}

impl Names {
    fn new(run_id: &str) -> Self {
        Self {
            run_id: run_id.to_string(),
            schema: format!("scn_{run_id}"),
            provider_schema: format!("scn_{run_id}_provider"),
            topic: format!("scn.{run_id}.payments"),
            group: format!("scn-{run_id}"),
            queue: format!("scn.{run_id}.payments"),
            dlx: format!("scn.{run_id}.dlx"),
            dlq: format!("scn.{run_id}.dlq"),
        }
    }
}

/// The fleet's `engine.lease`.
const LEASE: Duration = Duration::from_secs(5);

/// The fleet's configuration. `store_url`: the administrator's, or the
/// run's own role's.
fn dedupq_config(
    names: &Names,
    opts: &Options,
    store_url: &str,
    provider: &str,
    profile: &Profile,
) -> anyhow::Result<toml::Table> {
    let text = format!(
        r#"
[store]
url = "{db}"
schema = "{schema}"
max_connections = 8

[engine]
lease = "{lease}"
renew_every = "1s"
max_attempts = 30
retry_backoff_min = "100ms"
retry_backoff_max = "2s"

[handler]
kind = "payment"
url = "{provider}/charges"
timeout = "2s"

[identity]
max_body_bytes = {max_body_bytes}

[kafka]
topics = ["{topic}"]
brokers = "{brokers}"
group_id = "{group}"
create_topics = true
stall_after = "20s"

[amqp]
queues = ["{queue}"]
url = "{amqp}"
dead_letter_exchange = "{dlx}"
dead_letter_queue = "{dlq}"
stall_after = "20s"

[log]
filter = "info"
"#,
        db = store_url,
        lease = humantime::format_duration(LEASE),
        schema = names.schema,
        topic = names.topic,
        brokers = opts.brokers,
        group = names.group,
        queue = names.queue,
        amqp = opts.amqp_url,
        dlx = names.dlx,
        dlq = names.dlq,
        max_body_bytes = profile.workload.max_body_bytes,
    );
    let mut config: toml::Table = text.parse()?;
    let mut set = |section: &str, name: &str, value: toml::Value| {
        if let Some(toml::Value::Table(t)) = config.get_mut(section) {
            t.insert(name.into(), value);
        }
    };
    if profile.lookup {
        let url = format!("{provider}/charges/lookup?key={{derived_key}}");
        set("handler", "lookup_url", url.into());
    }
    if let Some(n) = profile.concurrency {
        set("engine", "concurrency", toml::Value::Integer(n as i64));
    }
    Ok(config)
}

async fn create_topic(brokers: &str, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> =
        dedupq::broker::kafka::admin(&dedupq::config::KafkaSettings::at(brokers)).create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for result in admin.create_topics(&[new], &AdminOptions::new()).await? {
        result.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
    }
    Ok(())
}

#[derive(Default)]
struct Published {
    kafka: AtomicUsize,
    amqp: AtomicUsize,
    amqp_republished: AtomicUsize,
    coordinates: Mutex<BTreeMap<Coordinates, Option<String>>>,
}

async fn publish_all(
    messages: Vec<Planned>,
    kafka: KafkaPublisher,
    mut amqp: AmqpPublisher,
    out: Arc<Published>,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let kafka = Arc::new(kafka);
    let mut inflight = tokio::task::JoinSet::new();
    for msg in messages {
        tokio::time::sleep_until(start + msg.at).await;
        match msg.route {
            Route::Amqp => {
                amqp.publish(&msg).await?;
                out.amqp.fetch_add(1, Ordering::Relaxed);
                out.amqp_republished
                    .store(amqp.republished, Ordering::Relaxed);
            }
            Route::Kafka | Route::KafkaUnkeyed => {
                let (kafka, out) = (kafka.clone(), out.clone());
                inflight.spawn(async move {
                    let at = kafka.publish(&msg).await?;
                    let derived = match (&msg.tenant, &msg.key, msg.kind) {
                        (Some(t), Some(k), kind)
                            if !matches!(kind, Kind::Invalid | Kind::Hostile) =>
                        {
                            Some(format!("{t}:{k}"))
                        }
                        _ => None,
                    };
                    out.coordinates
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(at, derived);
                    out.kafka.fetch_add(1, Ordering::Relaxed);
                    anyhow::Ok(())
                });
                while inflight.len() > 500 {
                    if let Some(r) = inflight.join_next().await {
                        r??;
                    }
                }
            }
        }
    }
    while let Some(r) = inflight.join_next().await {
        r??;
    }
    Ok(())
}

pub async fn run(profile: &Profile, opts: &Options) -> anyhow::Result<Report> {
    let run_id = format!("{:08x}", rand::rng().random::<u32>());
    let role = match profile.needs_own_role() {
        true => Some(RunRole::create(&opts.database_url, &run_id).await?),
        false => None,
    };
    let report = run_as(profile, opts, &run_id, role.as_ref()).await;
    if let Some(role) = role {
        role.drop().await;
    }
    report
}

/// The run, its fleet logged in as `role` when there is one.
async fn run_as(
    profile: &Profile,
    opts: &Options,
    run_id: &str,
    role: Option<&RunRole>,
) -> anyhow::Result<Report> {
    let run_id = run_id.to_string();
    let names = Names::new(&run_id);
    let mut spec = profile.workload.clone();
    spec.run_id = run_id.clone();
    let workload = Workload::generate(&spec);
    let expected: Vec<String> = workload
        .messages
        .iter()
        .filter(|m| m.kind == Kind::First)
        .filter_map(|m| Some(format!("{}:{}", m.tenant.as_ref()?, m.key.as_ref()?)))
        .collect();

    create_topic(&opts.brokers, &names.topic, profile.partitions).await?;
    let store_settings = StoreSettings {
        url: SecretUrl::new(opts.database_url.clone()),
        schema: Some(names.schema.clone()),
        ..StoreSettings::default()
    };
    let store = Store::connect_lazy(&store_settings)?;
    store.migrate(Some(&names.schema)).await?;
    let mut fleet = Fleet::new(&opts.workdir.join(&run_id), &opts.binaries)?;
    let provider = fleet
        .start_provider(
            &opts.database_url,
            &names.provider_schema,
            profile.provider_ignores_keys,
        )
        .await?;
    let base_knobs = profile.base_knobs.clone();
    set_knobs(&provider, &base_knobs).await;
    let store_url = role.map_or(opts.database_url.as_str(), RunRole::url);
    let config = dedupq_config(&names, opts, store_url, &provider, profile)?;
    for _ in 0..profile.processes {
        fleet.start_dedupq(config.clone()).await?;
    }
    if opts.progress {
        println!(
            "run {run_id}: {} messages ({} unique payments) over {:?} into Kafka topic {} and RabbitMQ queue {}; logs in {}",
            workload.messages.len(),
            expected.len(),
            spec.publish_for,
            names.topic,
            names.queue,
            opts.workdir.join(&run_id).display()
        );
    }

    let published = Arc::new(Published::default());
    let kafka = KafkaPublisher::new(&opts.brokers, &names.topic)?;
    let mut amqp = AmqpPublisher::new(&opts.amqp_url, &names.queue);
    amqp.declare_full_replies().await?;
    let started = Instant::now();
    let mut publisher = tokio::spawn(publish_all(
        workload.messages.clone(),
        kafka,
        amqp,
        published.clone(),
    ));
    let mut report = Report::new(profile, &names, &workload, expected.len());
    if let Some(role) = role {
        report.note(
            Duration::ZERO,
            &format!("the fleet logs in as PostgreSQL role {}", role.name()),
        );
    }

    let mut faults: Vec<(Duration, Fault)> = profile.faults.clone();
    faults.sort_by_key(|(t, _)| *t);
    let mut faults = faults.into_iter().peekable();
    let mut injector = Injector::new(
        Targets {
            provider: provider.clone(),
            base_knobs: base_knobs.clone(),
            services: opts.services.clone(),
            role,
            admin: store.pool().clone(),
            schema: names.schema.clone(),
            lease: LEASE,
        },
        started,
    );
    let next_kill = |from: Instant| {
        profile
            .kill_every
            .map(|(lo, hi)| from + rand::rng().random_range(lo..=hi))
    };
    let mut kill_at = next_kill(started);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut publishing = true;
    let mut quiet_since: Option<Instant> = None;
    loop {
        tokio::select! {
            done = &mut publisher, if publishing => {
                done.context("publisher task")??;
                publishing = false;
                report.publish_seconds = started.elapsed().as_secs_f64();
            }
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        while faults.peek().is_some_and(|(t, _)| started + *t <= now) {
            let Some((_, fault)) = faults.next() else {
                break;
            };
            injector.inject(fault, &mut fleet, &mut report).await?;
        }
        injector.end_due(&mut fleet, &mut report, false).await?;
        if kill_at.is_some_and(|k| k <= now) && publishing {
            let victim = rand::rng().random_range(0..fleet.instances.len());
            fleet.kill(victim);
            let pid = fleet.kills.last().map(|k| k.pid).unwrap_or_default();
            report.note(
                started.elapsed(),
                &format!("SIGKILL instance {victim} (pid {pid})"),
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
            fleet.restart(victim).await?;
            kill_at = next_kill(Instant::now());
        }
        let offsets = {
            let (b, t, g, p) = (
                opts.brokers.clone(),
                names.topic.clone(),
                names.group.clone(),
                profile.partitions,
            );
            tokio::task::spawn_blocking(move || verify::committed_and_end(&b, &t, &g, p))
                .await?
                .ok()
        };
        // Keys are read after the offsets: a key still open now was open
        // when its offset was committed, so a hit is a real commit ahead.
        let keys = verify::key_states(store.pool()).await.ok();
        if let (Some(keys), Some(offsets)) = (&keys, &offsets) {
            let coordinates = published
                .coordinates
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            // Sampled every second: each commit ahead counted once.
            for c in verify::commits_ahead(offsets, &coordinates, keys) {
                if !report.commits_ahead.contains(&c) {
                    report.commits_ahead.push(c);
                }
            }
        }
        let finished = keys.as_ref().map(|k| {
            expected
                .iter()
                .filter(|e| {
                    k.get(*e).is_some_and(|s| {
                        s.status == "done"
                            || s.status == "failed"
                            || (s.status == "unknown" && s.held)
                    })
                })
                .count()
        });
        if opts.progress {
            println!(
                "{:>5.0}s  published kafka {:>6} amqp {:>6}  payments finished {:>6}/{}  kills {}",
                started.elapsed().as_secs_f64(),
                published.kafka.load(Ordering::Relaxed),
                published.amqp.load(Ordering::Relaxed),
                finished
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "?".into()),
                expected.len(),
                fleet.kills.len(),
            );
        }
        if publishing {
            continue;
        }
        let all_committed = offsets
            .as_ref()
            .is_some_and(|o| o.iter().all(|(c, h)| c == h));
        let depths = verify::amqp_depths(
            &opts.amqp_url,
            &[names.queue.clone(), format!("{}.delay", names.queue)],
        )
        .await
        .ok();
        let drained = depths.as_ref().is_some_and(|d| d.iter().all(|n| *n == 0));
        let quiet = all_committed && drained && finished == Some(expected.len());
        quiet_since = if quiet {
            quiet_since.or(Some(now))
        } else {
            None
        };
        // Quiet for a few seconds: nothing unacked is waiting to come back.
        if quiet_since.is_some_and(|q| now - q >= Duration::from_secs(3)) {
            report.quiesced = true;
            break;
        }
        if started.elapsed() > spec.publish_for + profile.quiesce_limit {
            report.violations.push(format!(
                "not quiescent after {:?}: finished {finished:?}/{}, offsets {offsets:?}, queue depths {depths:?}",
                profile.quiesce_limit,
                expected.len()
            ));
            break;
        }
    }
    injector.end_due(&mut fleet, &mut report, true).await?;
    report.run_seconds = started.elapsed().as_secs_f64();
    for i in 0..fleet.instances.len() {
        let addr = fleet.instances[i].http;
        if let Ok(r) = reqwest::get(format!("http://{addr}/metrics")).await {
            report.add_metrics(&r.text().await.unwrap_or_default());
        }
        match reqwest::get(format!("http://{addr}/readyz")).await {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => report.not_ready.push(format!(
                "instance {i}: {}",
                r.text().await.unwrap_or_default().trim()
            )),
            Err(e) => report.not_ready.push(format!("instance {i}: {e}")),
        }
        report.metrics_urls.push(format!("http://{addr}/metrics"));
    }
    report.kills = fleet.kills.len();
    report.published_kafka = published.kafka.load(Ordering::Relaxed);
    report.published_amqp = published.amqp.load(Ordering::Relaxed);
    report.amqp_republished = published.amqp_republished.load(Ordering::Relaxed);
    fleet.stop_instances(Duration::from_secs(20)).await;

    let keys = verify::key_states(store.pool()).await?;
    let charges = verify::charges(&provider).await.unwrap_or_default();
    let ledger = verify::ledger(&provider).await?;
    report.charges = charges.iter().filter(|c| c.state != "declined").count();
    let killed: Vec<u32> = fleet.kills.iter().map(|k| k.pid).collect();
    report.check = verify::check_charges(&expected, &keys, &charges, &ledger, &killed);
    report.check.calls_after_freeze =
        verify::calls_after_freeze(injector.frozen_claims(), &charges, &keys);
    let offsets = verify::committed_and_end(
        &opts.brokers,
        &names.topic,
        &names.group,
        profile.partitions,
    )?;
    report.uncommitted = offsets.iter().map(|(c, h)| h - c).sum();
    let depths = verify::amqp_depths(
        &opts.amqp_url,
        &[names.queue.clone(), format!("{}.delay", names.queue)],
    )
    .await?;
    report.amqp_left = depths.iter().map(|d| *d as usize).sum();
    let kafka_letters = dead_letters::kafka(&opts.brokers, &format!("{}.dlq", names.topic))?;
    let amqp_letters = dead_letters::amqp(&opts.amqp_url, &names.dlq).await?;
    report.kafka_dead_letters = dead_letters::by_reason(&kafka_letters);
    report.amqp_dead_letters = dead_letters::by_reason(&amqp_letters);
    let charged = |key: &str| ledger.get(key).is_some_and(|l| l.charged > 0);
    report.charged_dead_letters = [kafka_letters, amqp_letters]
        .iter()
        .flat_map(|letters| dead_letters::of_charged(letters, charged))
        .collect();
    report.judge();
    if report.violations.is_empty() {
        // Nothing to look into: the run's quorum queues and topics go, so
        // that runs after it do not share the broker with every run before
        // (hundreds of idle quorum queues slow RabbitMQ's handshakes on a
        // busy host). The logs stay; a run that found a violation keeps
        // everything.
        remove_broker_objects(opts, &names).await;
    }
    Ok(report)
}

/// Deletes the run's RabbitMQ queues and exchange and its Kafka topics,
/// warning about what could not be deleted.
async fn remove_broker_objects(opts: &Options, names: &Names) {
    let queues = [
        names.queue.clone(),
        format!("{}.delay", names.queue),
        format!("{}.full-replies", names.queue),
        names.dlq.clone(),
    ];
    let amqp = async {
        let settings = dedupq::config::AmqpSettings::at(&opts.amqp_url);
        let conn = dedupq::broker::amqp::connect(&settings, "dedupq-scenario-cleanup").await?;
        let channel = conn.create_channel().await?;
        for q in &queues {
            channel
                .queue_delete(q.as_str().into(), Default::default())
                .await?;
        }
        channel
            .exchange_delete(names.dlx.as_str().into(), Default::default())
            .await?;
        let _ = conn.close(200, "cleaned up".into()).await;
        anyhow::Ok(())
    };
    if let Err(e) = amqp.await {
        eprintln!("warning: the run's RabbitMQ queues were not all deleted: {e:#}");
    }
    let topics = [names.topic.clone(), format!("{}.dlq", names.topic)];
    let kafka = async {
        let admin: AdminClient<DefaultClientContext> =
            dedupq::broker::kafka::admin(&dedupq::config::KafkaSettings::at(&opts.brokers))
                .create()?;
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        for result in admin.delete_topics(&topics, &AdminOptions::new()).await? {
            if let Err((topic, e)) = result {
                // A topic that never got a message (no dead letters) was
                // never created.
                if e != rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition {
                    anyhow::bail!("deleting topic {topic}: {e}");
                }
            }
        }
        anyhow::Ok(())
    };
    if let Err(e) = kafka.await {
        eprintln!("warning: the run's Kafka topics were not all deleted: {e:#}");
    }
}
