//! `dedupq-lab bench`: messages/s, end-to-end latency and peak memory of the
//! pipeline next to its limits (the naive per-message design, raw broker
//! consumption and echo, PostgreSQL alone, the narrowest claim table), all
//! measured in one run so that the ratios are comparable on a noisy
//! machine. See BENCHMARKS.md.
//!
//! The parent process prepares each case (topic, queue, schema, messages)
//! and spawns one child per measurement (`dedupq-lab bench --case …`), so that
//! the peak RSS of a row is that case's consumer and nothing else.

mod amqp;
mod args;
mod case;
mod child;
mod echo;
mod header;
mod http;
mod kafka;
mod minimal;
mod naive;
mod pg_limit;
mod plan;
mod prefill;
mod produce;
mod replies;
mod report;
mod runner;
mod service;
mod stats;

pub use args::BenchArgs;
pub use case::{Case, Job, Kind, Measured, Phase};
pub use child::run_job;
pub use plan::Plan;
pub use report::Row;
pub use runner::{run, run_case, Env};
