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
use super::reply::Answers;
use super::rest::Rest;
use super::routing::Routing;
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
            .unwrap_or(Err(Error::Internal("a call got no answer")))
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

/// Sends each hit to its slot's master, on that node's engine, as
/// [`Routing`] says, and follows MOVED and ASK, whose script did not run;
/// nothing else is sent again. Trouble with a node has the slot map asked
/// for again, so hits find a promoted replica.
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
    let mut routing = match timeout_at(deadline.into(), cluster.route(keys)).await {
        Ok(Ok(nodes)) => Routing::new(nodes),
        Ok(Err(e)) => return all(e),
        Err(_) => return all(unsent),
    };
    loop {
        if routing.take_stale() {
            cluster.stale();
        }
        let parts = routing.parts();
        if parts.is_empty() {
            break;
        }
        let sent = join_all(parts.iter().map(|part| {
            let chosen: Vec<Query> = part.hits.iter().map(|&i| queries[i]).collect();
            async move {
                part.node
                    .hits(&chosen, part.asking, (started, deadline))
                    .await
            }
        }))
        .await;
        for (part, results) in parts.iter().zip(sent) {
            routing.answered(part, results, |to| cluster.redirected(to));
        }
        cluster.monitor().tally().redirections += routing.take_redirections();
    }
    routing.finish()
}

#[cfg(test)]
mod tests {
    use crate::ops::Op;

    #[test]
    fn the_sha_is_forty_hex_digits() {
        let sha = Op::Hit.script().unwrap().sha();
        assert_eq!(sha.len(), 40);
        assert!(sha
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }
}
