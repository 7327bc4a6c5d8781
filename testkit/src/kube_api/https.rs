//! [`FakeApi::serve_https`]: the fake API server on a loopback port, over HTTPS, for a process
//! of its own (`plumber daemon` with a kubeconfig) rather than a client in the test process.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_openssl::SslStream;
use hyper_util::rt::TokioIo;
use kube::client::Body;
use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{AlpnError, Ssl, SslAcceptor, SslMethod, select_next_proto};
use openssl::x509::extension::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
    SubjectKeyIdentifier,
};
use openssl::x509::{X509, X509Builder, X509Name};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tower::{BoxError, Service};

use super::server::ApiError;
use super::{FakeApi, FakeBody, respond};

/// kube-apiserver's default limit on a request body (`--max-request-bytes`, 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// A [`FakeApi`] served over HTTPS on `127.0.0.1` (see [`FakeApi::serve_https`]); the server
/// stops, and its connections close, when this is dropped.
pub struct Served {
    addr: SocketAddr,
    ca_pem: String,
    token: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeApi {
    /// Serves this server's [`FakeApi::service`] over HTTPS (HTTP/1.1) on a free port of
    /// `127.0.0.1`, on a thread of its own with its own tokio runtime, so the test itself may be
    /// synchronous. Requests go through the same path as in-process ones: the request log,
    /// faults, holds, RBAC ([`FakeApi::with_rbac`]); watches stream as chunked responses.
    ///
    /// The certificates are made now: a self-signed CA, and a server certificate it signs for
    /// `IP:127.0.0.1` and `DNS:localhost`. Requests must carry the bearer token of
    /// [`Served::token`] (as the kubeconfig of [`Served::kubeconfig`] does), or a named
    /// client's ([`Served::kubeconfig_as`], recorded as that client): others are answered 401
    /// `Unauthorized`, as by the API server's authentication, and are not in the request log. An injected transport fault ([`super::Fault::Transport`]) closes the connection. A
    /// request body over 3 MiB is answered 413, as kube-apiserver answers it.
    ///
    /// Panics when it cannot make the certificates, bind the port or start its thread.
    pub fn serve_https(&self) -> Served {
        let tls = Tls::generate()
            .unwrap_or_else(|e| panic!("FakeApi::serve_https: cannot make the certificates: {e}"));
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .unwrap_or_else(|e| panic!("FakeApi::serve_https: cannot bind 127.0.0.1:0: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("FakeApi::serve_https: no local address: {e}"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("FakeApi::serve_https: cannot start a tokio runtime: {e}"));
        // Registered with the server's runtime here, so that a failure panics in the caller.
        let listener = {
            let _inside = runtime.enter();
            TcpListener::from_std(listener)
                .unwrap_or_else(|e| panic!("FakeApi::serve_https: cannot listen: {e}"))
        };
        let token = {
            let mut bytes = [0u8; 16];
            openssl::rand::rand_bytes(&mut bytes)
                .unwrap_or_else(|e| panic!("FakeApi::serve_https: no random token: {e}"));
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            format!("plumber-testkit-{hex}")
        };
        let server = Arc::new(Server {
            api: self.clone(),
            acceptor: tls.acceptor,
            token: token.clone(),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("fake-kube-https".to_string())
            // Dropping the runtime at the end of the thread drops every connection's task,
            // open watches included.
            .spawn(move || runtime.block_on(server.run(listener, stopped)))
            .unwrap_or_else(|e| panic!("FakeApi::serve_https: cannot start its thread: {e}"));
        Served {
            addr,
            ca_pem: tls.ca_pem,
            token,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Served {
    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA certificate the server's certificate is signed by, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The bearer token requests must carry.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// A kubeconfig (YAML) for this server: its URL, the CA (`certificate-authority-data`),
    /// a user with the bearer token, and a current context whose namespace is `namespace`.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        self.kubeconfig_with(namespace, &self.token)
    }

    /// [`Served::kubeconfig`] for client `client` (letters, digits and `-`): its requests are
    /// recorded with `client` as their [`super::RecordedRequest::client`], so a test tells
    /// two processes apart, or holds one's calls.
    pub fn kubeconfig_as(&self, namespace: &str, client: &str) -> String {
        assert!(
            !client.is_empty()
                && client
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "a client name is letters, digits and `-`: {client:?}"
        );
        self.kubeconfig_with(namespace, &format!("{}.{client}", self.token))
    }

    /// Writes [`Served::kubeconfig_as`] to `path`.
    pub fn write_kubeconfig_as(
        &self,
        path: impl AsRef<Path>,
        namespace: &str,
        client: &str,
    ) -> io::Result<()> {
        std::fs::write(path, self.kubeconfig_as(namespace, client))
    }

    fn kubeconfig_with(&self, namespace: &str, token: &str) -> String {
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{
                "name": "plumber-testkit",
                "cluster": {
                    "server": self.url(),
                    "certificate-authority-data": openssl::base64::encode_block(self.ca_pem.as_bytes()),
                },
            }],
            "users": [{"name": "plumber-testkit", "user": {"token": token}}],
            "contexts": [{
                "name": "plumber-testkit",
                "context": {"cluster": "plumber-testkit", "user": "plumber-testkit", "namespace": namespace},
            }],
            "current-context": "plumber-testkit",
        });
        serde_saphyr::to_string(&config)
            .unwrap_or_else(|e| panic!("a kubeconfig does not serialize as YAML: {e}"))
    }

    /// Writes [`Served::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>, namespace: &str) -> io::Result<()> {
        std::fs::write(path, self.kubeconfig(namespace))
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Joined, so that once this is dropped the port is closed and no request is answered.
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for Served {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Served").field("url", &self.url()).finish()
    }
}

struct Server {
    api: FakeApi,
    acceptor: SslAcceptor,
    /// The bearer token every request must carry, alone or followed by `.<client>`.
    token: String,
}

impl Server {
    /// Who a bearer token names: `Some(None)` for the plain token, `Some(Some(client))` for
    /// a named client's, `None` for any other.
    fn client_of(&self, token: &str) -> Option<Option<Arc<str>>> {
        let rest = token.strip_prefix(self.token.as_str())?;
        match rest.strip_prefix('.') {
            None if rest.is_empty() => Some(None),
            Some(client) if !client.is_empty() => Some(Some(client.into())),
            _ => None,
        }
    }

    async fn run(
        self: Arc<Server>,
        listener: TcpListener,
        mut stopped: tokio::sync::oneshot::Receiver<()>,
    ) {
        loop {
            let accepted = tokio::select! {
                // Stopped, or the `Served` is gone.
                _ = &mut stopped => return,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((tcp, _)) => {
                    tokio::spawn(self.clone().connection(tcp));
                }
                // Out of file descriptors and the like: a pause, lest the loop spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    async fn connection(self: Arc<Server>, tcp: TcpStream) {
        // Watch events are small writes that must not wait for more.
        let _ = tcp.set_nodelay(true);
        let Ok(ssl) = Ssl::new(self.acceptor.context()) else {
            return;
        };
        let Ok(mut stream) = SslStream::new(ssl, TokioIo::new(tcp)) else {
            return;
        };
        // A client that does not trust the CA or hangs up fails here: the error is its to see.
        if Pin::new(&mut stream).accept().await.is_err() {
            return;
        }
        let service = hyper::service::service_fn(move |request| self.clone().answer(request));
        // A connection ends with an error when the client goes away mid-response (a dropped
        // watch) or a transport fault is injected: nothing to do about either.
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(stream, service)
            .await;
    }

    async fn answer(
        self: Arc<Server>,
        request: Request<Incoming>,
    ) -> Result<Response<FakeBody>, BoxError> {
        let Some(client) = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .and_then(|token| self.client_of(token))
        else {
            return respond(
                401,
                &ApiError::new(401, "Unauthorized", "Unauthorized").status(),
            );
        };
        let (parts, body) = request.into_parts();
        let bytes = match Limited::new(body, MAX_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) if error.is::<LengthLimitError>() => {
                let message = format!("Request entity too large: limit is {MAX_BODY}");
                let error = ApiError::new(413, "RequestEntityTooLarge", message);
                return respond(413, &error.status());
            }
            Err(error) => {
                let message = format!("the request body could not be read: {error}");
                return respond(400, &ApiError::new(400, "BadRequest", message).status());
            }
        };
        let mut service = self.api.service_as(client);
        poll_fn(|cx| service.poll_ready(cx)).await?;
        service
            .call(Request::from_parts(parts, Body::from(bytes)))
            .await
    }
}

/// The server's TLS: an acceptor with a fresh certificate, and the CA that signed it.
struct Tls {
    acceptor: SslAcceptor,
    ca_pem: String,
}

impl Tls {
    fn generate() -> Result<Tls, ErrorStack> {
        // P-256 keys: quick to generate, and what TLS 1.2 and 1.3 clients all take.
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
        let ca_key = PKey::from_ec_key(EcKey::generate(&group)?)?;
        let ca_name = common_name("plumber-testkit fake API server CA")?;
        let mut ca = builder(&ca_name, &ca_key)?;
        ca.set_issuer_name(&ca_name)?;
        ca.append_extension(BasicConstraints::new().critical().ca().build()?)?;
        ca.append_extension(
            KeyUsage::new()
                .critical()
                .key_cert_sign()
                .crl_sign()
                .build()?,
        )?;
        let id = SubjectKeyIdentifier::new().build(&ca.x509v3_context(None, None))?;
        ca.append_extension(id)?;
        ca.sign(&ca_key, MessageDigest::sha256())?;
        let ca = ca.build();

        let key = PKey::from_ec_key(EcKey::generate(&group)?)?;
        let mut cert = builder(&common_name("localhost")?, &key)?;
        cert.set_issuer_name(ca.subject_name())?;
        cert.append_extension(BasicConstraints::new().build()?)?;
        cert.append_extension(KeyUsage::new().critical().digital_signature().build()?)?;
        cert.append_extension(ExtendedKeyUsage::new().server_auth().build()?)?;
        let names = SubjectAlternativeName::new()
            .ip("127.0.0.1")
            .dns("localhost")
            .build(&cert.x509v3_context(Some(&ca), None))?;
        cert.append_extension(names)?;
        let id = SubjectKeyIdentifier::new().build(&cert.x509v3_context(Some(&ca), None))?;
        cert.append_extension(id)?;
        let authority = AuthorityKeyIdentifier::new()
            .keyid(true)
            .build(&cert.x509v3_context(Some(&ca), None))?;
        cert.append_extension(authority)?;
        cert.sign(&ca_key, MessageDigest::sha256())?;
        let cert = cert.build();

        let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())?;
        acceptor.set_private_key(&key)?;
        acceptor.set_certificate(&cert)?;
        acceptor.check_private_key()?;
        // kube's client offers h2 and http/1.1; this server speaks HTTP/1.1 only.
        acceptor.set_alpn_select_callback(|_, offered| {
            select_next_proto(b"\x08http/1.1", offered).ok_or(AlpnError::NOACK)
        });
        let ca_pem = String::from_utf8_lossy(&ca.to_pem()?).into_owned();
        Ok(Tls {
            acceptor: acceptor.build(),
            ca_pem,
        })
    }
}

fn common_name(name: &str) -> Result<X509Name, ErrorStack> {
    let mut builder = X509Name::builder()?;
    builder.append_entry_by_nid(Nid::COMMONNAME, name)?;
    Ok(builder.build())
}

/// A v3 certificate of `subject` for `key`, with a random serial, valid from long ago (no clock
/// skew can make it not yet valid) for a year.
fn builder(subject: &X509Name, key: &PKey<Private>) -> Result<X509Builder, ErrorStack> {
    let mut builder = X509::builder()?;
    builder.set_version(2)?;
    let mut serial = BigNum::new()?;
    serial.rand(127, MsbOption::MAYBE_ZERO, false)?;
    let serial = serial.to_asn1_integer()?;
    builder.set_serial_number(&serial)?;
    builder.set_subject_name(subject)?;
    builder.set_pubkey(key)?;
    let (from, until) = (
        Asn1Time::from_str("20240101000000Z")?,
        Asn1Time::days_from_now(365)?,
    );
    builder.set_not_before(&from)?;
    builder.set_not_after(&until)?;
    Ok(builder)
}
