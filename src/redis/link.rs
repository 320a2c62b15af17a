//! One multiplexed connection per store: opened by the first hit that needs
//! it (concurrent hits share one connect), dropped when it fails, and
//! replaced after a short run of timeouts, so a server that stops answering
//! (paused, or behind a half-open socket) never leaves the store failing.
//! Nothing here sends a command again: a hit that was sent may have counted.
//!
//! The socket (TCP, TLS through rustls with ring, or a Unix socket) is opened
//! here and the Redis client's connection task is run here too, so a
//! connection that ends is noticed at once, even with no hit in flight.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisConnectionInfo, RedisError};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::AbortHandle;
use tokio_rustls::TlsConnector;

use super::config::{Addr, Config};
use crate::errors::{Error, Result};

/// Hits in a row that timed out, after which the connection counts as stuck.
const TIMEOUTS_BEFORE_REPLACING: u32 = 3;
/// Requests queued for the connection's writer before senders wait.
const PIPELINE_BUFFER: usize = 1024;

type Connecting = Shared<BoxFuture<'static, Result<MultiplexedConnection>>>;

enum Conn {
    Down,
    Connecting(Connecting),
    /// The connection and its task, which reads and writes the socket.
    Up(MultiplexedConnection, AbortHandle),
}

struct State {
    conn: Conn,
    /// Counts connects, so that a late report about an old connection
    /// leaves its replacement alone.
    generation: u64,
    closed: bool,
}

enum Target {
    Tcp {
        host: String,
        port: u16,
        tls: Option<(TlsConnector, ServerName<'static>)>,
    },
    Unix(PathBuf),
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub struct Link {
    target: Target,
    settings: RedisConnectionInfo,
    timeout: Duration,
    state: Mutex<State>,
    /// Hits in a row that timed out.
    timeouts: AtomicU32,
}

/// Where a Redis client error happened: a failed connect sent no hit.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Connect,
    Sent,
}

impl Link {
    pub fn new(config: &Config) -> Result<Link> {
        let target = match &config.addr {
            Addr::Tcp { host, port, tls } => Target::Tcp {
                host: host.clone(),
                port: *port,
                tls: match tls {
                    true => Some(tls_connector(host, config.tls_ca.as_deref())?),
                    false => None,
                },
            },
            Addr::Unix(path) if cfg!(unix) => Target::Unix(path.clone()),
            Addr::Unix(_) => {
                return Err(Error::Config(
                    "redis+unix:// URLs need a Unix socket, which this platform lacks".into(),
                ))
            }
        };
        let mut settings = RedisConnectionInfo::default()
            .set_db(config.db)
            .set_lib_name("ratestore", env!("CARGO_PKG_VERSION"));
        if let Some(user) = &config.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = &config.password {
            settings = settings.set_password(password);
        }
        Ok(Link {
            target,
            settings,
            timeout: Duration::from_millis(config.timeout_ms),
            state: Mutex::new(State {
                conn: Conn::Down,
                generation: 0,
                closed: false,
            }),
            timeouts: AtomicU32::new(0),
        })
    }

    /// The host name this link connects to (empty for a Unix socket).
    pub fn host(&self) -> &str {
        match &self.target {
            Target::Tcp { host, .. } => host,
            Target::Unix(_) => "",
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent at every step, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection, opening it if there is none, and its generation.
    /// Must run on the runtime: a connect is a task of its own, so that it
    /// finishes (and times out) even if the hit that started it gave up.
    pub async fn connection(self: &Arc<Self>) -> Result<(MultiplexedConnection, u64)> {
        let (connecting, generation) = {
            let mut state = self.lock();
            if state.closed {
                return Err(Error::Closed);
            }
            match &state.conn {
                Conn::Up(conn, _) => return Ok((conn.clone(), state.generation)),
                Conn::Connecting(connecting) => (connecting.clone(), state.generation),
                Conn::Down => {
                    state.generation += 1;
                    let connecting = self.connect(state.generation);
                    state.conn = Conn::Connecting(connecting.clone());
                    (connecting, state.generation)
                }
            }
        };
        Ok((connecting.await?, generation))
    }

    fn connect(self: &Arc<Self>, generation: u64) -> Connecting {
        let link = Arc::clone(self);
        let task = tokio::spawn(async move {
            let result = match tokio::time::timeout(link.timeout, link.open()).await {
                Ok(Ok((conn, driver))) => {
                    // The task holds the link weakly: a store nobody holds closes its socket.
                    let weak = Arc::downgrade(&link);
                    let task = tokio::spawn(async move {
                        driver.await;
                        if let Some(link) = Weak::upgrade(&weak) {
                            link.drop_connection(generation);
                        }
                    });
                    Ok((conn, task.abort_handle()))
                }
                Ok(Err(e)) => Err(classify(&e, Stage::Connect)),
                Err(_) => Err(Error::Timeout(link.timeout.as_millis() as u64)),
            };
            link.settle(generation, result)
        });
        task.map(|joined| {
            joined.unwrap_or_else(|_| Err(Error::Internal("the connect task failed")))
        })
        .boxed()
        .shared()
    }

    /// Opens the socket and greets the server (AUTH, SELECT) over it.
    async fn open(&self) -> redis::RedisResult<(MultiplexedConnection, BoxFuture<'static, ()>)> {
        let stream: Box<dyn Io> = match &self.target {
            Target::Tcp { host, port, tls } => {
                let tcp = TcpStream::connect((host.as_str(), *port)).await?;
                tcp.set_nodelay(true)?;
                match tls {
                    None => Box::new(tcp),
                    Some((connector, name)) => {
                        Box::new(connector.connect(name.clone(), tcp).await?)
                    }
                }
            }
            #[cfg(unix)]
            Target::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
            #[cfg(not(unix))]
            Target::Unix(_) => unreachable!("refused by Link::new"),
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(None)
            .set_response_timeout(None)
            .set_pipeline_buffer_size(PIPELINE_BUFFER);
        let (conn, driver) =
            MultiplexedConnection::new_with_config(&self.settings, stream, config).await?;
        Ok((conn, driver.boxed()))
    }

    fn settle(
        &self,
        generation: u64,
        result: Result<(MultiplexedConnection, AbortHandle)>,
    ) -> Result<MultiplexedConnection> {
        let mut state = self.lock();
        let current = state.generation == generation && !state.closed;
        match result {
            Ok((conn, task)) if current => {
                state.conn = Conn::Up(conn.clone(), task);
                self.timeouts.store(0, Ordering::Relaxed);
                Ok(conn)
            }
            Ok((_, task)) => {
                task.abort();
                Err(Error::Closed)
            }
            Err(e) => {
                if current {
                    state.conn = Conn::Down;
                }
                Err(e)
            }
        }
    }

    /// A hit got its answer: the connection works.
    pub fn answered(&self) {
        if self.timeouts.load(Ordering::Relaxed) != 0 {
            self.timeouts.store(0, Ordering::Relaxed);
        }
    }

    /// Hits sent on this generation's connection timed out.
    pub fn timed_out(&self, generation: u64, hits: usize) {
        let hits = u32::try_from(hits).unwrap_or(u32::MAX);
        if self
            .timeouts
            .fetch_add(hits, Ordering::Relaxed)
            .saturating_add(hits)
            >= TIMEOUTS_BEFORE_REPLACING
        {
            self.drop_connection(generation);
        }
    }

    /// The connection of this generation failed or is stuck: it is closed
    /// (hits still on it reject) and the next hit opens a new one.
    pub fn drop_connection(&self, generation: u64) {
        let mut state = self.lock();
        if state.generation == generation {
            if let Conn::Up(_, task) = &state.conn {
                task.abort();
                state.conn = Conn::Down;
                self.timeouts.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Refuses new hits; the connection ends once the hits in flight have settled.
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.conn = Conn::Down;
    }
}

/// A TLS connector for `host` that trusts `ca` if given, else the public roots.
fn tls_connector(
    host: &str,
    ca: Option<&[rustls::pki_types::CertificateDer<'static>]>,
) -> Result<(TlsConnector, ServerName<'static>)> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(certs) => {
            for cert in certs {
                roots.add(cert.clone()).map_err(|_| {
                    Error::Config("tls.ca holds a certificate that can't be used as a CA".into())
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|_| Error::Internal("no TLS protocol version is available"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let name = ServerName::try_from(host.to_string())
        .map_err(|_| Error::Config("the URL's host is not a valid TLS server name".into()))?;
    Ok((TlsConnector::from(Arc::new(config)), name))
}

/// The one mapping from the Redis client's errors to the store's. Text from
/// outside is redacted by the store before it reaches a message.
pub fn classify(error: &RedisError, stage: Stage) -> Error {
    if let Some(code) = error.code() {
        return server_error(code, error.detail(), stage);
    }
    match error.kind() {
        redis::ErrorKind::AuthenticationFailed => Error::Auth(error.to_string()),
        redis::ErrorKind::InvalidClientConfig => {
            Error::Config(format!("the Redis client refused the settings: {error}"))
        }
        _ => Error::Connection(match stage {
            Stage::Connect => format!("could not connect to Redis: {error}"),
            Stage::Sent => format!(
                "the connection to Redis failed ({error}); the hit was not sent again and may or may not have counted"
            ),
        }),
    }
}

/// An error answered by the server, by its code.
pub fn server_error(code: &str, detail: Option<&str>, stage: Stage) -> Error {
    let text = || match detail {
        Some(detail) => format!("{code} {detail}"),
        None => code.to_string(),
    };
    match code {
        "COUNTRANGE" => Error::CountOutOfRange,
        "NOAUTH" | "WRONGPASS" | "NOPERM" => Error::Auth(text()),
        // AUTH with a password to a server that has none answers a plain ERR.
        "ERR" if stage == Stage::Connect && detail.is_some_and(|d| d.contains("AUTH")) => {
            Error::Auth(text())
        }
        _ => Error::Redis(text()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_by_code() {
        assert_eq!(
            server_error("COUNTRANGE", Some("x"), Stage::Sent),
            Error::CountOutOfRange
        );
        assert_eq!(
            server_error("WRONGPASS", Some("invalid pair"), Stage::Connect).code(),
            "ERR_AUTH"
        );
        assert_eq!(server_error("NOAUTH", None, Stage::Sent).code(), "ERR_AUTH");
        let no_password = Some("AUTH <password> called without any password configured");
        assert_eq!(
            server_error("ERR", no_password, Stage::Connect).code(),
            "ERR_AUTH"
        );
        assert_eq!(
            server_error("ERR", no_password, Stage::Sent).code(),
            "ERR_REDIS"
        );
        let oom = server_error("OOM", Some("command not allowed"), Stage::Sent);
        assert_eq!(oom, Error::Redis("OOM command not allowed".into()));
    }

    #[test]
    fn client_errors_by_kind_and_stage() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let connect = classify(&io, Stage::Connect);
        assert_eq!(connect.code(), "ERR_CONNECTION");
        assert!(connect.to_string().contains("could not connect"));
        let sent = classify(&io, Stage::Sent).to_string();
        assert!(sent.contains("may or may not have counted"), "{sent}");
        let auth = RedisError::from((redis::ErrorKind::AuthenticationFailed, "refused"));
        assert_eq!(classify(&auth, Stage::Connect).code(), "ERR_AUTH");
    }
}
