//! The `dedupq-lab` commands of docs/development.md parse, so they cannot drift from the
//! command line.

use clap::Parser;
use dedupq_lab::cli::Cli;

/// The lines of docs/development.md's `sh` blocks that run `program`.
fn readme_commands(program: &str) -> Vec<String> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/development.md"
    ))
    .expect("docs/development.md");
    text.split("```sh\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .flat_map(str::lines)
        .filter(|l| l.starts_with(&format!("{program} ")))
        .map(str::to_string)
        .collect()
}

/// A command line split into words, "quoted text" being one.
fn words(line: &str) -> Vec<String> {
    let command = line.split('#').next().unwrap();
    let mut words = Vec::new();
    let mut quoted = command.split('"');
    while let Some(plain) = quoted.next() {
        words.extend(plain.split_whitespace().map(str::to_string));
        if let Some(q) = quoted.next() {
            words.push(q.to_string());
        }
    }
    words
}

#[test]
fn the_readme_lab_commands_exist_and_parse() {
    let commands = readme_commands("dedupq-lab");
    for sub in ["demo", "chaos", "bench"] {
        assert!(
            commands
                .iter()
                .any(|c| c.starts_with(&format!("dedupq-lab {sub}"))),
            "docs/development.md shows dedupq-lab {sub}"
        );
    }
    for line in commands {
        Cli::try_parse_from(words(&line))
            .unwrap_or_else(|e| panic!("docs/development.md command `{line}` does not parse: {e}"));
    }
}
