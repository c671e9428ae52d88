//! The benchmark's smallest cases, with tiny sizes, through the real
//! binary: they must keep producing sane numbers, so the bench cannot rot.

use crate::env;
use dedupq_lab::bench::{run_case, Case, Kind};

fn tiny(label: &str, kind: Kind, messages: usize) -> Case {
    Case {
        label: label.into(),
        kind,
        partitions: 2,
        messages,
        duplicates: false,
        schema: None,
        rate: None,
        latency_secs: 0.0,
        checkpoint_first: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_smallest_dedupq_case_reports_a_rate_and_memory() {
    let row = run_case(&tiny("a dedupq tiny", Kind::Dedupq, 2000), &env()).await;
    assert!(row.error.is_none(), "{:?}", row.error);
    let t = row.throughput.as_ref().expect("throughput measured");
    assert_eq!(t.messages, 2000);
    assert!(t.rate() > 50.0 && t.seconds > 0.0, "{t:?}");
    assert!(
        t.notes.iter().any(|n| n.contains("handler calls 2000;")),
        "{t:?}"
    );
    let rss = row.peak_rss_mb().expect("peak RSS");
    assert!((5.0..1000.0).contains(&rss), "{rss} MB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_naive_postgres_only_and_minimal_claim_cases_report_rates() {
    for case in [
        tiny("b naive tiny", Kind::Naive, 200),
        tiny("d pg tiny", Kind::PgLimit, 2000),
        tiny("f minimal claim tiny", Kind::MinimalClaim, 2000),
    ] {
        let row = run_case(&case, &env()).await;
        assert!(row.error.is_none(), "{}: {:?}", case.label, row.error);
        let t = row.throughput.expect("throughput measured");
        assert_eq!(t.messages, case.messages);
        assert!(t.rate() > 10.0, "{}: {t:?}", case.label);
        assert!(t.peak_rss_kb > 0, "{}: {t:?}", case.label);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_rows_time_every_paced_message_from_send_to_its_reply() {
    for kind in [Kind::Echo, Kind::Dedupq] {
        let mut case = tiny("g tiny 100/s", kind, 0);
        case.rate = Some(100.0);
        case.latency_secs = 1.0;
        let row = run_case(&case, &env()).await;
        assert!(row.error.is_none(), "{kind:?}: {:?}", row.error);
        let l = row.latency.as_ref().expect("latency measured");
        let (p50, p99, samples) = l.latency.expect("latency samples");
        assert_eq!(samples, 100, "{kind:?}: one sample per paced message");
        assert!(0.0 < p50 && p50 <= p99 && p99 < 10_000.0, "{kind:?}: {l:?}");
    }
}
