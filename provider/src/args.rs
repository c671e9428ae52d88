use crate::Compare;
use std::net::SocketAddr;
use std::time::Duration;

/// The `dedupq-provider` command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "dedupq-provider",
    version,
    about = "Run the payment-provider simulator (charges once per Idempotency-Key)"
)]
pub struct Args {
    /// Where to serve the simulator's HTTP API.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    /// The PostgreSQL database holding the simulator's charges.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres:postgres@127.0.0.1:5432/postgres",
        hide_env_values = true
    )]
    pub database_url: String,
    /// Schema for the simulator's charges, in that database.
    #[arg(long, default_value = "dedupq_provider")]
    pub schema: String,
    /// Delay between recording a charge and answering (e.g. 300ms).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub latency: Duration,
    /// Share of requests answered 503 before charging (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,
    /// Share of charges declined with 402 (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub decline_rate: f64,
    /// Share of requests that charge and then never answer (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub hang_after_charge_rate: f64,
    /// Charge on every request, ignoring Idempotency-Key.
    #[arg(long)]
    pub ignore_keys: bool,
    /// How a repeated key's body is compared with the first: json
    /// (canonical JSON) or bytes (any byte difference answers 422).
    #[arg(long, value_enum, default_value = "json")]
    pub compare: Compare,
    /// How long a slow request runs after charging before it answers (see
    /// --slow-after-charge-rate).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub slow_after_charge: Duration,
    /// Share of requests that charge, then answer only after
    /// --slow-after-charge (0..1); a repeat meanwhile gets 409.
    #[arg(long, default_value_t = 0.0)]
    pub slow_after_charge_rate: f64,
}

impl Args {
    /// The knobs these flags set (the rest at their defaults).
    pub fn knobs(&self) -> crate::Knobs {
        crate::Knobs {
            latency: self.latency,
            fail_rate: self.fail_rate,
            decline_rate: self.decline_rate,
            hang_after_charge_rate: self.hang_after_charge_rate,
            slow_after_charge: self.slow_after_charge,
            slow_after_charge_rate: self.slow_after_charge_rate,
            compare: self.compare,
            honour_keys: !self.ignore_keys,
            ..Default::default()
        }
    }
}
