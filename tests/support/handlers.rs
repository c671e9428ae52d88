//! Handlers that record every call, so tests can count effects.

use async_trait::async_trait;
use dedupq::handler::{Handler, HandlerCall, HandlerOutcome, HandlerResult};
use serde_json::json;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub derived_key: String,
    pub attempt: u32,
    pub body: serde_json::Value,
    /// The request bytes exactly as the handler got them.
    pub raw: Vec<u8>,
    pub uncertain: bool,
}

/// Succeeds after `delay`, echoing the tenant and body; or plays a script
/// of outcomes first.
#[derive(Default)]
pub struct Recording {
    pub delay: Duration,
    /// Each call waits a random time up to this, on top of `delay`.
    pub jitter: Duration,
    calls: Mutex<Vec<Call>>,
    script: Mutex<VecDeque<HandlerOutcome>>,
    /// The derived key the script plays for (every key when None).
    script_for: Option<String>,
}

impl Recording {
    pub fn with_delay(delay: Duration) -> Self {
        Self {
            delay,
            ..Self::default()
        }
    }

    pub fn with_jitter(jitter: Duration) -> Self {
        Self {
            jitter,
            ..Self::default()
        }
    }

    pub fn scripted(outcomes: Vec<HandlerOutcome>) -> Self {
        Self {
            script: Mutex::new(outcomes.into()),
            ..Self::default()
        }
    }

    /// A script played for the calls of one derived key only; other keys
    /// succeed.
    pub fn scripted_for(derived_key: &str, outcomes: Vec<HandlerOutcome>) -> Self {
        Self {
            script_for: Some(derived_key.to_string()),
            ..Self::scripted(outcomes)
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

#[async_trait]
impl Handler for Recording {
    async fn handle(&self, call: &HandlerCall<'_>) -> HandlerOutcome {
        self.calls.lock().unwrap().push(Call {
            derived_key: call.derived_key.to_string(),
            attempt: call.attempt,
            body: call.json().unwrap_or(serde_json::Value::Null),
            raw: call.request.body.to_vec(),
            uncertain: call.uncertain,
        });
        let jitter = self.jitter.mul_f64(rand::random::<f64>());
        tokio::time::sleep(self.delay + jitter).await;
        let scripted = self
            .script_for
            .as_ref()
            .is_none_or(|k| k == call.derived_key);
        if scripted {
            if let Some(next) = self.script.lock().unwrap().pop_front() {
                return next;
            }
        }
        let charged = call.json::<serde_json::Value>().unwrap_or_default();
        HandlerOutcome::Success(HandlerResult::json(
            201,
            &json!({ "tenant": call.identity.tenant.as_str(), "charged": charged }),
        ))
    }
}
