//! The `dedupq` command line.

mod actor;
mod args;
mod dlq;
mod keys;
mod output;

pub use args::{BrokerArgs, Cli, Command, KeysCommand, ProviderArgs, ScenarioArgs};
pub use dlq::{run_dlq, DlqCommand};
pub use keys::run_keys;
pub use output::Format;
