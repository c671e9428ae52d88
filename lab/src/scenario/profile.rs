//! Named scenario profiles: the demo, the CI chaos runs (`ci`, `hostile`,
//! `dependencies`), the long chaos run.

use super::workload::WorkloadSpec;
use serde_json::{json, Value};
use std::time::Duration;

/// A fault at a moment of the run.
#[derive(Debug, Clone)]
pub enum Fault {
    /// SIGKILL one dedupq instance and restart it.
    KillOne,
    RestartPostgres,
    RestartKafka,
    CloseAmqpConnections,
    /// Apply these provider knobs (a partial object) for a while, then reset.
    Provider {
        knobs: Value,
        for_: Duration,
    },
    /// The fleet's PostgreSQL role read-only for a while (its sessions
    /// cut: a failover as clients see it), then writable for new sessions
    /// only: dedupq must replace its read-only ones itself.
    PostgresReadOnly {
        for_: Duration,
    },
    /// The fleet's role refused every new session for a while (its
    /// sessions cut: `too many connections for role`, SQLSTATE 53300, as
    /// when a server's or a role's connection limit is reached), then let
    /// in again.
    PostgresNoConnections {
        for_: Duration,
    },
    /// A statement timeout on the fleet's role for a while (sessions cut
    /// on both changes, so each applies at once).
    StatementTimeout {
        timeout: Duration,
        for_: Duration,
    },
    /// Row locks from the run's own session on up to `each` key rows in
    /// progress and as many just done, held for a while, then rolled back.
    RowLocks {
        each: i64,
        for_: Duration,
    },
    /// SIGSTOP the instance holding the most claims for the lease and
    /// `beyond` it, then SIGCONT: its claims are taken over meanwhile.
    FreezePastLease {
        beyond: Duration,
    },
}

impl Fault {
    /// Whether the fault changes the fleet's PostgreSQL sessions, so the
    /// fleet must log in as a role of the run's own.
    fn needs_own_role(&self) -> bool {
        matches!(
            self,
            Fault::PostgresReadOnly { .. }
                | Fault::PostgresNoConnections { .. }
                | Fault::StatementTimeout { .. }
        )
    }
}

#[derive(Debug, Clone)]
pub struct Profile {
    pub name: &'static str,
    pub workload: WorkloadSpec,
    pub processes: usize,
    pub partitions: i32,
    /// SIGKILL a random instance every so often (min, max), restarting it.
    pub kill_every: Option<(Duration, Duration)>,
    pub faults: Vec<(Duration, Fault)>,
    /// Run the provider without idempotency, so any second execution shows
    /// as a second charge.
    pub provider_ignores_keys: bool,
    /// Provider knobs at the start and after every stretch.
    pub base_knobs: Value,
    /// `engine.concurrency` of the fleet (None: its default).
    pub concurrency: Option<usize>,
    /// Point `handler.lookup_url` at the provider's lookup, so a key whose
    /// outcome is unknown can settle without a second request.
    pub lookup: bool,
    /// Every key must end done or failed: a key held `unknown` for an
    /// operator, or a dead letter of a payment the provider charged, is a
    /// violation (elsewhere both are listed only).
    pub settle_every_key: bool,
    pub quiesce_limit: Duration,
}

impl Profile {
    /// Whether the fleet must log in as a PostgreSQL role of the run's own.
    pub fn needs_own_role(&self) -> bool {
        self.faults.iter().any(|(_, f)| f.needs_own_role())
    }
}

/// Provider knobs between stretches: fast, no failures, bodies of a
/// repeated key compared as canonical JSON.
fn base_knobs() -> Value {
    json!({
        "latency": "5ms",
        "fail_rate": 0.0,
        "hang_after_charge_rate": 0.0,
        "slow_after_charge_rate": 0.0,
        "compare": "json"
    })
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn workload(keys: usize, total: usize, publish_for: u64) -> WorkloadSpec {
    WorkloadSpec {
        seed: 20261129,
        run_id: String::new(),
        unique_keys: keys,
        total_messages: total,
        tenants: 8,
        conflicts: (keys / 200).max(3),
        invalid: (keys / 250).max(4),
        publish_for: secs(publish_for),
        hostile_each: 0,
        max_body_bytes: 1024 * 1024,
    }
}

fn stretch(at: u64, knobs: Value, for_: u64) -> (Duration, Fault) {
    (
        secs(at),
        Fault::Provider {
            knobs,
            for_: secs(for_),
        },
    )
}

impl Profile {
    pub const NAMES: [&'static str; 6] =
        ["demo", "ci", "hostile", "dependencies", "long", "broken"];

    pub fn named(name: &str) -> Option<Self> {
        Some(match name {
            "demo" => Profile {
                name: "demo",
                workload: workload(2000, 6000, 20),
                processes: 2,
                partitions: 4,
                kill_every: None,
                faults: vec![(secs(8), Fault::KillOne)],
                provider_ignores_keys: false,
                base_knobs: base_knobs(),
                concurrency: None,
                lookup: false,
                settle_every_key: false,
                quiesce_limit: secs(120),
            },
            "ci" => Profile {
                name: "ci",
                workload: workload(6000, 20000, 75),
                processes: 3,
                partitions: 6,
                kill_every: Some((secs(3), secs(6))),
                faults: vec![
                    (
                        secs(12),
                        Fault::Provider {
                            knobs: json!({"latency": "300ms"}),
                            for_: secs(8),
                        },
                    ),
                    (secs(18), Fault::CloseAmqpConnections),
                    (secs(25), Fault::RestartPostgres),
                    (
                        secs(33),
                        Fault::Provider {
                            knobs: json!({"fail_rate": 0.3}),
                            for_: secs(8),
                        },
                    ),
                    (secs(45), Fault::RestartKafka),
                    (
                        secs(55),
                        Fault::Provider {
                            knobs: json!({"hang_after_charge_rate": 0.02}),
                            for_: secs(6),
                        },
                    ),
                    (secs(62), Fault::CloseAmqpConnections),
                ],
                provider_ignores_keys: true,
                base_knobs: base_knobs(),
                concurrency: None,
                lookup: false,
                settle_every_key: false,
                quiesce_limit: secs(240),
            },
            // Hostile input and a provider that honours keys as Stripe does
            // (409 while a charged request still runs, 422 for other bytes
            // under the same key), slow past the handler timeout, hanging,
            // answering what jsonb cannot hold, and breaking its answers off
            // half-way. SIGKILLs, but no
            // service restarts or forced RabbitMQ closes: it runs next to
            // other users of the same services.
            "hostile" => Profile {
                name: "hostile",
                workload: WorkloadSpec {
                    hostile_each: 6,
                    max_body_bytes: 64 * 1024,
                    ..workload(3000, 9000, 45)
                },
                processes: 3,
                partitions: 6,
                kill_every: Some((secs(4), secs(8))),
                faults: vec![
                    stretch(
                        3,
                        json!({"odd_answer": "nul_escape", "odd_answer_next": 40}),
                        5,
                    ),
                    stretch(
                        10,
                        json!({"slow_after_charge": "3s", "slow_after_charge_rate": 0.05}),
                        8,
                    ),
                    stretch(
                        20,
                        json!({"odd_answer": "raw_bytes", "odd_answer_next": 40}),
                        5,
                    ),
                    stretch(
                        24,
                        json!({"odd_answer": "cut_body", "odd_answer_next": 20}),
                        3,
                    ),
                    stretch(27, json!({"hang_after_charge_rate": 0.03}), 6),
                    stretch(36, json!({"latency": "300ms"}), 5),
                ],
                provider_ignores_keys: false,
                base_knobs: json!({
                    "latency": "5ms",
                    "fail_rate": 0.0,
                    "hang_after_charge_rate": 0.0,
                    "slow_after_charge_rate": 0.0,
                    "compare": "bytes"
                }),
                concurrency: None,
                lookup: false,
                settle_every_key: false,
                quiesce_limit: secs(180),
            },
            // Dependencies that turn hostile mid-stream, one at a time, on
            // both transports: PostgreSQL read-only (a failover), timing out,
            // locked by another session and out of connections; a provider in an outage (bare
            // 503s), failing after it charged, and slow while one dedupq is
            // frozen past its lease. The provider honours keys, except
            // around the freeze: there a call on an ended lease would leave
            // a charge of its own. It restarts no service and closes no
            // connection but its own role's.
            "dependencies" => Profile {
                name: "dependencies",
                workload: workload(2000, 6000, 90),
                processes: 3,
                partitions: 6,
                kill_every: None,
                faults: vec![
                    (secs(3), Fault::PostgresReadOnly { for_: secs(8) }),
                    (
                        secs(13),
                        Fault::StatementTimeout {
                            timeout: Duration::from_millis(300),
                            for_: secs(5),
                        },
                    ),
                    // Statements here are fast: a locked row makes one
                    // wait, and 300 ms ends it before store.lock_timeout.
                    (
                        secs(14),
                        Fault::RowLocks {
                            each: 3,
                            for_: secs(3),
                        },
                    ),
                    (
                        secs(20),
                        Fault::RowLocks {
                            each: 3,
                            for_: secs(5),
                        },
                    ),
                    stretch(27, json!({"error_after_charge_rate": 0.2}), 6),
                    // Until 5 s after the SIGCONT: calls the frozen
                    // process makes then must leave charges to be seen.
                    stretch(35, json!({"latency": "1s", "honour_keys": false}), 20),
                    (secs(38), Fault::FreezePastLease { beyond: secs(6) }),
                    stretch(56, json!({"fail_rate": 1.0, "fail_retry_after": false}), 20),
                    (secs(78), Fault::PostgresNoConnections { for_: secs(6) }),
                ],
                provider_ignores_keys: false,
                base_knobs: json!({
                    "latency": "5ms",
                    "fail_rate": 0.0,
                    "fail_retry_after": true,
                    "error_after_charge_rate": 0.0,
                    "hang_after_charge_rate": 0.0,
                    "slow_after_charge_rate": 0.0,
                    "honour_keys": true,
                    "compare": "json"
                }),
                // Few handler runs at once: while the provider is slow,
                // claimed messages queue for a permit (claims the frozen
                // process holds and has not started).
                concurrency: Some(4),
                lookup: true,
                settle_every_key: true,
                quiesce_limit: secs(60),
            },
            "long" => Profile {
                name: "long",
                workload: workload(25000, 100000, 400),
                processes: 3,
                partitions: 12,
                kill_every: Some((secs(3), secs(8))),
                faults: (0..5)
                    .flat_map(|i| {
                        let t = 60 * i + 20;
                        vec![
                            (
                                secs(t),
                                Fault::Provider {
                                    knobs: json!({"latency": "400ms"}),
                                    for_: secs(10),
                                },
                            ),
                            (secs(t + 12), Fault::CloseAmqpConnections),
                            (secs(t + 20), Fault::RestartPostgres),
                            (
                                secs(t + 30),
                                Fault::Provider {
                                    knobs: json!({"fail_rate": 0.4}),
                                    for_: secs(10),
                                },
                            ),
                            (secs(t + 42), Fault::RestartKafka),
                            (
                                secs(t + 52),
                                Fault::Provider {
                                    knobs: json!({"hang_after_charge_rate": 0.03}),
                                    for_: secs(6),
                                },
                            ),
                        ]
                    })
                    .collect(),
                provider_ignores_keys: true,
                base_knobs: base_knobs(),
                concurrency: None,
                lookup: false,
                settle_every_key: false,
                quiesce_limit: secs(600),
            },
            // Short, for builds with a guarantee switched off on purpose:
            // concurrent duplicates on several instances must show.
            "broken" => Profile {
                name: "broken",
                workload: workload(1500, 6000, 20),
                processes: 3,
                partitions: 6,
                kill_every: None,
                faults: vec![],
                provider_ignores_keys: true,
                base_knobs: base_knobs(),
                concurrency: None,
                lookup: false,
                settle_every_key: false,
                quiesce_limit: secs(120),
            },
            _ => return None,
        })
    }
}
