//! postgresStore's TLS: libpq's `sslmode`s over rustls (ring), as
//! tokio-postgres's `MakeTlsConnect`. tokio-postgres itself parses only
//! `disable`, `prefer` and `require`; the store reads `sslmode` (and
//! `sslrootcert`) out of the URL first, and tells tokio-postgres whether TLS
//! is required.
//!
//! | sslmode | TLS | certificate checked |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (the default, as libpq's) | when the server offers it | as `require` |
//! | `require` | always | only against `tls.ca` when given (its chain, not the host name), as libpq with a root certificate |
//! | `verify-ca` | always | its chain, against `tls.ca` or the public roots |
//! | `verify-full` | always | its chain and the host name, against `tls.ca` or the public roots |
//!
//! Unchecked, the handshake's signature is still verified (the session is
//! encrypted and bound to the certificate's key), but nothing proves whose
//! key it is, as with libpq's `require`: use `verify-full` across networks
//! you do not trust. With `channel_binding=require`, SCRAM's channel binding
//! (`tls-server-end-point`) still catches a proxy that terminates TLS with a
//! certificate of its own.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use crate::errors::{Backend, Error, Result};
use crate::tls::{client_config, Check};

fn config_error(text: impl Into<String>) -> Error {
    Error::Sql {
        store: Backend::Postgres,
        code: "ERR_CONFIG",
        text: text.into(),
        sent: None,
    }
}

/// libpq's `sslmode`, those the store supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(text: &str) -> Result<SslMode> {
        Ok(match text {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => {
                return Err(config_error(
                    "sslmode must be disable, prefer, require, verify-ca or verify-full",
                ))
            }
        })
    }
}

/// `pem`'s certificates: `tls.ca`.
pub fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>> {
    crate::tls::certificates(pem, config_error)
}

/// The URL with `sslmode` and `sslrootcert` taken out of its query (or its
/// `key=value` words), and their values. The rest goes to tokio-postgres.
pub fn split_url(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut mode, mut root) = (None, None);
    let mut take = |pair: &str| -> bool {
        match pair.split_once('=') {
            Some(("sslmode", v)) => mode = Some(v.to_string()),
            Some(("sslrootcert", v)) => root = Some(v.to_string()),
            _ => return true,
        }
        false
    };
    let rest = if url.contains("://") {
        match url.split_once('?') {
            Some((base, query)) => {
                let kept: Vec<&str> = query.split('&').filter(|p| take(p)).collect();
                if kept.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
            None => url.to_string(),
        }
    } else {
        let kept: Vec<&str> = url.split_whitespace().filter(|p| take(p)).collect();
        kept.join(" ")
    };
    (rest, mode, root)
}

/// The connector for a mode other than `disable`.
#[derive(Clone)]
pub struct Tls {
    connector: tokio_rustls::TlsConnector,
}

impl Tls {
    pub fn new(mode: SslMode, ca: Option<&[CertificateDer<'static>]>) -> Result<Tls> {
        let check = match mode {
            SslMode::VerifyFull => Check::Identity,
            SslMode::VerifyCa => Check::Chain,
            _ if ca.is_some() => Check::Chain,
            _ => Check::Signature,
        };
        let config = client_config(check, ca, config_error)?;
        Ok(Tls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }
}

/// One connect's TLS: the connector and the server's name.
pub struct Connect {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl<S> MakeTlsConnect<S> for Tls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgStream<S>;
    type TlsConnect = Connect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<Connect> {
        let name = ServerName::try_from(domain.to_string()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the host is not a valid TLS server name",
            )
        })?;
        Ok(Connect {
            connector: self.connector.clone(),
            name,
        })
    }
}

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let tls = self.connector.connect(self.name, stream).await?;
            Ok(PgStream(tls))
        })
    }
}

/// A TLS session to the server.
pub struct PgStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgStream<S> {
    /// `tls-server-end-point` (RFC 5929): the hash of the server's
    /// certificate, so that SCRAM-SHA-256-PLUS proves both ends saw the same
    /// certificate, even where the certificate itself is not checked. None (plain SCRAM) for a
    /// certificate whose signature names no usable hash.
    fn channel_binding(&self) -> ChannelBinding {
        let (_, session) = self.0.get_ref();
        let end_point = session
            .peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(|cert| end_point_hash(cert.as_ref()));
        match end_point {
            Some(hash) => ChannelBinding::tls_server_end_point(hash),
            None => ChannelBinding::none(),
        }
    }
}

/// One DER element at the start of `der`: (tag, contents, rest).
fn der_element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | b as usize);
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The RFC 5929 hash of a DER certificate: that of its signature algorithm,
/// SHA-256 where that is MD5 or SHA-1 (and for RSASSA-PSS, whose common
/// profiles use it).
fn end_point_hash(cert: &[u8]) -> Option<Vec<u8>> {
    use ring::digest;
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    let (tag, body, _) = der_element(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (_, _tbs, rest) = der_element(body)?;
    let (tag, algorithm, _) = der_element(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, oid, _) = der_element(algorithm)?;
    if tag != OID {
        return None;
    }
    let hash = match oid {
        // sha{1,256}WithRSAEncryption, md5WithRSAEncryption, RSASSA-PSS, ecdsa-with-SHA{1,256}
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x04 | 0x05 | 0x0a | 0x0b]
        | [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01]
        | [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02] => &digest::SHA256,
        // sha384WithRSAEncryption, ecdsa-with-SHA384
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c]
        | [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03] => &digest::SHA384,
        // sha512WithRSAEncryption, ecdsa-with-SHA512
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d]
        | [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04] => &digest::SHA512,
        // Ed25519 and others: RFC 5929 names no hash.
        _ => return None,
    };
    Some(digest::digest(hash, cert).as_ref().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_of_the_url() {
        let (rest, mode, root) = split_url(
            "postgres://u:p@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=system",
        );
        assert_eq!(rest, "postgres://u:p@h:5/db?application_name=x");
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("system"));
        let (rest, mode, _) = split_url("postgres://u@h/db?sslmode=require");
        assert_eq!(
            (rest.as_str(), mode.as_deref()),
            ("postgres://u@h/db", Some("require"))
        );
        let (rest, mode, _) = split_url("host=h user=u sslmode=disable dbname=d");
        assert_eq!(
            (rest.as_str(), mode.as_deref()),
            ("host=h user=u dbname=d", Some("disable"))
        );
        assert_eq!(split_url("postgres://h/db").0, "postgres://h/db");
    }

    #[test]
    fn der_lengths_are_read_short_and_long() {
        assert_eq!(
            der_element(&[0x30, 2, 1, 2, 9]),
            Some((0x30, &[1u8, 2][..], &[9u8][..]))
        );
        let long = [&[0x04, 0x81, 3][..], &[7, 8, 9]].concat();
        assert_eq!(der_element(&long), Some((0x04, &[7u8, 8, 9][..], &[][..])));
        assert_eq!(der_element(&[0x30, 5, 1]), None);
        assert_eq!(end_point_hash(&[0x30, 0]), None);
    }

    #[test]
    fn modes_parse() {
        assert_eq!(
            SslMode::parse("verify-full").ok(),
            Some(SslMode::VerifyFull)
        );
        assert_eq!(SslMode::parse("allow").unwrap_err().code(), "ERR_CONFIG");
        assert!(certificates("nope").is_err());
    }
}
