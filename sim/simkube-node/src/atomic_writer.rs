//! Writes an API-data volume the way the kubelet's atomic writer does, so a container never
//! sees half an update: the files live in a `..<timestamp>` directory, `..data` points at it,
//! and each user-visible top-level name is a symlink through `..data`. An update writes a new
//! timestamped directory and swaps `..data` with one `rename`.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::volumes::File;

/// The symlink naming the current payload directory.
pub const DATA_LINK: &str = "..data";
const DATA_TMP_LINK: &str = "..data_tmp";

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Makes `dir` hold exactly `files`; returns whether anything changed. Nothing is rewritten
/// when the payload is the same, so mounted files keep their inode.
pub fn write(dir: &Path, files: &[File]) -> io::Result<bool> {
    std::fs::create_dir_all(dir)?;
    let current = std::fs::read_link(dir.join(DATA_LINK)).ok();
    if let Some(current) = &current
        && same_payload(&dir.join(current), files)?
    {
        return Ok(false);
    }
    let stamp = jiff::Timestamp::now().strftime("%Y_%m_%d_%H_%M_%S.%f");
    let name = format!("..{stamp}{}", SEQ.fetch_add(1, Ordering::Relaxed));
    let payload = dir.join(&name);
    std::fs::create_dir(&payload)?;
    std::fs::set_permissions(&payload, std::fs::Permissions::from_mode(0o755))?;
    for file in files {
        let path = payload.join(&file.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, &file.content)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(file.mode))?;
    }
    // The swap: a fresh link renamed over the old one is atomic for readers.
    let tmp = dir.join(DATA_TMP_LINK);
    let _ = std::fs::remove_file(&tmp);
    symlink(&name, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA_LINK))?;
    // User-visible names: one link per top-level entry, through `..data`.
    let wanted: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.path.split('/').next().map(str::to_owned))
        .collect();
    for top in &wanted {
        let link = dir.join(top);
        let target = format!("{DATA_LINK}/{top}");
        if std::fs::read_link(&link).ok().as_deref() != Some(Path::new(&target)) {
            let tmp = dir.join(format!("..{top}.tmp"));
            let _ = std::fs::remove_file(&tmp);
            symlink(&target, &tmp)?;
            std::fs::rename(&tmp, &link)?;
        }
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let entry_name = entry.file_name().to_string_lossy().into_owned();
        if entry_name.starts_with("..") {
            // Old payloads go once nothing points at them.
            if entry_name != DATA_LINK && entry_name != name && entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(entry.path())?;
            }
        } else if !wanted.contains(&entry_name) && entry.file_type()?.is_symlink() {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(true)
}

fn same_payload(payload: &Path, files: &[File]) -> io::Result<bool> {
    let mut count = 0usize;
    for file in files {
        let path = payload.join(&file.path);
        match std::fs::read(&path) {
            Ok(content) if content == file.content => {}
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        }
        if std::fs::metadata(&path)?.permissions().mode() & 0o777 != file.mode {
            return Ok(false);
        }
        count += 1;
    }
    Ok(count_files(payload)? == count)
}

fn count_files(dir: &Path) -> io::Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            n += count_files(&entry.path())?;
        } else {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, content: &str) -> File {
        File {
            path: path.into(),
            content: content.as_bytes().to_vec(),
            mode: 0o644,
        }
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| {
                let e = e.expect("entry");
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("..") && name != DATA_LINK {
                    "..<stamp>".to_owned()
                } else {
                    name
                }
            })
            .collect();
        names.sort();
        names
    }

    #[test]
    fn writes_swaps_and_cleans_up() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("vol");
        assert!(write(&dir, &[file("a", "1"), file("sub/b", "2")]).expect("write"));
        assert_eq!(std::fs::read_to_string(dir.join("a")).expect("a"), "1");
        assert_eq!(std::fs::read_to_string(dir.join("sub/b")).expect("b"), "2");
        assert_eq!(listing(&dir), ["..<stamp>", "..data", "a", "sub"]);
        assert!(!write(&dir, &[file("a", "1"), file("sub/b", "2")]).expect("same"));
        let before = std::fs::read_link(dir.join(DATA_LINK)).expect("link");
        assert!(write(&dir, &[file("a", "changed")]).expect("update"));
        let after = std::fs::read_link(dir.join(DATA_LINK)).expect("link");
        assert_ne!(before, after);
        assert_eq!(
            std::fs::read_to_string(dir.join("a")).expect("a"),
            "changed"
        );
        assert!(!dir.join("sub").exists(), "a removed key disappears");
        assert_eq!(listing(&dir), ["..<stamp>", "..data", "a"]);
        let mut mode_change = file("a", "changed");
        mode_change.mode = 0o400;
        assert!(write(&dir, &[mode_change]).expect("mode"));
        let mode = std::fs::metadata(dir.join("a"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o400);
    }
}
