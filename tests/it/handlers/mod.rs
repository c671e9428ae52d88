//! The http/payment handler against the provider simulator over real HTTP,
//! with the engine and a real PostgreSQL.

mod config_faults;
mod derived_keys;
mod exact_request;
mod first_request;
mod forwarder;
mod lookup;
mod lookup_start;
mod provider_faults;
mod provider_latency;
mod redirects;
mod simulator;
mod simulator_answers;
mod simulator_bodies;
mod simulator_ledger;
mod simulator_running;
mod simulator_start;
mod tls_rotation;
mod tls_target;
mod unknown_outcomes;

use crate::support;
use crate::support::process::Provider;
use dedupq::engine::{Decision, Engine, Outcome, Unavailable};
use std::sync::Arc;
use std::time::Duration;

/// An engine whose handler POSTs to `provider` with the derived key.
pub async fn payment_engine(provider: &Provider, timeout: Duration) -> Engine {
    let (store, _) = support::isolated_store().await;
    let handler = support::http_handler(&provider.charges_url(), timeout);
    support::engine(&store, Arc::new(handler), support::fast_options())
}

/// Delivers `msg` until it is no longer retried, as a transport would.
pub async fn deliver_until_settled(
    engine: &Engine,
    msg: &dedupq::engine::Incoming,
) -> Vec<Decision> {
    let mut seen = Vec::new();
    for _ in 0..50 {
        let d = match engine.process(std::slice::from_ref(msg)).await {
            Ok(d) => d,
            // Paused for a provider outage: wait as asked, as a transport does.
            Err(Unavailable::Provider { retry_after }) => {
                tokio::time::sleep(retry_after).await;
                continue;
            }
            Err(e) => panic!("store reachable: {e}"),
        };
        let settled = !matches!(
            d[0].outcome,
            Outcome::Retried | Outcome::Unknown | Outcome::InFlight
        );
        seen.push(d[0].clone());
        if settled {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "message never settled: {:?}",
        seen.iter().map(|d| d.outcome).collect::<Vec<_>>()
    );
}
