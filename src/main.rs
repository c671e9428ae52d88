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
        Command::Migrate => {
            let store = Store::connect_lazy(&settings.store)?;
            store.migrate(settings.store.schema.as_deref()).await?;
            println!("migrations applied");
        }
        Command::Config => println!("{}", toml::to_string_pretty(&settings)?),
        Command::Keys { command } => run_keys(&settings, command, &mut std::io::stdout()).await?,
    }
    Ok(())
}
