//! Every contact of the HTTP API with the engine and the key table, in one
//! place: a request becomes an `Incoming` in the same key space as Kafka
//! and RabbitMQ messages, the engine decides it, and the decision becomes a
//! transport-free `Reply` that `answer.rs` turns into an HTTP response.

use crate::config::{ConfigError, IdentitySettings, TenantSource};
use crate::engine::{
    Action, DeadLetterReason, Decision, Header, Incoming, InvalidReason, Outcome, Parsed, Pipeline,
    Source, Unavailable, ROUTE_HEADER,
};
use crate::identity::{IdempotencyKey, Identity, Tenant};
use crate::message::Transport;
use crate::metrics::Metrics;
use crate::store::{KeyState, KeyStatus, Store, StoredResult};
use axum::body::Bytes;
use chrono::{DateTime, Utc};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One authenticated request with its key, before any claim.
pub(super) struct KeyedRequest {
    pub route: Arc<str>,
    pub tenant: Tenant,
    pub key: IdempotencyKey,
    pub body: Bytes,
    /// The request's `Content-Type`, forwarded with the body.
    pub content_type: Option<String>,
    pub received_at: DateTime<Utc>,
    /// The request's headers that go to the handler: `traceparent` and
    /// `tracestate` (continued by the message's span) and those
    /// `handler.pass_headers` names.
    pub passed: Vec<Header>,
}

/// A stored outcome as an answer carries it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StoredReply {
    /// The handler's status (not necessarily a valid HTTP status: a
    /// failure without an answer is stored as 0).
    pub status: i32,
    pub body: Bytes,
    pub content_type: String,
}

/// What the API answers, whichever way it was decided.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Reply {
    /// The key's stored outcome: fresh, or `replayed` for a repeat.
    Stored { result: StoredReply, replayed: bool },
    /// Another request holds the key's live lease.
    InFlight { retry_after: Duration },
    /// The key was used for another operation (fingerprint), or first on
    /// another route: `first_route` names it then.
    Conflict { first_route: Option<String> },
    /// Refused before any claim.
    Invalid { detail: String, too_large: bool },
    /// The handler failed transiently; the key is free for the retry.
    Released { retry_after: Duration },
    /// The handler's effect is unknown (it timed out after sending); the
    /// retry calls it again with the same derived key. None: attempts
    /// exhausted, an operator must reconcile.
    Unknown { retry_after: Option<Duration> },
    /// This worker's lease ended while the handler ran; another owns the key.
    LeaseLost { retry_after: Duration },
    /// Async routes: the command was published (`replayed`: earlier, and
    /// its key is still open).
    Accepted { key: String, replayed: bool },
    /// The key table could not be reached.
    Unavailable { detail: String },
    /// Intake is paused for a provider outage: nothing was claimed or
    /// called; retry after `retry_after`.
    Paused { retry_after: Duration },
}

/// A command that passed the identity rules: ready to claim or publish.
pub(super) struct Checked {
    incoming: Incoming,
    /// What the engine's parser read from it: the engine decides it
    /// without reading it again.
    parsed: Parsed,
    route: String,
}

/// What an async route publishes: the headers the consumers read the same
/// tenant and key from, the body as received.
#[derive(Debug, Clone)]
pub(super) struct Publication {
    pub key: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    /// The request's `Content-Type`, forwarded with the body by the
    /// consumer as it came.
    pub content_type: Option<String>,
}

/// The headers of an async route's message: text names (the ones the
/// identity rules read).
fn text_headers(incoming: &Incoming) -> Vec<(String, Vec<u8>)> {
    incoming
        .headers
        .iter()
        .filter_map(|h| {
            Some((
                h.name_str()?.to_string(),
                h.value.clone().unwrap_or_default(),
            ))
        })
        .collect()
}

impl Checked {
    pub(super) fn identity(&self) -> &Identity {
        &self.parsed.identity
    }

    pub(super) fn publication(&self) -> Publication {
        Publication {
            key: self.parsed.identity.key.as_str().to_string(),
            headers: text_headers(&self.incoming),
            body: self.incoming.body.clone(),
            content_type: self.incoming.content_type.clone(),
        }
    }
}

#[derive(Clone)]
pub(super) struct Gate {
    pipeline: Arc<dyn Pipeline>,
    store: Store,
    tenant_header: Arc<str>,
    next_request: Arc<AtomicU64>,
    /// Keys this process is deciding for a sync request right now: a
    /// concurrent retry of one of them shares that claim (and is answered
    /// 409) instead of queueing a claim of its own on the same row.
    deciding: Arc<Mutex<HashSet<Identity>>>,
}

/// How soon a retry of a key that this process is deciding is invited.
const SHARED_CLAIM_RETRY: Duration = Duration::from_secs(1);

/// Holds a key in [`Gate::deciding`] while its request is decided.
struct Deciding<'a> {
    set: &'a Mutex<HashSet<Identity>>,
    identity: Identity,
}

impl Drop for Deciding<'_> {
    fn drop(&mut self) {
        lock(self.set).remove(&self.identity);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Gate {
    pub(super) fn new(
        pipeline: Arc<dyn Pipeline>,
        store: Store,
        identity: &IdentitySettings,
    ) -> Result<Self, ConfigError> {
        let TenantSource::Header { name } = &identity.tenant else {
            return Err(ConfigError::new(
                "identity.tenant",
                "the HTTP API needs the tenant in a header",
                "use from = \"header\" when [api] is enabled",
            ));
        };
        Ok(Self {
            pipeline,
            store,
            tenant_header: name.as_str().into(),
            next_request: Arc::new(AtomicU64::new(1)),
            deciding: Arc::default(),
        })
    }

    pub(super) fn metrics(&self) -> &Metrics {
        self.pipeline.metrics()
    }

    /// A request refused before it became a message (no key, body over
    /// the limit): counted as invalid, like a queue message without a key.
    pub(super) fn count_invalid(&self) {
        self.count(Outcome::Invalid);
    }

    fn count(&self, outcome: Outcome) {
        self.metrics()
            .messages
            .with_label_values(&[Transport::Http.label(), outcome.label()])
            .inc();
    }

    /// Applies the identity rules of every transport (body size, JSON
    /// object, tenant, key, fingerprint). A refusal claims nothing.
    pub(super) fn check(&self, cmd: KeyedRequest) -> Result<Checked, Reply> {
        let source = Source::Http {
            route: cmd.route.to_string(),
            request_id: self.next_request.fetch_add(1, Ordering::Relaxed),
        };
        // Only these two and the trace context: a tenant header the client
        // sent never gets in.
        // The route goes with an async route's message, so the consumer
        // claims the key for this route as a sync route would.
        let mut incoming = Incoming::new(source, cmd.body.to_vec())
            .with_header(self.tenant_header.as_bytes(), cmd.tenant.as_str())
            .with_header(self.pipeline.parser().key_header(), cmd.key.as_str())
            .with_header(ROUTE_HEADER.as_bytes(), &*cmd.route);
        incoming.headers.extend(cmd.passed);
        incoming.content_type = cmd.content_type;
        incoming.received_at = cmd.received_at;
        match self.pipeline.parser().parse(&incoming) {
            Ok(parsed) => Ok(Checked {
                incoming,
                parsed,
                route: cmd.route.to_string(),
            }),
            Err(reason) => {
                self.count(Outcome::Invalid);
                Err(invalid(&reason))
            }
        }
    }

    /// Sync routes: claim, run the handler, store, in the engine. One
    /// claim per key at a time in this process: a retry of a key already
    /// being decided here is answered in flight at once, without taking a
    /// connection (a row locked elsewhere, or a slow handler, can then
    /// never fill the pool with waiting claims of one key).
    pub(super) async fn decide(&self, checked: Checked) -> Reply {
        let Checked {
            incoming, parsed, ..
        } = checked;
        let identity = parsed.identity.clone();
        let fresh = lock(&self.deciding).insert(identity.clone());
        if !fresh {
            self.count(Outcome::InFlight);
            return Reply::InFlight {
                retry_after: SHARED_CLAIM_RETRY,
            };
        }
        let deciding = Deciding {
            set: &self.deciding,
            identity,
        };
        let batch = std::slice::from_ref(&incoming);
        let verdict = match self.pipeline.process_parsed(batch, vec![parsed]).await {
            Ok(mut decisions) => match decisions.pop() {
                Some(d) => self.verdict(d, &deciding.identity).await,
                None => Reply::Unavailable {
                    detail: "no decision was made".into(),
                },
            },
            Err(Unavailable::Provider { retry_after }) => Reply::Paused { retry_after },
            Err(e) => Reply::Unavailable {
                detail: crate::telemetry::chain(&e).to_string(),
            },
        };
        if let Reply::Stored { .. } = verdict {
            let took = (Utc::now() - incoming.received_at).to_std();
            self.metrics()
                .end_to_end
                .with_label_values(&[Transport::Http.label()])
                .observe(took.unwrap_or_default().as_secs_f64());
        }
        verdict
    }

    async fn verdict(&self, d: Decision, identity: &Identity) -> Reply {
        match d.action {
            // Held for an operator after every attempt: answered unknown.
            Action::Commit { reply: Some(r) } if r.status == KeyStatus::Unknown => {
                Reply::Unknown { retry_after: None }
            }
            Action::Commit { reply: Some(r) } => Reply::Stored {
                result: stored(r),
                replayed: d.outcome == Outcome::Duplicate,
            },
            Action::Commit { reply: None } => self.read_stored(identity).await,
            // Nothing reached the provider (or it kept pointing at the
            // configuration): the key is free for the client's retry.
            Action::DeadLetter {
                reason: DeadLetterReason::ExhaustedRetries | DeadLetterReason::HandlerFault,
                ..
            } => Reply::Released {
                retry_after: super::answer::SOON,
            },
            Action::Postpone { after } => Reply::Paused { retry_after: after },
            Action::DeadLetter {
                reason: DeadLetterReason::Conflict,
                ..
            } => Reply::Conflict { first_route: None },
            Action::DeadLetter {
                reason: DeadLetterReason::KeyReused { first_route },
                ..
            } => Reply::Conflict {
                first_route: Some(first_route),
            },
            Action::DeadLetter {
                reason: DeadLetterReason::Invalid(reason),
                ..
            } => invalid(&reason),
            Action::DeadLetter {
                reason: DeadLetterReason::OutcomeUnknown,
                ..
            } => Reply::Unknown { retry_after: None },
            Action::DeadLetter {
                reason: DeadLetterReason::StoreRejected | DeadLetterReason::RetryLimit,
                detail,
            } => Reply::Unavailable { detail },
            Action::RetryLater { after } => match d.outcome {
                Outcome::Unknown => Reply::Unknown {
                    retry_after: Some(after),
                },
                Outcome::Retried | Outcome::Fault => Reply::Released { retry_after: after },
                Outcome::LeaseLost => Reply::LeaseLost { retry_after: after },
                _ => Reply::InFlight { retry_after: after },
            },
        }
    }

    async fn read_stored(&self, identity: &Identity) -> Reply {
        match self.store.lookup(identity).await {
            Ok(Some(KeyState {
                result: Some(r), ..
            })) => Reply::Stored {
                result: stored(r),
                replayed: false,
            },
            Ok(_) => Reply::Unavailable {
                detail: "the stored outcome could not be read back".into(),
            },
            Err(e) => Reply::Unavailable {
                detail: format!("{e}"),
            },
        }
    }

    /// Async routes: what a repeat of an accepted command gets, without
    /// claiming (the consumer claims). None: the key was never claimed.
    pub(super) async fn look_up(&self, checked: &Checked) -> Option<Reply> {
        let state = match self.store.lookup(checked.identity()).await {
            Ok(state) => state?,
            Err(e) => {
                return Some(Reply::Unavailable {
                    detail: format!("{e}"),
                })
            }
        };
        let other_route = state.route.as_ref().filter(|r| **r != checked.route);
        Some(if let Some(first) = other_route {
            self.count(Outcome::Conflict);
            Reply::Conflict {
                first_route: Some(first.clone()),
            }
        } else if state.conflicts_with(&checked.parsed.fingerprint) {
            self.count(Outcome::Conflict);
            Reply::Conflict { first_route: None }
        } else if state.status == KeyStatus::Unknown {
            // What the sync route answers for it: held for an operator, or
            // still being retried.
            self.count(Outcome::Unknown);
            Reply::Unknown {
                retry_after: (!state.no_lease).then_some(super::answer::SOON),
            }
        } else if let Some(r) = state.result {
            self.count(Outcome::Duplicate);
            Reply::Stored {
                result: stored(r),
                replayed: true,
            }
        } else {
            self.count(Outcome::InFlight);
            Reply::Accepted {
                key: checked.identity().key.as_str().to_string(),
                replayed: true,
            }
        })
    }
}

fn stored(r: StoredResult) -> StoredReply {
    StoredReply {
        status: r.result_status,
        body: Bytes::from(r.body),
        content_type: r
            .content_type
            .unwrap_or_else(|| "application/octet-stream".into()),
    }
}

fn invalid(reason: &InvalidReason) -> Reply {
    Reply::Invalid {
        detail: reason.to_string(),
        too_large: matches!(reason, InvalidReason::TooLarge { .. }),
    }
}
