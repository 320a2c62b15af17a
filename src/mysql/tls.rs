//! mysqlStore's TLS over rustls (ring), by MySQL's `ssl-mode`:
//!
//! | ssl-mode | TLS | certificate checked |
//! |---|---|---|
//! | `DISABLED` | never | - |
//! | `PREFERRED` (the default, as the mysql client's) | when the server offers it | only against `tls.ca` when given (its chain) |
//! | `REQUIRED` | always | as `PREFERRED` |
//! | `VERIFY_CA` | always | its chain, against `tls.ca` or the public roots |
//! | `VERIFY_IDENTITY` | always | its chain and the host name, against `tls.ca` or the public roots |
//!
//! Unchecked, the handshake's signature is still verified (the session is
//! encrypted and bound to the certificate's key), but nothing proves whose
//! key it is: use `VERIFY_IDENTITY` across networks you do not trust.

use std::io;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

use super::config_error;
use crate::errors::Result;
use crate::tls::{client_config, Check};

/// MySQL's `ssl-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MySslMode {
    Disabled,
    Preferred,
    Required,
    VerifyCa,
    VerifyIdentity,
}

impl MySslMode {
    /// MySQL's names (any case), and libpq's that Prisma and others put in MySQL URLs too.
    pub fn parse(text: &str) -> Result<MySslMode> {
        Ok(match text.to_ascii_uppercase().replace('-', "_").as_str() {
            "DISABLED" | "DISABLE" | "FALSE" | "0" => MySslMode::Disabled,
            "PREFERRED" | "PREFER" => MySslMode::Preferred,
            "REQUIRED" | "REQUIRE" | "TRUE" | "1" => MySslMode::Required,
            "VERIFY_CA" => MySslMode::VerifyCa,
            "VERIFY_IDENTITY" | "VERIFY_FULL" => MySslMode::VerifyIdentity,
            _ => {
                return Err(config_error(
                    "ssl-mode must be DISABLED, PREFERRED, REQUIRED, VERIFY_CA or VERIFY_IDENTITY",
                ))
            }
        })
    }
}

/// `pem`'s certificates: `tls.ca`.
pub fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>> {
    crate::tls::certificates(pem, config_error)
}

/// The connector for a mode other than `DISABLED`.
#[derive(Clone)]
pub struct MyTls {
    connector: tokio_rustls::TlsConnector,
}

impl MyTls {
    pub fn new(mode: MySslMode, ca: Option<&[CertificateDer<'static>]>) -> Result<MyTls> {
        let check = match mode {
            MySslMode::VerifyIdentity => Check::Identity,
            MySslMode::VerifyCa => Check::Chain,
            _ if ca.is_some() => Check::Chain,
            _ => Check::Signature,
        };
        let config = client_config(check, ca, config_error)?;
        Ok(MyTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }

    /// The TLS session over `tcp` to `host`.
    pub async fn connect(
        &self,
        host: &str,
        tcp: TcpStream,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = ServerName::try_from(host.to_string()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the host is not a valid TLS server name",
            )
        })?;
        self.connector.connect(name, tcp).await
    }
}
