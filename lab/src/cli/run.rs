use super::{Command, ScenarioArgs};
use crate::scenario::{self, Binaries, Profile};
use dedupq::config::Settings;

/// Runs one subcommand with dedupq's `settings`.
pub async fn run(command: Command, settings: &Settings) -> anyhow::Result<()> {
    match command {
        Command::Demo(args) => run_scenario(args, "demo", settings).await,
        Command::Chaos(args) => run_scenario(args, "ci", settings).await,
        Command::Bench(args) => crate::bench::run(args, settings).await,
    }
}

async fn run_scenario(
    args: ScenarioArgs,
    default_profile: &str,
    settings: &Settings,
) -> anyhow::Result<()> {
    let name = args.profile.as_deref().unwrap_or(default_profile);
    let profile = Profile::named(name).ok_or_else(|| {
        anyhow::anyhow!(
            "--profile must be one of {}, not '{name}'",
            Profile::NAMES.join(", ")
        )
    })?;
    let options = scenario::Options {
        database_url: settings.store.url.expose().to_string(),
        brokers: args.brokers.brokers,
        amqp_url: args.brokers.amqp_url,
        services: args.services,
        workdir: args.workdir,
        progress: true,
        binaries: Binaries::locate(args.dedupq_bin, args.dedupq_provider_bin)?,
    };
    let report = scenario::run(&profile, &options).await?;
    println!("{report}");
    anyhow::ensure!(
        report.passed(),
        "{} invariant violation(s)",
        report.violations.len()
    );
    Ok(())
}
