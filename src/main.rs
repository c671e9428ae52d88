use clap::Parser;
use dedupq::cli::{run_keys, Cli, Command};
use dedupq::config::Settings;
use dedupq::store::Store;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dedupq: {e}");
            return ExitCode::from(2);
        }
    };
    dedupq::telemetry::init(&settings.log);
    match run(cli.command, settings).await {
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
        Command::Provider(args) => run_provider(args, &settings).await?,
        Command::Migrate => {
            let store = Store::connect_lazy(&settings.store)?;
            store.migrate(settings.store.schema.as_deref()).await?;
            println!("migrations applied");
        }
        Command::Config => println!("{}", toml::to_string_pretty(&settings.redacted())?),
        Command::Keys { command } => run_keys(&settings, command, &mut std::io::stdout()).await?,
    }
    Ok(())
}

async fn run_provider(args: dedupq::cli::ProviderArgs, settings: &Settings) -> anyhow::Result<()> {
    let knobs = dedupq::provider::Knobs {
        latency: args.latency,
        fail_rate: args.fail_rate,
        decline_rate: args.decline_rate,
        hang_after_charge_rate: args.hang_after_charge_rate,
        honour_keys: !args.ignore_keys,
        ..Default::default()
    };
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
