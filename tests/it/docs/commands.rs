//! Shell command lines of the pages: split into words, and the `dedupq`
//! invocations among them checked against the real binary.

use std::process::Command;

/// `line` split into words as bash would (quotes removed, `$(…)` kept as
/// written), up to the first unquoted `|`, `;`, `&`, `<`, `>` or comment.
pub fn words(line: &str) -> Vec<String> {
    let (mut out, mut word, mut has_word) = (Vec::new(), String::new(), false);
    let (mut single, mut double, mut depth) = (false, false, 0usize);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if single {
            if c == '\'' {
                single = false;
            } else {
                word.push(c);
            }
            continue;
        }
        if !double && c == '$' && chars.peek() == Some(&'(') {
            depth += 1;
            word.push(c);
            word.extend(chars.next());
            has_word = true;
            continue;
        }
        if depth > 0 {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            word.push(c);
            continue;
        }
        match c {
            '"' => {
                double = !double;
                has_word = true;
            }
            _ if double => word.push(c),
            '\'' => {
                single = true;
                has_word = true;
            }
            '\\' => {
                if let Some(next) = chars.next() {
                    word.push(next);
                    has_word = true;
                }
            }
            '#' if !has_word => break,
            '|' | ';' | '&' | '<' | '>' => break,
            c if c.is_whitespace() => {
                if has_word {
                    out.push(std::mem::take(&mut word));
                    has_word = false;
                }
            }
            c => {
                word.push(c);
                has_word = true;
            }
        }
    }
    if has_word {
        out.push(word);
    }
    out
}

/// The arguments of a command line that runs `dedupq` (after any
/// `NAME=value` assignments; `dedupq` or a path ending in `/dedupq`).
pub fn dedupq_args(line: &str) -> Option<Vec<String>> {
    let words = words(line);
    let mut rest = words.iter().skip_while(|w| is_assignment(w));
    let program = rest.next()?;
    (program == "dedupq" || program.ends_with("/dedupq")).then(|| rest.cloned().collect())
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Whether the real binary accepts `args`: clap parses them with
/// `--help` appended (so no configuration is read and nothing runs).
pub fn parses(args: &[String]) -> Result<(), String> {
    let out = Command::new(env!("CARGO_BIN_EXE_dedupq"))
        .args(args)
        .arg("--help")
        .env_remove("DEDUPQ_CONFIG")
        .output()
        .expect("run dedupq");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The command lines of a `sh` or `console` block, continuation lines
/// (ending in `\`) joined; for `console` only the `$ ` lines, each with
/// the output lines shown under it.
pub fn lines(lang: &str, body: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut continued = false;
    for line in body.lines() {
        if continued {
            let last = &mut out.last_mut().expect("a command to continue").0;
            last.push_str(line.trim_start());
        } else if lang == "sh" {
            out.push((line.to_string(), Vec::new()));
        } else if let Some(command) = line.strip_prefix("$ ") {
            out.push((command.to_string(), Vec::new()));
        } else if let Some((_, shown)) = out.last_mut() {
            shown.push(line.to_string());
        }
        continued = line.ends_with('\\');
        if continued {
            let last = &mut out.last_mut().expect("a command").0;
            last.pop();
        }
    }
    out
}

#[test]
fn command_lines_split_as_bash_splits_them() {
    assert_eq!(
        words(
            r#"dedupq keys settle acme pay-42 --done --result "$(cat c.json)" --reason 'INC 7'  # why"#
        ),
        [
            "dedupq",
            "keys",
            "settle",
            "acme",
            "pay-42",
            "--done",
            "--result",
            "$(cat c.json)",
            "--reason",
            "INC 7"
        ]
    );
    assert_eq!(words("dedupq config | grep lease"), ["dedupq", "config"]);
    assert_eq!(words("echo $(date +%s) x"), ["echo", "$(date +%s)", "x"]);
    assert_eq!(
        dedupq_args("DEDUPQ__ENGINE__LEASE=45s target/release/dedupq config"),
        Some(vec!["config".to_string()])
    );
    assert_eq!(dedupq_args("dedupq-lab demo"), None);
}
