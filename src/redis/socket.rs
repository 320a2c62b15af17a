//! The connection engine's socket: opened and greeted (TLS handshake, AUTH,
//! SELECT) by blocking calls on a short-lived thread of its own, then handed
//! to its host non-blocking (the JS thread's event loop, or a tokio task on
//! the I/O thread), where every read and write is a single non-blocking call
//! made when the host says the socket is ready.

mod sentinel;

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection};

use super::config::{Addr, Config, Deployment};
use super::resp::{self, Parser, Value};
use crate::errors::{Error, Result};

/// A TLS client configuration that trusts `ca` if given, else the public roots.
pub fn tls_config(ca: Option<&[CertificateDer<'static>]>) -> Result<Arc<ClientConfig>> {
    let config = crate::tls::client_config(crate::tls::Check::Identity, ca, Error::Config)?;
    Ok(Arc::new(config))
}

/// The TLS name of `host`.
pub fn server_name(host: &str) -> Result<ServerName<'static>> {
    ServerName::try_from(host.to_string())
        .map_err(|_| Error::Config("the URL's host is not a valid TLS server name".into()))
}

enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixStream),
}

impl Stream {
    fn io(&mut self) -> &mut dyn ReadWrite {
        match self {
            Stream::Tcp(s) => s,
            #[cfg(unix)]
            Stream::Unix(s) => s,
        }
    }

    fn set_timeouts(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s
                .set_read_timeout(timeout)
                .and(s.set_write_timeout(timeout)),
            #[cfg(unix)]
            Stream::Unix(s) => s
                .set_read_timeout(timeout)
                .and(s.set_write_timeout(timeout)),
        }
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(true),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_nonblocking(true),
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// An open, greeted connection to one server.
pub struct Socket {
    stream: Stream,
    tls: Option<ClientConnection>,
}

/// What a connect needs, made once per store.
pub struct Target {
    config: Config,
    tls: Option<(Arc<ClientConfig>, ServerName<'static>)>,
    /// Sentinel over TLS (`rediss+sentinel://`): the TLS settings of the
    /// sentinels and of the master they name, each checked by its own name.
    sentinel_tls: Option<Arc<ClientConfig>>,
    /// Sentinel: the `+switch-master` announcements heard for the master.
    switches: Arc<sentinel::Switches>,
}

impl Target {
    pub fn new(config: &Config) -> Result<Target> {
        let mut sentinel_tls = None;
        let tls = match &config.deployment {
            Deployment::Server(Addr::Tcp {
                host, tls: true, ..
            }) => Some((tls_config(config.tls_ca.as_deref())?, server_name(host)?)),
            Deployment::Server(Addr::Unix(_)) if !cfg!(unix) => {
                return Err(Error::Config(
                    "redis+unix:// URLs need a Unix socket, which this platform lacks".into(),
                ))
            }
            Deployment::Server(_) => None,
            Deployment::Sentinel(sentinels) => {
                if sentinels.tls {
                    // Every sentinel's name is checked now, not at its turn.
                    for (host, _) in &sentinels.nodes {
                        sentinel::sentinel_name(host)?;
                    }
                    sentinel_tls = Some(tls_config(config.tls_ca.as_deref())?);
                }
                None
            }
            // A cluster's connections are to its nodes, each a server of its own.
            Deployment::Cluster { .. } | Deployment::Rest { .. } => return Err(NOT_ONE_SERVER),
        };
        Ok(Target {
            config: config.clone(),
            tls,
            sentinel_tls,
            switches: Arc::default(),
        })
    }

    /// A target found through Sentinel: a sentinel, or the master one named,
    /// with TLS if the Sentinel URL is `rediss+sentinel://`.
    fn found(config: Config, tls: Option<(Arc<ClientConfig>, ServerName<'static>)>) -> Target {
        Target {
            config,
            tls,
            sentinel_tls: None,
            switches: Arc::default(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Connects and greets the server within `timeout`, blocking; the
    /// socket it answers is non-blocking, for the event loop.
    pub fn connect(&self, timeout: Duration) -> Result<Socket> {
        self.watch_switches();
        let socket = self.connect_blocking(timeout)?;
        let failed = |e: io::Error| unsent(format!("could not connect to Redis: {e}"));
        socket.stream.set_timeouts(None).map_err(failed)?;
        socket.stream.set_nonblocking().map_err(failed)?;
        Ok(socket)
    }

    /// Connects and greets the server within `timeout`; the socket it
    /// answers blocks, each read and write for at most `timeout`.
    pub fn connect_blocking(&self, timeout: Duration) -> Result<Socket> {
        let addr = match &self.config.deployment {
            Deployment::Server(addr) => addr,
            Deployment::Sentinel(sentinels) => {
                return self
                    .connect_master(sentinels, timeout)
                    .map(|(socket, _, _)| socket)
            }
            Deployment::Cluster { .. } | Deployment::Rest { .. } => return Err(NOT_ONE_SERVER),
        };
        let deadline = Instant::now() + timeout;
        let left = || {
            deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or(Error::Timeout {
                    ms: timeout.as_millis() as u64,
                    sent: false,
                })
        };
        let failed = |e: io::Error| match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Error::Timeout {
                ms: timeout.as_millis() as u64,
                sent: false,
            },
            _ => unsent(format!("could not connect to Redis: {e}")),
        };
        let stream = match addr {
            Addr::Tcp { host, port, .. } => {
                let addrs = (host.as_str(), *port).to_socket_addrs().map_err(failed)?;
                let mut last = io::Error::new(io::ErrorKind::NotFound, "the host has no address");
                let mut connected = None;
                for addr in addrs {
                    match TcpStream::connect_timeout(&addr, left()?) {
                        Ok(tcp) => {
                            connected = Some(tcp);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                let tcp = connected.ok_or_else(|| failed(last))?;
                tcp.set_nodelay(true).map_err(failed)?;
                Stream::Tcp(tcp)
            }
            #[cfg(unix)]
            Addr::Unix(path) => {
                Stream::Unix(std::os::unix::net::UnixStream::connect(path).map_err(failed)?)
            }
            #[cfg(not(unix))]
            Addr::Unix(_) => {
                return Err(Error::Config(
                    "redis+unix:// URLs need a Unix socket, which this platform lacks".into(),
                ))
            }
        };
        stream.set_timeouts(Some(left()?)).map_err(failed)?;
        let mut socket = Socket {
            stream,
            tls: match &self.tls {
                Some((config, name)) => Some(
                    ClientConnection::new(Arc::clone(config), name.clone())
                        .map_err(|e| unsent(format!("could not start TLS: {e}")))?,
                ),
                None => None,
            },
        };
        if let Some(tls) = &mut socket.tls {
            while tls.is_handshaking() {
                tls.complete_io(&mut socket.stream.io())
                    .map_err(|e| match e.kind() {
                        io::ErrorKind::InvalidData => unsent(format!("{HANDSHAKE_FAILED}: {e}")),
                        _ => failed(e),
                    })?;
            }
        }
        socket.greet(&self.config).map_err(|e| match e {
            GreetError::Io(e) => failed(e),
            GreetError::Refused(e) => e,
        })?;
        socket.stream.set_timeouts(Some(timeout)).map_err(failed)?;
        Ok(socket)
    }
}

/// A connection is to one server (or the master Sentinel names): a cluster's
/// and the REST API's are made above it, so this is never answered to a user.
const NOT_ONE_SERVER: Error =
    Error::Internal("a connection was asked of a cluster or the REST API");

/// How the message of a failed TLS handshake starts (the peer's certificate
/// not trusted, or not for its name).
const HANDSHAKE_FAILED: &str = "the TLS handshake with Redis failed";

/// A connect's failure: no hit was sent on it.
fn unsent(text: String) -> Error {
    Error::Connection { text, sent: false }
}

enum GreetError {
    Io(io::Error),
    Refused(Error),
}

impl From<io::Error> for GreetError {
    fn from(e: io::Error) -> Self {
        GreetError::Io(e)
    }
}

/// The socket a host holds while a connection is up; an I/O error
/// (`NotConnected`) when it holds none, for the engine to treat as a loss.
pub fn held(socket: &mut Option<Box<Socket>>) -> io::Result<&mut Socket> {
    socket
        .as_deref_mut()
        .ok_or_else(|| io::ErrorKind::NotConnected.into())
}

impl Socket {
    /// AUTH and SELECT, then PING, with blocking reads, before the socket
    /// is handed on: a connect succeeds only once the server has answered,
    /// so an endpoint that accepts and closes (or never answers) fails the
    /// connect, and no hit is sent to it.
    fn greet(&mut self, config: &Config) -> std::result::Result<(), GreetError> {
        let mut out = Vec::new();
        let mut expected = 1;
        if let Some(password) = &config.password {
            match &config.username {
                Some(user) => {
                    resp::encode(&mut out, &[b"AUTH", user.as_bytes(), password.as_bytes()])
                }
                None => resp::encode(&mut out, &[b"AUTH", password.as_bytes()]),
            }
            expected += 1;
        }
        if config.db != 0 {
            resp::encode(&mut out, &[b"SELECT", config.db.to_string().as_bytes()]);
            expected += 1;
        }
        resp::encode(&mut out, &[b"PING"]);
        self.write_all_blocking(&out)?;
        let mut parser = Parser::default();
        let mut buf = [0u8; 4096];
        while expected > 0 {
            match parser
                .next()
                .map_err(|_| GreetError::Refused(unsent("Redis answered out of protocol".into())))?
            {
                Some(Value::Error(code, detail)) => {
                    return Err(GreetError::Refused(super::reply::server_error(
                        &code,
                        Some(&detail),
                        super::reply::Stage::Connect,
                    )))
                }
                Some(_) => expected -= 1,
                None => {
                    let n = self.read_blocking(&mut buf)?;
                    if n == 0 {
                        return Err(GreetError::Io(io::ErrorKind::UnexpectedEof.into()));
                    }
                    parser.feed(&buf[..n]);
                }
            }
        }
        Ok(())
    }

    /// Sends one command on a blocking socket and answers its reply (an
    /// error reply as the error it names).
    pub fn command(&mut self, args: &[Vec<u8>], timeout_ms: u64) -> Result<Value> {
        let parts: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let mut out = Vec::new();
        resp::encode(&mut out, &parts);
        let failed = |e: io::Error| match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Error::Timeout {
                ms: timeout_ms,
                sent: true,
            },
            _ => Error::Connection {
                text: format!(
                    "the connection to Redis failed ({e}); the command may or may not have run"
                ),
                sent: true,
            },
        };
        self.write_all_blocking(&out).map_err(failed)?;
        let mut parser = Parser::default();
        let mut buf = [0u8; 16 * 1024];
        loop {
            match parser.next() {
                Err(_) => return Err(failed(io::ErrorKind::InvalidData.into())),
                Ok(Some(Value::Error(code, detail))) => {
                    return Err(super::reply::server_error(
                        &code,
                        Some(&detail),
                        super::reply::Stage::Sent,
                    ))
                }
                Ok(Some(reply)) => return Ok(reply),
                Ok(None) => match self.read_blocking(&mut buf).map_err(failed)? {
                    0 => return Err(failed(io::ErrorKind::UnexpectedEof.into())),
                    n => parser.feed(&buf[..n]),
                },
            }
        }
    }

    fn write_all_blocking(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.tls {
            None => self.stream.io().write_all(bytes),
            Some(tls) => {
                tls.writer().write_all(bytes)?;
                while tls.wants_write() {
                    tls.write_tls(self.stream.io())?;
                }
                Ok(())
            }
        }
    }

    fn read_blocking(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.tls {
            None => self.stream.io().read(buf),
            Some(tls) => loop {
                match tls.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if tls.read_tls(self.stream.io())? == 0 {
                    return Ok(0);
                }
                tls.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            },
        }
    }

    /// The OS handle the event loop watches.
    #[cfg(unix)]
    pub fn raw(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match &self.stream {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }

    #[cfg(windows)]
    pub fn raw(&self) -> std::os::windows::io::RawSocket {
        use std::os::windows::io::AsRawSocket;
        match &self.stream {
            Stream::Tcp(s) => s.as_raw_socket(),
        }
    }

    /// Writes what it can of `out` without blocking and removes it from
    /// `out`. True when nothing is left to write (TLS records included).
    pub fn write(&mut self, out: &mut Vec<u8>) -> io::Result<bool> {
        match &mut self.tls {
            None => {
                let mut written = 0;
                let result = loop {
                    if written == out.len() {
                        break Ok(true);
                    }
                    match self.stream.io().write(&out[written..]) {
                        Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => written += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(false),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(e),
                    }
                };
                out.drain(..written);
                result
            }
            Some(tls) => {
                // rustls takes as much plaintext as its buffer allows.
                let taken = tls.writer().write(out)?;
                out.drain(..taken);
                while tls.wants_write() {
                    match tls.write_tls(self.stream.io()) {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(out.is_empty())
            }
        }
    }

    /// Reads all that has arrived into `parser` without blocking. False
    /// once the server has closed the connection.
    pub fn read(&mut self, parser: &mut Parser) -> io::Result<bool> {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match &mut self.tls {
                None => match self.stream.io().read(&mut buf) {
                    Ok(0) => return Ok(false),
                    // A read that did not fill the buffer took all there
                    // was: the loop (level-triggered) calls again if more
                    // comes, so no read is spent only to hear "would block".
                    Ok(n) if n < buf.len() => {
                        parser.feed(&buf[..n]);
                        return Ok(true);
                    }
                    Ok(n) => parser.feed(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                },
                Some(tls) => {
                    let read = match tls.read_tls(self.stream.io()) {
                        Ok(0) => return Ok(false),
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    };
                    let state = tls
                        .process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    let mut plain = state.plaintext_bytes_to_read();
                    while plain > 0 {
                        let n = tls.reader().read(&mut buf)?;
                        parser.feed(&buf[..n]);
                        plain -= n;
                    }
                    if state.peer_has_closed() {
                        return Ok(false);
                    }
                    // rustls reads at most one buffer (4 KiB or more) per call.
                    if read < 4096 {
                        return Ok(true);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::config::Options;
    use std::net::TcpListener;

    #[test]
    fn a_connect_gives_a_socket_that_writes_a_command_and_reads_its_reply() {
        // A server that answers the connect's PING with PONG and an ECHO with its word, then closes.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut parser = Parser::default();
            let mut buf = [0u8; 4096];
            for _ in 0..2 {
                let parts = loop {
                    if let Some(Value::Array(Some(parts))) = parser.next().unwrap() {
                        break parts;
                    }
                    let n = stream.read(&mut buf).unwrap();
                    parser.feed(&buf[..n]);
                };
                let reply = match parts.as_slice() {
                    [Value::Bulk(Some(w))] if w == b"PING" => b"+PONG\r\n".to_vec(),
                    [_, Value::Bulk(Some(word))] => {
                        [format!("${}\r\n", word.len()).as_bytes(), word, b"\r\n"].concat()
                    }
                    _ => b"-ERR unexpected\r\n".to_vec(),
                };
                stream.write_all(&reply).unwrap();
            }
        });
        let options = Options {
            url: Some(format!("redis://127.0.0.1:{port}")),
            timeout_ms: Some(5_000),
            ..Options::default()
        };
        let config = Config::resolve(&options, |_| None).unwrap();
        let target = Target::new(&config).unwrap();
        let mut socket = target.connect(Duration::from_secs(5)).unwrap();
        let mut out = Vec::new();
        resp::encode(&mut out, &[b"ECHO", b"hi"]);
        while !socket.write(&mut out).unwrap() {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(out.is_empty(), "what was written is taken out");
        let mut parser = Parser::default();
        let mut reply = None;
        for _ in 0..2_000 {
            assert!(socket.read(&mut parser).unwrap(), "still open");
            reply = parser.next().unwrap();
            if reply.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(reply, Some(Value::Bulk(Some(b"hi".to_vec()))));
        server.join().unwrap();
        // The server closed: a read says so.
        let mut open = true;
        for _ in 0..2_000 {
            open = socket.read(&mut parser).unwrap_or(false);
            if !open {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!open);
    }
}
