//! `dedupq keys …`: operator reads and repairs on the key table.

use super::output::{self, cell, Format, Row};
use super::{actor, KeysCommand};
use crate::config::Settings;
use crate::identity::{IdempotencyKey, Identity, Tenant};
use crate::store::{AuditRow, KeyFilter, KeyRow, KeyStatus, Released, Repaired, Settlement, Store};
use anyhow::{anyhow, bail, Context};
use std::io::Write;
use std::time::Duration;

fn identity(tenant: &str, key: &str) -> anyhow::Result<Identity> {
    Ok(Identity {
        tenant: Tenant::parse(tenant.as_bytes()).context("TENANT")?,
        key: IdempotencyKey::parse(key.as_bytes()).context("KEY")?,
    })
}

impl Row for KeyRow {
    const COLUMNS: &'static [&'static str] = &[
        "tenant",
        "key",
        "status",
        "epoch",
        "attempts",
        "owner",
        "lease_until",
        "updated_at",
    ];
    fn cells(&self) -> Vec<String> {
        let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
            t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_else(|| "-".into())
        };
        vec![
            cell(&self.tenant, 24),
            cell(&self.key, 40),
            self.status.as_str().into(),
            self.epoch.to_string(),
            self.attempts.to_string(),
            cell(&self.owner, 32),
            time(self.lease_until),
            time(Some(self.updated_at)),
        ]
    }
}

impl Row for AuditRow {
    const COLUMNS: &'static [&'static str] = &["at", "tenant", "key", "action", "actor", "reason"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.at.format("%Y-%m-%d %H:%M:%S").to_string(),
            cell(&self.tenant, 24),
            cell(&self.key, 40),
            cell(&self.action, 16),
            cell(&self.actor, 24),
            cell(&self.reason, 60),
        ]
    }
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
            tenant,
            limit,
            output,
        } => {
            let filter = match (status, unknown) {
                (_, true) => KeyFilter::Status(KeyStatus::Unknown),
                (Some(s), false) => KeyFilter::Status(KeyStatus::parse(&s).map_err(|_| {
                    anyhow!("--status must be one of in_progress, done, failed, unknown")
                })?),
                (None, false) => KeyFilter::Stuck,
            };
            if let Some(t) = &tenant {
                Tenant::parse(t.as_bytes()).context("--tenant")?;
            }
            let rows = store.list_keys(filter, tenant.as_deref(), limit).await?;
            output::print(Format::choose(output.output), &rows, out)?;
        }
        KeysCommand::Audit {
            tenant,
            key,
            limit,
            output,
        } => {
            let rows = store
                .audit_log(tenant.as_deref(), key.as_deref(), limit)
                .await?;
            output::print(Format::choose(output.output), &rows, out)?;
        }
        KeysCommand::Release {
            tenant,
            key,
            reason,
            force,
            actor,
        } => {
            let id = identity(&tenant, &key)?;
            let actor = actor::resolve(actor.actor.as_deref());
            let before = match store.release_key(&id, &reason, &actor, force).await? {
                Released::Done(before) => before,
                Released::NotOpen => {
                    bail!("{id} is not open (absent, done or failed): nothing to release")
                }
                Released::LeaseLive { until, owner } => bail!(
                    "{id} is held by {owner} until {until} (a live lease: its worker may be \
                     calling the provider now). Wait for the lease to end, or use --force to \
                     release it anyway: the next delivery may then run while that worker still \
                     does (two executions; one charge only if the provider honours the derived key)"
                ),
            };
            tracing::warn!(
                tenant,
                key,
                reason,
                actor,
                force,
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
        KeysCommand::Settle {
            tenant,
            key,
            done,
            failed: _,
            result,
            status,
            reason,
            actor,
        } => {
            let id = identity(&tenant, &key)?;
            let actor = actor::resolve(actor.actor.as_deref());
            let settlement = settlement(done, result, status, reason.as_deref())?;
            let reason = reason.unwrap_or_else(|| "settled by operator".into());
            match store.settle_key(&id, &settlement, &reason, &actor).await? {
                Repaired::Done(before) => {
                    let to = if done { "done" } else { "failed" };
                    tracing::warn!(tenant, key, reason, actor, to, "key settled by operator");
                    writeln!(
                        out,
                        "settled {id} as {to} (was {} at epoch {})",
                        before.status.as_str(),
                        before.epoch
                    )?;
                }
                Repaired::Absent => bail!("no key {key} for tenant {tenant}"),
                Repaired::Refused(row) => bail!(
                    "{id} is {} (lease until {:?}): only a key that is unknown, or in progress \
                     past its lease, and that no worker holds can be settled",
                    row.status.as_str(),
                    row.lease_until
                ),
            }
        }
        KeysCommand::Reset {
            tenant,
            key,
            reason,
            actor,
        } => {
            let id = identity(&tenant, &key)?;
            let actor = actor::resolve(actor.actor.as_deref());
            match store.reset_key(&id, &reason, &actor).await? {
                Repaired::Done(before) => {
                    tracing::warn!(tenant, key, reason, actor, "key reset by operator");
                    writeln!(
                        out,
                        "reset {id} (was {} with status {}); the next delivery runs it again",
                        before.status.as_str(),
                        before.result_status.unwrap_or_default()
                    )?;
                }
                Repaired::Absent => bail!("no key {key} for tenant {tenant}"),
                Repaired::Refused(row) => bail!(
                    "{id} is {}: only done or failed keys can be reset (settle or release an unknown one)",
                    row.status.as_str()
                ),
            }
        }
        KeysCommand::Purge {
            older_than,
            force,
            actor,
        } => {
            check_purge_age(settings, older_than, force)?;
            let n = store
                .purge(older_than, settings.retention.purge_batch)
                .await?;
            let actor = actor::resolve(actor.actor.as_deref());
            let age = humantime::format_duration(older_than).to_string();
            tracing::warn!(
                purged = n,
                older_than = age,
                actor,
                force,
                "keys purged by operator"
            );
            writeln!(out, "purged {n} finished keys older than {age}")?;
        }
    }
    Ok(())
}

/// What `keys settle` records.
fn settlement(
    done: bool,
    result: Option<String>,
    status: Option<i32>,
    reason: Option<&str>,
) -> anyhow::Result<Settlement> {
    if done {
        let result = result.ok_or_else(|| anyhow!("--done needs --result JSON"))?;
        crate::json::parse(result.as_bytes()).context("--result must be JSON")?;
        return Ok(Settlement::Done {
            status: status.unwrap_or(200),
            body: result.into_bytes(),
        });
    }
    let body = serde_json::json!({
        "error": "settled_failed",
        "reason": reason.unwrap_or_default(),
    });
    Ok(Settlement::Failed {
        status: status.unwrap_or(0),
        body: body.to_string().into_bytes(),
    })
}

/// A purge must not reach keys a redelivery could still need, unless the
/// operator insists.
fn check_purge_age(settings: &Settings, older_than: Duration, force: bool) -> anyhow::Result<()> {
    let horizon = settings.redelivery_horizon();
    if older_than > horizon || force {
        return Ok(());
    }
    bail!(
        "--older-than {} is within the redelivery horizon {} (retention.redelivery_horizon, \
         handler.retry_for, amqp.retry_delay_max x amqp.max_redeliveries): a message redelivered later would find its key purged and \
         run again. Use an age over the horizon, or --force if you accept that",
        humantime::format_duration(older_than),
        humantime::format_duration(horizon)
    )
}
