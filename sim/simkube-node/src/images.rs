//! The image table: how a container image reference becomes a local program (pure).
//!
//! Simulated nodes pull nothing. An image is either one of the built-in workloads (served by the
//! node binary itself, re-executed as `<exe> __builtin <name>`) or an entry of the table, loaded
//! from a YAML file, mapping a reference to an entrypoint and default arguments, with the
//! semantics of an image's ENTRYPOINT and CMD: a container's `command` replaces the entrypoint,
//! its `args` replace the default arguments.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The registry prefix of the built-in workloads (`simkube.dev/echo:any-tag`).
pub const BUILTIN_REGISTRY: &str = "simkube.dev";

/// Names of the built-in workloads.
pub const BUILTINS: &[&str] = &["echo", "sleeper", "traffic", "apicheck"];

/// The argument that makes the node binary run a built-in workload instead of the agent.
pub const BUILTIN_ARG: &str = "__builtin";

/// Why an image could not be resolved, or the table could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// No entry and no built-in matches.
    #[error(
        "image {image:?} is not known to this node: map it to a local executable with an entry \
         `{{image: {repo}, entrypoint: [/path/to/program]}}` in the node's image table \
         (--images FILE), or use a built-in image ({builtins})"
    )]
    Unknown {
        /// The reference as the pod spelled it.
        image: String,
        /// Its repository without tag, for the suggested entry.
        repo: String,
        /// The built-in references.
        builtins: String,
    },
    /// Neither the container nor the image says what to run.
    #[error("image {0:?} has no entrypoint and the container sets no command")]
    NothingToRun(String),
    /// The table file could not be read.
    #[error("cannot read image table {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The table file is not valid.
    #[error("invalid image table {origin}: {message}")]
    Parse {
        /// Where it came from.
        origin: String,
        /// What is wrong.
        message: String,
    },
}

/// One entry of the table file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageEntry {
    /// The reference it serves; without a tag it serves every tag.
    pub image: String,
    /// The program and its leading arguments (ENTRYPOINT).
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// Default arguments (CMD).
    #[serde(default)]
    pub cmd: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableFile {
    #[serde(default)]
    images: Vec<ImageEntry>,
}

/// A parsed image reference: repository (normalized like Docker Hub's) and tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// Repository, without `docker.io/` or `library/`.
    pub repo: String,
    /// Tag, if the reference had one (a digest counts as a tag).
    pub tag: Option<String>,
}

impl ImageRef {
    /// Parses `reference` (`busybox`, `docker.io/library/busybox:1.36`, `reg:5000/a/b@sha256:..`).
    pub fn parse(reference: &str) -> Self {
        let reference = reference.trim();
        let (name, tag) = if let Some((name, digest)) = reference.split_once('@') {
            (name, Some(digest.to_owned()))
        } else {
            // A colon after the last slash is a tag; before it, a registry port.
            let last_slash = reference.rfind('/').map_or(0, |i| i + 1);
            match reference[last_slash..].rfind(':') {
                Some(i) => (
                    &reference[..last_slash + i],
                    Some(reference[last_slash + i + 1..].to_owned()),
                ),
                None => (reference, None),
            }
        };
        let name = name
            .strip_prefix("docker.io/")
            .or_else(|| name.strip_prefix("index.docker.io/"))
            .unwrap_or(name);
        let name = name.strip_prefix("library/").unwrap_or(name);
        Self {
            repo: name.to_owned(),
            tag,
        }
    }
}

/// What to run for a container, before its `command`/`args` are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedImage {
    /// ENTRYPOINT.
    pub entrypoint: Vec<String>,
    /// CMD.
    pub cmd: Vec<String>,
}

impl ResolvedImage {
    /// The final argv given the container's `command` and `args` (Kubernetes semantics).
    pub fn argv(
        &self,
        image: &str,
        command: Option<&[String]>,
        args: Option<&[String]>,
    ) -> Result<Vec<String>, ImageError> {
        let command = command.filter(|c| !c.is_empty());
        let mut argv = match command {
            Some(c) => c.to_vec(),
            None => self.entrypoint.clone(),
        };
        match args {
            Some(a) if !a.is_empty() => argv.extend_from_slice(a),
            _ if command.is_none() => argv.extend_from_slice(&self.cmd),
            _ => {}
        }
        if argv.is_empty() {
            return Err(ImageError::NothingToRun(image.to_owned()));
        }
        Ok(argv)
    }
}

/// Maps image references to local programs.
#[derive(Debug, Clone)]
pub struct ImageTable {
    entries: Vec<ImageEntry>,
    builtin_exe: PathBuf,
}

impl ImageTable {
    /// A table with only the built-ins, served by `builtin_exe __builtin <name>`.
    pub fn new(builtin_exe: impl Into<PathBuf>) -> Self {
        Self {
            entries: Vec::new(),
            builtin_exe: builtin_exe.into(),
        }
    }

    /// Adds the entries of a YAML document (`images: [{image, entrypoint, cmd}]`).
    pub fn with_yaml(mut self, yaml: &str, origin: &str) -> Result<Self, ImageError> {
        let file: TableFile = serde_yaml::from_str(yaml).map_err(|e| ImageError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        for (i, entry) in file.images.iter().enumerate() {
            if entry.image.trim().is_empty() {
                return Err(ImageError::Parse {
                    origin: origin.to_owned(),
                    message: format!("images[{i}].image is empty"),
                });
            }
        }
        self.entries.extend(file.images);
        Ok(self)
    }

    /// Adds the entries of a YAML file.
    pub fn with_file(self, path: &Path) -> Result<Self, ImageError> {
        let text = std::fs::read_to_string(path).map_err(|source| ImageError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.with_yaml(&text, &path.display().to_string())
    }

    /// Adds one entry.
    pub fn with_entry(mut self, entry: ImageEntry) -> Self {
        self.entries.push(entry);
        self
    }

    /// Resolves `reference`: table entries first (an exact tag beats a tagless entry), then the
    /// built-ins.
    pub fn resolve(&self, reference: &str) -> Result<ResolvedImage, ImageError> {
        let wanted = ImageRef::parse(reference);
        let mut tagless = None;
        for entry in &self.entries {
            let have = ImageRef::parse(&entry.image);
            if have.repo != wanted.repo {
                continue;
            }
            match &have.tag {
                Some(tag) if Some(tag) == wanted.tag.as_ref() => return Ok(resolved(entry)),
                None if tagless.is_none() => tagless = Some(entry),
                _ => {}
            }
        }
        if let Some(entry) = tagless {
            return Ok(resolved(entry));
        }
        if let Some(name) = wanted
            .repo
            .strip_prefix(BUILTIN_REGISTRY)
            .and_then(|r| r.strip_prefix('/'))
            .filter(|name| BUILTINS.contains(name))
        {
            return Ok(ResolvedImage {
                entrypoint: vec![
                    self.builtin_exe.display().to_string(),
                    BUILTIN_ARG.to_owned(),
                    name.to_owned(),
                ],
                cmd: Vec::new(),
            });
        }
        Err(ImageError::Unknown {
            image: reference.to_owned(),
            repo: wanted.repo,
            builtins: BUILTINS
                .iter()
                .map(|b| format!("{BUILTIN_REGISTRY}/{b}"))
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

fn resolved(entry: &ImageEntry) -> ResolvedImage {
    ResolvedImage {
        entrypoint: entry.entrypoint.clone(),
        cmd: entry.cmd.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> ImageTable {
        ImageTable::new("/opt/node")
            .with_yaml(
                "images:\n\
                 - image: busybox\n  cmd: [sh]\n\
                 - image: busybox:1.36\n  entrypoint: [/bin/busybox136]\n\
                 - image: reg.local:5000/team/app\n  entrypoint: [/usr/bin/app, --serve]\n",
                "test",
            )
            .expect("valid table")
    }

    #[test]
    fn references_normalize() {
        let cases = [
            "busybox",
            "busybox:1.36",
            "docker.io/library/busybox:latest",
            "reg.local:5000/team/app",
            "reg.local:5000/team/app:v2",
            "app@sha256:abcd",
        ];
        let got: Vec<_> = cases
            .iter()
            .map(|c| {
                let r = ImageRef::parse(c);
                format!("{c} => {} {:?}", r.repo, r.tag)
            })
            .collect();
        expect_test::expect![[r#"
            [
                "busybox => busybox None",
                "busybox:1.36 => busybox Some(\"1.36\")",
                "docker.io/library/busybox:latest => busybox Some(\"latest\")",
                "reg.local:5000/team/app => reg.local:5000/team/app None",
                "reg.local:5000/team/app:v2 => reg.local:5000/team/app Some(\"v2\")",
                "app@sha256:abcd => app Some(\"sha256:abcd\")",
            ]
        "#]]
        .assert_debug_eq(&got);
    }

    #[test]
    fn exact_tags_win_then_tagless_then_builtins() {
        let t = table();
        assert_eq!(
            t.resolve("busybox:1.36").expect("known").entrypoint,
            ["/bin/busybox136"]
        );
        assert_eq!(
            t.resolve("docker.io/busybox:1.35").expect("known").cmd,
            ["sh"]
        );
        assert_eq!(
            t.resolve("reg.local:5000/team/app:v9")
                .expect("known")
                .entrypoint,
            ["/usr/bin/app", "--serve"]
        );
        assert_eq!(
            t.resolve("simkube.dev/echo:v1")
                .expect("builtin")
                .entrypoint,
            ["/opt/node", "__builtin", "echo"]
        );
        assert!(t.resolve("simkube.dev/nope").is_err());
    }

    #[test]
    fn unknown_image_says_how_to_map_it() {
        let err = table().resolve("nginx:1.27").expect_err("unknown");
        expect_test::expect![[r#"image "nginx:1.27" is not known to this node: map it to a local executable with an entry `{image: nginx, entrypoint: [/path/to/program]}` in the node's image table (--images FILE), or use a built-in image (simkube.dev/echo, simkube.dev/sleeper, simkube.dev/traffic, simkube.dev/apicheck)"#]]
        .assert_eq(&err.to_string());
    }

    #[test]
    fn command_and_args_follow_entrypoint_and_cmd_semantics() {
        let img = ResolvedImage {
            entrypoint: vec!["/ep".into()],
            cmd: vec!["default".into()],
        };
        let s = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let argv = |c: Option<&[String]>, a: Option<&[String]>| img.argv("i", c, a).expect("runs");
        assert_eq!(argv(None, None), s(&["/ep", "default"]));
        assert_eq!(argv(None, Some(&s(&["x"]))), s(&["/ep", "x"]));
        assert_eq!(argv(Some(&s(&["/c"])), None), s(&["/c"]));
        assert_eq!(argv(Some(&s(&["/c"])), Some(&s(&["y"]))), s(&["/c", "y"]));
        let empty = ResolvedImage {
            entrypoint: vec![],
            cmd: vec![],
        };
        assert!(empty.argv("i", None, None).is_err());
    }

    #[test]
    fn bad_tables_are_rejected_with_the_origin() {
        let err = ImageTable::new("/x")
            .with_yaml("images:\n- image: ''\n", "f.yaml")
            .expect_err("empty image");
        assert_eq!(
            err.to_string(),
            "invalid image table f.yaml: images[0].image is empty"
        );
        assert!(
            ImageTable::new("/x")
                .with_yaml("images:\n- imge: a\n", "f")
                .is_err()
        );
    }
}
