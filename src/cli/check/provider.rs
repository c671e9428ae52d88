//! The provider: the handler's settings build a client, and every target
//! URL answers a `HEAD` (nothing is charged).

use super::{Check, Report};
use crate::config::Settings;
use crate::handler::HttpHandler;
use crate::telemetry::chain;

pub(super) async fn check(s: &Settings, report: &mut Report) {
    let consumes = !s.kafka.topics.is_empty() || !s.amqp.queues.is_empty() || s.api.enabled;
    if s.handler.url.is_empty() && !consumes {
        return;
    }
    let handler = match HttpHandler::new(&s.handler) {
        Ok(h) => h,
        Err(e) => {
            report.push(Check::fail(
                "handler",
                chain(&e).to_string(),
                "correct the [handler] setting named",
            ));
            return;
        }
    };
    for reached in handler.reach().await {
        let name = format!("{} {}", reached.setting, reached.url);
        report.push(match reached.answer {
            Ok(status) if matches!(status.as_u16(), 401 | 403) => Check::warn(
                name,
                format!("answers HEAD with {status} to the configured headers"),
                "check the credentials in handler.headers (a provider may also refuse HEAD \
                 without them)",
            ),
            Ok(status) if status.is_redirection() => Check::fail(
                name,
                format!("answers HEAD with {status}: dedupq never follows a redirect"),
                "use the URL the redirect points at",
            ),
            Ok(status) => Check::ok(
                name,
                format!("reachable: HEAD answered {status} (nothing charged)"),
            ),
            Err(e) => Check::fail(
                name,
                format!("unreachable: {e}"),
                "check the URL, the network path and, for https, handler.ca_file",
            ),
        });
    }
}
