//! librdkafka reads its TLS and SASL files (`kafka.client`'s
//! `ssl.*.location` and `kafka.client_files`, e.g. `sasl.password`) when a
//! client is created, and never again. So that rotating one needs no
//! restart, the consumer is restarted in-process when one changes (checked
//! every 2 s, and at once on SIGHUP): its in-flight batches finish and
//! commit as on shutdown, the group member leaves, and a new one joins with
//! the files as they are now. For the guarantee it is a rebalance: nothing
//! uncommitted is lost, and what is redelivered meets its stored key.

use super::{run, KafkaError, KafkaSettings};
use crate::engine::Pipeline;
use crate::health::{Component, Health};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// [`run`], restarted whenever a TLS or SASL file it was built from
/// changes, until `shutdown`.
pub async fn run_reloading(
    settings: KafkaSettings,
    pipeline: Arc<dyn Pipeline>,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), KafkaError> {
    let files = watched_files(&settings);
    if files.is_empty() {
        return run(settings, pipeline, health, shutdown).await;
    }
    // Set after a restart: the changed files may not work (a CA that does
    // not sign the brokers' certificates, a wrong password). The consumer
    // then waits, not ready, for them to change again instead of stopping
    // the process.
    let mut restarted = false;
    loop {
        let built_from = digest(&files);
        let round = shutdown.child_token();
        let reloading = Arc::new(AtomicBool::new(false));
        let watcher = tokio::spawn(watch(
            files.clone(),
            built_from,
            round.clone(),
            reloading.clone(),
        ));
        let result = run(settings.clone(), pipeline.clone(), health.clone(), round).await;
        watcher.abort();
        if shutdown.is_cancelled() {
            return result;
        }
        if reloading.load(Ordering::SeqCst) {
            tracing::info!(files = ?files, "Kafka TLS/SASL files changed: restarting the consumer with them");
            restarted = true;
            continue;
        }
        match result {
            // A fatal client error is not the files' doing: it stops dedupq.
            Err(e) if restarted && !matches!(e, KafkaError::Fatal { .. }) => {
                let reason = format!(
                    "the consumer cannot start with the changed TLS/SASL files: {}",
                    crate::telemetry::chain(&e)
                );
                tracing::error!(%reason, "waiting for the Kafka TLS/SASL files to change again");
                health.set_down(Component::Kafka, reason);
                let round = shutdown.child_token();
                watch(files.clone(), built_from, round, Arc::default()).await;
                if shutdown.is_cancelled() {
                    return Ok(());
                }
            }
            other => return other,
        }
    }
}

/// The files the Kafka clients are built from.
fn watched_files(s: &KafkaSettings) -> Vec<PathBuf> {
    let locations = s
        .client
        .iter()
        .filter(|(property, _)| property.ends_with(".location"))
        .map(|(_, path)| PathBuf::from(path));
    locations.chain(s.client_files.values().cloned()).collect()
}

/// One digest of every file's bytes (a file that cannot be read counts as
/// empty: a file being replaced is read again on the next check).
fn digest(files: &[PathBuf]) -> [u8; 32] {
    let mut d = Sha256::new();
    for f in files {
        d.update(std::fs::read(f).unwrap_or_default());
        d.update(b"\0");
    }
    d.finalize().into()
}

/// Returns, cancelling `round`, once the files differ from `built_from`;
/// or when `round` is cancelled.
async fn watch(
    files: Vec<PathBuf>,
    built_from: [u8; 32],
    round: CancellationToken,
    reloading: Arc<AtomicBool>,
) {
    let mut recheck = crate::recheck::Recheck::new();
    loop {
        tokio::select! {
            _ = round.cancelled() => return,
            _ = recheck.next() => {}
        }
        let readable = files.iter().all(|f| std::fs::metadata(f).is_ok());
        if readable && digest(&files) != built_from {
            reloading.store(true, Ordering::SeqCst);
            round.cancel();
            return;
        }
    }
}
