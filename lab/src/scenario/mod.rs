//! End-to-end runs against the real services: the demo (`dedupq-lab demo`) and
//! the chaos run (`dedupq-lab chaos`). Both publish a payment stream with
//! duplicates through Kafka and RabbitMQ into several `dedupq run`
//! processes, inject faults, wait for quiescence and check every invariant
//! against the provider's charges, the key table and the brokers.

mod dead_letters;
mod faults;
mod fleet;
mod pg_faults;
mod profile;
mod publish;
mod report;
mod run;
mod verify;
mod workload;

pub use fleet::Binaries;
pub use profile::{Fault, Profile};
pub use report::Report;
pub use run::{run, Options};
pub use workload::{Hostile, Kind, ReplyTo, Route, Workload, WorkloadSpec};
