//! Real git servers on loopback: smart HTTP (`git http-backend` as a CGI program behind a small
//! HTTP server with basic auth), OpenSSH's `sshd` with its own host key and an authorized
//! key, and a server that accepts connections and never answers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use plumber_testkit::wait_until;

pub const PATIENCE: Duration = Duration::from_secs(60);

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Accepts connections on its own thread until dropped.
struct Acceptor {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Acceptor {
    fn start(handle: impl Fn(TcpStream) + Send + Sync + 'static) -> Acceptor {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let handle = Arc::new(handle);
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    let handle = handle.clone();
                    std::thread::spawn(move || handle(stream));
                }
            })
        };
        Acceptor {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Smart HTTP for the repositories under `root` (`http://127.0.0.1:PORT/NAME`), every request
/// needing `user:password` with basic auth.
pub struct GitHttpServer {
    acceptor: Acceptor,
    /// Requests answered with 401.
    pub refused: Arc<AtomicUsize>,
}

impl GitHttpServer {
    pub fn start(root: &Path, user: &str, password: &str) -> GitHttpServer {
        let expected = format!("Basic {}", base64(format!("{user}:{password}").as_bytes()));
        let refused = Arc::new(AtomicUsize::new(0));
        let root = root.to_path_buf();
        let counter = refused.clone();
        let acceptor = Acceptor::start(move |stream| {
            if let Err(error) = serve(stream, &root, &expected, &counter) {
                eprintln!("git http server: {error}");
            }
        });
        GitHttpServer { acceptor, refused }
    }

    pub fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/{name}", self.acceptor.port)
    }
}

fn serve(
    stream: TcpStream,
    root: &Path,
    expected_auth: &str,
    refused: &AtomicUsize,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("").to_owned(),
        parts.next().unwrap_or("").to_owned(),
    );
    let mut headers: Vec<(String, String)> = Vec::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header)?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(length) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    }
    if header("authorization") != Some(expected_auth) {
        refused.fetch_add(1, Ordering::SeqCst);
        return writer.write_all(
            b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\n\
              Content-Length: 0\r\nConnection: close\r\n\r\n",
        );
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut cgi = Command::new("git")
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", &method)
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("CONTENT_TYPE", header("content-type").unwrap_or(""))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env(
            "HTTP_CONTENT_ENCODING",
            header("content-encoding").unwrap_or(""),
        )
        .env("GIT_PROTOCOL", header("git-protocol").unwrap_or(""))
        .env("REMOTE_USER", "bot")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut stdin = cgi.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || stdin.write_all(&body));
    let output = cgi.wait_with_output()?;
    let _ = feeder.join();
    let split = output
        .stdout
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| (at, 4))
        .or_else(|| {
            output
                .stdout
                .windows(2)
                .position(|w| w == b"\n\n")
                .map(|at| (at, 2))
        })
        .unwrap_or((output.stdout.len(), 0));
    let cgi_headers = String::from_utf8_lossy(&output.stdout[..split.0]).into_owned();
    let cgi_body = &output.stdout[(split.0 + split.1).min(output.stdout.len())..];
    let mut status = "200 OK".to_owned();
    let mut response = Vec::new();
    for header in cgi_headers.lines().filter(|l| !l.is_empty()) {
        match header.split_once(':') {
            Some((name, value)) if name.eq_ignore_ascii_case("status") => {
                status = value.trim().to_owned();
            }
            _ => response.extend_from_slice(format!("{header}\r\n").as_bytes()),
        }
    }
    writer.write_all(format!("HTTP/1.1 {status}\r\n").as_bytes())?;
    writer.write_all(&response)?;
    writer.write_all(
        format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            cgi_body.len()
        )
        .as_bytes(),
    )?;
    writer.write_all(cgi_body)?;
    writer.flush()
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Accepts TCP connections and never sends or reads a byte: a hung git server.
pub struct SilentServer {
    acceptor: Acceptor,
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl SilentServer {
    pub fn start() -> SilentServer {
        let held = Arc::new(Mutex::new(Vec::new()));
        let keep = held.clone();
        let acceptor = Acceptor::start(move |stream| keep.lock().unwrap().push(stream));
        SilentServer { acceptor, held }
    }

    pub fn port(&self) -> u16 {
        self.acceptor.port
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        // Closing the connections ends the fetches that hang on them.
        self.held.lock().unwrap().clear();
    }
}

/// OpenSSH's sshd on a free loopback port, with its own host key, letting the current user in
/// with [`SshServer::key`] only. `home` holds a `.ssh/known_hosts` that trusts its host key.
pub struct SshServer {
    sshd: Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

const SSHD: &str = "/usr/sbin/sshd";

fn keygen(path: &Path) {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "plumber-test", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen (openssh-client)");
    assert!(status.success());
}

impl SshServer {
    pub fn start() -> SshServer {
        assert!(
            Path::new(SSHD).is_file(),
            "{SSHD} is missing: scripts/install-deps installs openssh-server"
        );
        // sshd's privilege separation needs it; the package creates it only when sshd runs
        // as a service.
        std::fs::create_dir_all("/run/sshd").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        for key in ["host_key", "key", "wrong_key"] {
            keygen(&path(key));
        }
        std::fs::copy(path("key.pub"), path("authorized_keys")).unwrap();
        let port = free_port();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {host}\nAuthorizedKeysFile {auth}\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
             UsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\nPidFile none\n\
             MaxAuthTries 1000\nLogLevel VERBOSE\n",
            host = path("host_key").display(),
            auth = path("authorized_keys").display(),
        );
        std::fs::write(path("sshd_config"), config).unwrap();
        let host_key = std::fs::read_to_string(path("host_key.pub")).unwrap();
        let ssh_dir = path("home").join(".ssh");
        std::fs::create_dir_all(&ssh_dir).unwrap();
        std::fs::write(
            ssh_dir.join("known_hosts"),
            format!("[127.0.0.1]:{port} {host_key}"),
        )
        .unwrap();
        let log = std::fs::File::create(path("sshd.log")).unwrap();
        let sshd = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(path("sshd_config"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let server = SshServer { sshd, port, dir };
        wait_until("sshd listens", PATIENCE, || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        server
    }

    /// `ssh://USER@127.0.0.1:PORT/PATH` for a repository on this machine.
    pub fn url(&self, repository: &Path) -> String {
        let user = Command::new("id").arg("-un").output().unwrap().stdout;
        let user = String::from_utf8(user).unwrap();
        let user = user.trim();
        format!(
            "ssh://{user}@127.0.0.1:{}{}",
            self.port,
            repository.display()
        )
    }

    /// The authorized private key.
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("key")
    }

    /// A valid key the server does not know.
    pub fn wrong_key(&self) -> PathBuf {
        self.dir.path().join("wrong_key")
    }

    /// A `HOME` whose known_hosts trusts this server.
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// The known_hosts file of [`SshServer::home`].
    pub fn known_hosts(&self) -> PathBuf {
        self.home().join(".ssh").join("known_hosts")
    }

    /// A known_hosts file that holds another key for this server (as a server that changed
    /// its key, or one in between, would present).
    pub fn wrong_known_hosts(&self) -> PathBuf {
        let path = self.dir.path().join("wrong_known_hosts");
        let other = std::fs::read_to_string(self.dir.path().join("wrong_key.pub")).unwrap();
        std::fs::write(&path, format!("[127.0.0.1]:{} {other}", self.port)).unwrap();
        path
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
    }
}
