//! The daemon's listener (SPEC §6, §11): it accepts connections and reads requests on a thread
//! of its own, answers `GET /healthz` there, and hands every other request to the API's
//! runtime on another thread ([`super::api`]), so a slow answer (a long plan rendered, the
//! history read from disk) never keeps health from answering.
//!
//! What a stranger on the port can make the daemon hold is bounded ([`ListenerConfig`]):
//!
//! - **Connections**: at most `max_connections` at once. Past it a connection is still
//!   accepted, to be told so (503; `/healthz` gets its answer, so a probe gets through) and
//!   closed; at most [`turned_away_at_once`] such connections at once, past which new ones are
//!   closed unanswered.
//! - **Time**: a request's head must arrive within `header_timeout` of connecting or of the
//!   previous answer on the connection (hyper's header read timeout, which so also closes
//!   kept-alive connections left idle); a connection on which no byte moved either way for
//!   `idle_timeout` is closed: a client that stopped reading (an event stream it never reads),
//!   a request stuck half sent.
//! - **Memory per connection**: hyper's read and write buffers are capped at [`BUFFER`] (a
//!   longer request head gets 431), and a response body is handed over one frame at a time: the
//!   API's runtime makes the next frame only once the connection took the last one.
//! - **Names**: a loopback listener answers only requests whose `Host` is `localhost`, an IP
//!   address or an allowed name, so that a web page whose name an attacker rebinds to
//!   127.0.0.1 cannot read the API (DNS rebinding). `POST /hooks/git` is not checked: any page
//!   can post to it anyway, and what it triggers does not depend on who asks.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Either, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::time::Instant;

use super::health::Threads;

/// The listener's limits: `plumber up` flags, the `listener:` section of the daemon's
/// configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    /// Connections open at once (`--max-connections`).
    pub max_connections: usize,
    /// The time a client has to send a request's head, from connecting or from the previous
    /// answer on the connection; also the time a webhook's body has to arrive
    /// (`--header-timeout`).
    pub header_timeout: Duration,
    /// A connection on which no byte moved either way for this long is closed
    /// (`--idle-timeout`). Event streams send a comment at least twice within it.
    pub idle_timeout: Duration,
    /// `GET /api/events` clients at once (`--max-event-streams`).
    pub max_event_streams: usize,
    /// The largest webhook body read, in bytes (`--max-webhook-body`).
    pub max_webhook_body: usize,
    /// Names a loopback listener answers to besides `localhost` and IP addresses
    /// (`--allow-host`); when given, a listener on any address checks `Host`.
    pub allowed_hosts: Vec<String>,
}

impl Default for ListenerConfig {
    /// A team's page and a forge's webhooks, with room to spare: each connection costs the
    /// daemon a few KB (`bench/results/listener.md`), each event stream about 0.3 MB when
    /// gzipped (its deflate window), a webhook 2 MB at most (axum's own default limit, over
    /// any push GitHub or GitLab sends but the very largest).
    fn default() -> Self {
        ListenerConfig {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_event_streams: 64,
            max_webhook_body: 2 * 1024 * 1024,
            allowed_hosts: Vec::new(),
        }
    }
}

/// hyper's read and write buffers per connection: a request head may take this much, and a
/// response body is not taken faster than the client reads past it.
pub const BUFFER: usize = 64 * 1024;

/// Connections answered 503 at once while `max_connections` are open.
pub fn turned_away_at_once(config: &ListenerConfig) -> usize {
    (config.max_connections / 8).clamp(8, 256)
}

/// How often a warning about refused connections or requests is logged at most (a flood
/// must not become a flood of log lines).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The listener's metrics (`plumber_http_*`).
#[derive(Clone, Default)]
pub struct ListenerMetrics {
    pub connections: Gauge,
    pub event_streams: Gauge,
    pub refused: Family<ReasonLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

impl ListenerMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "http_connections",
            "Connections open on the daemon's listener",
            self.connections.clone(),
        );
        registry.register(
            "http_event_streams",
            "Clients of GET /api/events connected",
            self.event_streams.clone(),
        );
        registry.register(
            "http_refused",
            "Connections and requests the listener refused or closed at a limit, by reason (max-connections, max-event-streams, header-timeout, header-size, idle-timeout, host, webhook-body, webhook-timeout)",
            self.refused.clone(),
        );
    }

    pub fn refuse(&self, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }
}

/// Logs a warning at most once per `WARN_EVERY`, counting what it left out.
#[derive(Default)]
pub struct Throttle {
    last: Mutex<Option<std::time::Instant>>,
    left_out: AtomicU64,
}

impl Throttle {
    /// `Some(lines left out since the last)` when a line may be logged now.
    pub fn allow(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let now = std::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < WARN_EVERY) {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.left_out.swap(0, Ordering::Relaxed))
    }
}

/// What the listener's thread needs.
pub(super) struct Front {
    pub config: ListenerConfig,
    /// The names `Host` may give; `None`: not checked.
    pub hosts: Option<Vec<String>>,
    pub threads: Arc<Threads>,
    pub metrics: ListenerMetrics,
    /// The API's runtime, where every request but `/healthz` is answered.
    pub api: tokio::runtime::Handle,
    pub router: axum::Router,
    connections: Arc<Semaphore>,
    turned_away: Arc<Semaphore>,
    refused_warning: Throttle,
    host_warning: Throttle,
}

/// An answer: made here (health, refusals) or relayed from the API's runtime.
pub type Answer = Either<Full<Bytes>, Relayed>;

impl Front {
    pub fn new(
        config: ListenerConfig,
        listening: SocketAddr,
        public_url: Option<&str>,
        threads: Arc<Threads>,
        metrics: ListenerMetrics,
        api: tokio::runtime::Handle,
        router: axum::Router,
    ) -> Front {
        let hosts = allowed_hosts(&config, listening, public_url);
        Front {
            connections: Arc::new(Semaphore::new(config.max_connections.max(1))),
            turned_away: Arc::new(Semaphore::new(turned_away_at_once(&config))),
            config,
            hosts,
            threads,
            metrics,
            api,
            router,
            refused_warning: Throttle::default(),
            host_warning: Throttle::default(),
        }
    }

    /// Accepts connections until `stop` turns true, then lets each finish the request in hand
    /// (for at most `grace`).
    pub async fn accept(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        mut stop: watch::Receiver<bool>,
        grace: Duration,
    ) {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.wait_for(|stop| *stop) => break,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors, most likely: wait a little rather than spin.
                    if let Some(left_out) = self.refused_warning.allow() {
                        tracing::warn!(%error, left_out, "cannot accept a connection");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (permit, full) = match self.connections.clone().try_acquire_owned() {
                Ok(permit) => (permit, false),
                Err(_) => {
                    self.metrics.refuse("max-connections");
                    if let Some(left_out) = self.refused_warning.allow() {
                        tracing::warn!(
                            max_connections = self.config.max_connections,
                            left_out,
                            "connection refused: the listener holds its maximum of connections \
                             (--max-connections, listener.maxConnections in the daemon's configuration)"
                        );
                    }
                    match self.turned_away.clone().try_acquire_owned() {
                        Ok(permit) => (permit, true),
                        // Closed unanswered.
                        Err(_) => continue,
                    }
                }
            };
            tokio::spawn(self.clone().serve(stream, permit, full, stop.clone()));
        }
        drop(listener);
        // Every connection gives its permit back when it ends.
        let all = u32::try_from(self.config.max_connections.max(1)).unwrap_or(u32::MAX);
        let _ = tokio::time::timeout(grace, self.connections.acquire_many(all)).await;
    }

    /// Serves one connection until it ends, is idle too long, or the listener stops.
    async fn serve(
        self: Arc<Self>,
        stream: TcpStream,
        _permit: OwnedSemaphorePermit,
        full: bool,
        mut stop: watch::Receiver<bool>,
    ) {
        self.metrics.connections.inc();
        let _open = scopeguard(|| {
            self.metrics.connections.dec();
        });
        let progress = Arc::new(Progress::new());
        let io = TokioIo::new(Watched {
            inner: stream,
            progress: progress.clone(),
        });
        let front = self.clone();
        let service = hyper::service::service_fn(move |request| {
            let front = front.clone();
            async move { Ok::<_, Infallible>(front.answer(request, full).await) }
        });
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(self.config.header_timeout)
            .max_buf_size(BUFFER)
            // A connection past the maximum answers once.
            .keep_alive(!full);
        let connection = http.serve_connection(io, service);
        tokio::pin!(connection);
        let idle = self.config.idle_timeout;
        let mut stopping = false;
        loop {
            tokio::select! {
                served = connection.as_mut() => {
                    // A kept-alive connection left idle after its answers ends so too: only
                    // one that began a request, or never sent one, was refused.
                    match served {
                        Err(error) if error.is_timeout() && progress.request_unanswered() => {
                            self.metrics.refuse("header-timeout");
                            tracing::debug!(timeout = ?self.config.header_timeout, "connection closed: no whole request head within --header-timeout");
                        }
                        Err(error) if error.is_parse_too_large() => {
                            self.metrics.refuse("header-size");
                            tracing::debug!(limit = BUFFER, "connection closed: a request head over the limit");
                        }
                        _ => {}
                    }
                    return;
                }
                () = tokio::time::sleep_until(progress.last() + idle) => {
                    if progress.last() + idle <= Instant::now() {
                        self.metrics.refuse("idle-timeout");
                        tracing::debug!(timeout = ?idle, "connection closed: nothing moved for --idle-timeout");
                        // Dropping the connection closes it.
                        return;
                    }
                }
                _ = stop.wait_for(|stop| *stop), if !stopping => {
                    stopping = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }

    async fn answer(&self, request: Request<Incoming>, full: bool) -> Response<Answer> {
        let path = request.uri().path();
        if path != "/hooks/git" && !self.host_allowed(&request) {
            self.metrics.refuse("host");
            let host = host_of(&request).unwrap_or_default().to_owned();
            if let Some(left_out) = self.host_warning.allow() {
                tracing::warn!(%host, left_out, "request refused: the listener does not answer to this name (--allow-host, listener.allowedHosts)");
            }
            return here(
                StatusCode::FORBIDDEN,
                format!(
                    "this daemon does not answer to the name `{host}`: give it --allow-host {host} \
                     (listener.allowedHosts in the daemon's configuration) if it is yours\n"
                ),
            );
        }
        if path == "/readyz" {
            return match self.threads.ready() {
                Ok(()) => here(StatusCode::OK, "ready\n".into()),
                Err(why) => here(StatusCode::SERVICE_UNAVAILABLE, why),
            };
        }
        if path == "/healthz" {
            let health = self.threads.health();
            let status = if health == super::health::Health::Ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            return here(status, health.text());
        }
        if full {
            let mut response = here(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the daemon holds {} connections at once (--max-connections, \
                     listener.maxConnections); try again later\n",
                    self.config.max_connections
                ),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return response;
        }
        self.relay(request).await
    }

    fn host_allowed(&self, request: &Request<Incoming>) -> bool {
        let Some(allowed) = &self.hosts else {
            return true;
        };
        // No name given (HTTP/1.0): nothing a browser sends.
        host_of(request).is_none_or(|host| host_is_allowed(host, allowed))
    }

    /// The request answered on the API's runtime, its body handed over frame by frame.
    async fn relay(&self, request: Request<Incoming>) -> Response<Answer> {
        let (head, answered) = oneshot::channel();
        // One frame in the hand-over at a time: the next is made once the connection took it.
        let (frames, relayed) = mpsc::channel(1);
        self.api.spawn(respond(
            self.router.clone(),
            request.map(axum::body::Body::new),
            head,
            frames,
        ));
        match answered.await {
            Ok((parts, hint)) => Response::from_parts(
                parts,
                Either::Right(Relayed {
                    frames: relayed,
                    hint,
                }),
            ),
            // The handler panicked, or the API's runtime is gone (the daemon stops).
            Err(_) => here(
                StatusCode::SERVICE_UNAVAILABLE,
                "the API could not answer\n".into(),
            ),
        }
    }
}

/// On the API's runtime: the router's answer, its head first, then its body frame by frame
/// as the connection takes them. Ends as soon as the connection is gone.
async fn respond(
    mut router: axum::Router,
    request: Request<axum::body::Body>,
    head: oneshot::Sender<(axum::http::response::Parts, SizeHint)>,
    frames: mpsc::Sender<Result<Frame<Bytes>, axum::Error>>,
) {
    use tower::Service as _;
    let response = match router.call(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let (parts, body) = response.into_parts();
    if head.send((parts, body.size_hint())).is_err() {
        return;
    }
    let mut body = std::pin::pin!(body);
    loop {
        let frame = tokio::select! {
            frame = body.frame() => frame,
            // An event stream waits for events: the client going away ends it at once.
            () = frames.closed() => return,
        };
        let Some(frame) = frame else { return };
        let failed = frame.is_err();
        if frames.send(frame).await.is_err() || failed {
            return;
        }
    }
}

/// A response body made on the API's runtime.
pub struct Relayed {
    frames: mpsc::Receiver<Result<Frame<Bytes>, axum::Error>>,
    hint: SizeHint,
}

impl Body for Relayed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.frames.poll_recv(cx)
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

fn here(status: StatusCode, text: String) -> Response<Answer> {
    let mut response = Response::new(Either::Left(Full::new(Bytes::from(text))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The names `Host` may give: `None` when not checked (a listener on other addresses than
/// loopback, without `allowed_hosts`). The public URL's host is one of them.
fn allowed_hosts(
    config: &ListenerConfig,
    listening: SocketAddr,
    public_url: Option<&str>,
) -> Option<Vec<String>> {
    if !listening.ip().is_loopback() && config.allowed_hosts.is_empty() {
        return None;
    }
    let mut names: Vec<String> = config
        .allowed_hosts
        .iter()
        .map(|name| normal_name(name))
        .collect();
    if let Some(host) = public_url
        .and_then(|url| url.split_once("://"))
        .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or_default())
        .and_then(|authority| name_of(authority.rsplit('@').next().unwrap_or_default()))
    {
        names.push(normal_name(host));
    }
    Some(names)
}

fn normal_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn host_of<B>(request: &Request<B>) -> Option<&str> {
    request
        .headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
}

/// The name of a `Host` value without its port; `None` for an IP address (which no attacker
/// can rebind).
fn name_of(host: &str) -> Option<&str> {
    if host.starts_with('[') {
        return None;
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        None
    } else {
        Some(name)
    }
}

/// Whether a browser reaching the daemon by `host` reached it on purpose: an IP address,
/// `localhost` (and its subdomains, which browsers resolve to loopback themselves), or a name
/// the operator allowed.
fn host_is_allowed(host: &str, allowed: &[String]) -> bool {
    let Some(name) = name_of(host) else {
        return true;
    };
    let name = normal_name(name);
    name == "localhost" || name.ends_with(".localhost") || allowed.contains(&name)
}

/// When a byte last moved on a connection, and which way.
struct Progress {
    start: Instant,
    /// Milliseconds from `start`.
    last: AtomicU64,
    /// Bytes were read since the daemon last wrote.
    read_last: AtomicBool,
    wrote: AtomicBool,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            start: Instant::now(),
            last: AtomicU64::new(0),
            read_last: AtomicBool::new(false),
            wrote: AtomicBool::new(false),
        }
    }

    fn touch(&self, read: bool) {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(elapsed, Ordering::Relaxed);
        self.read_last.store(read, Ordering::Relaxed);
        if !read {
            self.wrote.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the client began a request the daemon has not answered, or never sent one.
    fn request_unanswered(&self) -> bool {
        self.read_last.load(Ordering::Relaxed) || !self.wrote.load(Ordering::Relaxed)
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last.load(Ordering::Relaxed))
    }
}

/// A connection's socket, noting every byte that moves.
struct Watched {
    inner: TcpStream,
    progress: Arc<Progress>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.progress.touch(true);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.progress.touch(false);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.progress.touch(false);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Runs `f` when dropped.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_browser_reaches_a_loopback_listener_by() {
        let allowed = vec!["plumber.example".to_owned()];
        for ok in [
            "localhost",
            "localhost:7878",
            "LOCALHOST:9000",
            "app.localhost:7878",
            "127.0.0.1:7878",
            "10.1.2.3",
            "[::1]:7878",
            "[fe80::1]",
            "plumber.example",
            "Plumber.Example.:443",
        ] {
            assert!(host_is_allowed(ok, &allowed), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:7878",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "plumber.example.evil",
        ] {
            assert!(!host_is_allowed(refused, &allowed), "{refused}");
        }
    }

    #[test]
    fn only_loopback_listeners_check_host_unless_names_are_given() {
        let loopback: SocketAddr = "127.0.0.1:7878".parse().unwrap();
        let anywhere: SocketAddr = "0.0.0.0:7878".parse().unwrap();
        let config = ListenerConfig::default();
        assert_eq!(allowed_hosts(&config, loopback, None), Some(vec![]));
        assert_eq!(allowed_hosts(&config, anywhere, None), None);
        assert_eq!(
            allowed_hosts(
                &config,
                loopback,
                Some("https://user@Plumber.Example:8443/x")
            ),
            Some(vec!["plumber.example".to_owned()])
        );
        let named = ListenerConfig {
            allowed_hosts: vec!["Plumber.Internal.".into()],
            ..ListenerConfig::default()
        };
        assert_eq!(
            allowed_hosts(&named, anywhere, None),
            Some(vec!["plumber.internal".to_owned()])
        );
    }
}
