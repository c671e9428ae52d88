//! `dedupq`: the service (`dedupq run`) and its operator commands.

use clap::Parser;
use dedupq::cli::{run_dlq, run_keys, Cli, Command};
use dedupq::config::Settings;
use dedupq::store::Store;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // `run` calls the built-in HTTP handler; `config` shows what `run`
    // would start with, so both refuse a missing handler.url.
    let runs = matches!(cli.command, Command::Run | Command::Config);
    let loaded = Settings::load(cli.config.as_deref()).and_then(|s| {
        if runs {
            s.validate_for_run().map(|()| s)
        } else {
            Ok(s)
        }
    });
    let settings = match loaded {
        Ok(mut s) => {
            if cli.json_logs {
                s.log.format = dedupq::config::LogFormat::Json;
            }
            s
        }
        Err(e) => {
            eprintln!("dedupq: {e}");
            return ExitCode::from(2);
        }
    };
    // Traces are exported by the service only, not by one-off commands.
    let traces = matches!(cli.command, Command::Run).then_some(&settings.telemetry);
    let telemetry = match dedupq::telemetry::init_with_traces(&settings.log, traces) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("dedupq: {}", dedupq::telemetry::chain(&e));
            return ExitCode::from(2);
        }
    };
    let result = run(cli.command, settings).await;
    telemetry.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dedupq: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, settings: Settings) -> anyhow::Result<()> {
    match command {
        Command::Run => {
            dedupq::startup::Application::build(settings)
                .await?
                .run_until_stopped()
                .await?
        }
        Command::Migrate { check } => run_migrate(check, &settings).await?,
        Command::Config => println!("{}", toml::to_string_pretty(&settings.redacted())?),
        Command::Keys { command } => run_keys(&settings, command, &mut std::io::stdout()).await?,
        Command::Dlq { command } => run_dlq(&settings, command, &mut std::io::stdout()).await?,
    }
    Ok(())
}

async fn run_migrate(check: bool, settings: &Settings) -> anyhow::Result<()> {
    let store = Store::connect_lazy(&settings.store)?;
    let schema = settings.store.schema.as_deref();
    if check {
        store.check_migrated(schema).await?;
        println!("schema up to date");
    } else {
        store.migrate(schema).await?;
        println!("migrations applied");
    }
    Ok(())
}
