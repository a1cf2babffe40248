//! CSR signer: issues certificates for approved CertificateSigningRequests of the
//! `kubernetes.io/kube-apiserver-client` and `kubernetes.io/kube-apiserver-client-kubelet`
//! signers, with the cluster CA, as kube-controller-manager's csrsigning controller does.
//!
//! Nothing is approved here: like a real cluster, approval comes from a client through the
//! `approval` subresource (`kubectl certificate approve`). A request the signer's policy refuses
//! gets a `Failed` condition with reason `SignerValidationFailure` and the real signer's
//! message. The certificate lives `spec.expirationSeconds`, capped at the cluster signing
//! duration (kube-controller-manager's `--cluster-signing-duration`, one year by default), and
//! is written to `status.certificate`.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use super::is_status;
use crate::tls::CertAuthority;

/// Signer for client certificates that authenticate to the API server.
pub const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
/// Signer for kubelets' client certificates.
pub const KUBE_APISERVER_CLIENT_KUBELET: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// What the signer's policy looks at in a PKCS#10 request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestSubject {
    /// Subject CN.
    pub common_name: String,
    /// Subject O values.
    pub organizations: Vec<String>,
    /// DNS subjectAltNames requested.
    pub dns_names: usize,
    /// Email subjectAltNames requested.
    pub emails: usize,
    /// IP subjectAltNames requested.
    pub ips: usize,
    /// URI subjectAltNames requested.
    pub uris: usize,
}

/// Errors reading a CSR.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    /// `spec.request` is not a PEM `CERTIFICATE REQUEST`.
    #[error("unable to parse csr: {0}")]
    Parse(String),
    /// `spec.request` is not PEM.
    #[error("unable to parse csr")]
    Pem(#[source] x509_parser::nom::Err<x509_parser::error::PEMError>),
    /// The PEM block is not a DER certificate request.
    #[error("unable to parse csr")]
    Der(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
    /// The API server refused or failed a request.
    #[error("csr signer")]
    Kube(#[from] kube::Error),
}

/// Reads subject and subjectAltNames from a PEM `CERTIFICATE REQUEST`.
pub fn parse_request(pem: &[u8]) -> Result<RequestSubject, CsrError> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).map_err(CsrError::Pem)?;
    if pem.label != "CERTIFICATE REQUEST" {
        return Err(CsrError::Parse(format!(
            "PEM block type must be CERTIFICATE REQUEST, not {}",
            pem.label
        )));
    }
    let (_, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
            .map_err(CsrError::Der)?;
    let subject = &csr.certification_request_info.subject;
    let text = |attr: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        attr.as_str().map(str::to_owned).unwrap_or_default()
    };
    let mut out = RequestSubject {
        common_name: subject
            .iter_common_name()
            .next()
            .map(text)
            .unwrap_or_default(),
        organizations: subject.iter_organization().map(text).collect(),
        ..RequestSubject::default()
    };
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(_) => out.dns_names += 1,
                    GeneralName::RFC822Name(_) => out.emails += 1,
                    GeneralName::IPAddress(_) => out.ips += 1,
                    GeneralName::URI(_) => out.uris += 1,
                    _ => {}
                }
            }
        }
    }
    Ok(out)
}

/// The signer's policy for one request: `Ok` to sign, `Err(message)` for a `Failed`
/// condition. `None` when the signer name is not one this controller signs for.
pub fn validate(
    signer: &str,
    usages: &[String],
    subject: &RequestSubject,
) -> Option<Result<(), String>> {
    match signer {
        KUBE_APISERVER_CLIENT => Some(validate_client_usages(usages)),
        KUBE_APISERVER_CLIENT_KUBELET => Some(validate_kubelet_client(usages, subject)),
        _ => None,
    }
}

fn validate_client_usages(usages: &[String]) -> Result<(), String> {
    let mut client_auth = false;
    for usage in usages {
        match usage.as_str() {
            "digital signature" | "key encipherment" => {}
            "client auth" => client_auth = true,
            other => return Err(format!("invalid usage for client certificate: {other}")),
        }
    }
    if client_auth {
        Ok(())
    } else {
        Err("missing required usage for client certificate: client auth".to_owned())
    }
}

fn validate_kubelet_client(usages: &[String], subject: &RequestSubject) -> Result<(), String> {
    if subject.organizations != ["system:nodes"] {
        return Err("subject organization is not system:nodes".to_owned());
    }
    if subject.dns_names > 0 {
        return Err("DNS subjectAltNames are not allowed".to_owned());
    }
    if subject.emails > 0 {
        return Err("Email subjectAltNames are not allowed".to_owned());
    }
    if subject.ips > 0 {
        return Err("IP subjectAltNames are not allowed".to_owned());
    }
    if subject.uris > 0 {
        return Err("URI subjectAltNames are not allowed".to_owned());
    }
    if !subject.common_name.starts_with("system:node:") {
        return Err("subject common name does not begin with 'system:node:'".to_owned());
    }
    let mut sorted: Vec<&str> = usages.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let with_rsa = ["client auth", "digital signature", "key encipherment"];
    let without_rsa = ["client auth", "digital signature"];
    if sorted != with_rsa && sorted != without_rsa {
        return Err(
            "usages did not match [client auth digital signature key encipherment]".to_owned(),
        );
    }
    Ok(())
}

/// The state of a CSR as the signer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsrState {
    /// Not approved yet: nothing to do.
    Pending,
    /// Approved and not yet issued: sign it.
    Approved,
    /// Issued, denied or failed: final.
    Done,
}

/// Classifies a CSR from its status.
pub fn state(csr: &CertificateSigningRequest) -> CsrState {
    let Some(status) = csr.status.as_ref() else {
        return CsrState::Pending;
    };
    if status.certificate.as_ref().is_some_and(|c| !c.0.is_empty()) {
        return CsrState::Done;
    }
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let has = |type_: &str| {
        conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True")
    };
    if has("Denied") || has("Failed") {
        CsrState::Done
    } else if has("Approved") {
        CsrState::Approved
    } else {
        CsrState::Pending
    }
}

struct Context {
    client: Client,
    ca: Arc<CertAuthority>,
    signing_duration: Duration,
}

/// Runs the signer until `shutdown`.
pub async fn run(
    client: Client,
    ca: Arc<CertAuthority>,
    signing_duration: Duration,
    shutdown: CancellationToken,
) {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let context = Arc::new(Context {
        client,
        ca,
        signing_duration,
    });
    Controller::new(api, watcher::Config::default())
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, context)
        .for_each(|_| async {})
        .await;
}

fn error_policy(
    _csr: Arc<CertificateSigningRequest>,
    error: &CsrError,
    _ctx: Arc<Context>,
) -> Action {
    tracing::warn!(error = %crate::error::chain(error), "CSR signer pass failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

async fn reconcile(
    csr: Arc<CertificateSigningRequest>,
    ctx: Arc<Context>,
) -> Result<Action, CsrError> {
    if state(&csr) != CsrState::Approved {
        return Ok(Action::await_change());
    }
    let name = csr.name_any();
    let subject = match parse_request(&csr.spec.request.0) {
        Ok(subject) => subject,
        Err(e) => {
            // The API server validates the request on create; a request that still does not
            // parse is left alone, as the real signer does.
            tracing::warn!(csr = %name, error = %crate::error::chain(&e), "CSR signer: unparseable request ignored");
            return Ok(Action::await_change());
        }
    };
    let usages = csr.spec.usages.clone().unwrap_or_default();
    let Some(verdict) = validate(&csr.spec.signer_name, &usages, &subject) else {
        return Ok(Action::await_change());
    };
    let mut updated = (*csr).clone();
    let status = updated.status.get_or_insert_with(Default::default);
    let outcome = verdict.and_then(|()| {
        let pem = String::from_utf8_lossy(&csr.spec.request.0);
        let expiration = csr
            .spec
            .expiration_seconds
            .and_then(|s| u32::try_from(s).ok());
        ctx.ca
            .sign_csr(&pem, &usages, expiration, ctx.signing_duration)
            .map_err(|e| crate::error::chain(&e))
    });
    match outcome {
        Ok(certificate) => {
            status.certificate = Some(ByteString(certificate.into_bytes()));
            tracing::info!(csr = %name, signer = %csr.spec.signer_name, "CSR signed");
        }
        Err(message) => {
            let now = Time(jiff::Timestamp::now());
            status.conditions.get_or_insert_with(Vec::new).push(
                CertificateSigningRequestCondition {
                    type_: "Failed".to_owned(),
                    status: "True".to_owned(),
                    reason: Some("SignerValidationFailure".to_owned()),
                    message: Some(message),
                    last_update_time: Some(now.clone()),
                    last_transition_time: Some(now),
                },
            );
            tracing::info!(csr = %name, "CSR refused by the signer policy");
        }
    }
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    match api
        .replace_status(&name, &PostParams::default(), &updated)
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        // A newer version arrives through the watch and is signed then.
        Err(e) if is_status(&e, 409) || is_status(&e, 404) => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usages(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn node_subject() -> RequestSubject {
        RequestSubject {
            common_name: "system:node:n1".into(),
            organizations: vec!["system:nodes".into()],
            ..RequestSubject::default()
        }
    }

    #[test]
    fn client_signer_policy() {
        let any = RequestSubject::default();
        let cases: &[(&[&str], Result<(), &str>)] = &[
            (&["client auth"], Ok(())),
            (
                &["digital signature", "key encipherment", "client auth"],
                Ok(()),
            ),
            (
                &["client auth", "server auth"],
                Err("invalid usage for client certificate: server auth"),
            ),
            (
                &["digital signature"],
                Err("missing required usage for client certificate: client auth"),
            ),
        ];
        for (u, want) in cases {
            let got = validate(KUBE_APISERVER_CLIENT, &usages(u), &any).expect("known signer");
            assert_eq!(got, want.map_err(str::to_owned), "usages {u:?}");
        }
    }

    #[test]
    fn kubelet_client_signer_policy() {
        let good = usages(&["digital signature", "client auth"]);
        let s = node_subject();
        assert_eq!(
            validate(KUBE_APISERVER_CLIENT_KUBELET, &good, &s),
            Some(Ok(()))
        );
        let bad_org = RequestSubject {
            organizations: vec!["admins".into()],
            ..node_subject()
        };
        assert_eq!(
            validate(KUBE_APISERVER_CLIENT_KUBELET, &good, &bad_org),
            Some(Err("subject organization is not system:nodes".into()))
        );
        let bad_cn = RequestSubject {
            common_name: "alice".into(),
            ..node_subject()
        };
        assert_eq!(
            validate(KUBE_APISERVER_CLIENT_KUBELET, &good, &bad_cn),
            Some(Err(
                "subject common name does not begin with 'system:node:'".into()
            ))
        );
        let with_dns = RequestSubject {
            dns_names: 1,
            ..node_subject()
        };
        assert_eq!(
            validate(KUBE_APISERVER_CLIENT_KUBELET, &good, &with_dns),
            Some(Err("DNS subjectAltNames are not allowed".into()))
        );
        assert_eq!(
            validate(KUBE_APISERVER_CLIENT_KUBELET, &usages(&["client auth"]), &s),
            Some(Err(
                "usages did not match [client auth digital signature key encipherment]".into()
            ))
        );
    }

    #[test]
    fn other_signers_are_not_ours() {
        assert_eq!(
            validate(
                "kubernetes.io/kubelet-serving",
                &[],
                &RequestSubject::default()
            ),
            None
        );
        assert_eq!(
            validate("example.com/foo", &[], &RequestSubject::default()),
            None
        );
    }

    #[test]
    fn parses_subject_and_sans_of_a_real_request() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(vec!["example.com".to_owned()]).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:n1");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let pem = params
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem");
        let subject = parse_request(pem.as_bytes()).expect("parse");
        assert_eq!(subject.common_name, "system:node:n1");
        assert_eq!(subject.organizations, vec!["system:nodes".to_owned()]);
        assert_eq!(subject.dns_names, 1);
        assert!(parse_request(b"not pem").is_err());
    }

    #[test]
    fn state_follows_conditions() {
        let mut csr = CertificateSigningRequest::default();
        assert_eq!(state(&csr), CsrState::Pending);
        let cond = |t: &str| CertificateSigningRequestCondition {
            type_: t.into(),
            status: "True".into(),
            ..Default::default()
        };
        csr.status = Some(Default::default());
        if let Some(s) = csr.status.as_mut() {
            s.conditions = Some(vec![cond("Approved")]);
        }
        assert_eq!(state(&csr), CsrState::Approved);
        if let Some(s) = csr.status.as_mut() {
            s.conditions = Some(vec![cond("Approved"), cond("Failed")]);
        }
        assert_eq!(state(&csr), CsrState::Done);
        if let Some(s) = csr.status.as_mut() {
            s.conditions = Some(vec![cond("Approved")]);
            s.certificate = Some(ByteString(b"-----BEGIN CERTIFICATE-----".to_vec()));
        }
        assert_eq!(state(&csr), CsrState::Done);
    }
}
