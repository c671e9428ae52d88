//! `POST /v1/<route>`: authenticate, read the body within its limit, find
//! the key, check the identity rules — all before any claim — then run the
//! handler (sync) or publish the command (async).

use super::answer::{self, answer};
use super::auth::Callers;
use super::body::read_body;
use super::decide::{Checked, Gate, KeyedRequest, Reply};
use super::problem::Problem;
use super::publish::PublishError;
use super::route::Route;
use super::signature::Webhook;
use crate::engine::Header;
use crate::identity::Tenant;
use axum::extract::{Request, State};
use axum::http::HeaderName;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use futures::future::BoxFuture;
use futures::FutureExt;
use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

pub(super) struct ApiState {
    pub routes: HashMap<String, Route>,
    pub callers: Callers,
    pub gate: Gate,
    pub in_flight: Arc<Semaphore>,
    /// identity.max_body_bytes: the same limit on every transport.
    pub body_limit: usize,
    pub request_timeout: Duration,
    /// Sync work outlives its request (a client that gives up does not stop
    /// a payment half-way); shutdown waits for it.
    pub tasks: TaskTracker,
    /// Request headers that go with the request to the handler (through a
    /// broker for async routes): the trace context and
    /// `handler.pass_headers`, as a Kafka or RabbitMQ message's would.
    pub passed: Vec<HeaderName>,
}

impl ApiState {
    /// Reads the API keys file and the webhook secret files again where
    /// they changed; one that cannot be used keeps the credentials it held.
    pub(super) fn reload_credentials(&self) {
        self.callers.reload_logged();
        for route in self.routes.values() {
            if let Some(hook) = &route.webhook {
                hook.reload_logged();
            }
        }
    }
}

/// The headers of a request that reach the handler: the trace context and
/// what `handler.pass_headers` names, except the ones that name the
/// payment (those come from the authenticated caller and the route).
pub(super) fn passed_headers(settings: &crate::config::Settings) -> Vec<HeaderName> {
    let identity: Vec<String> = [
        Some(settings.identity.key_header.to_ascii_lowercase()),
        match &settings.identity.tenant {
            crate::config::TenantSource::Header { name } => Some(name.to_ascii_lowercase()),
            _ => None,
        },
        Some(crate::engine::ROUTE_HEADER.to_string()),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut names: Vec<HeaderName> = crate::telemetry::CONTEXT_HEADERS
        .iter()
        .map(|n| n.to_string())
        .chain(settings.handler.pass_headers.iter().cloned())
        .filter(|n| !identity.contains(&n.to_ascii_lowercase()))
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .collect();
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    names
}

fn headers_passed(passed: &[HeaderName], request: &axum::http::HeaderMap) -> Vec<Header> {
    passed
        .iter()
        .flat_map(|name| {
            request
                .get_all(name)
                .iter()
                .map(move |v| Header::new(name.as_str(), v.as_bytes()))
        })
        .collect()
}

pub(super) async fn handle(
    State(s): State<Arc<ApiState>>,
    name: String,
    request: Request,
) -> Response {
    let Some(route) = s.routes.get(&name) else {
        return answer::no_route(&format!("/v1/{name}"));
    };
    let Ok(_permit) = s.in_flight.clone().try_acquire_owned() else {
        return answer::overloaded();
    };
    let deadline = Instant::now() + s.request_timeout;
    let response = match accept(&s, route, request, deadline).await {
        Ok(r) | Err(r) => r,
    };
    tracing::debug!(route = %route.name, status = response.status().as_u16(), "api request");
    response
}

/// Who signs or authenticates a request: known from its headers, or only
/// once the body is there to check the signature against.
enum Sender<'a> {
    Caller(Tenant),
    Signed(&'a Webhook),
}

async fn accept(
    s: &ApiState,
    route: &Route,
    request: Request,
    deadline: Instant,
) -> Result<Response, Response> {
    let received_at = Utc::now();
    let (parts, body) = request.into_parts();
    let sender = match &route.webhook {
        Some(hook) => Sender::Signed(hook),
        None => Sender::Caller(s.callers.tenant(&parts.headers).map_err(problem)?),
    };
    let read = read_body(&parts.headers, body, s.body_limit);
    let body = match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => {
            s.gate.count_invalid();
            return Err(problem(e));
        }
        Err(_) => return Err(answer::body_timeout()),
    };
    let tenant = match sender {
        Sender::Caller(tenant) => tenant,
        Sender::Signed(hook) => hook.authenticate(&parts.headers, &body).map_err(problem)?,
    };
    let key = route
        .key
        .extract(&parts.headers, &body)
        .and_then(|key| route.namespaced(key, &body))
        .map_err(|e| {
            s.gate.count_invalid();
            problem(e)
        })?;
    let content_type = parts
        .headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let command = KeyedRequest {
        route: route.name.clone(),
        tenant,
        key,
        body,
        content_type,
        received_at,
        passed: headers_passed(&s.passed, &parts.headers),
    };
    let checked = s.gate.check(command).map_err(answer)?;
    Ok(match &route.publish {
        None => run(s, checked, deadline).await,
        Some(destination) => {
            if let Some(verdict) = s.gate.look_up(&checked).await {
                return Ok(answer(verdict));
            }
            let message = checked.publication();
            match tokio::time::timeout_at(deadline, destination.publish(&message)).await {
                Ok(Ok(())) => answer(Reply::Accepted {
                    key: checked.identity().key.as_str().to_string(),
                    replayed: false,
                }),
                Ok(Err(e)) => problem(e),
                Err(_) => problem(PublishError::Timeout),
            }
        }
    })
}

/// Sync routes: the engine decides in this request's own task, and if the
/// request ends first (it times out, or its client goes away) the decision
/// goes on in a task of its own, which finishes and stores the outcome.
/// Deciding in place spares each request a task and the hand-offs to it
/// and back (alternated runs of `h http sync 100c`: 5–9% less of the
/// process's CPU, BENCHMARKS.md).
async fn run(s: &ApiState, checked: Checked, deadline: Instant) -> Response {
    let gate = s.gate.clone();
    let work = Detachable::new(s.tasks.clone(), async move { gate.decide(checked).await });
    match tokio::time::timeout_at(deadline, work).await {
        Ok(Ok(verdict)) => answer(verdict),
        Ok(Err(Panicked)) => answer::internal("the request's decision failed"),
        // Dropped here, the decision carries on in a tracked task.
        Err(_) => answer::still_running(),
    }
}

/// A decision that panicked: answered 500, as a task's failure would be.
struct Panicked;

/// A decision polled where it was started that, dropped before it ends,
/// carries on in a task of `tasks` (which shutdown waits for). A panic
/// ends this decision only, never the connection's task: its work is
/// dropped (the key's lease runs out and it is taken over), as a task that
/// panicked would have been.
struct Detachable {
    tasks: TaskTracker,
    work: Option<BoxFuture<'static, std::thread::Result<Reply>>>,
}

impl Detachable {
    fn new(tasks: TaskTracker, work: impl Future<Output = Reply> + Send + 'static) -> Self {
        Self {
            tasks,
            work: Some(AssertUnwindSafe(work).catch_unwind().boxed()),
        }
    }
}

impl Future for Detachable {
    type Output = Result<Reply, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Polled again after it ended (never, under `timeout_at`).
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(Err(Panicked));
        };
        let verdict = ready!(work.as_mut().poll(cx));
        self.work = None;
        Poll::Ready(verdict.map_err(|_| Panicked))
    }
}

impl Drop for Detachable {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        // Outside a runtime (it is being torn down) the work is dropped:
        // its key's lease runs out and the key is taken over, as after a
        // crash.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.tasks.spawn_on(work, &runtime);
        }
    }
}

fn problem(e: impl Into<Problem>) -> Response {
    e.into().into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    fn stored_nowhere() -> Reply {
        Reply::Unavailable {
            detail: "test".into(),
        }
    }

    #[tokio::test]
    async fn a_decision_that_panics_is_answered_as_panicked_and_its_caller_goes_on() {
        let tasks = TaskTracker::new();
        let work = async {
            if std::hint::black_box(true) {
                panic!("a bug inside the decision");
            }
            stored_nowhere()
        };
        let outcome = Detachable::new(tasks.clone(), work).await;
        assert!(matches!(outcome, Err(Panicked)));
        // Nothing was left to carry on.
        assert_eq!(tasks.len(), 0);
        let after = Detachable::new(tasks, async { stored_nowhere() }).await;
        assert!(matches!(after, Ok(Reply::Unavailable { .. })));
    }

    #[tokio::test]
    async fn a_decision_dropped_before_it_ends_runs_to_its_end_in_a_tracked_task() {
        let tasks = TaskTracker::new();
        let (release, released) = oneshot::channel::<()>();
        let (ended, has_ended) = oneshot::channel::<()>();
        let work = async move {
            let _ = released.await;
            let _ = ended.send(());
            stored_nowhere()
        };
        let request = Detachable::new(tasks.clone(), work);
        let timed_out = tokio::time::timeout(Duration::from_millis(20), request).await;
        assert!(timed_out.is_err(), "the decision was still waiting");
        assert_eq!(tasks.len(), 1, "the dropped decision went on in a task");
        release
            .send(())
            .expect("the decision still waits to be released");
        tokio::time::timeout(Duration::from_secs(10), has_ended)
            .await
            .expect("the carried-on decision ends")
            .expect("it ran to its end");
        tasks.close();
        tokio::time::timeout(Duration::from_secs(10), tasks.wait())
            .await
            .expect("shutdown finds the tracked task done");
    }
}
