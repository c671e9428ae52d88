//! `dedupq keys …`: operator reads and repairs on the key table.

use super::KeysCommand;
use crate::config::Settings;
use crate::identity::{IdempotencyKey, Identity, Tenant};
use crate::store::{KeyFilter, KeyStatus, Store};
use anyhow::{anyhow, Context};
use std::io::Write;

fn identity(tenant: &str, key: &str) -> anyhow::Result<Identity> {
    Ok(Identity {
        tenant: Tenant::parse(tenant.as_bytes()).context("TENANT")?,
        key: IdempotencyKey::parse(key.as_bytes()).context("KEY")?,
    })
}

/// Runs one `keys` subcommand, writing its report to `out`.
pub async fn run_keys(
    settings: &Settings,
    command: KeysCommand,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let store = Store::connect_lazy(&settings.store)?;
    match command {
        KeysCommand::Show { tenant, key } => {
            let row = store.show_key(&identity(&tenant, &key)?).await?;
            let row = row.ok_or_else(|| anyhow!("no key {key} for tenant {tenant}"))?;
            writeln!(out, "{}", serde_json::to_string_pretty(&row)?)?;
        }
        KeysCommand::List {
            status,
            unknown,
            limit,
        } => {
            let filter = match (status, unknown) {
                (_, true) => KeyFilter::Status(KeyStatus::Unknown),
                (Some(s), false) => KeyFilter::Status(KeyStatus::parse(&s).map_err(|_| {
                    anyhow!("--status must be one of in_progress, done, failed, unknown")
                })?),
                (None, false) => KeyFilter::Stuck,
            };
            for row in store.list_keys(filter, limit).await? {
                writeln!(out, "{}", serde_json::to_string(&row)?)?;
            }
        }
        KeysCommand::Release {
            tenant,
            key,
            reason,
        } => {
            let id = identity(&tenant, &key)?;
            let actor = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
            match store.release_key(&id, &reason, &actor).await? {
                Some(before) => {
                    tracing::warn!(
                        tenant,
                        key,
                        reason,
                        actor,
                        epoch = before.epoch,
                        "key released by operator"
                    );
                    writeln!(
                        out,
                        "released {id} (was {} at epoch {})",
                        before.status.as_str(),
                        before.epoch
                    )?;
                }
                None => {
                    return Err(anyhow!(
                        "{id} is not open (absent, done or failed): nothing to release"
                    ))
                }
            }
        }
        KeysCommand::Purge { older_than } => {
            let n = store
                .purge(older_than, settings.retention.purge_batch)
                .await?;
            writeln!(
                out,
                "purged {n} finished keys older than {}",
                humantime::format_duration(older_than)
            )?;
        }
    }
    Ok(())
}
