//! The engine and the claim store against a real PostgreSQL.

mod batch_claims;
mod concurrency;
mod conflicts;
mod failures;
mod fingerprint_versions;
mod hot_finishes;
mod invalid_input;
mod odd_answers;
mod partitions;
mod renewal;
mod retention;
mod row_hint;
mod scale_out;
mod stalled_runtime;
mod takeover;
mod tenants;
mod transactional;
