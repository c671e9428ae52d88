//! The simulator's charges, in PostgreSQL: the ground truth tests and the
//! demo count effects against. Requests and answers are kept as the bytes
//! that went over the wire.

use sqlx::{PgPool, Row};

const SCHEMA_SQL: &str = r#"
CREATE TABLE IF NOT EXISTS provider_charges (
    id              bigserial PRIMARY KEY,
    idempotency_key text COLLATE "C",
    -- False once the provider forgot its keys: the charge stays, but a
    -- request with its key no longer finds it (and charges again).
    remembered      boolean     NOT NULL DEFAULT true,
    tenant          text,
    -- The body's payment_id, to count double charges of one payment.
    payment_id      text,
    request         bytea       NOT NULL,
    content_type    text,
    -- SHA-256 of the canonical JSON and of the raw bytes: the two ways a
    -- repeated key's body is compared.
    body_hash       text        NOT NULL,
    request_hash    text        NOT NULL,
    state           text        NOT NULL CHECK (state IN ('pending', 'succeeded', 'declined')),
    response        bytea,
    response_type   text,
    -- Who asked (X-Dedupq-Owner / X-Dedupq-Attempt), and whether the answer
    -- was sent: a charge whose answer never left is one the caller could
    -- not know about.
    owner           text,
    attempt         integer,
    created_at      timestamptz NOT NULL DEFAULT now(),
    answered_at     timestamptz
);
-- The W3C trace context the request carried, to tie a charge to a trace
-- (added to tables of earlier simulators in place).
ALTER TABLE provider_charges ADD COLUMN IF NOT EXISTS traceparent text;
ALTER TABLE provider_charges ADD COLUMN IF NOT EXISTS tracestate text;
-- The status a repeat replays when it is not the charge's own (a 500 the
-- provider cached after charging).
ALTER TABLE provider_charges ADD COLUMN IF NOT EXISTS response_status integer;
-- The claim's fencing epoch (X-Dedupq-Epoch): unlike the attempt, which an
-- attempt given back before it called leaves to the next claim, it names
-- one claim.
ALTER TABLE provider_charges ADD COLUMN IF NOT EXISTS epoch bigint;
CREATE INDEX IF NOT EXISTS provider_charges_remembered_key
    ON provider_charges (idempotency_key) WHERE remembered;
CREATE INDEX IF NOT EXISTS provider_charges_by_payment ON provider_charges (tenant, payment_id);
"#;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("the provider's database refused a statement")]
    Database(#[from] sqlx::Error),
    #[error(
        "the schema holds provider_charges of an older simulator (no request column): \
         choose another --schema or drop that table"
    )]
    OldLayout,
}

/// An answer as sent: its status, content type and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// What an earlier request with the same key left behind.
pub(crate) enum Existing {
    Pending,
    Finished {
        body_hash: String,
        request_hash: String,
        answer: Answer,
    },
}

/// Who asked.
pub(crate) struct Caller<'a> {
    pub key: Option<&'a str>,
    pub tenant: Option<&'a str>,
    pub owner: Option<&'a str>,
    pub attempt: Option<i32>,
    pub epoch: Option<i64>,
}

/// One charge request as received.
pub(crate) struct Received<'a> {
    pub caller: Caller<'a>,
    pub bytes: &'a [u8],
    pub content_type: Option<&'a str>,
    pub body_hash: String,
    pub request_hash: String,
    pub payment_id: Option<String>,
    /// The request's `traceparent` and `tracestate`, as sent.
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
}

#[derive(Clone)]
pub(crate) struct Ledger {
    pub(super) pool: PgPool,
}

impl Ledger {
    pub(crate) async fn open(pool: PgPool) -> Result<Self, LedgerError> {
        let old: bool = sqlx::query_scalar(
            "SELECT to_regclass('provider_charges') IS NOT NULL AND NOT EXISTS ( \
               SELECT 1 FROM pg_attribute \
               WHERE attrelid = to_regclass('provider_charges') AND attname = 'request')",
        )
        .fetch_one(&pool)
        .await?;
        if old {
            return Err(LedgerError::OldLayout);
        }
        sqlx::raw_sql(SCHEMA_SQL).execute(&pool).await?;
        Ok(Self { pool })
    }

    /// Records a charge unless the key is remembered, under a per-key lock
    /// so two concurrent requests with one key cannot both charge. Returns
    /// the new charge id, or what the key already has.
    pub(crate) async fn charge_once(
        &self,
        key: &str,
        received: &Received<'_>,
        declined: Option<&Answer>,
    ) -> Result<Result<i64, Existing>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(key)
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query(
            "SELECT state, body_hash, request_hash, response, response_type, response_status \
             FROM provider_charges \
             WHERE idempotency_key = $1 AND remembered ORDER BY id LIMIT 1",
        )
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = row {
            return Ok(Err(existing(&row)));
        }
        let id = insert(&mut tx, received, declined).await?;
        tx.commit().await?;
        Ok(Ok(id))
    }

    /// Records a charge with no idempotency check at all.
    pub(crate) async fn charge_always(
        &self,
        received: &Received<'_>,
        declined: Option<&Answer>,
    ) -> Result<i64, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        insert(&mut conn, received, declined).await
    }

    /// Marks a charge succeeded with the answer it gives (or would have
    /// given, had its caller waited).
    pub(crate) async fn succeed(&self, id: i64, answer: &Answer) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE provider_charges SET state = 'succeeded', response = $2, response_type = $3, \
             response_status = $4 WHERE id = $1",
        )
        .bind(id)
        .bind(&answer.body)
        .bind(&answer.content_type)
        .bind((answer.status != 201 && answer.status != 200).then_some(i32::from(answer.status)))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Notes that a charge's answer is being sent to a caller still there.
    pub(crate) async fn mark_answered(&self, id: i64) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE provider_charges SET answered_at = now() WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Forgets every key (as a provider does after its retention, often
    /// 24 h): charges stay, a repeated key charges again. Returns how many
    /// charges were remembered.
    pub(crate) async fn forget_keys(&self) -> Result<u64, sqlx::Error> {
        let done = sqlx::query("UPDATE provider_charges SET remembered = false WHERE remembered")
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}

fn existing(row: &sqlx::postgres::PgRow) -> Existing {
    match stored_answer(row) {
        None => Existing::Pending,
        Some(answer) => Existing::Finished {
            body_hash: row.get("body_hash"),
            request_hash: row.get("request_hash"),
            answer,
        },
    }
}

/// The answer a finished charge gave (a replay answers 200, a declined
/// card 402), from a row with `state`, `response` and `response_type`;
/// `None` while it is pending.
pub(super) fn stored_answer(row: &sqlx::postgres::PgRow) -> Option<Answer> {
    let state: String = row.get("state");
    let replayed: Option<i32> = row.try_get("response_status").ok().flatten();
    let status = match state.as_str() {
        "pending" => return None,
        "declined" => 402,
        _ => replayed.and_then(|s| u16::try_from(s).ok()).unwrap_or(200),
    };
    Some(Answer {
        status,
        content_type: row
            .get::<Option<String>, _>("response_type")
            .unwrap_or_default(),
        body: row
            .get::<Option<Vec<u8>>, _>("response")
            .unwrap_or_default(),
    })
}

/// Inserts a pending charge, or a declined one with its answer.
async fn insert(
    conn: &mut sqlx::PgConnection,
    r: &Received<'_>,
    declined: Option<&Answer>,
) -> Result<i64, sqlx::Error> {
    let state = if declined.is_some() {
        "declined"
    } else {
        "pending"
    };
    sqlx::query_scalar(
        "INSERT INTO provider_charges (idempotency_key, tenant, payment_id, request, content_type, \
           body_hash, request_hash, state, response, response_type, owner, attempt, answered_at, \
           traceparent, tracestate, epoch) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
           CASE WHEN $8 = 'declined' THEN now() END, $13, $14, $15) \
         RETURNING id",
    )
    .bind(r.caller.key)
    .bind(r.caller.tenant)
    .bind(r.payment_id.as_deref())
    .bind(r.bytes)
    .bind(r.content_type)
    .bind(&r.body_hash)
    .bind(&r.request_hash)
    .bind(state)
    .bind(declined.map(|a| a.body.as_slice()))
    .bind(declined.map(|a| a.content_type.as_str()))
    .bind(r.caller.owner)
    .bind(r.caller.attempt)
    .bind(r.traceparent)
    .bind(r.tracestate)
    .bind(r.caller.epoch)
    .fetch_one(conn)
    .await
}
