//! One typed configuration tree: defaults, then the standard `OTEL_…`
//! variables (`[telemetry]` only), then a TOML file, then environment
//! variables (`DEDUPQ__SECTION__FIELD`), then secrets from
//! files (`*_file` settings). Validated at start-up; a bad value stops the
//! process with the setting's name and the fix.

pub mod amqp;
pub mod api;
mod check;
pub mod handler;
pub mod kafka;
mod otel_env;
mod retention;
mod secret;
mod sources;
mod store;
pub mod telemetry;

pub use amqp::{AmqpSettings, QueueType, Topology};
pub use api::{ApiSettings, PublishTarget, RouteMode, RouteSettings, WebhookKind};
pub use handler::{HandlerKind, HandlerRoute, HandlerSettings, SecretValue};
pub use kafka::KafkaSettings;
pub use retention::{Keep, RetentionSettings};
pub use secret::{is_secret_name, redact_url, SecretUrl};
pub use store::{check_schema_name, MigrateMode, StoreSettings, SynchronousCommit};
pub use telemetry::{OtlpProtocol, TelemetrySettings};

use crate::fingerprint::FingerprintSpec;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// The whole configuration, one field per TOML table. Built by
/// [`Settings::load`]; `Settings::default()` holds every default of the
/// reference in docs/configuration.md.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// `[store]`: the PostgreSQL that holds the key table.
    pub store: StoreSettings,
    /// `[engine]`: leases, concurrency, attempts and backoff of the claims.
    pub engine: EngineSettings,
    /// `[identity]`: how a message's tenant, key and fingerprint are read.
    pub identity: IdentitySettings,
    /// `[retention]`: how long finished keys are kept, and their purging.
    pub retention: RetentionSettings,
    /// `[handler]`: the work call made for each claimed key.
    pub handler: HandlerSettings,
    /// `[kafka]`: the Kafka transport; off while `kafka.topics` is empty.
    pub kafka: KafkaSettings,
    /// `[amqp]`: the RabbitMQ transport; off while `amqp.queues` is empty.
    pub amqp: AmqpSettings,
    /// `[http]`: the operator endpoint (/metrics, /healthz, /readyz).
    pub http: HttpSettings,
    /// `[api]`: the HTTP API; off unless `api.enabled`.
    pub api: ApiSettings,
    /// `[log]`: the format and filter of log lines.
    pub log: LogSettings,
    /// `[telemetry]`: trace export over OTLP; off by default.
    pub telemetry: TelemetrySettings,
}

/// `[engine]`: how keys are claimed, held and retried.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSettings {
    /// How long a claim is exclusive without renewal.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// How often running handlers' leases are extended.
    #[serde(with = "humantime_serde")]
    pub renew_every: Duration,
    /// Handler runs per process at once.
    pub concurrency: usize,
    /// `engine.max_attempts` (default 10): attempts (first try included)
    /// before a transient failure or an unknown outcome is final, unless
    /// `handler.retry_for` ends them first. Attempts that did nothing (a
    /// fault, a 409 while the provider still works on the key, a probe
    /// during an outage) are not counted.
    pub max_attempts: u32,
    /// `engine.retry_backoff_min` (default 200ms): the first wait before a
    /// retry (a transient failure, an unknown outcome, a key held
    /// elsewhere, an unreachable store); it doubles with every attempt,
    /// with ±20 % jitter.
    #[serde(with = "humantime_serde")]
    pub retry_backoff_min: Duration,
    /// `engine.retry_backoff_max` (default 30s): the longest wait between
    /// retries: ten attempts span about a minute and a half.
    #[serde(with = "humantime_serde")]
    pub retry_backoff_max: Duration,
    /// Most messages claimed in one statement (at most 10 000).
    pub max_batch: usize,
    /// Name written into claimed rows; default: host-pid-random.
    pub owner: Option<String>,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            renew_every: Duration::from_secs(10),
            concurrency: 64,
            max_attempts: 10,
            retry_backoff_min: Duration::from_millis(200),
            retry_backoff_max: Duration::from_secs(30),
            max_batch: 500,
            owner: None,
        }
    }
}

/// Where the tenant of a message comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "snake_case", deny_unknown_fields)]
pub enum TenantSource {
    /// A header set where the deployment authenticates the sender.
    Header {
        /// `identity.tenant.name`: the header (`client-id` by default).
        name: String,
    },
    /// Every message of this deployment belongs to one tenant.
    Fixed {
        /// `identity.tenant.tenant`: the tenant (1..=128 visible ASCII
        /// characters, no `:`).
        tenant: String,
    },
    /// A JSON pointer into the body; only where no header can be trusted.
    Body {
        /// `identity.tenant.pointer`: the pointer, e.g. `/client_id`.
        pointer: String,
    },
}

/// `[identity]`: how each message's tenant, idempotency key and
/// fingerprint are read; the same rules on every transport.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdentitySettings {
    /// `[identity.tenant]` (default: the `client-id` header): where the
    /// tenant comes from.
    pub tenant: TenantSource,
    /// Header carrying the idempotency key (AMQP falls back to message_id).
    pub key_header: String,
    /// If set, the key is read from this JSON pointer when the header is absent.
    pub key_pointer: Option<String>,
    /// `identity.max_body_bytes` (default 1048576): the largest body
    /// accepted; a longer one is dead-lettered `too_large` and claims no key.
    pub max_body_bytes: usize,
    /// The provider's idempotency key: `tenant:key`, or `sha256:<n>` (the
    /// first n hex digits, 32..=64, of SHA-256 over `tenant:key`) for
    /// providers that limit key length. Applies to keys claimed from now on.
    pub derived_key: String,
    /// `[identity.fingerprint]`: the members of the body that define the
    /// operation (default: all but `/sent_at` and `/attempt`) and the
    /// version of the canonical form.
    pub fingerprint: FingerprintSpec,
}

impl Default for IdentitySettings {
    fn default() -> Self {
        Self {
            tenant: TenantSource::Header {
                name: "client-id".into(),
            },
            key_header: "idempotency-key".into(),
            key_pointer: None,
            max_body_bytes: 1024 * 1024,
            derived_key: "tenant:key".into(),
            fingerprint: FingerprintSpec::default(),
        }
    }
}

/// `[http]`: the operator endpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// Address of /metrics, /healthz and /readyz.
    pub listen: SocketAddr,
    /// `http.liveness_timeout` (default 1m): /healthz answers 503 once a
    /// consumer loop or the store watch has not gone round for this long
    /// (idle and paused loops still beat; see `liveness`).
    #[serde(with = "humantime_serde")]
    pub liveness_timeout: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            liveness_timeout: Duration::from_secs(60),
        }
    }
}

impl HttpSettings {
    /// A liveness timeout must leave a waiting loop several beats.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.liveness_timeout < Duration::from_secs(1) {
            return Err(ConfigError::new(
                "http.liveness_timeout",
                format!(
                    "{} is too short: loops beat every {}ms, and 0 would fail /healthz at once",
                    humantime::format_duration(self.liveness_timeout),
                    crate::liveness::BEAT_EVERY.as_millis()
                ),
                "use at least 1s; the default is 1m",
            ));
        }
        Ok(())
    }
}

/// How log lines are written (`log.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// `[log]`: the format and verbosity of log lines.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// `log.format` (default `text`): `text` or `json`.
    pub format: LogFormat,
    /// tracing-subscriber filter, e.g. `info,dedupq=debug`.
    pub filter: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            filter: "info".into(),
        }
    }
}

/// A setting that stops start-up: which one, what is wrong, how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting `{setting}` (env {env}): {problem}. Fix: {fix}")]
pub struct ConfigError {
    /// The setting's dotted name, e.g. `engine.lease` (or `--config`).
    pub setting: String,
    /// The variable that sets it, e.g. `DEDUPQ__ENGINE__LEASE` or
    /// `OTEL_SERVICE_NAME`.
    pub env: String,
    /// What is wrong with the value.
    pub problem: String,
    /// How to correct it.
    pub fix: String,
}

impl ConfigError {
    /// An error about `setting`; its variable name is derived from it.
    pub fn new(setting: &str, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            setting: setting.to_string(),
            env: format!("DEDUPQ__{}", env_name(setting)),
            problem: problem.into(),
            fix: fix.into(),
        }
    }

    /// An error about `setting` as the standard variable `variable` set
    /// it (e.g. `OTEL_SERVICE_NAME`).
    pub fn for_variable(
        setting: &str,
        variable: &str,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            env: variable.to_string(),
            ..Self::new(setting, problem, fix)
        }
    }
}

/// The PEM text of the CA file `setting` names: a file that cannot be read
/// or holds no certificate is refused naming the setting. `signer_of` says
/// whose certificate the CA signed (for the fix).
pub(crate) fn read_ca_pem(
    setting: &str,
    path: &Path,
    signer_of: &str,
) -> Result<String, ConfigError> {
    let fix = format!("point it at the PEM file of the CA that signed {signer_of} certificate");
    let pem = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(
            setting,
            format!("cannot read {}: {e}", path.display()),
            fix.clone(),
        )
    })?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(ConfigError::new(
            setting,
            format!("{} holds no PEM certificate", path.display()),
            fix,
        ));
    }
    Ok(pem)
}

/// The variable of a setting: `engine.lease` -> `ENGINE__LEASE`; a
/// librdkafka property keeps its dots as `_` (see `sources`).
fn env_name(setting: &str) -> String {
    for table in ["kafka.client_files.", "kafka.client."] {
        if let Some(property) = setting.strip_prefix(table) {
            let table = table.trim_end_matches('.').replace('.', "__");
            return format!("{table}__{}", property.replace('.', "_")).to_uppercase();
        }
    }
    setting.replace('.', "__").to_uppercase()
}

/// The layers under the configuration file: the defaults, and over them
/// what the standard OpenTelemetry variables (read through `otel`) set.
fn layers(otel: otel_env::Lookup<'_>) -> Result<Figment, ConfigError> {
    Ok(Figment::from(Serialized::defaults(Settings::default())).merge(otel_env::provider(otel)?))
}

impl Settings {
    /// Defaults, then the `OTEL_…` variables, then the TOML file (if
    /// given), then `DEDUPQ__…` variables, then secret files; the result
    /// has passed [`Settings::validate`].
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = layers(&|name| std::env::var(name).ok())?;
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::new(
                    "--config",
                    format!("file {} does not exist", path.display()),
                    "pass the path of a TOML file, or omit --config",
                ));
            }
            figment = figment.merge(Toml::file(path));
        }
        // `[kafka.client]` variables map to dotted property names, which
        // the generic mapping cannot express: `sources` reads them.
        let env = Env::prefixed("DEDUPQ__")
            .filter(|k| !sources::is_client_variable(k.as_str()))
            .split("__");
        let mut settings: Settings = figment.merge(env).extract().map_err(|e| {
            let setting = e.path.join(".");
            ConfigError::new(
                if setting.is_empty() {
                    "<root>"
                } else {
                    &setting
                },
                e.kind.to_string(),
                "see the configuration reference, docs/configuration.md",
            )
        })?;
        sources::resolve(&mut settings, std::env::vars())?;
        settings.validate()?;
        Ok(settings)
    }

    /// A copy safe to print: credentials in URLs and secret librdkafka
    /// properties replaced by `***`.
    pub fn redacted(&self) -> Self {
        let mut copy = self.clone();
        copy.store.url = SecretUrl::new(self.store.url.to_string());
        copy.amqp.url = SecretUrl::new(self.amqp.url.to_string());
        copy.handler = self.handler.redacted();
        copy.kafka.client = secret::redact_client(&self.kafka.client);
        copy
    }

    /// Every start-up check; the first that fails is returned, naming its
    /// setting and the fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check::validate(self)
    }

    /// What `dedupq run` needs beyond [`Settings::validate`]: its handler
    /// is the built-in HTTP one, so `handler.url` must be set once a
    /// transport is enabled. A library user bringing its own handler does
    /// not call this.
    pub fn validate_for_run(&self) -> Result<(), ConfigError> {
        check::check_handler_url(self)
    }
}
