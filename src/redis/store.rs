//! Hits on Redis from the I/O thread, within timeoutMs (connecting
//! included). Hits that arrive together go out as one pipeline per node,
//! each node's connection run by the same engine as the event loop's (see
//! [`super::host`]: EVALSHA, NOSCRIPT, the `WAIT` fence, timeouts). In a
//! cluster a hit that meets MOVED or ASK (its script did not run) is sent
//! to the node named: with NOSCRIPT's, the only safe retries. Nothing else
//! is ever sent again.
//!
//! Over Upstash's REST API the same ops go out as one `/pipeline` request
//! (see [`super::rest`]).
//!
//! Stores with the same settings share their connections (see [`Nodes::shared`]).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::time::timeout_at;

use super::calls::Query;
use super::cluster::Cluster;
use super::config::{Config, Deployment};
use super::host::Node;
use super::reply::{Answers, Code};
use super::rest::Rest;
use super::stats::Monitor;
use crate::errors::{Error, Result};

/// Where hits go: the one server, each key's node in a Redis Cluster, or
/// Upstash's REST API.
#[derive(Clone)]
enum Nodes {
    Single(Arc<Node>),
    Cluster(Arc<Cluster>),
    Rest(Arc<Rest>),
}

/// The nodes of a store that may still be alive, held weakly.
enum WeakNodes {
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
        static SHARED: Mutex<Vec<(Config, WeakNodes)>> = Mutex::new(Vec::new());
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
        let nodes = match &config.deployment {
            Deployment::Cluster { seeds, tls } => {
                Nodes::Cluster(Arc::new(Cluster::new(config, seeds, *tls, monitor)?))
            }
            Deployment::Rest { .. } => Nodes::Rest(Arc::new(Rest::new(config, monitor)?)),
            Deployment::Server(_) | Deployment::Sentinel(_) => {
                Nodes::Single(Arc::new(Node::start(config, monitor.clone())?))
            }
        };
        let held = match &nodes {
            Nodes::Single(node) => WeakNodes::Single(Arc::downgrade(node)),
            Nodes::Cluster(cluster) => WeakNodes::Cluster(Arc::downgrade(cluster)),
            Nodes::Rest(rest) => WeakNodes::Rest(Arc::downgrade(rest)),
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

impl WeakNodes {
    fn upgrade(&self) -> Option<Nodes> {
        match self {
            WeakNodes::Single(node) => node.upgrade().map(Nodes::Single),
            WeakNodes::Cluster(cluster) => cluster.upgrade().map(Nodes::Cluster),
            WeakNodes::Rest(rest) => rest.upgrade().map(Nodes::Rest),
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
        let results = match &self.nodes {
            Nodes::Single(node) => node.hits(queries, false, (started, deadline)).await,
            Nodes::Cluster(cluster) => routed(cluster, queries, (started, deadline)).await,
            Nodes::Rest(rest) => rest.hits(queries, started.into(), deadline.into()).await,
        };
        self.answer(queries, results.into_iter())
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

/// The error a hit's result says its node is in trouble with (it failed,
/// or no longer holds the slot): the slot map is asked for again.
fn node_trouble(result: &Result<Answers>) -> bool {
    match result {
        Ok(_) => false,
        Err(Error::Redis(text)) => text
            .split(' ')
            .next()
            .is_some_and(|code| Code::of(code).node_trouble()),
        Err(Error::Timeout { .. } | Error::Connection { .. } | Error::BackingOff { .. }) => true,
        Err(_) => false,
    }
}

/// What becomes of one hit's result in a cluster.
#[derive(Debug, PartialEq, Eq)]
enum Next<'a> {
    /// Sent again, to the node a MOVED or ASK names (its script did not run).
    Redirect { to: &'a str, asking: bool },
    /// Given to its caller.
    Give,
}

/// The cluster's rule for one hit's result, apart from any I/O: a MOVED or
/// ASK is followed while `redirects_left`, anything else is given; and
/// whether the slot map is to be asked for again (a MOVED, followed or
/// not, or trouble with the node: [`node_trouble`]). An ASK leaves the map
/// as it is: the slot is only moving.
fn next_step(result: &Result<Answers>, redirects_left: usize) -> (Next<'_>, bool) {
    match result {
        Err(Error::Redirected { to, asking, .. }) => {
            let next = match redirects_left {
                0 => Next::Give,
                _ => Next::Redirect {
                    to,
                    asking: *asking,
                },
            };
            (next, !asking)
        }
        _ => (Next::Give, node_trouble(result)),
    }
}

/// Sends each hit to its slot's master, on that node's engine, and follows
/// MOVED and ASK, whose script did not run; nothing else is sent again.
/// Trouble with a node has the slot map asked for again, so hits find a
/// promoted replica.
async fn routed(
    cluster: &Arc<Cluster>,
    queries: &[Query<'_>],
    (started, deadline): (Instant, Instant),
) -> Vec<Result<Answers>> {
    let ms = deadline.saturating_duration_since(started).as_millis() as u64;
    let all = |error: Error| queries.iter().map(|_| Err(error.clone())).collect();
    let unsent = Error::Timeout { ms, sent: false };
    // Taken before anything is awaited, so in the order the calls were made,
    // and held until every answer is in, redirections and retries included.
    let turn = cluster.order().turn(queries.iter().flat_map(|q| q.keys()));
    let Ok(_turn) = timeout_at(deadline.into(), turn).await else {
        return all(unsent);
    };
    let keys = queries.iter().map(|q| q.keys().next().unwrap_or(q.key));
    let nodes = match timeout_at(deadline.into(), cluster.route(keys)).await {
        Ok(Ok(nodes)) => nodes,
        Ok(Err(e)) => return all(e),
        Err(_) => return all(unsent),
    };
    let mut results: Vec<Option<Result<Answers>>> = queries.iter().map(|_| None).collect();
    let mut pending: Vec<(usize, Arc<Node>, bool)> = Vec::with_capacity(queries.len());
    for (i, node) in nodes.into_iter().enumerate() {
        match node {
            Some(node) => pending.push((i, node, false)),
            None => {
                // Only this key fails; the map may have changed since it was read.
                results[i] = Some(Err(Error::Redis(
                    "CLUSTERDOWN the key's slot is not served by any node".into(),
                )));
                cluster.stale();
            }
        }
    }
    for redirects_left in (0..=MAX_REDIRECTS).rev() {
        // One pipeline per node (and per ASK or not).
        let mut groups: Vec<(Arc<Node>, bool, Vec<usize>)> = Vec::new();
        for (i, node, asking) in pending.drain(..) {
            match groups
                .iter_mut()
                .find(|(n, a, _)| Arc::ptr_eq(n, &node) && *a == asking)
            {
                Some((_, _, chosen)) => chosen.push(i),
                None => groups.push((node, asking, vec![i])),
            }
        }
        let sent = join_all(groups.iter().map(|(node, asking, chosen)| {
            let part: Vec<Query> = chosen.iter().map(|&i| queries[i]).collect();
            async move { node.hits(&part, *asking, (started, deadline)).await }
        }))
        .await;
        for ((_, _, chosen), group) in groups.iter().zip(sent) {
            for (&i, result) in chosen.iter().zip(group) {
                let (next, stale) = next_step(&result, redirects_left);
                if stale {
                    cluster.stale();
                }
                match next {
                    Next::Redirect { to, asking } => {
                        cluster.monitor().tally().redirections += 1;
                        match cluster.redirected(to) {
                            Ok(node) => pending.push((i, node, asking)),
                            Err(e) => results[i] = Some(Err(e)),
                        }
                    }
                    Next::Give => results[i] = Some(result),
                }
            }
        }
        if pending.is_empty() {
            break;
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or(Err(Error::Internal("a hit got no answer"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{Answer, Op};

    #[test]
    fn the_sha_is_forty_hex_digits() {
        let sha = Op::Hit.script().unwrap().sha();
        assert_eq!(sha.len(), 40);
        assert!(sha
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }

    #[test]
    fn moved_and_ask_are_followed_while_redirections_are_left_and_moved_asks_for_the_map() {
        let moved = Err(Error::Redirected {
            slot: "3999".into(),
            to: "127.0.0.1:7001".into(),
            asking: false,
        });
        let ask = Err(Error::Redirected {
            slot: "12".into(),
            to: "127.0.0.1:7002".into(),
            asking: true,
        });
        let to = |to, asking| Next::Redirect { to, asking };
        assert_eq!(
            next_step(&moved, MAX_REDIRECTS),
            (to("127.0.0.1:7001", false), true)
        );
        assert_eq!(next_step(&ask, 1), (to("127.0.0.1:7002", true), false));
        // Past its redirections a hit is given its MOVED or ASK; a MOVED still asks for the map.
        assert_eq!(next_step(&moved, 0), (Next::Give, true));
        assert_eq!(next_step(&ask, 0), (Next::Give, false));
        let down = Err(Error::Redis("CLUSTERDOWN The cluster is down".into()));
        assert_eq!(next_step(&down, 3), (Next::Give, true));
        assert_eq!(
            next_step(&Ok((Answer::new(&[1]), Vec::new())), 3),
            (Next::Give, false)
        );
        assert_eq!(
            next_step(&Err(Error::CountOutOfRange), 3),
            (Next::Give, false)
        );
    }

    #[test]
    fn trouble_with_a_node_is_its_failure_or_a_slot_it_no_longer_holds() {
        let error = |e: Error| node_trouble(&Err(e));
        assert!(error(Error::Redis(
            "CLUSTERDOWN The cluster is down".into()
        )));
        assert!(error(Error::Redis("READONLY You can't write".into())));
        assert!(!error(Error::Redis(
            "ERR CLUSTERDOWN named in a message".into()
        )));
        assert!(!error(Error::CountOutOfRange));
        assert!(error(Error::Timeout { ms: 1, sent: true }));
        assert!(!node_trouble(&Ok((Answer::new(&[1]), Vec::new()))));
    }
}
