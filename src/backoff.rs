//! Waiting between tries: one exponential backoff with jitter, and one loop
//! that waits out an outage (PostgreSQL down, a broker refusing a publish)
//! until the operation succeeds, fails for good, or the process stops.

use rand::Rng;
use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Exponential backoff with jitter, between `min` and `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay, and the shortest.
    pub min: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Backoff {
    /// A backoff from `min` to `max`. Should `min` exceed `max`, every
    /// delay is `max`.
    pub const fn new(min: Duration, max: Duration) -> Self {
        Self { min, max }
    }

    /// Delay before attempt `attempt + 1` (attempts count from 1).
    pub fn after_attempt(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(20);
        let base = self.min.saturating_mul(1 << exp).min(self.max);
        // ±20 % so that retries of one burst spread out.
        let jitter: f64 = rand::rng().random_range(0.8..1.2);
        Duration::try_from_secs_f64(base.as_secs_f64() * jitter)
            .unwrap_or(self.max)
            .max(self.min)
            .min(self.max)
    }

    /// How long to wait before re-claiming a key someone else holds: until
    /// its lease ends, but looking again soon since the holder usually
    /// finishes well before that.
    pub fn for_held(&self, until_lease_end: Duration) -> Duration {
        until_lease_end
            .min(self.min.saturating_mul(5))
            .max(self.min)
            .min(self.max)
    }
}

/// Why a wait for an outage ended without success.
#[derive(Debug)]
pub(crate) enum Gave<E> {
    /// The error is not one that waiting cures.
    Up(E),
    /// Asked to stop; the last error is kept.
    Stopped(E),
}

impl<E> Gave<E> {
    /// The last error, however the wait ended.
    pub(crate) fn into_inner(self) -> E {
        match self {
            Gave::Up(e) | Gave::Stopped(e) => e,
        }
    }
}

/// Runs `op` until it succeeds; while it fails with an error `waitable`
/// accepts, reports it through `on_wait(error, attempt, delay)` and tries
/// again after a backoff. A stop signal ends the wait between tries.
pub(crate) async fn wait_out<T, E, F, Fut>(
    backoff: Backoff,
    stop: &CancellationToken,
    waitable: impl Fn(&E) -> bool,
    mut on_wait: impl FnMut(&E, u32, Duration),
    mut op: F,
) -> Result<T, Gave<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempt = 1;
    loop {
        // `op` bounds itself (pool acquire timeouts, produce timeouts); the
        // stop signal is honoured between tries.
        let error = match op().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if !waitable(&error) {
            return Err(Gave::Up(error));
        }
        let delay = backoff.after_attempt(attempt);
        on_wait(&error, attempt, delay);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.cancelled() => return Err(Gave::Stopped(error)),
        }
        attempt = attempt.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn quick() -> Backoff {
        Backoff::new(Duration::from_millis(1), Duration::from_millis(4))
    }

    #[test]
    fn the_delay_doubles_within_its_bounds() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        for _ in 0..100 {
            assert!(b.after_attempt(1) <= Duration::from_millis(120));
            assert!(b.after_attempt(1) >= Duration::from_millis(100));
            let third = b.after_attempt(3);
            assert!((Duration::from_millis(320)..=Duration::from_millis(480)).contains(&third));
            let late = b.after_attempt(30);
            assert!((Duration::from_millis(800)..=Duration::from_secs(1)).contains(&late));
        }
    }

    #[test]
    fn inverted_or_huge_bounds_give_delays_within_reach_and_never_panic() {
        let inverted = Backoff::new(Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(inverted.after_attempt(1), Duration::from_secs(1));
        assert_eq!(
            inverted.for_held(Duration::from_secs(60)),
            Duration::from_secs(1)
        );
        let huge = Backoff::new(Duration::from_secs(1), Duration::MAX);
        assert!(huge.after_attempt(u32::MAX) >= Duration::from_secs(1));
        assert_eq!(huge.for_held(Duration::ZERO), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn an_outage_is_waited_out_and_a_final_error_is_not() {
        let tries = AtomicU32::new(0);
        let stop = CancellationToken::new();
        let got: Result<u32, Gave<&str>> = wait_out(
            quick(),
            &stop,
            |e| *e == "down",
            |_, _, _| {},
            || async {
                let n = tries.fetch_add(1, Ordering::SeqCst);
                if n < 3 {
                    Err("down")
                } else {
                    Ok(n)
                }
            },
        )
        .await;
        assert_eq!(got.unwrap(), 3);
        let got: Result<(), Gave<&str>> = wait_out(
            quick(),
            &stop,
            |e| *e == "down",
            |_, _, _| {},
            || async { Err("broken") },
        )
        .await;
        assert!(matches!(got, Err(Gave::Up("broken"))));
    }

    #[tokio::test]
    async fn a_stop_ends_the_wait_with_the_last_error() {
        let stop = CancellationToken::new();
        stop.cancel();
        let got: Result<(), Gave<&str>> = wait_out(
            quick(),
            &stop,
            |_| true,
            |_, _, _| {},
            || async { Err("down") },
        )
        .await;
        assert!(matches!(got, Err(Gave::Stopped("down"))));
    }
}
