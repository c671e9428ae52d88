//! Fact (d): how long a poison holds its queue before RabbitMQ
//! dead-letters it, with a reconnect loop like dedupq's (backoff from
//! 200 ms doubling to 10 s, ±20 % jitter).
//!
//! The poison is dead-lettered by the (L + 1)-th failed session, so the
//! time from its first delivery is the sum of the L reconnect waits plus L
//! sessions (connect, channel, qos, consume, the failure: 30–40 ms each
//! here); the broker adds no delay of its own. Everything behind the
//! poison (in its queue) waits that long.
//!
//! - Backoff reset whenever a session got as far as consuming (dedupq's
//!   runner today: `established` is set once the consumers start, and a
//!   poisoned session always gets that far): every wait is the minimum
//!   (200–240 ms after jitter), about L × 250 ms in all. Measured here
//!   with L = 20: 5.0 s (4.3 s of waits).
//! - Backoff reset only after a session that received a delivery (a
//!   poisoned session receives none): the waits double, 0.2 + 0.4 + 0.8 +
//!   1.6 s ≈ 3 s for L = 4 (measured: 3.07 s); for L = 20 that would be
//!   0.2 + 0.4 + … + 6.4 + 14 × 10 s ≈ 153 s.

use super::raw_amqp_publish::hostile_properties;
use super::topology::{consume_session, is_parsing_error, Limited};
use crate::support::amqp::{amqp_url, Client};
use crate::support::raw_amqp::publish_raw;
use rand::Rng;
use std::time::Duration;
use tokio::time::Instant;

const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// The wait before reconnect attempt `attempt + 1`, as dedupq computes it.
fn backoff(attempt: u32) -> Duration {
    let base = BACKOFF_MIN
        .saturating_mul(1 << attempt.saturating_sub(1).min(20))
        .min(BACKOFF_MAX);
    let jitter: f64 = rand::rng().random_range(0.8..1.2);
    base.mul_f64(jitter).clamp(BACKOFF_MIN, BACKOFF_MAX)
}

#[derive(Clone, Copy, PartialEq)]
enum Reset {
    WhenConsumingStarted,
    AfterADeliveryArrived,
}

struct Measured {
    failed_sessions: usize,
    first_delivery_to_dead_letter: Duration,
    waited: Duration,
}

/// Runs the reconnect loop against a poison on a queue with
/// `x-delivery-limit = limit` until a session no longer fails.
async fn measure(limit: i32, reset: Reset) -> Measured {
    let client = Client::connect().await;
    let queues = Limited::declare(&client, limit).await;
    publish_raw(&amqp_url(), &queues.work, &hostile_properties(), b"{}")
        .await
        .expect("publish the poison");
    let dead_letters = queues.dead_letters.clone();
    let watcher = tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(300);
        while client.ready(&dead_letters).await == 0 {
            assert!(Instant::now() < deadline, "no dead letter in 300 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Instant::now()
    });

    let started = Instant::now();
    let (mut attempt, mut failed, mut waits) = (1, 0, Vec::new());
    loop {
        let session = consume_session(&queues.work, 256, false, Duration::from_secs(2)).await;
        match session.error {
            Some(e) if is_parsing_error(&e) => failed += 1,
            _ => break,
        }
        let established = match reset {
            Reset::WhenConsumingStarted => true,
            Reset::AfterADeliveryArrived => !session.received.is_empty(),
        };
        if established {
            attempt = 1;
        }
        let wait = backoff(attempt);
        waits.push(wait);
        tokio::time::sleep(wait).await;
        attempt += 1;
    }
    let dead_at = watcher.await.expect("watcher");
    // The last failed session dead-lettered the poison: the wait after it
    // is not part of the time.
    waits.pop();
    Measured {
        failed_sessions: failed,
        first_delivery_to_dead_letter: dead_at - started,
        waited: waits.iter().sum(),
    }
}

/// The dead letter comes right with the (L + 1)-th failed session: what
/// is not reconnect wait is a few tens of milliseconds per session.
fn assert_dead_lettered_by_the_last_session(m: &Measured, limit: i32) {
    assert_eq!(m.failed_sessions, limit as usize + 1);
    assert!(m.first_delivery_to_dead_letter >= m.waited);
    let per_session = (m.first_delivery_to_dead_letter - m.waited) / limit as u32;
    eprintln!(
        "limit {limit}: dead letter {:?} after the first delivery ({:?} of reconnect waits, {:?} per session)",
        m.first_delivery_to_dead_letter, m.waited, per_session
    );
    assert!(per_session < Duration::from_millis(500), "{per_session:?}");
}

#[tokio::test]
async fn with_the_backoff_reset_by_every_consuming_session_a_poison_holds_the_queue_about_limit_times_the_minimum_wait(
) {
    let limit = 20;

    let m = measure(limit, Reset::WhenConsumingStarted).await;

    assert_dead_lettered_by_the_last_session(&m, limit);
    // Every wait is the minimum: 200..240 ms.
    assert!(m.waited >= BACKOFF_MIN * limit as u32);
    assert!(m.waited <= BACKOFF_MIN.mul_f64(1.2) * limit as u32);
}

#[tokio::test]
async fn with_the_backoff_reset_only_by_a_delivery_the_waits_double_until_the_poison_is_dead_lettered(
) {
    let limit = 4;

    let m = measure(limit, Reset::AfterADeliveryArrived).await;

    assert_dead_lettered_by_the_last_session(&m, limit);
    // 200 + 400 + 800 + 1600 ms, each ±20 %.
    assert!(m.waited >= Duration::from_millis(2400), "{:?}", m.waited);
    assert!(m.waited <= Duration::from_millis(3600), "{:?}", m.waited);
}
