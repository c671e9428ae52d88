use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// A ~2-minute smoke run with small sizes (the numbers are noisier).
    #[arg(long)]
    pub quick: bool,
    /// Only the cases whose label contains this text (e.g. "naive", "amqp").
    #[arg(long)]
    pub only: Option<String>,
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_url: String,
    /// Logs of the case processes.
    #[arg(long, default_value = "/var/tmp/dedupq-bench")]
    pub workdir: PathBuf,
    /// Internal: run one measurement in this process and print its result.
    #[arg(long, hide = true)]
    pub case: Option<String>,
}
