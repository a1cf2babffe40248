//! The Dockerfile at the repository root builds the image `tether install` deploys: it builds
//! the `tetherd` binary of the `tetherd` package with the workspace's toolchain and lockfile,
//! runs it as the user the rendered Deployment names, and keeps build outputs out of the
//! context. (No Docker engine runs here; this checks the file against the workspace.)

use std::path::PathBuf;

use tether_api::ClusterId;
use tether_cli::manifests::{self, InstallOptions, Manifest};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The Dockerfile's instructions, with continuation lines joined and comments dropped.
fn instructions() -> Vec<(String, String)> {
    let text = read("Dockerfile").replace("\\\n", " ");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (op, rest) = l.split_once(' ').unwrap_or((l, ""));
            (
                op.to_ascii_uppercase(),
                rest.split_whitespace().collect::<Vec<_>>().join(" "),
            )
        })
        .collect()
}

fn workspace_rust_version() -> String {
    let manifest = read("Cargo.toml");
    let line = manifest
        .lines()
        .find(|l| l.starts_with("rust-version"))
        .expect("rust-version in the workspace");
    line.split('"').nth(1).expect("quoted").to_owned()
}

#[test]
fn it_builds_tetherd_with_the_workspace_toolchain_and_lockfile() {
    let ins = instructions();
    let froms: Vec<&String> = ins
        .iter()
        .filter(|(op, _)| op == "FROM")
        .map(|(_, a)| a)
        .collect();
    assert_eq!(
        froms.len(),
        2,
        "a build stage and a runtime stage: {froms:?}"
    );
    let build_image = froms[0].split_whitespace().next().expect("image");
    assert!(
        build_image.starts_with(&format!("rust:{}", workspace_rust_version())),
        "the build stage uses the workspace's rust-version {}: {build_image}",
        workspace_rust_version()
    );
    let run = ins
        .iter()
        .find(|(op, a)| op == "RUN" && a.contains("cargo build"))
        .map(|(_, a)| a.clone())
        .expect("a cargo build");
    for flag in ["--release", "--locked", "-p tetherd"] {
        assert!(run.contains(flag), "cargo build lacks {flag}: {run}");
    }
    assert!(run.contains("target/release/tetherd"), "{run}");
    // The tetherd package really has a binary called tetherd.
    let tetherd = read("crates/tetherd/Cargo.toml");
    assert!(
        tetherd.contains("name = \"tetherd\"\npath = \"src/main.rs\""),
        "{tetherd}"
    );
}

#[test]
fn the_runtime_stage_runs_tetherd_as_the_deployments_user() {
    let ins = instructions();
    let copy = ins
        .iter()
        .find(|(op, a)| op == "COPY" && a.starts_with("--from=build"))
        .map(|(_, a)| a.clone())
        .expect("a COPY from the build stage");
    assert!(copy.ends_with("/usr/local/bin/tetherd"), "{copy}");
    let entrypoint = ins
        .iter()
        .find(|(op, _)| op == "ENTRYPOINT")
        .map(|(_, a)| a.clone())
        .expect("an ENTRYPOINT");
    assert_eq!(entrypoint, r#"["/usr/local/bin/tetherd"]"#);
    let user = ins
        .iter()
        .rfind(|(op, _)| op == "USER")
        .map(|(_, a)| a.clone())
        .expect("a USER");
    assert_eq!(user, format!("{0}:{0}", manifests::RUN_AS_USER));

    // The Deployment's arguments start with the role, which the entrypoint receives.
    let rendered = manifests::render(&InstallOptions::new(ClusterId::new("c").expect("id")));
    let args = rendered
        .iter()
        .find_map(|m| match m {
            Manifest::Deployment(d) => d.spec.as_ref()?.template.spec.as_ref()?.containers[0]
                .args
                .clone(),
            _ => None,
        })
        .expect("Deployment args");
    assert_eq!(args[0], "controller");
}

#[test]
fn the_build_context_leaves_out_build_outputs() {
    let ignore = read(".dockerignore");
    for entry in ["target", ".git", "*.kubeconfig"] {
        assert!(
            ignore.lines().any(|l| l.trim() == entry),
            ".dockerignore lacks {entry}"
        );
    }
}
