//! The cases of one run and their sizes. Sizes are picked so that every
//! throughput run lasts several seconds here (a commit interval of 100 ms
//! is then a small part of it) and the whole run stays within ~10 minutes
//! (`--quick`: ~1 minute, noisier). Rows that a target compares are
//! measured one right after the other.

use super::case::{Case, Kind};

/// Schema holding the prefilled key table; kept between runs.
pub(super) const STORED_KEYS_SCHEMA: &str = "dedupq_bench_10m";
/// Every prefilled schema a run may use and its number of keys
/// (label, keys, schema); the 10M one is the default run's too.
pub(super) const PREFILLED: [(&str, i64, &str); 3] = [
    ("1M", 1_000_000, "dedupq_bench_1m"),
    ("10M", 10_000_000, STORED_KEYS_SCHEMA),
    ("50M", 50_000_000, "dedupq_bench_50m"),
];
/// Topic partitions of the scale grid (the work); the key table keeps its
/// default hash partitions (`store.partitions`).
pub(super) const SCALE_PARTITIONS: [i32; 3] = [1, 4, 16];
/// The paced rate at which a scale row's p50/p99 are measured.
pub(super) const SCALE_RATE: u32 = 1000;
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
            checkpoint_first: false,
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
        // The stored keys twice, in the two states a large primary key is
        // found in: right after a checkpoint, where the first change to
        // each leaf writes it whole to the WAL (for a few seconds after
        // each checkpoint at this rate), and then in the same checkpoint
        // cycle, where most leaves the run meets were changed already
        // (the rest of the time).
        for (label, checkpoint_first) in [
            (format!("a dedupq {MIX_PARTITIONS}p 10M checkpoint"), true),
            (format!("a dedupq {MIX_PARTITIONS}p 10M keys"), false),
        ] {
            let mut stored = case(label, Kind::Dedupq, MIX_PARTITIONS, 150_000);
            stored.schema = Some(STORED_KEYS_SCHEMA.into());
            stored.checkpoint_first = checkpoint_first;
            cases.push(stored);
        }
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
            case("h http seed 100c".into(), Kind::HttpSeed, 100, 20_000),
            case("h http sync 1000c".into(), Kind::HttpSync, 1000, 30_000),
            case("h http direct 1000c".into(), Kind::HttpDirect, 1000, 30_000),
        ]);
        Self { quick, cases }
    }

    /// The scale grid (`--scale`): per topic partition count, an empty
    /// table (a fresh schema, the reference measured in the same minutes)
    /// and each prefilled table. Every row is a throughput run of 150 000
    /// messages and then a paced run at `SCALE_RATE` msg/s whose messages
    /// are timed from `send()` to their reply (the g rows' method), so a
    /// row has both a rate and a p99.
    pub fn scale(quick: bool) -> Self {
        let mut cases = Vec::new();
        for partitions in SCALE_PARTITIONS {
            let tables = std::iter::once(("empty", None)).chain(
                PREFILLED
                    .iter()
                    .map(|(label, _, schema)| (*label, Some(*schema))),
            );
            for (size, schema) in tables {
                cases.push(Case {
                    label: format!("k scale {size} {partitions}p"),
                    kind: Kind::Dedupq,
                    partitions,
                    messages: if quick { 15_000 } else { 150_000 },
                    duplicates: false,
                    schema: schema.map(Into::into),
                    rate: Some(f64::from(SCALE_RATE)),
                    latency_secs: if quick { 3.0 } else { 10.0 },
                    checkpoint_first: false,
                });
            }
        }
        Self { quick, cases }
    }

    /// The cases whose label contains the text; several texts separated
    /// by `,` select every case any of them selects, and a text starting
    /// with `=` selects the case of exactly that label
    /// (`--only "=a dedupq 4p,=f minimal claim 4 conns"`).
    pub fn only(mut self, filter: Option<&str>) -> Self {
        if let Some(f) = filter {
            let texts: Vec<&str> = f.split(',').map(str::trim).collect();
            self.cases.retain(|c| {
                texts.iter().any(|t| match t.strip_prefix('=') {
                    Some(exact) => c.label == exact,
                    None => c.label.contains(t),
                })
            });
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::Plan;

    fn labels(plan: Plan) -> Vec<String> {
        plan.cases.into_iter().map(|c| c.label).collect()
    }

    #[test]
    fn only_takes_texts_and_exact_labels() {
        let picked = labels(Plan::new(false).only(Some("=a dedupq 4p, f minimal claim 4")));
        assert_eq!(picked, ["a dedupq 4p", "f minimal claim 4 conns"]);
        assert_eq!(labels(Plan::new(false).only(Some("a dedupq 4p"))).len(), 4);
    }

    #[test]
    fn the_scale_grid_has_an_empty_table_beside_each_size() {
        let grid = labels(Plan::scale(false));
        assert_eq!(grid.len(), 12);
        assert_eq!(grid[0], "k scale empty 1p");
        assert!(grid.contains(&"k scale 50M 16p".to_string()));
        assert!(labels(Plan::new(false))
            .iter()
            .all(|l| !l.starts_with("k scale")));
    }
}
