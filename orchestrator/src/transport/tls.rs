//! The server's certificate: read from PEM files, or made on first start (self-signed,
//! in the data directory) and kept; and the REST door's TLS acceptor.
//!
//! A generated certificate lives in `<dir>/cert.pem` with its key in `<dir>/key.pem`
//! and its fingerprint in `<dir>/fingerprint` (each mode 0600, in a 0700 directory, as
//! everything in the data directory); later starts reuse them, so clients that pinned
//! the fingerprint keep trusting the server.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use skein_proto::tls::Fingerprint;

use crate::private::create_private;

/// A PEM certificate chain and its private key.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
}

/// Why the server's certificate could not be read, made or used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("cannot use the TLS file {}; help: check that it exists and this user may read it", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file is not what it should be (no certificate, no key, bad PEM).
    #[error("{}: {what}; help: give a PEM certificate chain (--tls-cert) and its PEM private key (--tls-key)", .path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// Half of a generated certificate is missing.
    #[error(
        "{} exists but {} does not; help: delete the other one too, and a new certificate is made at the next start (clients must then pin its new fingerprint)",
        .present.display(), .missing.display()
    )]
    Half {
        /// The file that is there.
        present: PathBuf,
        /// The file that is not.
        missing: PathBuf,
    },
    /// The certificate could not be made.
    #[error("cannot make a self-signed certificate")]
    Generate(#[source] rcgen::Error),
    /// rustls refused the certificate or key.
    #[error("the certificate {} or its key cannot be used for TLS", .path.display())]
    Rustls {
        /// The certificate.
        path: PathBuf,
        /// The cause.
        #[source]
        source: rustls::Error,
    },
}

/// A certificate made on first start: its files and its fingerprint.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The certificate and key.
    pub files: TlsFiles,
    /// The certificate's SHA-256 fingerprint, for clients to pin.
    pub fingerprint: Fingerprint,
    /// Whether it was made now (else it was found from an earlier start).
    pub new: bool,
}

/// The certificate in `dir` (`cert.pem`, `key.pem`), made self-signed for `names`
/// (host names and IP addresses) when neither file exists.
///
/// Errors: [`TlsError::Half`] when only one file exists; IO and generation errors.
pub fn load_or_generate(dir: &Path, names: &[String]) -> Result<Generated, TlsError> {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    let files = TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
    };
    match (cert.exists(), key.exists()) {
        (true, true) => {
            let fingerprint = fingerprint(&cert)?;
            return Ok(Generated {
                files,
                fingerprint,
                new: false,
            });
        }
        (true, false) => {
            return Err(TlsError::Half {
                present: cert,
                missing: key,
            });
        }
        (false, true) => {
            return Err(TlsError::Half {
                present: key,
                missing: cert,
            });
        }
        (false, false) => {}
    }
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| TlsError::Io { path, source }
    };
    crate::private::private_dir(dir).map_err(io(dir))?;
    let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(TlsError::Generate)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Skein server (self-signed)");
    let pair = rcgen::KeyPair::generate().map_err(TlsError::Generate)?;
    let certificate = params.self_signed(&pair).map_err(TlsError::Generate)?;
    // The key first: a certificate without its key is refused at the next start.
    create_private(&key, pair.serialize_pem().as_bytes()).map_err(io(&key))?;
    create_private(&cert, certificate.pem().as_bytes()).map_err(io(&cert))?;
    let fingerprint = Fingerprint::of(certificate.der());
    let record = dir.join("fingerprint");
    // Replaced when stale (the certificate is the truth; this file is for people).
    let _ = std::fs::remove_file(&record);
    create_private(&record, format!("{fingerprint}\n").as_bytes()).map_err(io(&record))?;
    Ok(Generated {
        files,
        fingerprint,
        new: true,
    })
}

/// The certificates of a PEM file, in order (the server's first).
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |what: String| TlsError::Pem {
        path: path.to_owned(),
        what,
    };
    let bytes = std::fs::read(path).map_err(|source| TlsError::Io {
        path: path.to_owned(),
        source,
    })?;
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(format!("not PEM ({e})")))?;
    if certificates.is_empty() {
        return Err(pem("no `BEGIN CERTIFICATE` block".to_owned()));
    }
    Ok(certificates)
}

/// The fingerprint of the first certificate of a PEM file (the server's own).
///
/// Errors: the file cannot be read or holds no certificate.
pub fn fingerprint(path: &Path) -> Result<Fingerprint, TlsError> {
    let certificates = certificates(path)?;
    match certificates.first() {
        Some(first) => Ok(Fingerprint::of(first.as_ref())),
        None => Err(TlsError::Pem {
            path: path.to_owned(),
            what: "no `BEGIN CERTIFICATE` block".to_owned(),
        }),
    }
}

/// A TLS acceptor for the REST door from `files`, offering HTTP/2 and HTTP/1.1 (ALPN).
///
/// Errors: the files cannot be read, hold no certificate or key, or do not match.
pub fn acceptor(files: &TlsFiles) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
    let chain = certificates(&files.cert)?;
    let key_bytes = std::fs::read(&files.key).map_err(|source| TlsError::Io {
        path: files.key.clone(),
        source,
    })?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| TlsError::Pem {
        path: files.key.clone(),
        what: format!("no private key ({e})"),
    })?;
    let rustls = |source| TlsError::Rustls {
        path: files.cert.clone(),
        source,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(rustls)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(rustls)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_certificate_is_kept_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let data = tempfile::tempdir().unwrap();
        let dir = data.path().join("tls");
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let first = load_or_generate(&dir, &names).unwrap();
        assert!(first.new);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&first.files.key), 0o600);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(
            std::fs::read_to_string(dir.join("fingerprint")).unwrap().trim(),
            first.fingerprint.to_string()
        );
        acceptor(&first.files).unwrap();

        let again = load_or_generate(&dir, &names).unwrap();
        assert!(!again.new);
        assert_eq!(again.fingerprint, first.fingerprint);

        std::fs::remove_file(&first.files.key).unwrap();
        let half = load_or_generate(&dir, &names).unwrap_err().to_string();
        assert!(half.contains("key.pem") && half.contains("help:"), "{half}");
    }

    #[test]
    fn a_file_that_is_no_certificate_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, "not a certificate").unwrap();
        let error = fingerprint(&cert).unwrap_err().to_string();
        assert!(
            error.contains("BEGIN CERTIFICATE") && error.contains("help:"),
            "{error}"
        );
    }
}
