//! Every relative link and anchor resolves, and the README stays short.

use super::pages::{pages, prose, root, Page};
use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// Pages written on other branches at the same time as these: until they
/// land, a link to one of them may point at nothing. Once a file exists,
/// its links' anchors are checked like any other.
const ARRIVING: [&str; 0] = [];

/// GitHub's anchor of a heading: its text without markup, lower case,
/// spaces as `-`, punctuation other than `-` and `_` dropped.
pub fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text; a repeated heading gets `-1`, `-2`, ….
fn anchors(page: &Page) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in prose(page) {
        let Some(heading) = line
            .strip_prefix('#')
            .map(|h| h.trim_start_matches('#'))
            .and_then(|h| h.strip_prefix(' '))
        else {
            continue;
        };
        let text = without_links(heading).replace('`', "");
        let base = anchor(text.trim());
        let mut name = base.clone();
        let mut n = 0;
        while !out.insert(name.clone()) {
            n += 1;
            name = format!("{base}-{n}");
        }
    }
    out
}

/// `[text](target)` as `text`.
fn without_links(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("](") {
        let Some(end) = rest[start..].find(')') else {
            break;
        };
        out.push_str(&rest[..start].replace('[', ""));
        rest = &rest[start + end + 1..];
    }
    out.push_str(&rest.replace('[', ""));
    out
}

/// The link targets of a page's prose, outside code spans.
fn targets(page: &Page) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(page) {
        // Code spans are the odd pieces between backticks.
        let outside: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = outside.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let end = after.find(')').unwrap_or(after.len());
            if let Some(target) = after[..end].split_whitespace().next() {
                out.push(target.to_string());
            }
            rest = &after[end..];
        }
    }
    out
}

/// `path` joined to the directory of `page`, as a path under the root.
fn resolve(page: &str, path: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    let joined = Path::new(page).parent().unwrap_or(Path::new("")).join(path);
    for part in joined.components() {
        match part {
            Component::Normal(p) => out.push(p),
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

#[test]
fn every_relative_link_and_anchor_resolves_to_a_file_and_a_heading() {
    let root = root();
    let (mut failures, mut seen) = (Vec::new(), 0);
    for page in pages() {
        for target in targets(&page) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            seen += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                PathBuf::from(&page.name)
            } else {
                match resolve(&page.name, path) {
                    Some(f) => f,
                    None => {
                        failures.push(format!("{}: `{target}` leaves the repository", page.name));
                        continue;
                    }
                }
            };
            let name = file.to_string_lossy().into_owned();
            if !root.join(&file).exists() {
                if !ARRIVING.contains(&name.as_str()) {
                    failures.push(format!("{}: `{target}`: no file {name}", page.name));
                }
                continue;
            }
            if let Some(fragment) = fragment {
                let linked = Page::read(&root, &name);
                if !anchors(&linked).contains(fragment) {
                    failures.push(format!(
                        "{}: `{target}`: {name} has no heading #{fragment}",
                        page.name
                    ));
                }
            }
        }
    }
    assert!(seen >= 40, "only {seen} relative links found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn anchors_follow_github() {
    let page = Page {
        name: "x.md".into(),
        text: "# Poison: input no well-behaved producer sends\n## Guarantees, and their limits\n\
               ```\n# not a heading\n```\n## `dedupq check`\n## Notes\n## Notes\n"
            .into(),
    };
    let got: Vec<String> = anchors(&page).into_iter().collect();
    assert_eq!(
        got,
        [
            "dedupq-check",
            "guarantees-and-their-limits",
            "notes",
            "notes-1",
            "poison-input-no-well-behaved-producer-sends"
        ]
    );
}

#[test]
fn the_readme_fits_on_a_screen_or_two() {
    let readme = Page::read(&root(), "README.md");
    let lines = readme.text.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; move detail to docs/"
    );
}
