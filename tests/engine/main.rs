//! The engine and the claim store against a real PostgreSQL.

#[path = "../support/mod.rs"]
mod support;

mod batch_claims;
mod concurrency;
mod conflicts;
mod failures;
mod hot_finishes;
mod invalid_input;
mod renewal;
mod retention;
mod takeover;
mod tenants;
mod transactional;
