//! `dedupq-lab`: the demo, the chaos runs and the benchmark.

use clap::Parser;
use dedupq::config::Settings;
use dedupq_lab::cli::{self, Cli};
use std::process::ExitCode;

dedupq::allocator!();

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut settings = match Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dedupq-lab: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.json_logs {
        settings.log.format = dedupq::config::LogFormat::Json;
    }
    dedupq::telemetry::init(&settings.log);
    match cli::run(cli.command, &settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dedupq-lab: {e:#}");
            ExitCode::FAILURE
        }
    }
}
