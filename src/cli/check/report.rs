//! The report: one line per check, for people or as one JSON document.

use serde::Serialize;
use std::io::Write;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// As `dedupq run` needs it.
    Ok,
    /// `dedupq run` copes (it creates or applies what is missing), or it
    /// may be intended; worth a look.
    Warn,
    /// `dedupq run` would refuse to start, or would not work.
    Fail,
}

/// One check's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked, e.g. `store.connect` or `kafka.topic payments`.
    pub check: String,
    /// Ok, warn or fail.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about a warning or a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    /// A check that passed.
    pub fn ok(check: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(check, Status::Ok, detail, None)
    }

    /// A check worth a look.
    pub fn warn(
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(check, Status::Warn, detail, Some(fix.into()))
    }

    /// A check that failed.
    pub fn fail(
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(check, Status::Fail, detail, Some(fix.into()))
    }

    fn new(
        check: impl Into<String>,
        status: Status,
        detail: impl Into<String>,
        fix: Option<String>,
    ) -> Self {
        Self {
            check: check.into(),
            status,
            detail: detail.into(),
            fix,
        }
    }
}

/// Every check, in the order they ran.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// False if any check failed.
    pub ok: bool,
    /// The checks.
    pub checks: Vec<Check>,
}

/// `--output`: aligned lines, or one JSON document.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// `ok    store.connect  PostgreSQL 15.10 …`, one line per check.
    #[default]
    Text,
    /// `{"ok": false, "checks": [{"check", "status", "detail", "fix"}]}`.
    Json,
}

impl Report {
    /// Adds a check.
    pub fn push(&mut self, check: Check) {
        self.checks.push(check);
    }

    /// Whether any check failed.
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.status == Status::Fail)
    }

    /// The check named `name`, if it ran.
    pub fn get(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.check == name)
    }

    /// Prints the report.
    pub fn print(&self, format: ReportFormat, out: &mut impl Write) -> anyhow::Result<()> {
        match format {
            ReportFormat::Json => {
                let shown = Report {
                    ok: !self.failed(),
                    checks: self.checks.clone(),
                };
                writeln!(out, "{}", serde_json::to_string_pretty(&shown)?)?;
            }
            ReportFormat::Text => {
                let width = self.checks.iter().map(|c| c.check.len()).max().unwrap_or(0);
                for c in &self.checks {
                    let status = match c.status {
                        Status::Ok => "ok",
                        Status::Warn => "warn",
                        Status::Fail => "fail",
                    };
                    let line = match &c.fix {
                        Some(fix) => format!("{} — fix: {fix}", c.detail),
                        None => c.detail.clone(),
                    };
                    // One line per check, whatever a broker's error holds.
                    let line = line.replace(['\n', '\r'], " ");
                    writeln!(out, "{status:<4}  {:<width$}  {line}", c.check)?;
                }
                let (fails, warns) = self.counts();
                writeln!(
                    out,
                    "{} checks: {} ok, {warns} warn, {fails} fail",
                    self.checks.len(),
                    self.checks.len() - fails - warns
                )?;
            }
        }
        Ok(())
    }

    fn counts(&self) -> (usize, usize) {
        let count = |s| self.checks.iter().filter(|c| c.status == s).count();
        (count(Status::Fail), count(Status::Warn))
    }
}
