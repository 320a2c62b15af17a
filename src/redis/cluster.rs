//! Redis Cluster: which node holds a key. The slot map is asked of the
//! cluster (CLUSTER SLOTS) on the first hit and again whenever a node fails
//! or answers MOVED; each node gets a [`Node`] of its own (the connection
//! engine on the I/O thread), with the store's credentials, TLS and
//! timeouts. Nothing here sends a hit: the store does, and follows MOVED
//! and ASK (a redirected script did not run) as [`super::routing`] says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::config::{Addr, Config};
use super::host::Node;
use super::order::KeyOrder;
use super::resp::Value;
use super::stats::Monitor;
use crate::errors::{Error, Result};

pub const SLOTS: usize = 16384;
/// Slot map refreshes are at least this far apart, so that a run of failing
/// hits asks the cluster a few times a second, not once per hit.
const REFRESH_GAP: Duration = Duration::from_millis(100);

/// The slot of a key: CRC16 (XMODEM) of the key, or of its `{hash tag}` if
/// it has a non-empty one, modulo 16384.
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16(tagged) % SLOTS as u16
}

fn crc16(bytes: &[u8]) -> u16 {
    const TABLE: [u16; 256] = {
        let mut table = [0u16; 256];
        let mut i = 0;
        while i < 256 {
            let mut crc = (i as u16) << 8;
            let mut bit = 0;
            while bit < 8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
                bit += 1;
            }
            table[i] = crc;
            i += 1;
        }
        table
    };
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ TABLE[((crc >> 8) as u8 ^ b) as usize]
    })
}

struct Map {
    /// The master of each slot, as an index into `masters`.
    slots: Vec<Option<u16>>,
    masters: Vec<Arc<Node>>,
}

struct State {
    map: Option<Arc<Map>>,
    /// A node per address, kept across refreshes.
    nodes: HashMap<(String, u16), Arc<Node>>,
    refreshing: bool,
    last_refresh: Option<Instant>,
}

pub struct Cluster {
    /// The cluster's settings, each node's made from them.
    config: Config,
    seeds: Vec<(String, u16)>,
    /// Every node is reached over TLS (`rediss://`), or none is.
    tls: bool,
    state: Mutex<State>,
    /// Serializes refreshes; a hit that finds no map waits on it.
    refresh: tokio::sync::Mutex<()>,
    /// What every node's connection counts and tells.
    monitor: Arc<Monitor>,
    /// Keeps the calls on one key in order across pipelines (see [`Cluster::order`]).
    order: KeyOrder,
}

impl Cluster {
    pub fn new(
        config: &Config,
        seeds: &[(String, u16)],
        tls: bool,
        monitor: Arc<Monitor>,
    ) -> Result<Cluster> {
        let cluster = Cluster {
            config: config.clone(),
            seeds: seeds.to_vec(),
            tls,
            state: Mutex::new(State {
                map: None,
                nodes: HashMap::new(),
                refreshing: false,
                last_refresh: None,
            }),
            refresh: tokio::sync::Mutex::new(()),
            monitor,
            order: KeyOrder::default(),
        };
        // Checks the settings (TLS above all) now, as a single store does.
        let (host, port) = cluster
            .seeds
            .first()
            .ok_or_else(|| Error::Config("a Redis Cluster needs at least one seed URL".into()))?;
        cluster.node(host, *port)?;
        Ok(cluster)
    }

    /// What the connections to the nodes count and tell.
    pub fn monitor(&self) -> &Arc<Monitor> {
        &self.monitor
    }

    /// The turns of the pipelines sent to the nodes. A pipeline may hold
    /// some of its calls back (an UNLINK behind the EVALSHAs before it, a
    /// retry after NOSCRIPT, MOVED or ASK) while another pipeline goes on
    /// the same connection, so a later pipeline naming one of its keys
    /// waits for it; pipelines on other keys go at once.
    pub fn order(&self) -> &KeyOrder {
        &self.order
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change leaves the state whole, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node at `host:port`, made on first use.
    pub fn node(&self, host: &str, port: u16) -> Result<Arc<Node>> {
        let mut state = self.lock();
        if let Some(node) = state.nodes.get(&(host.to_string(), port)) {
            return Ok(Arc::clone(node));
        }
        let config = self.config.server(Addr::Tcp {
            host: host.to_string(),
            port,
            tls: self.tls,
        });
        let node = Arc::new(Node::start(&config, Arc::clone(&self.monitor))?);
        state
            .nodes
            .insert((host.to_string(), port), Arc::clone(&node));
        Ok(node)
    }

    /// The node a redirection names (`host:port`).
    pub fn redirected(&self, to: &str) -> Result<Arc<Node>> {
        let (host, port) = to
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse().ok()?)))
            .ok_or_else(|| Error::Redis("a redirection named no node".into()))?;
        self.node(host, port)
    }

    /// The master of each key's slot, as the map says (`None` for a slot no
    /// node serves); waits for the first map.
    pub async fn route(&self, keys: impl Iterator<Item = &[u8]>) -> Result<Vec<Option<Arc<Node>>>> {
        let map = match self.current_map() {
            Some(map) => map,
            None => {
                self.refresh_now(true).await?;
                self.current_map()
                    .ok_or_else(|| Error::Redis("the cluster has no slot map".into()))?
            }
        };
        Ok(keys
            .map(|key| map.slots[slot(key) as usize].map(|i| Arc::clone(&map.masters[i as usize])))
            .collect())
    }

    fn current_map(&self) -> Option<Arc<Map>> {
        self.lock().map.clone()
    }

    /// The map may be out of date (a node failed, or answered MOVED): asks
    /// the cluster again in the background, unless a refresh is under way.
    pub fn stale(self: &Arc<Self>) {
        {
            let mut state = self.lock();
            if state.refreshing {
                return;
            }
            state.refreshing = true;
        }
        let cluster = Arc::clone(self);
        tokio::spawn(async move {
            let _ = cluster.refresh_now(false).await;
            cluster.lock().refreshing = false;
        });
    }

    /// Asks the known masters, then the seeds, for the slot map, until one
    /// answers; with `first`, only if there is no map yet.
    async fn refresh_now(&self, first: bool) -> Result<()> {
        let _one = self.refresh.lock().await;
        let (known, last) = {
            let state = self.lock();
            if first && state.map.is_some() {
                return Ok(());
            }
            let known = state.map.as_ref().map(|m| m.masters.clone());
            (known.unwrap_or_default(), state.last_refresh)
        };
        if let Some(last) = last {
            tokio::time::sleep_until(last + REFRESH_GAP).await;
        }
        let mut candidates = known;
        for (host, port) in &self.seeds {
            candidates.push(self.node(host, *port)?);
        }
        let mut error = Error::Internal("no node to ask for the slot map");
        for node in candidates {
            match self.ask_slots(&node).await {
                Ok(map) => {
                    let mut state = self.lock();
                    state.map = Some(Arc::new(map));
                    state.last_refresh = Some(Instant::now());
                    return Ok(());
                }
                Err(e) => error = e,
            }
        }
        self.lock().last_refresh = Some(Instant::now());
        Err(error)
    }

    async fn ask_slots(&self, node: &Arc<Node>) -> Result<Map> {
        let bound = Duration::from_millis(self.config.timeout_ms);
        // No hit was sent yet: to the hits waiting, a failure is a failed connect.
        let answer = node
            .slots(node.deadline(std::time::Instant::now()))
            .await
            .map_err(|e| match e {
                Error::Timeout { .. } => Error::Timeout {
                    ms: bound.as_millis() as u64,
                    sent: false,
                },
                Error::Connection { text, .. } => Error::Connection {
                    text: format!("could not ask the cluster for its slot map: {text}"),
                    sent: false,
                },
                e => e,
            })?;
        let masters = parse_slots(&answer, node.host())?;
        let mut map = Map {
            slots: vec![None; SLOTS],
            masters: Vec::new(),
        };
        let mut index: HashMap<(String, u16), u16> = HashMap::new();
        for (start, end, host, port) in masters {
            let i = match index.get(&(host.clone(), port)) {
                Some(&i) => i,
                None => {
                    map.masters.push(self.node(&host, port)?);
                    let i = (map.masters.len() - 1) as u16;
                    index.insert((host, port), i);
                    i
                }
            };
            for slot in &mut map.slots[start..=end] {
                *slot = Some(i);
            }
        }
        Ok(map)
    }
}

/// CLUSTER SLOTS: `[start, end, [host, port, …], replicas…]` per range; an
/// empty host is the node that answered.
fn parse_slots(answer: &Value, asked: &str) -> Result<Vec<(usize, usize, String, u16)>> {
    let bad = || Error::Redis("CLUSTER SLOTS gave an answer of an unknown shape".into());
    let Value::Array(Some(ranges)) = answer else {
        return Err(match answer {
            Value::Error(code, detail) => {
                Error::Redis(format!("{code} {detail} (is this a Redis Cluster node?)"))
            }
            _ => bad(),
        });
    };
    let text = |v: &Value| match v {
        Value::Bulk(Some(b)) => String::from_utf8(b.clone()).ok(),
        Value::Status(s) => Some(s.clone()),
        _ => None,
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(Some(items)) = range else {
                return Err(bad());
            };
            match items.as_slice() {
                [Value::Int(start), Value::Int(end), Value::Array(Some(master)), ..]
                    if 0 <= *start && start <= end && (*end as usize) < SLOTS =>
                {
                    let (host, port) = match master.as_slice() {
                        [host, Value::Int(port), ..] => (text(host).ok_or_else(bad)?, *port),
                        _ => return Err(bad()),
                    };
                    let host = match host.as_str() {
                        "" => asked.to_string(),
                        _ => host,
                    };
                    let port = u16::try_from(port).map_err(|_| bad())?;
                    Ok((*start as usize, *end as usize, host, port))
                }
                _ => Err(bad()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::config::Deployment;

    #[test]
    fn slots_match_redis() {
        // CLUSTER KEYSLOT on a real server gives these.
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b""), 0);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    #[test]
    fn one_link_per_node_and_redirections_parsed() {
        let options = crate::redis::Options {
            url: Some("redis://:pw@127.0.0.1:7000".into()),
            cluster: Some(true),
            ..Default::default()
        };
        let config = Config::resolve(&options, |_| None).unwrap();
        let Deployment::Cluster { seeds, tls } = &config.deployment else {
            panic!("a cluster's settings");
        };
        let cluster = Cluster::new(&config, seeds, *tls, Arc::default()).unwrap();
        let a = cluster.redirected("::1:7001").unwrap();
        assert_eq!(a.host(), "::1");
        assert!(Arc::ptr_eq(&a, &cluster.node("::1", 7001).unwrap()));
        assert!(!Arc::ptr_eq(&a, &cluster.node("::1", 7002).unwrap()));
        assert!(cluster.redirected("no-port").is_err());
        assert!(cluster.current_map().is_none());
    }

    #[test]
    fn slots_answer() {
        let node = |host: &str, port| {
            Value::Array(Some(vec![
                Value::Bulk(Some(host.into())),
                Value::Int(port),
                Value::Bulk(Some(b"id".to_vec())),
            ]))
        };
        let answer = Value::Array(Some(vec![
            Value::Array(Some(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.2", 7003),
            ])),
            Value::Array(Some(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("", 7001),
            ])),
        ]));
        assert_eq!(
            parse_slots(&answer, "seed").unwrap(),
            vec![
                (0, 5460, "10.0.0.1".into(), 7000),
                (5461, 16383, "seed".into(), 7001)
            ]
        );
        let out_of_range = Value::Array(Some(vec![Value::Array(Some(vec![
            Value::Int(0),
            Value::Int(16384),
            node("h", 1),
        ]))]));
        assert!(parse_slots(&out_of_range, "seed").is_err());
        assert!(parse_slots(&Value::Bulk(None), "seed").is_err());
        let refused = Value::Error("ERR".into(), "cluster support disabled".into());
        let refused = parse_slots(&refused, "seed").unwrap_err().to_string();
        assert!(
            refused.contains("is this a Redis Cluster node?"),
            "{refused}"
        );
    }
}
