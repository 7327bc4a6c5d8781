//! The daemon's HTTP API (SPEC §6): `GET /healthz`, `GET /metrics`, `GET /api/status`,
//! `GET /api/history`, `GET /api/plans`, `GET /api/plans/{ref}` (`?format=markdown[&limit=N]`),
//! `GET /api/events` (Server-Sent Events: `plan` events, for now) and `POST /hooks/git`.
//! Handlers only read the status store, the plans and the state directory; the webhook only
//! sends a trigger.
//!
//! `POST /hooks/git` accepts GitHub (`X-Hub-Signature-256: sha256=HMAC`), GitLab
//! (`X-Gitlab-Token: SECRET`) and generic (`X-Plumber-Signature: sha256=HMAC`) pushes. With a
//! secret configured, a request without a valid signature or token gets 401; without one, any
//! request triggers a fetch (the fetch itself is harmless). A pull-request event (GitHub
//! `pull_request` opened/synchronize/reopened, GitLab `Merge Request Hook` open/update/reopen)
//! also has that pull request's plan published on the forge again (see [`super::publish`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc::Sender;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{Context, Error, Trigger};

#[derive(Clone)]
struct Api {
    context: Arc<Context>,
    triggers: Sender<Trigger>,
    /// Turns true when the server stops: event streams end, so the graceful shutdown does not
    /// wait for their clients.
    stopping: tokio::sync::watch::Receiver<bool>,
}

/// The API server, on its own thread with a small tokio runtime.
pub struct Server {
    pub addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    streams: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(context: Arc<Context>, triggers: Sender<Trigger>) -> Result<Server, Error> {
        let addr = context.config.listen;
        let listen_error = |source| Error::Listen { addr, source };
        let listener = std::net::TcpListener::bind(addr).map_err(listen_error)?;
        listener.set_nonblocking(true).map_err(listen_error)?;
        let bound = listener.local_addr().map_err(listen_error)?;
        let (streams, stopping) = tokio::sync::watch::channel(false);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(listen_error)?;
        let feeding = context.clone();
        let app = Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/metrics", get(metrics))
            .route("/api/status", get(status))
            .route("/api/history", get(history))
            .route("/api/plans", get(plans))
            .route("/api/plans/{*name}", get(plan_of))
            .route("/api/events", get(events))
            .route("/hooks/git", post(hook))
            .merge(crate::web::routes())
            .with_state(Api {
                context,
                triggers,
                stopping: stopping.clone(),
            });
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("api".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(error) => {
                            tracing::error!(%error, "cannot serve the API");
                            return;
                        }
                    };
                    tokio::spawn(feed_events(feeding, stopping));
                    let served = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await;
                    if let Err(error) = served {
                        tracing::error!(%error, "the API server failed");
                    }
                });
            })
            .map_err(listen_error)?;
        Ok(Server {
            addr: bound,
            shutdown: Some(shutdown),
            streams,
            thread: Some(thread),
        })
    }

    pub fn stop(mut self) {
        let _ = self.streams.send(true);
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn metrics(State(api): State<Api>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &api.context.store.metrics.registry)
    {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

async fn status(State(api): State<Api>) -> Response {
    let status = api.context.store.read().clone();
    axum::Json(status).into_response()
}

async fn history(State(api): State<Api>) -> Response {
    match api.context.records.history() {
        Ok(entries) => axum::Json(api.context.shown_history(entries)).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

async fn plans(State(api): State<Api>) -> Response {
    let plans = api.context.plans.list();
    axum::Json(plans.iter().map(AsRef::as_ref).collect::<Vec<_>>()).into_response()
}

#[derive(serde::Deserialize)]
struct PlanQuery {
    format: Option<String>,
    /// With `format=markdown`: at most this many bytes (a forge's comment limit).
    limit: Option<usize>,
}

/// `GET /api/plans/{ref}`: the ref URL-encoded (`refs%2Fheads%2Fx`) or not (`refs/heads/x`).
/// `?format=markdown` is the review text, `&limit=N` shortens it to N bytes at most.
async fn plan_of(
    State(api): State<Api>,
    Path(name): Path<String>,
    Query(query): Query<PlanQuery>,
) -> Response {
    let Some(plan) = api.context.plans.get(&name) else {
        let watched: Vec<String> = api
            .context
            .plans
            .list()
            .iter()
            .map(|p| p.name.clone())
            .collect();
        return (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({
                "error": format!(
                    "ref `{name}` is not watched (or has no plan yet); give the full ref name, \
                     URL-encoded, e.g. /api/plans/refs%2Fheads%2Fmy-branch"
                ),
                "watched": watched,
                "patterns": api.context.config.watch_refs,
            })),
        )
            .into_response();
    };
    match query.format.as_deref() {
        None | Some("json") => axum::Json(plan.as_ref()).into_response(),
        Some("markdown") => (
            [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
            match query.limit {
                Some(limit) => plan.markdown_within(limit),
                None => plan.markdown.clone(),
            },
        )
            .into_response(),
        Some(other) => (
            StatusCode::BAD_REQUEST,
            axum::Json(serde_json::json!({
                "error": format!("unknown format `{other}`; use json or markdown"),
            })),
        )
            .into_response(),
    }
}

/// Server-Sent Events ([`super::events`]): the newest status at once (with the delay an
/// EventSource waits before reconnecting), then every event in order. A client that fell
/// behind gets the newest status and a `resync` (read history and plans again).
async fn events(State(api): State<Api>) -> Response {
    let (first, receiver) = api.context.events.subscribe(&api.context.store);
    let context = api.context.clone();
    let mut stopping = api.stopping.clone();
    let first_id = first.id;
    let first = std::iter::once(sse(&first).retry(RECONNECT));
    let rest = futures::stream::unfold((receiver, first_id), move |(mut receiver, last)| {
        let context = context.clone();
        async move {
            match receiver.recv().await {
                Ok(event) => Some((vec![sse(&event)], (receiver, event.id))),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "an event stream's client fell behind");
                    let status = context.events.snapshot(&context.store, last);
                    let resync = Event::default().event("resync").data("{}");
                    Some((vec![sse(&status), resync], (receiver, last)))
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
            }
        }
    })
    .flat_map(futures::stream::iter);
    let stream = futures::stream::iter(first)
        .chain(rest)
        .map(Ok::<_, std::convert::Infallible>)
        .take_until(async move {
            let _ = stopping.wait_for(|stop| *stop).await;
        });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// How long a browser waits before reconnecting to a daemon that went away.
const RECONNECT: std::time::Duration = std::time::Duration::from_secs(2);

fn sse(event: &super::events::Outgoing) -> Event {
    Event::default()
        .id(event.id.to_string())
        .event(event.kind)
        .data(&event.data)
}

/// Feeds the event stream: status as it is written, and the plans' changes.
async fn feed_events(context: Arc<Context>, stopping: tokio::sync::watch::Receiver<bool>) {
    let plans = {
        let context = context.clone();
        let mut stopping = stopping.clone();
        async move {
            let mut receiver = context.plans.subscribe();
            loop {
                let received = tokio::select! {
                    received = receiver.recv() => received,
                    _ = stopping.wait_for(|stop| *stop) => return,
                };
                match received {
                    Ok(event) => context.events.publish("plan", &event),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        context.events.publish("resync", &serde_json::json!({}));
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    };
    let status =
        context
            .events
            .follow_status(&context.store, super::events::STATUS_INTERVAL, stopping);
    futures::join!(plans, status);
}

async fn hook(State(api): State<Api>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(secret) = &api.context.config.webhook_secret
        && !authentic(secret.as_bytes(), &headers, &body)
    {
        tracing::warn!("webhook refused: missing or wrong signature");
        return (StatusCode::UNAUTHORIZED, "missing or wrong signature\n").into_response();
    }
    let _ = api.triggers.send(Trigger::Webhook);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(number) = super::publish::webhook_pull_request(header, &body) {
        tracing::info!(
            pull_request = number,
            "pull-request webhook: its plan is published again"
        );
        api.context.publish.republish(number);
    }
    if let Some(number) = super::publish::webhook_pull_request_changed(header, &body) {
        // Labelled, unlabelled, closed, merged: whether its preview runs may have changed.
        api.context.previews.look(number);
    }
    (StatusCode::ACCEPTED, "fetching\n").into_response()
}

type HmacSha256 = Hmac<Sha256>;

/// Whether the request carries a valid GitHub or generic signature, or GitLab token. Never
/// with an empty secret, which anyone could sign with (`plumber up` refuses one at start).
fn authentic(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> bool {
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
}
