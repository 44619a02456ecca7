//! TLS client settings for outboxd's HTTPS requests (SNS's certificates, SES's API, AWS's
//! credentials sources): the public web's roots, and a private CA's certificates where one is
//! set, with `ring` as the one crypto provider.

use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;

/// Settings trusting the public web's roots and `extra_ca`'s PEM certificates (at least one
/// when given).
pub fn client_config(extra_ca: Option<&[u8]>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = extra_ca {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| format!("cannot read a certificate: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("cannot trust a certificate: {e}"))?;
            added += 1;
        }
        if added == 0 {
            return Err("holds no PEM certificate".to_owned());
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
