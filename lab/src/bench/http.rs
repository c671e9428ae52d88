//! (h) The HTTP API's sync route (claim, instant handler, store, answer)
//! under concurrent keep-alive clients, beside the same handler behind a
//! plain HTTP route without dedupq, and behind the seed's claim-first
//! recipe on a pool of connections. Load generator and server share this
//! process (and its CPUs), the same way in every row.

use super::case::{Job, Measured};
use super::naive::{CLAIM_SQL, COMPLETE_SQL, LEASE};
use super::service::{FastHandler, CASE_LIMIT};
use super::stats::{peak_rss_kb, percentiles, usage};
use anyhow::Context;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use dedupq::config::{RouteSettings, SecretUrl, Settings, StoreSettings};
use dedupq::fingerprint::FingerprintSpec;
use dedupq::handler::{Handler, HandlerCall, HandlerOutcome, Request};
use dedupq::identity::{Epoch, IdempotencyKey, Identity, Tenant};
use dedupq::message::Source;
use dedupq::startup::Application;
use dedupq::store::Store;
use sqlx::PgPool;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const API_KEY: &str = "sk_bench_0123456789abcdef";

/// The seed's pool: sqlx's default size, what a service written in an
/// afternoon runs with.
const SEED_POOL: u32 = 10;

/// What answers the row's requests.
#[derive(Debug, Clone, Copy)]
pub(super) enum Front {
    /// dedupq's API, built as `dedupq run` builds it.
    Dedupq,
    /// The handler alone behind a bare route.
    Plain,
    /// The seed's recipe: per request a claim statement, the handler and
    /// an outcome statement, each its own transaction on a pooled
    /// connection, on dedupq's key table.
    Seed,
}

pub(super) async fn run(job: &Job, base: &Settings, front: Front) -> anyhow::Result<Measured> {
    let clients = job.case.partitions.max(1) as usize;
    let handler = Arc::new(FastHandler::default());
    let stop = CancellationToken::new();
    let (addr, metrics) = match front {
        Front::Dedupq => {
            let (addr, metrics) = serve_dedupq(job, base, handler.clone(), stop.clone()).await?;
            (addr, Some(metrics))
        }
        Front::Plain => {
            let router = axum::Router::new()
                .route("/v1/bench", axum::routing::post(plain))
                .with_state(handler.clone());
            (serve(router, stop.clone()).await?, None)
        }
        Front::Seed => {
            let router = axum::Router::new()
                .route("/v1/bench", axum::routing::post(seed))
                .with_state(Arc::new(Seed::connect(job, handler.clone()).await?));
            (serve(router, stop.clone()).await?, None)
        }
    };
    let url = format!("http://{addr}/v1/bench");
    // One request per client first: connections open, pools warm.
    load(&url, clients, clients, "warm").await?;
    let (seconds, latencies) = load(&url, clients, job.expected, "run").await?;
    stop.cancel();
    let calls = handler.calls.load(Ordering::Relaxed);
    anyhow::ensure!(
        calls == job.expected + clients,
        "{calls} handler calls for {} requests",
        job.expected + clients
    );
    Ok(Measured {
        messages: job.expected,
        seconds,
        latency: percentiles(latencies),
        peak_rss_kb: peak_rss_kb(),
        notes: [
            Some(format!("{clients} concurrent clients; handler calls {calls}; latency = one request's round trip")),
            matches!(front, Front::Seed).then(|| format!("seed: a pool of {SEED_POOL} connections")),
            metrics.map(|m| super::service::breakdown(&m, calls)),
            Some(usage()),
        ]
        .into_iter()
        .flatten()
        .collect(),
    })
}

/// The whole service as `dedupq run` builds it, with `[api]` on.
async fn serve_dedupq(
    job: &Job,
    base: &Settings,
    handler: Arc<FastHandler>,
    stop: CancellationToken,
) -> anyhow::Result<(SocketAddr, dedupq::metrics::Metrics)> {
    let keys = job.log_path.with_extension("keys.toml");
    std::fs::write(&keys, format!("\"{API_KEY}\" = \"bench\"\n"))?;
    let mut s = base.clone();
    s.store.url = SecretUrl::new(job.database_url.clone());
    s.store.schema = Some(job.schema.clone());
    s.http.listen = ([127, 0, 0, 1], 0).into();
    s.api.enabled = true;
    s.api.listen = free_local_addr()?;
    s.api.keys_file = Some(keys);
    s.api.routes = vec![toml::from_str::<RouteSettings>("name = \"bench\"")?];
    s.validate()?;
    let addr = s.api.listen;
    let app = Application::build_with_handler(s, handler).await?;
    let token = app.shutdown_token();
    let metrics = app.metrics().clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        token.cancel();
    });
    tokio::spawn(app.run_until_stopped());
    wait_listening(addr).await?;
    Ok((addr, metrics))
}

/// A bare route on a local port until `stop`.
async fn serve(router: axum::Router, stop: CancellationToken) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
    });
    Ok(addr)
}

/// The request's key under the bench tenant, if its body is JSON and its
/// key valid.
fn identity(headers: &HeaderMap, body: &[u8]) -> Option<(Identity, dedupq::json::Json)> {
    let json = dedupq::json::parse(body).ok()?;
    let key = IdempotencyKey::parse(headers.get("idempotency-key")?.as_bytes()).ok()?;
    let tenant = Tenant::parse(b"bench").ok()?;
    Some((Identity { tenant, key }, json))
}

/// The handler's answer to this request: its status and body (502 and
/// nothing when it did not succeed).
async fn call(
    handler: &FastHandler,
    identity: &Identity,
    body: &[u8],
    epoch: i64,
) -> (StatusCode, Bytes) {
    let source = Source::Direct { id: 0 };
    let call = HandlerCall {
        identity,
        derived_key: &identity.derived_key(),
        request: Request {
            body,
            content_type: Some("application/json"),
        },
        headers: &[],
        attempt: 1,
        epoch: Epoch(epoch),
        owner: "bench",
        lease_deadline: chrono::Utc::now(),
        source: &source,
        uncertain: false,
    };
    match handler.handle(&call).await {
        HandlerOutcome::Success(r) => (
            StatusCode::from_u16(r.status as u16).unwrap_or(StatusCode::OK),
            Bytes::from(r.body),
        ),
        _ => (StatusCode::BAD_GATEWAY, Bytes::new()),
    }
}

/// The same handler behind a bare route: parse the JSON body, call it,
/// answer its result. No key table, no authentication.
async fn plain(
    State(handler): State<Arc<FastHandler>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match identity(&headers, &body) {
        Some((identity, _)) => call(&handler, &identity, &body, 1).await.into_response(),
        None => StatusCode::BAD_REQUEST.into_response(),
    }
}

/// The seed's service: its key table is dedupq's (same columns and
/// indexes), its statements the naive row's.
struct Seed {
    pool: PgPool,
    handler: Arc<FastHandler>,
    spec: FingerprintSpec,
}

impl Seed {
    async fn connect(job: &Job, handler: Arc<FastHandler>) -> anyhow::Result<Self> {
        let store = Store::connect_lazy(&StoreSettings {
            url: SecretUrl::new(job.database_url.clone()),
            schema: Some(job.schema.clone()),
            max_connections: SEED_POOL,
            ..StoreSettings::default()
        })?;
        store.migrate(Some(&job.schema)).await?;
        Ok(Self {
            pool: store.pool().clone(),
            handler,
            spec: FingerprintSpec::default(),
        })
    }

    /// Claim, call, store, answer; a key already claimed answers 409 (the
    /// bench sends each key once).
    async fn pay(
        &self,
        identity: &Identity,
        json: &dedupq::json::Json,
        body: &[u8],
    ) -> anyhow::Result<Response> {
        let fingerprint = self.spec.fingerprint(json, body);
        let epoch: Option<i64> = sqlx::query_scalar(CLAIM_SQL)
            .bind(identity.tenant.as_str())
            .bind(identity.key.as_str())
            .bind(&fingerprint.digest[..])
            .bind(fingerprint.version)
            .bind(LEASE.as_secs_f64())
            .bind("bench-seed")
            .fetch_optional(&self.pool)
            .await?;
        let Some(epoch) = epoch else {
            return Ok(StatusCode::CONFLICT.into_response());
        };
        let (status, answer) = call(&self.handler, identity, body, epoch).await;
        let stored = sqlx::query(COMPLETE_SQL)
            .bind(identity.tenant.as_str())
            .bind(identity.key.as_str())
            .bind(epoch)
            .bind(i32::from(status.as_u16()))
            .bind(String::from_utf8_lossy(&answer).as_ref())
            .execute(&self.pool)
            .await?;
        anyhow::ensure!(
            stored.rows_affected() == 1,
            "the outcome of {identity} was fenced"
        );
        Ok((status, answer).into_response())
    }
}

async fn seed(State(seed): State<Arc<Seed>>, headers: HeaderMap, body: Bytes) -> Response {
    let Some((identity, json)) = identity(&headers, &body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    seed.pay(&identity, &json, &body)
        .await
        .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")).into_response())
}

/// `total` POSTs with distinct keys over `clients` keep-alive connections;
/// returns the seconds they took and each one's latency (ms).
async fn load(
    url: &str,
    clients: usize,
    total: usize,
    tag: &str,
) -> anyhow::Result<(f64, Vec<f64>)> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .tcp_nodelay(true)
        .timeout(CASE_LIMIT)
        .build()?;
    let next = Arc::new(AtomicUsize::new(0));
    let nonce: u32 = rand::random();
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (client, next, url, tag) = (
                client.clone(),
                next.clone(),
                url.to_string(),
                tag.to_string(),
            );
            tokio::spawn(async move {
                let mut samples = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return Ok::<_, anyhow::Error>(samples);
                    }
                    let body = format!(
                        r#"{{"amount":{},"currency":"EUR","recipient":"acct-{i}"}}"#,
                        100 + i % 900
                    );
                    let t = Instant::now();
                    let r = client
                        .post(&url)
                        .bearer_auth(API_KEY)
                        .header("idempotency-key", format!("{tag}-{nonce:08x}-{i}"))
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await?;
                    let status = r.status();
                    r.bytes().await?;
                    anyhow::ensure!(status == StatusCode::OK, "request {i} answered {status}");
                    samples.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(total);
    for w in workers {
        latencies.extend(w.await.context("load client")??);
    }
    Ok((started.elapsed().as_secs_f64(), latencies))
}

fn free_local_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

async fn wait_listening(addr: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the API did not listen on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
