//! One multiplexed connection per target: opened by the first hit that
//! needs it (concurrent hits share one connect), dropped when it fails, when
//! the server answers that it was demoted, or when it stops answering (see
//! [`Stall`]), so that a server that is paused, behind a half-open socket or
//! no longer a primary never leaves the store failing. After a failed
//! connect, hits reject at once for a while ([`Backoff`]) and one at a time
//! tries again. Nothing here sends a command again: a hit that was sent may
//! have counted.
//!
//! The socket (TCP, TLS through rustls with ring, or a Unix socket) is opened
//! here, resolving the host name on every connect (a failover that moves a
//! DNS name is followed), and the Redis client's connection task is run here
//! too, so a connection that ends is noticed at once, even with no hit in
//! flight.
//!
//! Each link tells its [`Monitor`] what its connection does: a connect, a
//! failed connect, an open connection lost (with the code its calls met).

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisConnectionInfo, RedisError};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::AbortHandle;
use tokio_rustls::TlsConnector;

use super::calls::{Loaded, Query};
use super::config::{Addr, Config};
use super::fence::{Fence, Verdict};
use super::health::{Backoff, Gate, Mark, Stall};
use super::reply::{server_error, Reply, Stage};
use super::socket;
use super::stats::Monitor;
use crate::errors::{Error, Result};
use crate::ops::Op;

/// The code of a lost connection's calls (`Error::Connection`).
const CONNECTION: &str = "ERR_CONNECTION";

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
    /// Sentinel: the target's epoch when the connect started (see
    /// [`socket::Target::epoch`]); a later one replaces the connection.
    epoch: u64,
    backoff: Backoff,
}

enum Target {
    Tcp {
        host: String,
        port: u16,
        tls: Option<(TlsConnector, ServerName<'static>)>,
    },
    Unix(PathBuf),
    /// Redis Sentinel: each connect asks the sentinels where the master is
    /// (a blocking discovery, on a thread of the runtime's blocking pool).
    /// Over TLS the discovery checks the master on a connection of its own,
    /// and the client then opens its TLS connection there.
    Sentinel(Arc<socket::Target>),
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub struct Link {
    target: Target,
    settings: RedisConnectionInfo,
    timeout: Duration,
    state: Mutex<State>,
    stall: Stall,
    /// The generation of a connection that has answered nothing yet (0:
    /// none): dropped before it answers, it counts as a failed connect.
    fresh: AtomicU64,
    /// Counts connects and losses, and tells them to the stores.
    monitor: Arc<Monitor>,
    /// The scripts the connection of this generation has sent as EVAL.
    loaded: Mutex<(u64, Loaded)>,
    /// The pipelines written here while an older one is still out.
    written: Mutex<Written>,
    /// `waitForReplicas`: the `WAIT` that follows the calls' writes.
    fence: Option<Fence>,
    /// The `WAIT`s on this generation's connection.
    rounds: Mutex<Rounds>,
    /// Wakes the calls waiting for a round when one answers.
    round_done: tokio::sync::Notify,
}

/// What a `WAIT` on the I/O thread came to, for every call it covered.
#[derive(Clone, Debug)]
pub enum Confirmation {
    /// Its reply, read.
    Verdict(Verdict),
    /// The connection failed before it answered.
    Failed(RedisError),
    /// No answer in the `WAIT`'s time and the link's timeout after it.
    TimedOut,
}

/// `waitForReplicas` on one connection: one `WAIT` out at a time, each
/// serving the calls whose answers came in before it started (see
/// [`Link::confirm`]); the calls answered while one is out wait for the next.
#[derive(Default)]
struct Rounds {
    /// The connection these are on.
    generation: u64,
    /// Rounds (`WAIT`s) started on it; the last one is out while `out`.
    started: u64,
    out: bool,
    /// The earliest deadline of the calls waiting for the next round.
    earliest: Option<Instant>,
    /// The last round that answered, and what it came to.
    said: Option<(u64, Confirmation)>,
}

/// The keys of the pipelines written on a link, in order, kept from the
/// oldest one still out: a pipeline that meets NOSCRIPT tells from them
/// whether a later one named its key (see [`Link::named_after`]).
#[derive(Default)]
struct Written {
    next: u64,
    /// Each pipeline's number, its keys' hashes, and whether it is done.
    log: VecDeque<(u64, Vec<u64>, bool)>,
}

/// A pipeline written on a link, until it is done (dropped).
pub struct Out<'a> {
    link: &'a Link,
    id: u64,
}

impl Drop for Out<'_> {
    fn drop(&mut self) {
        let mut written = self.link.written();
        if let Some(entry) = written.log.iter_mut().find(|e| e.0 == self.id) {
            entry.2 = true;
        }
        while written.log.front().is_some_and(|e| e.2) {
            written.log.pop_front();
        }
    }
}

fn key_hash(key: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

impl Link {
    fn written(&self) -> MutexGuard<'_, Written> {
        // Every change leaves the log whole, so a poisoned lock is still usable.
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a pipeline of `ops` about to be written (call it right before
    /// the pipeline's first poll, which writes it); it counts as out until
    /// the answer is dropped. A PING names no key.
    pub fn out<'q>(&self, ops: impl Iterator<Item = Query<'q>>) -> Out<'_> {
        let keys = ops.filter(|q| q.op != Op::Ping);
        let keys = keys.flat_map(|q| q.keys().map(key_hash).collect::<Vec<_>>());
        let keys = keys.collect();
        let mut written = self.written();
        written.next += 1;
        let id = written.next;
        written.log.push_back((id, keys, false));
        Out { link: self, id }
    }

    /// Whether a pipeline written after `out` (still out or done since) named
    /// `key`. After a SCRIPT FLUSH another client may load the script between
    /// the two: an op of `out` that met NOSCRIPT, sent again, could take
    /// effect after that pipeline's op on its key, so it is not sent again.
    pub fn named_after(&self, out: &Out<'_>, key: &[u8]) -> bool {
        let hash = key_hash(key);
        let written = self.written();
        written
            .log
            .iter()
            .filter(|e| e.0 > out.id)
            .any(|e| e.1.contains(&hash))
    }

    pub fn new(config: &Config, monitor: Arc<Monitor>) -> Result<Link> {
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
            Addr::Rest { .. } => {
                return Err(Error::Internal(
                    "a REST URL was given to the Redis protocol",
                ))
            }
            Addr::Sentinel { .. } => Target::Sentinel(Arc::new(socket::Target::new(config)?)),
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
            fence: config.fence(),
            target,
            settings,
            timeout: Duration::from_millis(config.timeout_ms),
            state: Mutex::new(State {
                conn: Conn::Down,
                generation: 0,
                epoch: 0,
                backoff: Backoff::new(RandomState::new().hash_one(config.timeout_ms)),
            }),
            stall: Stall::default(),
            fresh: AtomicU64::new(0),
            monitor,
            loaded: Mutex::default(),
            written: Mutex::default(),
            rounds: Mutex::default(),
            round_done: tokio::sync::Notify::new(),
        })
    }

    /// The fence (`WAIT`) the calls' writes go through, if `waitForReplicas` asks for one.
    pub fn fence(&self) -> Option<Fence> {
        self.fence
    }

    fn rounds(&self, generation: u64) -> MutexGuard<'_, Rounds> {
        // Each change leaves the rounds whole, so a poisoned lock is still usable.
        let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
        if rounds.generation < generation {
            // A new connection: a `WAIT` on it covers nothing of the old one.
            *rounds = Rounds {
                generation,
                ..Rounds::default()
            };
        }
        rounds
    }

    /// Waits, within `deadline`, for a `WAIT` written on `conn` (the
    /// connection of `generation`) after this call's answers came in, and
    /// answers what it came to. A reply read means its command was on the
    /// wire before anything queued since, so a round started after the
    /// call's answers came in covers its writes; one started before may
    /// not (the client may queue a command after the round's `WAIT` though
    /// it was handed over first). One `WAIT` is out at a time; the first
    /// call to need one lets the calls answered in the same read join it
    /// before it starts, and its time is cut to answer before the earliest
    /// deadline among them.
    pub async fn confirm(
        self: &Arc<Self>,
        fence: Fence,
        generation: u64,
        conn: &MultiplexedConnection,
        deadline: Instant,
    ) -> Confirmation {
        let target = {
            let mut rounds = self.rounds(generation);
            if rounds.generation == generation {
                rounds.earliest = Some(rounds.earliest.map_or(deadline, |e| e.min(deadline)));
            }
            rounds.started + 1
        };
        let mut gathered = false;
        loop {
            let notified = self.round_done.notified();
            tokio::pin!(notified);
            let gather = {
                let mut rounds = self.rounds(generation);
                // Enabled under the lock a `WAIT` takes to finish: no wake-up is missed.
                notified.as_mut().enable();
                if rounds.generation != generation {
                    // Its connection was replaced (and closed): no `WAIT` can follow its writes.
                    return Confirmation::Failed(RedisError::from(std::io::Error::other(
                        "the connection was replaced before the call's WAIT answered",
                    )));
                }
                if let Some((round, said)) = &rounds.said {
                    if *round >= target {
                        return said.clone();
                    }
                }
                let due = !rounds.out && rounds.started < target;
                if due && gathered {
                    self.start_round(&mut rounds, fence, (generation, target), conn);
                }
                due && !gathered
            };
            if gather {
                // The tasks of the other calls answered in the same read run first.
                gathered = true;
                tokio::task::yield_now().await;
                continue;
            }
            if tokio::time::timeout_at(deadline.into(), notified)
                .await
                .is_err()
            {
                return Confirmation::TimedOut;
            }
        }
    }

    /// Starts round `target`: a task of its own sends its `WAIT` and
    /// answers for every call waiting for it, whichever of them gives up
    /// first.
    fn start_round(
        self: &Arc<Self>,
        rounds: &mut Rounds,
        fence: Fence,
        (generation, target): (u64, u64),
        conn: &MultiplexedConnection,
    ) {
        let now = Instant::now();
        // A deadline passed is a call's that gave up.
        let earliest = rounds.earliest.take().filter(|at| *at > now);
        let ms = fence.wait_ms(now, earliest);
        rounds.started = target;
        rounds.out = true;
        let (link, conn) = (Arc::clone(self), conn.clone());
        tokio::spawn(async move {
            let said = link.wait(fence, ms, &conn).await;
            let mut rounds = link.rounds(generation);
            if rounds.generation == generation {
                rounds.out = false;
                rounds.said = Some((target, said));
            }
            drop(rounds);
            link.round_done.notify_waiters();
        });
    }

    /// Sends `WAIT replicas ms` on `conn`; gives up `timeout` after `ms`.
    async fn wait(&self, fence: Fence, ms: u64, conn: &MultiplexedConnection) -> Confirmation {
        let mut wait = redis::cmd("WAIT");
        wait.arg(fence.replicas).arg(ms);
        let mut conn = conn.clone();
        let limit = Duration::from_millis(ms) + self.timeout;
        match tokio::time::timeout(limit, conn.send_packed_command(&wait)).await {
            Ok(Ok(value)) => Confirmation::Verdict(fence.verdict(read(&value), ms)),
            Ok(Err(e)) => Confirmation::Failed(e),
            Err(_) => Confirmation::TimedOut,
        }
    }

    /// The host name this link connects to (empty for a Unix socket).
    pub fn host(&self) -> &str {
        match &self.target {
            Target::Tcp { host, .. } => host,
            Target::Unix(_) | Target::Sentinel(_) => "",
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent at every step, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection, opening it if there is none (unless backing off),
    /// and its generation. Must run on the runtime: a connect is a task of
    /// its own, so that it finishes (and times out) even if the hit that
    /// started it gave up.
    pub async fn connection(self: &Arc<Self>) -> Result<(MultiplexedConnection, u64)> {
        let mut switched = false;
        let (connecting, generation) = {
            let mut state = self.lock();
            let epoch = match &self.target {
                Target::Sentinel(target) => target.epoch(),
                _ => 0,
            };
            if let Conn::Up(conn, task) = &state.conn {
                if state.epoch == epoch {
                    return Ok((conn.clone(), state.generation));
                }
                // The sentinels announced a new master: this hit and the
                // next go to it. Hits still on the old connection reject.
                task.abort();
                state.conn = Conn::Down;
                switched = true;
            }
            match (state.backoff.gate(Instant::now()), &state.conn) {
                (Gate::Refuse(e), _) => return Err(e),
                (_, Conn::Connecting(connecting)) => (connecting.clone(), state.generation),
                (_, _) => {
                    state.epoch = epoch;
                    state.generation += 1;
                    let connecting = self.connect(state.generation);
                    state.conn = Conn::Connecting(connecting.clone());
                    (connecting, state.generation)
                }
            }
        };
        if switched {
            // Told with the state unlocked: the monitor wakes the stores.
            self.monitor.lost(CONNECTION);
        }
        Ok((connecting.await?, generation))
    }

    fn connect(self: &Arc<Self>, generation: u64) -> Connecting {
        let link = Arc::clone(self);
        let task = tokio::spawn(async move {
            let result = match tokio::time::timeout(link.timeout, link.open()).await {
                Ok(Ok((conn, driver))) => {
                    // The task holds the link weakly: a link nobody holds closes its socket.
                    let weak = Arc::downgrade(&link);
                    let task = tokio::spawn(async move {
                        driver.await;
                        if let Some(link) = Weak::upgrade(&weak) {
                            link.drop_connection(generation, None, CONNECTION);
                        }
                    });
                    Ok((conn, task.abort_handle()))
                }
                Ok(Err(e)) => Err(e),
                Err(_) => Err(Error::Timeout {
                    ms: link.timeout.as_millis() as u64,
                    sent: false,
                }),
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
    async fn open(&self) -> Result<(MultiplexedConnection, BoxFuture<'static, ()>)> {
        let master = match &self.target {
            Target::Sentinel(target) => {
                let (target, timeout) = (Arc::clone(target), self.timeout);
                let master =
                    tokio::task::spawn_blocking(move || target.connect_master_for_client(timeout))
                        .await
                        .map_err(|_| Error::Internal("the Sentinel discovery task failed"))??;
                Some(master)
            }
            _ => None,
        };
        self.open_on(master)
            .await
            .map_err(|e| classify(&e, Stage::Connect))
    }

    /// Opens the socket (or takes the master's, found through Sentinel) and
    /// greets the server over it.
    async fn open_on(
        &self,
        master: Option<socket::Master>,
    ) -> redis::RedisResult<(MultiplexedConnection, BoxFuture<'static, ()>)> {
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
            Target::Sentinel(_) => match master {
                Some(socket::Master::Tcp(tcp)) => Box::new(TcpStream::from_std(tcp)?),
                Some(socket::Master::Tls {
                    host,
                    port,
                    config,
                    name,
                }) => {
                    let tcp = TcpStream::connect((host.as_str(), port)).await?;
                    tcp.set_nodelay(true)?;
                    Box::new(TlsConnector::from(config).connect(name, tcp).await?)
                }
                None => return Err(std::io::Error::other("no master was found").into()),
            },
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
        if state.generation != generation {
            // Only a connect starts a generation, and this one has not settled.
            if let Ok((_, task)) = result {
                task.abort();
            }
            return Err(Error::Internal("a connect settled out of turn"));
        }
        let settled = match result {
            Ok((conn, task)) => {
                state.conn = Conn::Up(conn.clone(), task);
                self.stall.reset();
                self.fresh.store(generation, Ordering::Relaxed);
                Ok(conn)
            }
            Err(e) => {
                state.conn = Conn::Down;
                state.backoff.failed(Instant::now(), e.clone());
                Err(e)
            }
        };
        // Told with the state unlocked: the monitor wakes the stores.
        drop(state);
        match &settled {
            Ok(_) => {
                self.monitor.opened();
                self.monitor.up();
            }
            Err(_) => self.monitor.connect_failed(),
        }
        settled
    }

    fn loaded(&self, generation: u64) -> MutexGuard<'_, (u64, Loaded)> {
        // A set of addresses is whole at every step.
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if loaded.0 != generation {
            // A new connection, perhaps to a server that never ran a script.
            *loaded = (generation, Loaded::default());
        }
        loaded
    }

    /// For each op about to go on this generation's connection: whether it
    /// goes as EVAL (its script's first use there).
    pub fn first_uses(&self, generation: u64, ops: impl Iterator<Item = Op>) -> Vec<bool> {
        self.loaded(generation).1.first_uses(ops)
    }

    /// The server answered NOSCRIPT (its cache was flushed): these ops go
    /// again as EVAL, which loads their scripts.
    pub fn flushed(&self, generation: u64, ops: impl Iterator<Item = Op>) {
        self.loaded(generation).1.reloaded(ops);
    }

    /// What the connection has answered so far: taken before hits are sent.
    pub fn mark(&self) -> Mark {
        self.stall.mark()
    }

    /// Hits sent on this generation's connection got their answers.
    pub fn answered(&self, generation: u64) {
        self.stall.answered();
        if self.fresh.load(Ordering::Relaxed) == generation
            && self
                .fresh
                .compare_exchange(generation, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.lock().backoff.succeeded();
        }
    }

    /// Hits sent at `sent` on this generation's connection timed out.
    pub fn timed_out(&self, generation: u64, sent: Mark, hits: usize) {
        if self.stall.timed_out(sent, hits) {
            self.drop_connection(generation, None, "ERR_TIMEOUT");
        }
    }

    /// The connection of this generation failed while hits were on it.
    pub fn failed(&self, generation: u64) {
        self.drop_connection(generation, None, CONNECTION);
    }

    /// The server answered that it no longer takes writes (`error`): the
    /// connection is dropped, and the next connect waits as after a failed one.
    pub fn demoted(&self, generation: u64, error: Error) {
        let code = error.code();
        self.drop_connection(generation, Some(error), code);
    }

    /// The connection of this generation is closed (hits still on it
    /// reject) and the next hit opens a new one: a loss, told with `code`.
    /// A failure, or a connection that answered nothing, counts as a failed
    /// connect for the backoff.
    fn drop_connection(&self, generation: u64, failure: Option<Error>, code: &'static str) {
        let mut state = self.lock();
        if state.generation != generation {
            return;
        }
        if let Conn::Up(_, task) = &state.conn {
            task.abort();
            state.conn = Conn::Down;
            let unanswered = self
                .fresh
                .compare_exchange(generation, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
            let failure = failure.or_else(|| {
                unanswered.then(|| Error::Connection {
                    text: "a new connection to Redis ended before it answered".into(),
                    sent: false,
                })
            });
            if let Some(e) = failure {
                state.backoff.failed(Instant::now(), e);
            }
            drop(state);
            self.monitor.lost(code);
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Nobody holds the link: its socket closes now.
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Conn::Up(_, task) = &state.conn {
            task.abort();
        }
    }
}

/// A TLS connector for `host` that trusts `ca` if given, else the public roots.
fn tls_connector(
    host: &str,
    ca: Option<&[rustls::pki_types::CertificateDer<'static>]>,
) -> Result<(TlsConnector, ServerName<'static>)> {
    Ok((
        TlsConnector::from(socket::tls_config(ca)?),
        socket::server_name(host)?,
    ))
}

/// A reply from the `redis` crate as every transport reads it.
pub fn read(value: &redis::Value) -> Reply<'_> {
    use redis::Value;
    match value {
        Value::Array(items) => Reply::Array(
            items
                .iter()
                .map(|v| match v {
                    Value::Int(n) => Some(*n),
                    _ => None,
                })
                .collect(),
        ),
        Value::Int(n) => Reply::Int(*n),
        Value::ServerError(e) => Reply::Error(e.code(), e.details()),
        _ => Reply::Other,
    }
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
        _ => Error::Connection {
            text: match stage {
                Stage::Connect => format!("could not connect to Redis: {error}; the hit was not sent"),
                Stage::Sent => format!(
                    "the connection to Redis failed ({error}); the hit was sent, is not sent again, and may or may not have counted"
                ),
            },
            sent: stage == Stage::Sent,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_by_kind_and_stage() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let connect = classify(&io, Stage::Connect);
        assert_eq!(
            (connect.code(), connect.sent()),
            ("ERR_CONNECTION", Some(false))
        );
        assert_eq!(classify(&io, Stage::Sent).sent(), Some(true));
        assert!(connect.to_string().contains("could not connect"));
        let sent = classify(&io, Stage::Sent).to_string();
        assert!(sent.contains("may or may not have counted"), "{sent}");
        let auth = RedisError::from((redis::ErrorKind::AuthenticationFailed, "refused"));
        assert_eq!(classify(&auth, Stage::Connect).code(), "ERR_AUTH");
    }
}
