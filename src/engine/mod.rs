//! Transport-free decisions: what happens to each message.

mod claimed;
mod core;
mod decision;
mod lease;
mod message;
mod options;
mod parked;
mod pipeline;
mod provider_gate;
mod record;
mod round;
mod transactional;
mod verdict;

pub use self::core::Engine;
pub use decision::{Action, DeadLetterReason, Decision, Outcome};
pub use message::{Header, Incoming, InvalidReason, Parsed, Parser, Source, Transport};
pub use options::{default_owner, Backoff, EngineOptions};
pub use pipeline::{Pipeline, Unavailable};
pub use transactional::{TransactionalEngine, TransactionalHandler, TxFailure};
