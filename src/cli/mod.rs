//! The `dedupq` command line.

mod args;
mod keys;

pub use args::{BrokerArgs, Cli, Command, KeysCommand, ProviderArgs, ScenarioArgs};
pub use keys::run_keys;
