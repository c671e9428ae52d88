//! Faults the simulator can be told to inject, set at start or at run time
//! through `POST /admin/knobs` (a partial JSON object).

use rand::Rng;
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Knobs {
    /// Time between recording a charge and answering (the window in which
    /// a client crash leaves an effect without a stored result).
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// Share of requests answered 503 before any charge.
    pub fail_rate: f64,
    /// The next N requests are answered 503 before any charge.
    pub fail_next: u32,
    /// Share of charges declined (402). Card 4000000000000002 is always declined.
    pub decline_rate: f64,
    /// Share of requests that charge and then never answer.
    pub hang_after_charge_rate: f64,
    /// The next N requests charge and then never answer.
    pub hang_after_charge_next: u32,
    /// The next N requests are never answered and charge nothing.
    pub hang_before_charge_next: u32,
    /// Honour Idempotency-Key (a real provider should). Off: every request
    /// charges, to show what a provider without idempotency does.
    pub honour_keys: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            latency: Duration::from_millis(0),
            fail_rate: 0.0,
            fail_next: 0,
            decline_rate: 0.0,
            hang_after_charge_rate: 0.0,
            hang_after_charge_next: 0,
            hang_before_charge_next: 0,
            honour_keys: true,
        }
    }
}

/// What the knobs decide for one request, drawn once when it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fate {
    pub fail: bool,
    pub decline: bool,
    pub hang_before_charge: bool,
    pub hang_after_charge: bool,
}

impl Knobs {
    /// Draws the fate of one request, consuming one of each `*_next` count.
    pub fn draw(&mut self) -> Fate {
        let mut rng = rand::rng();
        let take = |n: &mut u32| {
            let hit = *n > 0;
            *n = n.saturating_sub(1);
            hit
        };
        let fail = take(&mut self.fail_next) || rng.random_bool(self.fail_rate.clamp(0.0, 1.0));
        let hang_before_charge = !fail && take(&mut self.hang_before_charge_next);
        let hang_after_charge = !fail
            && !hang_before_charge
            && (take(&mut self.hang_after_charge_next)
                || rng.random_bool(self.hang_after_charge_rate.clamp(0.0, 1.0)));
        Fate {
            fail,
            decline: rng.random_bool(self.decline_rate.clamp(0.0, 1.0)),
            hang_before_charge,
            hang_after_charge,
        }
    }
}
