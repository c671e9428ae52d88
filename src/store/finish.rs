//! Writes that end (or pause) a claim. Every one is fenced by the epoch the
//! claim returned: a write that matches no row means the lease was lost.

use super::{sorted_order, RowAt, Store, StoreError};
use crate::identity::{Epoch, Identity};
use sqlx::Row;

/// The fence: a write matches its row only at the claim's epoch.
fn epoch_fence() -> &'static str {
    if crate::broken::is(crate::broken::Break::NoFencing) {
        // Test-only: a stale worker overwrites the current owner's row.
        return "";
    }
    "AND k.epoch = u.epoch"
}

/// One statement for a batch of finishes of any kind. `in_progress` with a
/// lease ending now is a release: the next delivery takes over at once. An
/// unknown outcome held for an operator has no lease at all, so no claim
/// takes it over. An attempt that sent no request gives its number back; one
/// that sent a request saying nothing about the payment (a fault, a 409, a
/// failed probe) keeps it and is counted apart (see [`Refund`]). An unknown outcome
/// marks the key uncertain; a done or failed one clears the mark.
///
/// It changes no indexed column of an ordinary key (`uncertain_since`
/// stays NULL, see migration 0003), so on a page with room it is a HOT
/// update: no index entry is written.
///
/// Each row is looked up first where its claim wrote it (`at_table`,
/// `at_tid`: one page, pruned to its partition by the key), then, if it is
/// not there (no hint, or the row moved: a renewal wrote a newer version),
/// through the primary key. Both look-ups match the key, the epoch and an
/// open row, so the hint never decides which row is written; the second
/// skips the rows the first wrote, so no row is written twice.
/// A small finish goes through the primary key alone ([`Reach::of`]).
pub(super) fn finish_sql(reach: Reach) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; 2] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    SQL[reach as usize].get_or_init(|| {
        let select: Vec<String> = reach
            .writes()
            .iter()
            .map(|cte| format!("SELECT ord FROM {cte}"))
            .collect();
        format!(
            "WITH {}\n{}",
            finish_ctes(0, reach),
            select.join(" UNION ALL ")
        )
    })
}

/// Rows from which a finish looks its rows up where their claims wrote
/// them first. Below it, the descents saved (4 µs per row on an empty
/// table, 14 µs on 10M keys) cost less than planning the second `UPDATE`
/// at each call (0.39–0.45 against 0.19–0.21 ms, BENCHMARKS.md).
#[doc(hidden)]
pub const HINTED_FROM: usize = 32;

/// How a finish reaches its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reach {
    /// Where each claim wrote its row, then through the primary key.
    AtRow = 0,
    /// Through the primary key only.
    ByKey = 1,
}

impl Reach {
    /// The CTEs that write rows and return their `ord`.
    pub(super) fn writes(self) -> &'static [&'static str] {
        match self {
            Reach::AtRow => &["at_row", "by_key"],
            Reach::ByKey => &["by_key"],
        }
    }

    /// How a finish of `rows` rows reaches them.
    pub(super) fn of(rows: usize) -> Self {
        if rows >= HINTED_FROM {
            Reach::AtRow
        } else {
            Reach::ByKey
        }
    }
}

/// The finish's common table expressions (`u`, with [`Reach::AtRow`]
/// `at_row`, and `by_key`), its twelve parameters numbered from
/// `first + 1`.
pub(super) fn finish_ctes(first: usize, reach: Reach) -> String {
    let fence = epoch_fence();
    let set = r#"
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
    attempts = k.attempts - (u.refund = 1)::int4,
    uncounted_attempts = k.uncounted_attempts + (u.refund = 2)::int4,
    attempt_open = false,
    updated_at = now()"#;
    let p = |n: usize| format!("${}", first + n);
    let (at_row, not_at_row) = match reach {
        Reach::AtRow => (
            format!(
                r#"
at_row AS (
    UPDATE dedupq_keys AS k SET{set}
    FROM u
    WHERE k.ctid = u.at_tid AND k.tableoid = u.at_table::oid
      AND k.tenant = u.tenant AND k.key = u.key
      AND k.completed_at IS NULL
      {fence}
    RETURNING u.ord
),"#
            ),
            "u.ord NOT IN (SELECT a.ord FROM at_row a)\n      AND ",
        ),
        Reach::ByKey => (String::new(), ""),
    };
    format!(
        r#"
u AS (
    SELECT * FROM unnest({}::text[], {}::text[], {}::int8[], {}::text[], {}::int4[], {}::bytea[],
                         {}::text[], {}::text[], {}::bool[], {}::int4[], {}::int8[],
                         {}::text[]::tid[])
        WITH ORDINALITY AS u(tenant, key, epoch, status, result_status, result_body,
                             result_content_type, error, hold, refund, at_table, at_tid, ord)
),{at_row}
by_key AS (
    UPDATE dedupq_keys AS k SET{set}
    FROM u
    WHERE {not_at_row}k.tenant = u.tenant AND k.key = u.key
      AND k.completed_at IS NULL
      {fence}
    RETURNING u.ord
)"#,
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        p(6),
        p(7),
        p(8),
        p(9),
        p(10),
        p(11),
        p(12),
    )
}

/// How a claim ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// The handler succeeded: store and replay the result.
    Done(Answer),
    /// The handler failed for good (declined, 4xx): stored and replayed too.
    Failed(Answer),
    /// Nothing happened (a transient failure, or a configuration fault):
    /// give the key up so the next delivery takes over. `refund`: whether
    /// the attempt counts (a fault says nothing about the payment).
    Release {
        /// Why, kept in `last_error` (without NULs, at most 2 KiB).
        error: String,
        /// Whether the attempt counts towards the limit.
        refund: Refund,
    },
    /// The call may or may not have had its effect: retry with the same
    /// request. `hold`: no more attempts; wait for an operator.
    Unknown {
        /// Why, kept in `last_error` (without NULs, at most 2 KiB).
        error: String,
        /// No attempts left: the key keeps no lease, so no claim takes it
        /// over until an operator settles or releases it.
        hold: bool,
        /// Whether the attempt counts towards the limit.
        refund: Refund,
    },
}

/// Whether the attempt a finish ends counts towards `engine.max_attempts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refund {
    /// It counts.
    No,
    /// It sent no request (the call never started): the attempt and its
    /// number are given back, and the next request uses the number.
    Unsent,
    /// It sent a request, which may have reached the provider, but what
    /// came back says nothing about the payment (a fault, a 409 for a
    /// request still running, a probe that found the provider still
    /// down). It does not count, but keeps its number: no two requests of
    /// a key carry the same `X-Dedupq-Attempt`, and `attempts` counts the
    /// requests sent.
    Uncounted,
}

impl Refund {
    /// As the finish statement takes it.
    fn code(self) -> i32 {
        match self {
            Refund::No => 0,
            Refund::Unsent => 1,
            // Test-only: the number is given back, as if nothing was sent.
            Refund::Uncounted if crate::broken::is(crate::broken::Break::SentAttemptGivenBack) => 1,
            Refund::Uncounted => 2,
        }
    }
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
                refund: refund.code(),
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
                refund: refund.code(),
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
    /// Where the claim wrote the row ([`Claim::at`](super::Claim::at)):
    /// looked at first, the primary key if the row is not there.
    pub at: Option<RowAt>,
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
        let input = FinishInput::new(writes);
        let rows = self
            .rows(|| input.bind(sqlx::query(finish_sql(Reach::of(writes.len())))))
            .await?;
        let mut landed = vec![false; writes.len()];
        for row in rows {
            input.landed(row.try_get("ord")?, &mut landed)?;
        }
        Ok(landed)
    }
}

/// A finish's input as the statement takes it: one array per column, in
/// key order (so that concurrent statements lock rows in the same order).
pub(super) struct FinishInput<'a> {
    /// `order[i]`: which write is the `i`-th in key order.
    order: Vec<usize>,
    tenants: Vec<&'a str>,
    keys: Vec<&'a str>,
    epochs: Vec<i64>,
    statuses: Vec<&'static str>,
    result_statuses: Vec<Option<i32>>,
    bodies: Vec<Option<&'a [u8]>>,
    content_types: Vec<Option<String>>,
    errors: Vec<Option<String>>,
    holds: Vec<bool>,
    refunds: Vec<i32>,
    at_tables: Vec<Option<i64>>,
    at_tids: Vec<Option<String>>,
}

impl<'a> FinishInput<'a> {
    pub(super) fn new(writes: &[&'a FinishWrite<'a>]) -> Self {
        let order = sorted_order(writes, |w| {
            (w.identity.tenant.as_str(), w.identity.key.as_str())
        });
        let n = writes.len();
        let mut input = Self {
            order: Vec::new(),
            tenants: Vec::with_capacity(n),
            keys: Vec::with_capacity(n),
            epochs: Vec::with_capacity(n),
            statuses: Vec::with_capacity(n),
            result_statuses: Vec::with_capacity(n),
            bodies: Vec::with_capacity(n),
            content_types: Vec::with_capacity(n),
            errors: Vec::with_capacity(n),
            holds: Vec::with_capacity(n),
            refunds: Vec::with_capacity(n),
            at_tables: Vec::with_capacity(n),
            at_tids: Vec::with_capacity(n),
        };
        for &i in &order {
            let w: &'a FinishWrite<'a> = writes[i];
            let c = w.finish.columns();
            input.tenants.push(w.identity.tenant.as_str());
            input.keys.push(w.identity.key.as_str());
            input.epochs.push(w.epoch.0);
            input.statuses.push(c.status);
            input.result_statuses.push(c.result.map(|r| r.status));
            input.bodies.push(c.result.map(|r| r.body.as_slice()));
            input.content_types.push(
                c.result
                    .and_then(|r| r.content_type.as_deref())
                    .map(|t| clean_text(t, 255)),
            );
            input.errors.push(c.error);
            input.holds.push(c.hold);
            input.refunds.push(c.refund);
            input.at_tables.push(w.at.map(|a| i64::from(a.table)));
            input.at_tids.push(w.at.map(|a| a.tid()));
        }
        input.order = order;
        input
    }

    pub(super) fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(&self.tenants)
            .bind(&self.keys)
            .bind(&self.epochs)
            .bind(&self.statuses)
            .bind(&self.result_statuses)
            .bind(&self.bodies)
            .bind(&self.content_types)
            .bind(&self.errors)
            .bind(&self.holds)
            .bind(&self.refunds)
            .bind(&self.at_tables)
            .bind(&self.at_tids)
    }

    /// Marks the write at position `ord` (1-based, in key order) landed.
    pub(super) fn landed(&self, ord: i64, landed: &mut [bool]) -> Result<(), StoreError> {
        let write = usize::try_from(ord - 1)
            .ok()
            .and_then(|i| self.order.get(i))
            .ok_or_else(|| StoreError::Corrupt(format!("a finish answered for row {ord}")))?;
        landed[*write] = true;
        Ok(())
    }
}
