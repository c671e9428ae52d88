//! The `dedupq` command line.

mod actor;
mod args;
mod check;
mod dlq;
mod keys;
mod output;

pub use args::{Cli, Command, KeysCommand};
pub use check::{checks, run_check, Check, Report, ReportFormat, Status};
pub use dlq::{run_dlq, DlqCommand};
pub use keys::run_keys;
pub use output::Format;
