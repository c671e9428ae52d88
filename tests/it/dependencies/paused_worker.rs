//! A worker paused (SIGSTOP, as a GC pause or a frozen VM would) while it
//! holds claimed, queued work, for longer than its lease, on Kafka and on
//! RabbitMQ. Another instance
//! takes the keys over and settles them. When the paused worker resumes it
//! starts no provider call on its stale claims, and its late writes are
//! fenced and counted.

use super::common::{body, set, status, with_amqp, TENANT};
use crate::support::kafka::{self, headers, produce};
use crate::support::process::{base_config, free_port, Dedupq, Provider};
use crate::support::{amqp, eventually, isolated_store, rabbit_management, unique};
use dedupq_provider::Knobs;
use std::time::Duration;

/// A provider that takes 0.8 s per call and ignores idempotency keys, so
/// that every call it gets is a charge.
async fn slow_provider_without_idempotency() -> Provider {
    Provider::start(Knobs {
        latency: Duration::from_millis(800),
        honour_keys: false,
        ..Knobs::default()
    })
    .await
}

fn worker(base: &toml::Table, topic: &str, group: &str, owner: &str) -> toml::Table {
    let mut config = kafka::with_kafka(base, topic, group, "");
    set(&mut config, "engine", "owner", owner);
    // One call at a time: the rest of the batch waits, claimed, in line.
    set(&mut config, "engine", "concurrency", 1_i64);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_resumed_after_a_pause_longer_than_its_lease_calls_the_provider_for_none_of_its_stale_claims(
) {
    let (_, store_settings) = isolated_store().await;
    let provider = slow_provider_without_idempotency().await;
    let (topic, _) = kafka::topics("paused", 1).await;
    let group = unique("g");
    let base = base_config(&store_settings, &provider);
    let mut a = Dedupq::start(&worker(&base, &topic, &group, "worker-a")).await;
    a.wait_ready(Duration::from_secs(30))
        .await
        .expect("a ready");

    const N: usize = 6;
    let producer = kafka::producer();
    for k in 0..N {
        produce(
            &producer,
            &topic,
            0,
            &headers(TENANT, &format!("pay-{k}")),
            body(k).as_bytes(),
        )
        .await;
    }
    eventually(Duration::from_secs(20), "worker a's first call", || async {
        (provider.stats().await.charges >= 1).then_some(())
    })
    .await;
    a.signal("-STOP");
    let mut b = Dedupq::start(&worker(&base, &topic, &group, "worker-b")).await;
    // b gets the partition once a misses its session (6 s), past a's lease.
    kafka::wait_committed_to_end(&group, &topic, 1, Duration::from_secs(90)).await;
    resumed_with_its_late_writes_fenced(&a, &provider, N, Duration::from_secs(4)).await;
    a.kill();
    b.kill();
}

/// Resumes the paused worker `a`, waits until its late writes are fenced
/// and counted, and gives it `settle` (long enough for every call it would
/// start on its queue to reach the provider, each behind the previous
/// one's 0.8 s); then checks that it made none.
async fn resumed_with_its_late_writes_fenced(
    a: &Dedupq,
    provider: &Provider,
    n: usize,
    settle: Duration,
) {
    let resumed_at = chrono::Utc::now();
    a.signal("-CONT");
    eventually(
        Duration::from_secs(20),
        "the resumed worker's late writes fenced and counted",
        || async { (a.metric("dedupq_fenced_writes_total").await >= 1.0).then_some(()) },
    )
    .await;
    tokio::time::sleep(settle).await;
    no_calls_from_the_resumed_worker(provider, n, resumed_at).await;
}

/// Once worker a is resumed (at `resumed_at`) and has had time to start
/// whatever it had queued: none of the `n` keys got a call from it after
/// that, and every key a had only queued was charged once, by b.
async fn no_calls_from_the_resumed_worker(
    provider: &Provider,
    n: usize,
    resumed_at: chrono::DateTime<chrono::Utc>,
) {
    let mut late = Vec::new();
    for k in 0..n {
        let key = format!("pay-{k}");
        let charges = provider.charges_for(&format!("{TENANT}:{key}")).await;
        let by_a = |c: &&dedupq_provider::Charge| c.owner.as_deref() == Some("worker-a");
        late.extend(
            charges
                .iter()
                .filter(by_a)
                .filter(|c| c.created_at > resumed_at)
                .map(|c| format!("{key} at {}", c.created_at)),
        );
        // A call a had on its way when it stopped is retried by b: the one
        // double charge a provider without idempotency cannot avoid. Every
        // key a had only queued is charged once, by b.
        if !charges.iter().any(|c| by_a(&c)) {
            assert_eq!(charges.len(), 1, "{key}: {charges:?}");
        }
    }
    assert!(late.is_empty(), "calls from the resumed worker: {late:?}");
}

/// The same on RabbitMQ: a stopped worker's connection misses its
/// heartbeats, the broker closes it and hands its unacked deliveries to
/// the other worker, which takes the keys over once a's leases end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_a_worker_resumed_after_a_pause_longer_than_its_lease_calls_the_provider_for_none_of_its_stale_claims(
) {
    let (store, store_settings) = isolated_store().await;
    let provider = slow_provider_without_idempotency().await;
    let (amqp_base, settings) = with_amqp(&base_config(&store_settings, &provider));
    let queue = settings.queues[0].clone();
    let worker = |owner: &str| {
        let mut config = amqp_base.clone();
        set(&mut config, "engine", "owner", owner);
        set(&mut config, "engine", "concurrency", 1_i64);
        // The broker gives a silent connection up after about two beats.
        set(&mut config, "amqp", "heartbeat", "2s");
        config
    };
    let mut a = Dedupq::start(&worker("worker-a")).await;
    a.wait_ready(Duration::from_secs(30))
        .await
        .expect("a ready");

    const N: usize = 6;
    let client = amqp::Client::connect().await;
    for k in 0..N {
        client
            .publish(
                &queue,
                &amqp::Msg::new(TENANT, &format!("pay-{k}"), &body(k)),
            )
            .await;
    }
    eventually(Duration::from_secs(20), "worker a's first call", || async {
        (provider.stats().await.charges >= 1).then_some(())
    })
    .await;
    a.signal("-STOP");
    let mut b = Dedupq::start(&worker("worker-b")).await;
    for k in 0..N {
        let key = format!("pay-{k}");
        eventually(Duration::from_secs(90), "settled by b", || async {
            (status(&store, &key).await.as_deref() == Some("done")).then_some(())
        })
        .await;
    }
    eventually(Duration::from_secs(30), "every delivery acked", || async {
        (rabbit_management::queue_info(&queue).await["messages"] == 0).then_some(())
    })
    .await;
    let resumed_at = chrono::Utc::now();
    a.signal("-CONT");
    tokio::time::sleep(Duration::from_secs(4)).await;

    no_calls_from_the_resumed_worker(&provider, N, resumed_at).await;
    assert!(
        client.drain(&settings.dead_letter_queue).await.is_empty(),
        "nothing dead-lettered"
    );
    a.kill();
    b.kill();
    client.cleanup(&settings).await;
}

/// The same behind a load balancer: two API replicas share the store, and
/// a client whose requests to the paused replica time out sends them to
/// the other. Once the paused replica's leases end, the other takes the
/// keys over and answers; the resumed replica starts no call on its stale
/// claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_a_replica_resumed_after_a_pause_longer_than_its_lease_calls_the_provider_for_none_of_its_stale_claims(
) {
    const API_KEY: &str = "sk_test_t1_0123456789";
    let (store, store_settings) = isolated_store().await;
    let provider = slow_provider_without_idempotency().await;
    let keys = std::env::temp_dir().join(unique("dedupq-paused-keys"));
    std::fs::write(&keys, format!("\"{API_KEY}\" = \"{TENANT}\"\n")).expect("write keys file");
    let base = base_config(&store_settings, &provider);
    let replica = |owner: &str| {
        let api: std::net::SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let mut config = base.clone();
        set(&mut config, "engine", "owner", owner);
        // One call at a time: the other claimed requests wait in line.
        set(&mut config, "engine", "concurrency", 1_i64);
        set(&mut config, "api", "enabled", true);
        set(&mut config, "api", "listen", api.to_string());
        set(&mut config, "api", "keys_file", keys.display().to_string());
        let route: toml::Table = toml::from_str(r#"name = "payments""#).expect("route");
        set(
            &mut config,
            "api",
            "routes",
            vec![toml::Value::Table(route)],
        );
        (config, api)
    };
    let pay = |api: std::net::SocketAddr, k: usize| {
        reqwest::Client::new()
            .post(format!("http://{api}/v1/payments"))
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", format!("pay-{k}"))
            .body(body(k))
            .timeout(Duration::from_secs(2))
            .send()
    };

    let (config_a, api_a) = replica("worker-a");
    let mut a = Dedupq::start(&config_a).await;
    a.wait_ready(Duration::from_secs(30))
        .await
        .expect("a ready");
    const N: usize = 6;
    for k in 0..N {
        tokio::spawn(pay(api_a, k));
    }
    eventually(
        Duration::from_secs(20),
        "every request claimed by a and its first call made",
        || async {
            for k in 0..N {
                status(&store, &format!("pay-{k}")).await?;
            }
            (provider.stats().await.charges >= 1).then_some(())
        },
    )
    .await;
    a.signal("-STOP");

    let (config_b, api_b) = replica("worker-b");
    let mut b = Dedupq::start(&config_b).await;
    b.wait_ready(Duration::from_secs(30))
        .await
        .expect("b ready");
    for k in 0..N {
        // 409 while a's lease holds the key, then b's answer.
        let status = eventually(Duration::from_secs(60), "b answers", || async {
            let status = pay(api_b, k).await.ok()?.status().as_u16();
            (status != 409).then_some(status)
        })
        .await;
        assert_eq!(status, 201, "pay-{k}");
    }
    resumed_with_its_late_writes_fenced(&a, &provider, N, Duration::from_secs(6)).await;
    a.kill();
    b.kill();
}
