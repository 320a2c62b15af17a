//! Redis Sentinel (`redis+sentinel://`, `rediss+sentinel://`): finding the
//! master a Sentinel URL names (asking each sentinel in the URL's order, then
//! checking the server's `ROLE`), and hearing its failovers (`+switch-master`,
//! on a thread of its own while the target lives). What a sentinel or the
//! master answers is read by the pure functions at the end of this file,
//! unit-tested below; the connects are the parent's blocking ones.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;

use super::super::config::{Addr, Config, Deployment, Sentinels, SENTINEL_PASSWORD};
use super::super::resp::{self, Parser, Value};
use super::{server_name, unsent, Socket, Target, HANDSHAKE_FAILED};
use crate::errors::{Error, Result};

/// Counts the failovers the sentinels announce (`+switch-master` for the
/// URL's master), heard by a thread that runs while the target lives.
#[derive(Default)]
pub(super) struct Switches {
    count: AtomicU64,
    watching: OnceLock<()>,
    /// The connection ended for good: the thread stops.
    stopped: AtomicBool,
}

impl Target {
    /// Sentinel: how many failovers the sentinels have announced since
    /// [`Target::watch_switches`] (0 for any other target). A connection
    /// opened at one epoch is replaced once the epoch moves. It only reads
    /// a count: the engine asks it, and does no I/O.
    pub fn epoch(&self) -> u64 {
        self.switches.count.load(Ordering::SeqCst)
    }

    /// Sentinel: starts listening for the failovers the sentinels announce,
    /// once, on a thread of its own that runs while the target lives. Each
    /// host's connect calls it ([`Target::connect`]), before it asks the
    /// sentinels for the master.
    pub fn watch_switches(&self) {
        if let Deployment::Sentinel(sentinels) = &self.config.deployment {
            self.switches.watching.get_or_init(|| {
                let targets = sentinels
                    .nodes
                    .iter()
                    .filter_map(|node| self.sentinel(sentinels, node).ok())
                    .collect();
                watch(
                    Arc::downgrade(&self.switches),
                    targets,
                    sentinels.name.clone(),
                    Duration::from_millis(self.config.timeout_ms),
                );
            });
        }
    }

    /// As if the sentinels had announced a failover (for the engine's tests).
    #[cfg(test)]
    pub fn announce_switch(&self) {
        self.switches.count.fetch_add(1, Ordering::SeqCst);
    }

    /// The connection that uses this target ended for good: no more
    /// listening for failovers (the thread ends within a second).
    pub fn stop_watching(&self) {
        self.switches.stopped.store(true, Ordering::SeqCst);
    }

    /// The target of one sentinel, with the sentinels' password, over TLS
    /// (checked against the sentinel's host in the URL) for `rediss+sentinel://`.
    fn sentinel(&self, sentinels: &Sentinels, (host, port): &(String, u16)) -> Result<Target> {
        let tls = match &self.sentinel_tls {
            Some(config) => Some((Arc::clone(config), sentinel_name(host)?)),
            None => None,
        };
        let secure = tls.is_some();
        Ok(Target::found(
            Config {
                deployment: Deployment::Server(Addr::Tcp {
                    host: host.clone(),
                    port: *port,
                    tls: secure,
                }),
                db: 0,
                username: sentinels.username.clone(),
                password: sentinels.password.clone(),
                timeout_ms: self.config.timeout_ms,
                tls_ca: None,
                wait_replicas: 0,
            },
            tls,
        ))
    }

    /// Sentinel: asks the sentinels where the master is, connects there and
    /// greets it, and checks that `ROLE` says master; a server that is not
    /// (yet, or any more) the master, or one that can't be reached, makes
    /// the sentinels be asked again, until `timeout`. Answers the socket
    /// and the master's address as the sentinel gave it. Over TLS the
    /// master's certificate is checked against that address (usually an IP).
    pub(super) fn connect_master(
        &self,
        sentinels: &Sentinels,
        timeout: Duration,
    ) -> Result<(Socket, String, u16)> {
        let deadline = Instant::now() + timeout;
        let ms = timeout.as_millis() as u64;
        let left = || {
            deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
        };
        let mut last = None;
        while let Some(budget) = left() {
            let tried = self.ask_sentinels(sentinels, deadline).and_then(|(host, port)| {
                let tls = match &self.sentinel_tls {
                    Some(config) => Some((Arc::clone(config), master_name(&host)?)),
                    None => None,
                };
                let master = Target::found(
                    self.config.server(Addr::Tcp {
                        host: host.clone(),
                        port,
                        tls: tls.is_some(),
                    }),
                    tls,
                );
                let mut socket = master.connect_blocking(budget).map_err(|e| match e {
                    Error::Connection { text, sent } if text.starts_with(HANDSHAKE_FAILED) => {
                        Error::Connection {
                            text: format!(
                                "{text} (with the master, whose certificate must name the address \
                                 the sentinels give for it)"
                            ),
                            sent,
                        }
                    }
                    e => e,
                })?;
                if !is_master(&socket.command(&[b"ROLE".to_vec()], ms)?) {
                    return Err(unsent(
                        "the server the sentinels named as the master is not a master (a failover is under way)"
                            .into(),
                    ));
                }
                socket
                    .stream
                    .set_timeouts(Some(timeout))
                    .map_err(|e| unsent(format!("could not connect to Redis: {e}")))?;
                Ok((socket, host, port))
            });
            match tried {
                Ok(socket) => return Ok(socket),
                // Reachable but wrong: the settings, the name, a password.
                Err(e @ (Error::Config(_) | Error::Auth(_))) => return Err(e),
                // A certificate not trusted, or not for the name: asking again won't change it.
                Err(Error::Connection { text, sent }) if text.contains(HANDSHAKE_FAILED) => {
                    return Err(Error::Connection { text, sent })
                }
                Err(e) => last = Some(e),
            }
            if let Some(wait) = left() {
                std::thread::sleep(wait.min(Duration::from_millis(100)));
            }
        }
        Err(match last {
            Some(Error::Connection { text, .. }) => unsent(format!("{text} (within {ms} ms)")),
            _ => Error::Timeout { ms, sent: false },
        })
    }

    /// The master's address, from the first sentinel (in the URL's order)
    /// that knows it; each sentinel gets a share of the time left.
    fn ask_sentinels(&self, sentinels: &Sentinels, deadline: Instant) -> Result<(String, u16)> {
        let nodes = &sentinels.nodes;
        let ask = [
            b"SENTINEL".to_vec(),
            b"get-master-addr-by-name".to_vec(),
            sentinels.name.as_bytes().to_vec(),
        ];
        let mut unknown = false;
        let mut last = None;
        for (i, node) in nodes.iter().enumerate() {
            let Some(left) = deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
            else {
                break;
            };
            let budget = left / (nodes.len() - i) as u32;
            let answer = self
                .sentinel(sentinels, node)
                .and_then(|sentinel| sentinel.connect_blocking(budget))
                .and_then(|mut socket| socket.command(&ask, budget.as_millis().max(1) as u64));
            match answer.map(master_address) {
                Ok(MasterAddress::At(host, port)) => return Ok((host, port)),
                Ok(MasterAddress::Unknown) => unknown = true,
                Ok(MasterAddress::Malformed) => {
                    last = Some(unsent("a sentinel answered an address of the wrong shape".into()))
                }
                Err(Error::Auth(text)) => {
                    return Err(Error::Auth(format!(
                        "a sentinel refused them, {text}; the sentinels take the {SENTINEL_PASSWORD} query parameter"
                    )))
                }
                Err(e) => last = Some(e),
            }
        }
        Err(no_master(unknown, last))
    }
}

/// Listens for `+switch-master` on one sentinel after another (the first
/// that takes the subscription), counting each announcement for `name` in
/// `switches`, until nobody holds them. A subscription lost and made again
/// counts as a switch too: one may have been missed meanwhile.
fn watch(switches: Weak<Switches>, sentinels: Vec<Target>, name: String, timeout: Duration) {
    let bump = |switches: &Weak<Switches>| {
        if let Some(switches) = switches.upgrade() {
            switches.count.fetch_add(1, Ordering::SeqCst);
        }
    };
    let alive = |switches: &Weak<Switches>| {
        switches
            .upgrade()
            .is_some_and(|s| !s.stopped.load(Ordering::SeqCst))
    };
    let spawned = std::thread::Builder::new()
        .name("ratestore-sentinel-watch".into())
        .spawn(move || {
            let mut subscribed_before = false;
            while alive(&switches) {
                for sentinel in &sentinels {
                    let Ok(mut socket) = sentinel.connect_blocking(timeout) else {
                        continue;
                    };
                    let mut out = Vec::new();
                    resp::encode(&mut out, &[b"SUBSCRIBE", b"+switch-master"]);
                    // Woken each second to see whether the target still lives.
                    let ready = socket
                        .write_all_blocking(&out)
                        .and_then(|()| socket.stream.set_timeouts(Some(Duration::from_secs(1))));
                    if ready.is_err() {
                        continue;
                    }
                    if std::mem::replace(&mut subscribed_before, true) {
                        bump(&switches);
                    }
                    let mut parser = Parser::default();
                    let mut buf = [0u8; 4096];
                    while alive(&switches) {
                        match parser.next() {
                            Ok(Some(reply)) => {
                                if announces_switch(&reply, &name) {
                                    bump(&switches);
                                }
                            }
                            Ok(None) => match socket.read_blocking(&mut buf) {
                                Ok(0) => break,
                                Ok(n) => parser.feed(&buf[..n]),
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                                    ) => {}
                                Err(_) => break,
                            },
                            Err(_) => break,
                        }
                    }
                    if !alive(&switches) {
                        return;
                    }
                }
                if alive(&switches) {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        });
    // Without the thread, a failover is still followed once the old
    // master's connection is lost or answers READONLY.
    drop(spawned);
}

/// A sentinel's TLS server name: its host in the URL.
pub(super) fn sentinel_name(host: &str) -> Result<ServerName<'static>> {
    server_name(host)
        .map_err(|_| Error::Config("a sentinel's host is not a valid TLS server name".into()))
}

fn master_name(host: &str) -> Result<ServerName<'static>> {
    ServerName::try_from(host.to_string()).map_err(|_| {
        Error::Config(
            "the sentinels named the master by an address that is not a valid TLS server name"
                .into(),
        )
    })
}

/// What a sentinel answered `SENTINEL get-master-addr-by-name <name>`.
#[derive(Debug, PartialEq)]
enum MasterAddress {
    /// The master's host and port, as the sentinel knows them.
    At(String, u16),
    /// nil: the sentinel knows no master of that name.
    Unknown,
    /// Anything else.
    Malformed,
}

fn master_address(reply: Value) -> MasterAddress {
    match reply {
        Value::Array(None) | Value::Bulk(None) => MasterAddress::Unknown,
        Value::Array(Some(parts)) => match parts.as_slice() {
            [Value::Bulk(Some(host)), Value::Bulk(Some(port))] => {
                let host = String::from_utf8(host.clone()).ok();
                let port = std::str::from_utf8(port).ok().and_then(|p| p.parse().ok());
                match (host, port) {
                    (Some(host), Some(port)) => MasterAddress::At(host, port),
                    _ => MasterAddress::Malformed,
                }
            }
            _ => MasterAddress::Malformed,
        },
        _ => MasterAddress::Malformed,
    }
}

/// Whether a `ROLE` reply says master (its first element).
fn is_master(reply: &Value) -> bool {
    matches!(reply, Value::Array(Some(parts))
        if matches!(parts.first(), Some(Value::Bulk(Some(role))) if role == b"master"))
}

/// Whether a message on the `+switch-master` subscription announces a
/// failover of the master `name` (its text: `<name> <old ip> <old port>
/// <new ip> <new port>`).
fn announces_switch(reply: &Value, name: &str) -> bool {
    let Value::Array(Some(parts)) = reply else {
        return false;
    };
    let [Value::Bulk(Some(kind)), _, Value::Bulk(Some(text))] = parts.as_slice() else {
        return false;
    };
    kind == b"message"
        && text.len() > name.len()
        && text.starts_with(name.as_bytes())
        && text[name.len()] == b' '
}

/// The error once no sentinel gave an address: `unknown` if one answered
/// nil, `last` the last other failure.
fn no_master(unknown: bool, last: Option<Error>) -> Error {
    match (unknown, last) {
        (true, None) => Error::Config(
            "the sentinels know no master of the name in the URL (SENTINEL get-master-addr-by-name \
             answered nil): check the name after the last /"
                .into(),
        ),
        (_, Some(Error::Timeout { .. })) | (_, None) => {
            unsent("could not reach any sentinel: each timed out".into())
        }
        (_, Some(Error::Connection { text, .. })) => {
            unsent(format!("could not reach any sentinel: {text}"))
        }
        (_, Some(e)) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::Bulk(Some(s.as_bytes().to_vec()))
    }

    fn array(parts: Vec<Value>) -> Value {
        Value::Array(Some(parts))
    }

    /// A reply as the server writes it, read by the RESP parser.
    fn parsed(wire: &[u8]) -> Value {
        let mut parser = Parser::default();
        parser.feed(wire);
        parser.next().unwrap().unwrap()
    }

    #[test]
    fn reads_the_masters_address() {
        let reply = parsed(b"*2\r\n$9\r\n127.0.0.1\r\n$4\r\n6380\r\n");
        assert_eq!(
            master_address(reply),
            MasterAddress::At("127.0.0.1".into(), 6380)
        );
        let v6 = array(vec![bulk("::1"), bulk("26379")]);
        assert_eq!(master_address(v6), MasterAddress::At("::1".into(), 26379));
    }

    #[test]
    fn reads_nil_as_no_master_of_that_name() {
        assert_eq!(master_address(parsed(b"*-1\r\n")), MasterAddress::Unknown);
        assert_eq!(master_address(parsed(b"$-1\r\n")), MasterAddress::Unknown);
    }

    #[test]
    fn refuses_an_address_of_the_wrong_shape() {
        for reply in [
            array(vec![bulk("127.0.0.1")]),
            array(vec![bulk("127.0.0.1"), bulk("6380"), bulk("extra")]),
            array(vec![bulk("127.0.0.1"), bulk("port")]),
            array(vec![bulk("127.0.0.1"), bulk("70000")]),
            array(vec![bulk("127.0.0.1"), Value::Int(6380)]),
            array(vec![Value::Bulk(Some(vec![0xff, 0xfe])), bulk("6380")]),
            Value::Int(1),
            parsed(b"-ERR unknown command\r\n"),
        ] {
            assert_eq!(master_address(reply), MasterAddress::Malformed);
        }
    }

    #[test]
    fn reads_role_master_only_from_a_master() {
        let master = parsed(b"*3\r\n$6\r\nmaster\r\n:3129659\r\n*0\r\n");
        assert!(is_master(&master));
        let replica = array(vec![bulk("slave"), bulk("127.0.0.1"), Value::Int(6380)]);
        assert!(!is_master(&replica));
        assert!(!is_master(&array(vec![bulk("sentinel"), array(vec![])])));
        assert!(!is_master(&array(vec![])));
        assert!(!is_master(&bulk("master")));
    }

    #[test]
    fn hears_a_switch_of_its_master_only() {
        let message = |text: &str| array(vec![bulk("message"), bulk("+switch-master"), bulk(text)]);
        assert!(announces_switch(
            &message("mymaster 127.0.0.1 6379 127.0.0.1 6380"),
            "mymaster"
        ));
        // Another master, one whose name begins with this one's, and this name alone.
        assert!(!announces_switch(
            &message("other 127.0.0.1 6379 127.0.0.1 6380"),
            "mymaster"
        ));
        assert!(!announces_switch(
            &message("mymaster2 127.0.0.1 6379 127.0.0.1 6380"),
            "mymaster"
        ));
        assert!(!announces_switch(&message("mymaster"), "mymaster"));
        // The subscription's confirmation is not a switch.
        let subscribed = array(vec![
            bulk("subscribe"),
            bulk("+switch-master"),
            Value::Int(1),
        ]);
        assert!(!announces_switch(&subscribed, "mymaster"));
        let wire = b"*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$38\r\nmymaster 127.0.0.1 6379 127.0.0.1 6380\r\n";
        assert!(announces_switch(&parsed(wire), "mymaster"));
    }

    #[test]
    fn says_why_no_sentinel_gave_an_address() {
        let nil = no_master(true, None);
        assert!(matches!(&nil, Error::Config(text) if text.contains("know no master")));
        let timed_out = no_master(false, Some(Error::Timeout { ms: 5, sent: false }));
        assert!(
            matches!(&timed_out, Error::Connection { text, sent: false } if text.contains("each timed out"))
        );
        assert!(matches!(
            no_master(false, None),
            Error::Connection { sent: false, .. }
        ));
        // A connection failure names its cause, and is never sent; it wins over a nil seen before it.
        let refused = no_master(
            true,
            Some(Error::Connection {
                text: "connection refused".into(),
                sent: true,
            }),
        );
        assert!(matches!(&refused, Error::Connection { text, sent: false }
            if text == "could not reach any sentinel: connection refused"));
        let shape = no_master(false, Some(Error::Config("x".into())));
        assert!(matches!(shape, Error::Config(_)));
    }
}
