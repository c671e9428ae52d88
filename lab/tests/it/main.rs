//! The lab against the real services: the benchmark's smallest cases, and
//! the README's `dedupq-lab` commands.

mod bench;
mod bench_http;
mod readme;

use dedupq_lab::bench::Env;
use std::path::PathBuf;

fn var(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

/// The services of scripts/services (or the environment's), this test's
/// dedupq-lab for the case processes, dedupq's default settings.
fn env() -> Env {
    Env {
        database_url: var(
            "DATABASE_URL",
            "postgres://postgres:postgres@127.0.0.1:5432/postgres",
        ),
        brokers: var("KAFKA_BROKERS", "127.0.0.1:9092"),
        amqp_url: var("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"),
        workdir: std::env::temp_dir(),
        exe: PathBuf::from(env!("CARGO_BIN_EXE_dedupq-lab")),
        settings: dedupq::config::Settings::default(),
    }
}
