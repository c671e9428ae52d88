//! dedupq-provider: a payment-provider simulator backed by PostgreSQL.
//! It charges once per Idempotency-Key (unless told not to), as a
//! Stripe-like provider does, and can add latency, fail, decline, hang,
//! answer statuses instead of charging, answer odd bodies and forget its
//! keys, so dedupq's tests, demo and chaos runs can count real effects.
//! [`serve`] runs it in a process of one's own (the tests do); the
//! `dedupq-provider` binary runs it on its own ([`Args`]).

mod answer;
mod api;
mod args;
mod canonical;
mod charge;
mod knobs;
mod ledger;
mod report;
mod serve;

pub use args::Args;
pub use charge::DECLINED_CARD;
pub use knobs::{AfterCharge, Compare, Fate, KnobError, Knobs, OddAnswer, STATUS_ANSWERS};
pub use ledger::LedgerError;
pub use report::{Charge, ChargeState, KeyCharges, Stats};
pub use serve::{serve, ProviderError};
