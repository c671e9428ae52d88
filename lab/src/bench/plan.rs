//! The cases of one run and their sizes. Sizes are picked so that every
//! throughput run lasts several seconds here (a commit interval of 100 ms
//! is then a small part of it) and the whole run stays within ~10 minutes
//! (`--quick`: ~1 minute, noisier). Rows that a target compares are
//! measured one right after the other.

use super::case::{Case, Kind};

/// Schema holding the prefilled key table; kept between runs.
pub(super) const STORED_KEYS_SCHEMA: &str = "dedupq_bench_10m";
pub(super) const STORED_KEYS: i64 = 10_000_000;
/// Partitions of the duplicate-mix, stored-keys and latency runs (and of
/// the empty-table run they are compared with).
pub(super) const MIX_PARTITIONS: i32 = 4;
/// The fixed rates of the latency rows, messages per second.
pub(super) const LATENCY_RATES: [u32; 2] = [100, 1000];

pub struct Plan {
    pub quick: bool,
    pub cases: Vec<Case>,
}

impl Plan {
    pub fn new(quick: bool) -> Self {
        let size = |n: usize| if quick { n / 10 } else { n };
        let case = |label: String, kind, partitions, messages| Case {
            label,
            kind,
            partitions,
            messages: size(messages),
            duplicates: false,
            schema: None,
            rate: None,
            latency_secs: 0.0,
        };
        let mut cases = vec![
            case("a dedupq 1p".into(), Kind::Dedupq, 1, 300_000),
            case(
                "f minimal claim 1 conn".into(),
                Kind::MinimalClaim,
                1,
                400_000,
            ),
            case("d pg 1 conn".into(), Kind::PgLimit, 1, 300_000),
            case("b naive 1p".into(), Kind::Naive, 1, 6_000),
            case("c raw kafka 1p".into(), Kind::RawKafka, 1, 300_000),
            case(
                format!("a dedupq {MIX_PARTITIONS}p"),
                Kind::Dedupq,
                MIX_PARTITIONS,
                300_000,
            ),
        ];
        let mut stored = case(
            format!("a dedupq {MIX_PARTITIONS}p 10M keys"),
            Kind::Dedupq,
            MIX_PARTITIONS,
            150_000,
        );
        stored.schema = Some(STORED_KEYS_SCHEMA.into());
        cases.push(stored);
        cases.extend([
            case(
                "f minimal claim 4 conns".into(),
                Kind::MinimalClaim,
                4,
                600_000,
            ),
            case("d pg 4 conns".into(), Kind::PgLimit, 4, 500_000),
            case("b naive 4p".into(), Kind::Naive, 4, 15_000),
            case("c raw kafka 4p".into(), Kind::RawKafka, 4, 300_000),
        ]);
        let mut mix = case(
            format!("a dedupq {MIX_PARTITIONS}p 50% dup"),
            Kind::Dedupq,
            MIX_PARTITIONS,
            300_000,
        );
        mix.duplicates = true;
        cases.push(mix);
        cases.extend([
            case("a dedupq 16p".into(), Kind::Dedupq, 16, 300_000),
            case("b naive 16p".into(), Kind::Naive, 16, 30_000),
            case("c raw kafka 16p".into(), Kind::RawKafka, 16, 300_000),
        ]);
        for rate in LATENCY_RATES {
            for (label, kind) in [("g raw echo", Kind::Echo), ("g dedupq", Kind::Dedupq)] {
                let mut paced = case(format!("{label} {rate}/s"), kind, MIX_PARTITIONS, 0);
                paced.rate = Some(f64::from(rate));
                paced.latency_secs = if quick { 3.0 } else { 10.0 };
                cases.push(paced);
            }
        }
        cases.extend([
            case("e dedupq amqp".into(), Kind::DedupqAmqp, 1, 100_000),
            case("e raw amqp".into(), Kind::RawAmqp, 1, 100_000),
            // Concurrent HTTP clients (1, 100, 1000 keep-alive connections);
            // p50/p99 are per request at full load. Each sync row beside the
            // same load on a plain route with the same instant handler.
            case("h http sync 1c".into(), Kind::HttpSync, 1, 3_000),
            case("h http direct 1c".into(), Kind::HttpDirect, 1, 3_000),
            case("h http sync 100c".into(), Kind::HttpSync, 100, 20_000),
            case("h http direct 100c".into(), Kind::HttpDirect, 100, 20_000),
            case("h http sync 1000c".into(), Kind::HttpSync, 1000, 30_000),
            case("h http direct 1000c".into(), Kind::HttpDirect, 1000, 30_000),
        ]);
        Self { quick, cases }
    }

    pub fn only(mut self, filter: Option<&str>) -> Self {
        if let Some(f) = filter {
            self.cases.retain(|c| c.label.contains(f));
        }
        self
    }
}
