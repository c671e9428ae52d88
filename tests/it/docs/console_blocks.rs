//! The commands the pages show: every `dedupq` line parses, and the
//! blocks marked `runnable` run against the real services.

use super::commands::{dedupq_args, lines, parses};
use super::pages::{blocks, pages};
use crate::support::{database_url, unique};
use std::path::Path;
use std::process::Command;

#[test]
fn every_dedupq_command_in_a_block_is_one_the_binary_parses() {
    let (mut failures, mut seen) = (Vec::new(), 0);
    for page in pages() {
        for block in blocks(&page) {
            if block.lang != "sh" && block.lang != "console" {
                continue;
            }
            for (line, _) in lines(&block.lang, &block.body) {
                let Some(args) = dedupq_args(&line) else {
                    continue;
                };
                seen += 1;
                if let Err(e) = parses(&args) {
                    failures.push(format!("{}: `{line}`: {e}", block.at));
                }
            }
        }
    }
    assert!(seen >= 20, "only {seen} dedupq commands found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_command_the_binary_does_not_have_is_caught() {
    let args = dedupq_args("dedupq keys list --stuck").unwrap();
    let error = parses(&args).expect_err("no such flag");
    assert!(error.contains("--stuck"), "{error}");
}

/// Runs one block's commands in order in `dir`, `dedupq` on the PATH
/// being the built binary, with a key-table schema of its own. The first
/// command that fails, or that does not print a line it shows, is the
/// error.
fn run_block(body: &str, dir: &Path) -> Result<(), String> {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("create the bin directory");
    let link = bin.join("dedupq");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_dedupq"), &link).expect("link dedupq");
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let schema = unique("docs");
    for (command, shown) in lines("console", body) {
        let out = Command::new("timeout")
            .args(["120", "bash", "-c", &command])
            .current_dir(dir)
            .env("PATH", &path)
            .env("DEDUPQ__STORE__URL", database_url())
            .env("DEDUPQ__STORE__SCHEMA", &schema)
            .env_remove("DEDUPQ_CONFIG")
            .output()
            .expect("run bash");
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            return Err(format!("`{command}` exited {}:\n{printed}", out.status));
        }
        let mut printed_lines = printed.lines().map(str::trim_end);
        for want in shown.iter().map(|l| l.trim_end()).filter(|l| !l.is_empty()) {
            if !printed_lines.any(|got| got == want) {
                return Err(format!(
                    "`{command}` did not print the line `{want}` (in the order shown):\n{printed}"
                ));
            }
        }
    }
    Ok(())
}

fn scratch() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(unique("dedupq-docs-console"));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

#[test]
fn the_runnable_console_blocks_run_against_the_real_services_and_print_what_they_show() {
    let (mut failures, mut seen) = (Vec::new(), 0);
    for page in pages() {
        for block in blocks(&page) {
            if block.lang != "console" || !block.marked("runnable") {
                continue;
            }
            seen += 1;
            let dir = scratch();
            if let Err(e) = run_block(&block.body, &dir) {
                failures.push(format!("{}: {e}", block.at));
            }
            std::fs::remove_dir_all(&dir).ok();
        }
    }
    assert!(seen >= 3, "only {seen} runnable console blocks found");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_block_showing_a_line_the_command_does_not_print_fails() {
    let dir = scratch();
    let stale = run_block("$ dedupq --help\nUsage: dedupq --stale-flag\n", &dir);
    let failing = run_block("$ dedupq keys show\n", &dir);
    std::fs::remove_dir_all(&dir).ok();
    assert!(stale.unwrap_err().contains("--stale-flag"));
    assert!(failing.unwrap_err().contains("exited"));
}
