//! A real Prometheus (the Debian package's server, installed by
//! scripts/observability) scraping real dedupq processes: every expression
//! of the dashboard and of the alert rules is evaluated through its HTTP
//! API. The alert rules' own unit tests are alerts_test.yml (promtool);
//! their labels, annotations and copies are checked in alert_conventions.
//! Traces go to a real Jaeger (built by scripts/observability), and one
//! trace is followed from a producer's span to the provider's request.

mod alert_conventions;
mod build_info;
mod jaeger;
mod liveness;
mod otel_env;
mod prometheus;
mod queries;
mod traces;
