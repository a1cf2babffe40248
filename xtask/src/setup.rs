//! The system packages the project needs on a Debian or Ubuntu machine, installed with apt-get
//! when `dpkg-query` says they are missing. A second run finds them and does nothing, so every
//! xtask command starts with it.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::Result;

/// A Debian package and why the project needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Package {
    /// The package name.
    pub(crate) name: &'static str,
    /// What uses it.
    pub(crate) why: &'static str,
}

const fn package(name: &'static str, why: &'static str) -> Package {
    Package { name, why }
}

/// What the tests and the main job run.
pub(crate) const BASE: &[Package] = &[
    package(
        "nftables",
        "nft: the gateway's NAT and the simulated nodes' service proxy",
    ),
    package(
        "iproute2",
        "ip: network namespaces, links, addresses and routes",
    ),
    package("iputils-ping", "ping: reachability in network tests"),
    package(
        "curl",
        "curl: the main job's requests through the demo Service",
    ),
    package("ethtool", "offload settings in data-plane tests"),
    package("procps", "ps and sysctl"),
    package("psmisc", "fuser and killall, to look at stuck tests"),
    package(
        "util-linux",
        "unshare and nsenter: namespace tests and hidden-program tests",
    ),
    package("mount", "mount: bind mounts in hidden-program tests"),
    package("bsdutils", "script: a terminal for `kubectl exec -t` tests"),
    package("iperf3", "the data-plane benchmark"),
    package("ca-certificates", "TLS to the package registries"),
];

/// What compiling the fuzz targets adds: libFuzzer is C++.
pub(crate) const FUZZ: &[Package] = &[package("g++", "libFuzzer in the fuzz targets")];

/// The package manager's programs (replaceable in tests).
pub(crate) struct Apt {
    pub(crate) dpkg_query: PathBuf,
    pub(crate) apt_get: PathBuf,
    pub(crate) root: bool,
}

impl Apt {
    fn system() -> Self {
        Self {
            dpkg_query: "dpkg-query".into(),
            apt_get: "apt-get".into(),
            root: crate::is_root(),
        }
    }
}

/// Installs whichever of `packages` is missing on this machine.
pub(crate) fn ensure(packages: &[Package]) -> Result {
    ensure_with(&Apt::system(), packages)
}

/// Installs whichever of `packages` `apt` says is missing; fails when some are missing and this
/// is not root, or when apt-get did not install them.
pub(crate) fn ensure_with(apt: &Apt, packages: &[Package]) -> Result {
    let Some(missing) = missing(apt, packages) else {
        println!(
            "xtask: no dpkg-query here, so this is not a Debian or Ubuntu machine: install \
             these yourself if they are missing: {}",
            names(packages)
        );
        return Ok(());
    };
    if missing.is_empty() {
        println!(
            "xtask: system packages present ({})",
            names(packages).replace(' ', ", ")
        );
        return Ok(());
    }
    let list = names(&missing);
    if !apt.root {
        return Err(format!(
            "missing system packages: {list} ({}); run this as root so that it installs them, \
             or install them yourself: `sudo apt-get install -y {list}`",
            missing
                .iter()
                .map(|p| format!("{}: {}", p.name, p.why))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    println!("xtask: installing missing system packages: {list}");
    let mut update = Command::new(&apt.apt_get);
    update
        .args(["update", "-qq"])
        .env("DEBIAN_FRONTEND", "noninteractive");
    crate::run(&mut update)?;
    let mut install = Command::new(&apt.apt_get);
    install
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(missing.iter().map(|p| p.name))
        .env("DEBIAN_FRONTEND", "noninteractive");
    crate::run(&mut install)?;
    match self::missing(apt, &missing) {
        Some(still) if !still.is_empty() => Err(format!(
            "apt-get ran but these packages are still not installed: {}",
            names(&still)
        )),
        _ => Ok(()),
    }
}

/// The packages `dpkg-query` does not report as installed; `None` without dpkg-query.
fn missing(apt: &Apt, packages: &[Package]) -> Option<Vec<Package>> {
    let mut missing = Vec::new();
    for package in packages {
        // `-W` fails for a package dpkg has never heard of: that one is missing too.
        let output = Command::new(&apt.dpkg_query)
            .args(["-W", "-f=${Status}", package.name])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !(output.status.success() && is_installed(&String::from_utf8_lossy(&output.stdout))) {
            missing.push(*package);
        }
    }
    Some(missing)
}

/// Whether a dpkg `Status` field ("want flag status", e.g. `install ok installed`) says the
/// package is installed; removed packages keep `deinstall ok config-files`.
fn is_installed(status: &str) -> bool {
    let words: Vec<&str> = status.split_whitespace().collect();
    words.len() == 3 && words[1] == "ok" && words[2] == "installed"
}

fn names(packages: &[Package]) -> String {
    packages
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::path::Path;

    use super::*;

    #[test]
    fn only_an_installed_status_counts() {
        assert!(is_installed("install ok installed"));
        assert!(is_installed("hold ok installed\n"));
        assert!(!is_installed("deinstall ok config-files"));
        assert!(!is_installed("install ok half-configured"));
        assert!(!is_installed("unknown ok not-installed"));
        assert!(!is_installed(""));
    }

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    /// A dpkg-query and an apt-get that keep the installed packages in a file.
    fn fake_apt(dir: &Path, installed: &[&str], root: bool) -> Apt {
        let db = dir.join("installed");
        std::fs::write(&db, installed.join("\n") + "\n").expect("db");
        let db = db.display();
        let dpkg_query = script(
            dir,
            "dpkg-query",
            &format!(
                "for p; do :; done\n\
                 grep -qx \"$p\" {db} && {{ printf 'install ok installed'; exit 0; }}\n\
                 echo \"dpkg-query: no packages found matching $p\" >&2; exit 1"
            ),
        );
        let log = dir.join("apt.log").display().to_string();
        let apt_get = script(
            dir,
            "apt-get",
            &format!(
                "echo \"$*\" >> {log}\n\
                 [ \"$1\" = install ] || exit 0\n\
                 for p; do case \"$p\" in -*|install) ;; *) echo \"$p\" >> {db};; esac; done"
            ),
        );
        Apt {
            dpkg_query,
            apt_get,
            root,
        }
    }

    const PACKAGES: &[Package] = &[package("nftables", "nft"), package("iperf3", "bench")];

    #[test]
    fn missing_packages_are_installed_once() {
        let dir = tempdir("once");
        let apt = fake_apt(&dir, &["iperf3"], true);
        ensure_with(&apt, PACKAGES).expect("installs");
        let log = std::fs::read_to_string(dir.join("apt.log")).expect("apt ran");
        assert_eq!(
            log,
            "update -qq\ninstall -y -qq --no-install-recommends nftables\n"
        );
        ensure_with(&apt, PACKAGES).expect("nothing to do");
        let again = std::fs::read_to_string(dir.join("apt.log")).expect("log");
        assert_eq!(again, log, "a second run installs nothing");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn without_root_the_missing_packages_are_named() {
        let dir = tempdir("noroot");
        let apt = fake_apt(&dir, &[], false);
        let error = ensure_with(&apt, PACKAGES).expect_err("not root");
        assert!(
            error.contains("missing system packages: nftables iperf3")
                && error.contains("sudo apt-get install -y nftables iperf3")
                && error.contains("nftables: nft"),
            "{error}"
        );
        assert!(!dir.join("apt.log").exists(), "apt-get never ran");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_package_apt_get_did_not_install_is_an_error() {
        let dir = tempdir("stuck");
        let mut apt = fake_apt(&dir, &[], true);
        apt.apt_get = script(&dir, "apt-get-noop", "exit 0");
        let error = ensure_with(&apt, PACKAGES).expect_err("still missing");
        assert!(
            error.contains("still not installed: nftables iperf3"),
            "{error}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempdir(label: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }
}
