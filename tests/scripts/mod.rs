//! The Redis side of the script twin tests: the server `REDIS_URL` names, or
//! one of their own on a loopback port, and a plain synchronous connection
//! that runs a script by EVALSHA (EVAL after NOSCRIPT), as a store would.

// Each twin test uses part of this module.
#![allow(dead_code)]

use crate::support::RedisServer;

pub struct Redis {
    pub con: redis::Connection,
    /// Every key of a test starts with this, so that a shared server (REDIS_URL) keeps its data.
    pub namespace: String,
    _server: Option<RedisServer>,
}

impl Redis {
    /// `test` names the keys' namespace on a shared server.
    pub fn connect(test: &str) -> Redis {
        let (url, server) = match std::env::var("REDIS_URL") {
            Ok(url) if !url.is_empty() => (url, None),
            _ => {
                let server = RedisServer::start();
                (server.url(), Some(server))
            }
        };
        let con = redis::Client::open(url)
            .and_then(|client| client.get_connection())
            .expect("a connection to the test's redis-server");
        Redis {
            con,
            namespace: format!("ratestore-test:{test}:{}:", std::process::id()),
            _server: server,
        }
    }

    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.namespace)
    }

    /// Runs `script` with `keys` and `args`; the reply as integers, or the
    /// server's error code (such as `NOTCOUNTER`).
    pub fn run(
        &mut self,
        script: &str,
        keys: &[&[u8]],
        args: &[String],
    ) -> Result<Vec<i64>, String> {
        let sha = sha1_smol::Sha1::from(script).digest().to_string();
        let call = |command: &str, body: &str, con: &mut redis::Connection| {
            let mut cmd = redis::cmd(command);
            cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
            cmd.query::<Vec<i64>>(con)
        };
        match call("EVALSHA", &sha, &mut self.con) {
            Err(e) if e.code() == Some("NOSCRIPT") => call("EVAL", script, &mut self.con),
            other => other,
        }
        .map_err(|e| e.code().unwrap_or("?").to_string())
    }

    /// The server's clock (`TIME`) in µs.
    pub fn time_us(&mut self) -> u64 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut self.con).unwrap();
        secs * 1_000_000 + micros
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        // Leave a shared server as it was.
        let pattern = format!("{}*", self.namespace);
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(&pattern)
            .query(&mut self.con)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut self.con);
        }
    }
}
