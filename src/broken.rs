//! Test-only switches that deliberately break one guarantee each, so the
//! tests can show that they catch the broken variant.
//!
//! The switches exist only in a build with the `broken` feature, never in a
//! release; without it [`is`] is `false` and every broken branch is
//! compiled out. A `broken` build breaks the one guarantee named in
//! `DEDUPQ_BROKEN` (read once by each process; the processes it starts
//! inherit it), and none while it is unset. One build thus serves every
//! broken variant: `DEDUPQ_BROKEN=no-fencing cargo test --features broken
//! --test it engine::takeover`.

/// One guarantee switched off.
// Without the feature, the switch that guards code compiled only with it
// is never named.
#[cfg_attr(not(feature = "broken"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Break {
    /// The store writes an outcome without matching the claim's epoch, so
    /// a stale worker overwrites the current owner's row.
    NoFencing,
    /// The naive order: the handler runs first, the key is claimed after.
    ClaimAfterWork,
    /// Every replica runs upkeep: no advisory lock elects a leader.
    NoUpkeepLock,
    /// The upkeep leader purges with its own `retention.keep`, ignoring the
    /// longer keep other live replicas announce.
    OwnKeepOnly,
    /// Instances started together migrate without the advisory lock that
    /// serialises them.
    NoMigrateLock,
    /// The HTTP handler forwards the producer's `traceparent` instead of
    /// its own span's context.
    NoTracePropagation,
    /// A queued handler call starts without checking that its lease is
    /// still this worker's.
    NoLeaseCheck,
    /// An attempt whose request went out but does not count (a failed
    /// probe, a fault, a 409) gives its number back, so the next request
    /// of the key carries the same `X-Dedupq-Attempt`.
    SentAttemptGivenBack,
    /// A store fault that passes (a read-only server, a lost connection,
    /// a timeout) is taken as final: what it met is dead-lettered or
    /// given up instead of waiting for PostgreSQL.
    StoreFaultsFinal,
    /// A Kafka producer librdkafka made fatal is kept: every record it is
    /// given fails until dedupq restarts.
    FatalProducerKept,
}

#[cfg(feature = "broken")]
impl Break {
    const ALL: [(&'static str, Break); 10] = [
        ("no-fencing", Break::NoFencing),
        ("claim-after-work", Break::ClaimAfterWork),
        ("no-upkeep-lock", Break::NoUpkeepLock),
        ("own-keep-only", Break::OwnKeepOnly),
        ("no-migrate-lock", Break::NoMigrateLock),
        ("no-trace-propagation", Break::NoTracePropagation),
        ("no-lease-check", Break::NoLeaseCheck),
        ("sent-attempt-given-back", Break::SentAttemptGivenBack),
        ("store-faults-final", Break::StoreFaultsFinal),
        ("fatal-producer-kept", Break::FatalProducerKept),
    ];
}

/// Whether this process runs with `what` broken.
#[cfg(feature = "broken")]
pub(crate) fn is(what: Break) -> bool {
    static CHOSEN: std::sync::OnceLock<Option<Break>> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let name = std::env::var("DEDUPQ_BROKEN").ok()?;
        match Break::ALL.iter().find(|(n, _)| *n == name) {
            Some((_, b)) => Some(*b),
            None => {
                let known: Vec<&str> = Break::ALL.iter().map(|(n, _)| *n).collect();
                // A mistyped name would break nothing and prove nothing.
                eprintln!("DEDUPQ_BROKEN={name:?} names no switch; known: {known:?}");
                std::process::exit(2);
            }
        }
    }) == Some(what)
}

/// Whether this process runs with `what` broken: never, in this build.
#[cfg(not(feature = "broken"))]
#[inline(always)]
pub(crate) const fn is(_what: Break) -> bool {
    false
}
