//! One connection's pipeline in the event-loop transport: each op encoded
//! as EVALSHA of its script (or its command) into the bytes to write, and
//! replies matched to them in order as they are read. After NOSCRIPT an op
//! goes out once more as EVAL (the script did not run); nothing else is
//! ever sent again. No I/O here: the
//! binding moves the bytes when the event loop says the socket is ready.

use std::collections::VecDeque;
use std::time::Instant;

use super::health;
use super::resp::{self, Malformed, Parser, Reply};
use super::stats::Tally;
use crate::errors::{Error, Result};
use crate::ops::{Answer, Args, Op};

/// An op to send: its id, its state's key (prefix and suffix included) and
/// numbers.
pub struct Request {
    /// The caller's: which store and which of its calls.
    pub id: u64,
    pub op: Op,
    pub args: Args,
    pub key: Box<[u8]>,
    pub sent_at: Instant,
    pub deadline: Instant,
}

/// An op's result, by its request's id.
pub struct Done {
    pub id: u64,
    pub result: Result<Answer>,
}

struct Sent {
    request: Request,
    /// Already rejected (it timed out): its reply, when it comes, is dropped.
    settled: bool,
    eval: bool,
}

/// What the replies read so far say about the connection.
#[derive(Default, Debug, PartialEq, Eq)]
pub struct Health {
    /// Some hit got a reply.
    pub answered: bool,
    /// The server can't take writes here (READONLY, MASTERDOWN, LOADING):
    /// the connection should be replaced.
    pub unusable: bool,
}

pub struct Pipe {
    secrets: Vec<Vec<u8>>,
    /// Bytes waiting to be written.
    pub out: Vec<u8>,
    sent: VecDeque<Sent>,
    /// How many of `sent` are not settled yet, kept as they change.
    unsettled: usize,
    parser: Parser,
    /// What this connection's calls met, over its life.
    pub tally: Tally,
}

impl Pipe {
    pub fn new(secrets: Vec<Vec<u8>>) -> Pipe {
        Pipe {
            secrets,
            out: Vec::new(),
            sent: VecDeque::new(),
            unsettled: 0,
            parser: Parser::default(),
            tally: Tally::default(),
        }
    }

    /// Hits sent whose reply has not come (timed-out ones included).
    pub fn in_flight(&self) -> usize {
        self.sent.len()
    }

    /// Hits sent that are still waiting for their result.
    pub fn unsettled(&self) -> usize {
        self.unsettled
    }

    /// Encodes a hit for sending.
    pub fn send(&mut self, request: Request) {
        self.encode(&request, false);
        self.unsettled += 1;
        self.sent.push_back(Sent {
            request,
            settled: false,
            eval: false,
        });
    }

    fn encode(&mut self, request: &Request, eval: bool) {
        let out = &mut self.out;
        let key: &[u8] = &request.key;
        match request.op.script() {
            None if request.op == Op::Ping => resp::encode(out, &[b"PING"]),
            None => resp::encode(out, &[b"UNLINK", key]),
            Some(script) => request.op.argv(&request.args, |argv| {
                let head: [&[u8]; 4] = match eval {
                    false => [b"EVALSHA", script.sha().as_bytes(), b"1", key],
                    true => [b"EVAL", script.body.as_bytes(), b"1", key],
                };
                resp::encode_parts(out, &head, argv);
            }),
        }
    }

    /// Adds bytes read from the socket.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.parser.feed(bytes);
    }

    pub fn parser(&mut self) -> &mut Parser {
        &mut self.parser
    }

    /// Matches every whole reply read so far to its hit.
    pub fn answers(&mut self, done: &mut Vec<Done>) -> std::result::Result<Health, Malformed> {
        let mut health = Health::default();
        // One clock read per batch of replies read together.
        let mut now = None;
        while let Some(reply) = self.parser.next()? {
            let Some(mut sent) = self.sent.pop_front() else {
                return Err(Malformed); // A reply nothing asked for.
            };
            health.answered = true;
            if let Reply::Error(code, _) = &reply {
                if code == "NOSCRIPT" && !sent.eval {
                    // The script did not run: send it whole, once.
                    self.encode(&sent.request, true);
                    self.tally.noscript += 1;
                    sent.eval = true;
                    self.sent.push_back(sent);
                    continue;
                }
                if health::demotion(code) {
                    health.unusable = true;
                }
            }
            if !sent.settled {
                self.unsettled -= 1;
                let now = *now.get_or_insert_with(Instant::now);
                self.tally
                    .answered(now.saturating_duration_since(sent.request.sent_at));
                let result =
                    outcome(sent.request.op, reply).map_err(|e| self.redact(e, &sent.request));
                done.push(Done {
                    id: sent.request.id,
                    result,
                });
            }
        }
        Ok(health)
    }

    /// Rejects the hits whose deadline has passed; their replies are
    /// dropped when they come. Answers how many timed out.
    pub fn expire(&mut self, now: Instant, done: &mut Vec<Done>) -> usize {
        let mut expired = 0;
        for sent in self.sent.iter_mut().filter(|s| !s.settled) {
            if sent.request.deadline > now {
                // Sent in order, with one timeout for all: the rest are later.
                break;
            }
            sent.settled = true;
            self.unsettled -= 1;
            expired += 1;
            self.tally.timeouts += 1;
            let ms = sent
                .request
                .deadline
                .saturating_duration_since(sent.request.sent_at)
                .as_millis() as u64;
            done.push(Done {
                id: sent.request.id,
                result: Err(Error::Timeout { ms, sent: true }),
            });
        }
        expired
    }

    /// When the oldest unsettled hit whose deadline has passed was sent.
    pub fn oldest_due(&self, now: Instant) -> Option<Instant> {
        self.sent
            .iter()
            .find(|s| !s.settled)
            .filter(|s| s.request.deadline <= now)
            .map(|s| s.request.sent_at)
    }

    /// The earliest deadline of a hit not yet settled.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.sent
            .iter()
            .find(|s| !s.settled)
            .map(|s| s.request.deadline)
    }

    /// The connection is gone: every hit on it rejects with `error`, which
    /// says whether they were sent. Nothing is sent again.
    pub fn fail(&mut self, error: &Error, done: &mut Vec<Done>) {
        for sent in self.sent.drain(..) {
            if !sent.settled {
                let e = error.clone();
                done.push(Done {
                    id: sent.request.id,
                    result: Err(e),
                });
            }
        }
        self.unsettled = 0;
        self.out.clear();
        self.parser = Parser::default();
    }

    fn redact(&self, error: Error, request: &Request) -> Error {
        let mut secrets: Vec<&[u8]> = self.secrets.iter().map(Vec::as_slice).collect();
        secrets.push(&request.key);
        error.redacted(&secrets)
    }
}

/// The op's answer, or the error its script raised.
fn outcome(op: Op, reply: Reply) -> Result<Answer> {
    let ints = |items: &[Reply]| -> Option<Vec<i64>> {
        items
            .iter()
            .map(|r| match r {
                Reply::Int(n) => Some(*n),
                _ => None,
            })
            .collect()
    };
    match reply {
        Reply::Array(Some(items)) => match ints(&items) {
            Some(values) => op.answer(&values),
            None => op.answer(&[]),
        },
        Reply::Int(n) if op == Op::Unlink => op.answer(&[n]),
        Reply::Error(code, detail) => Err(super::link::server_error(
            &code,
            (!detail.is_empty()).then_some(detail.as_str()),
            super::link::Stage::Sent,
        )),
        _ if op == Op::Ping => op.answer(&[1]),
        _ => op.answer(&[]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A hit sent 2 s before its deadline.
    fn request(id: u64, key: &str, deadline: Instant) -> Request {
        Request {
            id,
            op: Op::Hit,
            args: [60_000, 1, 0, 0],
            key: key.as_bytes().into(),
            sent_at: deadline - Duration::from_secs(2),
            deadline,
        }
    }

    fn pipe() -> Pipe {
        Pipe::new(vec![b"hunter2".to_vec()])
    }

    #[test]
    fn replies_settle_hits_in_order_and_noscript_sends_eval_once() {
        let now = Instant::now() + Duration::from_secs(5);
        let mut p = pipe();
        p.send(request(1, "a", now));
        p.send(request(2, "b", now));
        let sha = Op::Hit.script().unwrap().sha().to_string();
        let head = format!(
            "*6\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n1\r\n$1\r\na\r\n$5\r\n60000\r\n$1\r\n1\r\n"
        );
        assert!(p.out.starts_with(head.as_bytes()));
        p.out.clear();
        let mut done = Vec::new();
        p.feed(b"*2\r\n:1\r\n:60000\r\n-NOSCRIPT No matching script\r\n");
        assert_eq!(
            p.answers(&mut done),
            Ok(Health {
                answered: true,
                unusable: false
            })
        );
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].id, 1);
        assert!(p.out.starts_with(b"*6\r\n$4\r\nEVAL\r\n"), "EVAL queued");
        // A second NOSCRIPT is an error, not another retry.
        p.out.clear();
        p.feed(b"-NOSCRIPT again\r\n");
        p.answers(&mut done).unwrap();
        assert!(p.out.is_empty());
        assert_eq!(done[1].id, 2);
        assert_eq!(done[1].result.as_ref().unwrap_err().code(), "ERR_REDIS");
        assert_eq!((p.in_flight(), p.unsettled()), (0, 0));
    }

    #[test]
    fn timed_out_hits_reject_once_and_their_late_replies_are_dropped() {
        let start = Instant::now() + Duration::from_secs(5);
        let mut p = pipe();
        p.send(request(1, "a", start));
        p.send(request(2, "b", start + Duration::from_secs(10)));
        let mut done = Vec::new();
        assert_eq!(p.expire(start, &mut done), 1);
        assert_eq!((p.in_flight(), p.unsettled()), (2, 1));
        assert_eq!(
            done[0].result,
            Err(Error::Timeout {
                ms: 2_000,
                sent: true
            })
        );
        assert_eq!(p.next_deadline(), Some(start + Duration::from_secs(10)));
        p.feed(b"*2\r\n:1\r\n:5\r\n*2\r\n:7\r\n:5\r\n");
        p.answers(&mut done).unwrap();
        assert_eq!(done.len(), 2);
        assert_eq!(done[1].id, 2);
        assert_eq!(done[1].result, Ok(Answer::new(&[7, 5])));
    }

    #[test]
    fn readonly_marks_the_connection_unusable_and_errors_name_no_secret() {
        let far = Instant::now() + Duration::from_secs(5);
        let mut p = pipe();
        p.send(request(1, "203.0.113.9", far));
        let mut done = Vec::new();
        p.feed(b"-READONLY You can't write against a read only replica 203.0.113.9 hunter2\r\n");
        let health = p.answers(&mut done).unwrap();
        assert!(health.unusable);
        let text = done[0].result.as_ref().unwrap_err().to_string();
        assert!(
            !text.contains("203.0.113.9") && !text.contains("hunter2"),
            "{text}"
        );
    }

    #[test]
    fn a_lost_connection_rejects_what_is_in_flight() {
        let far = Instant::now() + Duration::from_secs(5);
        let mut p = pipe();
        p.send(request(1, "a", far));
        p.send(request(2, "b", far));
        let mut done = Vec::new();
        p.fail(
            &Error::Connection {
                text: "lost".into(),
                sent: true,
            },
            &mut done,
        );
        assert_eq!(done.len(), 2);
        assert_eq!(p.in_flight(), 0);
        p.feed(b":1\r\n");
        assert_eq!(
            p.answers(&mut done),
            Err(Malformed),
            "a reply nothing asked for"
        );
    }
}
