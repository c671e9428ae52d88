//! The `dedupq` command line.

mod args;
mod keys;

pub use args::{Cli, Command, KeysCommand, ProviderArgs};
pub use keys::run_keys;
