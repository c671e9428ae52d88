//! The head of a report: what was run, where, and with which settings.

use super::args::BenchArgs;
use super::kafka::COMMIT_INTERVAL;
use super::runner::Env;
use dedupq::config::Settings;

/// What was run, where, and with which settings.
pub(super) async fn header(args: &BenchArgs, env: &Env, s: &Settings) -> String {
    let (e, k, a) = (&s.engine, &s.kafka, &s.amqp);
    let pg = pg_settings(&env.database_url).await;
    format!(
        "dedupq-lab bench{}{} — {} CPUs, {}\n\
         PostgreSQL: {pg}\n\
         dedupq settings: engine.max_batch={} engine.concurrency={} \
         engine.lease={:?} store.max_connections={} kafka.batch_size={} kafka.batch_linger={:?} \
         kafka.max_batches_in_flight={} kafka.max_buffered_bytes={} \
         kafka.commit_interval={COMMIT_INTERVAL:?} (bench; configured {:?}) amqp.prefetch={} \
         amqp.batch_linger={:?} amqp.max_batches_in_flight={} amqp.queue_type={}\n\
         handler: in-process, answers at once. Producer: acks=all, idempotent, linger.ms=0. \
         Every consumer commits every {COMMIT_INTERVAL:?} at the latest.\n\
         msg/s: pre-produced messages / (first message handled -> group committed to the end; RabbitMQ: last decision/ack).\n\
         latency (g rows): messages sent at a fixed rate, from the producer's send() to the reply \
         on the reply topic (dedupq: kafka.reply_topic, produced once the outcome is stored; raw \
         echo: the record produced back as it arrives). (d), (f): one batch's claim+finish. \
         k rows: the throughput run, then the same latency method at the row's rate.",
        if args.scale { " --scale" } else { "" },
        if args.quick { " --quick" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        env.database_url.split('@').next_back().unwrap_or_default(),
        e.max_batch,
        e.concurrency,
        e.lease,
        s.store.max_connections,
        k.batch_size,
        k.batch_linger,
        k.max_batches_in_flight,
        k.max_buffered_bytes,
        k.commit_interval,
        a.prefetch,
        a.batch_linger,
        a.max_batches_in_flight,
        a.queue_type.as_str(),
    )
}

async fn pg_settings(database_url: &str) -> String {
    let Ok(pool) = sqlx::PgPool::connect(database_url).await else {
        return "unreachable".into();
    };
    let mut out = Vec::new();
    for name in [
        "server_version",
        "synchronous_commit",
        "fsync",
        "shared_buffers",
        "max_wal_size",
        "checkpoint_timeout",
        "wal_compression",
    ] {
        let sql = format!("SHOW {name}");
        if let Ok(v) = sqlx::query_scalar::<_, String>(&sql).fetch_one(&pool).await {
            out.push(format!("{name}={v}"));
        }
    }
    pool.close().await;
    out.join(" ")
}
