//! Builds the whole service from a configuration. Production (`dedupq run`)
//! and the tests call the same `Application::build`.

use crate::config::Settings;
use crate::engine::{
    Engine, EngineOptions, Parser, Pipeline, TransactionalEngine, TransactionalHandler,
};
use crate::handler::{self, Handler};
use crate::health::{Component, Health};
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};
use crate::telemetry::chain;
use crate::{maintenance, server, transport};
use anyhow::Context;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

/// The whole service: the operator endpoint, the prepared store, the
/// engine, and the transports and HTTP API the configuration turns on.
/// Built by [`Application::build`] or its library variants, run by
/// [`Application::run_until_stopped`].
pub struct Application {
    settings: Settings,
    store: Store,
    metrics: Metrics,
    pipeline: Arc<dyn Pipeline>,
    health: Health,
    addr: SocketAddr,
    server: JoinHandle<std::io::Result<()>>,
    signals: JoinHandle<anyhow::Result<()>>,
    shutdown: CancellationToken,
}

/// A SIGINT or SIGTERM (or the shutdown token) that came while the store
/// was still being prepared: a stop that was asked for, not a failure.
#[derive(Debug, thiserror::Error)]
#[error("stopped before start-up finished")]
pub struct StoppedDuringStartUp;

impl Application {
    /// Raises the open-files limit to its hard limit and refuses a
    /// configuration whose connections could not all be open under it,
    /// builds the configured handler (refusing a `handler.lookup_url` that
    /// answers 200 for a key never charged), serves the operator endpoints
    /// (so probes answer while PostgreSQL is still unreachable), then
    /// prepares the store as `store.migrate` says, waiting for PostgreSQL,
    /// and the engine with the handler.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        settings.validate_for_run()?;
        crate::open_files::prepare(&settings)?;
        let handler = handler::from_settings(&settings.handler).await?;
        Self::build_with_handler(settings, handler).await
    }

    /// The same, with a handler of the caller's (library use). The
    /// endpoint serves until `run_until_stopped` returns or the shutdown
    /// token is cancelled, also if the application is dropped unstarted.
    pub async fn build_with_handler(
        settings: Settings,
        handler: Arc<dyn Handler>,
    ) -> anyhow::Result<Self> {
        let parts = Parts::prepare(&settings).await?;
        let engine = Engine::with_health(
            parts.store.clone(),
            handler,
            Parser::new(&settings.identity),
            EngineOptions::from_settings(&settings),
            parts.metrics.clone(),
            parts.health.clone(),
            parts.shutdown.clone(),
        );
        Ok(parts.into_application(settings, Arc::new(engine)))
    }

    /// The same-database mode behind the same transports: the handler's
    /// writes commit in the claim's transaction (library use; see
    /// `examples/ledger.rs`).
    pub async fn build_transactional(
        settings: Settings,
        handler: Arc<dyn TransactionalHandler>,
    ) -> anyhow::Result<Self> {
        let parts = Parts::prepare(&settings).await?;
        let engine = TransactionalEngine::new(
            parts.store.clone(),
            handler,
            Parser::new(&settings.identity),
            EngineOptions::from_settings(&settings),
            parts.metrics.clone(),
        );
        Ok(parts.into_application(settings, Arc::new(engine)))
    }

    /// The address the operator endpoint is bound to: with `http.listen`
    /// on port 0, the port the system chose.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cancelling it stops the application as SIGTERM does.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// The engine behind every transport, for feeding it batches directly.
    pub fn pipeline(&self) -> &Arc<dyn Pipeline> {
        &self.pipeline
    }

    /// The key table's store; its pool also serves a same-database
    /// handler's own tables (see `examples/ledger.rs`).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The metrics /metrics exports.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Runs until SIGINT/SIGTERM or the shutdown token, then stops taking
    /// work, lets in-flight work finish and returns.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Self {
            settings,
            store,
            metrics,
            pipeline,
            health,
            server,
            signals,
            shutdown,
            ..
        } = self;
        let mut tasks = JoinSet::new();
        tasks.spawn(async move { signals.await.context("signal task")? });
        tasks.spawn(async move {
            server
                .await
                .context("http server task")?
                .context("http server")
        });
        let keep = match crate::retention::keep(&settings, &health, &shutdown).await {
            Ok(keep) => keep,
            Err(e) => {
                shutdown.cancel();
                return Err(e).context("checking key retention against the Kafka topics");
            }
        };
        tracing::info!(keep = %humantime::format_duration(keep), "retention: finished keys are kept this long");
        if settings.api.enabled {
            let api =
                crate::transport::http::Api::build(&settings, pipeline.clone(), store.clone())
                    .await
                    .context("starting the HTTP API");
            let api = match api {
                Ok(api) => api,
                Err(e) => {
                    shutdown.cancel();
                    return Err(e);
                }
            };
            tracing::info!(listen = %settings.api.listen, "HTTP API listening");
            let s = shutdown.clone();
            tasks.spawn(async move {
                api.serve(s).await;
                Ok(())
            });
        }
        {
            let (store, r, m, h, s) = (
                store.clone(),
                settings.retention.clone(),
                metrics.clone(),
                health.clone(),
                shutdown.clone(),
            );
            tasks.spawn(async move {
                maintenance::run(store, r, keep, m, h, s).await;
                Ok(())
            });
        }
        if !settings.kafka.topics.is_empty() {
            let (k, e, h, s) = (
                settings.kafka.clone(),
                pipeline.clone(),
                health.clone(),
                shutdown.clone(),
            );
            tasks.spawn(async move {
                transport::kafka::run_reloading(k, e, h, s)
                    .await
                    .context("kafka consumer")
            });
        }
        if !settings.amqp.queues.is_empty() {
            let (a, e, h, s) = (
                settings.amqp.clone(),
                pipeline.clone(),
                health.clone(),
                shutdown.clone(),
            );
            tasks.spawn(async move {
                transport::amqp::run(a, e, h, s)
                    .await
                    .context("rabbitmq consumer")
            });
        }
        tracing::info!(
            kafka_topics = ?settings.kafka.topics,
            amqp_queues = ?settings.amqp.queues,
            store = %settings.store.url,
            schema = settings.store.schema.as_deref().unwrap_or("(search_path)"),
            "dedupq running"
        );
        // The first task to fail stops the others.
        let mut result = Ok(());
        while let Some(done) = tasks.join_next().await {
            let outcome = done.context("task panicked").and_then(|r| r);
            if let Err(e) = outcome {
                tracing::error!(error = format!("{e:#}"), "stopping");
                if result.is_ok() {
                    result = Err(e);
                }
            }
            shutdown.cancel();
        }
        result
    }
}

/// What every kind of application shares: the operator endpoint (serving
/// from the first moment), the store (prepared), health, metrics and the
/// shutdown signal.
struct Parts {
    addr: SocketAddr,
    server: JoinHandle<std::io::Result<()>>,
    signals: JoinHandle<anyhow::Result<()>>,
    store: Store,
    shutdown: CancellationToken,
    health: Health,
    metrics: Metrics,
}

impl Parts {
    async fn prepare(settings: &Settings) -> anyhow::Result<Self> {
        let shutdown = CancellationToken::new();
        // Caught before the port opens: whoever waits for the port and
        // then stops the process gets a clean stop, never death by the
        // signal's default action; and a stop while PostgreSQL is awaited
        // ends start-up.
        let signals = Signals::install()?;
        let listener = TcpListener::bind(settings.http.listen)
            .await
            .with_context(|| format!("binding http.listen {}", settings.http.listen))?;
        let signals = tokio::spawn(signals.watch(shutdown.clone()));
        let addr = listener.local_addr()?;
        let (metrics, health) = (Metrics::new(), Health::default());
        health.set_down(Component::Store, "starting: not connected yet");
        let server = tokio::spawn(server::serve(
            listener,
            metrics.clone(),
            health.clone(),
            settings.http.liveness_timeout,
            shutdown.clone(),
        ));
        let store = match prepare_store(settings, &health, &shutdown).await {
            Ok(store) => store,
            Err(e) => {
                // Stops the endpoint of a library caller that goes on.
                shutdown.cancel();
                return Err(e);
            }
        };
        health.set(Component::Store, true);
        // Not ready until each configured transport reports in (its start
        // waits for start-up checks against the broker first).
        if !settings.kafka.topics.is_empty() {
            health.set_down(Component::Kafka, "starting");
        }
        if !settings.amqp.queues.is_empty() {
            health.set_down(Component::Amqp, "starting");
        }
        Ok(Self {
            addr,
            server,
            signals,
            store,
            shutdown,
            health,
            metrics,
        })
    }

    fn into_application(self, settings: Settings, pipeline: Arc<dyn Pipeline>) -> Application {
        Application {
            settings,
            store: self.store,
            metrics: self.metrics,
            pipeline,
            health: self.health,
            addr: self.addr,
            server: self.server,
            signals: self.signals,
            shutdown: self.shutdown,
        }
    }
}

/// Connects and migrates (or checks) the key table's schema, retrying
/// while PostgreSQL is unreachable so that dedupq can start before its
/// database; /readyz says why it is not ready meanwhile.
async fn prepare_store(
    settings: &Settings,
    health: &Health,
    shutdown: &CancellationToken,
) -> anyhow::Result<Store> {
    let store = Store::connect_lazy(&settings.store)?;
    let (schema, mode) = (settings.store.schema.as_deref(), settings.store.migrate);
    let mut delay = Duration::from_millis(200);
    loop {
        match store.prepare(schema, mode).await {
            Ok(()) => return Ok(store),
            Err(e) if e.is_transient() => {
                let e = store.explained(e).await;
                let cause = chain(&e).to_string();
                // Still retried: a database operator may create the role
                // after dedupq starts. But the operator reading this is
                // told which setting to look at.
                if e.is_credentials_refused() {
                    tracing::warn!(
                        error = %cause,
                        "PostgreSQL refused the role or password of store.url \
                         (or store.url_file); retrying, in case the role is still being created"
                    );
                    health.set_down(
                        Component::Store,
                        format!("credentials refused (store.url): {cause}"),
                    );
                } else {
                    tracing::warn!(error = %cause, "PostgreSQL not reachable yet; retrying");
                    health.set_down(Component::Store, format!("unreachable: {cause}"));
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.cancelled() => {
                        tracing::info!(error = %cause, "stopped while waiting for PostgreSQL");
                        return Err(StoppedDuringStartUp.into());
                    }
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e @ StoreError::SharedSessions(_)) => {
                health.set_down(Component::Store, chain(&e).to_string());
                return Err(e.into());
            }
            Err(e) => {
                health.set_down(Component::Store, chain(&e).to_string());
                return Err(e).context(format!("store.migrate = \"{}\"", mode.as_str()));
            }
        }
    }
}

/// SIGINT and SIGTERM stop the process; SIGHUP asks for credential files
/// to be read again (the API watches it) and never stops it, whatever is
/// enabled.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    async fn watch(mut self, shutdown: CancellationToken) -> anyhow::Result<()> {
        loop {
            tokio::select! {
                _ = self.int.recv() => tracing::info!("SIGINT: shutting down"),
                _ = self.term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = self.hangup.recv() => continue,
                _ = shutdown.cancelled() => {}
            }
            break;
        }
        shutdown.cancel();
        Ok(())
    }
}
