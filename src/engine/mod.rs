//! Transport-free decisions: what happens to each message.
//!
//! The leased [`Engine`] (`leased.rs`) reads top-down and calls the rest:
//! `claim.rs` claims a round, `settle.rs` decides what a claim settles on
//! its own (for both engines), `call.rs` runs a won claim's handler,
//! `verdict.rs` judges its outcome, `finish.rs` stores it, `record.rs`
//! counts and logs every decision (for both engines). `lease.rs` keeps
//! leases, `parked.rs` writes outcomes whose row was held, and
//! `provider_gate.rs` pauses intake in a provider outage. The
//! same-database [`TransactionalEngine`] is `transactional.rs`.

mod batch;
mod call;
mod claim;
mod decision;
mod finish;
mod group;
mod inner;
mod lease;
mod leased;
mod message;
mod options;
mod parked;
mod pipeline;
mod provider_gate;
mod record;
mod settle;
mod store_watch;
mod streaks;
mod transactional;
mod verdict;

pub use decision::{Action, DeadLetterReason, Decision, Outcome};
pub use leased::Engine;
pub use message::{
    Header, Incoming, InvalidReason, Parsed, Parser, Source, Transport, ROUTE_HEADER,
};
pub use options::{default_owner, Backoff, EngineOptions};
pub use pipeline::{Pipeline, Unavailable};
pub use transactional::{TransactionalEngine, TransactionalHandler, TxFailure};
