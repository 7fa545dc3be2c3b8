//! TLS between Skein's clients and its server: a certificate's SHA-256 fingerprint, and a
//! verifier that trusts exactly the certificate of a pinned fingerprint.
//!
//! A server with no certificate of its own makes a self-signed one on first start and
//! prints its fingerprint (`sha256:` and 64 hex digits). Agents and the command line pin
//! it: the handshake succeeds only when the server presents that very certificate, so no
//! certificate authority and no host name are involved. The signature of the handshake
//! is still checked against the certificate's key, so a party that copied the
//! certificate but lacks its key is refused.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use sha2::{Digest, Sha256};

/// The SHA-256 digest of a certificate's DER encoding, written `sha256:<64 hex digits>`
/// (colons between the byte pairs are accepted on input, as `openssl x509 -fingerprint`
/// writes them).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a DER-encoded certificate.
    pub fn of(certificate_der: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(certificate_der).into())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a text is not a fingerprint.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{text}` is not a certificate fingerprint: {reason}; help: write `sha256:` and the 64 hex digits the server printed at start (its log, or `<data dir>/tls/fingerprint`)"
)]
pub struct FingerprintError {
    text: String,
    reason: &'static str,
}

impl FromStr for Fingerprint {
    type Err = FingerprintError;

    fn from_str(text: &str) -> Result<Fingerprint, FingerprintError> {
        let fail = |reason| FingerprintError {
            text: text.to_owned(),
            reason,
        };
        let trimmed = text.trim();
        let (algorithm, digits) = trimmed
            .split_once(':')
            .ok_or_else(|| fail("it does not start with `sha256:`"))?;
        if !algorithm.eq_ignore_ascii_case("sha256") {
            return Err(fail("only SHA-256 fingerprints are used"));
        }
        let digits: Vec<u8> = digits.bytes().filter(|b| *b != b':').collect();
        if digits.len() != 64 {
            return Err(fail("a SHA-256 fingerprint has 64 hex digits"));
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
            let hex = std::str::from_utf8(pair).map_err(|_| fail("it holds a character that is not a hex digit"))?;
            *byte = u8::from_str_radix(hex, 16).map_err(|_| fail("it holds a character that is not a hex digit"))?;
        }
        Ok(Fingerprint(bytes))
    }
}

/// A [`ServerCertVerifier`] that accepts only the certificate whose fingerprint is
/// pinned, whatever its issuer, names or dates; the handshake's signature is verified
/// with the certificate's key as usual.
#[derive(Debug)]
pub struct PinnedServer {
    pin: Fingerprint,
    algorithms: WebPkiSupportedAlgorithms,
}

impl PinnedServer {
    /// A verifier of `pin`, checking signatures with `provider`'s algorithms.
    pub fn new(pin: Fingerprint, provider: &CryptoProvider) -> PinnedServer {
        PinnedServer {
            pin,
            algorithms: provider.signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for PinnedServer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = Fingerprint::of(end_entity);
        if presented == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the server presented the certificate {presented}, not the pinned {}; if the server's certificate was replaced on purpose, pin the fingerprint it printed at start",
                self.pin
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A client configuration (ring, TLS 1.2 and 1.3) that trusts only the certificate of
/// `pin`, offering the ALPN protocols `alpn` (`h2` for gRPC).
///
/// Errors: the provider refuses the protocol versions (it does not with ring).
pub fn pinned_client_config(pin: Fingerprint, alpn: &[&[u8]]) -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(PinnedServer::new(pin, &provider));
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_read_back_as_written() {
        let fingerprint = Fingerprint::of(b"a certificate");
        let text = fingerprint.to_string();
        assert!(text.starts_with("sha256:") && text.len() == 7 + 64, "{text}");
        assert_eq!(text.parse::<Fingerprint>().unwrap(), fingerprint);
        // openssl's way: upper case, colons between bytes.
        let openssl = format!(
            "SHA256:{}",
            text.as_bytes()[7..]
                .chunks(2)
                .map(|p| std::str::from_utf8(p).unwrap().to_uppercase())
                .collect::<Vec<_>>()
                .join(":")
        );
        assert_eq!(openssl.parse::<Fingerprint>().unwrap(), fingerprint);
    }

    #[test]
    fn a_bad_fingerprint_says_what_is_wrong() {
        for (text, says) in [
            ("abcd", "does not start with `sha256:`"),
            ("md5:00", "only SHA-256"),
            ("sha256:00", "64 hex digits"),
            (&format!("sha256:{}", "zz".repeat(32)), "not a hex digit"),
        ] {
            let error = text.parse::<Fingerprint>().unwrap_err().to_string();
            assert!(error.contains(says) && error.contains("help:"), "{text}: {error}");
        }
    }
}
