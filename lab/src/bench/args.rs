use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// A ~2-minute smoke run with small sizes (the numbers are noisier).
    #[arg(long)]
    pub quick: bool,
    /// Only the cases whose label contains this text (e.g. "naive", "amqp").
    #[arg(long)]
    pub only: Option<String>,
    #[command(flatten)]
    pub brokers: crate::cli::BrokerArgs,
    /// Logs of the case processes.
    #[arg(long, default_value = "/var/tmp/dedupq-bench")]
    pub workdir: PathBuf,
    /// Internal: run one measurement in this process and print its result.
    #[arg(long, hide = true)]
    pub case: Option<String>,
}
