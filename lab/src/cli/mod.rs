//! The `dedupq-lab` command line and what each subcommand runs.

mod args;
mod run;

pub use args::{BrokerArgs, Cli, Command, ScenarioArgs};
pub use run::run;
