//! User impersonation (`kubectl --as`, `--as-group`, `--as-uid`): the `Impersonate-*` headers,
//! each authorized with the `impersonate` verb as kube-apiserver's impersonation filter does.

use std::collections::BTreeMap;

use http::HeaderMap;

use super::rbac::{RbacView, authorize};
use super::{
    ANONYMOUS_USER, RequestAttributes, SYSTEM_AUTHENTICATED, SYSTEM_UNAUTHENTICATED, UserInfo,
};
use crate::error::ApiError;

const USER: &str = "impersonate-user";
const UID: &str = "impersonate-uid";
const GROUP: &str = "impersonate-group";
const EXTRA_PREFIX: &str = "impersonate-extra-";

/// Whether the request asks to act as someone else.
pub fn wants_impersonation(headers: &HeaderMap) -> bool {
    headers.keys().any(|k| {
        let k = k.as_str();
        k == USER || k == UID || k == GROUP || k.starts_with(EXTRA_PREFIX)
    })
}

fn values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect()
}

/// Percent-decodes an extra key (header names cannot carry every character a key may hold).
fn unescape_key(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = key.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn check(
    rbac: Option<&RbacView>,
    requester: &UserInfo,
    group: &str,
    resource: &str,
    subresource: &str,
    namespace: &str,
    name: &str,
) -> Result<(), ApiError> {
    let Some(rbac) = rbac else {
        return Ok(());
    };
    let attrs = RequestAttributes {
        user: requester.clone(),
        verb: "impersonate".into(),
        api_group: group.into(),
        api_version: String::new(),
        resource: resource.into(),
        subresource: subresource.into(),
        namespace: namespace.into(),
        name: name.into(),
        path: String::new(),
        resource_request: true,
    };
    authorize(rbac, &attrs)
}

/// Applies the `Impersonate-User`, `Impersonate-Group`, `Impersonate-Uid` and
/// `Impersonate-Extra-<key>` headers: returns the impersonated user, or `None` when the request
/// impersonates nobody. Each requested attribute needs the `impersonate` verb on `users`,
/// `groups`, `serviceaccounts` (for `system:serviceaccount:<ns>:<name>`),
/// `uids.authentication.k8s.io` or `userextras/<key>.authentication.k8s.io`; a denial is the
/// usual 403. `rbac` of `None` means every request is authorized (no RBAC). Groups, uid or extra
/// without a user are a 400.
pub fn impersonate(
    rbac: Option<&RbacView>,
    requester: &UserInfo,
    headers: &HeaderMap,
) -> Result<Option<UserInfo>, ApiError> {
    if !wants_impersonation(headers) {
        return Ok(None);
    }
    let user = values(headers, USER).into_iter().next().unwrap_or_default();
    let requested_groups = values(headers, GROUP);
    let uid = values(headers, UID).into_iter().next().unwrap_or_default();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix(EXTRA_PREFIX)
            && let Ok(value) = value.to_str()
        {
            extra
                .entry(unescape_key(key))
                .or_default()
                .push(value.to_owned());
        }
    }
    if user.is_empty() {
        return Err(ApiError::bad_request(
            "requested impersonation of groups, uid or extra fields without impersonating a user",
        ));
    }
    let mut groups = Vec::new();
    let service_account = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty());
    match service_account {
        Some((ns, name)) => {
            check(rbac, requester, "", "serviceaccounts", "", ns, name)?;
            groups.push("system:serviceaccounts".to_owned());
            groups.push(format!("system:serviceaccounts:{ns}"));
        }
        None => check(rbac, requester, "", "users", "", "", &user)?,
    }
    for group in &requested_groups {
        check(rbac, requester, "", "groups", "", "", group)?;
        groups.push(group.clone());
    }
    if !uid.is_empty() {
        check(
            rbac,
            requester,
            "authentication.k8s.io",
            "uids",
            "",
            "",
            &uid,
        )?;
    }
    for (key, vals) in &extra {
        for value in vals {
            check(
                rbac,
                requester,
                "authentication.k8s.io",
                "userextras",
                key,
                "",
                value,
            )?;
        }
    }
    if user == ANONYMOUS_USER {
        if !groups.iter().any(|g| g == SYSTEM_UNAUTHENTICATED) {
            groups.push(SYSTEM_UNAUTHENTICATED.to_owned());
        }
    } else if !groups
        .iter()
        .any(|g| g == SYSTEM_AUTHENTICATED || g == SYSTEM_UNAUTHENTICATED)
    {
        groups.push(SYSTEM_AUTHENTICATED.to_owned());
    }
    Ok(Some(UserInfo {
        username: user,
        uid,
        groups,
        extra,
    }))
}
