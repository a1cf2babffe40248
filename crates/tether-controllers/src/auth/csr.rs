//! Client certificates of consumers: the consumer makes a key and a CSR naming exactly its
//! username; the provider checks a CSR asks for nothing else before Kubernetes signs it.

use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, PKCS_ECDSA_P256_SHA256};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

use crate::Error;

/// A fresh client key and a CSR for `username`.
#[derive(Clone)]
pub struct ClientKey {
    /// The private key, PEM (PKCS#8). Stays with the consumer.
    pub key_pem: String,
    /// The request, PEM.
    pub csr_pem: String,
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientKey")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl ClientKey {
    /// Generates an ECDSA P-256 key and a CSR whose subject is `CN=<username>` and nothing else.
    pub fn generate(username: &str) -> Result<Self, Error> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(Error::cert("generating a client key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, username);
        params.distinguished_name = dn;
        let csr = params
            .serialize_request(&key)
            .map_err(Error::cert("building the certificate signing request"))?;
        Ok(Self {
            key_pem: key.serialize_pem(),
            csr_pem: csr.pem().map_err(Error::cert("encoding the CSR"))?,
        })
    }
}

/// Checks that `csr_pem` is a well-signed request whose subject is exactly `CN=<username>`,
/// with no organisation (Kubernetes would turn it into groups) and no requested extensions.
/// The error says what is wrong, for the consumer's condition message.
pub fn check(csr_pem: &str, username: &str) -> Result<(), String> {
    let der = pem_der(csr_pem, "CERTIFICATE REQUEST")
        .ok_or("the CSR is not a PEM `CERTIFICATE REQUEST`")?;
    let (_, csr) = X509CertificationRequest::from_der(&der)
        .map_err(|_| "the CSR cannot be parsed as PKCS#10")?;
    csr.verify_signature()
        .map_err(|_| "the CSR's signature does not verify")?;
    let subject = &csr.certification_request_info.subject;
    let attrs: Vec<_> = subject.iter_attributes().collect();
    let cn_ok = attrs.len() == 1
        && attrs[0].attr_type() == &x509_parser::oid_registry::OID_X509_COMMON_NAME
        && attrs[0].as_str().ok() == Some(username);
    if !cn_ok {
        return Err(format!(
            "the CSR's subject must be exactly CN={username} (got {subject})"
        ));
    }
    if csr
        .requested_extensions()
        .is_some_and(|mut e| e.next().is_some())
    {
        return Err("the CSR must not request extensions".to_owned());
    }
    Ok(())
}

/// The `notAfter` of a PEM certificate, in Unix seconds.
pub fn not_after(cert_pem: &str) -> Result<i64, Error> {
    let der = pem_der(cert_pem, "CERTIFICATE")
        .ok_or_else(|| Error::Invalid("the issued certificate is not PEM".to_owned()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|_| Error::Invalid("the issued certificate cannot be parsed".to_owned()))?;
    Ok(cert.validity().not_after.timestamp())
}

fn pem_der(pem: &str, label: &str) -> Option<Vec<u8>> {
    let mut reader = std::io::BufReader::new(pem.as_bytes());
    loop {
        match rustls_pemfile::read_one(&mut reader).ok()?? {
            rustls_pemfile::Item::Csr(der) if label == "CERTIFICATE REQUEST" => {
                return Some(der.to_vec());
            }
            rustls_pemfile::Item::X509Certificate(der) if label == "CERTIFICATE" => {
                return Some(der.to_vec());
            }
            _ => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr_with(dn: DistinguishedName, san: bool) -> String {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
        let mut params = if san {
            CertificateParams::new(vec!["evil.example".to_owned()]).expect("params")
        } else {
            CertificateParams::default()
        };
        params.distinguished_name = dn;
        params
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem")
    }

    #[test]
    fn accepts_exactly_the_username_and_refuses_groups_other_names_and_extensions() {
        let user = "tether:consumer:c1";
        let good = ClientKey::generate(user).expect("csr");
        assert_eq!(check(&good.csr_pem, user), Ok(()));

        let other = ClientKey::generate("tether:consumer:c2").expect("csr");
        let err = check(&other.csr_pem, user).expect_err("other name");
        assert!(err.contains("exactly CN=tether:consumer:c1"), "{err}");

        let mut with_group = DistinguishedName::new();
        with_group.push(DnType::CommonName, user);
        with_group.push(DnType::OrganizationName, "system:masters");
        let err = check(&csr_with(with_group, false), user).expect_err("group");
        assert!(err.contains("subject must be exactly"), "{err}");

        let mut plain = DistinguishedName::new();
        plain.push(DnType::CommonName, user);
        let err = check(&csr_with(plain, true), user).expect_err("san");
        assert!(err.contains("extensions"), "{err}");

        assert!(check("not pem", user).is_err());
    }

    #[test]
    fn a_csr_with_a_broken_signature_is_refused() {
        let user = "tether:consumer:c1";
        let good = ClientKey::generate(user).expect("csr");
        let der = pem_der(&good.csr_pem, "CERTIFICATE REQUEST").expect("der");
        let mut bad = der;
        let last = bad.len() - 1;
        bad[last] ^= 0x55;
        let pem = pem_encode("CERTIFICATE REQUEST", &bad);
        assert!(check(&pem, user).is_err());
    }

    fn pem_encode(label: &str, der: &[u8]) -> String {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).expect("ascii"))
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    }

    #[test]
    fn debug_hides_the_key() {
        let k = ClientKey::generate("u").expect("key");
        assert!(!format!("{k:?}").contains("PRIVATE"));
    }
}
