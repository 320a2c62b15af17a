//! redisStore's settings: the options and the environment in, a checked
//! connection target out. Pure, so every rule is unit-tested without a server.
//!
//! Messages name where a URL came from (an option or a variable), never the
//! URL itself: it may hold a password, and even its scheme may be a pasted
//! secret.

use std::path::PathBuf;

use percent_encoding::percent_decode_str;
use rustls::pki_types::CertificateDer;

use super::fence::Fence;
use crate::errors::{Error, Result};

/// Where the URL is looked for, in order, when the `url` option is not set:
/// the Redis protocol's URLs first (one socket, pipelined, is faster than
/// HTTPS, and Vercel sets both kinds for one database), then the REST ones.
pub const URL_VARIABLES: [&str; 2] = ["REDIS_URL", "KV_URL"];
/// The REST URL variables, each with its token variable, read after [`URL_VARIABLES`].
pub const REST_VARIABLES: [(&str, &str); 2] = [
    ("UPSTASH_REDIS_REST_URL", "UPSTASH_REDIS_REST_TOKEN"),
    ("KV_REST_API_URL", "KV_REST_API_TOKEN"),
];
/// Where the token is looked for when the `token` option is not set.
pub const TOKEN_VARIABLE: &str = "REDIS_TOKEN";
/// `1` (or `true`) when the `cluster` option is not set: the URL names Redis Cluster nodes.
pub const CLUSTER_VARIABLE: &str = "REDIS_CLUSTER";
pub const DEFAULT_PREFIX: &str = "askdare:";
pub const DEFAULT_TIMEOUT_MS: u64 = 2_000;
const DEFAULT_PORT: u16 = 6379;
const DEFAULT_SENTINEL_PORT: u16 = 26379;
/// The query parameter of a `redis+sentinel://` URL that holds the sentinels' password.
pub const SENTINEL_PASSWORD: &str = "sentinelPassword";
/// The query parameter of a `redis+sentinel://` URL that names the sentinels'
/// ACL user (with `sentinelPassword` as that user's password).
pub const SENTINEL_USERNAME: &str = "sentinelUsername";

/// The options as given to `redisStore(options)`, their types already checked.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub url: Option<String>,
    pub token: Option<String>,
    pub prefix: Option<String>,
    pub timeout_ms: Option<u64>,
    /// `tls.ca`: PEM certificates to trust for `rediss://` (and `rediss+sentinel://`)
    /// instead of the public roots.
    pub tls_ca: Option<String>,
    /// The URL names seed nodes of a Redis Cluster (comma-separated).
    pub cluster: Option<bool>,
    /// `waitForReplicas`: how many replicas must confirm a call's writes
    /// (Redis `WAIT`) before it is answered; 0 or none: no wait.
    pub wait_replicas: Option<u32>,
}

impl Options {
    pub fn prefix(&self) -> &str {
        self.prefix.as_deref().unwrap_or(DEFAULT_PREFIX)
    }

    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)
    }
}

/// One server's address: TCP (with TLS for `rediss://`) or a Unix socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addr {
    Tcp { host: String, port: u16, tls: bool },
    Unix(PathBuf),
}

/// What the URL names: where a store's connections go. Each kind holds only
/// what applies to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deployment {
    /// One server (`redis://`, `rediss://`, `redis+unix://`).
    Server(Addr),
    /// A Redis Cluster: its seed nodes, where the slot map is first asked
    /// for, all reached with TLS (`rediss://`) or none.
    Cluster {
        seeds: Vec<(String, u16)>,
        tls: bool,
    },
    /// A master that Redis Sentinel watches.
    Sentinel(Sentinels),
    /// Upstash's REST API: `https://host[:port][/path]` (or `http://` on a
    /// loopback address), with no user, password, query or trailing slash.
    Rest { base: String },
}

/// A Sentinel URL: the sentinels to ask, in turn, where the master of `name`
/// is (`redis+sentinel://host:port[,host:port...]/name`); with `tls`
/// (`rediss+sentinel://`), the sentinels and the master alike are reached
/// over TLS. The URL's own credentials are the master's; these are the
/// sentinels'.
#[derive(Clone, PartialEq, Eq)]
pub struct Sentinels {
    pub nodes: Vec<(String, u16)>,
    pub name: String,
    pub tls: bool,
    /// The sentinels' ACL user, if not `default`.
    pub username: Option<String>,
    /// The sentinels' password.
    pub password: Option<String>,
}

// Written by hand so that no debug print shows the password.
impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinels")
            .field("nodes", &self.nodes)
            .field("name", &self.name)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

/// Everything needed to connect, checked.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    pub deployment: Deployment,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
    pub timeout_ms: u64,
    /// Certificates to trust instead of the public roots (TLS URLs only).
    pub tls_ca: Option<Vec<CertificateDer<'static>>>,
    /// How many replicas must confirm each call (see [`Fence`]); 0: none.
    pub wait_replicas: u32,
}

// Written by hand so that no debug print shows the password.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("deployment", &self.deployment)
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("timeout_ms", &self.timeout_ms)
            .field("tls_ca", &self.tls_ca.is_some())
            .field("wait_replicas", &self.wait_replicas)
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
        // The URL, where it came from, and the token variable paired with it.
        let (url, source, paired) = match &options.url {
            Some(url) => (url.clone(), "the url option".to_string(), None),
            None => URL_VARIABLES
                .iter()
                .map(|name| (*name, None))
                .chain(REST_VARIABLES.iter().map(|(url, token)| (*url, Some(*token))))
                .find_map(|(name, token)| env(name).map(|url| (url, name.to_string(), token)))
                .ok_or_else(|| {
                    Error::Config(format!(
                        "no Redis URL: set the url option or one of the environment variables {} \
                         (redis:// or rediss://), {} with {}, or {} with {} (https://, Upstash's REST API)",
                        URL_VARIABLES.join(", "),
                        REST_VARIABLES[0].0,
                        REST_VARIABLES[0].1,
                        REST_VARIABLES[1].0,
                        REST_VARIABLES[1].1,
                    ))
                })?,
        };
        let cluster = match options.cluster {
            Some(cluster) => cluster,
            None => env(CLUSTER_VARIABLE).map_or(Ok(false), |v| cluster_flag(&v))?,
        };
        let mut config = match (cluster, is_sentinel(&url)) {
            (true, true) => {
                return Err(Error::Config(format!(
                    "{source} is a redis+sentinel:// URL, which names sentinels, not Redis Cluster nodes: \
                     drop the cluster setting"
                )))
            }
            (false, true) => parse_sentinel(&url, &source)?,
            (true, false) => parse_cluster(&url, &source)?,
            (false, false) => parse_single(&url, &source)?,
        };
        config.timeout_ms = timeout_ms;
        config.wait_replicas = options.wait_replicas.unwrap_or(0);
        if config.wait_replicas > 0 && (config.is_cluster() || config.is_rest()) {
            return Err(Error::Config(
                "waitForReplicas is for one server or a Sentinel-watched master (redis://, rediss://, redis+unix://, \
                 redis[s]+sentinel://), not a Redis Cluster nor Upstash's REST API"
                    .into(),
            ));
        }
        let token = match config.is_rest() {
            // The token of the URL's own variable first, as askdare-upstash reads them.
            true => options.token.clone().or_else(|| {
                paired
                    .into_iter()
                    .chain(REST_VARIABLES.iter().map(|(_, token)| *token))
                    .chain([TOKEN_VARIABLE])
                    .find_map(&env)
            }),
            false => options.token.clone().or_else(|| env(TOKEN_VARIABLE)),
        };
        if let Some(token) = token {
            config.password = Some(token);
        }
        if config.is_rest() && config.password.is_none() {
            return Err(Error::Config(format!(
                "{source} is a REST URL (Upstash's REST API), which needs its token: set the token option or {} \
                 ({} beside {})",
                REST_VARIABLES[0].1, REST_VARIABLES[1].1, REST_VARIABLES[1].0
            )));
        }
        if let Some(ca) = &options.tls_ca {
            let tls = match &config.deployment {
                Deployment::Server(Addr::Tcp { tls, .. }) => *tls,
                Deployment::Server(Addr::Unix(_)) => false,
                Deployment::Cluster { tls, .. } => *tls,
                Deployment::Sentinel(sentinels) => sentinels.tls,
                Deployment::Rest { base } => base.starts_with("https:"),
            };
            if !tls {
                return Err(Error::Config(format!(
                    "tls.ca is set but {source} is not a rediss://, rediss+sentinel:// or https:// URL; TLS is \
                     used only with those"
                )));
            }
            config.tls_ca = Some(certificates(ca)?);
        }
        Ok(config)
    }

    /// The target is Upstash's REST API rather than a Redis server.
    pub fn is_rest(&self) -> bool {
        matches!(self.deployment, Deployment::Rest { .. })
    }

    /// The URL names Redis Cluster nodes.
    pub fn is_cluster(&self) -> bool {
        matches!(self.deployment, Deployment::Cluster { .. })
    }

    /// The settings of one server of this deployment (a cluster's node, a
    /// Sentinel-named master): the same credentials, database and timeouts.
    pub fn server(&self, addr: Addr) -> Config {
        Config {
            deployment: Deployment::Server(addr),
            ..self.clone()
        }
    }

    /// The `WAIT` that follows each pipeline, if `waitForReplicas` asks for one.
    pub fn fence(&self) -> Option<Fence> {
        (self.wait_replicas > 0).then(|| Fence {
            replicas: self.wait_replicas,
            timeout_ms: (self.timeout_ms / 2).max(1),
        })
    }

    /// The texts no message may show.
    pub fn secrets(&self) -> Vec<Vec<u8>> {
        let sentinels = match &self.deployment {
            Deployment::Sentinel(sentinels) => sentinels.password.as_ref(),
            _ => None,
        };
        self.password
            .iter()
            .chain(sentinels)
            .map(|p| p.as_bytes().to_vec())
            .collect()
    }
}

fn cluster_flag(value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(Error::Config(format!(
            "{CLUSTER_VARIABLE} must be 1 (the URL names Redis Cluster nodes) or 0"
        ))),
    }
}

/// One URL; several comma-separated ones are refused with a hint at the
/// cluster setting (a password may hold a comma, so only whole URLs count).
fn parse_single(text: &str, source: &str) -> Result<Config> {
    let parts: Vec<&str> = text.split(',').collect();
    if parts.len() > 1 && parts.iter().all(|part| parse_url(part, source).is_ok()) {
        return Err(Error::Config(format!(
            "{source} holds several comma-separated URLs, which only a Redis Cluster takes: set the cluster \
             option to true (or {CLUSTER_VARIABLE}=1)"
        )));
    }
    parse_url(text, source)
}

/// Comma-separated seed nodes: redis:// or rediss:// alike, database 0 (the
/// only one a cluster has), one set of credentials.
fn parse_cluster(text: &str, source: &str) -> Result<Config> {
    let bad = |what: &str| Error::Config(format!("{source}: {what}"));
    let mut seeds = Vec::new();
    let mut first: Option<(Config, bool)> = None;
    for part in text.split(',') {
        let node = parse_url(part, source)?;
        let Deployment::Server(Addr::Tcp { host, port, tls }) = &node.deployment else {
            return Err(bad(
                "a Redis Cluster is reached over TCP: use redis:// or rediss:// URLs",
            ));
        };
        let tls = *tls;
        if node.db != 0 {
            return Err(bad(
                "a Redis Cluster has only database 0; drop the /db from the URLs",
            ));
        }
        seeds.push((host.clone(), *port));
        match &mut first {
            None => first = Some((node, tls)),
            Some((first, first_tls)) => {
                if *first_tls != tls {
                    return Err(bad("the cluster URLs mix redis:// and rediss://"));
                }
                if node.password.is_some() || node.username.is_some() {
                    if first.password.is_none() && first.username.is_none() {
                        first.username = node.username;
                        first.password = node.password;
                    } else if (&first.username, &first.password) != (&node.username, &node.password)
                    {
                        return Err(bad("the cluster URLs hold different credentials; every node takes the same"));
                    }
                }
            }
        }
    }
    let (mut config, tls) = first.ok_or_else(|| bad("no URL"))?;
    config.deployment = Deployment::Cluster { seeds, tls };
    Ok(config)
}

fn parse_url(text: &str, source: &str) -> Result<Config> {
    const FORMS: &str = "redis://[[user]:password@]host[:port][/db], rediss://… (TLS), redis+unix:///path/to/socket[?db=N], \
                         redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/name (Sentinel), \
                         rediss+sentinel://… (Sentinel over TLS) \
                         or https://host (Upstash's REST API)";
    let url = url::Url::parse(text.trim())
        .map_err(|_| Error::Config(format!("{source} is not a valid URL; expected {FORMS}")))?;
    let bad = |what: &str| Error::Config(format!("{source}: {what}"));
    let (deployment, db) = match url.scheme() {
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
            (Deployment::Server(Addr::Tcp { host, port, tls }), db)
        }
        "redis+unix" | "unix" => {
            let path = url
                .to_file_path()
                .map_err(|_| bad("the URL must hold an absolute socket path"))?;
            let db = match url.query_pairs().find(|(k, _)| k == "db") {
                None => 0,
                Some((_, v)) => parse_db(&v)
                    .ok_or_else(|| bad("the db query parameter must be a non-negative integer"))?,
            };
            (Deployment::Server(Addr::Unix(path)), db)
        }
        "https" | "http" => {
            let loopback = match url.host() {
                Some(url::Host::Domain(name)) if !name.is_empty() => name == "localhost",
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                _ => return Err(bad("the URL has no host")),
            };
            if url.scheme() == "http" && !loopback {
                return Err(bad(
                    "an http:// URL is taken only on a loopback address (for tests): Upstash's REST API is \
                     reached over https://",
                ));
            }
            let mut base = url.clone();
            // Neither can fail on a URL with a host; the credentials are read below.
            let _ = base.set_username("");
            let _ = base.set_password(None);
            base.set_query(None);
            base.set_fragment(None);
            let base = base.as_str().trim_end_matches('/').to_string();
            (Deployment::Rest { base }, 0)
        }
        _ => return Err(bad(&format!("unsupported URL scheme; expected {FORMS}"))),
    };
    let decode = |text: &str, what: &str| percent_decoded(text, what).map_err(|e| bad(&e));
    let username = match url.username() {
        "" => None,
        name => Some(decode(name, "user name")?),
    };
    let password = url.password().map(|p| decode(p, "password")).transpose()?;
    Ok(Config {
        deployment,
        db,
        username,
        password,
        timeout_ms: DEFAULT_TIMEOUT_MS,
        tls_ca: None,
        wait_replicas: 0,
    })
}

/// The URL's scheme is one of Sentinel's.
fn is_sentinel(text: &str) -> bool {
    let text = text.trim_start().to_ascii_lowercase();
    text.starts_with("redis+sentinel:") || text.starts_with("rediss+sentinel:")
}

/// `redis+sentinel://[user:password@]host[:port][,host[:port]...]/name[?sentinelUsername=...&sentinelPassword=...]`,
/// or `rediss+sentinel://…` for TLS to the sentinels and to the master, read
/// by hand: a URL parser takes one host, not a list.
fn parse_sentinel(text: &str, source: &str) -> Result<Config> {
    const FORM: &str =
        "redis[s]+sentinel://[[user]:password@]host[:port][,host[:port]...]/name[?[sentinelUsername=...&]sentinelPassword=...]";
    let bad = |what: &str| Error::Config(format!("{source}: {what}"));
    let text = text.trim();
    let (scheme, rest) = text
        .split_once("://")
        .ok_or_else(|| bad(&format!("a Sentinel URL has the form {FORM}")))?;
    let tls = scheme.eq_ignore_ascii_case("rediss+sentinel");
    if !tls && !scheme.eq_ignore_ascii_case("redis+sentinel") {
        return Err(bad(&format!("a Sentinel URL has the form {FORM}")));
    }
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let rest = rest.split('#').next().unwrap_or_default();
    // The credentials end at the last '@' (a password's own '@' is encoded, or comes before it).
    let (userinfo, hosts_and_path) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let (hosts, path) = hosts_and_path
        .split_once('/')
        .ok_or_else(|| bad(&format!("the URL names no master: {FORM}")))?;
    let decode = |text: &str, what: &str| percent_decoded(text, what).map_err(|e| bad(&e));
    let name = decode(path.trim_end_matches('/'), "master name")?;
    if name.is_empty() || name.contains('/') {
        return Err(bad(&format!(
            "the URL's path must be the master's name: {FORM}"
        )));
    }
    let mut nodes = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        let url = url::Url::parse(&format!("redis://{host}"))
            .ok()
            .filter(|_| !host.is_empty() && !host.contains(['/', '@', '?', '#']))
            .ok_or_else(|| bad(&format!("a sentinel's address is not host[:port]: {FORM}")))?;
        let name = match url.host() {
            Some(url::Host::Domain(name)) if !name.is_empty() => name.to_string(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            _ => return Err(bad("a sentinel's address has no host")),
        };
        nodes.push((name, url.port().unwrap_or(DEFAULT_SENTINEL_PORT)));
    }
    let (username, password) = match userinfo {
        None => (None, None),
        Some(info) => {
            let (user, password) = match info.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (info, None),
            };
            let user = match user {
                "" => None,
                user => Some(decode(user, "user name")?),
            };
            (user, password.map(|p| decode(p, "password")).transpose()?)
        }
    };
    let (mut sentinel_password, mut sentinel_username) = (None, None);
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            SENTINEL_PASSWORD => sentinel_password = Some(value.into_owned()),
            SENTINEL_USERNAME if !value.is_empty() => sentinel_username = Some(value.into_owned()),
            SENTINEL_USERNAME => return Err(bad(&format!("{SENTINEL_USERNAME} is empty"))),
            _ => {
                return Err(bad(&format!(
                    "a Sentinel URL takes only the {SENTINEL_USERNAME} and {SENTINEL_PASSWORD} query parameters"
                )))
            }
        }
    }
    if sentinel_username.is_some() && sentinel_password.is_none() {
        return Err(bad(&format!(
            "{SENTINEL_USERNAME} is the sentinels' ACL user: give its password as {SENTINEL_PASSWORD}"
        )));
    }
    Ok(Config {
        deployment: Deployment::Sentinel(Sentinels {
            nodes,
            name,
            tls,
            username: sentinel_username,
            password: sentinel_password,
        }),
        db: 0,
        username,
        password,
        timeout_ms: DEFAULT_TIMEOUT_MS,
        tls_ca: None,
        wait_replicas: 0,
    })
}

fn parse_db(text: &str) -> Option<i64> {
    text.parse::<i64>().ok().filter(|db| *db >= 0)
}

fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>> {
    crate::tls::certificates(pem, Error::Config)
}

/// `text` percent-decoded as UTF-8, or what to say about the URL's `what`.
fn percent_decoded(text: &str, what: &str) -> std::result::Result<String, String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| format!("the {what} in the URL is not valid percent-encoded UTF-8"))
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

    /// The one server a config names.
    fn server(c: &Config) -> Addr {
        match &c.deployment {
            Deployment::Server(addr) => addr.clone(),
            other => panic!("expected one server, got {other:?}"),
        }
    }

    /// The sentinels a config names.
    fn sentinels(c: &Config) -> Sentinels {
        match &c.deployment {
            Deployment::Sentinel(sentinels) => sentinels.clone(),
            other => panic!("expected sentinels, got {other:?}"),
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
        assert_eq!((server(&c), c.db, c.password), (tcp, 2, None));
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
        assert_eq!(server(&c), tls);
        assert_eq!(c.username.as_deref(), Some("default"));
        assert_eq!(c.password.as_deref(), Some("p@ss"));
    }

    #[test]
    fn a_unix_socket() {
        let c = Config::resolve(&url("redis+unix:///tmp/redis.sock?db=3"), env(&[])).unwrap();
        assert_eq!(
            (server(&c), c.db),
            (Addr::Unix("/tmp/redis.sock".into()), 3)
        );
    }

    #[test]
    fn the_environment_in_order_and_empty_is_unset() {
        let e = env(&[("REDIS_URL", ""), ("KV_URL", "redis://kv:1")]);
        let c = Config::resolve(&Options::default(), e).unwrap();
        assert!(matches!(server(&c), Addr::Tcp { ref host, port: 1, .. } if host == "kv"));
        let e = env(&[("REDIS_URL", "redis://first"), ("KV_URL", "redis://kv")]);
        let c = Config::resolve(&Options::default(), e).unwrap();
        assert!(matches!(server(&c), Addr::Tcp { ref host, .. } if host == "first"));
        let c = Config::resolve(&url("redis://option"), env(&[("REDIS_URL", "redis://env")]));
        assert!(matches!(server(&c.unwrap()), Addr::Tcp { ref host, .. } if host == "option"));
    }

    #[test]
    fn no_url_names_the_variables() {
        let message = config_error(Config::resolve(&Options::default(), env(&[])));
        for name in [
            "url option",
            "REDIS_URL",
            "KV_URL",
            "UPSTASH_REDIS_REST_URL with UPSTASH_REDIS_REST_TOKEN",
            "KV_REST_API_URL with KV_REST_API_TOKEN",
        ] {
            assert!(message.contains(name), "{name}: {message}");
        }
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

    fn rest(base: &str) -> Deployment {
        Deployment::Rest { base: base.into() }
    }

    #[test]
    fn an_https_url_is_the_rest_api_without_its_credentials() {
        let mut o = url("https://default:in-url@eu1-fine-cat-3.upstash.io/?x=1");
        let c = Config::resolve(&o, env(&[])).unwrap();
        assert_eq!(c.deployment, rest("https://eu1-fine-cat-3.upstash.io"));
        assert!(c.is_rest());
        assert_eq!(c.password.as_deref(), Some("in-url"));
        o.token = Some("from-option".into());
        let c = Config::resolve(&o, env(&[])).unwrap();
        assert_eq!(c.password.as_deref(), Some("from-option"));
        let c = Config::resolve(
            &url("http://127.0.0.1:8079/base/"),
            env(&[("REDIS_TOKEN", "t")]),
        );
        assert_eq!(c.unwrap().deployment, rest("http://127.0.0.1:8079/base"));
        for loopback in ["http://localhost:1", "http://[::1]:1", "http://127.8.0.1"] {
            let c = Config::resolve(&url(loopback), env(&[("REDIS_TOKEN", "t")]));
            assert!(c.is_ok(), "{loopback}");
        }
    }

    #[test]
    fn the_rest_variables_come_after_the_tcp_ones_each_with_its_token() {
        let upstash = [
            ("UPSTASH_REDIS_REST_URL", "https://upstash.example"),
            ("UPSTASH_REDIS_REST_TOKEN", "upstash-token"),
            ("KV_REST_API_URL", "https://kv.example"),
            ("KV_REST_API_TOKEN", "kv-token"),
        ];
        let c = Config::resolve(&Options::default(), env(&upstash)).unwrap();
        assert_eq!(c.deployment, rest("https://upstash.example"));
        assert_eq!(c.password.as_deref(), Some("upstash-token"));
        let c = Config::resolve(&Options::default(), env(&upstash[2..])).unwrap();
        assert_eq!(
            (c.deployment, c.password.as_deref()),
            (rest("https://kv.example"), Some("kv-token"))
        );
        // A URL of one pair with only the other's token, as askdare-upstash takes it.
        let mixed = [upstash[0], upstash[3]];
        let c = Config::resolve(&Options::default(), env(&mixed)).unwrap();
        assert_eq!(c.password.as_deref(), Some("kv-token"));
        let mut tcp_too = upstash.to_vec();
        tcp_too.push(("KV_URL", "rediss://:pw@kv.example:6379"));
        let c = Config::resolve(&Options::default(), env(&tcp_too)).unwrap();
        assert!(
            matches!(server(&c), Addr::Tcp { tls: true, .. }),
            "KV_URL wins"
        );
        assert_eq!(c.password.as_deref(), Some("pw"));
        // An https:// url option reads the REST tokens too.
        let c = Config::resolve(&url("https://upstash.example"), env(&upstash[1..2])).unwrap();
        assert_eq!(c.password.as_deref(), Some("upstash-token"));
    }

    #[test]
    fn a_rest_url_needs_a_token_https_off_loopback_and_no_cluster() {
        let e = env(&[("UPSTASH_REDIS_REST_URL", "https://hunter2.upstash.io")]);
        let message = config_error(Config::resolve(&Options::default(), e));
        assert!(
            message.starts_with("UPSTASH_REDIS_REST_URL is a REST URL"),
            "{message}"
        );
        assert!(message.contains("UPSTASH_REDIS_REST_TOKEN"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        let mut o = url("http://hunter2.example");
        o.token = Some("t".into());
        let message = config_error(Config::resolve(&o, env(&[])));
        assert!(message.contains("only on a loopback address"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        o.url = Some("https://a.example".into());
        o.cluster = Some(true);
        assert!(config_error(Config::resolve(&o, env(&[]))).contains("over TCP"));
    }

    #[test]
    fn tls_ca_goes_with_https_too() {
        let mut o = url("https://h");
        o.token = Some("t".into());
        o.tls_ca = Some("x".into());
        assert!(config_error(Config::resolve(&o, env(&[]))).contains("PEM certificate"));
        o.url = Some("http://127.0.0.1:1".into());
        assert!(config_error(Config::resolve(&o, env(&[])))
            .contains("not a rediss://, rediss+sentinel:// or https://"));
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
        assert!(config_error(Config::resolve(&o, env(&[])))
            .contains("not a rediss://, rediss+sentinel:// or https://"));
        o.url = Some("rediss://h".into());
        assert!(config_error(Config::resolve(&o, env(&[]))).contains("PEM certificate"));
    }

    fn cluster(url: &str) -> Options {
        Options {
            cluster: Some(true),
            ..self::url(url)
        }
    }

    fn seeds(list: &[(&str, u16)]) -> Deployment {
        Deployment::Cluster {
            seeds: list.iter().map(|(h, p)| (h.to_string(), *p)).collect(),
            tls: false,
        }
    }

    #[test]
    fn cluster_seeds_from_the_option_or_the_environment() {
        let c = Config::resolve(&cluster("redis://:pw@a:7000, redis://b:7001"), env(&[])).unwrap();
        assert_eq!(c.deployment, seeds(&[("a", 7000), ("b", 7001)]));
        assert_eq!(c.password.as_deref(), Some("pw"));
        let e = env(&[
            ("REDIS_URL", "redis://a:1,redis://:pw@b:2"),
            ("REDIS_CLUSTER", "1"),
        ]);
        let c = Config::resolve(&Options::default(), e).unwrap();
        assert!(matches!(c.deployment, Deployment::Cluster { ref seeds, .. } if seeds.len() == 2));
        assert_eq!(c.password.as_deref(), Some("pw"));
        // One URL is a cluster of one seed; the option wins over the variable.
        let c = Config::resolve(&cluster("redis://a"), env(&[])).unwrap();
        assert_eq!(c.deployment, seeds(&[("a", 6379)]));
        let mut o = url("redis://a");
        o.cluster = Some(false);
        assert!(!Config::resolve(&o, env(&[("REDIS_CLUSTER", "1")]))
            .unwrap()
            .is_cluster());
    }

    #[test]
    fn several_urls_need_the_cluster_setting() {
        let message = config_error(Config::resolve(
            &url("redis://:hunter2@a,redis://b"),
            env(&[]),
        ));
        assert!(
            message.contains("set the cluster option to true (or REDIS_CLUSTER=1)"),
            "{message}"
        );
        assert!(!message.contains("hunter2"), "{message}");
        let e = env(&[("REDIS_URL", "redis://a,redis://b"), ("REDIS_CLUSTER", "0")]);
        assert!(
            config_error(Config::resolve(&Options::default(), e)).starts_with("REDIS_URL holds")
        );
        let e = env(&[("REDIS_URL", "redis://a"), ("REDIS_CLUSTER", "maybe")]);
        assert!(config_error(Config::resolve(&Options::default(), e))
            .contains("REDIS_CLUSTER must be 1"));
        // A comma inside a password is not a second URL.
        let c = Config::resolve(&url("redis://:a,b@h"), env(&[])).unwrap();
        assert_eq!(c.password.as_deref(), Some("a,b"));
    }

    #[test]
    fn cluster_urls_must_agree() {
        for (text, expect) in [
            ("redis://a,rediss://b", "mix redis:// and rediss://"),
            ("redis://a/1", "only database 0"),
            ("redis+unix:///tmp/s", "over TCP"),
            (
                "redis://:hunter2@a,redis://:other@b",
                "different credentials",
            ),
            ("redis://a,,redis://b", "not a valid URL"),
        ] {
            let message = config_error(Config::resolve(&cluster(text), env(&[])));
            assert!(message.contains(expect), "{text}: {message}");
            assert!(!message.contains("hunter2"), "{text}: {message}");
        }
    }

    #[test]
    fn a_sentinel_url_names_the_sentinels_the_master_and_the_passwords() {
        let c = Config::resolve(
            &url("redis+sentinel://app:p%40ss@10.0.0.1:26380, sentinel.example ,[::1]:5/mymaster?sentinelPassword=s%26p"),
            env(&[]),
        )
        .unwrap();
        let nodes = vec![
            ("10.0.0.1".to_string(), 26380),
            ("sentinel.example".to_string(), 26379),
            ("::1".to_string(), 5),
        ];
        let s = sentinels(&c);
        assert_eq!(
            (s.nodes, s.name, s.tls, s.username),
            (nodes, "mymaster".into(), false, None)
        );
        assert_eq!(c.username.as_deref(), Some("app"));
        assert_eq!(c.password.as_deref(), Some("p@ss"));
        assert_eq!(s.password.as_deref(), Some("s&p"));
        assert_eq!(c.secrets(), vec![b"p@ss".to_vec(), b"s&p".to_vec()]);
        assert!(!format!("{c:?}").contains("s&p"));
        assert_eq!(c.db, 0);
        // From REDIS_URL too, with no credentials, and a name that needs decoding.
        let e = env(&[("REDIS_URL", "REDIS+SENTINEL://h/my%20master")]);
        let c = Config::resolve(&Options::default(), e).unwrap();
        let s = sentinels(&c);
        assert_eq!(
            (s.nodes, s.name, s.tls),
            (vec![("h".into(), 26379)], "my master".into(), false)
        );
        assert_eq!((c.username, c.password, s.password), (None, None, None));
        // Only a password: the default user.
        let c = Config::resolve(&url("redis+sentinel://:pw@h/m/"), env(&[])).unwrap();
        assert_eq!(
            (c.username.as_deref(), c.password.as_deref()),
            (None, Some("pw"))
        );
        assert_eq!(sentinels(&c).username, None);
        // The sentinels' ACL user, beside its password.
        let c = Config::resolve(
            &url("redis+sentinel://h/m?sentinelUsername=watch%20er&sentinelPassword=s%26p"),
            env(&[]),
        )
        .unwrap();
        let s = sentinels(&c);
        assert_eq!(s.username.as_deref(), Some("watch er"));
        assert_eq!(s.password.as_deref(), Some("s&p"));
        assert_eq!((&c.username, &c.password), (&None, &None));
        assert!(!format!("{c:?}").contains("s&p"));
    }

    #[test]
    fn bad_sentinel_urls_are_refused_without_their_secrets() {
        for (options, expect) in [
            (url("rediss+sentinel://:hunter2@h"), "names no master"),
            (url("redis+sentinel://:hunter2@h"), "names no master"),
            (url("redis+sentinel://:hunter2@h/"), "master's name"),
            (url("redis+sentinel://:hunter2@h/a/b"), "master's name"),
            (url("redis+sentinel://:hunter2@h,,g/m"), "not host[:port]"),
            (
                url("redis+sentinel://:hunter2@h:99999/m"),
                "not host[:port]",
            ),
            (url("redis+sentinel://:hunter2@/m"), "not host[:port]"),
            (
                url("redis+sentinel://:hunter2@h/m?db=1"),
                "only the sentinelUsername and sentinelPassword",
            ),
            (
                url("redis+sentinel://:hunter2@h/m?sentinelUsername=u"),
                "give its password as sentinelPassword",
            ),
            (
                url("redis+sentinel://:hunter2@h/m?sentinelUsername=&sentinelPassword=hunter2"),
                "sentinelUsername is empty",
            ),
            (url("redis+sentinel://:%ff@h/m"), "password in the URL"),
            (url("redis+sentinel:hunter2"), "has the form"),
            (
                cluster("redis+sentinel://:hunter2@h/m"),
                "not Redis Cluster nodes",
            ),
        ] {
            let text = options.url.clone().unwrap_or_default();
            let message = config_error(Config::resolve(&options, env(&[])));
            assert!(message.contains(expect), "{text}: {message}");
            assert!(message.starts_with("the url option"), "{text}: {message}");
            assert!(!message.contains("hunter2"), "{text}: {message}");
        }
        let mut o = url("redis+sentinel://h/m");
        o.tls_ca = Some("x".into());
        assert!(config_error(Config::resolve(&o, env(&[])))
            .contains("not a rediss://, rediss+sentinel:// or https://"));
    }

    #[test]
    fn a_tls_sentinel_url_takes_tls_ca_for_the_sentinels_and_the_master() {
        let mut o = url("rediss+sentinel://:pw@a:1,b/m?sentinelPassword=sp");
        let c = Config::resolve(&o, env(&[])).unwrap();
        let s = sentinels(&c);
        assert_eq!(
            (s.nodes, s.name, s.tls),
            (vec![("a".into(), 1), ("b".into(), 26379)], "m".into(), true)
        );
        assert_eq!(c.password.as_deref(), Some("pw"));
        assert_eq!(s.password.as_deref(), Some("sp"));
        assert!(c.tls_ca.is_none());
        o.tls_ca = Some("x".into());
        assert!(config_error(Config::resolve(&o, env(&[]))).contains("PEM certificate"));
        let e = env(&[("REDIS_URL", "REDISS+SENTINEL://h/m")]);
        let c = Config::resolve(&Options::default(), e).unwrap();
        assert!(sentinels(&c).tls);
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
