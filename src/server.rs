//! The operator endpoints: /metrics, /healthz, /readyz.

use crate::health::{Component, Health};
use crate::listener::{self, Limits};
use crate::metrics::Metrics;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: Health,
    liveness_timeout: Duration,
}

/// The operator endpoints: `/metrics` (Prometheus text), `/healthz` (200
/// while every long-running loop beats, else 503 naming those silent for
/// `liveness_timeout`) and `/readyz` (200 when [`Health::ready`], else 503;
/// the body lists each component's state, reason and stalled lanes).
pub(crate) fn router(metrics: Metrics, health: Health, liveness_timeout: Duration) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            metrics,
            health,
            liveness_timeout,
        })
}

/// Bounds of the operator listener: a few scrapers and probes use it, so
/// a client that opens connections and sends nothing (or stays idle after
/// its answer) is closed after [`Limits::header_timeout`], and at most
/// [`Limits::max_connections`] are open at once; more wait in the listen
/// backlog. Without them, silent connections would hold the process's file
/// descriptors, which its PostgreSQL and broker connections need.
pub(crate) const LIMITS: Limits = Limits {
    max_connections: 128,
    max_header_bytes: 16 * 1024,
    max_headers: 64,
    header_timeout: Duration::from_secs(10),
    shutdown_timeout: Duration::from_secs(5),
};

/// Serves [`router`] on `listener` within [`LIMITS`] until `shutdown` is
/// cancelled, then lets open requests finish.
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    health: Health,
    liveness_timeout: Duration,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let router = router(metrics, health, liveness_timeout);
    listener::serve(listener, router, LIMITS, TaskTracker::new(), shutdown).await;
    Ok(())
}

async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

/// Not ready is not dead: /healthz fails only for a loop that is stuck,
/// never for an unreachable dependency, so a restart can only help.
async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    let stuck = state.health.liveness().stuck(state.liveness_timeout);
    if stuck.is_empty() {
        return (StatusCode::OK, "ok\n".to_string());
    }
    let body: String = stuck.iter().map(|s| format!("stuck: {s}\n")).collect();
    (StatusCode::SERVICE_UNAVAILABLE, body)
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let mut body = String::new();
    for c in Component::ALL {
        let status = match state.health.get(c) {
            None => "off",
            Some(true) => "up",
            Some(false) => "down",
        };
        match state.health.reason(c) {
            Some(reason) => body.push_str(&format!("{} {status}: {reason}\n", c.name())),
            None => body.push_str(&format!("{} {status}\n", c.name())),
        }
        if c == Component::Store {
            if let Some(failure) = state.health.store_write_failure() {
                body.push_str(&format!("store down: {failure}\n"));
            }
        }
        for lane in state.health.stalled(c) {
            body.push_str(&format!("{} stalled: {lane}\n", c.name()));
        }
    }
    let code = if state.health.ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn healthz(addr: std::net::SocketAddr) -> (u16, String) {
        let r = reqwest::get(format!("http://{addr}/healthz"))
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    #[tokio::test]
    async fn healthz_fails_naming_the_loop_that_stopped_beating_and_recovers_when_it_ends() {
        let health = Health::default();
        let beating = health.liveness().register("kafka consumer");
        let wedged = health.liveness().register("amqp consumer payments");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let timeout = Duration::from_secs(1);
        tokio::spawn(serve(
            listener,
            Metrics::new(),
            health.clone(),
            timeout,
            stop.clone(),
        ));
        assert_eq!(healthz(addr).await, (200, "ok\n".into()));
        // 1.5 s: one loop keeps beating, the other has stopped.
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            beating.beat();
        }
        assert_eq!(
            healthz(addr).await,
            (
                503,
                "stuck: amqp consumer payments: no heartbeat for 1s\n".into()
            )
        );
        // A stuck loop whose task ends (a session torn down) is not watched.
        drop(wedged);
        assert_eq!(healthz(addr).await, (200, "ok\n".into()));
        stop.cancel();
    }

    /// Silent connections (a port scanner, a stuck client) hold the
    /// operator listener's slots only for its header timeout: past
    /// `max_connections` a probe waits, and is answered once they are
    /// closed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silent_connections_are_bounded_and_closed_after_the_header_timeout() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let health = Health::default();
        tokio::spawn(serve(
            listener,
            Metrics::new(),
            health,
            Duration::from_secs(60),
            stop.clone(),
        ));
        assert_eq!(healthz(addr).await, (200, "ok\n".into()));
        let mut silent = Vec::new();
        for _ in 0..LIMITS.max_connections {
            silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let client = reqwest::Client::new();
        let url = format!("http://{addr}/healthz");
        let waiting = client
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        assert!(
            waiting.is_err(),
            "a probe past max_connections waits: {waiting:?}"
        );
        let answered = client
            .get(&url)
            .timeout(LIMITS.header_timeout * 3)
            .send()
            .await
            .expect("answered once the silent connections were closed");
        assert_eq!(answered.status().as_u16(), 200);
        for mut s in silent {
            let mut rest = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
            assert!(read.is_ok(), "each silent connection was closed");
        }
        stop.cancel();
    }
}
