//! A real Prometheus (the Debian package's server, installed by
//! scripts/observability) scraping real dedupq processes: every expression
//! of the dashboard and of the alert rules is evaluated through its HTTP
//! API. The alert rules' own unit tests are alerts_test.yml (promtool).

#[path = "../support/mod.rs"]
mod support;

mod prometheus;
mod queries;
