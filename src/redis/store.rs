//! One hit on Redis: the window script sent as EVALSHA, within timeoutMs
//! (connecting included). After NOSCRIPT (the script cache was flushed; the
//! script did not run) the same hit is sent once more as EVAL: the one safe
//! retry. Nothing else is ever sent again.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{RedisResult, Value};
use tokio::time::{timeout_at, Instant};

use super::config::Config;
use super::link::{classify, server_error, Link, Stage};
use crate::errors::{Error, Result};
use crate::window::{self, MAX_SAFE};

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

    /// One hit on the counter at `key` (the prefix included). Runs on the runtime.
    pub async fn hit(&self, key: &[u8], window_ms: u64, amount: i64) -> Result<Hit> {
        self.run(key, window_ms, amount).await.map_err(|e| {
            let mut secrets: Vec<&[u8]> = self.secrets.iter().map(Vec::as_slice).collect();
            secrets.push(key);
            e.redacted(&secrets)
        })
    }

    async fn run(&self, key: &[u8], window_ms: u64, amount: i64) -> Result<Hit> {
        let deadline = Instant::now() + self.timeout;
        let timed_out = || Error::Timeout(self.timeout.as_millis() as u64);
        let (conn, generation) = timeout_at(deadline, self.link.connection())
            .await
            .map_err(|_| timed_out())??;
        match timeout_at(deadline, eval(conn, key, window_ms, amount)).await {
            Err(_) => {
                self.link.timed_out(generation);
                Err(timed_out())
            }
            Ok(Err(e)) => {
                self.link.drop_connection(generation);
                Err(classify(&e, Stage::Sent))
            }
            Ok(Ok(answer)) => {
                self.link.answered();
                outcome(answer)
            }
        }
    }

    /// Ends the connection; later hits reject with [`Error::Closed`].
    pub fn close(&self) {
        self.link.close();
    }
}

fn sha() -> &'static str {
    static SHA: OnceLock<String> = OnceLock::new();
    SHA.get_or_init(|| sha1_smol::Sha1::from(window::SCRIPT).digest().to_string())
}

async fn eval(
    mut conn: MultiplexedConnection,
    key: &[u8],
    window_ms: u64,
    amount: i64,
) -> RedisResult<Value> {
    let script = |command: &str, body: &str| {
        let mut cmd = redis::cmd(command);
        cmd.arg(body).arg(1).arg(key).arg(window_ms).arg(amount);
        cmd
    };
    let answer = conn.send_packed_command(&script("EVALSHA", sha())).await?;
    match &answer {
        Value::ServerError(e) if e.code() == "NOSCRIPT" => {
            conn.send_packed_command(&script("EVAL", window::SCRIPT))
                .await
        }
        _ => Ok(answer),
    }
}

/// The script's answer, `[count, resetMs]`, or the error it raised.
fn outcome(answer: Value) -> Result<Hit> {
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
            _ => Err(Error::Redis(
                "the hit script gave an answer of the wrong shape".into(),
            )),
        },
        Value::ServerError(e) => Err(server_error(e.code(), e.details(), Stage::Sent)),
        _ => Err(Error::Redis(
            "the hit script gave an answer of the wrong shape".into(),
        )),
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
