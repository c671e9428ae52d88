//! The HTTP API (`[api]`): `POST /v1/<route>` in the same key space as the
//! Kafka and RabbitMQ consumers. Sync routes claim, run the handler and
//! answer with the stored result; async routes publish the command to a
//! broker and answer 202; webhook routes take the key from the sender's
//! event id and verify its signature first.

mod answer;
mod auth;
mod body;
mod decide;
mod key;
mod post;
mod problem;
mod publish;
mod reload;
mod route;
mod service;
mod signature;

pub use answer::REPLAYED;
pub use service::{Api, ApiError};
