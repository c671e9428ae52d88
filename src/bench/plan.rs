//! The cases of one run and their sizes. Sizes are picked so that every
//! throughput run lasts several seconds here and the whole run stays
//! within ~10-15 minutes (`--quick`: ~2 minutes, noisier).

use super::case::{Case, Kind};

/// Schema holding the prefilled key table; kept between runs.
pub const STORED_KEYS_SCHEMA: &str = "dedupq_bench_10m";
pub const STORED_KEYS: i64 = 10_000_000;
/// Partitions of the duplicate-mix and stored-keys runs (and of the
/// empty-table run they are compared with).
pub const MIX_PARTITIONS: i32 = 4;

pub struct Plan {
    pub quick: bool,
    pub cases: Vec<Case>,
}

impl Plan {
    pub fn new(quick: bool) -> Self {
        let size = |n: usize| if quick { n / 10 } else { n };
        let latency_secs = if quick { 2.0 } else { 5.0 };
        let case = |label: String, kind, partitions, messages| Case {
            label,
            kind,
            partitions,
            messages: size(messages),
            duplicates: false,
            schema: None,
            // Brokerless cases measure latency in their throughput run.
            latency_secs: if kind.consumes() { latency_secs } else { 0.0 },
            buffered_per_partition: None,
        };
        let mut cases = Vec::new();
        // Side by side per partition count, so each ratio compares runs
        // made a minute apart.
        for (p, dedupq, naive) in [
            (1, 60_000, 4_000),
            (4, 200_000, 10_000),
            (16, 200_000, 20_000),
        ] {
            cases.push(case(format!("a dedupq {p}p"), Kind::Dedupq, p, dedupq));
            cases.push(case(format!("b naive {p}p"), Kind::Naive, p, naive));
            cases.push(case(
                format!("c raw kafka {p}p"),
                Kind::RawKafka,
                p,
                300_000,
            ));
        }
        // What-if: the fetch is paused and resumed every ~1000 messages per
        // partition at the default buffer; this row shows the cost.
        let mut big = case("a dedupq 1p buf 20k".into(), Kind::Dedupq, 1, 150_000);
        big.buffered_per_partition = Some(20_000);
        cases.push(big);
        cases.push(case("d pg 1 conn".into(), Kind::PgLimit, 1, 300_000));
        cases.push(case("d pg 4 conns".into(), Kind::PgLimit, 4, 500_000));
        cases.push(case("e dedupq amqp".into(), Kind::DedupqAmqp, 1, 60_000));
        cases.push(case("e raw amqp".into(), Kind::RawAmqp, 1, 60_000));
        // 100 concurrent HTTP clients; p50/p99 are per request at full load.
        cases.push(case("f http sync 100c".into(), Kind::HttpSync, 100, 20_000));
        cases.push(case(
            "f http direct 100c".into(),
            Kind::HttpDirect,
            100,
            20_000,
        ));
        let mut mix = case(
            format!("a dedupq {MIX_PARTITIONS}p 50% dup"),
            Kind::Dedupq,
            MIX_PARTITIONS,
            200_000,
        );
        mix.duplicates = true;
        cases.push(mix);
        let mut stored = case(
            format!("a dedupq {MIX_PARTITIONS}p 10M keys"),
            Kind::Dedupq,
            MIX_PARTITIONS,
            // Far slower than the empty table (see BENCHMARKS.md): sized
            // to finish in about a minute.
            30_000,
        );
        stored.schema = Some(STORED_KEYS_SCHEMA.into());
        cases.push(stored);
        Self { quick, cases }
    }

    pub fn only(mut self, filter: Option<&str>) -> Self {
        if let Some(f) = filter {
            self.cases.retain(|c| c.label.contains(f));
        }
        self
    }
}
