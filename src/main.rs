//! `dedupq`: the service (`dedupq run`) and its operator commands.

use clap::Parser;
use dedupq::cli::{run_check, run_dlq, run_keys, Cli, Command, ReportFormat};
use dedupq::config::Settings;
use dedupq::store::Store;
use std::process::ExitCode;

dedupq::allocator!();

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Check { output } = cli.command {
        return preflight(cli.config.as_deref(), output).await;
    }
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
        // A stop asked for before start-up finished is a clean stop.
        Err(e) if e.is::<dedupq::startup::StoppedDuringStartUp>() => ExitCode::SUCCESS,
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
        Command::Migrate { check, partitions } => run_migrate(check, partitions, settings).await?,
        Command::Config => println!("{}", toml::to_string_pretty(&settings.redacted())?),
        Command::Check { .. } => unreachable!("run by preflight"),
        Command::Keys { command } => run_keys(&settings, command, &mut std::io::stdout()).await?,
        Command::Dlq { command } => run_dlq(&settings, command, &mut std::io::stdout()).await?,
    }
    Ok(())
}

async fn run_migrate(
    check: bool,
    partitions: Option<u32>,
    mut settings: Settings,
) -> anyhow::Result<()> {
    if let Some(n) = partitions {
        settings.store.partitions = n;
        settings.store.validate()?;
    }
    let store = Store::connect_lazy(&settings.store)?;
    let schema = settings.store.schema.as_deref();
    if check {
        store.check_migrated(schema).await?;
        println!("schema up to date");
    } else {
        // Through a pooler in transaction mode, the migration lock would
        // not keep two instances from migrating at once.
        store.check_sessions_kept().await?;
        store.migrate(schema).await?;
        println!("migrations applied");
    }
    Ok(())
}

/// `dedupq check`: a configuration that does not load is its first failed
/// check, not an early exit, so the report is complete either way.
async fn preflight(file: Option<&std::path::Path>, output: ReportFormat) -> ExitCode {
    let loaded = Settings::load(file).and_then(|s| s.validate_for_run().map(|()| s));
    // The report is the output: only warnings go to stderr, and not the
    // broker's own log of the passive declares that find nothing.
    let log = dedupq::config::LogSettings {
        filter: "warn,lapin=off".into(),
        ..loaded.as_ref().map(|s| s.log.clone()).unwrap_or_default()
    };
    let telemetry = dedupq::telemetry::init_with_traces(&log, None).ok();
    let result = run_check(loaded, output, &mut std::io::stdout()).await;
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("dedupq: {e:#}");
            ExitCode::FAILURE
        }
    }
}
