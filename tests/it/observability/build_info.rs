//! `dedupq_build_info` names the commit the running binary was built from:
//! the `DEDUPQ_GIT_COMMIT` the build was given (the Dockerfile's build
//! argument), else, built in this checkout, its `git rev-parse --short HEAD`.

use crate::support::isolated_store;
use crate::support::process::{base_config, Dedupq, Provider};
use dedupq_provider::Knobs;
use std::process::Command;

fn head() -> String {
    let out = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git runs");
    assert!(out.status.success(), "the tests run in a git checkout");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test]
async fn build_info_names_the_commit_the_binary_was_built_from() {
    let (_store, store) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let dedupq = Dedupq::start(&base_config(&store, &provider)).await;
    let exposition = dedupq.metrics().await;
    let line = exposition
        .lines()
        .find(|l| l.starts_with("dedupq_build_info{"))
        .unwrap_or_else(|| panic!("no dedupq_build_info in:\n{exposition}"));
    let commit = line
        .split("commit=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no commit label: {line}"));
    let expected = match option_env!("DEDUPQ_GIT_COMMIT") {
        Some(given) if !given.trim().is_empty() => given.to_string(),
        _ => head(),
    };
    assert_eq!(commit, expected, "{line}");
    assert!(line.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))));
    assert!(line.ends_with(" 1"), "{line}");
}
