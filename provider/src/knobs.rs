//! Faults the simulator can be told to inject, set at start or at run time
//! through `POST /admin/knobs` (a partial JSON object).

use rand::Rng;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How a repeated key's body is compared with the first one's.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Compare {
    /// Canonical JSON: key order and insignificant whitespace do not matter.
    #[default]
    Json,
    /// Any byte difference is another body (as a provider hashing the raw
    /// request does).
    Bytes,
}

/// An answer after charging that a careless client may choke on.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OddAnswer {
    /// Valid JSON with a `\u0000` escape in a string (PostgreSQL's jsonb
    /// refuses it).
    NulEscape,
    /// A raw NUL byte and bytes that are not UTF-8: not JSON at all,
    /// though labelled `application/json`.
    RawBytes,
    /// The charge's `201` and headers, its full length declared, then half
    /// its body and the connection dropped: the answer breaks off. The
    /// charge keeps its whole answer, which a repeat replays.
    CutBody,
}

/// The longest `answer_padding`.
pub(crate) const MAX_ANSWER_PADDING: usize = 1024 * 1024;

/// Statuses the simulator can answer instead of charging: configuration
/// faults and redirects (whose `Location` is the charge listing).
pub const STATUS_ANSWERS: [u16; 10] = [301, 302, 303, 307, 308, 401, 403, 404, 405, 429];

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Knobs {
    /// Time between recording a charge and answering (the window in which
    /// a client crash leaves an effect without a stored result). The key
    /// counts as running (409 to a repeat) during it.
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// Share of requests answered 503 before any charge.
    pub fail_rate: f64,
    /// The next N requests are answered 503 before any charge.
    pub fail_next: u32,
    /// Those 503s carry `Retry-After: 1`, saying the request was not
    /// processed (what a provider that sheds load answers). Off: a bare 503,
    /// as a load balancer in front of a provider in an outage answers,
    /// which says nothing about whether anything happened.
    pub fail_retry_after: bool,
    /// Share of charges declined (402). Card 4000000000000002 is always declined.
    pub decline_rate: f64,
    /// Share of requests that charge and then never answer; the key counts
    /// as running until the caller hangs up.
    pub hang_after_charge_rate: f64,
    /// The next N requests charge and then never answer.
    pub hang_after_charge_next: u32,
    /// The next N requests are never answered and charge nothing.
    pub hang_before_charge_next: u32,
    /// How long a slow request runs after charging before it answers (it
    /// runs on if the caller hangs up; the key counts as running).
    #[serde(with = "humantime_serde")]
    pub slow_after_charge: Duration,
    /// Share of requests that are slow after charging.
    pub slow_after_charge_rate: f64,
    /// The next N requests are slow after charging.
    pub slow_after_charge_next: u32,
    /// Share of requests that charge and then answer
    /// `error_after_charge_status` (a 5xx): the provider acted, its answer
    /// says it failed.
    pub error_after_charge_rate: f64,
    /// The next N requests charge and then answer the error.
    pub error_after_charge_next: u32,
    /// The 5xx those requests answer (default 500).
    pub error_after_charge_status: u16,
    /// A repeat of such a key replays the error, as Stripe's v1 API does
    /// with a 500 it cached; off: a repeat gets the charge.
    pub error_after_charge_replay: bool,
    /// The status answered instead of charging (one of `STATUS_ANSWERS`).
    pub answer_status: Option<u16>,
    /// Share of requests answered `answer_status`, with no charge.
    pub answer_status_rate: f64,
    /// The next N requests are answered `answer_status`, with no charge.
    pub answer_status_next: u32,
    /// `Retry-After` (seconds) on those answers: a 429 with it is a
    /// provider's rate limit. None: no `Retry-After`.
    pub answer_retry_after: Option<u32>,
    /// The answer the next `odd_answer_next` charges get (and keep: a
    /// repeat replays it).
    pub odd_answer: Option<OddAnswer>,
    pub odd_answer_next: u32,
    /// Bytes of a `receipt` string every charge's answer carries, made not
    /// to compress (a provider's long receipt; a stored outcome that needs
    /// room of its own). 0: none.
    pub answer_padding: usize,
    /// How a repeated key's body is compared with the first.
    pub compare: Compare,
    /// Honour Idempotency-Key (a real provider should). Off: every request
    /// charges, to show what a provider without idempotency does.
    pub honour_keys: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            fail_rate: 0.0,
            fail_next: 0,
            fail_retry_after: true,
            decline_rate: 0.0,
            hang_after_charge_rate: 0.0,
            hang_after_charge_next: 0,
            hang_before_charge_next: 0,
            slow_after_charge: Duration::ZERO,
            slow_after_charge_rate: 0.0,
            slow_after_charge_next: 0,
            error_after_charge_rate: 0.0,
            error_after_charge_next: 0,
            error_after_charge_status: 500,
            error_after_charge_replay: false,
            answer_status: None,
            answer_status_rate: 0.0,
            answer_status_next: 0,
            answer_retry_after: None,
            odd_answer: None,
            odd_answer_next: 0,
            answer_padding: 0,
            compare: Compare::Json,
            honour_keys: true,
        }
    }
}

/// A knob with a value the simulator cannot use.
#[derive(Debug, thiserror::Error)]
#[error("provider knob {knob}: {problem}")]
pub struct KnobError {
    pub knob: String,
    pub problem: String,
}

/// What happens after a request charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterCharge {
    /// Answer after `latency`.
    Answer,
    /// Answer after this long.
    Slow(Duration),
    /// Never answer.
    Hang,
}

/// What the knobs decide for one request, drawn once when it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fate {
    pub fail: bool,
    /// Answer this status instead of charging.
    pub status_instead: Option<u16>,
    pub decline: bool,
    pub hang_before_charge: bool,
    pub after_charge: AfterCharge,
    /// Charges, then answers `error_after_charge_status`.
    pub error_after_charge: bool,
    pub odd_answer: Option<OddAnswer>,
}

impl Knobs {
    /// Refuses values no request could be served with, naming the knob.
    pub fn validate(&self) -> Result<(), KnobError> {
        let rates = [
            ("fail_rate", self.fail_rate),
            ("decline_rate", self.decline_rate),
            ("hang_after_charge_rate", self.hang_after_charge_rate),
            ("slow_after_charge_rate", self.slow_after_charge_rate),
            ("answer_status_rate", self.answer_status_rate),
            ("error_after_charge_rate", self.error_after_charge_rate),
        ];
        for (knob, rate) in rates {
            if !(0.0..=1.0).contains(&rate) {
                return Err(KnobError {
                    knob: knob.into(),
                    problem: format!("{rate} is not a share between 0 and 1"),
                });
            }
        }
        if self.answer_padding > MAX_ANSWER_PADDING {
            return Err(KnobError {
                knob: "answer_padding".into(),
                problem: format!(
                    "{} is more than {MAX_ANSWER_PADDING} bytes",
                    self.answer_padding
                ),
            });
        }
        if !(500..=599).contains(&self.error_after_charge_status) {
            return Err(KnobError {
                knob: "error_after_charge_status".into(),
                problem: format!("{} is not a 5xx", self.error_after_charge_status),
            });
        }
        match self.answer_status {
            Some(s) if !STATUS_ANSWERS.contains(&s) => Err(KnobError {
                knob: "answer_status".into(),
                problem: format!("{s} is not one of {STATUS_ANSWERS:?}"),
            }),
            None if self.answer_status_rate > 0.0 || self.answer_status_next > 0 => {
                Err(KnobError {
                    knob: "answer_status".into(),
                    problem: "set it to the status to answer".into(),
                })
            }
            _ if self.odd_answer.is_none() && self.odd_answer_next > 0 => Err(KnobError {
                knob: "odd_answer".into(),
                problem: "set it to nul_escape or raw_bytes".into(),
            }),
            _ => Ok(()),
        }
    }

    /// These knobs with the fields of `patch` (a JSON object) replaced,
    /// validated; an error names the first knob that does not fit.
    pub fn patched(&self, patch: serde_json::Value) -> Result<Knobs, KnobError> {
        let serde_json::Value::Object(fields) = patch else {
            return Err(KnobError {
                knob: "knobs".into(),
                problem: "expected a JSON object of knobs".into(),
            });
        };
        let mut merged = serde_json::to_value(self).map_err(|e| KnobError {
            knob: "knobs".into(),
            problem: e.to_string(),
        })?;
        for (knob, value) in fields {
            merged[&knob] = value;
            if let Err(e) = serde_json::from_value::<Knobs>(merged.clone()) {
                return Err(KnobError {
                    knob,
                    problem: e.to_string(),
                });
            }
        }
        let new: Knobs = serde_json::from_value(merged).map_err(|e| KnobError {
            knob: "knobs".into(),
            problem: e.to_string(),
        })?;
        new.validate()?;
        Ok(new)
    }

    /// Draws the fate of one request, consuming one of each `*_next` count
    /// it uses.
    pub fn draw(&mut self) -> Fate {
        let mut rng = rand::rng();
        let mut hit = |next: &mut u32, rate: f64| {
            let taken = *next > 0;
            *next = next.saturating_sub(1);
            taken || rng.random_bool(rate.clamp(0.0, 1.0))
        };
        let fail = hit(&mut self.fail_next, self.fail_rate);
        let status_instead = (!fail && hit(&mut self.answer_status_next, self.answer_status_rate))
            .then_some(self.answer_status)
            .flatten();
        let answers_early = fail || status_instead.is_some();
        let hang_before_charge = !answers_early && hit(&mut self.hang_before_charge_next, 0.0);
        let charges = !answers_early && !hang_before_charge;
        let after_charge = if charges
            && hit(
                &mut self.hang_after_charge_next,
                self.hang_after_charge_rate,
            ) {
            AfterCharge::Hang
        } else if charges
            && hit(
                &mut self.slow_after_charge_next,
                self.slow_after_charge_rate,
            )
        {
            AfterCharge::Slow(self.slow_after_charge)
        } else {
            AfterCharge::Answer
        };
        let error_after_charge = charges
            && after_charge == AfterCharge::Answer
            && hit(
                &mut self.error_after_charge_next,
                self.error_after_charge_rate,
            );
        let odd_answer = (charges && hit(&mut self.odd_answer_next, 0.0))
            .then_some(self.odd_answer)
            .flatten();
        Fate {
            fail,
            status_instead,
            decline: rng.random_bool(self.decline_rate.clamp(0.0, 1.0)),
            hang_before_charge,
            after_charge,
            error_after_charge,
            odd_answer,
        }
    }
}
