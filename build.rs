//! The commit `dedupq_build_info` reports: `DEDUPQ_GIT_COMMIT` when the
//! build sets it (the Dockerfile's build argument), else the checkout's
//! `git rev-parse --short HEAD`, else "unknown" (a source tree without git).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=DEDUPQ_GIT_COMMIT");
    let given = std::env::var("DEDUPQ_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty());
    let commit = given
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // Built again when HEAD moves: a checkout, or a commit on the branch.
    // (Only files that exist: a missing one would rerun this every build.)
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for path in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        if let Some(file) = git(&["rev-parse", "--git-path", path]) {
            if std::path::Path::new(&file).exists() {
                println!("cargo:rerun-if-changed={file}");
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=DEDUPQ_BUILD_COMMIT={commit}");
}
