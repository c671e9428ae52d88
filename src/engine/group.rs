//! Group commit: the claims (and finishes) of concurrent callers share
//! statements. Whatever queued while the previous statement ran goes into
//! the next one, with no timer, so a lone request pays nothing extra and a
//! crowd of requests (HTTP, a RabbitMQ consumer taking one delivery at a
//! time, an embedder calling the engine per message) pays one round trip
//! and one commit per group instead of per request. Each caller gets its
//! own rows' results the moment its statement returns: nobody waits for
//! another caller's handler.
//!
//! One statement of small groups runs at a time, and the next one takes
//! everything that queued meanwhile. More at once would split a crowd into
//! more, smaller statements, each a commit (a WAL flush) of its own
//! (measured with 100 HTTP clients: 25 rows per statement with one worker,
//! 13 with two and 9 with three; taking turns as below answered about 4 %
//! more requests than two running at once, in five alternated pairs at 100
//! and 1,000 connections; two answered 30–45 % more than six). A second
//! worker waits for its turn only while the running statement is young
//! ([`STALLED`]): one that waits on a row lock or a slow server does not
//! hold back everyone else's claims, and the second worker then runs beside
//! it, as two lanes always did. A caller
//! bringing a large batch of its own (a Kafka batch) gains nothing from
//! company: its statement runs at once, beside the others, as many at once
//! as the store's claim connections allow. A group never holds
//! one key twice (PostgreSQL touches a row once per statement): a caller
//! whose keys overlap waits for the next statement. When a combined
//! statement fails, each caller's rows run again on their own, so every
//! caller meets its own error (a row PostgreSQL refuses is never blamed on
//! its neighbours).

use crate::identity::Identity;
use crate::store::{Store, StoreError};
use async_trait::async_trait;
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Mutex, OwnedMutexGuard};

/// How long the next statement waits for the running one before it runs
/// beside it. A statement of small groups takes 1–5 ms on a busy 2-core
/// host (p99 under 16 ms); one running longer than this waits on something
/// (a row lock up to `store.lock_timeout`, a slow server), not on work.
const STALLED: Duration = Duration::from_millis(20);

/// One kind of statement that can be shared: its rows, what each row
/// gets back, and how a group of rows is written.
#[async_trait]
pub(super) trait Statement: Send + Sync + 'static {
    /// One row to write, owned (it crosses tasks).
    type Row: Send + Sync + 'static;
    /// What one row gets back.
    type Out: Send + 'static;
    /// The key a row writes.
    fn identity(row: &Self::Row) -> &Identity;
    /// Writes `rows` in one statement; one answer per row, in order.
    async fn run(&self, store: &Store, rows: &[Self::Row]) -> Result<Vec<Self::Out>, StoreError>;
}

type Reply<S> = oneshot::Sender<Result<Vec<<S as Statement>::Out>, StoreError>>;

struct Job<S: Statement> {
    rows: Vec<S::Row>,
    reply: Reply<S>,
}

/// The queue of callers waiting for a statement, and the callers put back
/// because their keys overlapped the group before them.
struct Queue<S: Statement> {
    incoming: mpsc::UnboundedReceiver<Job<S>>,
    deferred: VecDeque<Job<S>>,
}

/// Shares statements of kind `S` among concurrent callers (see the module
/// documentation). The workers start with the first call.
pub(super) struct Group<S: Statement> {
    statement: Arc<S>,
    store: Store,
    /// Most rows in one statement (`engine.max_batch`).
    max_rows: usize,
    /// Workers: statements of small groups at once while one is stalled.
    workers: usize,
    /// A caller with this many rows or more runs its own statement.
    alone_from: usize,
    /// Rows per statement, observed once per statement run.
    rows: Option<prometheus::Histogram>,
    sender: OnceLock<mpsc::UnboundedSender<Job<S>>>,
}

impl<S: Statement> Group<S> {
    /// `rows`, if given, observes each statement's row count.
    pub(super) fn new(
        statement: S,
        store: Store,
        max_rows: usize,
        workers: usize,
        rows: Option<prometheus::Histogram>,
    ) -> Self {
        Self {
            statement: Arc::new(statement),
            store,
            max_rows: max_rows.max(1),
            workers: workers.max(1),
            alone_from: (max_rows / 4).max(2),
            rows,
            sender: OnceLock::new(),
        }
    }

    /// Writes `rows` (distinct keys) in the next statement, with whatever
    /// other callers queued meanwhile; returns their answers, in order.
    pub(super) async fn write(&self, rows: Vec<S::Row>) -> Result<Vec<S::Out>, StoreError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        if rows.len() >= self.alone_from {
            observe(&self.rows, rows.len());
            return self.statement.run(&self.store, &rows).await;
        }
        let (reply, answer) = oneshot::channel();
        let sent = self.sender().send(Job { rows, reply });
        if let Err(mpsc::error::SendError(job)) = sent {
            // Only when the workers are gone (the runtime shuts down).
            observe(&self.rows, job.rows.len());
            return self.statement.run(&self.store, &job.rows).await;
        }
        match answer.await {
            Ok(out) => out,
            Err(_) => Err(StoreError::Corrupt(
                "a shared statement's worker stopped before answering".into(),
            )),
        }
    }

    fn sender(&self) -> &mpsc::UnboundedSender<Job<S>> {
        self.sender.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let queue = Arc::new(Mutex::new(Queue {
                incoming: rx,
                deferred: VecDeque::new(),
            }));
            let turn = Arc::new(Turn {
                lock: Arc::new(Mutex::new(())),
                since: std::sync::Mutex::new(Instant::now()),
            });
            for _ in 0..self.workers {
                let worker = Worker {
                    statement: self.statement.clone(),
                    store: self.store.clone(),
                    queue: queue.clone(),
                    turn: turn.clone(),
                    max_rows: self.max_rows,
                    rows: self.rows.clone(),
                };
                tokio::spawn(worker.run());
            }
            tx
        })
    }
}

/// Whose statement runs now: workers take turns, except past a stalled
/// statement (see [`STALLED`]).
struct Turn {
    lock: Arc<Mutex<()>>,
    /// When the current holder took its turn.
    since: std::sync::Mutex<Instant>,
}

impl Turn {
    /// Waits for the running statement while it is younger than
    /// [`STALLED`]; None: it is stalled, and the caller runs beside it.
    async fn take(&self) -> Option<OwnedMutexGuard<()>> {
        let guard = match self.lock.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                let held = self
                    .since
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .elapsed();
                let wait = STALLED.saturating_sub(held);
                tokio::time::timeout(wait, self.lock.clone().lock_owned())
                    .await
                    .ok()?
            }
        };
        *self.since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        Some(guard)
    }
}

struct Worker<S: Statement> {
    statement: Arc<S>,
    store: Store,
    queue: Arc<Mutex<Queue<S>>>,
    turn: Arc<Turn>,
    max_rows: usize,
    rows: Option<prometheus::Histogram>,
}

fn observe(rows: &Option<prometheus::Histogram>, n: usize) {
    if let Some(h) = rows {
        h.observe(n as f64);
    }
}

impl<S: Statement> Worker<S> {
    async fn run(self) {
        while let Some((group, turn)) = self.next_group().await {
            self.write(group).await;
            drop(turn);
        }
    }

    /// Waits for a caller and for its turn, then takes every other caller
    /// queued by then whose keys are new to the group, up to `max_rows`
    /// rows. None once every sender is gone.
    async fn next_group(&self) -> Option<(Vec<Job<S>>, Option<OwnedMutexGuard<()>>)> {
        let mut queue = self.queue.lock().await;
        let first = match queue.deferred.pop_front() {
            Some(job) => job,
            None => queue.incoming.recv().await?,
        };
        // The queue stays locked meanwhile: whoever waits next waits here.
        let turn = self.turn.take().await;
        let mut keys: HashSet<Identity> =
            first.rows.iter().map(|r| S::identity(r).clone()).collect();
        let mut rows = first.rows.len();
        let mut group = vec![first];
        let mut later = VecDeque::new();
        let mut take = |job: Job<S>, group: &mut Vec<Job<S>>, later: &mut VecDeque<Job<S>>| {
            let fits = rows + job.rows.len() <= self.max_rows;
            let apart = job.rows.iter().all(|r| !keys.contains(S::identity(r)));
            if fits && apart {
                keys.extend(job.rows.iter().map(|r| S::identity(r).clone()));
                rows += job.rows.len();
                group.push(job);
            } else {
                later.push_back(job);
            }
        };
        while let Some(job) = queue.deferred.pop_front() {
            take(job, &mut group, &mut later);
        }
        while let Ok(job) = queue.incoming.try_recv() {
            take(job, &mut group, &mut later);
        }
        queue.deferred = later;
        Some((group, turn))
    }

    async fn write(&self, group: Vec<Job<S>>) {
        if group.len() == 1 {
            let job = group.into_iter().next().expect("a group of one");
            observe(&self.rows, job.rows.len());
            let out = self.statement.run(&self.store, &job.rows).await;
            let _ = job.reply.send(out);
            return;
        }
        let (rows, jobs): (Vec<Vec<S::Row>>, Vec<Reply<S>>) =
            group.into_iter().map(|j| (j.rows, j.reply)).unzip();
        let lengths: Vec<usize> = rows.iter().map(Vec::len).collect();
        let all: Vec<S::Row> = rows.into_iter().flatten().collect();
        observe(&self.rows, all.len());
        match self.statement.run(&self.store, &all).await {
            Ok(out) => {
                let mut out = out.into_iter();
                for (reply, n) in jobs.into_iter().zip(lengths) {
                    let _ = reply.send(Ok(out.by_ref().take(n).collect()));
                }
            }
            // Each caller's rows on their own: each gets its own answer.
            Err(_) => {
                let mut all = all.into_iter();
                for (reply, n) in jobs.into_iter().zip(lengths) {
                    let rows: Vec<S::Row> = all.by_ref().take(n).collect();
                    observe(&self.rows, rows.len());
                    let _ = reply.send(self.statement.run(&self.store, &rows).await);
                }
            }
        }
    }
}

/// A claim, owned: what [`crate::store::ClaimRequest`] borrows.
pub(super) struct ClaimRow {
    pub identity: Identity,
    pub fingerprint: crate::fingerprint::Fingerprint,
    pub body: Vec<u8>,
    pub content_type: Option<String>,
    pub derived_key: String,
    pub route: Option<String>,
}

/// The claim statement, for this process's owner name and lease.
pub(super) struct Claims {
    pub owner: String,
    pub lease: std::time::Duration,
}

#[async_trait]
impl Statement for Claims {
    type Row = ClaimRow;
    type Out = crate::store::ClaimResult;

    fn identity(row: &ClaimRow) -> &Identity {
        &row.identity
    }

    async fn run(&self, store: &Store, rows: &[ClaimRow]) -> Result<Vec<Self::Out>, StoreError> {
        let requests: Vec<crate::store::ClaimRequest<'_>> = rows
            .iter()
            .map(|r| crate::store::ClaimRequest {
                identity: &r.identity,
                fingerprint: &r.fingerprint,
                body: &r.body,
                content_type: r.content_type.as_deref(),
                derived_key: &r.derived_key,
                route: r.route.as_deref(),
            })
            .collect();
        store.claim_batch(&requests, &self.owner, self.lease).await
    }
}

/// A finish, owned: what [`crate::store::FinishWrite`] borrows.
pub(super) struct FinishRow {
    pub identity: Identity,
    pub epoch: crate::identity::Epoch,
    pub finish: crate::store::Finish,
}

/// The finish statement.
pub(super) struct Finishes;

#[async_trait]
impl Statement for Finishes {
    type Row = FinishRow;
    type Out = crate::store::Written;

    fn identity(row: &FinishRow) -> &Identity {
        &row.identity
    }

    async fn run(&self, store: &Store, rows: &[FinishRow]) -> Result<Vec<Self::Out>, StoreError> {
        let writes: Vec<crate::store::FinishWrite<'_>> = rows
            .iter()
            .map(|r| crate::store::FinishWrite {
                identity: &r.identity,
                epoch: r.epoch,
                finish: r.finish.clone(),
            })
            .collect();
        store.finish_batch(&writes).await
    }
}
