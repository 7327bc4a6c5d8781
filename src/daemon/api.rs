//! The daemon's HTTP API (SPEC §6): `GET /healthz`, `GET /metrics`, `GET /api/status`,
//! `GET /api/history`, `GET /api/plans`, `GET /api/plans/{ref}` (`?format=markdown[&limit=N]`),
//! `GET /api/events` (Server-Sent Events, gzipped event by event for clients that accept it)
//! and `POST /hooks/git`. Every other response is gzipped for clients that accept it too.
//! Handlers only read the status store, the plans and the state directory; the webhook only
//! sends a trigger.
//!
//! `POST /hooks/git` accepts GitHub (`X-Hub-Signature-256: sha256=HMAC`), GitLab
//! (`X-Gitlab-Token: SECRET`) and generic (`X-Plumber-Signature: sha256=HMAC`) pushes. With a
//! secret configured, a request without a valid signature or token gets 401; without one, any
//! request triggers a fetch (the fetch itself is harmless). A pull-request event (GitHub
//! `pull_request` opened/synchronize/reopened, GitLab `Merge Request Hook` open/update/reopen)
//! also has that pull request's plan published on the forge again, and a verified close or
//! merge stops its publication (see [`super::publish`]).

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
            // Gzip for clients that accept it, except the event stream (the default
            // predicate leaves `text/event-stream` alone; `events` gzips it itself).
            .layer(tower_http::compression::CompressionLayer::new())
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
async fn events(State(api): State<Api>, headers: HeaderMap) -> Response {
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
    let response = Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response();
    if accepts_gzip(&headers) {
        gzip_events(response)
    } else {
        response
    }
}

/// Whether `Accept-Encoding` names gzip (or `*`) with a weight above zero.
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let weight = parts
                .find_map(|p| p.strip_prefix("q="))
                .map_or(Some(1.0), |q| q.parse::<f32>().ok());
            (name.eq_ignore_ascii_case("gzip") || name == "*") && weight.is_some_and(|q| q > 0.0)
        })
}

/// The event stream gzipped, flushed after every event so each reaches the client whole at
/// once. One deflate window spans the stream: a status document that differs little from the
/// one before it (most of them) costs a small part of its size on the wire.
fn gzip_events(response: Response) -> Response {
    use std::io::Write as _;
    let (mut parts, body) = response.into_parts();
    parts.headers.insert(
        header::CONTENT_ENCODING,
        header::HeaderValue::from_static("gzip"),
    );
    parts.headers.insert(
        header::VARY,
        header::HeaderValue::from_static("accept-encoding"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    let encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let chunks = body.into_data_stream();
    let gzipped = futures::stream::unfold(Some((chunks, encoder)), |state| async move {
        let (mut chunks, mut encoder) = state?;
        let written = match chunks.next().await {
            Some(Ok(chunk)) => encoder.write_all(&chunk).and_then(|()| encoder.flush()),
            Some(Err(error)) => Err(std::io::Error::other(error)),
            // The stream ended (the daemon stops): the gzip trailer ends it properly.
            None => {
                let last = encoder.finish();
                return Some((last.map(Bytes::from), None));
            }
        };
        let out = written.map(|()| Bytes::from(std::mem::take(encoder.get_mut())));
        Some((out, Some((chunks, encoder))))
    });
    Response::from_parts(parts, axum::body::Body::from_stream(gzipped))
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
    // Only a verified delivery may say which head a label approves: anyone can post one.
    if api.context.config.webhook_secret.is_some()
        && let Some(label) = &api.context.config.preview_label
        && let Some((number, head)) = super::previews::webhook_labelled(header, &body, label)
    {
        api.context.previews.labelled(number, head);
    }
    // Only a signed webhook may stop the plans of a pull request from being published.
    if api.context.config.webhook_secret.is_some()
        && let Some(number) = super::publish::webhook_pull_request_closed(header, &body)
    {
        api.context.publish.closed(number);
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

    #[test]
    fn gzip_is_accepted_unless_its_weight_is_zero() {
        let accepts = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_str(value).unwrap(),
            );
            accepts_gzip(&headers)
        };
        assert!(accepts("gzip, deflate, br, zstd"));
        assert!(accepts("br;q=1.0, GZIP;q=0.5"));
        assert!(accepts("*"));
        assert!(!accepts("gzip;q=0"));
        assert!(!accepts("br, identity"));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    /// A status document with `size` letters that compress poorly on their own (the same in
    /// every document) and an `n` field that differs.
    fn document(n: u32, size: usize) -> String {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let filler: String = (0..size)
            .map(|_| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                char::from(b'a' + ((seed >> 33) % 26) as u8)
            })
            .collect();
        format!("{{\"n\":{n},\"steps\":\"{filler}\"}}")
    }

    #[tokio::test]
    async fn each_gzipped_event_decodes_whole_on_arrival_and_a_similar_one_costs_little() {
        use std::io::Write as _;
        let (events, received) = futures::channel::mpsc::unbounded::<Event>();
        let response =
            gzip_events(Sse::new(received.map(Ok::<_, std::convert::Infallible>)).into_response());
        assert_eq!(response.headers()[header::CONTENT_ENCODING], "gzip");
        let mut body = response.into_body().into_data_stream();
        let mut decoded = flate2::write::GzDecoder::new(Vec::new());
        let mut sizes = Vec::new();
        for n in 0..3 {
            let data = document(n, 16_000);
            events
                .unbounded_send(Event::default().event("status").data(&data))
                .unwrap();
            // The stream stays open (nothing more is sent): what arrived must be the whole
            // event, not the part of it a deflate block happened to hold.
            let frame = body.next().await.unwrap().unwrap();
            sizes.push(frame.len());
            decoded.write_all(&frame).unwrap();
            decoded.flush().unwrap();
            let text = String::from_utf8(decoded.get_ref().clone()).unwrap();
            assert!(
                text.ends_with(&format!("data: {data}\n\n")),
                "event {n} arrived whole"
            );
        }
        drop(events);
        // The end of the stream is the gzip trailer: the decoder checks its CRC and length.
        let trailer = body.next().await.unwrap().unwrap();
        decoded.write_all(&trailer).unwrap();
        let all = String::from_utf8(decoded.finish().unwrap()).unwrap();
        assert_eq!(all.matches("event: status").count(), 3);
        assert!(body.next().await.is_none());
        // The window spans events: the second and third repeat the first but for one field,
        // and cost a small part of what the first (which compresses poorly alone) did.
        assert!(sizes[0] > 8_000, "{sizes:?}");
        assert!(
            sizes[1] * 20 < sizes[0] && sizes[2] * 20 < sizes[0],
            "a repeated document costs under 5 % of the first: {sizes:?}"
        );
    }

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
