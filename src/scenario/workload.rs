//! A stream of payment commands with the duplicates real pipelines see:
//! concurrent copies, delayed retries, copies across transports, producer
//! re-publishes to other partitions, a redelivery storm, plus poison and
//! conflicting messages. Seeded, so a run can be reproduced.

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// Produced with the idempotency key as the Kafka message key.
    Kafka,
    /// Produced without a message key: lands on any partition, as a
    /// producer that re-publishes through another path would.
    KafkaUnkeyed,
    Amqp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    First,
    Concurrent,
    Delayed,
    Republish,
    Storm,
    Conflict,
    Invalid,
}

impl Kind {
    pub fn is_duplicate(self) -> bool {
        matches!(
            self,
            Kind::Concurrent | Kind::Delayed | Kind::Republish | Kind::Storm
        )
    }
}

#[derive(Debug, Clone)]
pub struct Planned {
    /// When to publish, from the start of the run.
    pub at: Duration,
    pub route: Route,
    pub kind: Kind,
    pub tenant: Option<String>,
    pub key: Option<String>,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    pub seed: u64,
    pub run_id: String,
    pub unique_keys: usize,
    pub total_messages: usize,
    pub tenants: usize,
    pub conflicts: usize,
    pub invalid: usize,
    pub publish_for: Duration,
}

pub struct Workload {
    pub messages: Vec<Planned>,
}

fn body(key: &str, amount: u64, currency: &str, recipient: &str) -> Vec<u8> {
    json!({
        "payment_id": key,
        "amount": amount,
        "currency": currency,
        "recipient": recipient,
        "purpose": "invoice",
        // Differs on every copy; excluded from the fingerprint by default.
        "sent_at": chrono::Utc::now().to_rfc3339(),
    })
    .to_string()
    .into_bytes()
}

impl Workload {
    pub fn generate(spec: &WorkloadSpec) -> Self {
        let mut rng = StdRng::seed_from_u64(spec.seed);
        let span = spec.publish_for.as_secs_f64();
        let at = |rng: &mut StdRng, from: f64, to: f64| {
            Duration::from_secs_f64(rng.random_range(from..to).max(0.0))
        };
        let mut messages = Vec::with_capacity(spec.total_messages + spec.invalid + spec.conflicts);
        let mut firsts = Vec::with_capacity(spec.unique_keys);
        for i in 0..spec.unique_keys {
            let tenant = format!("tenant-{}", i % spec.tenants.max(1));
            let key = format!("pay-{}-{i:06}", spec.run_id);
            let amount = rng.random_range(100..500_000u64);
            let currency = *["EUR", "USD", "GBP"].choose(&mut rng).unwrap_or(&"EUR");
            let recipient = format!("acct-{}", rng.random_range(1000..9999));
            let route = if rng.random_bool(0.5) {
                Route::Kafka
            } else {
                Route::Amqp
            };
            let p = Planned {
                at: at(&mut rng, 0.0, span * 0.7),
                route,
                kind: Kind::First,
                tenant: Some(tenant),
                key: Some(key.clone()),
                body: body(&key, amount, currency, &recipient),
            };
            firsts.push((p.clone(), amount, currency, recipient));
            messages.push(p);
        }
        while messages.len() < spec.total_messages && !firsts.is_empty() {
            let (first, ..) = &firsts[rng.random_range(0..firsts.len())];
            let mut copy = first.clone();
            let roll: f64 = rng.random();
            let other = if first.route == Route::Amqp {
                Route::Kafka
            } else {
                Route::Amqp
            };
            (copy.kind, copy.at, copy.route) = if roll < 0.35 {
                let route = if rng.random_bool(0.5) {
                    other
                } else {
                    first.route
                };
                (Kind::Concurrent, first.at, route)
            } else if roll < 0.70 {
                let route = if rng.random_bool(0.5) {
                    other
                } else {
                    first.route
                };
                (Kind::Delayed, first.at + at(&mut rng, 1.0, 20.0), route)
            } else if roll < 0.85 {
                (
                    Kind::Republish,
                    first.at + at(&mut rng, 0.0, 5.0),
                    Route::KafkaUnkeyed,
                )
            } else {
                let route = *[Route::Kafka, Route::KafkaUnkeyed, Route::Amqp]
                    .choose(&mut rng)
                    .unwrap_or(&Route::Kafka);
                (Kind::Storm, at(&mut rng, span * 0.85, span), route)
            };
            messages.push(copy);
        }
        for (first, amount, currency, recipient) in firsts.iter().take(spec.conflicts) {
            let key = first.key.clone().unwrap_or_default();
            messages.push(Planned {
                at: first.at + Duration::from_secs(30).min(spec.publish_for),
                kind: Kind::Conflict,
                body: body(&key, amount + 1, currency, recipient),
                ..first.clone()
            });
        }
        for i in 0..spec.invalid {
            let route = if i % 2 == 0 {
                Route::Kafka
            } else {
                Route::Amqp
            };
            let (key, body) = match i % 4 {
                0 => (
                    Some(format!("bad-{}-{i}", spec.run_id)),
                    b"{not json".to_vec(),
                ),
                1 => (None, br#"{"amount": 1}"#.to_vec()),
                2 => (Some("k".repeat(300)), br#"{"amount": 1}"#.to_vec()),
                _ => (
                    Some(format!("arr-{}-{i}", spec.run_id)),
                    b"[1, 2, 3]".to_vec(),
                ),
            };
            messages.push(Planned {
                at: at(&mut rng, 0.0, span),
                route,
                kind: Kind::Invalid,
                tenant: Some("tenant-0".into()),
                key,
                body,
            });
        }
        messages.sort_by_key(|m| m.at);
        Self { messages }
    }

    pub fn count(&self, kind: Kind) -> usize {
        self.messages.iter().filter(|m| m.kind == kind).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> WorkloadSpec {
        WorkloadSpec {
            seed: 7,
            run_id: "t".into(),
            unique_keys: 500,
            total_messages: 2000,
            tenants: 5,
            conflicts: 10,
            invalid: 8,
            publish_for: Duration::from_secs(60),
        }
    }

    #[test]
    fn the_workload_has_the_requested_shape_and_is_reproducible() {
        let w = Workload::generate(&spec());
        assert_eq!(w.count(Kind::First), 500);
        assert_eq!(w.messages.len(), 2000 + 10 + 8);
        assert_eq!(w.count(Kind::Conflict), 10);
        assert_eq!(w.count(Kind::Invalid), 8);
        for kind in [
            Kind::Concurrent,
            Kind::Delayed,
            Kind::Republish,
            Kind::Storm,
        ] {
            assert!(w.count(kind) > 100, "{kind:?}: {}", w.count(kind));
        }
        assert!(w.messages.iter().any(|m| m.route == Route::Amqp));
        assert!(w.messages.windows(2).all(|p| p[0].at <= p[1].at));
        let again = Workload::generate(&spec());
        let keys = |w: &Workload| {
            w.messages
                .iter()
                .map(|m| (m.key.clone(), m.route, m.at))
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&w), keys(&again));
    }
}
