//! The pages under test and their fenced blocks.

use std::path::{Path, PathBuf};

/// Where README.md and docs/ are read from.
pub fn root() -> PathBuf {
    std::env::var_os("DEDUPQ_DOCS_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// One Markdown page, named by its path under the root.
pub struct Page {
    pub name: String,
    pub text: String,
}

impl Page {
    pub fn read(root: &Path, name: &str) -> Page {
        let text = std::fs::read_to_string(root.join(name))
            .unwrap_or_else(|e| panic!("{}: {e}", root.join(name).display()));
        Page {
            name: name.to_string(),
            text,
        }
    }
}

/// README.md, then every docs/*.md in name order.
pub fn pages() -> Vec<Page> {
    let root = root();
    let mut names: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap_or_else(|e| panic!("{}/docs: {e}", root.display()))
        .map(|e| {
            e.expect("a docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    names.sort();
    assert!(names.len() >= 10, "the docs pages: {names:?}");
    std::iter::once("README.md".to_string())
        .chain(names)
        .map(|n| Page::read(&root, &n))
        .collect()
}

/// A fenced block: its language, the words after it, its text.
pub struct Block {
    /// `page:line` of the opening fence.
    pub at: String,
    pub lang: String,
    pub marks: Vec<String>,
    pub body: String,
}

impl Block {
    pub fn marked(&self, mark: &str) -> bool {
        self.marks.iter().any(|m| m == mark)
    }
}

/// Every fenced block of `page`.
pub fn blocks(page: &Page) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(Block, String)> = None;
    for (n, line) in page.text.lines().enumerate() {
        let trimmed = line.trim_start();
        match open.take() {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let mut words = info.split_whitespace().map(str::to_string);
                    let block = Block {
                        at: format!("{}:{}", page.name, n + 1),
                        lang: words.next().unwrap_or_default(),
                        marks: words.collect(),
                        body: String::new(),
                    };
                    let indent = line.len() - trimmed.len();
                    open = Some((block, " ".repeat(indent)));
                }
            }
            Some((mut block, indent)) => {
                if trimmed.starts_with("```") {
                    out.push(block);
                } else {
                    block
                        .body
                        .push_str(line.strip_prefix(&indent).unwrap_or(line));
                    block.body.push('\n');
                    open = Some((block, indent));
                }
            }
        }
    }
    assert!(open.is_none(), "{}: a fence is never closed", page.name);
    out
}

/// The page's text outside fenced blocks, line by line (inside: empty).
pub fn prose(page: &Page) -> Vec<String> {
    let mut fenced = false;
    page.text
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return String::new();
            }
            if fenced {
                String::new()
            } else {
                line.to_string()
            }
        })
        .collect()
}
