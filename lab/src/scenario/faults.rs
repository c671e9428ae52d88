//! A profile's faults, dealt to a running scenario: each applied at its
//! moment, noted in the report's timeline, and ended when its time is up.

use super::fleet::Fleet;
use super::pg_faults::{through_restarts, RowLocks, RunRole};
use super::profile::Fault;
use super::report::Report;
use super::verify::FrozenClaim;
use anyhow::Context;
use serde_json::Value;
use sqlx::PgPool;
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;

/// What ends a fault that lasts.
enum Ending {
    /// Back to the base knobs, once no other stretch runs.
    ProviderKnobs,
    Writable,
    SessionsLetIn,
    NoStatementTimeout,
    Unlock(RowLocks),
    Thaw(usize),
}

/// Everything a fault acts on besides the fleet.
pub(super) struct Targets<'a> {
    /// The provider simulator's base URL.
    pub provider: String,
    pub base_knobs: Value,
    /// `scripts/services`, to restart PostgreSQL and Kafka.
    pub services: PathBuf,
    /// The fleet's own PostgreSQL role, when the profile needs one.
    pub role: Option<&'a RunRole>,
    /// The run's own (administrator's) pool, and the key table's schema.
    pub admin: PgPool,
    pub schema: String,
    /// The fleet's `engine.lease`.
    pub lease: Duration,
}

pub(super) struct Injector<'a> {
    targets: Targets<'a>,
    started: Instant,
    endings: Vec<(Instant, Ending)>,
    /// The claims of every process frozen so far.
    frozen: Vec<FrozenClaim>,
}

impl<'a> Injector<'a> {
    pub(super) fn new(targets: Targets<'a>, started: Instant) -> Self {
        Self {
            targets,
            started,
            endings: Vec::new(),
            frozen: Vec::new(),
        }
    }

    /// The claims frozen processes held when they were stopped.
    pub(super) fn frozen_claims(&self) -> &[FrozenClaim] {
        &self.frozen
    }

    fn note(&self, report: &mut Report, what: &str) {
        report.note(self.started.elapsed(), what);
    }

    fn role(&self) -> anyhow::Result<&'a RunRole> {
        self.targets
            .role
            .context("a PostgreSQL fault needs the run's own role")
    }

    fn until(&mut self, for_: Duration, ending: Ending) {
        self.endings.push((Instant::now() + for_, ending));
        self.endings.sort_by_key(|(t, _)| *t);
    }

    pub(super) async fn inject(
        &mut self,
        fault: Fault,
        fleet: &mut Fleet,
        report: &mut Report,
    ) -> anyhow::Result<()> {
        self.note(report, &format!("{fault:?}"));
        let t = &self.targets;
        match fault {
            Fault::KillOne => {
                fleet.kill(0);
                tokio::time::sleep(Duration::from_millis(500)).await;
                fleet.restart(0).await?;
            }
            Fault::RestartPostgres => {
                services(&t.services, "restart", "postgres").await?;
                report.postgres_restarts += 1;
            }
            Fault::RestartKafka => {
                services(&t.services, "restart", "kafka").await?;
                report.kafka_restarts += 1;
            }
            Fault::CloseAmqpConnections => {
                let _ = tokio::process::Command::new("rabbitmqctl")
                    .args(["close_all_connections", "dedupq scenario fault"])
                    .stdout(std::process::Stdio::null())
                    .status()
                    .await;
                report.amqp_closes += 1;
            }
            Fault::Provider { knobs, for_ } => {
                set_knobs(&t.provider, &knobs).await;
                self.until(for_, Ending::ProviderKnobs);
                report.provider_stretches += 1;
            }
            Fault::PostgresReadOnly { for_ } => {
                let cut = self.role()?.read_only().await?;
                self.note(report, &format!("  read-only; {cut} sessions cut"));
                self.until(for_, Ending::Writable);
                report.pg_read_only += 1;
            }
            Fault::PostgresNoConnections { for_ } => {
                let cut = self.role()?.refuse_sessions().await?;
                self.note(
                    report,
                    &format!("  new sessions refused; {cut} sessions cut"),
                );
                self.until(for_, Ending::SessionsLetIn);
                report.pg_no_connections += 1;
            }
            Fault::StatementTimeout { timeout, for_ } => {
                let cut = self.role()?.statement_timeout(Some(timeout)).await?;
                self.note(report, &format!("  timeout set; {cut} sessions cut"));
                self.until(for_, Ending::NoStatementTimeout);
                report.pg_timeouts += 1;
            }
            Fault::RowLocks { each, for_ } => {
                let locks = RowLocks::take(&t.admin, &t.schema, each).await?;
                self.note(report, &format!("  locked {:?}", locks.rows));
                self.until(for_, Ending::Unlock(locks));
                report.pg_row_locks += 1;
            }
            Fault::FreezePastLease { beyond } => {
                let (i, owner) = busiest(&t.admin, &t.schema, fleet).await?;
                let pid = fleet.pid(i).unwrap_or_default();
                let for_ = t.lease + beyond;
                fleet.freeze(i, true)?;
                // Statements it sent just before may still land.
                tokio::time::sleep(Duration::from_millis(300)).await;
                let claims = match &owner {
                    Some(owner) => frozen_claims(&t.admin, &t.schema, owner).await?,
                    None => Vec::new(),
                };
                let last = claims.iter().map(|c| c.lease_until).max();
                let last = last.map_or("-".into(), |t| t.format("%H:%M:%S%.3f").to_string());
                self.note(
                    report,
                    &format!(
                        "  SIGSTOP instance {i} (pid {pid}) for {for_:?}: {} claims, leases ending by {last}",
                        claims.len()
                    ),
                );
                self.frozen.extend(claims);
                self.until(for_, Ending::Thaw(i));
                report.freezes += 1;
            }
        }
        Ok(())
    }

    /// Ends every fault whose time is up (all of them with `all`).
    pub(super) async fn end_due(
        &mut self,
        fleet: &mut Fleet,
        report: &mut Report,
        all: bool,
    ) -> anyhow::Result<()> {
        let now = Instant::now();
        while let Some(pos) = self.endings.iter().position(|(t, _)| all || *t <= now) {
            let (_, ending) = self.endings.remove(pos);
            self.end(ending, fleet, report).await?;
        }
        Ok(())
    }

    async fn end(
        &mut self,
        ending: Ending,
        fleet: &mut Fleet,
        report: &mut Report,
    ) -> anyhow::Result<()> {
        let what = match ending {
            Ending::ProviderKnobs => {
                let others = self
                    .endings
                    .iter()
                    .any(|(_, e)| matches!(e, Ending::ProviderKnobs));
                if others {
                    return Ok(());
                }
                set_knobs(&self.targets.provider, &self.targets.base_knobs).await;
                "provider knobs back to the base".to_string()
            }
            Ending::Writable => {
                self.role()?.writable().await?;
                "PostgreSQL writable again (new sessions only)".into()
            }
            Ending::SessionsLetIn => {
                self.role()?.accept_sessions().await?;
                "PostgreSQL lets the fleet's sessions in again".into()
            }
            Ending::NoStatementTimeout => {
                let cut = self.role()?.statement_timeout(None).await?;
                format!("statement timeout reset; {cut} sessions cut")
            }
            Ending::Unlock(locks) => {
                locks.release().await?;
                "row locks rolled back".into()
            }
            Ending::Thaw(i) => {
                fleet.freeze(i, false)?;
                format!("SIGCONT instance {i}")
            }
        };
        self.note(report, &what);
        Ok(())
    }
}

/// The instance holding the most live claims, and the owner name it
/// claims under (None if it holds none).
async fn busiest(
    admin: &PgPool,
    schema: &str,
    fleet: &Fleet,
) -> anyhow::Result<(usize, Option<String>)> {
    let sql = format!(
        "SELECT owner, count(*) FROM \"{schema}\".dedupq_keys \
         WHERE status = 'in_progress' AND lease_until > now() GROUP BY owner ORDER BY 2 DESC"
    );
    let owners: Vec<(String, i64)> =
        through_restarts(|| sqlx::query_as(&sql).fetch_all(admin)).await?;
    // Owners are named host-pid-nonce.
    let pid_of = |owner: &str| owner.rsplit('-').nth(1)?.parse::<u32>().ok();
    let found = owners.iter().find_map(|(owner, _)| {
        let i = (0..fleet.instances.len()).find(|i| pid_of(owner) == fleet.pid(*i))?;
        Some((i, Some(owner.clone())))
    });
    Ok(found.unwrap_or((0, None)))
}

/// The claims `owner` holds now, with their leases as PostgreSQL has them.
async fn frozen_claims(
    admin: &PgPool,
    schema: &str,
    owner: &str,
) -> anyhow::Result<Vec<FrozenClaim>> {
    let sql = format!(
        "SELECT tenant || ':' || key, attempts, epoch, lease_until FROM \"{schema}\".dedupq_keys \
         WHERE status = 'in_progress' AND owner = $1 AND lease_until IS NOT NULL"
    );
    let rows: Vec<(String, i32, i64, chrono::DateTime<chrono::Utc>)> =
        through_restarts(|| sqlx::query_as(&sql).bind(owner).fetch_all(admin)).await?;
    Ok(rows
        .into_iter()
        .map(|(derived_key, attempt, epoch, lease_until)| FrozenClaim {
            derived_key,
            owner: owner.to_string(),
            attempt,
            epoch,
            lease_until,
        })
        .collect())
}

async fn services(script: &PathBuf, action: &str, name: &str) -> anyhow::Result<()> {
    let status = tokio::process::Command::new(script)
        .args([action, name])
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .with_context(|| format!("{} {action} {name}", script.display()))?;
    anyhow::ensure!(
        status.success(),
        "{} {action} {name} failed",
        script.display()
    );
    Ok(())
}

/// Applies provider knobs; a refusal (a knob the simulator does not know
/// or cannot use) is logged with the simulator's reason.
pub(super) async fn set_knobs(provider: &str, knobs: &Value) {
    let sent = reqwest::Client::new()
        .post(format!("{provider}/admin/knobs"))
        .json(knobs)
        .send()
        .await;
    match sent {
        Ok(r) if r.status().is_success() => {}
        Ok(r) => {
            let status = r.status();
            let why = r.text().await.unwrap_or_default();
            tracing::warn!(%status, %why, %knobs, "the provider refused knobs");
        }
        Err(e) => {
            tracing::warn!(error = %dedupq::telemetry::chain(&e), "setting provider knobs failed");
        }
    }
}
