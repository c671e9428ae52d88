//! Claiming one round of a batch: one statement for all its keys, claimed
//! again (a few times) where it raced a concurrent claimer, and one
//! message at a time where PostgreSQL refuses the statement itself.

use super::batch::Pending;
use super::decision::{Action, DeadLetterReason, Decision, Outcome};
use super::group::ClaimRow;
use super::inner::Inner;
use super::message::Incoming;
use crate::store::{ClaimResult, StoreError};
use crate::telemetry::spans;
use tracing::Instrument;

/// A claim's result, or the dead letter of a message PostgreSQL refused.
pub(super) type Claimed = Result<ClaimResult, Box<Decision>>;

/// How often a claim that raced a concurrent claimer is retried at once.
const CONTENDED_RETRIES: usize = 3;

/// Claims the round; requests that raced a concurrent claimer's insert
/// are claimed again (a few times) to learn the row's real state. A
/// statement PostgreSQL refuses (not an outage) is retried one message at
/// a time, so only the message it cannot take is dead-lettered.
pub(super) async fn claim_round(
    inner: &Inner,
    batch: &[Incoming],
    round: &[Pending],
) -> Result<Vec<Claimed>, StoreError> {
    let (mut results, mut todo) = skip_parked(inner, round);
    for _ in 0..CONTENDED_RETRIES {
        if todo.is_empty() {
            break;
        }
        let got = match claim(inner, batch, round, &todo).await {
            Ok(got) => got.into_iter().map(Ok).collect(),
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => claim_one_by_one(inner, batch, round, &todo, &e).await?,
        };
        let mut again = Vec::new();
        for (&i, r) in todo.iter().zip(got) {
            if let Ok(r) = &r {
                inner.metrics.claims.with_label_values(&[r.label()]).inc();
                if *r == ClaimResult::Contended {
                    again.push(i);
                }
            }
            results[i] = r;
        }
        if again.is_empty() {
            break;
        }
        todo = again;
    }
    Ok(results)
}

/// A key whose answer this process still has to store (its row was held)
/// is not claimed meanwhile: a takeover would call again. Returns every
/// request's result so far (`Locked` for those, `Contended` for the rest)
/// and the positions left to claim.
fn skip_parked(inner: &Inner, round: &[Pending]) -> (Vec<Claimed>, Vec<usize>) {
    let results: Vec<Claimed> = round
        .iter()
        .map(|p| {
            Ok(if inner.parked.holds(&p.parsed.identity) {
                ClaimResult::Locked
            } else {
                ClaimResult::Contended
            })
        })
        .collect();
    let todo: Vec<usize> = (0..round.len())
        .filter(|&i| {
            results[i]
                .as_ref()
                .is_ok_and(|r| *r == ClaimResult::Contended)
        })
        .collect();
    let parked = (round.len() - todo.len()) as u64;
    if parked > 0 {
        inner
            .metrics
            .claims
            .with_label_values(&[ClaimResult::Locked.label()])
            .inc_by(parked);
    }
    (results, todo)
}

async fn claim(
    inner: &Inner,
    batch: &[Incoming],
    round: &[Pending],
    todo: &[usize],
) -> Result<Vec<ClaimResult>, StoreError> {
    let rows: Vec<ClaimRow> = todo
        .iter()
        .map(|&i| {
            let p = &round[i];
            let msg = &batch[p.index];
            ClaimRow {
                identity: p.parsed.identity.clone(),
                fingerprint: p.parsed.fingerprint.clone(),
                body: msg.body.clone(),
                content_type: msg.content_type.clone(),
                derived_key: p.parsed.derived_key.clone(),
                route: p.parsed.route.clone(),
            }
        })
        .collect();
    let n = rows.len();
    let timer = inner
        .metrics
        .store_duration
        .with_label_values(&["claim"])
        .start_timer();
    // Shared with the claims of concurrent callers (see group.rs).
    let got = inner
        .statements
        .claim(rows)
        .instrument(spans::claim(n))
        .await
        .inspect_err(|e| inner.watch.failed(e))?;
    timer.observe_duration();
    inner.watch.worked();
    Ok(got)
}

async fn claim_one_by_one(
    inner: &Inner,
    batch: &[Incoming],
    round: &[Pending],
    todo: &[usize],
    refused: &StoreError,
) -> Result<Vec<Claimed>, StoreError> {
    tracing::warn!(error = %crate::telemetry::chain(refused), messages = todo.len(),
        "PostgreSQL refused a claim statement; claiming its messages one by one");
    let mut out = Vec::with_capacity(todo.len());
    for &i in todo {
        match claim(inner, batch, round, &[i]).await {
            Ok(mut one) => out.push(Ok(one.pop().unwrap_or(ClaimResult::Contended))),
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => out.push(Err(Box::new(Decision::about(
                Outcome::Invalid,
                Action::DeadLetter {
                    reason: DeadLetterReason::StoreRejected,
                    detail: crate::telemetry::chain(&e).to_string(),
                },
                &round[i].parsed,
            )))),
        }
    }
    Ok(out)
}
