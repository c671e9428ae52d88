//! The consume loop: fetch, group into batches (a partition in a few at a
//! time, never sharing a key), hand each batch to a task, put retries back
//! at the head of their partition, commit the durable prefix as batches
//! finish (at most once per `kafka.commit_interval`).

use super::apply::{self, BatchContext, BatchDone};
use super::context::{commit, Context};
use super::error::KafkaError;
use super::lanes::{Flow, Lanes};
use super::ledger::{Ledger, Tp};
use super::message::Held;
use crate::backoff::Backoff;
use crate::config::KafkaSettings;
use crate::health::{Component, Health};
use crate::liveness::BEAT_EVERY;
use crate::message::Transport;
use futures::FutureExt;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::TopicPartitionList;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(super) type KafkaConsumer = StreamConsumer<Context>;

/// Pauses after the store failed a batch (or the provider is paused).
const STORE_PAUSE: Backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));

pub(super) struct Pump {
    pub consumer: Arc<KafkaConsumer>,
    pub shared: Arc<BatchContext>,
    pub ledger: Arc<Ledger>,
    pub settings: KafkaSettings,
    health: Health,
    lanes: Lanes,
    /// Running batches, by the number `Lanes::take_batch` gave them.
    batches: JoinSet<(u64, BatchDone)>,
    linger_from: Option<Instant>,
    store_failures: u32,
    /// Messages waiting for a batch past which fetched records stay in
    /// librdkafka's bounded queue instead of this process's: fetching is
    /// not paused (a pause drops librdkafka's prefetch), only deferred.
    high_water: usize,
    last_commit: Instant,
    /// A batch finished since the last commit: commit at this moment.
    commit_due: Option<Instant>,
    /// Since when no broker has been reached (as the statistics say).
    down_since: Option<Instant>,
}

/// Why the consume loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// Asked to stop.
    Stopped,
    /// No broker reached for `kafka.restart_after_down`: the caller builds
    /// a new client.
    Unreachable,
}

impl Pump {
    pub(super) fn new(
        consumer: Arc<KafkaConsumer>,
        shared: Arc<BatchContext>,
        ledger: Arc<Ledger>,
        settings: KafkaSettings,
        health: Health,
    ) -> Self {
        Self {
            lanes: Lanes::new(
                settings.max_buffered_per_partition,
                settings.max_buffered_bytes,
            ),
            high_water: settings.batch_size * settings.max_batches_in_flight,
            consumer,
            shared,
            ledger,
            settings,
            health,
            batches: JoinSet::new(),
            linger_from: None,
            store_failures: 0,
            last_commit: Instant::now(),
            commit_due: None,
            down_since: None,
        }
    }

    /// Runs until `shutdown`, or until no broker has been reached for
    /// `kafka.restart_after_down`; then drains in-flight batches (bounded)
    /// and commits what is durable.
    pub(super) async fn run(mut self, shutdown: CancellationToken) -> Result<Ended, KafkaError> {
        let consumer = self.consumer.clone();
        let mut commit_tick = tokio::time::interval(self.settings.commit_interval);
        commit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Every wait below is in the select, so the loop goes round at least
        // every beat, idle or paused; only a loop stuck elsewhere goes silent.
        let heartbeat = self.health.liveness().register("kafka consumer");
        let mut beat_tick = tokio::time::interval(BEAT_EVERY);
        beat_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ended = Ended::Stopped;
        // librdkafka's fatal state (a static member fenced by another with
        // its `group.instance.id`): the client never consumes or commits
        // again, so the loop ends instead of idling as a member in name.
        let mut fatal = None;
        loop {
            heartbeat.beat();
            let wake = self.next_wake();
            let take = self.lanes.backlog(Instant::now()) < self.high_water;
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(done) = self.batches.join_next(), if !self.batches.is_empty() => {
                    self.finished(done)?;
                    // At once if the last commit is old enough, else when it is.
                    self.commit_due
                        .get_or_insert(self.last_commit + self.settings.commit_interval);
                }
                msg = consumer.recv(), if take => {
                    if msg.is_err() {
                        fatal = consumer.client().fatal_error();
                        if fatal.is_some() {
                            break;
                        }
                    }
                    self.received(msg);
                    self.receive_ready(&consumer);
                }
                _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
                _ = commit_tick.tick() => {
                    fatal = consumer.client().fatal_error();
                    if fatal.is_some() {
                        break;
                    }
                    self.commit(CommitMode::Async);
                    self.report_stalls();
                    if self.unreachable_too_long() {
                        ended = Ended::Unreachable;
                        break;
                    }
                }
                _ = beat_tick.tick() => {}
            }
            if self.commit_due.is_some_and(|t| t <= Instant::now()) {
                self.commit(CommitMode::Async);
            }
            self.dispatch();
        }
        // The drain is bounded by kafka.drain_timeout, not watched.
        drop(heartbeat);
        let fatal = fatal.map(|(code, reason)| {
            tracing::error!(?code, %reason, "the Kafka consumer cannot go on: draining in-flight batches, then stopping");
            self.health
                .set_down(Component::Kafka, format!("kafka client fatal: {reason}"));
            KafkaError::Fatal {
                code,
                reason,
                group: self.settings.group_id.clone(),
                instance: self.settings.client.get("group.instance.id").cloned(),
            }
        });
        self.drain().await?;
        fatal.map_or(Ok(ended), Err)
    }

    /// Whether no broker has been reached for `kafka.restart_after_down`
    /// (the statistics report none up, or librdkafka said all are down).
    fn unreachable_too_long(&mut self) -> bool {
        if self.health.get(Component::Kafka) != Some(false) {
            self.down_since = None;
            return false;
        }
        let down_for = self.down_since.get_or_insert_with(Instant::now).elapsed();
        if down_for < self.settings.restart_after_down {
            return false;
        }
        tracing::warn!(?down_for, "no Kafka broker reached for kafka.restart_after_down: rebuilding the consumer with a new client");
        true
    }

    fn received(&mut self, msg: Result<BorrowedMessage<'_>, rdkafka::error::KafkaError>) {
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "kafka consume error");
                return;
            }
        };
        let tp = Tp {
            topic: msg.topic().to_string(),
            partition: msg.partition(),
        };
        // None: a revoked partition's leftover, or a refetched copy.
        let Some(lane) = self.ledger.received(&tp, msg.offset()) else {
            return;
        };
        let mut held = Held::from_record(lane, &msg);
        held.hint = self.shared.pipeline.parser().identity_hint(&held.incoming);
        let flow = self.lanes.push(held);
        self.apply_flow(flow);
    }

    /// Takes what librdkafka already holds, without waiting, so that one
    /// dispatch sees it all: batches fill from a backlog and never wait
    /// for one that is not there.
    fn receive_ready(&mut self, consumer: &KafkaConsumer) {
        let now = Instant::now();
        let mut backlog = self.lanes.backlog(now);
        while backlog < self.high_water {
            match consumer.recv().now_or_never() {
                Some(msg) => self.received(msg),
                None => return,
            }
            backlog += 1;
        }
    }

    fn finished(&mut self, done: Result<(u64, BatchDone), JoinError>) -> Result<(), KafkaError> {
        let (id, done) = done.map_err(KafkaError::BatchTask)?;
        let pause = if let Some(asked) = done.paused {
            self.store_failures += 1;
            Some(STORE_PAUSE.after_attempt(self.store_failures).max(asked))
        } else {
            self.store_failures = 0;
            None
        };
        let mut per_lane: HashMap<_, (Vec<Held>, Duration)> = HashMap::new();
        for (held, after) in done.retries {
            let entry = per_lane
                .entry(held.lane.clone())
                .or_insert((Vec::new(), after));
            entry.1 = pause.unwrap_or(entry.1.min(after));
            entry.0.push(held);
        }
        for lane in &done.lanes {
            let (retries, after) = per_lane.remove(lane).unwrap_or_default();
            let flow = self.lanes.finished(lane, id, retries, after);
            self.apply_flow(flow);
        }
        Ok(())
    }

    /// Reports partitions whose messages wait without progress.
    fn report_stalls(&self) {
        let stalled = self
            .lanes
            .stalled(Instant::now(), self.settings.stall_after);
        self.shared
            .metrics
            .stalled_lanes
            .with_label_values(&[Transport::Kafka.label()])
            .set(stalled.len() as i64);
        let lines = stalled
            .iter()
            .map(|(tp, idle)| {
                format!(
                    "{tp}: no message of this partition reached a durable outcome for {}s",
                    idle.as_secs()
                )
            })
            .collect::<Vec<_>>();
        if !lines.is_empty() {
            tracing::warn!(partitions = ?lines, "stalled partitions");
        }
        self.health.set_stalled(Component::Kafka, lines);
    }

    fn dispatch(&mut self) {
        let ledger = self.ledger.clone();
        self.lanes.retain(|lane| ledger.owns(lane));
        let now = Instant::now();
        while self.batches.len() < self.settings.max_batches_in_flight {
            let ready = self.lanes.ready(now);
            if ready == 0 {
                self.linger_from = None;
                return;
            }
            let since = *self.linger_from.get_or_insert(now);
            if ready < self.settings.batch_size && now < since + self.settings.batch_linger {
                return;
            }
            let (id, batch) = self.lanes.take_batch(now, self.settings.batch_size);
            if batch.is_empty() {
                return;
            }
            let mut lanes: Vec<_> = batch.iter().map(|h| h.lane.clone()).collect();
            lanes.dedup();
            self.ledger.batch_started(&lanes);
            let run = apply::run(self.shared.clone(), batch);
            self.batches.spawn(async move { (id, run.await) });
        }
    }

    /// The next moment the loop has something to do besides fetching.
    fn next_wake(&self) -> Option<Instant> {
        let commit = self.commit_due;
        if self.batches.len() >= self.settings.max_batches_in_flight {
            return commit;
        }
        let linger = self.linger_from.map(|t| t + self.settings.batch_linger);
        let now = Instant::now();
        let unblock = self.lanes.next_unblock().filter(|t| *t > now);
        linger.into_iter().chain(unblock).chain(commit).min()
    }

    fn commit(&mut self, mode: CommitMode) {
        self.last_commit = Instant::now();
        self.commit_due = None;
        let positions = self.ledger.to_commit(None);
        match commit(self.consumer.as_ref(), &positions, mode) {
            Ok(()) if matches!(mode, CommitMode::Sync) => {
                for (tp, offset) in &positions {
                    self.ledger.committed(tp, *offset);
                }
            }
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %e, "offset commit failed; retried on the next tick"),
        }
    }

    fn apply_flow(&self, flow: Flow) {
        for tp in &flow.pause {
            tracing::debug!(partition = %tp, buffered_bytes = self.lanes.bytes(), "buffer full: pausing fetch");
            self.flow(tp, true);
        }
        for tp in &flow.resume {
            self.flow(tp, false);
        }
    }

    fn flow(&self, tp: &Tp, pause: bool) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&tp.topic, tp.partition);
        let r = if pause {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        };
        if let Err(e) = r {
            tracing::warn!(error = %e, partition = %tp, pause, "pause/resume failed");
        }
    }

    /// Lets in-flight batches finish within the drain bound, then commits
    /// what is durable, synchronously.
    async fn drain(mut self) -> Result<(), KafkaError> {
        let deadline = Instant::now() + self.settings.drain_timeout;
        while !self.batches.is_empty() {
            match tokio::time::timeout_at(deadline, self.batches.join_next()).await {
                Ok(Some(done)) => self.finished(done)?,
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        batches = self.batches.len(),
                        "shutdown: batches still running after the drain timeout; \
                         their messages stay uncommitted and come back"
                    );
                    // Unconfirmed dead letters and replies stop waiting.
                    self.shared.outbox.shutdown.cancel();
                    self.batches.abort_all();
                    // Aborted batches never report back: their partitions
                    // are idle now, so the revoke on leaving the group does
                    // not wait out a second drain for them.
                    self.ledger.abandon_batches();
                    break;
                }
            }
        }
        self.commit(CommitMode::Sync);
        tracing::info!(
            uncommitted = self.ledger.pending(),
            "kafka consumer stopped"
        );
        Ok(())
    }
}
