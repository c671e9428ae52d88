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
    /// Input no well-behaved producer sends (see `Hostile`); never a
    /// payment, always dead-lettered.
    Hostile,
}

impl Kind {
    pub fn is_duplicate(self) -> bool {
        matches!(
            self,
            Kind::Concurrent | Kind::Delayed | Kind::Republish | Kind::Storm
        )
    }
}

/// Hostile input, and the dead-letter reason it must end with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hostile {
    /// Kafka: a header whose name is not UTF-8.
    KafkaBadHeaderName,
    /// Kafka: `idempotency-key` given twice.
    KafkaTwoKeys,
    /// RabbitMQ: a `message_id` that is not UTF-8 (the client library
    /// cannot parse the delivery: the broker's delivery limit ends it).
    AmqpBadMessageId,
    /// RabbitMQ: a header name that is not UTF-8 (likewise).
    AmqpBadHeaderName,
    /// RabbitMQ: `client-id` and `Client-Id`.
    AmqpTwoTenants,
    /// JSON with a repeated member.
    RepeatedMember,
    /// A body past `identity.max_body_bytes`.
    TooLarge,
}

impl Hostile {
    pub const ALL: [Hostile; 7] = [
        Hostile::KafkaBadHeaderName,
        Hostile::KafkaTwoKeys,
        Hostile::AmqpBadMessageId,
        Hostile::AmqpBadHeaderName,
        Hostile::AmqpTwoTenants,
        Hostile::RepeatedMember,
        Hostile::TooLarge,
    ];

    /// The dead-letter reason: dedupq's `dedupq-reason`, or the broker's
    /// `x-death` reason for what dedupq cannot read.
    pub fn reason(self) -> &'static str {
        match self {
            Hostile::KafkaBadHeaderName => "bad_header",
            Hostile::KafkaTwoKeys | Hostile::AmqpTwoTenants => "duplicate_header",
            Hostile::AmqpBadMessageId | Hostile::AmqpBadHeaderName => "delivery_limit",
            Hostile::RepeatedMember => "duplicate_member",
            Hostile::TooLarge => "too_large",
        }
    }

    fn route(self, i: usize) -> Route {
        match self {
            Hostile::KafkaBadHeaderName | Hostile::KafkaTwoKeys => Route::Kafka,
            Hostile::AmqpBadMessageId | Hostile::AmqpBadHeaderName | Hostile::AmqpTwoTenants => {
                Route::Amqp
            }
            Hostile::RepeatedMember | Hostile::TooLarge if i.is_multiple_of(2) => Route::Kafka,
            Hostile::RepeatedMember | Hostile::TooLarge => Route::Amqp,
        }
    }
}

/// Where a RabbitMQ payment asks for its reply: a queue that refuses
/// every publish, or one that does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplyTo {
    Full,
    Missing,
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
    pub hostile: Option<Hostile>,
    pub reply_to: Option<ReplyTo>,
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
    /// Hostile input: this many messages of each `Hostile` kind, as many
    /// payments padded to just under `max_body_bytes`, and as many
    /// RabbitMQ payments whose `reply_to` refuses (half full, half
    /// missing). 0: none.
    pub hostile_each: usize,
    /// `identity.max_body_bytes` of the run (the size the padded and the
    /// too-large bodies are made for).
    pub max_body_bytes: usize,
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
                hostile: None,
                reply_to: None,
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
                hostile: None,
                reply_to: None,
            });
        }
        hostile(spec, &mut rng, &mut messages);
        messages.sort_by_key(|m| m.at);
        Self { messages }
    }

    pub fn count(&self, kind: Kind) -> usize {
        self.messages.iter().filter(|m| m.kind == kind).count()
    }

    /// Hostile messages by the dead-letter reason they must end with.
    pub fn hostile_reasons(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut out = std::collections::BTreeMap::new();
        for h in self.messages.iter().filter_map(|m| m.hostile) {
            *out.entry(h.reason()).or_default() += 1;
        }
        out
    }
}

/// Adds the hostile input, payments padded to just under the size limit,
/// and payments whose `reply_to` refuses.
fn hostile(spec: &WorkloadSpec, rng: &mut StdRng, out: &mut Vec<Planned>) {
    if spec.hostile_each == 0 {
        return;
    }
    let span = spec.publish_for.as_secs_f64() * 0.8;
    let mut n = 0;
    for kind in Hostile::ALL {
        for i in 0..spec.hostile_each {
            n += 1;
            let key = format!("hostile-{}-{n}", spec.run_id);
            let body = match kind {
                Hostile::RepeatedMember => br#"{"amount":1,"amount":100000}"#.to_vec(),
                Hostile::TooLarge => padded(&key, spec.max_body_bytes + 1 + i),
                _ => body(&key, 1, "EUR", "acct-0"),
            };
            out.push(Planned {
                at: Duration::from_secs_f64(rng.random_range(0.0..span)),
                route: kind.route(i),
                kind: Kind::Hostile,
                tenant: Some("tenant-0".into()),
                key: Some(key),
                body,
                hostile: Some(kind),
                reply_to: None,
            });
        }
    }
    // Payments of their own (no copies, so nothing else competes for
    // their key): bodies one byte under the limit, and RabbitMQ deliveries
    // whose reply address refuses.
    for i in 0..spec.hostile_each * 2 {
        let key = format!("edge-{}-{i}", spec.run_id);
        let (route, body, reply_to) = if i < spec.hostile_each {
            let route = if i % 2 == 0 {
                Route::Kafka
            } else {
                Route::Amqp
            };
            (route, padded(&key, spec.max_body_bytes - 1), None)
        } else {
            let to = if i % 2 == 0 {
                ReplyTo::Full
            } else {
                ReplyTo::Missing
            };
            (
                Route::Amqp,
                body(&key, 1 + i as u64, "EUR", "acct-1"),
                Some(to),
            )
        };
        out.push(Planned {
            at: Duration::from_secs_f64(rng.random_range(0.0..span)),
            route,
            kind: Kind::First,
            tenant: Some(format!("tenant-{}", i % spec.tenants.max(1))),
            key: Some(key),
            body,
            hostile: None,
            reply_to,
        });
    }
}

/// A payment body of exactly `len` bytes.
fn padded(key: &str, len: usize) -> Vec<u8> {
    let head = format!(r#"{{"payment_id":"{key}","amount":1,"currency":"EUR","pad":""#);
    let room = len.saturating_sub(head.len() + 2);
    let mut out = head.into_bytes();
    out.resize(out.len() + room, b'x');
    out.extend_from_slice(b"\"}");
    out
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
            hostile_each: 0,
            max_body_bytes: 1024,
        }
    }

    #[test]
    fn a_hostile_workload_adds_every_kind_of_poison_and_edge_payments() {
        let spec = WorkloadSpec {
            hostile_each: 4,
            ..spec()
        };
        let w = Workload::generate(&spec);
        let reasons = w.hostile_reasons();
        assert_eq!(reasons["delivery_limit"], 8);
        assert_eq!(reasons["duplicate_header"], 8);
        for r in ["bad_header", "duplicate_member", "too_large"] {
            assert_eq!(reasons[r], 4, "{r}");
        }
        let firsts: Vec<&Planned> = w
            .messages
            .iter()
            .filter(|m| m.kind == Kind::First)
            .collect();
        assert_eq!(firsts.len(), 500 + 8);
        let padded = firsts.iter().filter(|m| m.body.len() == 1023).count();
        assert_eq!(padded, 4, "bodies one byte under the limit");
        assert!(firsts
            .iter()
            .filter(|m| m.body.len() == 1023)
            .all(|m| dedupq::json::parse(&m.body).is_ok()));
        assert_eq!(firsts.iter().filter(|m| m.reply_to.is_some()).count(), 4);
        let too_large = w
            .messages
            .iter()
            .filter(|m| m.hostile == Some(Hostile::TooLarge));
        assert!(too_large.into_iter().all(|m| m.body.len() > 1024));
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
