//! Every broker client dedupq builds, one module per broker: the consumers,
//! the API's publisher, the `dlq` command, the lab and the tests all connect
//! through these, so TLS, SASL, timeouts, the heartbeat and the settings the
//! guarantees depend on are applied in one place.

pub mod amqp;
pub mod kafka;
