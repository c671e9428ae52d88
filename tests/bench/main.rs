//! The benchmark's smallest cases, with tiny sizes, through the real
//! binary: they must keep producing sane numbers, so the bench cannot rot.

#[path = "../support/mod.rs"]
mod support;

use dedupq::bench::{run_case, Case, Env, Kind};
use std::path::PathBuf;

fn env() -> Env {
    Env {
        database_url: support::database_url(),
        brokers: support::kafka::brokers(),
        amqp_url: std::env::var("AMQP_URL")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into()),
        workdir: std::env::temp_dir(),
        exe: PathBuf::from(env!("CARGO_BIN_EXE_dedupq")),
    }
}

fn tiny(label: &str, kind: Kind, messages: usize, latency_secs: f64) -> Case {
    Case {
        label: label.into(),
        kind,
        partitions: 2,
        messages,
        duplicates: false,
        schema: None,
        latency_secs,
        buffered_per_partition: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_smallest_dedupq_case_reports_a_rate_latencies_and_memory() {
    let row = run_case(&tiny("a dedupq tiny", Kind::Dedupq, 2000, 1.0), &env()).await;
    assert!(row.error.is_none(), "{:?}", row.error);
    let t = row.throughput.as_ref().expect("throughput measured");
    assert_eq!(t.messages, 2000);
    assert!(t.rate() > 50.0 && t.seconds > 0.0, "{t:?}");
    assert!(
        t.notes.iter().any(|n| n.contains("handler calls 2000;")),
        "{t:?}"
    );
    let l = row.latency.as_ref().expect("latency measured");
    let (p50, p99, samples) = l.latency.expect("latency samples");
    assert!(samples >= 100, "{l:?}");
    assert!(0.0 < p50 && p50 <= p99 && p99 < 10_000.0, "{l:?}");
    let rss = row.peak_rss_mb().expect("peak RSS");
    assert!((5.0..1000.0).contains(&rss), "{rss} MB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_naive_and_postgres_only_cases_report_rates() {
    for case in [
        tiny("b naive tiny", Kind::Naive, 200, 0.0),
        tiny("d pg tiny", Kind::PgLimit, 2000, 0.0),
    ] {
        let row = run_case(&case, &env()).await;
        assert!(row.error.is_none(), "{}: {:?}", case.label, row.error);
        let t = row.throughput.expect("throughput measured");
        assert_eq!(t.messages, case.messages);
        assert!(t.rate() > 10.0, "{}: {t:?}", case.label);
        assert!(t.peak_rss_kb > 0, "{}: {t:?}", case.label);
    }
}
