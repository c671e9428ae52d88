//! dedupq: exactly-once effects over at-least-once Kafka and RabbitMQ
//! delivery. Each message's idempotency key is claimed in PostgreSQL before
//! any work, the handler runs, its outcome is stored, and only then is the
//! offset committed or the delivery acked.
//!
//! # Embedding
//!
//! The crate root is what an embedder uses. [`Application`] runs the whole
//! service (the configured transports, the HTTP API, `/metrics` and the
//! probes) around a [`Handler`] of one's own, or a [`TransactionalHandler`]
//! whose writes commit in the claim's own transaction; [`Settings`] is the
//! configuration tree (its sections in [`config`]), and [`telemetry`]
//! installs logging and trace export. A transport of one's own hands
//! [`Incoming`] batches to a [`Pipeline`] and applies each [`Decision`].
//!
//! ```no_run
//! use dedupq::{Application, Handler, HandlerCall, HandlerOutcome, HandlerResult, Settings};
//! use std::sync::Arc;
//!
//! struct Payments;
//!
//! #[async_trait::async_trait]
//! impl Handler for Payments {
//!     async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
//!         // Send call.derived_key as the provider's idempotency key.
//!         let _ = call.derived_key;
//!         HandlerOutcome::Success(HandlerResult::json(201, &serde_json::json!({"ok": true})))
//!     }
//! }
//!
//! # async fn start() -> anyhow::Result<()> {
//! let settings = Settings::load(None)?;
//! dedupq::telemetry::init(&settings.log);
//! Application::build_with_handler(settings, Arc::new(Payments))
//!     .await?
//!     .run_until_stopped()
//!     .await
//! # }
//! ```
//!
//! The other modules are the service's own parts. They stay public for the
//! `dedupq` binary, the lab and the integration tests, but are hidden from
//! these docs: they are not an API an embedder should build on.

#![warn(missing_docs)]

// Running the service.
pub use config::Settings;
pub use startup::Application;

// The work a claimed message triggers.
pub use handler::{
    FaultReason, Handler, HandlerCall, HandlerOutcome, HandlerResult, HttpHandler, Request,
};

// The engines, and the seam to the transports.
pub use engine::{
    Action, DeadLetterReason, Decision, Engine, EngineOptions, Incoming, Outcome, Parser, Pipeline,
    TransactionalEngine, TransactionalHandler, TxFailure, Unavailable,
};
pub use message::{Header, Source};

// The vocabulary: who and what a message is about.
pub use identity::{Epoch, IdempotencyKey, Identity, Tenant};

// What the engines share: the key table, metrics, readiness.
pub use health::Health;
pub use metrics::Metrics;
pub use store::{Store, StoreError, StoredResult};

pub mod allocator;
pub mod config;
pub mod telemetry;

#[doc(hidden)]
pub mod broker;
#[doc(hidden)]
pub mod cli;
#[doc(hidden)]
pub mod engine;
#[doc(hidden)]
pub mod fingerprint;
#[doc(hidden)]
pub mod handler;
#[doc(hidden)]
pub mod health;
#[doc(hidden)]
pub mod identity;
#[doc(hidden)]
pub mod json;
#[doc(hidden)]
pub mod liveness;
#[doc(hidden)]
pub mod message;
#[doc(hidden)]
pub mod metrics;
#[doc(hidden)]
pub mod retention;
#[doc(hidden)]
pub mod startup;
#[doc(hidden)]
pub mod store;
#[doc(hidden)]
pub mod transport;

mod backoff;
mod broken;
mod listener;
mod maintenance;
mod open_files;
mod recheck;
mod server;
