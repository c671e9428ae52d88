//! Claims and finishes in one statement: the commit that makes one
//! caller's outcome durable also makes another caller's claim durable, so
//! a crowd of single requests (HTTP, an embedder calling per message) pays
//! one round trip and one WAL flush per round of the shared statement
//! instead of one for its claims and one for its finishes.

use super::claim::{ClaimInput, CLAIM_COLUMNS, CLAIM_CTES, CLAIM_SELECT};
use super::finish::{finish_ctes, FinishInput, Reach};
use super::{ClaimRequest, ClaimResult, FinishWrite, Store, StoreError, Written};
use sqlx::Row;
use std::time::Duration;

/// The finish's CTEs (parameters 12–23) before the claim's (1–11). Every
/// CTE sees the statement's snapshot: the claim reads no row the finish
/// writes, because no key is in both (the caller's duty). The claim's rows
/// come back first, then one row per finish written, with only `finished`
/// set (its position in the finish's sorted input).
pub(super) fn together_sql(reach: Reach) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; 2] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    SQL[reach as usize].get_or_init(|| {
        let nulls = vec!["NULL"; CLAIM_COLUMNS].join(", ");
        let finished: String = reach
            .writes()
            .iter()
            .map(|cte| format!("UNION ALL\nSELECT {nulls}, ord FROM {cte}\n"))
            .collect();
        format!(
            "WITH {},\n{CLAIM_CTES}{CLAIM_SELECT}{finished}",
            finish_ctes(11, reach)
        )
    })
}

impl Store {
    /// Claims `requests` and writes `finishes` in one statement (one round
    /// trip, one commit). No key may be in both, nor twice in either.
    /// Answers as [`Store::claim_batch`] and [`Store::finish_batch`] would,
    /// in input order, except that it does not wait around rows another
    /// transaction holds: a lock wait fails the whole statement, and the
    /// caller then claims and finishes apart.
    pub async fn claim_and_finish(
        &self,
        requests: &[ClaimRequest<'_>],
        owner: &str,
        lease: Duration,
        finishes: &[FinishWrite<'_>],
    ) -> Result<(Vec<ClaimResult>, Vec<Written>), StoreError> {
        let claims = ClaimInput::new(requests);
        let writes: Vec<&FinishWrite<'_>> = finishes.iter().collect();
        let finished = FinishInput::new(&writes);
        let rows = self
            .rows(|| {
                let query = claims.bind(
                    sqlx::query(together_sql(Reach::of(finishes.len()))),
                    owner,
                    lease,
                );
                finished.bind(query)
            })
            .await?;
        let mut landed = vec![false; finishes.len()];
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            match row.try_get::<Option<i64>, _>("finished")? {
                Some(ord) => finished.landed(ord, &mut landed)?,
                None => claimed.push(row),
            }
        }
        let results = claims.results(requests, &claimed)?;
        let written = landed
            .into_iter()
            .map(|l| if l { Written::Landed } else { Written::Fenced })
            .collect();
        Ok((results, written))
    }
}
