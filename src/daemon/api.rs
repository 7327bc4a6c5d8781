//! The daemon's HTTP API (SPEC §6): `GET /metrics`, `GET /api/status`, `GET /api/history`,
//! `GET /api/plans`, `GET /api/plans/{ref}` (`?format=markdown[&limit=N]`),
//! `GET /api/records/{topology}/{step}` (`?limit=N`), `GET /api/events`
//! (Server-Sent Events, gzipped event by event for clients that accept it), `POST /hooks/git`
//! ([`super::hooks`]) and the web page. Every other response is gzipped for clients that
//! accept it too. Handlers only read the status store, the plans and the state directory; the
//! webhook only sends requests.
//!
//! The answers are made on a runtime of their own (the `api` thread); connections, their
//! limits and `GET /healthz` are the listener's, on its own thread ([`super::listener`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::health::Kind;
use super::hooks::Hooks;
use super::listener::{Front, ListenerMetrics, Throttle};
use super::{Context, Error, Trigger};

#[derive(Clone)]
struct Api {
    context: Arc<Context>,
    triggers: Sender<Trigger>,
    /// Turns true when the server stops: event streams end, so the graceful shutdown does not
    /// wait for their clients.
    stopping: tokio::sync::watch::Receiver<bool>,
    /// One permit per event stream client.
    streams: Arc<Semaphore>,
    streams_warning: Arc<Throttle>,
    hooks: Arc<Hooks>,
    /// One read of a step's records at a time (`GET /api/records/…`).
    tails: Arc<Semaphore>,
}

impl Api {
    fn metrics(&self) -> &ListenerMetrics {
        &self.context.store.metrics.listener
    }
}

/// The API server: the listener's thread and the API's.
pub struct Server {
    pub addr: SocketAddr,
    /// Turns true to stop: the listener accepts no more connections and lets each finish
    /// its answer, and event streams end.
    stop: tokio::sync::watch::Sender<bool>,
    listener: Option<std::thread::JoinHandle<()>>,
    api: Option<(
        tokio::sync::oneshot::Sender<()>,
        std::thread::JoinHandle<()>,
    )>,
}

/// How long a stopping listener lets connections finish the answer in hand.
const GRACE: Duration = Duration::from_secs(5);

impl Server {
    pub fn start(context: Arc<Context>, triggers: Sender<Trigger>) -> Result<Server, Error> {
        let addr = context.config.listen;
        let limits = context.config.listener.clone();
        let listen_error = |source| Error::Listen { addr, source };
        let listener = std::net::TcpListener::bind(addr).map_err(listen_error)?;
        listener.set_nonblocking(true).map_err(listen_error)?;
        let bound = listener.local_addr().map_err(listen_error)?;
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(listen_error)
        };
        let (api_runtime, front_runtime) = (runtime()?, runtime()?);
        let app = Router::new()
            .route("/metrics", get(metrics))
            .route("/api/status", get(status))
            .route("/api/history", get(history))
            .route("/api/plans", get(plans))
            .route("/api/plans/{*name}", get(plan_of))
            .route("/api/records/{topology}/{step}", get(records))
            .route("/api/events", get(events))
            .route("/hooks/git", post(hook))
            .merge(crate::web::routes())
            // Gzip for clients that accept it, except the event stream (the default
            // predicate leaves `text/event-stream` alone; `events` gzips it itself).
            .layer(tower_http::compression::CompressionLayer::new())
            .with_state(Api {
                context: context.clone(),
                triggers,
                stopping: stopping.clone(),
                streams: Arc::new(Semaphore::new(limits.max_event_streams)),
                streams_warning: Arc::default(),
                tails: Arc::new(Semaphore::new(1)),
                hooks: Arc::new(Hooks::new(limits.max_webhook_body, limits.header_timeout)),
            });
        let front = Arc::new(Front::new(
            limits,
            bound,
            context.config.public_url.as_deref(),
            context.threads.clone(),
            context.store.metrics.listener.clone(),
            api_runtime.handle().clone(),
            app,
        ));

        let (api_stop, api_stopped) = tokio::sync::oneshot::channel::<()>();
        let api = super::spawn(&context.threads, "api", Kind::Essential, {
            let (context, stopping) = (context.clone(), stopping.clone());
            move || {
                api_runtime.block_on(async move {
                    tokio::spawn(feed_events(context, stopping));
                    let _ = api_stopped.await;
                });
            }
        })?;
        // Not among the threads health watches: when it dies, nothing answers `/healthz`.
        let listening = std::thread::Builder::new()
            .name("listener".into())
            .spawn(move || {
                front_runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => front.accept(listener, stopping, GRACE).await,
                        Err(error) => tracing::error!(%error, "cannot serve the API"),
                    }
                });
            })
            .map_err(listen_error)?;
        Ok(Server {
            addr: bound,
            stop,
            listener: Some(listening),
            api: Some((api_stop, api)),
        })
    }

    pub fn stop(mut self) {
        // Event streams end (with their gzip trailers) while connections finish.
        let _ = self.stop.send(true);
        if let Some(listener) = self.listener.take() {
            let _ = listener.join();
        }
        if let Some((stop, thread)) = self.api.take() {
            let _ = stop.send(());
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
    // The records may be Topology objects, read through a client that blocks its thread on
    // the Kubernetes runtime's own tokio runtime, and the commits they name are read from
    // git: never on one of the listener's threads.
    let context = api.context.clone();
    let read =
        move || Ok::<_, crate::store::Error>(context.shown_history(context.records.history()?));
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok(shown)) => axum::Json(shown).into_response(),
        Ok(Err(error)) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading the history failed: {error}"),
        )
            .into_response(),
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

#[derive(serde::Deserialize)]
struct RecordsQuery {
    /// Records of each kind (written, dead letters); 10 by default.
    limit: Option<usize>,
}

/// `GET /api/records/{topology}/{step}?limit=N` ([`super::tail`]): one read at a time.
async fn records(
    State(api): State<Api>,
    Path((topology, step)): Path<(String, String)>,
    Query(query): Query<RecordsQuery>,
) -> Response {
    use super::tail::{MAX_RECORDS, TailError};
    let limit = query.limit.unwrap_or(10);
    if limit == 0 || limit > MAX_RECORDS {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(serde_json::json!({
                "error": format!("`limit` is 1 to {MAX_RECORDS} records, not {limit}"),
            })),
        )
            .into_response();
    }
    let Ok(permit) = api.tails.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            axum::Json(serde_json::json!({
                "error": "another read of records is in progress (one at a time); ask again",
            })),
        )
            .into_response();
    };
    let context = api.context.clone();
    // Kafka reads block: never on one of the listener's threads.
    let read = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        context.step_records(&topology, &step, limit)
    });
    match read.await {
        Ok(Ok(records)) => axum::Json(records).into_response(),
        Ok(Err(error @ TailError::NotFound(_))) => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({ "error": error.to_string() })),
        )
            .into_response(),
        Ok(Err(error @ TailError::Unavailable(_))) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            axum::Json(serde_json::json!({ "error": error.to_string() })),
        )
            .into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading the records failed: {error}"),
        )
            .into_response(),
    }
}

/// Server-Sent Events ([`super::events`]): the newest status at once (with the delay an
/// EventSource waits before reconnecting), then every event in order, and a comment when
/// nothing was sent for a while. A client that fell behind gets the newest status and a
/// `resync` (read history and plans again). At most `max_event_streams` clients at once.
async fn events(State(api): State<Api>, headers: HeaderMap) -> Response {
    let Ok(permit) = api.streams.clone().try_acquire_owned() else {
        let limit = api.context.config.listener.max_event_streams;
        api.metrics().refuse("max-event-streams");
        if let Some(left_out) = api.streams_warning.allow() {
            tracing::warn!(
                max_event_streams = limit,
                left_out,
                "event stream refused: its maximum of clients is connected \
                 (--max-event-streams, listener.maxEventStreams)"
            );
        }
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "2")],
            format!(
                "the daemon serves {limit} event streams at once (--max-event-streams, \
                 listener.maxEventStreams); try again later\n"
            ),
        )
            .into_response();
    };
    let (first, receiver) = api.context.events.subscribe(&api.context.store);
    let gzip = accepts_gzip(&headers);
    // One piece: each event travels as one chunk, as clients that read the wire expect.
    let mut opening = format!("retry: {}\n", RECONNECT.as_millis()).into_bytes();
    opening.extend_from_slice(&first.frame());
    let opening = Bytes::from(opening);
    let stream = Stream {
        opening: Some(opening),
        receiver,
        last: first.id,
        context: api.context.clone(),
        stopping: api.stopping.clone(),
        keep_alive: keep_alive(api.context.config.listener.idle_timeout),
        gzip: gzip.then(Gzip::new),
        ended: false,
        _slot: Slot::take(permit, api.metrics().event_streams.clone()),
    };
    let body = futures::stream::unfold(stream, |mut stream| async move {
        let next = stream.next().await?;
        Some((next, stream))
    });
    let mut response = axum::body::Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if gzip {
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
    response
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

/// How long a browser waits before reconnecting to a daemon that went away.
const RECONNECT: Duration = Duration::from_secs(2);

/// The longest an event stream stays silent: a comment is sent then (what proxies and the
/// listener's idle timeout see as life).
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Twice within the listener's idle timeout at least, so that a quiet stream is never idle.
fn keep_alive(idle_timeout: Duration) -> Duration {
    KEEP_ALIVE
        .min(idle_timeout / 2)
        .max(Duration::from_millis(100))
}

/// An event stream's place among the `max_event_streams`, given back when it ends.
struct Slot {
    _permit: OwnedSemaphorePermit,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Slot {
    fn take(permit: OwnedSemaphorePermit, gauge: prometheus_client::metrics::gauge::Gauge) -> Slot {
        gauge.inc();
        Slot {
            _permit: permit,
            gauge,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// One client's event stream. What it holds: its place, its receiver (the events it has not
/// read are the channel's, shared by every client) and, gzipped, one deflate window over the
/// whole stream; the listener takes the next piece only once the client took the last.
struct Stream {
    /// The status as it was at connection, with the reconnection delay.
    opening: Option<Bytes>,
    receiver: tokio::sync::broadcast::Receiver<Arc<super::events::Outgoing>>,
    /// The id of the last event sent.
    last: u64,
    context: Arc<Context>,
    stopping: tokio::sync::watch::Receiver<bool>,
    keep_alive: Duration,
    gzip: Option<Gzip>,
    ended: bool,
    _slot: Slot,
}

impl Stream {
    /// The next event (gzipped: what the deflate stream gave for it, flushed); `None` once
    /// the stream ended.
    async fn next(&mut self) -> Option<std::io::Result<Bytes>> {
        use tokio::sync::broadcast::error::RecvError;
        if self.ended {
            return None;
        }
        enum Next {
            Event(Arc<super::events::Outgoing>),
            Lagged(u64),
            Quiet,
            End,
        }
        let frame = match self.opening.take() {
            Some(opening) => opening,
            None => {
                let next = tokio::select! {
                    received = self.receiver.recv() => match received {
                        Ok(event) => Next::Event(event),
                        Err(RecvError::Lagged(missed)) => Next::Lagged(missed),
                        Err(RecvError::Closed) => Next::End,
                    },
                    () = tokio::time::sleep(self.keep_alive) => Next::Quiet,
                    _ = self.stopping.wait_for(|stop| *stop) => Next::End,
                };
                match next {
                    Next::Event(event) => {
                        self.last = event.id;
                        event.frame()
                    }
                    Next::Lagged(missed) => {
                        tracing::debug!(missed, "an event stream's client fell behind");
                        let status = self.context.events.snapshot(&self.context.store, self.last);
                        let mut resync = status.frame().to_vec();
                        resync.extend_from_slice(b"event: resync\ndata: {}\n\n");
                        Bytes::from(resync)
                    }
                    Next::Quiet => Bytes::from_static(b":\n\n"),
                    Next::End => return self.end(),
                }
            }
        };
        Some(self.encode(frame))
    }

    /// The daemon stops: a gzipped stream ends with its trailer.
    fn end(&mut self) -> Option<std::io::Result<Bytes>> {
        self.ended = true;
        Some(self.gzip.take()?.finish())
    }

    fn encode(&mut self, frame: Bytes) -> std::io::Result<Bytes> {
        match &mut self.gzip {
            None => Ok(frame),
            Some(gzip) => gzip.event(&frame),
        }
    }
}

/// An event stream gzipped: one deflate window spans the stream, so a status document that
/// differs little from the one before it (most of them) costs a small part of its size on
/// the wire; flushed after every event, so each reaches the client whole at once.
struct Gzip(flate2::write::GzEncoder<Vec<u8>>);

impl Gzip {
    fn new() -> Gzip {
        Gzip(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::default(),
        ))
    }

    /// An event, gzipped.
    fn event(&mut self, frame: &[u8]) -> std::io::Result<Bytes> {
        use std::io::Write as _;
        self.0.write_all(frame)?;
        self.0.flush()?;
        Ok(Bytes::from(std::mem::take(self.0.get_mut())))
    }

    /// The gzip trailer (the decoder checks the stream's CRC and length with it).
    fn finish(self) -> std::io::Result<Bytes> {
        self.0.finish().map(Bytes::from)
    }
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

async fn hook(State(api): State<Api>, headers: HeaderMap, body: axum::body::Body) -> Response {
    let outcome = |outcome: &str| {
        api.context
            .store
            .metrics
            .webhooks
            .get_or_create(&super::status::WebhookLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
    };
    let body = match api.hooks.read(&headers, body).await {
        Ok(body) => body,
        Err(refusal) => {
            api.metrics().refuse(refusal.reason());
            tracing::warn!(
                limit = api.context.config.listener.max_webhook_body,
                ?refusal,
                "webhook refused"
            );
            return (refusal.status(), refusal.message()).into_response();
        }
    };
    let verified = match &api.context.config.webhook_secret {
        Some(secret) if super::hooks::authentic(secret.as_bytes(), &headers, &body) => true,
        Some(_) => {
            outcome("refused");
            tracing::warn!("webhook refused: missing or wrong signature");
            return (StatusCode::UNAUTHORIZED, "missing or wrong signature\n").into_response();
        }
        None => false,
    };
    let delivery = super::hooks::delivery(&headers);
    if let Some(delivery) = &delivery
        && !api.hooks.first_delivery(delivery)
    {
        outcome("duplicate");
        tracing::info!(header = delivery.header, id = %delivery.id, "webhook delivery seen before: ignored");
        return (StatusCode::OK, "duplicate delivery; ignored\n").into_response();
    }
    api.fetch();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let republish = super::review::publish::webhook_pull_request(header, &body);
    let look = super::review::publish::webhook_pull_request_changed(header, &body);
    let closed = super::review::publish::webhook_pull_request_closed(header, &body);
    let labelled = api
        .context
        .config
        .preview_label
        .as_ref()
        .and_then(|label| super::review::previews::webhook_labelled(header, &body, label));
    if republish.is_none() && look.is_none() && closed.is_none() && labelled.is_none() {
        outcome("fetch");
    } else if !verified {
        // Anyone can post without a secret: a forge request per post would be theirs to
        // command, and which head a label approves or whether a pull request closed theirs to
        // say.
        outcome("unsigned");
        tracing::debug!(pull_request = ?look.or(republish), "unsigned pull-request webhook: fetching only (configure a webhook secret to have it publish the plan and decide the preview)");
    } else if !api.hooks.first_body(&body) {
        // The same signed body under a new delivery id: a replay.
        outcome("replayed");
        tracing::warn!(delivery = ?delivery, "a signed webhook body seen before, under a new delivery id: fetching only");
    } else {
        outcome("pull-request");
        if let Some(number) = republish {
            tracing::info!(
                pull_request = number,
                "pull-request webhook: its plan is published again"
            );
            api.context.publish.republish(number);
        }
        if let Some((number, head)) = labelled {
            api.context.previews.labelled(number, head);
        }
        if let Some(number) = closed {
            api.context.publish.closed(number);
        }
        if let Some(number) = look {
            // Labelled, unlabelled, closed, merged: whether its preview runs may have changed.
            api.context.previews.look(number);
        }
    }
    (StatusCode::ACCEPTED, "fetching\n").into_response()
}

impl Api {
    /// Asks the follower for a fetch, unless one asked for is still to start: a flood of
    /// posts queues one trigger, not one each.
    fn fetch(&self) {
        if !self.context.fetch_asked.swap(true, Ordering::SeqCst) {
            let _ = self.triggers.send(Trigger::Webhook);
        }
    }
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

    #[test]
    fn each_gzipped_event_decodes_whole_on_arrival_and_a_similar_one_costs_little() {
        use std::io::Write as _;
        let mut gzip = Gzip::new();
        let mut decoded = flate2::write::GzDecoder::new(Vec::new());
        let mut sizes = Vec::new();
        for n in 0..3 {
            let data = document(n, 16_000);
            let frame = gzip
                .event(format!("event: status\ndata: {data}\n\n").as_bytes())
                .unwrap();
            sizes.push(frame.len());
            // What arrived must be the whole event, not the part of it a deflate block
            // happened to hold.
            decoded.write_all(&frame).unwrap();
            decoded.flush().unwrap();
            let text = String::from_utf8(decoded.get_ref().clone()).unwrap();
            assert!(
                text.ends_with(&format!("data: {data}\n\n")),
                "event {n} arrived whole"
            );
        }
        // The end of the stream is the gzip trailer: the decoder checks its CRC and length.
        decoded.write_all(&gzip.finish().unwrap()).unwrap();
        let all = String::from_utf8(decoded.finish().unwrap()).unwrap();
        assert_eq!(all.matches("event: status").count(), 3);
        // The window spans events: the second and third repeat the first but for one field,
        // and cost a small part of what the first (which compresses poorly alone) did.
        assert!(sizes[0] > 8_000, "{sizes:?}");
        assert!(
            sizes[1] * 20 < sizes[0] && sizes[2] * 20 < sizes[0],
            "a repeated document costs under 5 % of the first: {sizes:?}"
        );
    }

    #[test]
    fn a_quiet_stream_speaks_twice_within_the_idle_timeout() {
        assert_eq!(keep_alive(Duration::from_secs(60)), KEEP_ALIVE);
        assert_eq!(keep_alive(Duration::from_secs(4)), Duration::from_secs(2));
    }
}
