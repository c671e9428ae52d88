//! dedupq's lab: the tooling that runs dedupq against the real services,
//! kept out of the product crate.
//!
//! - [`bench`](mod@bench): `dedupq-lab bench`, throughput, latency and memory next to
//!   the limits (BENCHMARKS.md);
//! - [`scenario`]: `dedupq-lab demo` and `dedupq-lab chaos`, payment
//!   streams with faults through a fleet of `dedupq run` processes, every
//!   invariant checked at the end;
//! - [`cli`]: the command line.

pub mod bench;
pub mod cli;
pub mod scenario;
