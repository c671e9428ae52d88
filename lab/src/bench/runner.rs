//! The parent: prepares each case (topic or queue, schema, messages),
//! runs its measurements in child processes, cleans up, prints the report.

use super::amqp;
use super::args::BenchArgs;
use super::case::{Case, Job, Measured, Phase};
use super::child::run_job;
use super::header;
use super::kafka;
use super::plan::{Plan, PREFILLED};
use super::prefill;
use super::produce::{AmqpPublisher, KafkaProducer, Stream};
use super::replies;
use super::report::{self, Row};
use super::service::{self, CASE_LIMIT};
use super::stats::percentiles;
use anyhow::Context;
use dedupq::config::Settings;
use rand::Rng;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Where the services are and where case logs go.
#[derive(Debug, Clone)]
pub struct Env {
    pub database_url: String,
    pub brokers: String,
    pub amqp_url: String,
    pub workdir: PathBuf,
    /// The binary whose `bench --case` runs each case in a process of its
    /// own: dedupq-lab (the dedupq library is linked in, so a case measures
    /// the same code as `dedupq run`).
    pub exe: PathBuf,
    /// The configuration the cases run with (queue arguments included).
    pub settings: Settings,
}

impl Env {
    pub fn new(args: &BenchArgs, settings: &Settings) -> anyhow::Result<Self> {
        Ok(Self {
            database_url: settings.store.url.expose().to_string(),
            brokers: args.brokers.brokers.clone(),
            amqp_url: args.brokers.amqp_url.clone(),
            workdir: args.workdir.clone(),
            exe: std::env::current_exe().context("locating the dedupq-lab binary")?,
            settings: settings.clone(),
        })
    }
}

/// `dedupq-lab bench`: the whole run, or (`--case`) one measurement.
pub async fn run(args: BenchArgs, settings: &Settings) -> anyhow::Result<()> {
    if let Some(json) = &args.case {
        let job: Job = serde_json::from_str(json).context("parsing --case")?;
        let measured = run_job(&job, settings).await?;
        println!("RESULT {}", serde_json::to_string(&measured)?);
        return Ok(());
    }
    let env = Env::new(&args, settings)?;
    std::fs::create_dir_all(&env.workdir)?;
    let plan = if args.scale {
        Plan::scale(args.quick)
    } else {
        Plan::new(args.quick)
    };
    let mut plan = plan.only(args.only.as_deref());
    println!("{}", header::header(&args, &env, settings).await);
    for (_, keys, schema) in PREFILLED {
        if !plan
            .cases
            .iter()
            .any(|c| c.schema.as_deref() == Some(schema))
        {
            continue;
        }
        if args.quick && !prefilled(&env, schema).await {
            println!("stored-keys cases skipped: run the full bench once to fill {schema}");
            plan.cases.retain(|c| c.schema.as_deref() != Some(schema));
        } else {
            println!(
                "{}",
                prefill::ensure(
                    &env.database_url,
                    schema,
                    keys,
                    env.settings.store.partitions
                )
                .await?
            );
        }
    }
    let mut rows = Vec::new();
    for case in &plan.cases {
        eprintln!("bench: {} …", case.label);
        let row = run_case(case, &env).await;
        eprint!(
            "{}",
            report::table(std::slice::from_ref(&row))
                .lines()
                .nth(1)
                .unwrap_or_default()
        );
        eprintln!(
            "{}",
            row.error
                .as_deref()
                .map(|e| format!("  FAILED: {e}"))
                .unwrap_or_default()
        );
        rows.push(row);
    }
    println!("\n{}", report::table(&rows));
    println!("{}", report::ratios(&rows));
    println!("{}", report::notes(&rows));
    anyhow::ensure!(rows.iter().all(|r| r.error.is_none()), "some cases failed");
    Ok(())
}

/// The throughput run, or for a latency row the paced run at its rate. A
/// failed run is tried once more (other test suites restart the services
/// at times).
pub async fn run_case(case: &Case, env: &Env) -> Row {
    let mut row = Row {
        case: case.clone(),
        throughput: None,
        latency: None,
        error: None,
    };
    // A row with a rate and messages (the scale grid) has both runs: the
    // throughput run, then the paced one (the empty table: a fresh schema
    // again; a prefilled one: the same table).
    if case.rate.is_none() || case.messages > 0 {
        match twice(|| measure(case, Phase::Throughput, 0.0, env)).await {
            Ok(m) => row.throughput = Some(m),
            Err(e) => {
                row.error = Some(format!("{e:#}"));
                return row;
            }
        }
    }
    if let Some(rate) = case.rate {
        match twice(|| measure(case, Phase::Latency, rate, env)).await {
            Ok(m) => row.latency = Some(m),
            Err(e) => row.error = Some(format!("{e:#}")),
        }
    }
    row
}

async fn twice<F, Fut>(mut run: F) -> anyhow::Result<Measured>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Measured>>,
{
    match run().await {
        Ok(m) => Ok(m),
        Err(e) => {
            eprintln!("bench: {e:#}; trying once more");
            run().await
        }
    }
}

/// One measurement: prepare, run the child, clean up.
async fn measure(case: &Case, phase: Phase, rate: f64, env: &Env) -> anyhow::Result<Measured> {
    let nonce: u32 = rand::rng().random();
    let slug: String = case
        .label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let source = format!("bench-{slug}-{nonce:08x}");
    let schema = case.schema.clone().unwrap_or(format!("bench_{nonce:08x}"));
    let job = |expected, warmup| Job {
        case: case.clone(),
        phase,
        source: source.clone(),
        expected,
        warmup,
        schema: schema.clone(),
        database_url: env.database_url.clone(),
        brokers: env.brokers.clone(),
        amqp_url: env.amqp_url.clone(),
        reply_topic: (phase == Phase::Latency).then(|| format!("{source}.replies")),
        log_path: env.workdir.join(format!("{source}-{phase:?}.log")),
    };
    let result = if case.kind.brokerless() {
        spawn(&job(case.messages, 0), env, None)
            .await
            .map(|(m, _)| m)
    } else {
        let (stream, warmup) = workload(case, phase, rate);
        let job = job(stream.len(), warmup);
        let result = prepare_and_spawn(&job, env, stream, rate).await;
        if case.kind.uses_amqp() && result.is_ok() {
            let left = amqp::ready(&env.amqp_url, &source)
                .await
                .unwrap_or(u32::MAX);
            anyhow::ensure!(left == 0, "{left} messages left in {source} after the run");
        }
        result
    };
    if case.kind.uses_kafka() {
        kafka::delete_topic(&env.brokers, &source).await;
        kafka::delete_topic(&env.brokers, &format!("{source}.replies")).await;
        kafka::delete_topic(&env.brokers, &format!("{source}.dlq")).await;
    }
    if case.kind.uses_amqp() {
        amqp::delete(&env.amqp_url, &source).await;
    }
    if case.schema.is_none() {
        drop_schema(&env.database_url, &schema).await;
    }
    result
}

/// The messages of a run: everything up front for throughput; for
/// latency one warm-up message per partition, then `latency_secs` worth.
fn workload(case: &Case, phase: Phase, rate: f64) -> (Stream, usize) {
    match phase {
        Phase::Throughput => (
            Stream::new(case.messages, case.duplicates, case.partitions),
            0,
        ),
        Phase::Latency => {
            let warmup = case.partitions.max(1) as usize;
            let paced = ((rate * case.latency_secs) as usize).max(100);
            (
                Stream::new(warmup + paced, case.duplicates, case.partitions),
                warmup,
            )
        }
    }
}

/// The producer of a run, kept from the up-front messages to the paced ones.
enum Producer {
    Kafka(KafkaProducer),
    Amqp(Box<AmqpPublisher>),
}

async fn prepare_and_spawn(
    job: &Job,
    env: &Env,
    mut stream: Stream,
    rate: f64,
) -> anyhow::Result<Measured> {
    let upfront = match job.phase {
        Phase::Throughput => stream.len(),
        Phase::Latency => job.warmup,
    };
    let mut listener = None;
    let producer = if job.case.kind.uses_kafka() {
        kafka::create_topic(&env.brokers, &job.source, job.case.partitions).await?;
        if let Some(reply) = &job.reply_topic {
            kafka::create_topic(&env.brokers, reply, 1).await?;
            listener = Some(replies::listen(&env.brokers, reply, 1)?);
        }
        let producer = KafkaProducer::new(&env.brokers, &job.source)?;
        let (producer, s) = tokio::task::spawn_blocking(move || {
            producer
                .send(&mut stream, 0..upfront, None)
                .map(|()| (producer, stream))
        })
        .await??;
        stream = s;
        Producer::Kafka(producer)
    } else {
        amqp::declare(&service::settings(job, true, &env.settings).amqp).await?;
        let publisher = AmqpPublisher::new(&env.amqp_url, &job.source).await?;
        publisher.send(&mut stream, 0..upfront, None).await?;
        Producer::Amqp(Box::new(publisher))
    };
    let paced = (job.phase == Phase::Latency).then_some((producer, stream, rate));
    if job.case.checkpoint_first {
        checkpoint(&env.database_url).await?;
    }
    let (mut measured, stream) = spawn(job, env, paced).await?;
    if let (Some(listener), Some(stream)) = (listener, stream) {
        let sent = stream.stamped();
        let latencies = listener.latencies(&sent).await?;
        measured.notes.push(format!(
            "{} messages at {rate} msg/s; {}",
            sent.len(),
            tail(latencies.clone())
        ));
        measured.latency = percentiles(latencies);
    }
    Ok(measured)
}

/// A `CHECKPOINT`: from now on, the first change to each page writes it
/// whole to the WAL.
async fn checkpoint(database_url: &str) -> anyhow::Result<()> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(database_url).await?;
    sqlx::query("CHECKPOINT")
        .execute(&mut conn)
        .await
        .context("CHECKPOINT before the run (needs a superuser or pg_checkpoint)")?;
    conn.close().await?;
    Ok(())
}

/// Runs the child; on READY starts the paced producer (if any), whose
/// stream comes back with its send stamps.
async fn spawn(
    job: &Job,
    env: &Env,
    mut paced: Option<(Producer, Stream, f64)>,
) -> anyhow::Result<(Measured, Option<Stream>)> {
    let log = std::fs::File::create(&job.log_path)?;
    let mut child = tokio::process::Command::new(&env.exe)
        .args(["bench", "--case", &serde_json::to_string(job)?])
        .env("DEDUPQ_LOG", "warn")
        .env("DEDUPQ__LOG__FORMAT", "json")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting the case process")?;
    let mut lines = BufReader::new(child.stdout.take().context("child stdout")?).lines();
    let mut producing = None;
    let mut result = None;
    let deadline = tokio::time::Instant::now() + CASE_LIMIT * 2;
    while let Some(line) = tokio::time::timeout_at(deadline, lines.next_line())
        .await
        .context("case process timed out")??
    {
        if line == "READY" {
            if let Some((producer, stream, rate)) = paced.take() {
                producing = Some(pace(job.warmup, producer, stream, rate));
            }
        } else if let Some(json) = line.strip_prefix("RESULT ") {
            result = Some(serde_json::from_str::<Measured>(json)?);
        }
    }
    let status = child.wait().await?;
    let stream = match producing {
        Some(p) => Some(p.await.context("paced producer")??),
        None => None,
    };
    match result {
        Some(m) if status.success() => Ok((m, stream)),
        _ => anyhow::bail!(
            "case process failed ({status}); {}:\n{}",
            job.log_path.display(),
            log_tail(&job.log_path)
        ),
    }
}

fn pace(
    warmup: usize,
    producer: Producer,
    mut stream: Stream,
    rate: f64,
) -> tokio::task::JoinHandle<anyhow::Result<Stream>> {
    let range = warmup..stream.len();
    match producer {
        Producer::Kafka(p) => tokio::task::spawn_blocking(move || {
            p.send(&mut stream, range, Some(rate)).map(|()| stream)
        }),
        Producer::Amqp(p) => tokio::spawn(async move {
            let sent = p.send(&mut stream, range, Some(rate)).await;
            p.close().await;
            sent.map(|()| stream)
        }),
    }
}

/// The slow end of a latency distribution, in ms.
fn tail(mut samples: Vec<f64>) -> String {
    if samples.is_empty() {
        return String::new();
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    format!(
        "p90 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms",
        at(0.90),
        at(0.999),
        at(1.0)
    )
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

async fn drop_schema(database_url: &str, schema: &str) {
    if let Ok(pool) = sqlx::PgPool::connect(database_url).await {
        // Simple protocol: both statements in one go, without the notice
        // about the dropped objects.
        let sql = format!(
            "SET client_min_messages = warning; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
        );
        let _ = sqlx::Executor::execute(&pool, sql.as_str()).await;
        pool.close().await;
    }
}

async fn prefilled(env: &Env, schema: &str) -> bool {
    let Ok(pool) = sqlx::PgPool::connect(&env.database_url).await else {
        return false;
    };
    let sql =
        format!("SELECT count(*) > 0 FROM (SELECT 1 FROM \"{schema}\".dedupq_keys LIMIT 1) t");
    let filled = sqlx::query_scalar::<_, bool>(&sql)
        .fetch_one(&pool)
        .await
        .unwrap_or(false);
    pool.close().await;
    filled
}
