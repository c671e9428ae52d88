//! The simulator's charges, in PostgreSQL: the ground truth tests and the
//! demo count effects against.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgPool, Row};

const SCHEMA_SQL: &str = r#"
CREATE TABLE IF NOT EXISTS provider_charges (
    id              bigserial PRIMARY KEY,
    idempotency_key text COLLATE "C",
    tenant          text,
    body            jsonb       NOT NULL,
    body_hash       text        NOT NULL,
    state           text        NOT NULL CHECK (state IN ('pending', 'succeeded', 'declined')),
    response        jsonb,
    -- Who asked (X-Dedupq-Owner / X-Dedupq-Attempt), and whether the answer
    -- was sent: a charge whose answer never left is one the caller could
    -- not know about.
    owner           text,
    attempt         integer,
    created_at      timestamptz NOT NULL DEFAULT now(),
    answered_at     timestamptz
);
CREATE INDEX IF NOT EXISTS provider_charges_by_key ON provider_charges (idempotency_key);
CREATE INDEX IF NOT EXISTS provider_charges_by_body ON provider_charges (body_hash);
"#;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Charge {
    pub id: i64,
    pub owner: Option<String>,
    pub attempt: Option<i32>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub answered_at: Option<chrono::DateTime<chrono::Utc>>,
    pub idempotency_key: Option<String>,
    pub tenant: Option<String>,
    pub body: Value,
    pub state: String,
    pub response: Option<Value>,
}

/// What an earlier request with the same key left behind.
pub enum Existing {
    Pending,
    Finished {
        body_hash: String,
        response: Value,
        declined: bool,
    },
}

pub struct Caller<'a> {
    pub key: Option<&'a str>,
    pub tenant: Option<&'a str>,
    pub owner: Option<&'a str>,
    pub attempt: Option<i32>,
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

#[derive(Clone)]
pub struct Ledger {
    pool: PgPool,
}

impl Ledger {
    pub async fn open(pool: PgPool) -> Result<Self, sqlx::Error> {
        sqlx::raw_sql(SCHEMA_SQL).execute(&pool).await?;
        Ok(Self { pool })
    }

    /// Records a charge unless the key was seen, under a per-key lock so
    /// two concurrent requests with one key cannot both charge. Returns the
    /// new charge id, or what the key already has.
    pub async fn charge_once(
        &self,
        key: &str,
        caller: &Caller<'_>,
        body: &Value,
        body_hash: &str,
        declined: bool,
    ) -> Result<Result<i64, Existing>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(key)
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query(
            "SELECT state, body_hash, response FROM provider_charges \
             WHERE idempotency_key = $1 ORDER BY id LIMIT 1",
        )
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = row {
            let state: String = row.get("state");
            return Ok(Err(match state.as_str() {
                "pending" => Existing::Pending,
                _ => Existing::Finished {
                    body_hash: row.get("body_hash"),
                    response: row
                        .get::<Option<Value>, _>("response")
                        .unwrap_or(Value::Null),
                    declined: state == "declined",
                },
            }));
        }
        let id = self
            .insert(&mut tx, caller, body, body_hash, declined)
            .await?;
        tx.commit().await?;
        Ok(Ok(id))
    }

    /// Records a charge with no idempotency check at all.
    pub async fn charge_always(
        &self,
        caller: &Caller<'_>,
        body: &Value,
        body_hash: &str,
        declined: bool,
    ) -> Result<i64, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        self.insert(&mut conn, caller, body, body_hash, declined)
            .await
    }

    async fn insert(
        &self,
        conn: &mut sqlx::PgConnection,
        caller: &Caller<'_>,
        body: &Value,
        body_hash: &str,
        declined: bool,
    ) -> Result<i64, sqlx::Error> {
        let state = if declined { "declined" } else { "pending" };
        let response = declined.then(|| serde_json::json!({"error": "card_declined"}));
        sqlx::query_scalar(
            "INSERT INTO provider_charges \
             (idempotency_key, tenant, body, body_hash, state, response, owner, attempt, answered_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, CASE WHEN $5 = 'declined' THEN now() END) RETURNING id",
        )
        .bind(caller.key)
        .bind(caller.tenant)
        .bind(body)
        .bind(body_hash)
        .bind(state)
        .bind(response)
        .bind(caller.owner)
        .bind(caller.attempt)
        .fetch_one(conn)
        .await
    }

    /// Marks a charge succeeded; `answered` when the answer is about to be sent.
    pub async fn succeed(
        &self,
        id: i64,
        response: &Value,
        answered: bool,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE provider_charges SET state = 'succeeded', response = $2, \
             answered_at = CASE WHEN $3 THEN now() END WHERE id = $1",
        )
        .bind(id)
        .bind(response)
        .bind(answered)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn list(
        &self,
        key: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<Vec<Charge>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT id, idempotency_key, tenant, body, state, response, owner, attempt, created_at, answered_at \
             FROM provider_charges \
             WHERE ($1::text IS NULL OR idempotency_key = $1) AND ($2::text IS NULL OR tenant = $2) \
             ORDER BY id",
        )
        .bind(key)
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| Charge {
                id: r.get("id"),
                owner: r.get("owner"),
                attempt: r.get("attempt"),
                created_at: r.get("created_at"),
                answered_at: r.get("answered_at"),
                idempotency_key: r.get("idempotency_key"),
                tenant: r.get("tenant"),
                body: r.get("body"),
                state: r.get("state"),
                response: r.get("response"),
            })
            .collect())
    }

    pub async fn stats(&self) -> Result<Stats, sqlx::Error> {
        let row = sqlx::query(
            "SELECT count(*) FILTER (WHERE state <> 'declined') AS charges, \
                    count(*) FILTER (WHERE state = 'declined') AS declined, \
                    count(DISTINCT idempotency_key) FILTER (WHERE state <> 'declined') AS keys, \
                    (SELECT count(*) FROM (SELECT 1 FROM provider_charges WHERE state <> 'declined' \
                        GROUP BY tenant, coalesce(body->>'payment_id', body_hash) HAVING count(*) > 1) d) \
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
}
