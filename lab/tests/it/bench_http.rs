//! The benchmark's HTTP rows, tiny, through the real binary: they must keep
//! producing sane numbers, so the bench cannot rot.

use crate::env;
use dedupq_lab::bench::{run_case, Case, Kind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_rows_report_requests_per_second_and_latencies_with_dedupq_without_it_and_with_the_seeds_recipe(
) {
    for kind in [Kind::HttpSync, Kind::HttpDirect, Kind::HttpSeed] {
        let case = Case {
            label: format!("h {kind:?} tiny"),
            kind,
            partitions: 20,
            messages: 400,
            duplicates: false,
            schema: None,
            rate: None,
            latency_secs: 0.0,
            checkpoint_first: false,
        };
        let row = run_case(&case, &env()).await;
        assert!(row.error.is_none(), "{kind:?}: {:?}", row.error);
        let t = row.throughput.as_ref().expect("throughput measured");
        assert_eq!(t.messages, 400);
        assert!(t.rate() > 10.0, "{kind:?}: {t:?}");
        assert!(
            t.notes.iter().any(|n| n.contains("handler calls 420;")),
            "every request and warm-up ran the handler once: {t:?}"
        );
        let (p50, p99, samples) = t.latency.expect("latency samples");
        assert_eq!(samples, 400);
        assert!(0.0 < p50 && p50 <= p99, "{t:?}");
    }
}
