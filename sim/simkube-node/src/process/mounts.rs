//! A container's own mount namespace: volumes, `/etc/resolv.conf` and `/etc/hosts` bound at the
//! paths the pod asks for, invisible to the host and to other containers. Everything is
//! prepared in the agent ([`Prepared::new`]); the forked child only makes system calls
//! ([`Prepared::apply`]), so it stays async-signal-safe.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use nix::sys::stat::Mode;

/// One bind mount into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// What the container sees there (a directory or a file of the node).
    pub source: PathBuf,
    /// Where the container sees it (absolute).
    pub target: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
}

struct Step {
    path: CString,
    file: bool,
}

struct PreparedMount {
    source: CString,
    target: CString,
    read_only: bool,
    /// The target and its ancestors, outermost first, created if missing.
    steps: Vec<Step>,
}

/// Mounts ready for the forked child: every path already a C string.
pub(crate) struct Prepared {
    mounts: Vec<PreparedMount>,
    working_dir: CString,
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("path {} contains a NUL byte", path.display()),
        )
    })
}

impl Prepared {
    /// Checks `mounts` (absolute targets, existing sources) and orders them so a mount inside
    /// another comes after it.
    pub(crate) fn new(mounts: &[Mount], working_dir: &Path) -> io::Result<Self> {
        let mut ordered: Vec<&Mount> = mounts.iter().collect();
        ordered.sort_by_key(|m| m.target.components().count());
        let mut prepared = Vec::with_capacity(ordered.len());
        for mount in ordered {
            if !mount.target.is_absolute()
                || mount
                    .target
                    .components()
                    .any(|c| matches!(c, Component::ParentDir))
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "mount path {} must be absolute and may not contain '..'",
                        mount.target.display()
                    ),
                ));
            }
            let meta = std::fs::metadata(&mount.source).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("mount source {}: {e}", mount.source.display()),
                )
            })?;
            let mut steps = Vec::new();
            let mut path = PathBuf::from("/");
            let count = mount.target.components().count();
            for (i, part) in mount.target.components().enumerate().skip(1) {
                path.push(part);
                steps.push(Step {
                    path: c_path(&path)?,
                    file: i + 1 == count && !meta.is_dir(),
                });
            }
            prepared.push(PreparedMount {
                source: c_path(&mount.source)?,
                target: c_path(&mount.target)?,
                read_only: mount.read_only,
                steps,
            });
        }
        Ok(Self {
            mounts: prepared,
            working_dir: c_path(working_dir)?,
        })
    }

    /// In the forked child: a new mount namespace that receives no mount from and sends none
    /// to the host's, the binds, the read-only remounts, then the working directory (after the
    /// mounts, since it may lie inside one).
    pub(crate) fn apply(&self) -> io::Result<()> {
        nix::sched::unshare(CloneFlags::CLONE_NEWNS)?;
        // Slave rather than private: unmounts on the host (a deleted pod's netns file) still
        // reach this namespace, so it never pins them, while nothing mounted here goes back.
        nix::mount::mount(
            None::<&CStr>,
            c"/",
            None::<&CStr>,
            MsFlags::MS_REC | MsFlags::MS_SLAVE,
            None::<&CStr>,
        )?;
        for mount in &self.mounts {
            for step in &mount.steps {
                if step.file {
                    match nix::fcntl::open(
                        step.path.as_c_str(),
                        OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_CLOEXEC,
                        Mode::from_bits_truncate(0o644),
                    ) {
                        Ok(fd) => drop(fd),
                        Err(e) => return Err(e.into()),
                    }
                } else {
                    match nix::unistd::mkdir(step.path.as_c_str(), Mode::from_bits_truncate(0o755))
                    {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            nix::mount::mount(
                Some(mount.source.as_c_str()),
                mount.target.as_c_str(),
                None::<&CStr>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&CStr>,
            )?;
        }
        for mount in self.mounts.iter().filter(|m| m.read_only) {
            nix::mount::mount(
                None::<&CStr>,
                mount.target.as_c_str(),
                None::<&CStr>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                None::<&CStr>,
            )?;
        }
        nix::unistd::chdir(self.working_dir.as_c_str())?;
        Ok(())
    }

    /// Whether there is anything to mount.
    pub(crate) fn is_empty(&self) -> bool {
        self.mounts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(source: &Path, target: &str) -> Mount {
        Mount {
            source: source.to_owned(),
            target: PathBuf::from(target),
            read_only: false,
        }
    }

    #[test]
    fn prepares_nested_mounts_outermost_first_with_their_steps() {
        let tmp = tempfile::tempdir().expect("tmp");
        let file = tmp.path().join("resolv");
        std::fs::write(&file, "nameserver 10.96.0.10\n").expect("file");
        let mounts = [
            mount(tmp.path(), "/data/inner/deeper"),
            mount(&file, "/etc/resolv.conf"),
            mount(tmp.path(), "/data"),
        ];
        let prepared = Prepared::new(&mounts, Path::new("/data")).expect("prepared");
        let shown: Vec<String> = prepared
            .mounts
            .iter()
            .map(|m| {
                let steps: Vec<String> = m
                    .steps
                    .iter()
                    .map(|s| {
                        format!(
                            "{}{}",
                            s.path.to_string_lossy(),
                            if s.file { "(file)" } else { "" }
                        )
                    })
                    .collect();
                format!("{} <- {}", m.target.to_string_lossy(), steps.join(" "))
            })
            .collect();
        assert_eq!(
            shown,
            [
                "/data <- /data",
                "/etc/resolv.conf <- /etc /etc/resolv.conf(file)",
                "/data/inner/deeper <- /data /data/inner /data/inner/deeper",
            ]
        );
    }

    #[test]
    fn rejects_relative_or_escaping_targets_and_missing_sources() {
        let tmp = tempfile::tempdir().expect("tmp");
        for target in ["relative/path", "/a/../etc"] {
            let err = Prepared::new(&[mount(tmp.path(), target)], Path::new("/"))
                .err()
                .expect("rejected");
            assert_eq!(
                err.to_string(),
                format!("mount path {target} must be absolute and may not contain '..'")
            );
        }
        let missing = tmp.path().join("gone");
        let err = Prepared::new(&[mount(&missing, "/x")], Path::new("/"))
            .err()
            .expect("rejected");
        assert!(
            err.to_string()
                .starts_with(&format!("mount source {}:", missing.display())),
            "{err}"
        );
    }
}
