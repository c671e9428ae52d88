//! Deployable where payments run, against the real services: Kafka over
//! SASL_SSL, RabbitMQ over TLS, PostgreSQL with verify-full; instances
//! started together, a runtime role without DDL rights, probes while
//! PostgreSQL is away; schema names; secrets kept out of output and logs;
//! the Kubernetes manifests and the Helm chart; the binary's allocator.

mod allocator;
mod amqp_tls;
mod architecture;
mod chart;
mod kafka_rotation;
mod kafka_sasl;
mod manifests;
mod payment_safe;
mod pg_tls;
mod preflight;
mod probes;
mod readme_examples;
mod roles;
mod schema_names;
mod schema_race;
mod secrets;
mod shipped;
