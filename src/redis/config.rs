//! redisStore's settings: the options and the environment in, a checked
//! connection target out. Pure, so every rule is unit-tested without a server.
//!
//! Messages name where a URL came from (an option or a variable), never the
//! URL itself: it may hold a password, and even its scheme may be a pasted
//! secret.

use std::path::PathBuf;

use percent_encoding::percent_decode_str;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::errors::{Error, Result};

/// Where the URL is looked for, in order, when the `url` option is not set.
pub const URL_VARIABLES: [&str; 2] = ["REDIS_URL", "KV_URL"];
/// Where the token is looked for when the `token` option is not set.
pub const TOKEN_VARIABLE: &str = "REDIS_TOKEN";
pub const DEFAULT_PREFIX: &str = "askdare:";
pub const DEFAULT_TIMEOUT_MS: u64 = 2_000;
const DEFAULT_PORT: u16 = 6379;

/// The options as given to `redisStore(options)`, their types already checked.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub url: Option<String>,
    pub token: Option<String>,
    pub prefix: Option<String>,
    pub timeout_ms: Option<u64>,
    /// `tls.ca`: PEM certificates to trust for `rediss://` instead of the public roots.
    pub tls_ca: Option<String>,
}

impl Options {
    pub fn prefix(&self) -> &str {
        self.prefix.as_deref().unwrap_or(DEFAULT_PREFIX)
    }

    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addr {
    Tcp { host: String, port: u16, tls: bool },
    Unix(PathBuf),
}

/// Everything needed to connect, checked.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    pub addr: Addr,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
    pub timeout_ms: u64,
    /// Certificates to trust instead of the public roots (`rediss://` only).
    pub tls_ca: Option<Vec<CertificateDer<'static>>>,
}

// Written by hand so that no debug print shows the password.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("addr", &self.addr)
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("timeout_ms", &self.timeout_ms)
            .field("tls_ca", &self.tls_ca.is_some())
            .finish()
    }
}

impl Config {
    /// Resolves the options against the environment, which `env` reads: an
    /// unset or empty variable is `None`.
    pub fn resolve(options: &Options, env: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let timeout_ms = options.timeout_ms();
        if timeout_ms == 0 {
            return Err(Error::InvalidRange("timeoutMs must be a positive integer"));
        }
        let (url, source) = match &options.url {
            Some(url) => (url.clone(), "the url option".to_string()),
            None => URL_VARIABLES
                .iter()
                .find_map(|name| env(name).map(|url| (url, (*name).to_string())))
                .ok_or_else(|| {
                    Error::Config(format!(
                        "no Redis URL: set the url option or the {} environment variable \
                         (rediss://default:<password>@<host>:6379 for a managed Redis such as Upstash)",
                        URL_VARIABLES.join(" or ")
                    ))
                })?,
        };
        let mut config = parse_url(&url, &source)?;
        config.timeout_ms = timeout_ms;
        if let Some(token) = options.token.clone().or_else(|| env(TOKEN_VARIABLE)) {
            config.password = Some(token);
        }
        if let Some(ca) = &options.tls_ca {
            if !matches!(config.addr, Addr::Tcp { tls: true, .. }) {
                return Err(Error::Config(format!(
                    "tls.ca is set but {source} is not a rediss:// URL; TLS is used only with rediss://"
                )));
            }
            config.tls_ca = Some(certificates(ca)?);
        }
        Ok(config)
    }

    /// The texts no message may show.
    pub fn secrets(&self) -> Vec<Vec<u8>> {
        self.password
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .collect()
    }
}

fn parse_url(text: &str, source: &str) -> Result<Config> {
    const FORMS: &str = "redis://[[user]:password@]host[:port][/db], rediss://… (TLS) or redis+unix:///path/to/socket[?db=N]";
    let url = url::Url::parse(text.trim())
        .map_err(|_| Error::Config(format!("{source} is not a valid URL; expected {FORMS}")))?;
    let bad = |what: &str| Error::Config(format!("{source}: {what}"));
    let (addr, db) = match url.scheme() {
        "redis" | "rediss" => {
            let host = match url.host() {
                Some(url::Host::Domain(name)) if !name.is_empty() => name.to_string(),
                Some(url::Host::Ipv4(ip)) => ip.to_string(),
                Some(url::Host::Ipv6(ip)) => ip.to_string(),
                _ => return Err(bad("the URL has no host")),
            };
            let db = match url.path().trim_matches('/') {
                "" => 0,
                path => parse_db(path).ok_or_else(|| {
                    bad("the URL path must be a database number (a non-negative integer)")
                })?,
            };
            let tls = url.scheme() == "rediss";
            let port = url.port().unwrap_or(DEFAULT_PORT);
            (Addr::Tcp { host, port, tls }, db)
        }
        "redis+unix" | "unix" => {
            let path = url
                .to_file_path()
                .map_err(|_| bad("the URL must hold an absolute socket path"))?;
            let db = match url.query_pairs().find(|(k, _)| k == "db") {
                None => 0,
                Some((_, v)) => parse_db(&v).ok_or_else(|| {
                    bad("the db query parameter must be a non-negative integer")
                })?,
            };
            (Addr::Unix(path), db)
        }
        "https" | "http" => {
            return Err(Error::Config(format!(
                "{source} is an HTTP(S) URL, such as the REST endpoint of Upstash; redisStore speaks the Redis \
                 protocol: use the database's rediss:// endpoint (rediss://default:<password>@<host>:6379) and its \
                 password as the token (the REDIS_TOKEN variable or the token option)"
            )))
        }
        _ => return Err(bad(&format!("unsupported URL scheme; expected {FORMS}"))),
    };
    let decode = |text: &str, what: &str| {
        percent_decode_str(text)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| {
                bad(&format!(
                    "the {what} in the URL is not valid percent-encoded UTF-8"
                ))
            })
    };
    let username = match url.username() {
        "" => None,
        name => Some(decode(name, "user name")?),
    };
    let password = url.password().map(|p| decode(p, "password")).transpose()?;
    Ok(Config {
        addr,
        db,
        username,
        password,
        timeout_ms: DEFAULT_TIMEOUT_MS,
        tls_ca: None,
    })
}

fn parse_db(text: &str) -> Option<i64> {
    text.parse::<i64>().ok().filter(|db| *db >= 0)
}

fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs: std::result::Result<Vec<_>, _> =
        CertificateDer::pem_slice_iter(pem.as_bytes()).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        _ => Err(Error::Config(
            "tls.ca must hold at least one PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, v)| *k == name && !v.is_empty())
                .map(|(_, v)| v.to_string())
        }
    }

    fn url(url: &str) -> Options {
        Options {
            url: Some(url.into()),
            ..Options::default()
        }
    }

    fn config_error(result: Result<Config>) -> String {
        match result {
            Err(Error::Config(message)) => message,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn a_plain_url() {
        let c = Config::resolve(&url("redis://127.0.0.1:6380/2"), env(&[])).unwrap();
        let tcp = Addr::Tcp {
            host: "127.0.0.1".into(),
            port: 6380,
            tls: false,
        };
        assert_eq!((c.addr, c.db, c.password), (tcp, 2, None));
        assert_eq!(c.timeout_ms, DEFAULT_TIMEOUT_MS);
    }

    #[test]
    fn a_tls_url_with_user_and_encoded_password() {
        let c = Config::resolve(&url("rediss://default:p%40ss@[::1]"), env(&[])).unwrap();
        let tls = Addr::Tcp {
            host: "::1".into(),
            port: 6379,
            tls: true,
        };
        assert_eq!(c.addr, tls);
        assert_eq!(c.username.as_deref(), Some("default"));
        assert_eq!(c.password.as_deref(), Some("p@ss"));
    }

    #[test]
    fn a_unix_socket() {
        let c = Config::resolve(&url("redis+unix:///tmp/redis.sock?db=3"), env(&[])).unwrap();
        assert_eq!((c.addr, c.db), (Addr::Unix("/tmp/redis.sock".into()), 3));
    }

    #[test]
    fn the_environment_in_order_and_empty_is_unset() {
        let e = env(&[("REDIS_URL", ""), ("KV_URL", "redis://kv:1")]);
        let c = Config::resolve(&Options::default(), e).unwrap();
        assert!(matches!(c.addr, Addr::Tcp { ref host, port: 1, .. } if host == "kv"));
        let e = env(&[("REDIS_URL", "redis://first"), ("KV_URL", "redis://kv")]);
        let c = Config::resolve(&Options::default(), e).unwrap();
        assert!(matches!(c.addr, Addr::Tcp { ref host, .. } if host == "first"));
        let c = Config::resolve(&url("redis://option"), env(&[("REDIS_URL", "redis://env")]));
        assert!(matches!(c.unwrap().addr, Addr::Tcp { ref host, .. } if host == "option"));
    }

    #[test]
    fn no_url_names_the_variables() {
        let message = config_error(Config::resolve(&Options::default(), env(&[])));
        assert!(message.contains("REDIS_URL or KV_URL"), "{message}");
        assert!(message.contains("url option"), "{message}");
    }

    #[test]
    fn the_token_wins_over_the_url_password() {
        let e = env(&[("REDIS_TOKEN", "from-env")]);
        let c = Config::resolve(&url("redis://:in-url@h"), &e).unwrap();
        assert_eq!(c.password.as_deref(), Some("from-env"));
        let mut o = url("redis://:in-url@h");
        o.token = Some("from-option".into());
        assert_eq!(
            Config::resolve(&o, &e).unwrap().password.as_deref(),
            Some("from-option")
        );
        let c = Config::resolve(&url("redis://:in-url@h"), env(&[])).unwrap();
        assert_eq!(c.password.as_deref(), Some("in-url"));
        assert_eq!(c.secrets(), vec![b"in-url".to_vec()]);
    }

    #[test]
    fn an_https_url_says_to_use_rediss_and_the_password() {
        let e = env(&[("REDIS_URL", "https://eu1-fine-cat-3.upstash.io")]);
        let message = config_error(Config::resolve(&Options::default(), e));
        assert!(
            message.starts_with("REDIS_URL is an HTTP(S) URL"),
            "{message}"
        );
        assert!(message.contains("rediss://"), "{message}");
        assert!(message.contains("password"), "{message}");
        assert!(!message.contains("upstash.io"), "{message}");
    }

    #[test]
    fn bad_urls_are_named_by_their_source_never_shown() {
        for (text, expect) in [
            ("hunter2", "not a valid URL"),
            ("hunter2:secret", "unsupported URL scheme"),
            ("redis://:hunter2@host/x", "database number"),
            ("redis://:hunter2@host/-1", "database number"),
            ("redis://:hunter2@:5", "not a valid URL"),
            ("redis+unix:///tmp/s?db=x", "db query parameter"),
            ("redis+unix://relative", "absolute socket path"),
            ("redis://:%ff@host", "password in the URL"),
        ] {
            let message = config_error(Config::resolve(&url(text), env(&[])));
            assert!(message.contains(expect), "{text}: {message}");
            assert!(message.starts_with("the url option"), "{text}: {message}");
            assert!(!message.contains("hunter2"), "{text}: {message}");
        }
    }

    #[test]
    fn tls_ca_needs_rediss_and_a_certificate() {
        let mut o = url("redis://h");
        o.tls_ca = Some("x".into());
        assert!(config_error(Config::resolve(&o, env(&[]))).contains("not a rediss:// URL"));
        o.url = Some("rediss://h".into());
        assert!(config_error(Config::resolve(&o, env(&[]))).contains("PEM certificate"));
    }

    #[test]
    fn the_password_stays_out_of_debug_output() {
        let c = Config::resolve(&url("redis://:hunter2@h"), env(&[])).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn options_defaults() {
        let o = Options::default();
        assert_eq!((o.prefix(), o.timeout_ms()), ("askdare:", 2_000));
        let o = Options {
            timeout_ms: Some(0),
            ..url("redis://h")
        };
        assert!(matches!(
            Config::resolve(&o, env(&[])),
            Err(Error::InvalidRange(_))
        ));
    }
}
