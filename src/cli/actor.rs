//! The name an operator action is recorded under.

/// `--actor`, then `$USER`, then the host name, then "unknown".
pub(super) fn resolve(explicit: Option<&str>) -> String {
    let non_empty = |s: String| {
        let s = s.trim().to_string();
        (!s.is_empty()).then_some(s)
    };
    explicit
        .map(str::to_string)
        .and_then(non_empty)
        .or_else(|| std::env::var("USER").ok().and_then(non_empty))
        .or_else(|| host_name().and_then(non_empty))
        .unwrap_or_else(|| "unknown".into())
}

fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
}
