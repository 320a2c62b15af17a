//! Upstash's REST API as a transport: each command a JSON array of strings,
//! `Authorization: Bearer <token>`, the hits of a batch sent together as one
//! POST to `/pipeline`, answered by one `{ "result" }` or `{ "error" }` per
//! command. The scripts, keys and arguments are those of the Redis protocol,
//! so the data in Redis is the same either way.
//!
//! hyper's pooled client keeps its connections alive (HTTP/2 where the
//! server offers it by ALPN, else HTTP/1.1), over the rustls setup of
//! `rediss://`. A hit that was sent is never sent again, except as EVAL
//! after NOSCRIPT; the pool only retries a request that never left the
//! process (its idle connection had closed). Failed connects back off as on
//! the Redis protocol, and a pool that stops answering is replaced.
//!
//! Calls on one key take effect in the order they were made (see "Order of
//! calls" in docs/algorithms.md): a pipeline waits for the pipelines before
//! it that name one of its keys ([`KeyOrder`]); a script goes as EVAL on its
//! first use (and after a NOSCRIPT), and an UNLINK behind an EVALSHA waits
//! for its answer.
//!
//! What the [`Monitor`] hears: every connection the pool opens or fails to
//! open (its connector counts them), and the API's reachability as requests
//! show it: the first answer is `connected`; a transport failure after an
//! answer (a connection that failed, a connect refused, a pool replaced for
//! stalling) is `lost`; the next answer after that is `reconnected`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Request, StatusCode, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::{capture_connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::ClientConfig;
use serde_json::Value;
use tokio::time::{timeout_at, Duration, Instant};

use super::calls::Loaded;
use super::calls::{overtaken, part_end, Query};
use super::config::{Config, Deployment};
use super::order::KeyOrder;
use super::reply::{self, server_error, Answers, Code, Reply, Stage};
use super::reset::{Command, ResetAll};
use super::socket::tls_config;
use super::stats::Monitor;
use super::step;
use crate::errors::{Error, Result};
use crate::health::{Backoff, Gate, Stall};
#[cfg(test)]
use crate::ops::Answer;
use crate::ops::Op;

/// The message for a key JSON can't carry as it is.
pub const KEY_NOT_WELL_FORMED: &str =
    "over Upstash's REST API a key must be a well-formed string: it holds a lone surrogate, \
     which a JSON string can't carry to Redis faithfully; use a redis:// or rediss:// URL for such keys";

/// How long an idle connection stays in the pool: under the 5 s after which
/// Node.js servers (and many proxies) close idle HTTP/1.1 connections.
const IDLE: Duration = Duration::from_secs(4);

type Http = Client<Counted, Full<Bytes>>;

struct Pool {
    client: Http,
    /// Counts pools, so that a late report about a replaced one is ignored.
    generation: u64,
    backoff: Backoff,
    /// Whether the last request showed the API reachable: None before any answer.
    reached: Option<bool>,
}

pub struct Rest {
    pipeline: Uri,
    root: Uri,
    auth: HeaderValue,
    tls: Arc<ClientConfig>,
    timeout_ms: u64,
    pool: Mutex<Pool>,
    stall: Stall,
    monitor: Arc<Monitor>,
    /// Pipelines on one key go one after the other.
    order: KeyOrder,
    loaded: Mutex<Loaded>,
}

/// How one request ended, short of an answer.
#[derive(Debug)]
enum RestFailure {
    /// The request never left the process.
    Unsent(Error),
    /// The request was sent (or may have been); it is not sent again.
    Sent(Error),
}

impl RestFailure {
    fn error(self) -> Error {
        match self {
            RestFailure::Unsent(e) | RestFailure::Sent(e) => e,
        }
    }
}

impl Rest {
    pub fn new(config: &Config, monitor: Arc<Monitor>) -> Result<Rest> {
        let Deployment::Rest { base } = &config.deployment else {
            return Err(Error::Internal(
                "a Redis URL was given to the REST transport",
            ));
        };
        let uri = |path: &str| {
            format!("{base}{path}")
                .parse::<Uri>()
                .map_err(|_| Error::Config("the REST URL is not a valid HTTP URL".into()))
        };
        let token = config.password.as_deref().unwrap_or_default();
        let mut auth = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            Error::Config("the REST token holds characters an HTTP header can't carry".into())
        })?;
        auth.set_sensitive(true);
        let tls = tls_config(config.tls_ca.as_deref())?;
        Ok(Rest {
            pipeline: uri("/pipeline")?,
            root: uri("")?,
            auth,
            pool: Mutex::new(Pool {
                client: new_pool(&tls, &monitor),
                generation: 0,
                backoff: Backoff::new(u64::from(std::process::id()) ^ config.timeout_ms),
                reached: None,
            }),
            tls,
            timeout_ms: config.timeout_ms,
            stall: Stall::default(),
            order: KeyOrder::default(),
            loaded: Mutex::default(),
            monitor,
        })
    }

    /// What this transport's connections and calls count and tell.
    pub fn monitor(&self) -> &Arc<Monitor> {
        &self.monitor
    }

    fn lock(&self) -> MutexGuard<'_, Pool> {
        // Every change leaves the pool whole, so a poisoned lock is still usable.
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ops sent together at `started`, answered in order, within `deadline`;
    /// each answered op adds one latency sample (`started` to its answer).
    /// Runs on the runtime.
    pub async fn hits(
        &self,
        queries: &[Query<'_>],
        started: Instant,
        deadline: Instant,
    ) -> Vec<Result<Answers>> {
        let mut results: Vec<Option<Result<Answers>>> = queries.iter().map(|_| None).collect();
        let mut chosen = Vec::with_capacity(queries.len());
        for (i, q) in queries.iter().enumerate() {
            match q.keys().all(|k| std::str::from_utf8(k).is_ok()) {
                true => chosen.push(i),
                false => results[i] = Some(Err(Error::InvalidType(KEY_NOT_WELL_FORMED))),
            }
        }
        // Calls on one key go in the order they were made: a later pipeline
        // on one of these keys waits for this one (retries included).
        let turn = self
            .order
            .turn(chosen.iter().flat_map(|&i| queries[i].keys()));
        match timeout_at(deadline, turn).await {
            Ok(_turn) => {
                let evals = self
                    .loaded()
                    .first_uses(chosen.iter().map(|&i| queries[i].op));
                let mut start = 0;
                while start < chosen.len() {
                    let end = part_end(queries, &chosen, &evals, start);
                    self.segment(
                        queries,
                        &chosen[start..end],
                        &evals[start..end],
                        started,
                        deadline,
                        &mut results,
                    )
                    .await;
                    start = end;
                }
            }
            Err(_) => {
                for &i in &chosen {
                    let ms = self.timeout_ms;
                    results[i] = Some(Err(Error::Timeout { ms, sent: false }));
                }
            }
        }
        let timeouts = results
            .iter()
            .filter(|r| matches!(r, Some(Err(Error::Timeout { .. }))))
            .count();
        if timeouts > 0 {
            self.monitor.tally().timeouts += timeouts as u64;
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(Error::Internal("a call got no answer"))))
            .collect()
    }

    /// Sends the chosen ops (each as EVAL if `evals` says so, else as
    /// EVALSHA), then those that met NOSCRIPT as EVAL, in order.
    async fn segment(
        &self,
        queries: &[Query<'_>],
        chosen: &[usize],
        evals: &[bool],
        started: Instant,
        deadline: Instant,
        results: &mut [Option<Result<Answers>>],
    ) {
        let mut chosen = chosen.to_vec();
        let mut evals = evals.to_vec();
        for retry in [false, true] {
            if chosen.is_empty() {
                break;
            }
            let body = pipeline_body(queries, &chosen, &evals);
            let mut missing = Vec::new();
            match self
                .send(&self.pipeline, body, chosen.len(), deadline)
                .await
            {
                Ok(items) => {
                    let took = started.elapsed();
                    let mut tally = self.monitor.tally();
                    // Which met NOSCRIPT (an EVAL, or a retry, meeting it is an error).
                    let met: Vec<(Query, bool)> = chosen
                        .iter()
                        .zip(items.iter().zip(&evals))
                        .map(|(&i, (item, &eval))| {
                            let noscript =
                                matches!(item, Err((code, _)) if Code::of(code) == Code::NoScript);
                            (queries[i], noscript && !eval && !retry)
                        })
                        .collect();
                    let passed = overtaken(&met);
                    for (((&i, item), &(_, noscript)), passed) in
                        chosen.iter().zip(items).zip(&met).zip(passed)
                    {
                        match item {
                            // The script cache lacks it: the script did not
                            // run. A later call on its key ran: it must not.
                            _ if noscript && passed => results[i] = Some(Err(Error::Overtaken)),
                            _ if noscript => {
                                tally.noscript += 1;
                                missing.push(i);
                            }
                            Err((code, detail)) => {
                                tally.answered(took);
                                results[i] =
                                    Some(Err(server_error(&code, Some(&detail), Stage::Sent)))
                            }
                            Ok(value) => {
                                tally.answered(took);
                                results[i] = Some(outcomes(&queries[i], value));
                            }
                        }
                    }
                }
                Err(failure) => {
                    let e = failure.error();
                    for &i in &chosen {
                        results[i] = Some(Err(e.clone()));
                    }
                }
            }
            if !missing.is_empty() {
                // The cache was flushed; the retries' EVALs load their scripts again.
                self.loaded()
                    .reloaded(missing.iter().map(|&i| queries[i].op));
            }
            evals = vec![true; missing.len()];
            chosen = missing;
        }
    }

    /// The scripts the server has cached, as far as this transport knows.
    fn loaded(&self) -> MutexGuard<'_, Loaded> {
        // A set of addresses is whole at every step.
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// POSTs `body` to `uri` within `deadline`, through the backoff and the
    /// pool's health: the items of a pipeline's answer (`expected` of them,
    /// each a result or an error's code and detail), or a single command's
    /// answer as one item (`expected` 0).
    async fn send(
        &self,
        uri: &Uri,
        body: Vec<u8>,
        expected: usize,
        deadline: Instant,
    ) -> std::result::Result<Vec<Item>, RestFailure> {
        let (client, generation, failures) = {
            let mut pool = self.lock();
            if let Gate::Refuse(e) = pool.backoff.gate(std::time::Instant::now()) {
                return Err(RestFailure::Unsent(e));
            }
            (
                pool.client.clone(),
                pool.generation,
                pool.backoff.failures(),
            )
        };
        let mark = self.stall.mark();
        let answer = self.request(&client, uri, body, deadline).await;
        let mut pool = self.lock();
        // What the request showed of the API: reached, or lost with this code.
        let mut showed: Option<std::result::Result<(), &'static str>> = None;
        match &answer {
            Err(RestFailure::Unsent(e)) => {
                // One failure per round of connects, however many batches met it.
                if pool.backoff.failures() == failures {
                    pool.backoff.failed(std::time::Instant::now(), e.clone());
                }
                if matches!(e, Error::Connection { .. }) {
                    showed = Some(Err(e.code()));
                }
            }
            Err(RestFailure::Sent(e @ Error::Timeout { .. })) => {
                let hits = expected.max(1);
                if self.stall.timed_out(mark, hits) && pool.generation == generation {
                    // Its connections stopped answering: new hits get a new pool.
                    pool.client = new_pool(&self.tls, &self.monitor);
                    pool.generation += 1;
                    self.stall.reset();
                    showed = Some(Err(e.code()));
                }
                pool.backoff.succeeded();
            }
            Err(RestFailure::Sent(e)) => {
                self.stall.answered();
                pool.backoff.succeeded();
                if matches!(e, Error::Connection { .. }) {
                    showed = Some(Err(e.code()));
                }
            }
            Ok(_) => {
                self.stall.answered();
                pool.backoff.succeeded();
                showed = Some(Ok(()));
            }
        }
        // Only a change is told: the first answer, a loss after answers, an answer after a loss.
        let change = match (showed, pool.reached) {
            (Some(Ok(())), Some(true)) | (Some(Err(_)), None | Some(false)) | (None, _) => None,
            (Some(Ok(())), _) => {
                pool.reached = Some(true);
                Some(Ok(()))
            }
            (Some(Err(code)), Some(true)) => {
                pool.reached = Some(false);
                Some(Err(code))
            }
        };
        drop(pool);
        // Told with the pool unlocked: the monitor wakes the stores.
        match change {
            Some(Ok(())) => self.monitor.up(),
            Some(Err(code)) => self.monitor.lost(code),
            None => {}
        }
        let (status, bytes) = answer?;
        parse(status, &bytes, expected).map_err(RestFailure::Sent)
    }

    async fn request(
        &self,
        client: &Http,
        uri: &Uri,
        body: Vec<u8>,
        deadline: Instant,
    ) -> std::result::Result<(StatusCode, Bytes), RestFailure> {
        let mut request = Request::post(uri.clone())
            .header(AUTHORIZATION, self.auth.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| {
                RestFailure::Unsent(Error::Internal("a REST request could not be made"))
            })?;
        // Set once the pool hands the request to a connection: from then on it may have been sent.
        let captured = capture_connection(&mut request);
        let sent = || captured.connection_metadata().is_some();
        let ms = self.timeout_ms;
        let response = match timeout_at(deadline, client.request(request)).await {
            Err(_) if sent() => return Err(RestFailure::Sent(Error::Timeout { ms, sent: true })),
            Err(_) => return Err(RestFailure::Unsent(Error::Timeout { ms, sent: false })),
            Ok(Err(e)) if e.is_connect() || !sent() => {
                return Err(RestFailure::Unsent(Error::Connection {
                    text: format!(
                        "could not connect to the REST API: {}; the call was not sent",
                        chain(&e)
                    ),
                    sent: false,
                }))
            }
            Ok(Err(e)) => return Err(RestFailure::Sent(lost(&e))),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        match timeout_at(deadline, response.into_body().collect()).await {
            Err(_) => Err(RestFailure::Sent(Error::Timeout { ms, sent: true })),
            Ok(Err(e)) => Err(RestFailure::Sent(lost(&e))),
            Ok(Ok(collected)) => Ok((status, collected.to_bytes())),
        }
    }

    /// `resetAll()`: SCAN and UNLINK, each command a request of its own
    /// within timeoutMs. Runs on the runtime.
    async fn reset_all(&self, prefix: &[u8]) -> Result<()> {
        let mut plan = ResetAll::new(prefix)?;
        let timeout = Duration::from_millis(self.timeout_ms);
        while let Some(scan) = plan.next_scan() {
            let reply = self.command(&scan, Instant::now() + timeout).await?;
            let (cursor, keys) = scan_page(reply)?;
            for unlink in plan.on_scan_reply(cursor, keys, |_| 0) {
                self.command(&unlink, Instant::now() + timeout).await?;
            }
        }
        Ok(())
    }

    /// One command, sent alone to the API's root.
    async fn command(&self, command: &Command, deadline: Instant) -> Result<Value> {
        let mut body = Vec::new();
        let parts: Option<Vec<&str>> = command
            .iter()
            .map(|part| std::str::from_utf8(part).ok())
            .collect();
        json_command(
            &mut body,
            &parts.ok_or(Error::InvalidType(KEY_NOT_WELL_FORMED))?,
        );
        let mut items = self
            .send(&self.root, body, 0, deadline)
            .await
            .map_err(RestFailure::error)?;
        match items.pop() {
            Some(Ok(value)) => Ok(value),
            Some(Err((code, detail))) => Err(server_error(&code, Some(&detail), Stage::Sent)),
            None => Err(wrong_shape()),
        }
    }
}

/// `resetAll()` over REST, from a worker thread: runs on the runtime, over a
/// pool of its own, and waits for it.
pub fn reset_all(config: &Config, prefix: &[u8]) -> Result<()> {
    let rest = Rest::new(config, Arc::default())?;
    let prefix = prefix.to_vec();
    let (tx, rx) = std::sync::mpsc::channel();
    crate::runtime::handle()?.spawn(async move {
        let _ = tx.send(rest.reset_all(&prefix).await);
    });
    rx.recv()
        .unwrap_or(Err(Error::Internal("resetAll() over REST got no answer")))
}

/// A pool: keep-alive connections, HTTP/2 by ALPN where offered, TCP_NODELAY;
/// `monitor` counts the connects it makes.
fn new_pool(tls: &Arc<ClientConfig>, monitor: &Arc<Monitor>) -> Http {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(ClientConfig::clone(tls))
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    let connector = Counted {
        inner: connector,
        monitor: Arc::clone(monitor),
    };
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(IDLE)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector)
}

/// The pool's connector: HTTPS (or HTTP on loopback), counting in the
/// monitor each connection opened, and each connect that failed or was
/// given up (its request's deadline passed first).
#[derive(Clone)]
struct Counted {
    inner: Https,
    monitor: Arc<Monitor>,
}

type Https = HttpsConnector<HttpConnector>;
type Connected = <Https as tower_service::Service<Uri>>::Response;
type ConnectError = <Https as tower_service::Service<Uri>>::Error;

impl tower_service::Service<Uri> for Counted {
    type Response = Connected;
    type Error = ConnectError;
    type Future =
        Pin<Box<dyn Future<Output = std::result::Result<Connected, ConnectError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), ConnectError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let mut pending = Unsettled(Some(Arc::clone(&self.monitor)));
        Box::pin(async move {
            let connected = connecting.await;
            if let Some(monitor) = pending.0.take() {
                match &connected {
                    Ok(_) => monitor.opened(),
                    Err(_) => monitor.connect_failed(),
                }
            }
            connected
        })
    }
}

/// A connect under way: dropped before it settles, it was given up.
struct Unsettled(Option<Arc<Monitor>>);

impl Drop for Unsettled {
    fn drop(&mut self) {
        if let Some(monitor) = self.0.take() {
            monitor.connect_failed();
        }
    }
}

/// A pipeline item: the result, or an error's code (its first word) and the rest.
type Item = std::result::Result<Value, (String, String)>;

/// The answer's items, or the error of an answer that is not 200 or not of
/// the expected shape. Text from outside is redacted by the store.
fn parse(status: StatusCode, bytes: &[u8], expected: usize) -> Result<Vec<Item>> {
    let json: Option<Value> = serde_json::from_slice(bytes).ok();
    if !status.is_success() {
        let detail = json
            .as_ref()
            .and_then(|v| v.get("error"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let answered = match detail {
            "" => format!("the REST API answered HTTP {}", status.as_u16()),
            detail => format!("the REST API answered HTTP {} ({detail})", status.as_u16()),
        };
        return Err(match status.as_u16() {
            401 | 403 => Error::Auth(answered),
            500.. => Error::Connection {
                text: format!(
                    "{answered}; the call was sent, is not sent again, and may or may not have counted"
                ),
                sent: true,
            },
            // A refused command: the answer names its Redis error.
            _ if !detail.is_empty() => {
                let (code, rest) = split(detail);
                server_error(&code, Some(&rest), Stage::Sent)
            }
            _ => Error::Redis(answered),
        });
    }
    let item = |v: Value| match v.get("error").and_then(Value::as_str) {
        Some(e) => Err(split(e)),
        None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
    };
    match (json, expected) {
        (Some(v), 0) if v.is_object() => Ok(vec![item(v)]),
        (Some(Value::Array(items)), n) if n > 0 && items.len() == n => {
            Ok(items.into_iter().map(item).collect())
        }
        _ => Err(wrong_shape()),
    }
}

fn split(error: &str) -> (String, String) {
    match error.split_once(' ') {
        Some((code, rest)) => (code.to_string(), rest.to_string()),
        None => (error.to_string(), String::new()),
    }
}

fn wrong_shape() -> Error {
    Error::Redis("the REST API gave an answer of the wrong shape".into())
}

/// The error of a request whose connection failed after it was handed over.
fn lost(e: &(dyn std::error::Error + 'static)) -> Error {
    Error::Connection {
        text: format!(
            "the connection to the REST API failed ({}); the call was sent, is not sent again, and may or may not \
             have counted",
            chain(e)
        ),
        sent: true,
    }
}

/// An error and its sources, as one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The `/pipeline` body for the chosen ops: `EVALSHA sha 1 key argv…` (or
/// `EVAL script …`), a plain op as its command. Keys are UTF-8 (checked).
fn pipeline_body(queries: &[Query<'_>], chosen: &[usize], evals: &[bool]) -> Vec<u8> {
    let mut body = Vec::with_capacity(chosen.len() * 160);
    body.push(b'[');
    for (n, (&i, &eval)) in chosen.iter().zip(evals).enumerate() {
        if n > 0 {
            body.push(b',');
        }
        let q = &queries[i];
        let key = std::str::from_utf8(q.key).unwrap_or_default();
        match q.op.script() {
            // ping() touches no key: its key is the bare prefix.
            None if q.op == Op::Ping => json_command(&mut body, &["PING"]),
            None => json_command(&mut body, &["UNLINK", key]),
            Some(script) if q.op == Op::Takes => step::command(q.key, |n, keys, argv| {
                let mut parts = Vec::with_capacity(3 + keys.len() + argv.len());
                match eval {
                    false => parts.extend(["EVALSHA", script.sha()]),
                    true => parts.extend(["EVAL", script.body]),
                }
                // Keys are UTF-8 (checked), the numbers ASCII.
                parts.push(std::str::from_utf8(n).unwrap_or_default());
                parts.extend(
                    keys.iter()
                        .chain(argv)
                        .map(|a| std::str::from_utf8(a).unwrap_or_default()),
                );
                json_command(&mut body, &parts);
            }),
            Some(script) => q.op.argv(&q.args, |argv| {
                let mut parts = Vec::with_capacity(4 + argv.len());
                match eval {
                    false => parts.extend(["EVALSHA", script.sha()]),
                    true => parts.extend(["EVAL", script.body]),
                }
                parts.extend(["1", key]);
                // The op's arguments are ASCII: numbers and names.
                parts.extend(
                    argv.iter()
                        .map(|a| std::str::from_utf8(a).unwrap_or_default()),
                );
                json_command(&mut body, &parts);
            }),
        }
    }
    body.push(b']');
    body
}

/// Appends a command as a JSON array of strings.
fn json_command(out: &mut Vec<u8>, parts: &[&str]) {
    out.push(b'[');
    for (n, part) in parts.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        // Writing a string into a Vec can't fail.
        let _ = serde_json::to_writer(&mut *out, part);
    }
    out.push(b']');
}

/// A command's JSON result as every transport reads it.
fn read(value: &Value) -> Reply<'_> {
    match value {
        Value::Array(items) => Reply::Array(items.iter().map(Value::as_i64).collect()),
        Value::Number(n) => Reply::Int(n.as_i64().unwrap_or(-1)),
        _ => Reply::Other,
    }
}

/// The op's answers from a command's JSON result.
fn outcomes(q: &Query<'_>, value: Value) -> Result<Answers> {
    reply::outcomes(q.op, q.key, read(&value))
}

/// The op's answer from a command's JSON result.
#[cfg(test)]
fn outcome(op: Op, value: Value) -> Result<Answer> {
    reply::outcome(op, read(&value))
}

/// A SCAN result: the next cursor and the page's keys.
fn scan_page(reply: Value) -> Result<(Vec<u8>, Vec<Vec<u8>>)> {
    let wrong = || Error::Redis("SCAN gave an answer of the wrong shape".into());
    let Value::Array(parts) = reply else {
        return Err(wrong());
    };
    let cursor = match parts.first() {
        Some(Value::String(c)) => c.clone().into_bytes(),
        Some(Value::Number(n)) => n.to_string().into_bytes(),
        _ => return Err(wrong()),
    };
    let Some(Value::Array(keys)) = parts.get(1) else {
        return Err(wrong());
    };
    let keys = keys
        .iter()
        .map(|k| k.as_str().map(|k| k.as_bytes().to_vec()).ok_or_else(wrong))
        .collect::<Result<_>>()?;
    Ok((cursor, keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(key: &[u8], op: Op) -> Query<'_> {
        Query {
            key,
            op,
            args: [60_000, 1, 0, 0],
        }
    }

    #[test]
    fn a_pipeline_is_a_json_array_of_commands() {
        let queries = [
            query("p:a\"\u{e9}".as_bytes(), Op::Hit),
            query(b"p:b", Op::Unlink),
        ];
        let body = String::from_utf8(pipeline_body(&queries, &[0, 1], &[false, false])).unwrap();
        let sha = Op::Hit.script().unwrap().sha();
        assert_eq!(
            body,
            format!(r#"[["EVALSHA","{sha}","1","p:a\"é","60000","1"],["UNLINK","p:b"]]"#)
        );
        let eval: Value = serde_json::from_slice(&pipeline_body(&queries, &[0], &[true])).unwrap();
        assert_eq!(eval[0][0], "EVAL");
        assert_eq!(eval[0][1], Op::Hit.script().unwrap().body);
    }

    #[test]
    fn answers_are_results_or_errors_per_command() {
        let ok = StatusCode::OK;
        let items = parse(
            ok,
            br#"[{"result":[3,60000]},{"error":"NOSCRIPT No matching script"}]"#,
            2,
        )
        .unwrap();
        assert_eq!(items[0], Ok(serde_json::json!([3, 60000])));
        assert_eq!(
            items[1],
            Err(("NOSCRIPT".into(), "No matching script".into()))
        );
        assert_eq!(
            outcome(Op::Hit, serde_json::json!([3, 60000])),
            Ok(Answer::new(&[3, 60000]))
        );
        assert_eq!(
            outcome(Op::Unlink, serde_json::json!(2)),
            Ok(Answer::new(&[2]))
        );
        assert_eq!(
            outcome(Op::Hit, Value::Null).unwrap_err().code(),
            "ERR_REDIS"
        );
        assert_eq!(parse(ok, b"[]", 2).unwrap_err().code(), "ERR_REDIS");
        assert_eq!(
            parse(ok, br#"{"result":"OK"}"#, 0).unwrap(),
            [Ok(Value::from("OK"))]
        );
    }

    #[test]
    fn statuses_become_the_store_errors() {
        let code = |status: u16, body: &[u8]| {
            let e = parse(StatusCode::from_u16(status).unwrap(), body, 1).unwrap_err();
            (e.code(), e.sent())
        };
        assert_eq!(
            code(401, br#"{"error":"Unauthorized"}"#),
            ("ERR_AUTH", None)
        );
        assert_eq!(code(403, b""), ("ERR_AUTH", None));
        assert_eq!(code(502, b"bad gateway"), ("ERR_CONNECTION", Some(true)));
        assert_eq!(
            code(400, br#"{"error":"WRONGPASS invalid"}"#),
            ("ERR_AUTH", None)
        );
        assert_eq!(
            code(400, br#"{"error":"ERR syntax error"}"#),
            ("ERR_REDIS", None)
        );
        assert_eq!(code(404, b""), ("ERR_REDIS", None));
    }

    #[test]
    fn scan_pages_take_string_or_number_cursors() {
        let (cursor, keys) = scan_page(serde_json::json!(["17", ["p:a", "p:b"]])).unwrap();
        assert_eq!(
            (cursor, keys),
            (b"17".to_vec(), vec![b"p:a".to_vec(), b"p:b".to_vec()])
        );
        assert_eq!(scan_page(serde_json::json!([0, []])).unwrap().0, b"0");
        assert!(scan_page(serde_json::json!("x")).is_err());
    }
}
