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
        Command::Demo(args) => run_scenario(args, "demo", &settings).await?,
        Command::Chaos(args) => run_scenario(args, "ci", &settings).await?,
        Command::Provider(args) => run_provider(args, &settings).await?,
        Command::Migrate { check } => run_migrate(check, &settings).await?,
        Command::Config => println!("{}", toml::to_string_pretty(&settings.redacted())?),
        Command::Keys { command } => run_keys(&settings, command, &mut std::io::stdout()).await?,
        Command::Dlq { command } => run_dlq(&settings, command, &mut std::io::stdout()).await?,
        Command::Bench(args) => run_bench(args, &settings).await?,
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

async fn run_bench(args: dedupq::bench::BenchArgs, settings: &Settings) -> anyhow::Result<()> {
    dedupq::bench::run(args, settings).await
}

async fn run_provider(args: dedupq::cli::ProviderArgs, settings: &Settings) -> anyhow::Result<()> {
    let knobs = dedupq::provider::Knobs {
        latency: args.latency,
        fail_rate: args.fail_rate,
        decline_rate: args.decline_rate,
        hang_after_charge_rate: args.hang_after_charge_rate,
        slow_after_charge: args.slow_after_charge,
        slow_after_charge_rate: args.slow_after_charge_rate,
        compare: args.compare,
        honour_keys: !args.ignore_keys,
        ..Default::default()
    };
    if let Err(e) = knobs.validate() {
        anyhow::bail!("invalid --{}: {}", e.knob.replace('_', "-"), e.problem);
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(listen = %args.listen, schema = args.schema, ?knobs, "provider simulator running");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    dedupq::provider::serve(
        listener,
        settings.store.url.expose(),
        &args.schema,
        knobs,
        shutdown,
    )
    .await?;
    Ok(())
}

async fn run_scenario(
    args: dedupq::cli::ScenarioArgs,
    default_profile: &str,
    settings: &Settings,
) -> anyhow::Result<()> {
    let name = args.profile.as_deref().unwrap_or(default_profile);
    let profile = dedupq::scenario::Profile::named(name).ok_or_else(|| {
        anyhow::anyhow!(
            "--profile must be one of {}, not '{name}'",
            dedupq::scenario::Profile::NAMES.join(", ")
        )
    })?;
    let options = dedupq::scenario::Options {
        database_url: settings.store.url.expose().to_string(),
        brokers: args.brokers.brokers,
        amqp_url: args.brokers.amqp_url,
        services: args.services,
        workdir: args.workdir,
        progress: true,
    };
    let report = dedupq::scenario::run(&profile, &options).await?;
    println!("{report}");
    anyhow::ensure!(
        report.passed(),
        "{} invariant violation(s)",
        report.violations.len()
    );
    Ok(())
}
