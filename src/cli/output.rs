//! Listings for people (an aligned table) or programs (JSON lines).

use serde::Serialize;
use std::io::{IsTerminal, Write};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

impl Format {
    /// The explicit choice, else a table on a terminal and JSON elsewhere.
    pub fn choose(explicit: Option<Format>) -> Format {
        explicit.unwrap_or(if std::io::stdout().is_terminal() {
            Format::Table
        } else {
            Format::Json
        })
    }
}

/// A row that can be printed either way.
pub(super) trait Row: Serialize {
    const COLUMNS: &'static [&'static str];
    fn cells(&self) -> Vec<String>;
}

pub(super) fn print<R: Row>(
    format: Format,
    rows: &[R],
    out: &mut impl Write,
) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            for row in rows {
                writeln!(out, "{}", serde_json::to_string(row)?)?;
            }
        }
        Format::Table => {
            let cells: Vec<Vec<String>> = rows.iter().map(|r| r.cells()).collect();
            let mut widths: Vec<usize> = R::COLUMNS.iter().map(|c| c.len()).collect();
            for row in &cells {
                for (w, cell) in widths.iter_mut().zip(row) {
                    *w = (*w).max(cell.chars().count());
                }
            }
            let header: Vec<String> = R::COLUMNS.iter().map(|c| c.to_uppercase()).collect();
            write_line(out, &header, &widths)?;
            for row in &cells {
                write_line(out, row, &widths)?;
            }
        }
    }
    Ok(())
}

fn write_line(out: &mut impl Write, cells: &[String], widths: &[usize]) -> std::io::Result<()> {
    let line: Vec<String> = cells
        .iter()
        .zip(widths)
        .map(|(c, w)| format!("{c:<w$}"))
        .collect();
    writeln!(out, "{}", line.join("  ").trim_end())
}

/// Text fit for one table cell: control characters (a terminal escape in
/// a hostile header, a newline) shown escaped, long values shortened.
pub(super) fn cell(text: &str, max: usize) -> String {
    let escaped: String = text.chars().flat_map(char::escape_debug).collect();
    if escaped.chars().count() <= max {
        return escaped;
    }
    let mut short: String = escaped.chars().take(max.saturating_sub(1)).collect();
    short.push('…');
    short
}
