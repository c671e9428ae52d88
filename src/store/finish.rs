//! Writes that end (or pause) a claim. Every one is fenced by the epoch the
//! claim returned: a write that matches no row means the lease was lost.

use super::{sorted_order, Store, StoreError};
use crate::identity::{Epoch, Identity};
use sqlx::Row;

#[cfg(not(feature = "broken-no-fencing"))]
const EPOCH_FENCE: &str = "AND k.epoch = u.epoch";
// Test-only: lets a stale worker overwrite the current owner's row, so the
// tests can show that they catch a store without fencing.
#[cfg(feature = "broken-no-fencing")]
const EPOCH_FENCE: &str = "";

/// One statement for a batch of finishes of any kind. `in_progress` with a
/// lease ending now is a release: the next delivery takes over at once. An
/// unknown outcome held for an operator has no lease at all, so no claim
/// takes it over. A fault refunds the attempt it used. An unknown outcome
/// marks the key uncertain; a done or failed one clears the mark.
///
/// It changes no indexed column of an ordinary key (`uncertain_since`
/// stays NULL, see migration 0003), so on a page with room it is a HOT
/// update: no index entry is written.
fn finish_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            r#"
UPDATE dedupq_keys AS k SET
    status = u.status,
    result_status = u.result_status,
    result_body = u.result_body,
    result_content_type = u.result_content_type,
    last_error = u.error,
    lease_until = CASE WHEN u.status IN ('done', 'failed') OR u.hold THEN NULL ELSE now() END,
    completed_at = CASE WHEN u.status IN ('done', 'failed') THEN now() ELSE NULL END,
    uncertain_since = CASE WHEN u.status = 'unknown' THEN coalesce(k.uncertain_since, now())
                           WHEN u.status IN ('done', 'failed') THEN NULL
                           ELSE k.uncertain_since END,
    attempts = k.attempts - u.refund,
    attempt_open = false,
    updated_at = now()
FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::int4[], $6::bytea[],
            $7::text[], $8::text[], $9::bool[], $10::int4[])
    WITH ORDINALITY AS u(tenant, key, epoch, status, result_status, result_body,
                         result_content_type, error, hold, refund, ord)
WHERE k.tenant = u.tenant AND k.key = u.key
  AND k.completed_at IS NULL
  {EPOCH_FENCE}
RETURNING u.ord
"#
        )
    })
}

/// How a claim ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// The handler succeeded: store and replay the result.
    Done(Answer),
    /// The handler failed for good (declined, 4xx): stored and replayed too.
    Failed(Answer),
    /// Nothing happened (a transient failure, or a configuration fault):
    /// give the key up so the next delivery takes over. `refund` gives the
    /// attempt back (a fault says nothing about the payment).
    Release {
        /// Why, kept in `last_error` (without NULs, at most 2 KiB).
        error: String,
        /// Gives the attempt back: it does not count towards the limit.
        refund: bool,
    },
    /// The call may or may not have had its effect: retry with the same
    /// request. `hold`: no more attempts; wait for an operator.
    Unknown {
        /// Why, kept in `last_error` (without NULs, at most 2 KiB).
        error: String,
        /// No attempts left: the key keeps no lease, so no claim takes it
        /// over until an operator settles or releases it.
        hold: bool,
        /// Gives the attempt back: it does not count towards the limit.
        refund: bool,
    },
}

/// A stored answer: status and body byte for byte.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The answer's status code (the provider's HTTP status for `http`).
    pub status: i32,
    /// The body, byte for byte.
    pub body: Vec<u8>,
    /// Its media type, if any (stored without NULs, at most 255 bytes).
    pub content_type: Option<String>,
}

/// Longest `last_error` kept.
const MAX_ERROR: usize = 2048;

/// Text columns refuse NUL; errors may quote whatever a provider sent.
pub(super) fn clean_text(s: &str, max: usize) -> String {
    let mut out: String = s.chars().filter(|c| *c != '\0').collect();
    if out.len() > max {
        let mut end = max;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

struct Columns<'a> {
    status: &'static str,
    result: Option<&'a Answer>,
    error: Option<String>,
    hold: bool,
    refund: i32,
}

impl Finish {
    fn columns(&self) -> Columns<'_> {
        let error = |e: &str| Some(clean_text(e, MAX_ERROR));
        match self {
            Finish::Done(o) => Columns {
                status: "done",
                result: Some(o),
                error: None,
                hold: false,
                refund: 0,
            },
            Finish::Failed(o) => Columns {
                status: "failed",
                result: Some(o),
                error: None,
                hold: false,
                refund: 0,
            },
            Finish::Release { error: e, refund } => Columns {
                status: "in_progress",
                result: None,
                error: error(e),
                hold: false,
                refund: i32::from(*refund),
            },
            Finish::Unknown {
                error: e,
                hold,
                refund,
            } => Columns {
                status: "unknown",
                result: None,
                error: error(e),
                hold: *hold,
                refund: i32::from(*refund),
            },
        }
    }
}

/// What became of one finish write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Stored.
    Landed,
    /// The epoch no longer matches (or the key is finished): another
    /// worker owns the key; the writer lost its lease and must not commit
    /// or ack.
    Fenced,
    /// Another transaction holds the row past `store.lock_timeout`:
    /// nothing written; write it again later.
    Locked,
}

/// One write of a finish batch: a claim's end, fenced by its epoch.
pub struct FinishWrite<'a> {
    /// The key whose claim ends.
    pub identity: &'a Identity,
    /// The epoch the claim returned: the write lands only while the row
    /// still has it.
    pub epoch: Epoch,
    /// How the claim ends.
    pub finish: Finish,
}

impl Store {
    /// Applies every write in one round trip. Returns, in input order,
    /// what became of each write (see [`Written`]); a row another
    /// transaction holds does not hold back the others.
    pub async fn finish_batch(
        &self,
        writes: &[FinishWrite<'_>],
    ) -> Result<Vec<Written>, StoreError> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&Identity> = writes.iter().map(|w| w.identity).collect();
        self.around_locks(
            &ids,
            || Written::Locked,
            |subset| async move {
                let some: Vec<&FinishWrite<'_>> = subset.iter().map(|&i| &writes[i]).collect();
                let landed = self.finish_statement(&some).await?;
                Ok(landed
                    .into_iter()
                    .map(|l| if l { Written::Landed } else { Written::Fenced })
                    .collect())
            },
        )
        .await
    }

    async fn finish_statement(&self, writes: &[&FinishWrite<'_>]) -> Result<Vec<bool>, StoreError> {
        let order = sorted_order(writes, |w| {
            (w.identity.tenant.as_str(), w.identity.key.as_str())
        });
        let n = writes.len();
        let mut tenants = Vec::with_capacity(n);
        let mut keys = Vec::with_capacity(n);
        let mut epochs = Vec::with_capacity(n);
        let mut statuses = Vec::with_capacity(n);
        let mut result_statuses = Vec::with_capacity(n);
        let mut bodies: Vec<Option<&[u8]>> = Vec::with_capacity(n);
        let mut content_types: Vec<Option<String>> = Vec::with_capacity(n);
        let mut errors = Vec::with_capacity(n);
        let mut holds = Vec::with_capacity(n);
        let mut refunds = Vec::with_capacity(n);
        let columns: Vec<Columns<'_>> = writes.iter().map(|w| w.finish.columns()).collect();
        for &i in &order {
            let w = &writes[i];
            let c = &columns[i];
            tenants.push(w.identity.tenant.as_str());
            keys.push(w.identity.key.as_str());
            epochs.push(w.epoch.0);
            statuses.push(c.status);
            result_statuses.push(c.result.map(|r| r.status));
            bodies.push(c.result.map(|r| r.body.as_slice()));
            content_types.push(
                c.result
                    .and_then(|r| r.content_type.as_deref())
                    .map(|t| clean_text(t, 255)),
            );
            errors.push(c.error.clone());
            holds.push(c.hold);
            refunds.push(c.refund);
        }
        let rows = sqlx::query(finish_sql())
            .bind(&tenants)
            .bind(&keys)
            .bind(&epochs)
            .bind(&statuses)
            .bind(&result_statuses)
            .bind(&bodies)
            .bind(&content_types)
            .bind(&errors)
            .bind(&holds)
            .bind(&refunds)
            .fetch_all(self.pool())
            .await
            .map_err(|e| self.noted(e))?;
        let mut landed = vec![false; n];
        for row in rows {
            let ord: i64 = row.try_get("ord")?;
            landed[order[(ord - 1) as usize]] = true;
        }
        Ok(landed)
    }
}
