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
}

/// Succeeds after `delay`, echoing the tenant and body; or plays a script
/// of outcomes first.
#[derive(Default)]
pub struct Recording {
    pub delay: Duration,
    calls: Mutex<Vec<Call>>,
    script: Mutex<VecDeque<HandlerOutcome>>,
}

impl Recording {
    pub fn with_delay(delay: Duration) -> Self {
        Self {
            delay,
            ..Self::default()
        }
    }

    pub fn scripted(outcomes: Vec<HandlerOutcome>) -> Self {
        Self {
            script: Mutex::new(outcomes.into()),
            ..Self::default()
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
            body: call.body.clone(),
        });
        tokio::time::sleep(self.delay).await;
        if let Some(next) = self.script.lock().unwrap().pop_front() {
            return next;
        }
        HandlerOutcome::Success(HandlerResult {
            status: 201,
            body: json!({ "tenant": call.identity.tenant.as_str(), "charged": call.body }),
        })
    }
}
