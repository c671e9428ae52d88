//! The operator endpoints: /metrics, /healthz, /readyz.

use crate::health::{Component, Health};
use crate::metrics::Metrics;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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

/// Serves [`router`] on `listener` until `shutdown` is cancelled, then lets
/// open requests finish.
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    health: Health,
    liveness_timeout: Duration,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, health, liveness_timeout))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
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
}
