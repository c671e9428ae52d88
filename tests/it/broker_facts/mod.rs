//! Facts about the real brokers that dedupq's handling of hostile input
//! rests on, and the tools that produce such input: raw Kafka headers,
//! raw AMQP publishing, and how RabbitMQ 3.10 quorum queues count
//! deliveries that lapin cannot even parse. Each fact is stated in the doc
//! comment of its file and asserted by its tests:
//!
//! - `lapin_poison`: (a) what lapin does with such a delivery;
//! - `delivery_limit`: (b) what counts toward `x-delivery-limit`, and the
//!   broker's own dead-lettering;
//! - `innocent_deliveries`: (c) how a poison drags the other unacked
//!   deliveries of its connection along (prefetch > 1) or not (prefetch 1);
//! - `dead_letter_timing`: (d) how long a poison holds its queue with
//!   dedupq's reconnect loop;
//! - `existing_queues`: (e) how queues that already exist get the limit.

mod dead_letter_timing;
mod delivery_limit;
mod existing_queues;
mod innocent_deliveries;
mod kafka_raw_headers;
mod lapin_poison;
mod raw_amqp_publish;
mod topology;
