//! After a scenario: every key charged once, every message accounted for,
//! no offset committed ahead of an unfinished message.

use super::publish::Coordinates;
use anyhow::Context;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;
use sqlx::{PgPool, Row};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// One key row as the check needs it.
#[derive(Debug, Clone)]
pub(super) struct KeyState {
    pub status: String,
    pub attempts: i32,
    /// The charge the stored answer names (`"id": "ch_…"`).
    pub charge_id: Option<String>,
    /// `unknown` after the last attempt: held for an operator.
    pub held: bool,
}

pub(super) async fn key_states(pool: &PgPool) -> anyhow::Result<HashMap<String, KeyState>> {
    let rows = super::pg_faults::through_restarts(|| {
        sqlx::query(
            "SELECT tenant, key, status, attempts, result_body, \
                    (status = 'unknown' AND lease_until IS NULL) AS held \
             FROM dedupq_keys",
        )
        .fetch_all(pool)
    })
    .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let derived = format!(
                "{}:{}",
                r.get::<String, _>("tenant"),
                r.get::<String, _>("key")
            );
            let body: Option<Vec<u8>> = r.get("result_body");
            (
                derived,
                KeyState {
                    status: r.get("status"),
                    attempts: r.get("attempts"),
                    charge_id: body.as_deref().and_then(charge_id),
                    held: r.get("held"),
                },
            )
        })
        .collect())
}

/// The `"id"` a provider answer names. Answers are stored as the provider
/// sent them, which need not be JSON (raw NUL, bytes that are not UTF-8):
/// then the first `"id":"…"` in the bytes.
pub(super) fn charge_id(body: &[u8]) -> Option<String> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return v.get("id")?.as_str().map(str::to_string);
    }
    let marker = br#""id":""#;
    let start = body.windows(marker.len()).position(|w| w == marker)? + marker.len();
    let len = body[start..].iter().position(|b| *b == b'"')?;
    String::from_utf8(body[start..start + len].to_vec()).ok()
}

#[derive(Debug, Clone, serde::Deserialize)]
pub(super) struct ChargeRow {
    pub id: i64,
    pub idempotency_key: Option<String>,
    pub attempt: Option<i32>,
    /// The claim's fencing epoch, as the request carried it.
    #[serde(default)]
    pub epoch: Option<i64>,
    pub owner: Option<String>,
    pub state: String,
    /// When the provider recorded it, on PostgreSQL's clock (the one
    /// leases are compared on: the ledger lives in the same server).
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl ChargeRow {
    /// The pid inside the owner name `host-pid-nonce`.
    fn owner_pid(&self) -> Option<u32> {
        self.owner.as_deref()?.rsplit('-').nth(1)?.parse().ok()
    }
}

/// What the provider's ledger holds for one idempotency key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Ledgered {
    /// Charges that moved money.
    pub charged: i64,
    /// Requests the provider refused (a declined card).
    pub declined: i64,
}

/// `GET /stats/keys`, per idempotency key.
pub(super) async fn ledger(provider: &str) -> anyhow::Result<HashMap<String, Ledgered>> {
    let keys: Vec<dedupq_provider::KeyCharges> = reqwest::get(format!("{provider}/stats/keys"))
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(keys
        .into_iter()
        .map(|k| {
            let declined = k.charges.iter().filter(|c| c.state == "declined").count();
            let entry = Ledgered {
                charged: k.charged,
                declined: declined as i64,
            };
            (k.idempotency_key, entry)
        })
        .collect())
}

pub(super) async fn charges(provider: &str) -> anyhow::Result<Vec<ChargeRow>> {
    let v: Value = reqwest::get(format!("{provider}/charges"))
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(serde_json::from_value(v["charges"].clone())?)
}

#[derive(Debug, Default)]
pub struct ChargeCheck {
    pub charged_keys: usize,
    /// Keys charged twice under one claim attempt, or without a claim: a
    /// dedup failure.
    pub double_charged: Vec<String>,
    /// Extra charges made by an attempt that was then abandoned (killed
    /// after the charge, or no answer): a provider that honours keys
    /// absorbs these; one that does not, cannot be protected from them.
    pub repeated_after_abandoned_attempt: usize,
    /// Of those, made by a process the scenario then SIGKILLed.
    pub repeated_by_killed_process: usize,
    pub missing: Vec<String>,
    pub unfinished: Vec<String>,
    /// Stored `failed` while the provider's ledger shows the charge.
    pub failed_but_charged: Vec<String>,
    /// Stored `done` with no charge in the provider's ledger.
    pub done_but_not_charged: Vec<String>,
    /// Stored `done`, charged, but the stored answer names no charge: the
    /// provider's answer (the charge's id) was lost.
    pub answer_lost: Vec<String>,
    /// Stored `failed`, and the provider agrees (it declined, no charge).
    pub failed_declined: usize,
    /// Stored `failed`, though the provider neither charged nor refused
    /// it: nothing it said can have made the payment fail.
    pub failed_not_refused: Vec<String>,
    /// Charged, and not stored `done` (stored failed, left open, or held).
    pub charged_not_done: usize,
    /// A charge by an attempt recorded after a charge by a later attempt
    /// of the same key: the later attempt claimed only once the earlier
    /// one's lease had ended, so the earlier one called on an ended lease.
    /// Only visible when the provider ignores keys (otherwise the second
    /// call is answered with the first charge and leaves no row), and
    /// proof only while the provider records requests as they arrive.
    pub calls_out_of_order: Vec<String>,
    /// Calls a frozen process made once its lease had ended (see
    /// `calls_after_freeze`).
    pub calls_after_freeze: Vec<String>,
    /// Held `unknown` for an operator, each with the provider's charge
    /// count: legitimate, never hidden.
    pub held: Vec<String>,
}

/// `expected`: the derived keys (`tenant:key`) of every unique payment;
/// `ledger`: what the provider's ledger holds, per derived key.
pub(super) fn check_charges(
    expected: &[String],
    keys: &HashMap<String, KeyState>,
    charges: &[ChargeRow],
    ledger: &HashMap<String, Ledgered>,
    killed: &[u32],
) -> ChargeCheck {
    let mut by_key: HashMap<&str, Vec<&ChargeRow>> = HashMap::new();
    for c in charges.iter().filter(|c| c.state != "declined") {
        if let Some(k) = c.idempotency_key.as_deref() {
            by_key.entry(k).or_default().push(c);
        }
    }
    let mut out = ChargeCheck {
        calls_out_of_order: calls_out_of_order(&by_key),
        ..ChargeCheck::default()
    };
    for key in expected {
        let Some(state) = keys.get(key) else {
            out.missing.push(key.clone());
            continue;
        };
        let Ledgered { charged, declined } = ledger.get(key).copied().unwrap_or_default();
        if charged > 0 && state.status != "done" {
            out.charged_not_done += 1;
        }
        match state.status.as_str() {
            "done" if charged == 0 => {
                out.done_but_not_charged.push(key.clone());
                continue;
            }
            "done" => {}
            "failed" if charged > 0 => {
                out.failed_but_charged
                    .push(format!("{key}: the provider charged it {charged} time(s)"));
                continue;
            }
            "failed" if declined > 0 => {
                out.failed_declined += 1;
                continue;
            }
            "failed" => {
                out.failed_not_refused.push(format!(
                    "{key}: the provider has neither a charge nor a refusal"
                ));
                continue;
            }
            "unknown" if state.held => {
                let says = match charged {
                    0 => "the provider has no charge".to_string(),
                    n => format!("the provider charged it {n} time(s)"),
                };
                out.held.push(format!("{key}: held unknown; {says}"));
                continue;
            }
            other => {
                out.unfinished.push(format!("{key} ({other})"));
                continue;
            }
        }
        let made = by_key.get(key.as_str()).cloned().unwrap_or_default();
        if made.is_empty() {
            out.missing.push(key.clone());
            continue;
        }
        out.charged_keys += 1;
        let mut per_attempt: BTreeMap<i32, usize> = BTreeMap::new();
        for c in &made {
            *per_attempt.entry(c.attempt.unwrap_or(0)).or_default() += 1;
        }
        let Some(stored) = state.charge_id.as_deref() else {
            out.answer_lost.push(format!(
                "{key}: stored done, and the stored answer names no charge"
            ));
            continue;
        };
        if !made.iter().any(|c| format!("ch_{}", c.id) == stored) {
            out.double_charged.push(format!(
                "{key}: the stored result names {stored}, not a charge of this key"
            ));
            continue;
        }
        let twice_in_one_attempt = per_attempt.values().any(|n| *n > 1);
        let beyond_claims = per_attempt.keys().any(|a| *a > state.attempts || *a < 1);
        if twice_in_one_attempt || beyond_claims {
            out.double_charged.push(format!(
                "{key}: charges per attempt {per_attempt:?}, claims {}",
                state.attempts
            ));
        } else {
            out.repeated_after_abandoned_attempt += made.len() - 1;
            out.repeated_by_killed_process += made
                .iter()
                .filter(|c| format!("ch_{}", c.id) != stored)
                .filter(|c| c.owner_pid().is_some_and(|pid| killed.contains(&pid)))
                .count();
        }
    }
    out
}

/// Per key, the charges (in the order the provider recorded them) whose
/// attempt is lower than that of a charge recorded before them.
fn calls_out_of_order(by_key: &HashMap<&str, Vec<&ChargeRow>>) -> Vec<String> {
    let mut out = Vec::new();
    for (key, made) in by_key {
        let mut made = made.clone();
        made.sort_by_key(|c| c.id);
        let mut latest: Option<&ChargeRow> = None;
        for c in made {
            let attempt = c.attempt.unwrap_or(0);
            match latest {
                Some(l) if attempt < l.attempt.unwrap_or(0) => out.push(format!(
                    "{key}: ch_{} by attempt {attempt} ({}) after ch_{} by attempt {}",
                    c.id,
                    c.owner.as_deref().unwrap_or("?"),
                    l.id,
                    l.attempt.unwrap_or(0)
                )),
                Some(l) if attempt <= l.attempt.unwrap_or(0) => {}
                _ => latest = Some(c),
            }
        }
    }
    out.sort();
    out
}

/// A claim a frozen process held, as PostgreSQL had it once the process
/// could renew no more.
#[derive(Debug, Clone)]
pub(super) struct FrozenClaim {
    pub derived_key: String,
    pub owner: String,
    pub attempt: i32,
    /// Names the claim: its attempt number goes to the next claim when the
    /// process gives the key back without calling.
    pub epoch: i64,
    pub lease_until: chrono::DateTime<chrono::Utc>,
}

/// How long after a lease's end a request sent just before it may still
/// reach the provider's ledger (a loaded machine, the provider's pool).
const IN_TRANSIT: chrono::TimeDelta = chrono::TimeDelta::seconds(1);

/// Charges a frozen process's attempt made well after that attempt's lease
/// had ended, of keys another attempt claimed since: the process started a
/// provider call after the stall without re-checking its lease in
/// PostgreSQL (DESIGN, invariant 8). Had it re-checked and found its claim
/// still there, its lease would have been live again and no other attempt
/// could have claimed the key while the call ran, so such a call (on a key
/// nobody else claimed) is not counted.
pub(super) fn calls_after_freeze(
    frozen: &[FrozenClaim],
    charges: &[ChargeRow],
    keys: &HashMap<String, KeyState>,
) -> Vec<String> {
    let mut out = Vec::new();
    for claim in frozen {
        let claimed_again = keys
            .get(&claim.derived_key)
            .is_some_and(|k| k.attempts > claim.attempt);
        for c in charges.iter().filter(|c| {
            claimed_again
                && c.idempotency_key.as_deref() == Some(claim.derived_key.as_str())
                && c.owner.as_deref() == Some(claim.owner.as_str())
                && c.epoch == Some(claim.epoch)
                && c.created_at > claim.lease_until + IN_TRANSIT
        }) {
            out.push(format!(
                "{}: ch_{} by attempt {} at {}, its lease ended at {}",
                claim.derived_key,
                c.id,
                claim.attempt,
                c.created_at.format("%H:%M:%S%.3f"),
                claim.lease_until.format("%H:%M:%S%.3f")
            ));
        }
    }
    out
}

fn kafka_consumer(brokers: &str, group: &str) -> anyhow::Result<BaseConsumer> {
    dedupq::broker::kafka::reader(&dedupq::config::KafkaSettings::at(brokers), group)
        .create()
        .context("creating a Kafka consumer for checks")
}

/// (committed offset, high watermark) per partition of `topic` for `group`.
pub(super) fn committed_and_end(
    brokers: &str,
    topic: &str,
    group: &str,
    partitions: i32,
) -> anyhow::Result<Vec<(i64, i64)>> {
    let consumer = kafka_consumer(brokers, group)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    (0..partitions)
        .map(|p| {
            let c = match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => 0,
            };
            let (_, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
            Ok((c, high))
        })
        .collect()
}

/// Messages below a sampled committed offset whose key is still open: a
/// commit ran ahead of an unfinished message. Sound because key rows only
/// move forward: a key open now was open when the offset was committed.
pub(super) fn commits_ahead(
    committed: &[(i64, i64)],
    published: &BTreeMap<Coordinates, Option<String>>,
    keys: &HashMap<String, KeyState>,
) -> Vec<String> {
    published
        .iter()
        .filter(|(at, _)| {
            committed
                .get(at.partition as usize)
                .is_some_and(|(c, _)| at.offset < *c)
        })
        .filter_map(|(at, key)| {
            let key = key.as_ref()?;
            // A key held `unknown` is settled as far as the broker goes:
            // its dead letter is published, duplicates are answered.
            let open = keys
                .get(key)
                .is_none_or(|s| s.status == "in_progress" || (s.status == "unknown" && !s.held));
            open.then(|| {
                format!(
                    "partition {} offset {} ({key}) committed while open",
                    at.partition, at.offset
                )
            })
        })
        .collect()
}

/// Ready messages in each RabbitMQ queue (0 for a queue that is absent).
pub(super) async fn amqp_depths(url: &str, queues: &[String]) -> anyhow::Result<Vec<u32>> {
    let settings = dedupq::config::AmqpSettings::at(url);
    let conn = dedupq::broker::amqp::connect(&settings, "dedupq-scenario-check").await?;
    let mut out = Vec::new();
    for q in queues {
        let channel = conn.create_channel().await?;
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let depth = match channel
            .queue_declare(q.as_str().into(), options, FieldTable::default())
            .await
        {
            Ok(queue) => queue.message_count(),
            Err(_) => 0,
        };
        let _ = channel.close(200, "checked".into()).await;
        out.push(depth);
    }
    let _ = conn.close(200, "checked".into()).await;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(status: &str, held: bool, charge: Option<&str>) -> KeyState {
        KeyState {
            status: status.into(),
            attempts: 1,
            charge_id: charge.map(str::to_string),
            held,
        }
    }

    fn charge(id: i64, key: &str) -> ChargeRow {
        ChargeRow {
            id,
            idempotency_key: Some(key.into()),
            attempt: Some(1),
            epoch: Some(3),
            owner: None,
            state: "succeeded".into(),
            created_at: chrono::DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn every_stored_outcome_is_held_against_the_providers_ledger() {
        let expected: Vec<String> = [
            "t:ok",
            "t:lost",
            "t:failed-charged",
            "t:failed",
            "t:declined",
            "t:done-free",
            "t:held-charged",
            "t:held-free",
            "t:open",
            "t:absent",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let keys: HashMap<String, KeyState> = [
            ("t:ok", key("done", false, Some("ch_1"))),
            ("t:lost", key("done", false, None)),
            ("t:failed-charged", key("failed", false, None)),
            ("t:failed", key("failed", false, None)),
            ("t:declined", key("failed", false, None)),
            ("t:done-free", key("done", false, Some("ch_9"))),
            ("t:held-charged", key("unknown", true, None)),
            ("t:held-free", key("unknown", true, None)),
            ("t:open", key("in_progress", false, None)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let charges = vec![
            charge(1, "t:ok"),
            charge(4, "t:lost"),
            charge(2, "t:failed-charged"),
            charge(3, "t:held-charged"),
        ];
        let charged = Ledgered {
            charged: 1,
            declined: 0,
        };
        let refused = Ledgered {
            charged: 0,
            declined: 1,
        };
        let ledger: HashMap<String, Ledgered> = [
            ("t:ok", charged),
            ("t:lost", charged),
            ("t:failed-charged", charged),
            ("t:held-charged", charged),
            ("t:declined", refused),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();

        let out = check_charges(&expected, &keys, &charges, &ledger, &[]);
        assert_eq!(out.charged_keys, 2, "ok and lost");
        assert_eq!(out.failed_but_charged.len(), 1);
        assert!(out.failed_but_charged[0].starts_with("t:failed-charged"));
        assert_eq!(out.failed_declined, 1);
        assert_eq!(out.failed_not_refused.len(), 1);
        assert!(out.failed_not_refused[0].starts_with("t:failed:"));
        assert_eq!(out.charged_not_done, 2, "failed-charged and held-charged");
        assert_eq!(out.done_but_not_charged, vec!["t:done-free".to_string()]);
        assert_eq!(out.held.len(), 2);
        assert!(out
            .held
            .iter()
            .any(|h| h.starts_with("t:held-free") && h.contains("no charge")));
        assert!(out
            .held
            .iter()
            .any(|h| h.starts_with("t:held-charged") && h.contains("charged it 1")));
        assert_eq!(out.unfinished, vec!["t:open (in_progress)".to_string()]);
        assert_eq!(out.missing, vec!["t:absent".to_string()]);
        assert!(out.double_charged.is_empty());
        assert_eq!(out.answer_lost.len(), 1);
        assert!(out.answer_lost[0].starts_with("t:lost"));
    }

    #[test]
    fn a_charge_by_an_earlier_attempt_recorded_after_a_later_attempts_is_a_call_on_an_ended_lease()
    {
        let by = |id: i64, key: &str, attempt: i32| ChargeRow {
            attempt: Some(attempt),
            owner: Some(format!("host-{}-x", 100 + attempt)),
            ..charge(id, key)
        };
        let charges = [
            by(1, "t:stale", 1),
            by(2, "t:stale", 2),
            by(3, "t:stale", 1),
            by(4, "t:in-order", 1),
            by(5, "t:in-order", 2),
            by(6, "t:in-order", 2),
        ];
        let mut by_key: HashMap<&str, Vec<&ChargeRow>> = HashMap::new();
        for c in &charges {
            by_key
                .entry(c.idempotency_key.as_deref().unwrap_or_default())
                .or_default()
                .push(c);
        }
        assert_eq!(
            calls_out_of_order(&by_key),
            vec!["t:stale: ch_3 by attempt 1 (host-101-x) after ch_2 by attempt 2".to_string()]
        );
    }

    #[test]
    fn a_frozen_attempt_charging_well_after_its_lease_ended_on_a_key_claimed_since_is_a_call_on_an_ended_lease(
    ) {
        let at = |s: i64| chrono::DateTime::UNIX_EPOCH + chrono::TimeDelta::seconds(s);
        let claim = |key: &str| FrozenClaim {
            derived_key: key.into(),
            owner: "host-7-x".into(),
            attempt: 1,
            epoch: 3,
            lease_until: at(100),
        };
        let frozen = [
            claim("t:late"),
            claim("t:in-time"),
            claim("t:other"),
            claim("t:revalidated"),
            claim("t:given-back"),
        ];
        let keys: HashMap<String, KeyState> = [
            ("t:late", 2),
            ("t:in-time", 2),
            ("t:other", 2),
            ("t:revalidated", 1),
            ("t:given-back", 2),
        ]
        .into_iter()
        .map(|(k, attempts)| {
            let state = KeyState {
                attempts,
                ..key("done", false, None)
            };
            (k.to_string(), state)
        })
        .collect();
        let by = |id: i64, key: &str, owner: &str, secs: i64| ChargeRow {
            owner: Some(owner.into()),
            created_at: at(secs),
            ..charge(id, key)
        };
        let charges = [
            by(1, "t:late", "host-7-x", 105),
            by(2, "t:in-time", "host-7-x", 100),
            by(3, "t:other", "host-8-y", 105),
            by(4, "t:revalidated", "host-7-x", 105),
            // Given back unasked after the freeze (its attempt refunded),
            // then claimed again by the same process: the same attempt
            // number, a new epoch, a live lease.
            ChargeRow {
                epoch: Some(4),
                ..by(5, "t:given-back", "host-7-x", 105)
            },
        ];
        let found = calls_after_freeze(&frozen, &charges, &keys);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("t:late: ch_1 by attempt 1"));
    }

    #[test]
    fn the_charge_a_stored_answer_names_is_found_in_json_and_in_raw_bytes() {
        assert_eq!(
            charge_id(br#"{"id":"ch_7","note":"a\u0000b"}"#).as_deref(),
            Some("ch_7")
        );
        assert_eq!(
            charge_id(b"{\"id\":\"ch_8\",\"note\":\"before\x00\xff\xfeafter\"}").as_deref(),
            Some("ch_8")
        );
        assert_eq!(charge_id(b"\xff\xfe"), None);
    }
}
