//! Two database roles: the schema owner runs `dedupq migrate`; the runtime
//! role has USAGE on the schema and SELECT/INSERT/UPDATE/DELETE on its
//! tables, nothing more. `store.migrate = "check"` lets it start, and
//! `auto` asks it for DDL only when a migration is really pending.

use crate::support::{self, handlers::Recording, unique};
use dedupq::config::{HttpSettings, MigrateMode, SecretUrl, Settings, StoreSettings};
use dedupq::startup::Application;
use sqlx::{Executor, PgPool};
use std::sync::Arc;

/// A login role with data rights only, on one schema.
pub struct RuntimeRole {
    pub name: String,
    pub password: String,
    admin: PgPool,
}

impl RuntimeRole {
    /// Creates the role and grants it what the runtime needs on `schema`:
    /// now, and on every table the owner creates there later.
    pub async fn create(schema: &str) -> Self {
        let admin = PgPool::connect(&support::database_url()).await.unwrap();
        let (name, password) = (unique("dq_runtime"), unique("pw"));
        for sql in [
            format!("CREATE ROLE {name} LOGIN PASSWORD '{password}'"),
            format!("GRANT USAGE ON SCHEMA \"{schema}\" TO {name}"),
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{schema}\" TO {name}"
            ),
            format!(
                "ALTER DEFAULT PRIVILEGES IN SCHEMA \"{schema}\" \
                 GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {name}"
            ),
        ] {
            admin.execute(sql.as_str()).await.unwrap();
        }
        Self {
            name,
            password,
            admin,
        }
    }

    fn url(&self) -> String {
        format!(
            "postgres://{}:{}@127.0.0.1:5432/postgres",
            self.name, self.password
        )
    }

    pub async fn drop(self) {
        for sql in [
            format!("DROP OWNED BY {}", self.name),
            format!("DROP ROLE {}", self.name),
        ] {
            self.admin.execute(sql.as_str()).await.unwrap();
        }
    }
}

fn settings(url: String, schema: &str, migrate: MigrateMode) -> Settings {
    Settings {
        store: StoreSettings {
            url: SecretUrl::new(url),
            schema: Some(schema.to_string()),
            migrate,
            ..StoreSettings::default()
        },
        http: HttpSettings {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..HttpSettings::default()
        },
        ..Settings::default()
    }
}

async fn build(settings: Settings) -> anyhow::Result<Application> {
    Application::build_with_handler(settings, Arc::new(Recording::default())).await
}

#[tokio::test]
async fn a_runtime_role_without_ddl_rights_starts_and_processes_payments() {
    let (_, owner) = support::isolated_store().await;
    let schema = owner.schema.clone().unwrap();
    let role = RuntimeRole::create(&schema).await;

    for mode in [MigrateMode::Check, MigrateMode::Auto] {
        let app = build(settings(role.url(), &schema, mode))
            .await
            .unwrap_or_else(|e| panic!("{mode:?} with the runtime role: {e:#}"));
        let decisions = app
            .pipeline()
            .process(&[support::message("acme", &unique("k"), r#"{"amount":5}"#)])
            .await
            .unwrap();
        assert_eq!(decisions.len(), 1);
        app.shutdown_token().cancel();
    }
    let rows = support::count_rows(&dedupq::store::Store::connect_lazy(&owner).unwrap()).await;
    assert_eq!(
        rows, 2,
        "both payments were claimed and stored by the runtime role"
    );

    let denied = sqlx::query("CREATE TABLE probe (id int)")
        .execute(&PgPool::connect(&role.url()).await.unwrap())
        .await;
    assert!(denied.is_err(), "the runtime role really has no DDL rights");
    role.drop().await;
}

#[tokio::test]
async fn pending_migrations_stop_the_runtime_role_until_the_owner_runs_dedupq_migrate() {
    let schema = unique("t");
    let admin = PgPool::connect(&support::database_url()).await.unwrap();
    admin
        .execute(format!("CREATE SCHEMA \"{schema}\"").as_str())
        .await
        .unwrap();
    let role = RuntimeRole::create(&schema).await;

    let auto = build(settings(role.url(), &schema, MigrateMode::Auto)).await;
    let auto = format!("{:#}", auto.err().expect("auto cannot apply migrations"));
    assert!(auto.contains("store.migrate = \"auto\""), "{auto}");
    assert!(auto.contains("may not apply them"), "{auto}");
    assert!(auto.contains("dedupq migrate"), "{auto}");
    assert!(auto.contains("permission denied"), "{auto}");

    let check = build(settings(role.url(), &schema, MigrateMode::Check)).await;
    let check = format!("{:#}", check.err().expect("check refuses a schema behind"));
    assert!(check.contains("store.migrate = \"check\""), "{check}");
    assert!(check.contains("0001 keys"), "{check}");
    assert!(check.contains("dedupq migrate"), "{check}");
    let behind = support::cli::migrate(&role.url(), &schema, &["--check"]).unwrap_err();
    assert!(behind.contains("0001 keys"), "{behind}");

    let applied = support::cli::migrate(&support::database_url(), &schema, &[]).unwrap();
    assert!(applied.contains("migrations applied"), "{applied}");
    support::cli::migrate(&role.url(), &schema, &["--check"]).unwrap();
    let app = build(settings(role.url(), &schema, MigrateMode::Check))
        .await
        .unwrap_or_else(|e| panic!("check after dedupq migrate: {e:#}"));
    app.shutdown_token().cancel();
    role.drop().await;
}
