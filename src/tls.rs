//! The rustls (ring) client set-up the stores' TLS shares: `tls.ca`'s PEM
//! certificates, the roots (those certificates, else the public roots), and
//! how much of the server's certificate is checked. Each store keeps its own
//! modes (MySQL's `ssl-mode`, libpq's `sslmode`, `rediss://`) and names
//! itself in its errors through the `config_error` it passes.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::errors::{Error, Result};

/// A store's configuration error, with the store's own code and name.
pub type ConfigError = fn(String) -> Error;

/// `pem`'s certificates: `tls.ca`.
pub fn certificates(pem: &str, config_error: ConfigError) -> Result<Vec<CertificateDer<'static>>> {
    let certs: std::result::Result<Vec<_>, _> =
        CertificateDer::pem_slice_iter(pem.as_bytes()).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        _ => Err(config_error(
            "tls.ca must hold at least one PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        )),
    }
}

/// How much of the server's certificate is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Nothing but the handshake's signatures.
    Signature,
    /// Its chain against the roots, not the host name.
    Chain,
    /// Its chain and the host name.
    Identity,
}

/// A client configuration that trusts `ca` if given, else the public roots,
/// and checks the server's certificate as `check` says.
pub fn client_config(
    check: Check,
    ca: Option<&[CertificateDer<'static>]>,
    config_error: ConfigError,
) -> Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    match ca {
        Some(certs) => {
            for cert in certs {
                roots.add(cert.clone()).map_err(|_| {
                    config_error("tls.ca holds a certificate that can't be used as a CA".into())
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
            .map_err(|_| config_error("tls.ca can't be used to check certificates".into()))
    };
    let verifier: Arc<dyn ServerCertVerifier> = match check {
        Check::Identity => webpki()?,
        Check::Chain => Arc::new(ChainOnly(webpki()?)),
        Check::Signature => Arc::new(Unchecked(Arc::clone(&provider))),
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// Accepts any certificate, and checks only the handshake's signatures.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

/// Checks the chain against the roots, not the host name.
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
