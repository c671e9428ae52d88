//! The operator endpoints: /metrics, /healthz, /readyz.

use crate::health::{Component, Health};
use crate::metrics::Metrics;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: Health,
}

/// The operator endpoints: `/metrics` (Prometheus text), `/healthz` (200
/// while the process lives) and `/readyz` (200 when [`Health::ready`], else
/// 503; the body lists each component's state, reason and stalled lanes).
pub(crate) fn router(metrics: Metrics, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, health })
}

/// Serves [`router`] on `listener` until `shutdown` is cancelled, then lets
/// open requests finish.
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    health: Health,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, health))
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
