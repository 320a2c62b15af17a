//! Hits on Redis: the window script sent as EVALSHA, within timeoutMs
//! (connecting included). Hits that arrive together go out as one pipeline:
//! one write and one read for the lot, each still its own atomic script.
//! After NOSCRIPT (the script cache was flushed; the script did not run) a
//! hit is sent once more as EVAL: the one safe retry. Nothing else is ever
//! sent again.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::time::{timeout_at, Instant};

use super::config::Config;
use super::link::{classify, server_error, Link, Stage};
use crate::errors::{Error, Result};
use crate::window::{self, MAX_SAFE};

/// One hit to make: the counter at `key` (the prefix included).
#[derive(Clone, Copy, Debug)]
pub struct Query<'a> {
    pub key: &'a [u8],
    pub window_ms: u64,
    pub amount: i64,
}

/// What a hit answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    pub count: i64,
    pub reset_ms: u64,
}

pub struct Store {
    link: Arc<Link>,
    timeout: Duration,
    secrets: Vec<Vec<u8>>,
}

impl Store {
    pub fn new(config: &Config) -> Result<Store> {
        Ok(Store {
            link: Arc::new(Link::new(config)?),
            timeout: Duration::from_millis(config.timeout_ms),
            secrets: config.secrets(),
        })
    }

    /// One hit. Runs on the runtime.
    pub async fn hit(&self, query: Query<'_>) -> Result<Hit> {
        let mut results = self.hits(&[query]).await;
        results
            .pop()
            .unwrap_or(Err(Error::Internal("a hit got no answer")))
    }

    /// Hits sent together, answered in order. Runs on the runtime.
    pub async fn hits(&self, queries: &[Query<'_>]) -> Vec<Result<Hit>> {
        let timeout = Error::Timeout(self.timeout.as_millis() as u64);
        let deadline = Instant::now() + self.timeout;
        let (conn, generation) = match timeout_at(deadline, self.link.connection()).await {
            Ok(Ok(connected)) => connected,
            Ok(Err(e)) => return self.answer(queries, queries.iter().map(|_| Err(e.clone()))),
            Err(_) => return self.answer(queries, queries.iter().map(|_| Err(timeout.clone()))),
        };
        let answers = send(conn, queries, deadline).await;
        let timeouts = answers
            .iter()
            .filter(|a| matches!(a, Answer::TimedOut))
            .count();
        if timeouts > 0 {
            self.link.timed_out(generation, timeouts);
        } else if answers.iter().any(|a| matches!(a, Answer::Failed(_))) {
            self.link.drop_connection(generation);
        } else {
            self.link.answered();
        }
        let results = answers.into_iter().map(|answer| match answer {
            Answer::Value(value) => outcome(value),
            Answer::Failed(e) => Err(classify(&e, Stage::Sent)),
            Answer::TimedOut => Err(timeout.clone()),
        });
        self.answer(queries, results)
    }

    /// The results, each error's text cleaned of its query's key and of the credentials.
    fn answer(
        &self,
        queries: &[Query<'_>],
        results: impl Iterator<Item = Result<Hit>>,
    ) -> Vec<Result<Hit>> {
        queries
            .iter()
            .zip(results)
            .map(|(query, result)| {
                result.map_err(|e| {
                    let mut secrets: Vec<&[u8]> = self.secrets.iter().map(Vec::as_slice).collect();
                    secrets.push(query.key);
                    e.redacted(&secrets)
                })
            })
            .collect()
    }

    /// Ends the connection; later hits reject with [`Error::Closed`].
    pub fn close(&self) {
        self.link.close();
    }
}

/// How one sent hit ended.
enum Answer {
    Value(Value),
    Failed(redis::RedisError),
    TimedOut,
}

/// Sends the hits as EVALSHA, then those that met NOSCRIPT as EVAL: one
/// answer per query, in order.
async fn send(
    mut conn: MultiplexedConnection,
    queries: &[Query<'_>],
    deadline: Instant,
) -> Vec<Answer> {
    let all: Vec<usize> = (0..queries.len()).collect();
    let mut answers = pipeline(&mut conn, "EVALSHA", sha(), queries, &all, deadline).await;
    let missing: Vec<usize> = (0..answers.len())
        .filter(|&i| matches!(&answers[i], Answer::Value(Value::ServerError(e)) if e.code() == "NOSCRIPT"))
        .collect();
    if !missing.is_empty() {
        let script = window::SCRIPT;
        let retried = pipeline(&mut conn, "EVAL", script, queries, &missing, deadline).await;
        for (i, answer) in missing.into_iter().zip(retried) {
            answers[i] = answer;
        }
    }
    answers
}

/// Sends `command body 1 key windowMs amount` for the chosen queries as one
/// pipeline; one answer per chosen query, in order.
async fn pipeline(
    conn: &mut MultiplexedConnection,
    command: &str,
    body: &str,
    queries: &[Query<'_>],
    chosen: &[usize],
    deadline: Instant,
) -> Vec<Answer> {
    let mut pipe = redis::Pipeline::with_capacity(chosen.len());
    for &i in chosen {
        let q = &queries[i];
        // Sized up front: the numbers take at most 20 digits each.
        let mut cmd =
            redis::Cmd::with_capacity(6, command.len() + body.len() + 1 + q.key.len() + 40);
        cmd.arg(command)
            .arg(body)
            .arg(1)
            .arg(q.key)
            .arg(q.window_ms)
            .arg(q.amount);
        pipe.add_command(cmd);
    }
    match timeout_at(deadline, conn.send_packed_commands(&pipe, 0, chosen.len())).await {
        Ok(Ok(values)) if values.len() == chosen.len() => {
            values.into_iter().map(Answer::Value).collect()
        }
        Ok(Ok(_)) => chosen.iter().map(|_| Answer::Value(Value::Nil)).collect(),
        Ok(Err(e)) => chosen.iter().map(|_| Answer::Failed(e.clone())).collect(),
        Err(_) => chosen.iter().map(|_| Answer::TimedOut).collect(),
    }
}

fn sha() -> &'static str {
    static SHA: OnceLock<String> = OnceLock::new();
    SHA.get_or_init(|| sha1_smol::Sha1::from(window::SCRIPT).digest().to_string())
}

/// The script's answer, `[count, resetMs]`, or the error it raised.
fn outcome(answer: Value) -> Result<Hit> {
    let wrong_shape = || Error::Redis("the hit script gave an answer of the wrong shape".into());
    match answer {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(count), Value::Int(reset_ms)]
                if count.abs() <= MAX_SAFE && *reset_ms > 0 =>
            {
                Ok(Hit {
                    count: *count,
                    reset_ms: *reset_ms as u64,
                })
            }
            _ => Err(wrong_shape()),
        },
        Value::ServerError(e) => Err(server_error(e.code(), e.details(), Stage::Sent)),
        _ => Err(wrong_shape()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sha_is_forty_hex_digits() {
        assert_eq!(sha().len(), 40);
        assert!(sha()
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }

    #[test]
    fn answers_become_hits_or_errors() {
        let pair = |a, b| Value::Array(vec![Value::Int(a), Value::Int(b)]);
        assert_eq!(
            outcome(pair(-3, 10)),
            Ok(Hit {
                count: -3,
                reset_ms: 10
            })
        );
        assert_eq!(
            outcome(pair(MAX_SAFE + 1, 10)).unwrap_err().code(),
            "ERR_REDIS"
        );
        assert_eq!(outcome(pair(1, 0)).unwrap_err().code(), "ERR_REDIS");
        assert_eq!(outcome(Value::Nil).unwrap_err().code(), "ERR_REDIS");
    }
}
