//! The connection engine and a Redis server in memory, joined as quinn's
//! `Pair` joins a connection and its peer: what the engine writes, the
//! server reads and answers; what the server answers, the engine reads;
//! time is a value the test moves. No socket, no clock, no thread, so each
//! of the engine's rules (the table in `conn.rs`'s and `pipe.rs`'s docs:
//! encoding, EVALSHA and NOSCRIPT, order, the `WAIT` fence, a Sentinel
//! switch, timeouts, a stuck connection, backoff, redaction, a cluster's
//! MOVED and ASK across two engines) is tested here deterministically,
//! end to end through the engine's one API, as both hosts drive it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::{Config, Options};
use super::conn::{Conn, Io};
use super::pipe::{Request, Route};
use super::reply::Answers;
use super::resp::{Parser, Value};
use super::socket::Target;
use crate::delivery::Completion;
use crate::errors::Error;
use crate::ops::{Answer, Op};

/// A host in memory: it records what the engine asked of it, keeps the
/// bytes the engine writes, and gives it the bytes put in its inbox.
#[derive(Default)]
pub struct Fake {
    pub connects: Vec<(Arc<Target>, Duration)>,
    pub opened: usize,
    pub watching: Vec<bool>,
    pub closed: usize,
    pub armed: Vec<Option<Instant>>,
    pub torn_down: usize,
    /// What the engine wrote.
    pub sent: Vec<u8>,
    /// The most a write takes (None: all of it).
    pub room: Option<usize>,
    /// The server's bytes, not yet read, and whether it has closed.
    pub inbox: Vec<u8>,
    pub hung_up: bool,
}

impl Io for Fake {
    type Socket = ();
    fn connect(&mut self, target: Arc<Target>, timeout: Duration) -> Result<(), Error> {
        self.connects.push((target, timeout));
        Ok(())
    }
    fn open(&mut self, (): ()) -> Result<(), Error> {
        // A new socket: nothing the old one was sent reaches it.
        self.opened += 1;
        self.hung_up = false;
        self.inbox.clear();
        Ok(())
    }
    fn watch(&mut self, writing: bool) -> bool {
        self.watching.push(writing);
        true
    }
    fn read(&mut self, parser: &mut Parser) -> std::io::Result<bool> {
        parser.feed(&std::mem::take(&mut self.inbox));
        Ok(!self.hung_up)
    }
    fn write(&mut self, out: &mut Vec<u8>) -> std::io::Result<bool> {
        let n = self.room.map_or(out.len(), |room| room.min(out.len()));
        self.sent.extend(out.drain(..n));
        Ok(out.is_empty())
    }
    fn close(&mut self) {
        self.closed += 1;
    }
    fn arm(&mut self, at: Option<Instant>) {
        self.armed.push(at);
    }
    fn teardown(&mut self) {
        self.torn_down += 1;
    }
}

fn word(v: &Value) -> String {
    match v {
        Value::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    }
}

/// A Redis server in memory, with enough of Redis for the engine's rules:
/// a script cache (EVAL loads a script, EVALSHA of one it does not hold
/// answers NOSCRIPT and runs nothing), the fixed-window hit counted per key
/// (the window script's `[count, resetMs]`, its window never ending), `WAIT`
/// answered with its replicas, UNLINK, PING, and a cluster's MOVED and ASK
/// for the keys it does not serve.
#[derive(Default)]
pub struct Server {
    /// The SHA1s of the scripts it holds.
    scripts: HashSet<String>,
    /// Each key's count.
    pub counts: HashMap<Vec<u8>, i64>,
    /// What `WAIT` answers.
    pub replicas: i64,
    /// Keys it answers `MOVED <slot> <to>` for.
    pub moved: HashMap<Vec<u8>, String>,
    /// Keys being imported from it: `ASK <slot> <to>`, unless after `ASKING`.
    pub migrating: HashMap<Vec<u8>, String>,
    /// Keys it takes only after `ASKING`, else `MOVED` to the value.
    pub importing: HashMap<Vec<u8>, String>,
    /// An error every hit is answered with (e.g. `READONLY ...`).
    pub error: Option<String>,
    /// Another client loads the scripts again after this many NOSCRIPTs.
    pub reloaded_after: Option<usize>,
    /// Its answers wait until [`Server::release`].
    pub holding: bool,
    held: Vec<Vec<u8>>,
    asking: bool,
    /// Every command it read, as its words, in order.
    pub received: Vec<Vec<String>>,
    /// Every key a hit named, as its bytes, in order.
    pub keys: Vec<Vec<u8>>,
    parser: Parser,
}

impl Server {
    /// Forgets every script (SCRIPT FLUSH, a restart, a failover to a
    /// replica that never ran them).
    pub fn flush_scripts(&mut self) {
        self.scripts.clear();
    }

    /// Gives back the answers it held, and answers at once from now on.
    pub fn release(&mut self) -> Vec<u8> {
        self.holding = false;
        std::mem::take(&mut self.held).concat()
    }

    /// Gives back the first `n` answers it held, holding the rest.
    pub fn release_first(&mut self, n: usize) -> Vec<u8> {
        self.held.drain(..n).collect::<Vec<_>>().concat()
    }

    /// Reads `bytes` (whole commands or parts), answers every whole command.
    pub fn take(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.parser.feed(bytes);
        let mut out = Vec::new();
        while let Some(Value::Array(Some(parts))) = self.parser.next().unwrap() {
            let bulk = |i: usize| match parts.get(i) {
                Some(Value::Bulk(Some(b))) => b.clone(),
                _ => Vec::new(),
            };
            let words: Vec<String> = parts.iter().map(word).collect();
            let reply = match words[0].as_str() {
                "PING" => "+PONG\r\n".to_string(),
                "ASKING" => {
                    self.asking = true;
                    "+OK\r\n".to_string()
                }
                "WAIT" => format!(":{}\r\n", self.replicas),
                "UNLINK" => {
                    let gone = self.counts.remove(&bulk(1)).is_some();
                    format!(":{}\r\n", gone as i64)
                }
                "EVAL" | "EVALSHA" => {
                    let asking = std::mem::take(&mut self.asking);
                    self.run(&words, &bulk(3), asking)
                }
                other => format!("-ERR unknown command '{other}'\r\n"),
            };
            self.received.push(words);
            match self.holding {
                true => self.held.push(reply.into_bytes()),
                false => out.extend_from_slice(reply.as_bytes()),
            }
        }
        out
    }

    /// An EVAL or EVALSHA of the hit script on `key`.
    fn run(&mut self, words: &[String], key: &[u8], asking: bool) -> String {
        let script = Op::Hit.script().expect("a hit runs a script");
        let sha = match words[0].as_str() {
            "EVAL" if words[1] == script.body => script.sha().to_string(),
            "EVAL" => return "-ERR only the hit script runs here\r\n".into(),
            _ => words[1].clone(),
        };
        if words[0] == "EVAL" {
            self.scripts.insert(sha.clone());
        }
        if !self.scripts.contains(&sha) {
            if let Some(left) = self.reloaded_after.as_mut() {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    self.scripts.insert(script.sha().to_string());
                    self.reloaded_after = None;
                }
            }
            return "-NOSCRIPT No matching script. Please use EVAL.\r\n".into();
        }
        if let Some(to) = self.moved.get(key) {
            return format!("-MOVED 3999 {to}\r\n");
        }
        if let Some(to) = self.migrating.get(key) {
            return format!("-ASK 3999 {to}\r\n");
        }
        if let (Some(to), false) = (self.importing.get(key), asking) {
            return format!("-MOVED 3999 {to}\r\n");
        }
        if let Some(error) = &self.error {
            return format!("-{error}\r\n");
        }
        self.keys.push(key.to_vec());
        let amount: i64 = words[5].parse().unwrap();
        let count = self.counts.entry(key.to_vec()).or_default();
        *count += amount;
        format!("*2\r\n:{count}\r\n:{}\r\n", words[4])
    }
}

/// One engine (one store joined) and its server, on time as a value.
pub struct Pair {
    pub conn: Conn<Fake, ()>,
    pub sink: usize,
    pub server: Server,
    pub now: Instant,
    /// Connects the host answers: refused while set.
    pub refusing: bool,
    answered_connects: usize,
    next: u32,
}

impl Pair {
    /// An engine for `url`, with a `timeoutMs` of 1 s.
    pub fn new(url: &str) -> Pair {
        Pair::with(Options {
            url: Some(url.into()),
            ..Options::default()
        })
    }

    pub fn with(options: Options) -> Pair {
        let options = Options {
            timeout_ms: options.timeout_ms.or(Some(1_000)),
            ..options
        };
        let config = Config::resolve(&options, |_| None).unwrap();
        let mut conn = Conn::new(&config, config.clone(), Fake::default(), 7).unwrap();
        let sink = conn.join(());
        Pair {
            conn,
            sink,
            server: Server::default(),
            now: Instant::now(),
            refusing: false,
            answered_connects: 0,
            next: 0,
        }
    }

    /// Hands the engine a hit of `amount` on `key` now (after `ASKING` on
    /// [`Route::Asking`]), due within the store's timeout: its id, or why it
    /// was refused at once.
    pub fn send(&mut self, key: &[u8], amount: i64, route: Route) -> Result<u32, Error> {
        self.next += 1;
        let request = Request {
            id: (self.sink as u64) << 32 | self.next as u64,
            op: Op::Hit,
            args: [60_000, amount, 0, 0],
            key: key.into(),
            sent_at: self.now,
            deadline: self.now + Duration::from_secs(1),
            route,
        };
        self.conn.send(self.sink, request).map(|()| self.next)
    }

    pub fn hit(&mut self, key: &str, amount: i64) -> u32 {
        self.send(key.as_bytes(), amount, Route::Direct).unwrap()
    }

    /// Runs the host until nothing moves: connects answered (or refused),
    /// what the engine wrote taken by the server, its answers read.
    pub fn drive(&mut self) {
        loop {
            let mut moved = false;
            if self.conn.io.connects.len() > self.answered_connects {
                self.answered_connects = self.conn.io.connects.len();
                let result = match self.refusing {
                    true => Err(Error::Connection {
                        text: "connection refused".into(),
                        sent: false,
                    }),
                    false => Ok(()),
                };
                self.conn.connected(result, self.now);
                moved = true;
            }
            self.conn.flush(self.now);
            let written = std::mem::take(&mut self.conn.io.sent);
            let answers = self.server.take(&written);
            if !answers.is_empty() {
                self.answer(&answers);
                moved = true;
            }
            if !moved {
                break;
            }
        }
        self.conn.arm();
    }

    /// The server's bytes reach the engine.
    pub fn answer(&mut self, bytes: &[u8]) {
        self.conn.io.inbox.extend_from_slice(bytes);
        self.conn.ready(true, false, self.now);
    }

    /// Moves time on by `by`; the timer fires if it is due.
    pub fn advance(&mut self, by: Duration) {
        self.now += by;
        if self.conn.poll_timeout().is_some_and(|at| at <= self.now) {
            self.conn.handle_timeout(self.now);
        }
        self.drive();
    }

    /// The results settled since last asked, by id.
    pub fn done(&mut self) -> Vec<Completion> {
        self.conn.route();
        let sink = self.conn.sinks[self.sink].as_mut().unwrap();
        std::mem::take(&mut sink.done)
    }

    /// Each result's count (its error's code if it failed), in id order.
    pub fn counts(&mut self) -> Vec<(u32, Result<i64, &'static str>)> {
        let mut done: Vec<_> = self
            .done()
            .into_iter()
            .map(|c| (c.id, c.result.map(|a| a.values[0]).map_err(|e| e.code())))
            .collect();
        done.sort_by_key(|(id, _)| *id);
        done
    }
}

/// A result as the cluster's routing takes it.
pub fn answers(result: Result<Answer, Error>) -> Result<Answers, Error> {
    result.map(|answer| (answer, Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::routing::{NodeRef, Routing};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The first word of each command the server read, and its key (a
    /// `WAIT`'s replicas).
    fn commands(server: &Server) -> Vec<(&str, &str)> {
        server
            .received
            .iter()
            .map(|w| (w[0].as_str(), w.get(3).or(w.get(1)).map_or("", |s| s)))
            .collect()
    }

    /// A pair whose hit 1, on `p:a`, was answered (the script is loaded) and taken.
    fn warmed() -> Pair {
        let mut p = Pair::new("redis://127.0.0.1:1");
        p.hit("p:a", 1);
        p.drive();
        assert_eq!(p.counts(), [(1, Ok(1))]);
        p
    }

    /// The one result settled since last asked.
    fn one(p: &mut Pair) -> Completion {
        let mut done = p.done();
        assert_eq!(done.len(), 1);
        done.pop().unwrap()
    }

    #[test]
    fn a_hit_goes_as_eval_once_then_evalsha_and_the_server_reads_its_key_and_numbers_whole() {
        let mut p = Pair::new("redis://127.0.0.1:1");
        // A key that holds RESP's own framing and a byte that is not UTF-8.
        let key = b"p:\r\n$3\r\n\xff{k}".to_vec();
        p.send(&key, 2, Route::Direct).unwrap();
        p.drive();
        p.send(&key, 3, Route::Direct).unwrap();
        p.drive();
        assert_eq!(p.counts(), [(1, Ok(2)), (2, Ok(5))]);
        let sha = Op::Hit.script().unwrap().sha();
        let evalsha = &p.server.received[1];
        assert_eq!(p.server.received[0][0], "EVAL");
        assert_eq!((evalsha[0].as_str(), evalsha[1].as_str()), ("EVALSHA", sha));
        assert_eq!(
            (&evalsha[2], &evalsha[4], &evalsha[5]),
            (&"1".into(), &"60000".into(), &"3".into())
        );
        assert_eq!(p.server.keys, [key.clone(), key]);
        assert_eq!(p.conn.pipe.tally.connects, 1);
    }

    #[test]
    fn after_the_script_cache_is_flushed_each_hit_counts_once_and_in_the_order_sent() {
        let mut p = Pair::new("redis://127.0.0.1:1");
        p.hit("p:a", 1);
        p.drive();
        p.server.flush_scripts();
        // One pipeline: all three meet NOSCRIPT and run nothing.
        for key in ["p:a", "p:b", "p:a"] {
            p.hit(key, 1);
        }
        p.drive();
        assert_eq!(p.counts(), [(1, Ok(1)), (2, Ok(2)), (3, Ok(1)), (4, Ok(3))]);
        assert_eq!(p.server.counts[&b"p:a"[..]], 3);
        assert_eq!(p.server.counts[&b"p:b"[..]], 1);
        assert_eq!(
            commands(&p.server),
            [
                ("EVAL", "p:a"),
                ("EVALSHA", "p:a"),
                ("EVALSHA", "p:b"),
                ("EVALSHA", "p:a"),
                ("EVAL", "p:a"),
                ("EVAL", "p:b"),
                ("EVAL", "p:a"),
            ]
        );
        assert_eq!(p.conn.pipe.tally.noscript, 3);
        // Loaded again: the next hit goes as EVALSHA.
        p.hit("p:b", 1);
        p.drive();
        assert_eq!(p.counts(), [(5, Ok(2))]);
        assert_eq!(commands(&p.server).last(), Some(&("EVALSHA", "p:b")));
    }

    #[test]
    fn a_hit_that_met_noscript_behind_a_later_hit_on_its_key_that_ran_is_not_sent_again() {
        let mut p = warmed();
        // Flushed; another client loads the script between hits 2 and 3.
        p.server.flush_scripts();
        p.server.reloaded_after = Some(1);
        p.hit("p:a", 1);
        p.hit("p:a", 1);
        p.drive();
        let done = p.done();
        assert_eq!(done.len(), 2);
        let overtaken = done.iter().find(|c| c.id == 2).unwrap();
        assert_eq!(overtaken.result, Err(Error::Overtaken));
        assert_eq!(overtaken.result.as_ref().unwrap_err().sent(), Some(false));
        let ran = done.iter().find(|c| c.id == 3).unwrap();
        assert_eq!(ran.result.as_ref().unwrap().values[0], 2);
        assert_eq!(p.server.counts[&b"p:a"[..]], 2, "hit 2 never ran");
        assert_eq!(p.server.received.len(), 3, "nothing was sent again");
    }

    #[test]
    fn with_wait_for_replicas_a_hit_is_given_once_a_wait_after_it_says_enough_replicas_have_it() {
        let mut p = Pair::with(Options {
            url: Some("redis://127.0.0.1:1".into()),
            wait_replicas: Some(1),
            ..Options::default()
        });
        p.server.replicas = 1;
        p.hit("p:a", 1);
        p.hit("p:b", 1);
        p.drive();
        assert_eq!(p.counts(), [(1, Ok(1)), (2, Ok(1))]);
        let words: Vec<_> = commands(&p.server).iter().map(|c| c.0).collect();
        assert_eq!(
            words,
            ["EVAL", "EVALSHA", "WAIT"],
            "one WAIT covers the batch"
        );
        assert_eq!(p.server.received[2][1], "1");
        // No replica confirms: the hit ran on the master, and rejects as sent.
        p.server.replicas = 0;
        p.hit("p:a", 1);
        p.drive();
        let done = one(&mut p);
        let error = done.result.unwrap_err();
        assert!(
            matches!(
                error,
                Error::Unconfirmed {
                    acked: 0,
                    wanted: 1,
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(error.sent(), Some(true));
        assert_eq!(p.server.counts[&b"p:a"[..]], 2);
    }

    #[test]
    fn a_failover_rejects_what_the_old_master_holds_as_sent_and_the_next_hit_goes_to_the_new_one() {
        let mut p = Pair::new("redis+sentinel://127.0.0.1:1/mymaster");
        p.hit("p:a", 1);
        p.drive();
        p.server.holding = true;
        p.hit("p:a", 1);
        p.drive();
        assert_eq!(p.counts(), [(1, Ok(1))]);
        p.conn.target().announce_switch();
        let old = std::mem::take(&mut p.server);
        p.hit("p:a", 1);
        p.drive();
        let done = p.counts();
        assert_eq!(done, [(2, Err("ERR_CONNECTION")), (3, Ok(1))]);
        assert_eq!(
            old.counts[&b"p:a"[..]],
            2,
            "hit 2 may have counted on the old master"
        );
        // The new master never ran the script: the new connection loads it.
        assert_eq!(commands(&p.server), [("EVAL", "p:a")]);
        assert_eq!((p.conn.io.connects.len(), p.conn.io.closed), (2, 1));
    }

    #[test]
    fn a_hit_unanswered_by_its_deadline_rejects_sent_and_its_late_answer_settles_nothing() {
        let mut p = warmed();
        // A slow server: hit 2's answer comes after hit 3 was handed over, hit 3's after its deadline.
        p.server.holding = true;
        p.hit("p:b", 1);
        p.drive();
        p.advance(ms(500));
        p.hit("p:a", 1);
        p.drive();
        p.advance(ms(100));
        let first = p.server.release_first(1);
        p.answer(&first);
        assert_eq!(p.counts(), [(2, Ok(1))]);
        p.advance(ms(899));
        assert!(p.done().is_empty(), "not due a millisecond early");
        p.advance(ms(1));
        let done = one(&mut p);
        assert_eq!(
            done.result,
            Err(Error::Timeout {
                ms: 1_000,
                sent: true
            })
        );
        // The connection answered meanwhile, so it is kept; the late answer
        // settles nothing, and the count it made shows in the next hit's.
        let late = p.server.release();
        p.answer(&late);
        assert!(p.done().is_empty());
        p.hit("p:a", 1);
        p.drive();
        assert_eq!(p.counts(), [(4, Ok(3))]);
        assert_eq!((p.conn.io.connects.len(), p.conn.io.closed), (1, 0));
        assert_eq!(p.conn.pipe.tally.timeouts, 1);
    }

    #[test]
    fn a_connection_that_answers_nothing_is_replaced_and_the_next_hit_goes_on_a_new_one() {
        let mut p = warmed();
        // A paused server: nothing has answered since hit 2 was sent.
        p.server.holding = true;
        p.hit("p:a", 1);
        p.drive();
        p.advance(ms(1_000));
        assert_eq!(p.counts(), [(2, Err("ERR_TIMEOUT"))]);
        assert_eq!(p.conn.io.closed, 1, "the stuck connection is closed");
        p.server.release();
        p.hit("p:a", 1);
        p.drive();
        assert_eq!(p.counts(), [(3, Ok(3))]);
        assert_eq!(p.conn.io.connects.len(), 2);
        assert_eq!(
            commands(&p.server).last(),
            Some(&("EVAL", "p:a")),
            "a new connection loads the script again"
        );
    }

    #[test]
    fn a_refused_connect_rejects_unsent_and_the_next_waits_for_the_backoff() {
        let mut p = Pair::new("redis://127.0.0.1:1");
        p.refusing = true;
        p.hit("p:a", 1);
        p.drive();
        let done = one(&mut p);
        let error = done.result.unwrap_err();
        assert_eq!(
            (error.code(), error.sent()),
            ("ERR_CONNECTION", Some(false))
        );
        // Refused at once while the backoff's first delay (50-100 ms) runs.
        p.now += ms(40);
        let early = p.send(b"p:a", 1, Route::Direct).unwrap_err();
        assert_eq!(early.code(), "ERR_CONNECTION");
        assert_eq!(p.conn.io.connects.len(), 1);
        p.refusing = false;
        p.now += ms(100);
        p.hit("p:a", 1);
        p.drive();
        assert_eq!(p.counts(), [(3, Ok(1))]);
        assert_eq!(p.conn.io.connects.len(), 2);
        assert_eq!(
            p.server.counts[&b"p:a"[..]],
            1,
            "only the hit that was sent counted"
        );
    }

    #[test]
    fn no_error_names_the_key_or_the_password_and_a_demoted_master_is_left() {
        let mut p = Pair::new("redis://:s3cret-pw@127.0.0.1:1");
        p.server.error = Some("ERR bad thing on p:user@10.0.0.7 with s3cret-pw".into());
        p.hit("p:user@10.0.0.7", 1);
        p.drive();
        let text = one(&mut p).result.unwrap_err().to_string();
        assert!(text.contains("bad thing"), "{text}");
        assert!(
            !text.contains("10.0.0.7") && !text.contains("s3cret-pw"),
            "{text}"
        );
        // READONLY: the server is a replica now; the connection is replaced.
        p.server.error = Some("READONLY You can't write against a read only replica.".into());
        p.hit("p:a", 1);
        p.drive();
        assert_eq!(one(&mut p).result.unwrap_err().code(), "ERR_REDIS");
        assert_eq!(p.conn.io.closed, 1);
        // A new connection once the backoff's first delay has passed.
        p.server.error = None;
        p.now += ms(100);
        p.hit("p:a", 1);
        p.drive();
        assert_eq!(p.counts(), [(3, Ok(1))]);
        assert_eq!(p.conn.io.connects.len(), 2);
    }

    impl NodeRef for usize {
        fn same(&self, other: &Self) -> bool {
            self == other
        }
    }

    /// Runs `routing` over the nodes' engines until every hit has its result.
    fn routed(
        nodes: &mut [Pair],
        keys: &[&[u8]],
        mut routing: Routing<usize>,
    ) -> Vec<Result<i64, String>> {
        loop {
            let parts = routing.parts();
            if parts.is_empty() {
                break;
            }
            for part in parts {
                let node = &mut nodes[part.node];
                let route = match part.asking {
                    true => Route::Asking,
                    false => Route::Direct,
                };
                let ids: Vec<u32> = part
                    .hits
                    .iter()
                    .map(|&i| node.send(keys[i], 1, route).unwrap())
                    .collect();
                node.drive();
                let mut done = node.done();
                let results = ids.iter().map(|id| {
                    let at = done.iter().position(|c| c.id == *id).unwrap();
                    answers(done.remove(at).result)
                });
                let results: Vec<_> = results.collect();
                routing.answered(&part, results, |to| match to {
                    "127.0.0.1:7001" => Ok(0),
                    "127.0.0.1:7002" => Ok(1),
                    _ => Err(Error::Redis("a redirection named no node".into())),
                });
            }
        }
        routing
            .finish()
            .into_iter()
            .map(|r| r.map(|(a, _)| a.values[0]).map_err(|e| e.to_string()))
            .collect()
    }

    #[test]
    fn in_a_cluster_a_moved_hit_runs_once_on_the_node_named_and_an_asked_one_after_asking() {
        let mut nodes = [
            Pair::new("redis://127.0.0.1:7001"),
            Pair::new("redis://127.0.0.1:7002"),
        ];
        let (a, b) = ("127.0.0.1:7001".to_string(), "127.0.0.1:7002".to_string());
        // p:m's slot moved to b; p:k's is migrating to b, which takes it only after ASKING.
        nodes[0].server.moved.insert(b"p:m".to_vec(), b.clone());
        nodes[0].server.migrating.insert(b"p:k".to_vec(), b);
        nodes[1].server.importing.insert(b"p:k".to_vec(), a);
        let keys: [&[u8]; 3] = [b"p:m", b"p:k", b"p:a"];
        // The map, out of date, puts all three on a.
        let mut routing = Routing::new([Some(0), Some(0), Some(0)]);
        routing.take_stale();
        // p:m's slot moves back and forth: b and a name each other.
        let mut watched = Routing::new([Some(1)]);
        watched.take_stale();
        assert_eq!(routed(&mut nodes, &keys, routing), [Ok(1), Ok(1), Ok(1)]);
        assert_eq!(
            nodes[0].server.keys,
            [b"p:a".to_vec()],
            "a ran only its own key"
        );
        assert_eq!(nodes[1].server.keys, [b"p:m".to_vec(), b"p:k".to_vec()]);
        let on_b: Vec<_> = commands(&nodes[1].server).iter().map(|c| c.0).collect();
        assert_eq!(
            on_b,
            ["EVAL", "ASKING", "EVALSHA"],
            "the asked hit goes after ASKING"
        );
        // A hit sent on after its redirections run out is given its MOVED.
        nodes[1]
            .server
            .moved
            .insert(b"p:m".to_vec(), "127.0.0.1:7001".into());
        let results = routed(&mut nodes, &keys[..1], watched);
        assert!(
            results[0].as_ref().unwrap_err().contains("MOVED"),
            "{results:?}"
        );
        assert!(
            nodes[0].server.keys.len() == 1 && nodes[1].server.keys.len() == 2,
            "nothing ran"
        );
    }
}
