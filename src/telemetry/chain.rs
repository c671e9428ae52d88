//! Errors with their causes, for log lines and problem details.

use std::error::Error;
use std::fmt;

/// Displays an error followed by its causes, `outer: cause: root cause`,
/// so a log line says *why* ("PostgreSQL is unavailable: … Connection
/// refused") and not only what failed. Log with `error = %chain(&e)`.
pub struct Chain<'a>(&'a (dyn Error + 'static));

/// Wraps `error` to display it with its causes.
pub fn chain<'a>(error: &'a (dyn Error + 'static)) -> Chain<'a> {
    Chain(error)
}

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            let text = e.to_string();
            // Errors that already print their source (`"…: {0}"`) would
            // otherwise show the same words twice.
            if !text.is_empty() && !shown.contains(&text) {
                write!(f, ": {text}")?;
                shown = text;
            }
            cause = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::chain;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("PostgreSQL is unavailable")]
        Unavailable(#[source] Middle),
        #[error("wrapped: {0}")]
        Repeats(#[source] std::io::Error),
    }

    #[derive(Debug, thiserror::Error)]
    #[error("error communicating with database")]
    struct Middle(#[source] std::io::Error);

    fn refused() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused")
    }

    #[test]
    fn a_chained_error_shows_every_cause_down_to_the_root() {
        let e = Outer::Unavailable(Middle(refused()));
        assert_eq!(
            e.to_string(),
            "PostgreSQL is unavailable",
            "plain text hides the cause"
        );
        assert_eq!(
            chain(&e).to_string(),
            "PostgreSQL is unavailable: error communicating with database: Connection refused"
        );
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let e = Outer::Repeats(refused());
        assert_eq!(chain(&e).to_string(), "wrapped: Connection refused");
    }
}
