//! Claiming a batch of keys: one statement, one round trip.

use super::{secs, sorted_order, KeyStatus, Store, StoreError};
use crate::fingerprint::{Fingerprint, LEGACY_VERSION};
use crate::identity::{Epoch, Identity};
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;
use std::time::Duration;

/// Insert every key; where it exists, take it over only if it is open
/// (in_progress or unknown), its lease is over (an unknown key held for an
/// operator has none) and it is the same operation. The rows it wrote come
/// back as they are now; every other key is read as of the statement's
/// snapshot (which does not see its own writes), which tells duplicates,
/// held keys and conflicts apart in the same round trip. A key it wrote is
/// not read again, and no join sorts the written rows: they carry their
/// identity back instead of the input's position.
///
/// A row stored under another fingerprint version is taken over on the
/// key alone, except a version-1 row: it is compared with the message's
/// version-1 digest (`legacy`), as `classify` compares finished rows. That
/// digest is sent only once known: a claim that meets an open version-1
/// row without it is not taken over, `classify` works the digest out and
/// answers `Contended`, and the engine claims again with it.
///
/// A new key stores the request of its first attempt (bytes, content type,
/// derived key); a takeover returns that stored request so the retry sends
/// exactly it. A takeover of a key whose outcome was unknown, or whose
/// last attempt never wrote one (its worker died mid-call), marks the key
/// uncertain: only a settling answer may end it.
///
/// A row it inserted is told from one it took over by its epoch: an
/// insert writes epoch 1 and a takeover the stored epoch plus one, and no
/// other statement changes it. (`xmax = 0`, the usual test, is a system
/// column, which RETURNING of a partitioned table cannot read.)
///
/// A written row also comes back with where its version lies (its
/// partition and `ctid`), so that the finish can reach it without
/// descending the primary key again (see [`RowAt`]).
///
/// Whether a lease is over, and how long it has left, is PostgreSQL's
/// answer (`lease_over`, `lease_left` in seconds): the worker's clock may
/// be off.
///
/// The keys it did not write are told from the ones it did with `NOT IN`
/// over the written rows, which PostgreSQL answers from one hash of them
/// (a hashed SubPlan). `NOT EXISTS` would be planned as an anti join, and
/// with hash joins off on dedupq's sessions (`connect::PLANNER`) that is a
/// nested loop over both lists: for 500 keys, 250 000 comparisons and
/// 13 of the statement's 17 ms (EXPLAIN ANALYZE; BENCHMARKS.md). Neither
/// list holds a NULL (both columns are NOT NULL), so the two mean the same.
pub(super) const CLAIM_CTES: &str = r#"
input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::int2[],
                         $5::bytea[], $6::text[], $7::text[], $10::bytea[], $11::text[])
        WITH ORDINALITY AS i(tenant, key, fingerprint, fingerprint_version,
                             request_body, request_content_type, derived_key,
                             legacy, route, ord)
),
claimed AS (
    INSERT INTO dedupq_keys AS k
        (tenant, key, fingerprint, fingerprint_version, status, epoch,
         lease_until, owner, attempts, attempt_open,
         request_body, request_content_type, derived_key, route)
    SELECT tenant, key, fingerprint, fingerprint_version, 'in_progress', 1,
           now() + make_interval(secs => $8), $9, 1, true,
           request_body, request_content_type, derived_key, route
    FROM input ORDER BY ord
    ON CONFLICT (tenant, key) DO UPDATE SET
        status = 'in_progress',
        epoch = k.epoch + 1,
        lease_until = EXCLUDED.lease_until,
        owner = EXCLUDED.owner,
        attempts = k.attempts + 1,
        attempt_open = true,
        uncertain_since = CASE WHEN (k.status = 'unknown') OR k.attempt_open
                               THEN coalesce(k.uncertain_since, now())
                               ELSE k.uncertain_since END,
        updated_at = now()
    WHERE (k.status IN ('in_progress', 'unknown'))
      AND (k.lease_until <= now())
      AND ((k.route IS NULL) OR (EXCLUDED.route IS NULL) OR (k.route = EXCLUDED.route))
      AND (((k.fingerprint_version = EXCLUDED.fingerprint_version)
            AND (k.fingerprint = EXCLUDED.fingerprint))
           OR ((k.fingerprint_version <> EXCLUDED.fingerprint_version)
               AND ((k.fingerprint_version <> 1)
                    OR (k.fingerprint = (SELECT l.legacy FROM input l
                                         WHERE l.tenant = k.tenant AND l.key = k.key)))))
    RETURNING k.tenant, k.key, k.epoch, k.attempts,
              k.attempts - k.uncounted_attempts AS counted, (k.epoch = 1) AS inserted,
              (k.uncertain_since IS NOT NULL) AS uncertain,
              CASE WHEN k.epoch = 1 THEN NULL ELSE k.request_body END AS stored_body,
              CASE WHEN k.epoch = 1 THEN NULL ELSE k.request_content_type END AS stored_content_type,
              CASE WHEN k.epoch = 1 THEN NULL ELSE k.derived_key END AS stored_derived_key,
              CASE WHEN k.epoch = 1 THEN 0
                   ELSE extract(epoch FROM (now() - k.created_at)) END::float8 AS age,
              k.tableoid::int8 AS at_table, k.ctid::text AS at_tid
),
unclaimed AS MATERIALIZED (
    SELECT i.ord, i.tenant, i.key FROM input i
    WHERE (i.tenant, i.key) NOT IN (SELECT c.tenant, c.key FROM claimed c)
)
"#;

/// What the claim's common table expressions answer: one row per key, as
/// [`classify`] reads it, and a last column (`finished`) that only a
/// statement sharing the claim with finishes fills.
pub(super) const CLAIM_SELECT: &str = r#"
SELECT NULL::int8 AS ord, c.tenant, c.key,
       c.epoch AS claimed_epoch, c.attempts AS claimed_attempts,
       c.counted AS claimed_counted, c.inserted,
       c.uncertain, c.stored_body, c.stored_content_type, c.stored_derived_key,
       c.age AS claimed_age, c.at_table, c.at_tid,
       NULL::text AS status, NULL::bytea AS fingerprint, NULL::int2 AS fingerprint_version,
       NULL::timestamptz AS lease_until, NULL::bool AS lease_over,
       NULL::float8 AS lease_left, NULL::int4 AS attempts,
       NULL::int4 AS result_status, NULL::bytea AS result_body,
       NULL::text AS result_content_type, NULL::text AS route,
       NULL::int8 AS finished
FROM claimed c
UNION ALL
SELECT u.ord, NULL, NULL,
       NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       k.status, k.fingerprint, k.fingerprint_version,
       k.lease_until, ((k.lease_until <= now()) IS TRUE),
       extract(epoch FROM (k.lease_until - now()))::float8, k.attempts,
       k.result_status, k.result_body,
       k.result_content_type, k.route,
       NULL
FROM unclaimed u
JOIN dedupq_keys k ON k.tenant = u.tenant AND k.key = u.key
"#;

/// Columns of [`CLAIM_SELECT`] before `finished`.
pub(super) const CLAIM_COLUMNS: usize = 25;

/// The claim on its own.
pub(super) fn claim_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| format!("WITH {CLAIM_CTES}{CLAIM_SELECT}"))
}

/// One message to claim: its identity and operation, and the request a
/// new key stores for every later attempt.
#[derive(Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The row's primary key: `(tenant, key)`.
    pub identity: &'a Identity,
    /// The operation: a stored row under another fingerprint is a conflict.
    pub fingerprint: &'a Fingerprint,
    /// The payload as received; a new key stores it so that every retry
    /// and takeover sends exactly these bytes.
    pub body: &'a [u8],
    /// The payload's media type, stored with it.
    pub content_type: Option<&'a str>,
    /// The key sent to the provider; a new key stores it so that a later
    /// attempt sends the same one, even after a change of format.
    pub derived_key: &'a str,
    /// The HTTP route the request came on; None from a queue. A key claimed
    /// on one route is refused on another ([`ClaimResult::OtherRoute`]).
    pub route: Option<&'a str>,
}

/// What a finished key stored; replayed to duplicates. `Unknown` is the
/// answer for a key held for an operator (no body).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResult {
    /// `Done` or `Failed` for a stored answer; `Unknown` for a held key.
    pub status: KeyStatus,
    /// The answer's status code (the provider's HTTP status for `http`);
    /// 0 when none is stored.
    pub result_status: i32,
    /// The provider's answer, byte for byte.
    pub body: Vec<u8>,
    /// The answer's media type, if it had one.
    pub content_type: Option<String>,
}

impl StoredResult {
    /// The answer a done or failed row stores, read from its
    /// `result_status`, `result_body` and `result_content_type` columns.
    pub(super) fn from_row(row: &PgRow, status: KeyStatus) -> Result<Self, StoreError> {
        Ok(Self {
            status,
            result_status: row
                .try_get::<Option<i32>, _>("result_status")?
                .unwrap_or_default(),
            body: row
                .try_get::<Option<Vec<u8>>, _>("result_body")?
                .unwrap_or_default(),
            content_type: row.try_get("result_content_type")?,
        })
    }

    /// The answer for a key whose outcome is unknown and held.
    pub fn unknown() -> Self {
        Self {
            status: KeyStatus::Unknown,
            result_status: 0,
            body: Vec::new(),
            content_type: None,
        }
    }
}

/// The request the key's first attempt stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRequest {
    /// The payload of the first attempt, byte for byte.
    pub body: Vec<u8>,
    /// Its media type, if it had one.
    pub content_type: Option<String>,
    /// The provider key the first attempt used.
    pub derived_key: String,
}

/// This worker owns the key now.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The fencing token of this claim: every later write of it carries the
    /// epoch and lands only while the row still has it.
    pub epoch: Epoch,
    /// Attempts on the key that sent a request, and this one: the number
    /// its request carries (`X-Dedupq-Attempt`), never one an earlier
    /// request carried.
    pub attempts: i32,
    /// Of those, the ones that count towards `engine.max_attempts` (see
    /// [`Refund`](super::Refund)), this one included.
    pub counted: i32,
    /// An earlier attempt may have had its effect (its outcome was unknown,
    /// or its worker died mid-call): only a settling answer ends the key.
    pub uncertain: bool,
    /// For a takeover: the request of the first attempt, to send again.
    /// None for a new key (or a row stored before requests were kept).
    pub stored_request: Option<StoredRequest>,
    /// How long ago the key was first claimed, by PostgreSQL's clock (zero
    /// for a new key): what `handler.retry_for` is measured against.
    pub age: Duration,
    /// Where the row version this claim wrote lies: a hint for the write
    /// that ends the claim (None when the claim did not say).
    pub at: Option<RowAt>,
}

/// Where one version of a key's row lies: its partition and its `ctid`.
/// A finish looks the row up there first, which costs one page instead of
/// a descent of the primary key (four levels and a cache miss on each at
/// ten million keys). It is only a hint: the row is still matched on its
/// key and epoch there, and a row that moved since (a lease renewal writes
/// a new version) is found through the primary key as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowAt {
    /// The partition's `tableoid`.
    pub table: u32,
    /// The `ctid`'s block.
    pub block: u32,
    /// The `ctid`'s line pointer.
    pub offset: u16,
}

impl RowAt {
    /// Reads the `at_table` and `at_tid` columns (a `ctid` as PostgreSQL
    /// prints it: `(block,offset)`); None when either is missing or cannot
    /// be read, which only costs the finish its shortcut.
    pub(super) fn read(row: &PgRow) -> Result<Option<Self>, StoreError> {
        let table = row.try_get::<Option<i64>, _>("at_table")?;
        let tid = row.try_get::<Option<String>, _>("at_tid")?;
        Ok(table
            .zip(tid)
            .and_then(|(table, tid)| Self::parse(table, &tid)))
    }

    fn parse(table: i64, tid: &str) -> Option<Self> {
        let (block, offset) = tid.strip_prefix('(')?.strip_suffix(')')?.split_once(',')?;
        Some(Self {
            table: u32::try_from(table).ok()?,
            block: block.parse().ok()?,
            offset: offset.parse().ok()?,
        })
    }

    /// The `ctid` as PostgreSQL reads it.
    pub(super) fn tid(&self) -> String {
        format!("({},{})", self.block, self.offset)
    }
}

/// What claiming one key found, which decides what becomes of its message.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimResult {
    /// New key: this worker owns it.
    Won(Claim),
    /// The previous owner's lease was over: this worker owns it now.
    TakenOver(Claim),
    /// Finished before, same operation: replay the stored result.
    Duplicate(StoredResult),
    /// Someone else holds a live lease on it.
    Held {
        /// What is left of the holder's lease by PostgreSQL's clock (zero
        /// for a row without one): the earliest a retry can take the key
        /// over.
        lease_left: Duration,
    },
    /// Its outcome stayed unknown through every allowed attempt: held for
    /// an operator, never run again on its own.
    HeldUnknown {
        /// Attempts made on the key.
        attempts: i32,
    },
    /// Same key, different operation.
    Conflict,
    /// The key was first claimed on another HTTP route (the route named
    /// here): a key belongs to its route.
    OtherRoute {
        /// The route the key was first used on.
        first: String,
    },
    /// Another transaction holds the row (an operator's `SELECT … FOR
    /// UPDATE`, a long transaction) past `store.lock_timeout`: nothing was
    /// written; try again later. The rest of the batch was claimed.
    Locked,
    /// A concurrent claimer committed the row after this statement's
    /// snapshot was taken: claim again to learn its state.
    Contended,
}

impl ClaimResult {
    /// The `result` label of `dedupq_claims_total`, and the claim event of
    /// a message's span.
    pub fn label(&self) -> &'static str {
        match self {
            ClaimResult::Won(_) => "won",
            ClaimResult::TakenOver(_) => "takeover",
            ClaimResult::Duplicate(_) => "duplicate",
            ClaimResult::Held { .. } => "held",
            ClaimResult::HeldUnknown { .. } => "held_unknown",
            ClaimResult::Conflict | ClaimResult::OtherRoute { .. } => "conflict",
            ClaimResult::Locked => "locked",
            ClaimResult::Contended => "contended",
        }
    }
}

impl Store {
    /// Claims every request in one round trip. The requests must have
    /// distinct identities (PostgreSQL refuses to touch a row twice in one
    /// statement); results come back in request order. A row another
    /// transaction holds comes back [`ClaimResult::Locked`] and the rest
    /// are claimed without it. Claims use their share of the pool only, so
    /// renewals and finishes always find a connection.
    pub async fn claim_batch(
        &self,
        requests: &[ClaimRequest<'_>],
        owner: &str,
        lease: Duration,
    ) -> Result<Vec<ClaimResult>, StoreError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let _permit = self.claim_permit().await;
        let ids: Vec<&Identity> = requests.iter().map(|r| r.identity).collect();
        self.around_locks(
            &ids,
            || ClaimResult::Locked,
            |subset| async move {
                let some: Vec<ClaimRequest<'_>> = subset.iter().map(|&i| requests[i]).collect();
                self.claim_statement(&some, owner, lease).await
            },
        )
        .await
    }

    async fn claim_statement(
        &self,
        requests: &[ClaimRequest<'_>],
        owner: &str,
        lease: Duration,
    ) -> Result<Vec<ClaimResult>, StoreError> {
        let input = ClaimInput::new(requests);
        let rows = self
            .rows(|| input.bind(sqlx::query(claim_sql()), owner, lease))
            .await?;
        input.results(requests, &rows)
    }
}

/// A claim's input as the statement takes it: one array per column, in
/// key order (so that concurrent statements lock rows in the same order).
pub(super) struct ClaimInput<'a> {
    /// `order[i]`: which request is the `i`-th in key order.
    order: Vec<usize>,
    tenants: Vec<&'a str>,
    keys: Vec<&'a str>,
    digests: Vec<&'a [u8]>,
    versions: Vec<i16>,
    bodies: Vec<&'a [u8]>,
    content_types: Vec<Option<&'a str>>,
    derived: Vec<&'a str>,
    routes: Vec<Option<&'a str>>,
    legacy: Vec<Option<&'a [u8]>>,
}

impl<'a> ClaimInput<'a> {
    pub(super) fn new(requests: &[ClaimRequest<'a>]) -> Self {
        let order = sorted_order(requests, |r| {
            (r.identity.tenant.as_str(), r.identity.key.as_str())
        });
        let sorted = || order.iter().map(|&i| &requests[i]);
        Self {
            tenants: sorted().map(|r| r.identity.tenant.as_str()).collect(),
            keys: sorted().map(|r| r.identity.key.as_str()).collect(),
            digests: sorted().map(|r| &r.fingerprint.digest[..]).collect(),
            versions: sorted().map(|r| r.fingerprint.version).collect(),
            bodies: sorted().map(|r| r.body).collect(),
            content_types: sorted().map(|r| r.content_type).collect(),
            derived: sorted().map(|r| r.derived_key).collect(),
            routes: sorted().map(|r| r.route).collect(),
            legacy: sorted()
                .map(|r| r.fingerprint.legacy_if_known().map(|d| &d[..]))
                .collect(),
            order,
        }
    }

    /// Every request's result, in request order, from the rows the claim
    /// answered (a request with no row raced a concurrent claimer).
    pub(super) fn results(
        &self,
        requests: &[ClaimRequest<'_>],
        rows: &[PgRow],
    ) -> Result<Vec<ClaimResult>, StoreError> {
        let sorted: Vec<(&str, &str)> = self
            .tenants
            .iter()
            .copied()
            .zip(self.keys.iter().copied())
            .collect();
        let mut results = vec![ClaimResult::Contended; requests.len()];
        for row in rows {
            let position = match row.try_get::<Option<i64>, _>("ord")? {
                Some(ord) => (ord - 1) as usize,
                // A written row: its identity, in the sorted input.
                None => {
                    let id: (&str, &str) = (row.try_get("tenant")?, row.try_get("key")?);
                    sorted.binary_search(&id).map_err(|_| {
                        StoreError::Corrupt(format!(
                            "claimed {}/{}, which was not asked for",
                            id.0, id.1
                        ))
                    })?
                }
            };
            let request_index = self.order[position];
            let request = &requests[request_index];
            results[request_index] = classify(row, request.fingerprint, request.route)?;
        }
        Ok(results)
    }

    pub(super) fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
        owner: &'q str,
        lease: Duration,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(&self.tenants)
            .bind(&self.keys)
            .bind(&self.digests)
            .bind(&self.versions)
            .bind(&self.bodies)
            .bind(&self.content_types)
            .bind(&self.derived)
            .bind(secs(lease))
            .bind(owner)
            .bind(&self.legacy)
            .bind(&self.routes)
    }
}

impl Store {
    /// The plan PostgreSQL would run the claim of `requests` with, as
    /// `EXPLAIN (COSTS OFF)` prints it, on one of dedupq's own sessions;
    /// `generic`: the plan a prepared statement settles on after its first
    /// executions, which cannot see how many keys a batch holds. Nothing
    /// is claimed. For tests, and for reading a slow claim.
    #[doc(hidden)]
    pub async fn explain_claim(
        &self,
        requests: &[ClaimRequest<'_>],
        generic: bool,
    ) -> Result<String, StoreError> {
        let input = ClaimInput::new(requests);
        let mut tx = self.pool().begin().await?;
        let mode = if generic {
            "SET LOCAL plan_cache_mode = force_generic_plan"
        } else {
            "SET LOCAL plan_cache_mode = force_custom_plan"
        };
        sqlx::query(mode).execute(&mut *tx).await?;
        let sql = format!("EXPLAIN (COSTS OFF) {}", claim_sql());
        let lines: Vec<String> = input
            .bind(sqlx::query(&sql), "explain", Duration::from_secs(30))
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?;
        tx.rollback().await?;
        Ok(lines.join("\n"))
    }
}

pub(super) fn classify(
    row: &PgRow,
    fingerprint: &Fingerprint,
    route: Option<&str>,
) -> Result<ClaimResult, StoreError> {
    if let Some(epoch) = row.try_get::<Option<i64>, _>("claimed_epoch")? {
        let inserted: bool = row.try_get("inserted")?;
        let stored_request = match row.try_get::<Option<Vec<u8>>, _>("stored_body")? {
            Some(body) => Some(StoredRequest {
                body,
                content_type: row.try_get("stored_content_type")?,
                derived_key: row
                    .try_get::<Option<String>, _>("stored_derived_key")?
                    .unwrap_or_default(),
            }),
            None => None,
        };
        let claim = Claim {
            epoch: Epoch(epoch),
            attempts: row.try_get("claimed_attempts")?,
            counted: row.try_get("claimed_counted")?,
            uncertain: !inserted && row.try_get::<Option<bool>, _>("uncertain")?.unwrap_or(true),
            stored_request: stored_request.filter(|r| !r.derived_key.is_empty()),
            age: row
                .try_get::<Option<f64>, _>("claimed_age")?
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .unwrap_or_default(),
            at: RowAt::read(row)?,
        };
        return Ok(if inserted {
            ClaimResult::Won(claim)
        } else {
            ClaimResult::TakenOver(claim)
        });
    }
    let Some(status) = row.try_get::<Option<String>, _>("status")? else {
        return Ok(ClaimResult::Contended);
    };
    // A key belongs to the route that claimed it first; queue messages
    // (no route) share every route's keys.
    if let (Some(route), Some(first)) = (route, row.try_get::<Option<String>, _>("route")?) {
        if route != first {
            return Ok(ClaimResult::OtherRoute { first });
        }
    }
    let stored_digest: Vec<u8> = row.try_get("fingerprint")?;
    let stored_version: i16 = row.try_get("fingerprint_version")?;
    // A row stored under another field set cannot be compared: the key
    // alone decides (see FingerprintSpec::version). Version-1 rows are
    // compared with the message's version-1 digest.
    let comparable = fingerprint.digest_for(stored_version);
    if let Some(digest) = comparable {
        if stored_digest != digest[..] {
            return Ok(ClaimResult::Conflict);
        }
    }
    let lease_until = row.try_get::<Option<DateTime<Utc>>, _>("lease_until")?;
    let open = matches!(status.as_str(), "in_progress" | "unknown");
    let lease_over = row
        .try_get::<Option<bool>, _>("lease_over")?
        .unwrap_or(false);
    if open
        && lease_over
        && stored_version == LEGACY_VERSION
        && fingerprint.version != LEGACY_VERSION
    {
        // The claim had no version-1 digest to compare with: now it is
        // known (same operation), claim again with it. A body that cannot
        // be read the legacy way cannot be shown to be the same payment.
        return Ok(match comparable {
            Some(_) => ClaimResult::Contended,
            None => ClaimResult::Conflict,
        });
    }
    Ok(match KeyStatus::parse(&status)? {
        status @ (KeyStatus::Done | KeyStatus::Failed) => {
            ClaimResult::Duplicate(StoredResult::from_row(row, status)?)
        }
        KeyStatus::Unknown if lease_until.is_none() => ClaimResult::HeldUnknown {
            attempts: row.try_get("attempts")?,
        },
        KeyStatus::InProgress | KeyStatus::Unknown => ClaimResult::Held {
            lease_left: row
                .try_get::<Option<f64>, _>("lease_left")?
                .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
                .unwrap_or_default(),
        },
    })
}
