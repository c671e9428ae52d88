//! The shipped binary allocates through jemalloc with dedupq's compiled-in
//! options (src/allocator.rs): asked for its statistics at exit, jemalloc
//! itself reports the options it runs with. Under glibc's allocator, or
//! with options jemalloc did not take, the report is missing or differs.

use std::process::Command;

#[test]
fn the_binary_runs_on_jemalloc_with_its_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_dedupq"))
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .expect("running dedupq --version");
    assert!(out.status.success(), "{out:?}");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        !report.contains("<jemalloc>: Invalid conf"),
        "jemalloc refused an option:\n{report}"
    );
    for option in ["opt.dirty_decay_ms: 500", "opt.muzzy_decay_ms: 0"] {
        assert!(
            report.contains(option),
            "no `{option}` in jemalloc's report (is it the allocator?):\n{}",
            &report[..report.len().min(2000)]
        );
    }
}
