//! A batch's messages on their way through the leased engine: parsed and
//! waiting for a claim ([`Pending`]), claimed by this worker ([`Owned`]),
//! and what became of the handler call ([`Ran`]).

use super::decision::Outcome;
use super::message::Parsed;
use crate::handler::HandlerOutcome;
use crate::store::Claim;
use std::collections::HashSet;
use std::time::Duration;

/// A parsed message and its position in the batch.
pub(super) struct Pending {
    pub index: usize,
    pub parsed: Parsed,
    /// The message's trace span (disabled when traces are off).
    pub span: tracing::Span,
    /// Test-only: the handler's outcome when it ran before the claim.
    #[cfg(feature = "broken")]
    pub early: Option<crate::handler::HandlerOutcome>,
}

impl Pending {
    pub(super) fn new(index: usize, parsed: Parsed, span: tracing::Span) -> Self {
        Self {
            index,
            parsed,
            span,
            #[cfg(feature = "broken")]
            early: None,
        }
    }
}

/// A key this worker owns: the message that claimed it and the claim.
pub(super) struct Owned<'a> {
    pub pending: &'a Pending,
    pub claim: Claim,
    /// `Processed` for a new key, `Takeover` for one taken over.
    pub fresh: Outcome,
}

impl<'a> Owned<'a> {
    pub(super) fn new(pending: &'a Pending, claim: Claim, fresh: Outcome) -> Self {
        Self {
            pending,
            claim,
            fresh,
        }
    }
}

/// What became of a claim's handler call.
pub(super) enum Ran {
    /// It ran and says how it went; `probe`: it was the one call let
    /// through while intake was paused for a provider outage.
    Called {
        outcome: HandlerOutcome,
        probe: bool,
    },
    /// It never started; nothing reached the provider.
    Skipped(Skip),
}

/// Why a handler call never started.
pub(super) enum Skip {
    /// Intake is paused for a provider outage: try again after this long.
    Paused(Duration),
    /// The lease may have ended (the process was paused, the runtime
    /// stalled) and PostgreSQL could not confirm it.
    LeaseInDoubt,
}

/// Splits off the first message of every identity; the rest keep order.
/// A statement may touch a row once, and messages with one key must be
/// handled in order: the first of each key goes first, repeats in later
/// rounds (where they find the first one's result).
pub(super) fn split_first_occurrences(pending: Vec<Pending>) -> (Vec<Pending>, Vec<Pending>) {
    let mut seen = HashSet::new();
    pending
        .into_iter()
        .partition(|p| seen.insert(p.parsed.identity.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Incoming, Parser, Source};

    fn pending(index: usize, key: &str) -> Pending {
        let msg = Incoming::new(Source::Direct { id: index as u64 }, "{}")
            .with_header("client-id", "acme")
            .with_header("idempotency-key", key);
        let parsed = Parser::new(&Default::default()).parse(&msg).unwrap();
        Pending::new(index, parsed, tracing::Span::none())
    }

    #[test]
    fn repeats_of_a_key_wait_for_a_later_round_in_order() {
        let batch = ["a", "b", "a", "c", "b", "a"]
            .iter()
            .enumerate()
            .map(|(i, k)| pending(i, k))
            .collect();
        let indexes = |ps: &[Pending]| ps.iter().map(|p| p.index).collect::<Vec<_>>();
        let (round, later) = split_first_occurrences(batch);
        assert_eq!(indexes(&round), [0, 1, 3]);
        assert_eq!(indexes(&later), [2, 4, 5]);
        let (round, later) = split_first_occurrences(later);
        assert_eq!(indexes(&round), [2, 4]);
        assert_eq!(indexes(&later), [5]);
    }
}
