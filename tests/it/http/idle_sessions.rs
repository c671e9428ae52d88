//! PostgreSQL ends sessions that sit idle (`idle_session_timeout` on the
//! role, as a managed server or a DBA may set it; a restart ends them
//! all). dedupq's pool keeps idle connections, so the next statement on
//! one of them found its session over (SQLSTATE 57P05) and the request
//! was answered 503 "store unavailable" while PostgreSQL was up and well.
//! A statement that never ran because its session had ended is run again
//! on a fresh connection; every request between idle spells is answered
//! as if the pool had never been idle, and each is charged once. The
//! upkeep leader's own session, idle between rounds on purpose, is exempt
//! from the timeout: it keeps its lock instead of losing it every spell.

use super::harness::{scratch, settings, App};
use crate::support::pg_faults::FaultyRole;
use crate::support::process::Provider;
use crate::support::{database_url, eventually, isolated_store};
use dedupq_provider::Knobs;
use std::time::Duration;

/// How long a session of the test's role may sit idle.
const IDLE_TIMEOUT: &str = "300ms";
/// Longer than that: every pooled connection's session is over by then.
const IDLE_SPELL: Duration = Duration::from_millis(900);

/// The backend of the role's session holding an advisory lock (the upkeep
/// lock; the test's role has no other), if one does.
async fn upkeep_backend(admin: &sqlx::PgPool, role: &str) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND a.usename = $1",
    )
    .bind(role)
    .fetch_optional(admin)
    .await
    .expect("read pg_locks")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_after_postgres_ended_the_pools_idle_sessions_are_answered_and_charged_once() {
    let provider = Provider::start(Knobs::default()).await;
    let role = FaultyRole::create().await;
    role.set("idle_session_timeout", Some(IDLE_TIMEOUT)).await;
    let (_, store) = isolated_store().await;
    let s = settings(&role.store_settings(&store), &provider, &scratch());
    let app = App::start(s).await;
    app.wait_ready().await;
    let admin = sqlx::PgPool::connect(&database_url()).await.expect("admin");
    let leader = eventually(Duration::from_secs(20), "the upkeep lock taken", || {
        upkeep_backend(&admin, &role.name)
    })
    .await;

    let mut statuses = Vec::new();
    for i in 0..5 {
        tokio::time::sleep(IDLE_SPELL).await;
        let body = format!(r#"{{"amount": {}, "currency": "EUR"}}"#, 100 + i);
        let reply = app.pay(&format!("idle-{i}"), &body).await;
        statuses.push(reply.status);
        let ready = reqwest::get(format!("http://{}/readyz", app.ops))
            .await
            .expect("readyz answers");
        assert!(
            ready.status().is_success(),
            "/readyz after an idle spell: {}",
            ready.text().await.unwrap_or_default()
        );
    }
    assert_eq!(
        statuses, [201; 5],
        "no request may be refused because the pool sat idle"
    );
    assert_eq!(
        upkeep_backend(&admin, &role.name).await,
        Some(leader),
        "the upkeep session outlives the idle spells, its lock held throughout"
    );
    let stats = provider.stats().await;
    assert_eq!(stats.charges, 5, "each payment charged once");
    for i in 0..5 {
        assert_eq!(
            app.status("acme", &format!("idle-{i}")).await.as_deref(),
            Some("done")
        );
    }
    app.stop().await;
    role.set("idle_session_timeout", None).await;
    role.drop().await;
}
