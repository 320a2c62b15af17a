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

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::net::TcpStream;

use super::config_error;
use crate::errors::{Error, Result};

/// MySQL's `ssl-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disabled,
    Preferred,
    Required,
    VerifyCa,
    VerifyIdentity,
}

impl SslMode {
    /// MySQL's names (any case), and libpq's that Prisma and others put in MySQL URLs too.
    pub fn parse(text: &str) -> Result<SslMode> {
        Ok(match text.to_ascii_uppercase().replace('-', "_").as_str() {
            "DISABLED" | "DISABLE" | "FALSE" | "0" => SslMode::Disabled,
            "PREFERRED" | "PREFER" => SslMode::Preferred,
            "REQUIRED" | "REQUIRE" | "TRUE" | "1" => SslMode::Required,
            "VERIFY_CA" => SslMode::VerifyCa,
            "VERIFY_IDENTITY" | "VERIFY_FULL" => SslMode::VerifyIdentity,
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
    let certs: std::result::Result<Vec<_>, _> =
        CertificateDer::pem_slice_iter(pem.as_bytes()).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        _ => Err(config_error(
            "tls.ca must hold at least one PEM certificate (-----BEGIN CERTIFICATE-----)",
        )),
    }
}

/// Accepts any certificate, and checks only the handshake's signatures.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

/// Checks the chain against the roots, not the host name (`VERIFY_CA`).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The connector for a mode other than `DISABLED`.
#[derive(Clone)]
pub struct Tls {
    connector: tokio_rustls::TlsConnector,
}

impl Tls {
    pub fn new(mode: SslMode, ca: Option<&[CertificateDer<'static>]>) -> Result<Tls> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        match ca {
            Some(certs) => {
                for cert in certs {
                    roots.add(cert.clone()).map_err(|_| {
                        config_error("tls.ca holds a certificate that can't be used as a CA")
                    })?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let roots = Arc::new(roots);
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|_| Error::Internal("no TLS protocol version is available"))?;
        let webpki = || {
            WebPkiServerVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
                .build()
                .map_err(|_| config_error("tls.ca can't be used to check certificates"))
        };
        let verifier: Arc<dyn ServerCertVerifier> = match mode {
            SslMode::VerifyIdentity => webpki()?,
            SslMode::VerifyCa => Arc::new(ChainOnly(webpki()?)),
            _ if ca.is_some() => Arc::new(ChainOnly(webpki()?)),
            _ => Arc::new(Unchecked(Arc::clone(&provider))),
        };
        let config = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Tls {
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
