//! The `dedupq` command line.

mod args;
mod keys;

pub use args::{Cli, Command, KeysCommand};
pub use keys::run_keys;
