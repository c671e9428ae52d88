//! The process's budget of open files (`RLIMIT_NOFILE`). Every client
//! connection, PostgreSQL connection, broker socket and provider connection
//! is one. Run out, and what fails first is whatever opens the next one:
//! often a PostgreSQL or provider connection, while idle API clients keep
//! theirs. So `dedupq run` raises its soft limit to the hard one (as most
//! servers do; systemd and containerd start services at a soft 1024), and
//! refuses to start when the connections its configuration allows cannot
//! all be open at once.

use crate::config::{ConfigError, Settings};
use crate::server;

/// Files beside the bounded connections: broker sockets (librdkafka keeps
/// several per broker), the provider's connections for queue deliveries,
/// the upkeep connection, configuration and secret files, the runtime's
/// own descriptors.
pub(crate) const RESERVE: u64 = 256;

/// The process's open-files limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// What the process may open now.
    pub(crate) soft: u64,
    /// What it may raise `soft` to.
    pub(crate) hard: u64,
}

/// The limits in force, if the platform tells them.
pub(crate) fn limits() -> Option<Limits> {
    #[cfg(unix)]
    {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes only the struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
            return None;
        }
        Some(Limits {
            soft: l.rlim_cur,
            hard: l.rlim_max,
        })
    }
    #[cfg(not(unix))]
    None
}

/// Raises the soft limit to the hard one; the limits after it.
pub(crate) fn raise() -> Option<Limits> {
    let now = limits()?;
    #[cfg(unix)]
    if now.soft < now.hard {
        let l = libc::rlimit {
            rlim_cur: now.hard,
            rlim_max: now.hard,
        };
        // SAFETY: setrlimit reads only the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } != 0 {
            return Some(now);
        }
        return limits();
    }
    Some(now)
}

/// The open files the configuration may need at once: the operator
/// listener's connections, the store's pool, with the API its client
/// connections and a provider connection per request in flight, and
/// [`RESERVE`].
pub(crate) fn needed(s: &Settings) -> u64 {
    let mut n =
        server::LIMITS.max_connections as u64 + u64::from(s.store.max_connections) + RESERVE;
    if s.api.enabled {
        n += s.api.max_connections as u64 + s.api.max_requests_in_flight as u64;
    }
    n
}

/// Whether `limit` open files are enough for `s`; the error names
/// `api.max_connections` when the API is on (its bound is the one an
/// operator sets to fit), else `store.max_connections`.
pub(crate) fn fits(s: &Settings, limit: u64) -> Result<(), ConfigError> {
    let needed = needed(s);
    if needed <= limit {
        return Ok(());
    }
    let (setting, value) = if s.api.enabled {
        ("api.max_connections", s.api.max_connections as u64)
    } else {
        ("store.max_connections", u64::from(s.store.max_connections))
    };
    Err(ConfigError::new(
        setting,
        format!(
            "{setting} = {value} lets dedupq hold up to {needed} open files at once, \
             but this process may open {limit} (RLIMIT_NOFILE, its hard limit)"
        ),
        format!(
            "lower {setting}, or raise the limit to at least {needed} \
             (`ulimit -Hn`, systemd's LimitNOFILE=, the container runtime's nofile)"
        ),
    ))
}

/// For `dedupq run`: raises the soft limit to the hard one, then checks
/// that the configuration fits under it.
pub(crate) fn prepare(s: &Settings) -> Result<(), ConfigError> {
    match raise() {
        Some(l) => fits(s, l.soft),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_bounds_count_only_when_the_api_is_on() {
        let mut s = Settings::default();
        let without = needed(&s);
        assert_eq!(without, 128 + 8 + RESERVE);
        s.api.enabled = true;
        assert_eq!(needed(&s), without + 4096 + 1024);
    }

    #[test]
    fn a_limit_below_the_need_names_the_setting_to_lower() {
        let mut s = Settings::default();
        s.api.enabled = true;
        let e = fits(&s, 1024).unwrap_err();
        assert_eq!(e.setting, "api.max_connections");
        assert!(e.problem.contains("1024"), "{}", e.problem);
        assert!(e.fix.contains(&needed(&s).to_string()), "{}", e.fix);
        assert!(fits(&s, needed(&s)).is_ok());
        s.api.enabled = false;
        assert_eq!(fits(&s, 100).unwrap_err().setting, "store.max_connections");
        assert!(fits(&s, 1024).is_ok());
    }
}
