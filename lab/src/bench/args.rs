use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// A ~2-minute smoke run with small sizes (the numbers are noisier).
    #[arg(long)]
    pub quick: bool,
    /// Only the cases whose label contains this text (e.g. "naive", "amqp");
    /// several texts separated by commas, `=label` for one exact label.
    #[arg(long)]
    pub only: Option<String>,
    /// The scale grid instead of the default run: 0, 1M, 10M and 50M stored
    /// keys at 1, 4 and 16 topic partitions, msg/s and paced p99 per row
    /// (fills the prefilled schemas once: ~20 GB, tens of minutes).
    #[arg(long)]
    pub scale: bool,
    #[command(flatten)]
    pub brokers: crate::cli::BrokerArgs,
    /// Logs of the case processes.
    #[arg(long, default_value = "/var/tmp/dedupq-bench")]
    pub workdir: PathBuf,
    /// Internal: run one measurement in this process and print its result.
    #[arg(long, hide = true)]
    pub case: Option<String>,
}
