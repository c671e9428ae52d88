//! The API as one service: built from the settings (keys, secrets, broker
//! clients, the bound listener), then served until shutdown.

use super::{answer, auth, decide, post, publish, reload, route};
use crate::config::{ConfigError, Settings};
use crate::engine::Pipeline;
use crate::listener;
use crate::store::Store;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::Uri;
use axum::routing::post;
use axum::Router;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why the API could not start. Any of them stops dedupq at startup.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// An `[api]` or `[identity]` setting is unusable (a route, a caller
    /// key, a webhook secret file).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `api.listen` could not be bound (in use, not permitted).
    #[error("binding api.listen {addr} failed")]
    Bind {
        /// The address from `api.listen`.
        addr: SocketAddr,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// An async route publishes to Kafka and its producer could not be
    /// created.
    #[error("creating the Kafka producer of the async routes failed")]
    Kafka(#[source] rdkafka::error::KafkaError),
}

/// The API, bound and ready to serve.
pub struct Api {
    listener: TcpListener,
    router: Router,
    limits: listener::Limits,
    tasks: TaskTracker,
    state: Arc<post::ApiState>,
}

impl Api {
    /// Reads the keys and secret files, builds the broker clients of the
    /// async routes and binds `api.listen`.
    pub async fn build(
        settings: &Settings,
        pipeline: Arc<dyn Pipeline>,
        store: Store,
    ) -> Result<Self, ApiError> {
        let api = &settings.api;
        let callers = auth::Callers::load(api)?;
        let publishers = publish::Publishers::new(settings).map_err(ApiError::Kafka)?;
        let mut routes = HashMap::new();
        for (i, r) in api.routes.iter().enumerate() {
            routes.insert(r.name.clone(), route::Route::build(i, r, &publishers)?);
        }
        let tasks = TaskTracker::new();
        let shared = Arc::new(post::ApiState {
            routes,
            callers,
            gate: decide::Gate::new(pipeline, store, &settings.identity)?,
            in_flight: Arc::new(Semaphore::new(api.max_requests_in_flight)),
            body_limit: settings.identity.max_body_bytes,
            request_timeout: api.request_timeout,
            tasks: tasks.clone(),
            passed: post::passed_headers(settings),
        });
        let router = Router::new()
            .route(
                "/v1/{route}",
                post(post_route).fallback(|| async { answer::method_not_allowed() }),
            )
            .fallback(|uri: Uri| async move { answer::no_route(uri.path()) })
            .with_state(shared.clone());
        let listener = TcpListener::bind(api.listen)
            .await
            .map_err(|source| ApiError::Bind {
                addr: api.listen,
                source,
            })?;
        let limits = listener::Limits {
            max_connections: api.max_connections,
            max_header_bytes: api.max_header_bytes,
            max_headers: api.max_headers,
            header_timeout: api.header_timeout,
            shutdown_timeout: api.shutdown_timeout,
        };
        Ok(Self {
            listener,
            router,
            limits,
            tasks,
            state: shared,
        })
    }

    /// The address actually bound (the port chosen when `api.listen` asks
    /// for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown`, then lets in-flight requests and handlers
    /// finish within `api.shutdown_timeout`. The API keys file and the
    /// webhook secret files are read again when they change and on SIGHUP.
    pub async fn serve(self, shutdown: CancellationToken) {
        let state = self.state;
        tokio::spawn(reload::watch(
            move || state.reload_credentials(),
            shutdown.clone(),
        ));
        listener::serve(
            self.listener,
            self.router,
            self.limits,
            self.tasks,
            shutdown,
        )
        .await
    }
}

async fn post_route(
    state: State<Arc<post::ApiState>>,
    name: Result<Path<String>, PathRejection>,
    request: Request,
) -> axum::response::Response {
    let name = name.map(|Path(n)| n).unwrap_or_default();
    post::handle(state, name, request).await
}
