//! `dedupq-provider`: the payment-provider simulator as a process of its
//! own (the demo, the chaos runs and docker-compose.yml start it).

use clap::Parser;
use dedupq_provider::Args;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // RUST_LOG chooses what is logged (info by default); colour only at a
    // terminal, as dedupq's own logs.
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dedupq-provider: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let knobs = args.knobs();
    if let Err(e) = knobs.validate() {
        anyhow::bail!("invalid --{}: {}", e.knob.replace('_', "-"), e.problem);
    }
    let shutdown = CancellationToken::new();
    // SIGINT (a terminal) or SIGTERM (docker stop, Kubernetes, a script)
    // stops it the same way. Both are caught before the port opens: a
    // script that waits for the port and then stops it must not find the
    // default action (death by signal) still in place.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    // The bound address, so that `--listen 127.0.0.1:0` says which port it got.
    let listen = listener.local_addr()?;
    tracing::info!(%listen, schema = args.schema, ?knobs, "provider simulator running");
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => tracing::info!("SIGINT: stopping"),
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        }
        stop.cancel();
    });
    dedupq_provider::serve(listener, &args.database_url, &args.schema, knobs, shutdown).await?;
    Ok(())
}
