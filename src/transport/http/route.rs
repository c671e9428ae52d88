//! A configured route, resolved at start-up: where its key comes from,
//! who may call it, and whether it runs the handler or publishes.

use super::key::{KeyError, KeySource};
use super::publish::{Destination, Publishers};
use super::signature::Webhook;
use crate::config::{ConfigError, RouteSettings, WebhookKind};
use crate::identity::IdempotencyKey;
use axum::http::HeaderName;
use sha2::Digest;
use std::sync::Arc;

pub(super) struct Route {
    pub name: Arc<str>,
    pub key: KeySource,
    /// Webhook routes: the signature authenticates the sender. Others: the
    /// caller's API key or gateway header.
    pub webhook: Option<Webhook>,
    /// Async routes: where the command is published. None: sync.
    pub publish: Option<Destination>,
}

impl Route {
    pub(super) fn build(
        i: usize,
        r: &RouteSettings,
        publishers: &Publishers,
    ) -> Result<Self, ConfigError> {
        let webhook = r
            .webhook
            .map(|kind| Webhook::load(i, kind, r))
            .transpose()?;
        let publish = match &r.publish {
            None => None,
            Some(target) => Some(publishers.destination(target).ok_or_else(|| {
                ConfigError::new(
                    &format!("api.routes[{i}].publish"),
                    "no client for this broker was built",
                    "check the [kafka] or [amqp] section",
                )
            })?),
        };
        Ok(Self {
            name: r.name.as_str().into(),
            key: key_source(r),
            webhook,
            publish,
        })
    }
}

/// Where webhook routes keep their event ids: `webhook/<route>/<event id>`,
/// a namespace of their own, so an API caller of the same tenant who sends
/// an event id as `Idempotency-Key` (one seen in a dashboard) can never
/// take the key of a signed delivery. Other routes may not use it.
pub(super) const WEBHOOK_KEYS: &str = "webhook/";

impl Route {
    /// The key this route claims: a webhook's event id in its namespace
    /// (for a sender whose event id is not signed, the signed body's
    /// SHA-256 instead, so a captured delivery replayed under a new id is a
    /// duplicate); an API caller's key as sent, unless it is in the
    /// webhooks' namespace.
    pub(super) fn namespaced(
        &self,
        key: IdempotencyKey,
        body: &[u8],
    ) -> Result<IdempotencyKey, KeyError> {
        if let Some(hook) = &self.webhook {
            let key = if hook.signs_its_event_id() {
                format!("{WEBHOOK_KEYS}{}/{}", self.name, key.as_str())
            } else {
                let digest = crate::fingerprint::hex(&sha2::Sha256::digest(body));
                format!("{WEBHOOK_KEYS}{}/sha256:{digest}", self.name)
            };
            return Ok(IdempotencyKey::parse(key.as_bytes())?);
        }
        if key.as_str().starts_with(WEBHOOK_KEYS) {
            return Err(KeyError::Reserved(WEBHOOK_KEYS));
        }
        Ok(key)
    }
}

/// The route's own settings win; otherwise the webhook preset's event id,
/// or `Idempotency-Key` (with `key_pointer` as a fallback).
fn key_source(r: &RouteSettings) -> KeySource {
    let header = |name: &str| HeaderName::from_bytes(name.as_bytes()).ok();
    let pointer = r.key_pointer.clone();
    match (r.webhook, &r.key_header) {
        (_, Some(h)) => KeySource {
            header: header(h),
            pointer,
        },
        (Some(_), None) if pointer.is_some() => KeySource {
            header: None,
            pointer,
        },
        (Some(WebhookKind::Stripe), None) => KeySource {
            header: None,
            pointer: Some("/id".into()),
        },
        (Some(WebhookKind::Github), None) => KeySource {
            header: header("x-github-delivery"),
            pointer: None,
        },
        (Some(WebhookKind::Shopify), None) => KeySource {
            header: header("x-shopify-webhook-id"),
            pointer: None,
        },
        (None | Some(WebhookKind::Hmac), None) => KeySource {
            header: header("idempotency-key"),
            pointer,
        },
    }
}
