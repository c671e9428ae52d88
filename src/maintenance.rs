//! Background upkeep of the key table. Every replica pings the store for
//! /readyz; one replica at a time, the upkeep leader, runs retention purges
//! and samples the `dedupq_keys` gauges. Leadership is a PostgreSQL session
//! advisory lock held on a connection of its own: when the leader dies, its
//! session ends, the lock is free, and a standby takes it within
//! `STANDBY_RETRY`. Every replica announces its `retention.keep` on that
//! connection, and the leader purges with the longest one announced, so a
//! replica with a short keep never purges keys another one still needs.

use crate::config::RetentionSettings;
use crate::health::{Component, Health};
use crate::metrics::Metrics;
use crate::store::{KeyStatus, Store, StoreError};
use crate::telemetry::chain;
use sqlx::PgConnection;
use std::time::Duration;
use tokio::time::{interval, interval_at, timeout, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// How often the store is pinged for /readyz.
const PING_EVERY: Duration = Duration::from_secs(1);
/// How often unknown keys are counted: through their index, cheap.
const COUNT_UNKNOWN_EVERY: Duration = Duration::from_secs(15);
/// How often the other statuses are counted: a scan of the table, which on
/// tens of millions of rows costs seconds of a core.
const COUNT_SCANNED_EVERY: Duration = Duration::from_secs(600);
/// A key table larger than this (about a million keys) is first scanned
/// [`FIRST_SCAN_AFTER`] after the upkeep starts rather than at once: a
/// replica that starts (a deploy, a restart after a crash) usually has a
/// backlog to catch up on, and the scan of ten million keys takes a core
/// for five seconds of it (measured with the bench's 10M-key row, where
/// it ran through most of the measurement).
const SCAN_AT_ONCE_UP_TO: i64 = 256 << 20;
/// When a larger table is first counted.
const FIRST_SCAN_AFTER: Duration = Duration::from_secs(60);
/// How often a standby tries to become the leader.
const STANDBY_RETRY: Duration = Duration::from_secs(2);
/// How often the leader checks that the connection holding its lock lives.
const LOCK_CHECK_EVERY: Duration = Duration::from_secs(1);
/// A lock check slower than this counts as a lost connection.
const LOCK_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// What the upkeep leader purges: finished keys older than `keep` (this
/// replica's, resolved at start-up; see `retention::keep`), `batch` at a
/// time, every `every`.
struct Purging {
    keep: Duration,
    every: Duration,
    batch: i64,
}

pub(crate) async fn run(
    store: Store,
    retention: RetentionSettings,
    keep: Duration,
    metrics: Metrics,
    health: Health,
    shutdown: CancellationToken,
) {
    let purging = Purging {
        keep,
        every: retention.purge_every,
        batch: retention.purge_batch,
    };
    tokio::join!(
        report_readiness(&store, &metrics, &health, &shutdown),
        lead_when_elected(&store, &purging, &metrics, &shutdown),
    );
}

async fn report_readiness(
    store: &Store,
    metrics: &Metrics,
    health: &Health,
    shutdown: &CancellationToken,
) {
    let mut ping = interval(PING_EVERY);
    // Waiting for PostgreSQL (however long, in an outage) is on purpose.
    let heartbeat = health.liveness().register("store watch");
    loop {
        heartbeat.beat();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ping.tick() => {
                match heartbeat.waiting(store.ping()).await {
                    Ok(()) => health.set(Component::Store, true),
                    Err(e) => {
                        let code = e.sqlstate().unwrap_or_else(|| e.class().to_string());
                        health.set_down(Component::Store, format!("{code}: {}", chain(&e)));
                    }
                }
                metrics.ready.set(health.ready().into());
            }
        }
    }
}

/// Stands by until this replica holds the upkeep lock, leads until the
/// lock's connection is lost, and stands by again.
async fn lead_when_elected(
    store: &Store,
    purging: &Purging,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) {
    let mut standby = interval(STANDBY_RETRY);
    standby.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut conn: Option<PgConnection> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = standby.tick() => {}
        }
        match try_lock(store, &mut conn, purging.keep).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                conn = None;
                tracing::warn!(error = %chain(&e), "upkeep election failed; standing by");
                continue;
            }
        }
        let Some(held) = conn.take() else { continue };
        metrics.upkeep_leader.set(1);
        tracing::info!("upkeep leader: this replica purges and counts keys");
        lead(store, held, purging, metrics, shutdown).await;
        metrics.upkeep_leader.set(0);
        // Only the leader exports the key-table gauges, so a former leader's
        // stale numbers never sit beside the new leader's.
        metrics.keys.reset();
        metrics.keys_abandoned.set(0);
    }
}

/// Tries to take the lock, on the standby connection if it still lives
/// (a new one announces this replica's keep first).
async fn try_lock(
    store: &Store,
    conn: &mut Option<PgConnection>,
    keep: Duration,
) -> Result<bool, StoreError> {
    if conn.is_none() {
        let mut fresh = store.dedicated_connection().await?;
        Store::announce_keep(&mut fresh, keep).await?;
        *conn = Some(fresh);
    }
    let c = conn.as_mut().expect("connected just above");
    if crate::broken::is(crate::broken::Break::NoUpkeepLock) {
        // Test-only: every replica leads.
        return Ok(true);
    }
    Store::try_upkeep_lock(c).await
}

/// Purges and counts while the lock's connection lives. Returns when it is
/// lost (the lock went with it) or on shutdown (dropping the connection
/// frees the lock for a standby at once).
async fn lead(
    store: &Store,
    mut conn: PgConnection,
    purging: &Purging,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) {
    let mut check = interval(LOCK_CHECK_EVERY);
    let mut count_unknown = interval(COUNT_UNKNOWN_EVERY);
    let first_scan = match store.table_bytes().await {
        Ok(bytes) if bytes <= SCAN_AT_ONCE_UP_TO => Instant::now(),
        _ => Instant::now() + FIRST_SCAN_AFTER,
    };
    let mut count_scanned = interval_at(first_scan, COUNT_SCANNED_EVERY);
    let mut purge = interval(purging.every);
    let mut keep = purging.keep;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = check.tick() => {
                let alive = timeout(LOCK_CHECK_TIMEOUT, Store::check_connection(&mut conn)).await;
                match alive {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %chain(&e), "upkeep lock lost with its connection; standing by");
                        return;
                    }
                    Err(_) => {
                        tracing::warn!("upkeep lock connection stopped answering; standing by");
                        return;
                    }
                }
            }
            _ = count_unknown.tick() => record_counts(store.count_unknown().await, metrics),
            _ = count_scanned.tick() => match store.count_scanned().await {
                Ok(scanned) => {
                    metrics.keys_abandoned.set(scanned.abandoned);
                    record_counts(Ok(scanned.counts), metrics);
                }
                Err(e) => record_counts(Err(e), metrics),
            },
            _ = purge.tick() => purge_once(store, &mut conn, purging, &mut keep, metrics).await,
        }
    }
}

/// Purges with the longest keep a live replica announces (this one's
/// included). If the announcements cannot be read, nothing is purged:
/// this replica's keep alone could be too short for another one.
async fn purge_once(
    store: &Store,
    conn: &mut PgConnection,
    purging: &Purging,
    keep: &mut Duration,
    metrics: &Metrics,
) {
    let Ok(announced) = timeout(LOCK_CHECK_TIMEOUT, longest_keep(conn, purging.keep)).await else {
        tracing::warn!("retention purge skipped: the upkeep connection stopped answering");
        return;
    };
    let purged = match announced {
        Ok(longest) => {
            if longest != *keep {
                tracing::info!(
                    keep = %humantime::format_duration(longest),
                    own = %humantime::format_duration(purging.keep),
                    "retention: purging keys older than the longest retention.keep of the live replicas"
                );
                *keep = longest;
            }
            store.purge(longest, purging.batch).await
        }
        Err(e) => Err(e),
    };
    match purged {
        Ok(0) => {}
        Ok(n) => {
            metrics.keys_purged.inc_by(n);
            tracing::info!(purged = n, "retention purge");
        }
        Err(e) => {
            metrics.store_error(&e);
            tracing::warn!(error = %chain(&e), "retention purge failed");
        }
    }
}

async fn longest_keep(conn: &mut PgConnection, own: Duration) -> Result<Duration, StoreError> {
    if crate::broken::is(crate::broken::Break::OwnKeepOnly) {
        // Test-only: every leader purges with its own keep.
        return Ok(own);
    }
    let announced = Store::longest_announced_keep(conn).await?;
    Ok(announced.map_or(own, |a| a.max(own)))
}

fn record_counts(counts: Result<Vec<(KeyStatus, i64)>, StoreError>, metrics: &Metrics) {
    match counts {
        Ok(counts) => {
            for (status, n) in counts {
                metrics.keys.with_label_values(&[status.as_str()]).set(n);
            }
        }
        Err(e) => {
            metrics.store_error(&e);
            tracing::warn!(error = %chain(&e), "counting keys failed");
        }
    }
}
