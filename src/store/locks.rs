//! Rows another transaction holds. Every statement of dedupq's pool waits
//! at most `store.lock_timeout` for a row lock; when a batch statement runs
//! out of it, the rows held elsewhere are found without waiting, and the
//! statement runs again without them. So a key locked from psql (or by a
//! long transaction) holds back that key alone, never its batch.

use super::{Store, StoreError};
use crate::identity::Identity;
use sqlx::Row;
use std::future::Future;

/// Existing rows of the input that cannot be locked now. The lock mode is
/// the one a claim, finish or renewal takes (an UPDATE of non-key
/// columns), so this finds exactly the rows they would wait for. Locks
/// are released when the statement ends; nothing is written.
const LOCKED_SQL: &str = r#"
SELECT i.ord
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS i(tenant, key, ord)
WHERE EXISTS (SELECT 1 FROM dedupq_keys k WHERE k.tenant = i.tenant AND k.key = i.key)
  AND NOT EXISTS (SELECT 1 FROM dedupq_keys k WHERE k.tenant = i.tenant AND k.key = i.key
                  FOR NO KEY UPDATE SKIP LOCKED)
"#;

/// How often a batch statement is run again around rows found locked
/// before the rest are tried one at a time.
const ROUNDS: usize = 3;

impl Store {
    /// Which of `ids` another transaction holds right now (in input order).
    pub async fn locked_rows(&self, ids: &[&Identity]) -> Result<Vec<bool>, StoreError> {
        let tenants: Vec<&str> = ids.iter().map(|id| id.tenant.as_str()).collect();
        let keys: Vec<&str> = ids.iter().map(|id| id.key.as_str()).collect();
        let rows = self
            .rows(|| sqlx::query(LOCKED_SQL).bind(&tenants).bind(&keys))
            .await?;
        let mut locked = vec![false; ids.len()];
        for row in rows {
            let ord: i64 = row.try_get("ord")?;
            locked[(ord - 1) as usize] = true;
        }
        Ok(locked)
    }

    /// Runs a batch statement over `ids` with `run(subset)`, which answers
    /// for each index of the subset, in order. If it runs out of
    /// `store.lock_timeout` (or a statement timeout cancels it), the rows
    /// another transaction holds get `locked` and the statement runs again
    /// for the rest; a timeout with no row held is an outage, returned as
    /// it is. A lock that moves (a row's insert not committed yet is not
    /// seen as held) is met by trying what is left one row at a time.
    pub(super) async fn around_locks<T, F, Fut>(
        &self,
        ids: &[&Identity],
        locked: impl Fn() -> T,
        mut run: F,
    ) -> Result<Vec<T>, StoreError>
    where
        F: FnMut(Vec<usize>) -> Fut,
        Fut: Future<Output = Result<Vec<T>, StoreError>>,
    {
        let first = match run((0..ids.len()).collect()).await {
            Err(e) if e.is_lock_wait() => e,
            other => return other,
        };
        let mut out: Vec<Option<T>> = (0..ids.len()).map(|_| None).collect();
        let mut todo: Vec<usize> = (0..ids.len()).collect();
        let mut error = first;
        for _ in 0..ROUNDS {
            let subset: Vec<&Identity> = todo.iter().map(|&i| ids[i]).collect();
            let held = self.locked_rows(&subset).await?;
            if !held.contains(&true) && error.sqlstate().as_deref() != Some("55P03") {
                // Cancelled by a statement timeout with no row held: the
                // server is slow, not one key.
                return Err(error);
            }
            let mut rest = Vec::with_capacity(todo.len());
            for (&i, held) in todo.iter().zip(held) {
                if held {
                    out[i] = Some(locked());
                } else {
                    rest.push(i);
                }
            }
            todo = rest;
            if todo.is_empty() {
                return Ok(finish(out, &locked));
            }
            match run(todo.clone()).await {
                Ok(got) => {
                    for (&i, r) in todo.iter().zip(got) {
                        out[i] = Some(r);
                    }
                    return Ok(finish(out, &locked));
                }
                Err(e) if e.is_lock_wait() => error = e,
                Err(e) => return Err(e),
            }
        }
        tracing::warn!(error = %crate::telemetry::chain(&error), rows = todo.len(),
            "a row lock moved between statements; trying the rest one row at a time");
        for &i in &todo {
            match run(vec![i]).await {
                Ok(mut got) => out[i] = got.pop(),
                Err(e) if e.is_lock_wait() => out[i] = Some(locked()),
                Err(e) => return Err(e),
            }
        }
        Ok(finish(out, &locked))
    }
}

fn finish<T>(out: Vec<Option<T>>, locked: &impl Fn() -> T) -> Vec<T> {
    out.into_iter().map(|r| r.unwrap_or_else(locked)).collect()
}
