//! `POST /hooks/git` (SPEC §6, §11): what a webhook may make the daemon do, and what it may
//! make it hold.
//!
//! - **Verification**: GitHub (`X-Hub-Signature-256: sha256=HMAC`), GitLab
//!   (`X-Gitlab-Token: SECRET`) and generic (`X-Plumber-Signature: sha256=HMAC`) deliveries
//!   are checked in constant time when a secret is configured (401 otherwise). Without a
//!   secret anyone can post, so a delivery only asks for a fetch (harmless: it reads the
//!   repository, and fetches are coalesced); only a verified pull-request event has its plan
//!   published again and its preview decided, both of which ask the forge.
//! - **De-duplication**: a delivery whose id was seen before is answered 200 and does nothing
//!   (GitHub's `X-GitHub-Delivery`, GitLab's `Idempotency-Key` (kept across its retries) or
//!   else `X-Gitlab-Event-UUID`, generic `X-Plumber-Delivery`). The id header is not signed,
//!   so a verified delivery's body is remembered too: one replayed under a new id only fetches.
//!   The last [`REMEMBERED`] of each are kept.
//! - **Holding**: a body over `max_webhook_body` is refused (413) without reading it all, one
//!   that does not arrive within `header_timeout` is dropped (408), and at most
//!   [`BODIES_AT_ONCE`] bodies are read at once.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use hmac::{Hmac, Mac};
use http_body_util::BodyExt as _;
use sha2::{Digest as _, Sha256};
use tokio::sync::Semaphore;

/// Webhook bodies read at once: at most this many times `max_webhook_body` is held for them.
pub const BODIES_AT_ONCE: usize = 4;

/// Delivery ids and bodies remembered, each.
pub const REMEMBERED: usize = 1024;

/// The headers that name a delivery, in the order they are looked for.
pub const DELIVERY_HEADERS: [&str; 4] = [
    "x-github-delivery",
    "idempotency-key",
    "x-gitlab-event-uuid",
    "x-plumber-delivery",
];

/// Why a webhook's body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Over `max_webhook_body` bytes.
    TooLarge { limit: usize },
    /// Not whole within the time allowed.
    TooSlow { timeout: Duration },
    /// The connection failed while reading it.
    Broken,
}

impl Refusal {
    pub fn status(self) -> StatusCode {
        match self {
            Refusal::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::TooSlow { .. } => StatusCode::REQUEST_TIMEOUT,
            Refusal::Broken => StatusCode::BAD_REQUEST,
        }
    }

    /// `plumber_http_refused`'s reason.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::TooLarge { .. } => "webhook-body",
            Refusal::TooSlow { .. } | Refusal::Broken => "webhook-timeout",
        }
    }

    pub fn message(self) -> String {
        match self {
            Refusal::TooLarge { limit } => format!(
                "a webhook body takes at most {limit} bytes (--max-webhook-body, \
                 listener.maxWebhookBody); the next poll fetches\n"
            ),
            Refusal::TooSlow { timeout } => format!(
                "the webhook body did not arrive within {timeout:?} (--header-timeout, \
                 listener.headerTimeout)\n"
            ),
            Refusal::Broken => "the webhook body could not be read\n".into(),
        }
    }
}

/// The webhook's limits and memory.
pub struct Hooks {
    max_body: usize,
    timeout: Duration,
    reading: Semaphore,
    ids: Recent,
    bodies: Recent,
}

impl Hooks {
    pub fn new(max_body: usize, timeout: Duration) -> Hooks {
        Hooks {
            max_body,
            timeout,
            reading: Semaphore::new(BODIES_AT_ONCE),
            ids: Recent::default(),
            bodies: Recent::default(),
        }
    }

    /// The whole body, within the limits: its turn to be read and the body itself within the
    /// time allowed, at most the size allowed.
    pub async fn read(
        &self,
        headers: &HeaderMap,
        body: axum::body::Body,
    ) -> Result<Bytes, Refusal> {
        let too_large = Refusal::TooLarge {
            limit: self.max_body,
        };
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|length| length > self.max_body as u64) {
            return Err(too_large);
        }
        let read = async {
            let _turn = self.reading.acquire().await.map_err(|_| Refusal::Broken)?;
            match http_body_util::Limited::new(body, self.max_body)
                .collect()
                .await
            {
                Ok(collected) => Ok(collected.to_bytes()),
                Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(too_large),
                Err(_) => Err(Refusal::Broken),
            }
        };
        tokio::time::timeout(self.timeout, read)
            .await
            .unwrap_or(Err(Refusal::TooSlow {
                timeout: self.timeout,
            }))
    }

    /// Whether the delivery named so is new (and from now on remembered).
    pub fn first_delivery(&self, delivery: &Delivery) -> bool {
        let mut digest = Sha256::new();
        digest.update(delivery.header.as_bytes());
        digest.update(b":");
        digest.update(delivery.id.as_bytes());
        self.ids.first(digest.finalize().into())
    }

    /// Whether a verified body is new (and from now on remembered).
    pub fn first_body(&self, body: &[u8]) -> bool {
        self.bodies.first(Sha256::digest(body).into())
    }
}

/// A delivery's id and the header that gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub header: &'static str,
    pub id: String,
}

/// The delivery's id, from the first of [`DELIVERY_HEADERS`] it has.
pub fn delivery(headers: &HeaderMap) -> Option<Delivery> {
    DELIVERY_HEADERS.iter().find_map(|&name| {
        let id = headers.get(name)?.to_str().ok()?.trim();
        (!id.is_empty()).then(|| Delivery {
            header: name,
            id: id.to_owned(),
        })
    })
}

/// The last [`REMEMBERED`] digests, oldest forgotten first.
#[derive(Default)]
struct Recent {
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    order: VecDeque<[u8; 32]>,
    set: HashSet<[u8; 32]>,
}

impl Recent {
    fn first(&self, digest: [u8; 32]) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if !seen.set.insert(digest) {
            return false;
        }
        seen.order.push_back(digest);
        if seen.order.len() > REMEMBERED
            && let Some(oldest) = seen.order.pop_front()
        {
            seen.set.remove(&oldest);
        }
        true
    }
}

type HmacSha256 = Hmac<Sha256>;

/// Whether the request carries a valid GitHub or generic signature, or GitLab token. Never
/// with an empty secret, which anyone could sign with (`plumber up` refuses one at start).
pub fn authentic(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> bool {
    if secret.is_empty() {
        return false;
    }
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Ok(mac) = HmacSha256::new_from_slice(secret) else {
        return false;
    };
    for name in ["x-hub-signature-256", "x-plumber-signature"] {
        if let Some(signature) = text(name).and_then(|v| v.strip_prefix("sha256="))
            && let Ok(expected) = hex::decode(signature)
        {
            let mut mac = mac.clone();
            mac.update(body);
            return mac.verify_slice(&expected).is_ok();
        }
    }
    if let Some(token) = text("x-gitlab-token") {
        // Compared through HMACs, so the comparison takes the same time wherever it differs.
        let digest = |value: &[u8]| {
            let mut mac = mac.clone();
            mac.update(value);
            mac
        };
        let expected = digest(secret).finalize().into_bytes();
        return digest(token.as_bytes()).verify_slice(&expected).is_ok();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn signed(secret: &[u8], body: &[u8]) -> String {
        let mut mac = HmacSha256::new_from_slice(secret).unwrap();
        mac.update(body);
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    }

    #[test]
    fn github_and_generic_signatures_are_checked() {
        let body = br#"{"ref":"refs/heads/main"}"#;
        for header in ["x-hub-signature-256", "x-plumber-signature"] {
            let mut headers = HeaderMap::new();
            headers.insert(
                header,
                HeaderValue::from_str(&signed(b"s3cret", body)).unwrap(),
            );
            assert!(authentic(b"s3cret", &headers, body), "{header}");
            assert!(
                !authentic(b"other", &headers, body),
                "{header} with another secret"
            );
            assert!(
                !authentic(b"s3cret", &headers, b"tampered"),
                "{header} on another body"
            );
        }
    }

    #[test]
    fn gitlab_tokens_and_missing_headers() {
        let mut headers = HeaderMap::new();
        assert!(!authentic(b"s3cret", &headers, b""));
        headers.insert("x-gitlab-token", HeaderValue::from_static("s3cret"));
        assert!(authentic(b"s3cret", &headers, b""));
        headers.insert("x-gitlab-token", HeaderValue::from_static("s3cre"));
        assert!(!authentic(b"s3cret", &headers, b""));
        // An empty secret authenticates nothing, not even a matching empty signature.
        headers.insert("x-gitlab-token", HeaderValue::from_static(""));
        assert!(!authentic(b"", &headers, b""));
        let mut signed_empty = HeaderMap::new();
        signed_empty.insert(
            "x-plumber-signature",
            HeaderValue::from_str(&signed(b"", b"x")).unwrap(),
        );
        assert!(!authentic(b"", &signed_empty, b"x"));
    }

    #[test]
    fn deliveries_are_named_by_the_forge_s_header_and_remembered_for_a_while() {
        let named = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, HeaderValue::from_static(value));
            }
            delivery(&headers)
        };
        assert_eq!(named(&[]), None);
        assert_eq!(named(&[("x-github-delivery", "  ")]), None);
        let gitlab = named(&[
            ("x-gitlab-event-uuid", "event"),
            ("idempotency-key", "retry-safe"),
        ])
        .unwrap();
        // GitLab keeps the Idempotency-Key across its retries of one delivery.
        assert_eq!(
            (gitlab.header, gitlab.id.as_str()),
            ("idempotency-key", "retry-safe")
        );

        let hooks = Hooks::new(1024, Duration::from_secs(1));
        let github = named(&[("x-github-delivery", "72d3162e")]).unwrap();
        assert!(hooks.first_delivery(&github));
        assert!(!hooks.first_delivery(&github));
        // The same id under another header is another delivery.
        let generic = named(&[("x-plumber-delivery", "72d3162e")]).unwrap();
        assert!(hooks.first_delivery(&generic));
        assert!(hooks.first_body(b"{}"));
        assert!(!hooks.first_body(b"{}"));

        // Only the last REMEMBERED are kept: the first is forgotten after as many more.
        for n in 0..REMEMBERED {
            assert!(hooks.first_body(n.to_string().as_bytes()));
        }
        assert!(hooks.first_body(b"{}"));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_or_too_slow_is_not_read() {
        let hooks = Hooks::new(8, Duration::from_millis(200));
        let mut headers = HeaderMap::new();
        assert_eq!(
            hooks
                .read(&headers, axum::body::Body::from("12345678"))
                .await,
            Ok(Bytes::from_static(b"12345678"))
        );
        // Declared too long: refused before a byte is read.
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("9"));
        assert_eq!(
            hooks.read(&headers, axum::body::Body::from("")).await,
            Err(Refusal::TooLarge { limit: 8 })
        );
        // Too long as it arrives (chunked).
        let headers = HeaderMap::new();
        assert_eq!(
            hooks
                .read(&headers, axum::body::Body::from("123456789"))
                .await,
            Err(Refusal::TooLarge { limit: 8 })
        );
        // A body that never ends.
        let endless = axum::body::Body::from_stream(futures::stream::pending::<
            Result<Bytes, std::io::Error>,
        >());
        assert_eq!(
            hooks.read(&headers, endless).await,
            Err(Refusal::TooSlow {
                timeout: Duration::from_millis(200)
            })
        );
    }
}
