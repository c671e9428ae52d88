//! What the simulator's ledger says: charges as listed, the lookup a
//! reconciler asks, and counts a checker compares with dedupq's key table.

use super::ledger::{stored_answer, Answer, Ledger};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::Row;

/// One charge as `GET /charges` lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Charge {
    pub id: i64,
    pub owner: Option<String>,
    pub attempt: Option<i32>,
    /// The claim's fencing epoch (`X-Dedupq-Epoch`).
    pub epoch: Option<i64>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub answered_at: Option<chrono::DateTime<chrono::Utc>>,
    pub idempotency_key: Option<String>,
    /// False once the provider forgot its keys.
    pub remembered: bool,
    pub tenant: Option<String>,
    /// The request body exactly as received (only JSON is charged, so it
    /// is always UTF-8).
    pub request: String,
    pub content_type: Option<String>,
    /// The request body parsed (numbers through f64: use `request` for the
    /// exact text).
    pub body: Value,
    pub state: String,
    /// The answer parsed, or null when it is not JSON.
    pub response: Option<Value>,
    pub response_type: Option<String>,
    /// The W3C trace context the request carried.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// What a retry of a key would be answered, for `GET /charges/lookup`.
pub(crate) enum Lookup {
    Unknown,
    Running,
    Finished(Answer),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stats {
    /// Charges that moved money (pending or succeeded).
    pub charges: i64,
    pub declined: i64,
    /// Distinct idempotency keys among charges.
    pub keys: i64,
    /// Payments charged more than once (a payment: tenant and the body's
    /// `payment_id`, or the whole body when it has none).
    pub double_charged: i64,
}

/// One idempotency key's charges, oldest first, for `GET /stats/keys`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyCharges {
    /// The key as received (dedupq's derived key).
    pub idempotency_key: String,
    /// The key split at its first `:` (dedupq's `{tenant}:{key}` form).
    pub tenant: Option<String>,
    pub key: Option<String>,
    /// Charges that moved money.
    pub charged: i64,
    pub charges: Vec<ChargeState>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChargeState {
    /// `ch_<n>`, as the answer names it.
    pub id: String,
    pub state: String,
    pub remembered: bool,
}

impl Ledger {
    pub(crate) async fn list(
        &self,
        key: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<Vec<Charge>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT id, idempotency_key, remembered, tenant, request, content_type, state, response, \
               response_type, owner, attempt, epoch, created_at, answered_at, traceparent, tracestate \
             FROM provider_charges \
             WHERE ($1::text IS NULL OR idempotency_key = $1) AND ($2::text IS NULL OR tenant = $2) \
             ORDER BY id",
        )
        .bind(key)
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(charge).collect())
    }

    /// What the first remembered charge with `key` would answer a retry.
    pub(crate) async fn lookup(&self, key: &str) -> Result<Lookup, sqlx::Error> {
        let row = sqlx::query(
            "SELECT state, response, response_type, response_status FROM provider_charges \
             WHERE idempotency_key = $1 AND remembered ORDER BY id LIMIT 1",
        )
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match row.as_ref().map(stored_answer) {
            None => Lookup::Unknown,
            Some(None) => Lookup::Running,
            Some(Some(answer)) => Lookup::Finished(answer),
        })
    }

    pub(crate) async fn stats(&self) -> Result<Stats, sqlx::Error> {
        let row = sqlx::query(
            "SELECT count(*) FILTER (WHERE state <> 'declined') AS charges, \
                    count(*) FILTER (WHERE state = 'declined') AS declined, \
                    count(DISTINCT idempotency_key) FILTER (WHERE state <> 'declined') AS keys, \
                    (SELECT count(*) FROM (SELECT 1 FROM provider_charges WHERE state <> 'declined' \
                        GROUP BY tenant, coalesce(payment_id, body_hash) HAVING count(*) > 1) d) \
                        AS double_charged \
             FROM provider_charges",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Stats {
            charges: row.get("charges"),
            declined: row.get("declined"),
            keys: row.get("keys"),
            double_charged: row.get("double_charged"),
        })
    }

    /// Every idempotency key (of `tenant`, if given) with its charges.
    pub(crate) async fn per_key(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<KeyCharges>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT idempotency_key, \
                    count(*) FILTER (WHERE state <> 'declined') AS charged, \
                    array_agg(id ORDER BY id) AS ids, \
                    array_agg(state ORDER BY id) AS states, \
                    array_agg(remembered ORDER BY id) AS remembered \
             FROM provider_charges \
             WHERE idempotency_key IS NOT NULL AND ($1::text IS NULL OR tenant = $1) \
             GROUP BY idempotency_key ORDER BY idempotency_key",
        )
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(key_charges).collect())
    }
}

fn charge(r: &sqlx::postgres::PgRow) -> Charge {
    let request: Vec<u8> = r.get("request");
    let response: Option<Vec<u8>> = r.get("response");
    Charge {
        id: r.get("id"),
        owner: r.get("owner"),
        attempt: r.get("attempt"),
        epoch: r.get("epoch"),
        created_at: r.get("created_at"),
        answered_at: r.get("answered_at"),
        idempotency_key: r.get("idempotency_key"),
        remembered: r.get("remembered"),
        tenant: r.get("tenant"),
        body: serde_json::from_slice(&request).unwrap_or(Value::Null),
        request: String::from_utf8_lossy(&request).into_owned(),
        content_type: r.get("content_type"),
        state: r.get("state"),
        response: response.and_then(|b| serde_json::from_slice(&b).ok()),
        response_type: r.get("response_type"),
        traceparent: r.get("traceparent"),
        tracestate: r.get("tracestate"),
    }
}

fn key_charges(r: &sqlx::postgres::PgRow) -> KeyCharges {
    let idempotency_key: String = r.get("idempotency_key");
    let (tenant, key) = match idempotency_key.split_once(':') {
        Some((t, k)) => (Some(t.to_string()), Some(k.to_string())),
        None => (None, None),
    };
    let ids: Vec<i64> = r.get("ids");
    let states: Vec<String> = r.get("states");
    let remembered: Vec<bool> = r.get("remembered");
    KeyCharges {
        idempotency_key,
        tenant,
        key,
        charged: r.get("charged"),
        charges: ids
            .into_iter()
            .zip(states)
            .zip(remembered)
            .map(|((id, state), remembered)| ChargeState {
                id: format!("ch_{id}"),
                state,
                remembered,
            })
            .collect(),
    }
}
