//! The Kafka transport against the real broker and PostgreSQL: offsets
//! advance only over durable outcomes, duplicates never cause a second
//! effect, bad input is dead-lettered, rebalances and crashes lose nothing.
//! (The PostgreSQL outage test is its own binary: tests/kafka_outage.)

mod common;
mod crashes;
mod dead_letter_fit;
mod dead_letters;
mod duplicates;
mod fatal_producer;
mod late_cluster;
mod poison;
mod rebalance;
mod refused_reads;
mod replies;
mod retries;
mod shutdown;
mod stalls;
mod startup_topics;
mod static_membership;
