//! A shared service stopped by a test of its own binary (cargo runs test
//! binaries one at a time), and started again whatever happens.

use std::process::Command;

/// `scripts/services <action> <service>`.
fn services(action: &str, service: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/services");
    let status = Command::new(script)
        .args([action, service])
        .status()
        .expect("run scripts/services");
    assert!(
        status.success(),
        "scripts/services {action} {service} failed"
    );
}

/// A service stopped until this is dropped: then started again, even if
/// the test panics meanwhile, with `restart`, which keeps the broker's
/// topics (`start` formats a data dir that earlier runs filled with more
/// than `KAFKA_MAX_PARTITIONS` partitions, the test's topic with them).
pub struct Stopped(&'static str);

impl Stopped {
    /// Stops `service` (`postgres`, `rabbitmq` or `kafka`).
    pub fn new(service: &'static str) -> Self {
        services("stop", service);
        Self(service)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        services("restart", self.0);
    }
}
