//! nftables through the `nft` binary, the one external command this crate runs.
//!
//! Why a command and not a library: prefix (netmap) NAT (`dnat ip prefix to ip daddr map {…}`),
//! which remapping needs, cannot be expressed by any Rust nftables crate (`nftables` lacks the
//! `netmap` flag and cannot even parse such a ruleset; `rustables` has no NAT flags), and the
//! netlink encoding of nft expressions is not something to hand-roll. `nft -f -` also gives the
//! property we need most: a whole script is one kernel transaction, so our table is replaced
//! atomically or not at all.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tether_netplan::{Ruleset, fingerprint_from_comment};
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

use crate::error::KernelError;

/// What `nft list table` showed about our table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableListing {
    /// The fingerprint in the table comment, or `""` when the comment is missing or not ours.
    pub(crate) fingerprint: String,
    /// The stateless listing (`nft -s`), compared against what we applied to spot edits made
    /// behind our back that leave the comment untouched.
    pub(crate) text: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Nft {
    program: PathBuf,
}

impl Nft {
    pub(crate) fn new(program: &Path) -> Self {
        Self {
            program: program.to_owned(),
        }
    }

    /// Replaces our table with `ruleset` in one transaction.
    pub(crate) async fn apply(&self, ruleset: &Ruleset) -> Result<(), KernelError> {
        self.run(&["-f", "-"], Some(&ruleset.render()), &ruleset.table)
            .await
            .map(drop)
    }

    /// Deletes our table; an absent table counts as deleted.
    pub(crate) async fn delete(&self, table: &str) -> Result<(), KernelError> {
        match self
            .run(&["-f", "-"], Some(&Ruleset::render_delete(table)), table)
            .await
        {
            Ok(_) => Ok(()),
            Err(KernelError::Nft { stderr, .. }) if is_missing_table(&stderr) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Lists our table, or `None` if it does not exist.
    pub(crate) async fn list(&self, table: &str) -> Result<Option<TableListing>, KernelError> {
        match self
            .run(&["-s", "list", "table", "ip", table], None, table)
            .await
        {
            Ok(text) => Ok(Some(TableListing {
                fingerprint: table_fingerprint(&text),
                text,
            })),
            Err(KernelError::Nft { stderr, .. }) if is_missing_table(&stderr) => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn run(
        &self,
        args: &[&str],
        stdin: Option<&str>,
        table: &str,
    ) -> Result<String, KernelError> {
        let command_line = format!("{} {}", self.program.display(), args.join(" "));
        // Spawned from the calling thread, so the child inherits that thread's network
        // namespace (which is what a test running on a namespaced thread relies on).
        let mut child = Command::new(&self.program)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| KernelError::NftSpawn {
                command: command_line.clone(),
                source,
            })?;
        if let Some(script) = stdin {
            let mut pipe = child.stdin.take().expect("invariant: stdin was piped");
            // A write error means nft exited early; its stderr below says why.
            let _ = pipe.write_all(script.as_bytes()).await;
            drop(pipe);
        }
        let output = child
            .wait_with_output()
            .await
            .map_err(|source| KernelError::NftSpawn {
                command: command_line.clone(),
                source,
            })?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(KernelError::Nft {
                command: command_line,
                table: table.to_owned(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            })
        }
    }
}

fn is_missing_table(stderr: &str) -> bool {
    stderr.contains("No such file or directory")
}

/// The fingerprint from the table-level `comment "…"` line (the one before the first chain;
/// rule comments sit at the end of rule lines).
fn table_fingerprint(listing: &str) -> String {
    listing
        .lines()
        .map(str::trim)
        .take_while(|line| !line.starts_with("chain "))
        .find_map(|line| line.strip_prefix("comment \"")?.strip_suffix('"'))
        .and_then(fingerprint_from_comment)
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_table_comment_not_rule_comments() {
        let listing = concat!(
            "table ip tether {\n",
            "\tcomment \"tether:00ff00ff00ff00ff\"\n",
            "\tchain prerouting {\n",
            "\t\ttype filter hook prerouting priority mangle; policy accept;\n",
            "\t\tiifname \"t\" counter drop comment \"tether:bogus\"\n",
            "\t}\n",
            "}\n",
        );
        assert_eq!(table_fingerprint(listing), "00ff00ff00ff00ff");
        let foreign = "table ip tether {\n\tcomment \"someone else\"\n}\n";
        assert_eq!(table_fingerprint(foreign), "");
        let rule_only =
            "table ip tether {\n\tchain c {\n\t\tcounter comment \"tether:abc\"\n\t}\n}\n";
        assert_eq!(table_fingerprint(rule_only), "");
    }
}
