//! `resetAll()` on Redis: every key under the prefix unlinked, page by page
//! (`SCAN … MATCH prefix* COUNT 1000`, then `UNLINK` of what the page found,
//! never `KEYS`, which blocks the server), on the one server or on every
//! master of a cluster (over Upstash's REST API, see `rest`). It runs blocking, on a worker thread, over
//! connections of its own: it is rare, and it must not hold up hits.

use std::time::Duration;

use super::cluster::slot;
use super::config::{Addr, Config, Deployment};
use super::reset::ResetAll;
use super::resp::Value;
use super::socket::Target;
use crate::errors::{Error, Result};

/// Unlinks every key under `prefix`. Refused for an empty prefix.
pub fn reset_all(config: &Config, prefix: &[u8]) -> Result<()> {
    ResetAll::new(prefix)?;
    if config.is_rest() {
        let secrets = config.secrets();
        let secrets: Vec<&[u8]> = secrets.iter().map(Vec::as_slice).collect();
        return super::rest::reset_all(config, prefix).map_err(|e| e.redacted(&secrets));
    }
    let timeout = Duration::from_millis(config.timeout_ms);
    let nodes = match &config.deployment {
        Deployment::Cluster { seeds, tls } => masters(config, seeds, *tls, timeout)?,
        _ => vec![config.clone()],
    };
    let secrets = config.secrets();
    let secrets: Vec<&[u8]> = secrets.iter().map(Vec::as_slice).collect();
    for node in nodes {
        on_node(&node, prefix, timeout, config.is_cluster()).map_err(|e| e.redacted(&secrets))?;
    }
    Ok(())
}

/// Unlinks the keys under `prefix` on one server; on a cluster's master
/// (`by_slot`) each UNLINK names keys of one slot.
fn on_node(node: &Config, prefix: &[u8], timeout: Duration, by_slot: bool) -> Result<()> {
    let ms = timeout.as_millis() as u64;
    let mut socket = Target::new(node)?.connect_blocking(timeout)?;
    let mut plan = ResetAll::new(prefix)?;
    while let Some(scan) = plan.next_scan() {
        let (cursor, keys) = scan_page(socket.command(&scan, ms)?)?;
        // On a cluster each UNLINK names keys of one slot; one server takes any.
        let slot_of = |key: &[u8]| if by_slot { slot(key) } else { 0 };
        for unlink in plan.on_scan_reply(cursor, keys, slot_of) {
            socket.command(&unlink, ms)?;
        }
    }
    Ok(())
}

/// A SCAN reply: the next cursor and the page's keys.
fn scan_page(reply: Value) -> Result<(Vec<u8>, Vec<Vec<u8>>)> {
    let wrong = || Error::Redis("SCAN gave an answer of the wrong shape".into());
    let Value::Array(Some(mut parts)) = reply else {
        return Err(wrong());
    };
    let (Some(Value::Array(Some(keys))), Some(Value::Bulk(Some(cursor)))) =
        (parts.pop(), parts.pop())
    else {
        return Err(wrong());
    };
    let keys = keys
        .into_iter()
        .map(|k| match k {
            Value::Bulk(Some(k)) => Ok(k),
            _ => Err(wrong()),
        })
        .collect::<Result<_>>()?;
    Ok((cursor, keys))
}

/// The cluster's masters, from CLUSTER SLOTS asked of the first seed that
/// answers, each as the config of a single server.
fn masters(
    config: &Config,
    seeds: &[(String, u16)],
    tls: bool,
    timeout: Duration,
) -> Result<Vec<Config>> {
    let mut last = Error::Config("no seed node to ask for the cluster's masters".into());
    for (host, port) in seeds {
        let node = config.server(Addr::Tcp {
            host: host.clone(),
            port: *port,
            tls,
        });
        let asked = Target::new(&node)
            .and_then(|t| t.connect_blocking(timeout))
            .and_then(|mut s| {
                s.command(
                    &[b"CLUSTER".to_vec(), b"SLOTS".to_vec()],
                    timeout.as_millis() as u64,
                )
            });
        match asked {
            Ok(reply) => return masters_of(config, host, tls, reply),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The masters a CLUSTER SLOTS reply names; a node that does not know its
/// own address is at `seed_host`, the seed that answered.
fn masters_of(config: &Config, seed_host: &str, tls: bool, reply: Value) -> Result<Vec<Config>> {
    let wrong = || Error::Redis("CLUSTER SLOTS gave an answer of the wrong shape".into());
    let Value::Array(Some(ranges)) = reply else {
        return Err(wrong());
    };
    let mut found: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(Some(parts)) = range else {
            return Err(wrong());
        };
        let Some(Value::Array(Some(master))) = parts.get(2) else {
            return Err(wrong());
        };
        let (Some(Value::Bulk(Some(host))), Some(Value::Int(port))) =
            (master.first(), master.get(1))
        else {
            return Err(wrong());
        };
        let mut host = String::from_utf8_lossy(host).into_owned();
        if host.is_empty() {
            // A node that does not know its own address: the seed's.
            host = seed_host.to_string();
        }
        let port = u16::try_from(*port).map_err(|_| wrong())?;
        if !found.contains(&(host.clone(), port)) {
            found.push((host, port));
        }
    }
    Ok(found
        .into_iter()
        .map(|(host, port)| config.server(Addr::Tcp { host, port, tls }))
        .collect())
}
