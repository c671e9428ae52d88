//! Every TOML block is a configuration the product loads.

use super::pages::{blocks, pages, Block};
use crate::support::unique;
use dedupq::config::Settings;

/// The block through `Settings::load`, as `dedupq --config FILE` reads it.
fn load(block: &Block) -> Result<(), String> {
    let dir = std::env::temp_dir().join(unique("dedupq-docs-toml"));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    let path = dir.join("dedupq.toml");
    std::fs::write(&path, &block.body).expect("write the block");
    let loaded = Settings::load(Some(&path)).map_err(|e| e.to_string());
    std::fs::remove_dir_all(&dir).ok();
    let settings = loaded?;
    if !block.marked("fragment") {
        settings
            .validate_for_run()
            .map_err(|e| format!("{e} (mark a part of a configuration ```toml fragment)"))?;
    }
    Ok(())
}

#[test]
fn every_toml_block_loads_through_the_configuration_loader_and_validates() {
    let mut failures = Vec::new();
    let mut seen = 0;
    for page in pages() {
        for block in blocks(&page).iter().filter(|b| b.lang == "toml") {
            seen += 1;
            if let Err(e) = load(block) {
                failures.push(format!("{}: {e}", block.at));
            }
        }
    }
    assert!(seen >= 6, "only {seen} TOML blocks found");
    assert!(
        failures.is_empty(),
        "stale TOML blocks:\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_block_naming_a_setting_that_does_not_exist_is_refused() {
    let block = Block {
        at: "example".into(),
        lang: "toml".into(),
        marks: vec!["fragment".into()],
        body: "[kafka]\ncreate_topic = true\n".into(),
    };
    let error = load(&block).expect_err("an unknown setting is refused");
    assert!(error.contains("create_topic"), "{error}");
}

#[test]
fn every_block_mark_is_one_the_tests_know() {
    for page in pages() {
        for block in blocks(&page) {
            let known: &[&str] = match block.lang.as_str() {
                "toml" => &["fragment"],
                "console" => &["runnable"],
                _ => &[],
            };
            for mark in &block.marks {
                assert!(
                    known.contains(&mark.as_str()),
                    "{}: unknown mark `{mark}` on a {} block",
                    block.at,
                    block.lang
                );
            }
        }
    }
}
