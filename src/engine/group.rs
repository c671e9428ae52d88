//! Group commit: the claims and finishes of concurrent callers share
//! statements. Whatever queued while the previous statement ran goes into
//! the next one, with no timer, so a lone request pays nothing extra and a
//! crowd of requests (HTTP, a RabbitMQ consumer taking one delivery at a
//! time, an embedder calling the engine per message) pays one round trip
//! and one commit per group instead of per request. Each caller gets its
//! own rows' results the moment its statement returns: nobody waits for
//! another caller's handler.
//!
//! Claims and finishes queue together, and a group holding both runs them
//! as one statement ([`Store::claim_and_finish`]): the commit that makes
//! one caller's outcome durable makes another caller's claim durable too,
//! so each request pays about one commit where it paid two.
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
//! it, as two lanes always did. A caller bringing a large batch of its own
//! (a Kafka batch) gains nothing from company: its statement runs at once,
//! beside the others, as many at once as the store's claim connections
//! allow. A group never holds one key twice, as a claim or a finish
//! (PostgreSQL touches a row once per statement): a caller whose keys
//! overlap waits for the next statement. When a combined statement fails,
//! its claims and its finishes run again apart, and if one of those fails,
//! each caller's rows run on their own, so every caller meets its own error
//! (a row PostgreSQL refuses is never blamed on its neighbours, and a row
//! held by another transaction is waited around as a claim or finish alone
//! would).

use crate::identity::{Epoch, Identity};
use crate::store::{
    ClaimRequest, ClaimResult, Finish, FinishWrite, RowAt, Store, StoreError, Written,
};
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Mutex, OwnedMutexGuard};

/// How long the next statement waits for the running one before it runs
/// beside it. A statement of small groups takes 1–5 ms on a busy 2-core
/// host (p99 under 16 ms); one running longer than this waits on something
/// (a row lock up to `store.lock_timeout`, a slow server), not on work.
const STALLED: Duration = Duration::from_millis(20);

/// A claim, owned: what [`ClaimRequest`] borrows.
pub(super) struct ClaimRow {
    pub identity: Identity,
    pub fingerprint: crate::fingerprint::Fingerprint,
    pub body: Vec<u8>,
    pub content_type: Option<String>,
    pub derived_key: String,
    pub route: Option<String>,
}

impl ClaimRow {
    fn request(&self) -> ClaimRequest<'_> {
        ClaimRequest {
            identity: &self.identity,
            fingerprint: &self.fingerprint,
            body: &self.body,
            content_type: self.content_type.as_deref(),
            derived_key: &self.derived_key,
            route: self.route.as_deref(),
        }
    }
}

/// A finish, owned: what [`FinishWrite`] borrows.
pub(super) struct FinishRow {
    pub identity: Identity,
    pub epoch: Epoch,
    pub finish: Finish,
    pub at: Option<RowAt>,
}

impl FinishRow {
    fn write(&self) -> FinishWrite<'_> {
        FinishWrite {
            identity: &self.identity,
            epoch: self.epoch,
            finish: self.finish.clone(),
            at: self.at,
        }
    }
}

type Reply<T> = oneshot::Sender<Result<Vec<T>, StoreError>>;

/// One caller's rows and where their answers go.
enum Job {
    Claim(Vec<ClaimRow>, Reply<ClaimResult>),
    Finish(Vec<FinishRow>, Reply<Written>),
}

impl Job {
    fn identities(&self) -> Box<dyn Iterator<Item = &Identity> + '_> {
        match self {
            Job::Claim(rows, _) => Box::new(rows.iter().map(|r| &r.identity)),
            Job::Finish(rows, _) => Box::new(rows.iter().map(|r| &r.identity)),
        }
    }

    fn len(&self) -> usize {
        match self {
            Job::Claim(rows, _) => rows.len(),
            Job::Finish(rows, _) => rows.len(),
        }
    }
}

/// The queue of callers waiting for a statement, and the callers put back
/// because their keys overlapped the group before them.
struct Queue {
    incoming: mpsc::UnboundedReceiver<Job>,
    deferred: VecDeque<Job>,
}

/// What the workers run statements with.
struct Statements {
    store: Store,
    /// The owner name and lease of this process's claims.
    owner: String,
    lease: Duration,
    /// Rows per claim statement, observed once per statement run.
    claim_rows: Option<prometheus::Histogram>,
}

/// Shares statements among concurrent callers (see the module
/// documentation). The workers start with the first call.
pub(super) struct Group {
    statements: Arc<Statements>,
    /// Most rows in one statement (`engine.max_batch`).
    max_rows: usize,
    /// Workers: statements of small groups at once while one is stalled.
    workers: usize,
    /// A caller with this many rows or more runs its own statement.
    alone_from: usize,
    sender: OnceLock<mpsc::UnboundedSender<Job>>,
}

impl Group {
    /// `claim_rows`, if given, observes each claim statement's row count.
    pub(super) fn new(
        store: Store,
        owner: String,
        lease: Duration,
        max_rows: usize,
        workers: usize,
        claim_rows: Option<prometheus::Histogram>,
    ) -> Self {
        Self {
            statements: Arc::new(Statements {
                store,
                owner,
                lease,
                claim_rows,
            }),
            max_rows: max_rows.max(1),
            workers: workers.max(1),
            alone_from: (max_rows / 4).max(2),
            sender: OnceLock::new(),
        }
    }

    /// Claims `rows` (distinct keys) in the next statement, with whatever
    /// other callers queued meanwhile; returns their results, in order.
    pub(super) async fn claim(&self, rows: Vec<ClaimRow>) -> Result<Vec<ClaimResult>, StoreError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        if rows.len() >= self.alone_from {
            return self.statements.claims(&rows).await;
        }
        let (reply, answer) = oneshot::channel();
        match self.sender().send(Job::Claim(rows, reply)) {
            Ok(()) => received(answer).await,
            // Only when the workers are gone (the runtime shuts down).
            Err(mpsc::error::SendError(job)) => match job {
                Job::Claim(rows, _) => self.statements.claims(&rows).await,
                Job::Finish(..) => unreachable!("a claim was sent"),
            },
        }
    }

    /// Writes `rows` (distinct keys) in the next statement, with whatever
    /// other callers queued meanwhile; returns what became of each write,
    /// in order.
    pub(super) async fn finish(&self, rows: Vec<FinishRow>) -> Result<Vec<Written>, StoreError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        if rows.len() >= self.alone_from {
            return self.statements.finishes(&rows).await;
        }
        let (reply, answer) = oneshot::channel();
        match self.sender().send(Job::Finish(rows, reply)) {
            Ok(()) => received(answer).await,
            Err(mpsc::error::SendError(job)) => match job {
                Job::Finish(rows, _) => self.statements.finishes(&rows).await,
                Job::Claim(..) => unreachable!("a finish was sent"),
            },
        }
    }

    fn sender(&self) -> &mpsc::UnboundedSender<Job> {
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
                    statements: self.statements.clone(),
                    queue: queue.clone(),
                    turn: turn.clone(),
                    max_rows: self.max_rows,
                };
                tokio::spawn(worker.run());
            }
            tx
        })
    }
}

async fn received<T>(
    answer: oneshot::Receiver<Result<Vec<T>, StoreError>>,
) -> Result<Vec<T>, StoreError> {
    match answer.await {
        Ok(out) => out,
        Err(_) => Err(StoreError::Corrupt(
            "a shared statement's worker stopped before answering".into(),
        )),
    }
}

impl Statements {
    async fn claims(&self, rows: &[ClaimRow]) -> Result<Vec<ClaimResult>, StoreError> {
        if let Some(h) = &self.claim_rows {
            h.observe(rows.len() as f64);
        }
        let requests: Vec<ClaimRequest<'_>> = rows.iter().map(ClaimRow::request).collect();
        self.store
            .claim_batch(&requests, &self.owner, self.lease)
            .await
    }

    async fn finishes(&self, rows: &[FinishRow]) -> Result<Vec<Written>, StoreError> {
        let writes: Vec<FinishWrite<'_>> = rows.iter().map(FinishRow::write).collect();
        self.store.finish_batch(&writes).await
    }

    async fn together(
        &self,
        claims: &[ClaimRow],
        finishes: &[FinishRow],
    ) -> Result<(Vec<ClaimResult>, Vec<Written>), StoreError> {
        if let Some(h) = &self.claim_rows {
            h.observe(claims.len() as f64);
        }
        let requests: Vec<ClaimRequest<'_>> = claims.iter().map(ClaimRow::request).collect();
        let writes: Vec<FinishWrite<'_>> = finishes.iter().map(FinishRow::write).collect();
        self.store
            .claim_and_finish(&requests, &self.owner, self.lease, &writes)
            .await
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

struct Worker {
    statements: Arc<Statements>,
    queue: Arc<Mutex<Queue>>,
    turn: Arc<Turn>,
    max_rows: usize,
}

/// The claims and the finishes of one group, each caller's rows in a row.
#[derive(Default)]
struct Split {
    claims: Vec<ClaimRow>,
    claim_jobs: Vec<(usize, Reply<ClaimResult>)>,
    finishes: Vec<FinishRow>,
    finish_jobs: Vec<(usize, Reply<Written>)>,
}

impl Split {
    fn of(group: Vec<Job>) -> Self {
        let mut split = Split::default();
        for job in group {
            match job {
                Job::Claim(rows, reply) => {
                    split.claim_jobs.push((rows.len(), reply));
                    split.claims.extend(rows);
                }
                Job::Finish(rows, reply) => {
                    split.finish_jobs.push((rows.len(), reply));
                    split.finishes.extend(rows);
                }
            }
        }
        split
    }
}

impl Worker {
    async fn run(self) {
        while let Some((group, turn)) = self.next_group().await {
            self.write(group).await;
            drop(turn);
        }
    }

    /// Waits for a caller and for its turn, then takes every other caller
    /// queued by then whose keys are new to the group, up to `max_rows`
    /// rows. None once every sender is gone.
    async fn next_group(&self) -> Option<(Vec<Job>, Option<OwnedMutexGuard<()>>)> {
        let mut queue = self.queue.lock().await;
        let first = match queue.deferred.pop_front() {
            Some(job) => job,
            None => queue.incoming.recv().await?,
        };
        // The queue stays locked meanwhile: whoever waits next waits here.
        let turn = self.turn.take().await;
        let mut keys: HashSet<Identity> = first.identities().cloned().collect();
        let mut rows = first.len();
        let mut group = vec![first];
        let mut later = VecDeque::new();
        let mut take = |job: Job, group: &mut Vec<Job>, later: &mut VecDeque<Job>| {
            let fits = rows + job.len() <= self.max_rows;
            let apart = job.identities().all(|id| !keys.contains(id));
            if fits && apart {
                keys.extend(job.identities().cloned());
                rows += job.len();
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

    async fn write(&self, group: Vec<Job>) {
        let split = Split::of(group);
        let s = &self.statements;
        if split.claims.is_empty() {
            answer_each(s, split.finishes, split.finish_jobs).await;
        } else if split.finishes.is_empty() {
            answer_each(s, split.claims, split.claim_jobs).await;
        } else {
            match s.together(&split.claims, &split.finishes).await {
                Ok((claimed, written)) => {
                    answer(claimed, split.claim_jobs);
                    answer(written, split.finish_jobs);
                }
                // Apart: each kind waits around held rows on its own, and
                // each caller meets its own error.
                Err(_) => {
                    answer_each(s, split.finishes, split.finish_jobs).await;
                    answer_each(s, split.claims, split.claim_jobs).await;
                }
            }
        }
    }
}

/// Hands each caller its rows' answers, in order.
fn answer<T>(out: Vec<T>, jobs: Vec<(usize, Reply<T>)>) {
    let mut out = out.into_iter();
    for (n, reply) in jobs {
        let _ = reply.send(Ok(out.by_ref().take(n).collect()));
    }
}

/// A kind of row the workers write: claims or finishes.
trait Rows: Sized + Send + Sync {
    type Out: Send;
    fn run<'a>(
        s: &'a Statements,
        rows: &'a [Self],
    ) -> futures::future::BoxFuture<'a, Result<Vec<Self::Out>, StoreError>>;
}

impl Rows for ClaimRow {
    type Out = ClaimResult;
    fn run<'a>(
        s: &'a Statements,
        rows: &'a [Self],
    ) -> futures::future::BoxFuture<'a, Result<Vec<ClaimResult>, StoreError>> {
        Box::pin(s.claims(rows))
    }
}

impl Rows for FinishRow {
    type Out = Written;
    fn run<'a>(
        s: &'a Statements,
        rows: &'a [Self],
    ) -> futures::future::BoxFuture<'a, Result<Vec<Written>, StoreError>> {
        Box::pin(s.finishes(rows))
    }
}

/// Runs `rows` in one statement; if it fails, each caller's rows on their
/// own, so each caller gets its own answer.
async fn answer_each<R: Rows>(s: &Statements, rows: Vec<R>, jobs: Vec<(usize, Reply<R::Out>)>) {
    if jobs.is_empty() {
        return;
    }
    if jobs.len() == 1 {
        let (_, reply) = jobs.into_iter().next().expect("one job");
        let _ = reply.send(R::run(s, &rows).await);
        return;
    }
    match R::run(s, &rows).await {
        Ok(out) => answer(out, jobs),
        Err(_) => {
            let mut rows = rows.into_iter();
            for (n, reply) in jobs {
                let mine: Vec<R> = rows.by_ref().take(n).collect();
                let _ = reply.send(R::run(s, &mine).await);
            }
        }
    }
}
