//! Hits on Redis: the window script sent as EVALSHA, within timeoutMs
//! (connecting included). Hits that arrive together go out as one pipeline
//! per node: one write and one read for the lot, each still its own atomic
//! script. After NOSCRIPT (that node's script cache lacks it; the script did
//! not run) a hit is sent once more as EVAL, and in a cluster after MOVED or
//! ASK (the script did not run either) to the node named: the only safe
//! retries. Nothing else is ever sent again.
//!
//! Over Upstash's REST API the same ops go out as one `/pipeline` request
//! (see [`super::rest`]).
//!
//! Stores with the same settings share their connections (see [`Nodes::shared`]).

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::time::{timeout_at, Instant};

use futures_util::future::join_all;

use super::calls::{overtaken, part_end, Query};
use super::cluster::Cluster;
use super::config::Config;
use super::fence::Verdict;
use super::health;
use super::host::Node;
use super::link::{classify, read, Confirmation, Link};
use super::reply::{self, server_error, Answers, Stage};
use super::rest::Rest;
use super::stats::Monitor;
use crate::errors::{Error, Result};
#[cfg(test)]
use crate::ops::Answer as Values;
use crate::ops::Op;
use crate::step;

/// Where hits go: the one server, each key's node in a Redis Cluster, or
/// Upstash's REST API.
#[derive(Clone)]
enum Nodes {
    Single(Arc<Node>),
    Cluster(Arc<Cluster>),
    Rest(Arc<Rest>),
}

/// The nodes of a store that may still be alive, held weakly.
enum Held {
    Single(Weak<Node>),
    Cluster(Weak<Cluster>),
    Rest(Weak<Rest>),
}

/// How long the connections of a store that was collected without
/// `close()` stay open, for a store with the same settings made meanwhile
/// (an app that makes a store per request).
const LINGER: Duration = Duration::from_secs(2);

impl Nodes {
    /// The nodes of a live store with the same settings (target,
    /// credentials, database, TLS roots, cluster seeds, timeoutMs; the
    /// prefix plays no part in a connection), else new ones. Sharing is
    /// sound: a connection carries no state of a store's own, hits of
    /// several stores are pipelined on it as one store's are, and its
    /// health (timeouts, backoff) is the server's, the same for all.
    fn shared(config: &Config) -> Result<Nodes> {
        static SHARED: Mutex<Vec<(Config, Held)>> = Mutex::new(Vec::new());
        // Every change leaves the list whole, so a poisoned lock is still usable.
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        shared.retain(|(_, held)| held.upgrade().is_some());
        if let Some(nodes) = shared
            .iter()
            .find(|(c, _)| c == config)
            .and_then(|(_, held)| held.upgrade())
        {
            return Ok(nodes);
        }
        let monitor = Arc::new(Monitor::default());
        let nodes = match &config.cluster {
            Some(seeds) => Nodes::Cluster(Arc::new(Cluster::new(config, seeds, monitor)?)),
            None if config.is_rest() => Nodes::Rest(Arc::new(Rest::new(config, monitor)?)),
            None => Nodes::Single(Arc::new(Node::start(config, monitor.clone())?)),
        };
        let held = match &nodes {
            Nodes::Single(link) => Held::Single(Arc::downgrade(link)),
            Nodes::Cluster(cluster) => Held::Cluster(Arc::downgrade(cluster)),
            Nodes::Rest(rest) => Held::Rest(Arc::downgrade(rest)),
        };
        shared.push((config.clone(), held));
        Ok(nodes)
    }

    /// What these nodes' connections and calls count and tell.
    fn monitor(&self) -> &Arc<Monitor> {
        match self {
            Nodes::Single(node) => node.monitor(),
            Nodes::Cluster(cluster) => cluster.monitor(),
            Nodes::Rest(rest) => rest.monitor(),
        }
    }
}

impl Held {
    fn upgrade(&self) -> Option<Nodes> {
        match self {
            Held::Single(link) => link.upgrade().map(Nodes::Single),
            Held::Cluster(cluster) => cluster.upgrade().map(Nodes::Cluster),
            Held::Rest(rest) => rest.upgrade().map(Nodes::Rest),
        }
    }
}

pub struct Store {
    nodes: Nodes,
    timeout: Duration,
    secrets: Vec<Vec<u8>>,
}

/// Redirections one hit may follow (a slot that moves twice while a hit is
/// under way is already rare).
const MAX_REDIRECTS: usize = 5;

impl Store {
    pub fn new(config: &Config) -> Result<Store> {
        Ok(Store {
            nodes: Nodes::shared(config)?,
            timeout: Duration::from_millis(config.timeout_ms),
            secrets: config.secrets(),
        })
    }

    /// One hit. Runs on the runtime.
    pub async fn hit(&self, query: Query<'_>) -> Result<Answers> {
        let mut results = self.hits(&[query]).await;
        results
            .pop()
            .unwrap_or(Err(Error::Internal("a hit got no answer")))
    }

    /// What the calls and connections of the nodes met, shared by the
    /// stores on them: locked once per pipeline's answers.
    pub fn monitor(&self) -> &Arc<Monitor> {
        self.nodes.monitor()
    }

    /// Hits sent together, answered in order. Runs on the runtime. Each
    /// answered hit adds one latency sample: from here to its answer.
    pub async fn hits(&self, queries: &[Query<'_>]) -> Vec<Result<Answers>> {
        let started = Instant::now();
        let deadline = started + self.timeout;
        let monitor = &**self.monitor();
        let answers = match &self.nodes {
            Nodes::Single(node) => {
                // The engine counts its calls' latencies and timeouts itself.
                let results = node.hits(queries).await;
                return self.answer(queries, results.into_iter());
            }
            Nodes::Cluster(cluster) => routed(cluster, queries, deadline, monitor).await,
            Nodes::Rest(rest) => {
                let results = rest.hits(queries, started, deadline).await;
                return self.answer(queries, results.into_iter());
            }
        };
        {
            let mut tally = monitor.tally();
            for (answer, at) in &answers {
                match answer {
                    Answer::TimedOut { .. } => tally.timeouts += 1,
                    Answer::Value(_) => tally.answered(at.saturating_duration_since(started)),
                    Answer::Refused(Error::Unconfirmed { .. } | Error::WaitRefused { .. }) => {
                        tally.unconfirmed += 1
                    }
                    _ => {}
                }
            }
        }
        let ms = self.timeout.as_millis() as u64;
        let results = answers
            .into_iter()
            .zip(queries)
            .map(|((answer, _), q)| match answer {
                Answer::Value(value) => outcomes(q, value),
                Answer::Refused(e) => Err(e),
                Answer::Failed(e) => Err(classify(&e, Stage::Sent)),
                Answer::TimedOut { sent } => Err(Error::Timeout { ms, sent }),
            });
        self.answer(queries, results)
    }

    /// The results, each error's text cleaned of its query's key and of the credentials.
    fn answer(
        &self,
        queries: &[Query<'_>],
        results: impl Iterator<Item = Result<Answers>>,
    ) -> Vec<Result<Answers>> {
        queries
            .iter()
            .zip(results)
            .map(|(query, result)| {
                result.map_err(|e| {
                    let mut secrets: Vec<&[u8]> = self.secrets.iter().map(Vec::as_slice).collect();
                    secrets.extend(query.keys());
                    e.redacted(&secrets)
                })
            })
            .collect()
    }

    /// The store speaks Upstash's REST API.
    pub fn is_rest(&self) -> bool {
        matches!(self.nodes, Nodes::Rest(_))
    }

    /// Keeps this store's connections open for a while after it is gone
    /// (they close when no store holds them), for a store with the same
    /// settings made meanwhile. Runs on the runtime.
    pub fn linger(&self) {
        let nodes = self.nodes.clone();
        tokio::spawn(async move {
            tokio::time::sleep(LINGER).await;
            drop(nodes);
        });
    }
}

/// How one hit ended.
enum Answer {
    Value(Value),
    /// Not sent: no connection.
    Refused(Error),
    Failed(redis::RedisError),
    /// `sent` false: timed out while connecting.
    TimedOut {
        sent: bool,
    },
}

impl Answer {
    /// A MOVED or ASK answer: the script did not run; it belongs on this
    /// node (`host:port`), and with ASK only for this once.
    fn redirection(&self) -> Option<(&str, bool)> {
        let Answer::Value(Value::ServerError(e)) = self else {
            return None;
        };
        let asking = match e.code() {
            "MOVED" => false,
            "ASK" => true,
            _ => return None,
        };
        Some((e.details()?.split(' ').nth(1)?, asking))
    }

    /// The answer says the node failed or no longer holds the slot.
    fn node_trouble(&self) -> bool {
        match self {
            Answer::Value(Value::ServerError(e)) => matches!(
                e.code(),
                "CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN" | "READONLY" | "LOADING"
            ),
            Answer::Value(_) => false,
            Answer::Refused(_) | Answer::Failed(_) | Answer::TimedOut { .. } => true,
        }
    }

    /// The error of an answer that says the node no longer takes writes.
    fn demotion(&self) -> Option<Error> {
        match self {
            Answer::Value(Value::ServerError(e)) if health::demotion(e.code()) => {
                Some(server_error(e.code(), e.details(), Stage::Sent))
            }
            _ => None,
        }
    }
}

/// An answer and when it came in.
type Timed = (Answer, Instant);

/// `n` answers alike, all in now: hits that were never sent, or refused together.
fn alike(n: usize, answer: &dyn Fn() -> Answer) -> Vec<Timed> {
    let now = Instant::now();
    (0..n).map(|_| (answer(), now)).collect()
}

/// Sends the chosen hits to one node within the deadline (connecting
/// included), and tells its link how that went. One answer per chosen hit.
async fn on_node(
    link: &Arc<Link>,
    queries: &[Query<'_>],
    chosen: &[usize],
    asking: bool,
    deadline: Instant,
    monitor: &Monitor,
) -> Vec<Timed> {
    let all = |answer: &dyn Fn() -> Answer| alike(chosen.len(), answer);
    let (conn, generation) = match timeout_at(deadline, link.connection()).await {
        Ok(Ok(connected)) => connected,
        Ok(Err(e)) => return all(&|| Answer::Refused(e.clone())),
        Err(_) => return all(&|| Answer::TimedOut { sent: false }),
    };
    let mark = link.mark();
    let fenced = link.fence().map(|fence| (fence, conn.clone()));
    let mut answers = send(
        conn,
        (link, generation),
        queries,
        chosen,
        asking,
        deadline,
        monitor,
    )
    .await;
    let mut demoted = None;
    if let Some((fence, conn)) = fenced {
        if answers.iter().any(|(a, _)| ran(a)) {
            let said = link
                .confirm(fence, generation, &conn, deadline.into_std())
                .await;
            demoted = confirmed(said, &mut answers);
        }
    }
    let timeouts = answers
        .iter()
        .filter(|(a, _)| matches!(a, Answer::TimedOut { .. }))
        .count();
    if let Some(demotion) = demoted.or_else(|| answers.iter().find_map(|(a, _)| a.demotion())) {
        link.demoted(generation, demotion);
    } else if timeouts > 0 {
        link.timed_out(generation, mark, timeouts);
    } else if answers.iter().any(|(a, _)| matches!(a, Answer::Failed(_))) {
        link.failed(generation);
    } else {
        link.answered(generation);
    }
    answers
}

/// An op that ran: its answer is a value, not a server's error.
fn ran(answer: &Answer) -> bool {
    matches!(answer, Answer::Value(v) if !matches!(v, Value::ServerError(_)))
}

/// `waitForReplicas`: once the ops' answers are in, a `WAIT` on the same
/// connection written after them (see [`Link::confirm`]) says whether
/// enough replicas have them. The answers stand only if so; else each op
/// that ran rejects with [`Error::Unconfirmed`] (or WAIT's own error), as
/// it may be lost in a failover. Ops that failed or never ran keep their
/// answers. Answers the error to replace the connection with if `WAIT`
/// said the server was demoted.
fn confirmed(said: Confirmation, answers: &mut [Timed]) -> Option<Error> {
    let now = Instant::now();
    for (answer, at) in answers.iter_mut().filter(|(a, _)| ran(a)) {
        *at = now;
        *answer = match &said {
            Confirmation::Verdict(Verdict::Confirmed) => continue,
            Confirmation::Verdict(Verdict::Rejected { error, .. }) => {
                Answer::Refused(error.clone())
            }
            Confirmation::Failed(e) => Answer::Failed(e.clone()),
            Confirmation::TimedOut => Answer::TimedOut { sent: true },
        }
    }
    // The link's cause for the backoff that follows: the calls it refuses are not sent.
    let demoted = matches!(
        said,
        Confirmation::Verdict(Verdict::Rejected { demoted: true, .. })
    );
    demoted.then(|| Error::Redis("the server refused WAIT as a replica: it was demoted".into()))
}

/// Sends each hit to its slot's master and follows MOVED and ASK, whose
/// script did not run; nothing else is sent again. Trouble with a node has
/// the slot map asked for again, so hits find a promoted replica.
async fn routed(
    cluster: &Arc<Cluster>,
    queries: &[Query<'_>],
    deadline: Instant,
    monitor: &Monitor,
) -> Vec<Timed> {
    let all = |answer: &dyn Fn() -> Answer| alike(queries.len(), answer);
    // Taken before anything is awaited, so in the order the calls were made,
    // and held until every answer is in, redirections and retries included.
    let turn = cluster.order().turn(queries.iter().flat_map(|q| q.keys()));
    let Ok(_turn) = timeout_at(deadline, turn).await else {
        return all(&|| Answer::TimedOut { sent: false });
    };
    let links = match timeout_at(
        deadline,
        cluster.route(queries.iter().map(|q| q.keys().next().unwrap_or(q.key))),
    )
    .await
    {
        Ok(Ok(links)) => links,
        Ok(Err(e)) => return all(&|| Answer::Refused(e.clone())),
        Err(_) => return all(&|| Answer::TimedOut { sent: false }),
    };
    let mut answers: Vec<Option<Timed>> = queries.iter().map(|_| None).collect();
    let mut pending: Vec<(usize, Arc<Link>, bool)> = Vec::with_capacity(queries.len());
    for (i, link) in links.into_iter().enumerate() {
        match link {
            Some(link) => pending.push((i, link, false)),
            None => {
                // Only this key fails; the map may have changed since it was read.
                let refused = Answer::Refused(Error::Redis(
                    "CLUSTERDOWN the key's slot is not served by any node".into(),
                ));
                answers[i] = Some((refused, Instant::now()));
                cluster.stale();
            }
        }
    }
    for redirects_left in (0..=MAX_REDIRECTS).rev() {
        // One pipeline per node (and per ASK or not).
        let mut groups: Vec<(Arc<Link>, bool, Vec<usize>)> = Vec::new();
        for (i, link, asking) in pending.drain(..) {
            match groups
                .iter_mut()
                .find(|(l, a, _)| Arc::ptr_eq(l, &link) && *a == asking)
            {
                Some((_, _, chosen)) => chosen.push(i),
                None => groups.push((link, asking, vec![i])),
            }
        }
        let sent = join_all(groups.iter().map(|(link, asking, chosen)| {
            on_node(link, queries, chosen, *asking, deadline, monitor)
        }))
        .await;
        for ((_, _, chosen), group) in groups.iter().zip(sent) {
            for (&i, (answer, at)) in chosen.iter().zip(group) {
                match answer.redirection() {
                    Some((to, asking)) if redirects_left > 0 => {
                        monitor.tally().redirections += 1;
                        if !asking {
                            cluster.stale();
                        }
                        match cluster.redirected(to) {
                            Ok(link) => pending.push((i, link, asking)),
                            Err(e) => answers[i] = Some((Answer::Refused(e), at)),
                        }
                    }
                    _ => {
                        if answer.node_trouble() {
                            cluster.stale();
                        }
                        answers[i] = Some((answer, at));
                    }
                }
            }
        }
        if pending.is_empty() {
            break;
        }
    }
    answers
        .into_iter()
        .map(|a| {
            a.unwrap_or_else(|| {
                let none = Answer::Refused(Error::Internal("a hit got no answer"));
                (none, Instant::now())
            })
        })
        .collect()
}

/// Sends the chosen ops, each as EVALSHA (as EVAL on its script's first use
/// on this connection), then those that met NOSCRIPT as EVAL, in order: one
/// answer per chosen op, in order, with when it came in. An UNLINK can't
/// meet NOSCRIPT, so it goes only once the EVALSHAs before it have answered
/// (and their retries run), so that it never overtakes one.
async fn send(
    mut conn: MultiplexedConnection,
    (link, generation): (&Link, u64),
    queries: &[Query<'_>],
    chosen: &[usize],
    asking: bool,
    deadline: Instant,
    monitor: &Monitor,
) -> Vec<Timed> {
    let evals: Vec<bool> = link.first_uses(generation, chosen.iter().map(|&i| queries[i].op));
    let mut answers: Vec<Timed> = Vec::with_capacity(chosen.len());
    let mut start = 0;
    while start < chosen.len() {
        let end = part_end(queries, chosen, &evals, start);
        let part = &chosen[start..end];
        // Noted right before the pipeline's first poll writes it.
        let out = link.out(part.iter().map(|&i| queries[i]));
        let answered = pipeline(
            &mut conn,
            &evals[start..end],
            queries,
            part,
            asking,
            deadline,
        )
        .await;
        let now = Instant::now();
        let base = answers.len();
        answers.extend(answered.into_iter().map(|a| (a, now)));
        let met: Vec<(Query, bool)> = (base..answers.len())
            .map(|j| {
                let noscript = !evals[j]
                    && matches!(&answers[j].0, Answer::Value(Value::ServerError(e)) if e.code() == "NOSCRIPT");
                (queries[chosen[j]], noscript)
            })
            .collect();
        let (mut missing, mut at) = (Vec::new(), Vec::new());
        for ((j, (q, noscript)), passed) in (base..).zip(&met).zip(overtaken(&met)) {
            if !noscript {
                continue;
            }
            // A later op of this pipeline ran, or a later pipeline named the key.
            if passed || q.keys().any(|k| link.named_after(&out, k)) {
                answers[j].0 = Answer::Refused(Error::Overtaken);
            } else {
                missing.push(chosen[j]);
                at.push(j);
            }
        }
        if !missing.is_empty() {
            monitor.tally().noscript += missing.len() as u64;
            link.flushed(generation, missing.iter().map(|&i| queries[i].op));
            let all = vec![true; missing.len()];
            let _retry = link.out(missing.iter().map(|&i| queries[i]));
            let retried = pipeline(&mut conn, &all, queries, &missing, asking, deadline).await;
            let now = Instant::now();
            for (j, answer) in at.into_iter().zip(retried) {
                answers[j] = (answer, now);
            }
        }
        start = end;
    }
    answers
}

/// Sends each chosen op as one pipeline (`EVALSHA sha 1 key argv…`, or
/// `EVAL script …` where `evals` says; a plain op as its command), each
/// after ASKING if `asking`; one answer per chosen op, in order.
async fn pipeline(
    conn: &mut MultiplexedConnection,
    evals: &[bool],
    queries: &[Query<'_>],
    chosen: &[usize],
    asking: bool,
    deadline: Instant,
) -> Vec<Answer> {
    let per_hit = 1 + usize::from(asking);
    let mut pipe = redis::Pipeline::with_capacity(chosen.len() * per_hit);
    for (&i, &eval) in chosen.iter().zip(evals) {
        let q = &queries[i];
        if asking {
            pipe.add_command(redis::cmd("ASKING"));
        }
        let mut cmd = redis::Cmd::with_capacity(8, q.key.len() + 160);
        match q.op.script() {
            None if q.op == Op::Ping => {
                cmd.arg("PING");
            }
            None => {
                cmd.arg("UNLINK").arg(q.key);
            }
            Some(script) if q.op == Op::Takes => {
                match eval {
                    false => cmd.arg("EVALSHA").arg(script.sha()),
                    true => cmd.arg("EVAL").arg(script.body),
                };
                step::command(q.key, |n, keys, argv| {
                    cmd.arg(n);
                    for part in keys.iter().chain(argv) {
                        cmd.arg(*part);
                    }
                });
            }
            Some(script) => {
                match eval {
                    false => cmd.arg("EVALSHA").arg(script.sha()),
                    true => cmd.arg("EVAL").arg(script.body),
                };
                cmd.arg(1).arg(q.key);
                q.op.argv(&q.args, |argv| {
                    for arg in argv {
                        cmd.arg(*arg);
                    }
                });
            }
        }
        pipe.add_command(cmd);
    }
    let expected = chosen.len() * per_hit;
    match timeout_at(deadline, conn.send_packed_commands(&pipe, 0, expected)).await {
        Ok(Ok(values)) if values.len() == expected => values
            .into_iter()
            .skip(per_hit - 1)
            .step_by(per_hit)
            .map(Answer::Value)
            .collect(),
        Ok(Ok(_)) => chosen.iter().map(|_| Answer::Value(Value::Nil)).collect(),
        Ok(Err(e)) => chosen.iter().map(|_| Answer::Failed(e.clone())).collect(),
        Err(_) => chosen
            .iter()
            .map(|_| Answer::TimedOut { sent: true })
            .collect(),
    }
}

/// The op's answers, or the error its script raised.
fn outcomes(q: &Query<'_>, answer: Value) -> Result<Answers> {
    reply::outcomes(q.op, q.key, read(&answer))
}

/// The op's answer, or the error its script raised.
#[cfg(test)]
fn outcome(op: Op, answer: Value) -> Result<Values> {
    reply::outcome(op, read(&answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sha_is_forty_hex_digits() {
        let sha = Op::Hit.script().unwrap().sha();
        assert_eq!(sha.len(), 40);
        assert!(sha
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }

    fn server(reply: &str) -> Answer {
        Answer::Value(redis::parse_redis_value(reply.as_bytes()).unwrap())
    }

    #[test]
    fn redirections_name_the_node() {
        let moved = server("-MOVED 3999 127.0.0.1:6381\r\n");
        assert_eq!(moved.redirection(), Some(("127.0.0.1:6381", false)));
        let ask = server("-ASK 3999 ::1:6381\r\n");
        assert_eq!(ask.redirection(), Some(("::1:6381", true)));
        assert_eq!(server("-ASK\r\n").redirection(), None);
        assert_eq!(server("-NOSCRIPT x\r\n").redirection(), None);
        assert!(!moved.node_trouble());
        assert!(server("-CLUSTERDOWN The cluster is down\r\n").node_trouble());
        assert!(!server("-COUNTRANGE x\r\n").node_trouble());
        assert!(Answer::TimedOut { sent: true }.node_trouble());
        let readonly = server("-READONLY You can't write against a read only replica.\r\n");
        assert!(readonly.node_trouble());
        assert_eq!(readonly.demotion().unwrap().code(), "ERR_REDIS");
        assert_eq!(server("-ERR x\r\n").demotion(), None);
        assert_eq!(moved.demotion(), None);
    }

    #[test]
    fn answers_become_values_or_errors() {
        let pair = |a, b| Value::Array(vec![Value::Int(a), Value::Int(b)]);
        assert_eq!(outcome(Op::Hit, pair(-3, 10)), Ok(Values::new(&[-3, 10])));
        let max = crate::window::MAX_SAFE;
        assert_eq!(
            outcome(Op::Hit, pair(max + 1, 10)).unwrap_err().code(),
            "ERR_REDIS"
        );
        assert_eq!(
            outcome(Op::Hit, pair(1, 0)).unwrap_err().code(),
            "ERR_REDIS"
        );
        assert_eq!(
            outcome(Op::Hit, Value::Nil).unwrap_err().code(),
            "ERR_REDIS"
        );
        assert_eq!(outcome(Op::Unlink, Value::Int(2)), Ok(Values::new(&[2])));
    }
}
