//! The nftables part of a plan: one table we own entirely, rendered as one atomic `nft -f -`
//! script, and a fingerprint that the applier stores in the table comment to detect drift.

use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

/// Prefix of the table comment that carries the fingerprint: `tether:<fingerprint>`.
pub const FINGERPRINT_COMMENT_PREFIX: &str = "tether:";

/// Our nftables table (family `ip`) with all its chains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ruleset {
    /// Table name.
    pub table: String,
    /// Base chains, in render order.
    pub chains: Vec<Chain>,
}

/// A base chain attached to a netfilter hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    /// Chain name.
    pub name: String,
    /// Chain type.
    pub kind: ChainKind,
    /// Netfilter hook.
    pub hook: Hook,
    /// Hook priority.
    pub priority: Priority,
    /// Rules, in order.
    pub rules: Vec<NftRule>,
}

/// nftables chain type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ChainKind {
    /// `type filter`.
    Filter,
    /// `type nat`.
    Nat,
}

/// Netfilter hook of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Hook {
    /// `hook prerouting`.
    Prerouting,
    /// `hook forward`.
    Forward,
    /// `hook postrouting`.
    Postrouting,
}

/// Named hook priorities (nft keywords), in the order netfilter runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Priority {
    /// `raw` (-300): before connection tracking, so a conntrack zone can still be chosen.
    Raw,
    /// `mangle` (-150): before destination NAT, so marks see the original destination.
    Mangle,
    /// `dstnat` (-100).
    Dstnat,
    /// `filter` (0).
    Filter,
    /// `srcnat` (100).
    Srcnat,
}

/// One nftables rule: match expressions and statements in nft syntax, plus an optional comment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NftRule {
    /// The rule body, e.g. `iifname "tether0" ct mark set ...`.
    pub body: String,
    /// A comment saying why the rule exists (rendered as `comment "..."`).
    pub comment: Option<String>,
}

impl NftRule {
    /// A rule with a comment.
    pub fn new(body: impl Into<String>, comment: impl AsRef<str>) -> Self {
        Self {
            body: body.into(),
            comment: Some(comment.as_ref().to_owned()),
        }
    }
}

impl fmt::Display for ChainKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Filter => "filter",
            Self::Nat => "nat",
        })
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Prerouting => "prerouting",
            Self::Forward => "forward",
            Self::Postrouting => "postrouting",
        })
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Raw => "raw",
            Self::Mangle => "mangle",
            Self::Dstnat => "dstnat",
            Self::Filter => "filter",
            Self::Srcnat => "srcnat",
        })
    }
}

impl fmt::Display for NftRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.body)?;
        if let Some(comment) = &self.comment {
            write!(f, " comment \"{comment}\"")?;
        }
        Ok(())
    }
}

impl Ruleset {
    /// An empty table.
    pub fn empty(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            chains: Vec::new(),
        }
    }

    /// The full atomic script for `nft -f -`: create the table if missing, delete it, and add it
    /// again with every chain and rule. nft runs the file as one transaction, so the kernel
    /// never sees a half-written table, and nothing of an older version survives.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let table = &self.table;
        // Writing to a String cannot fail.
        let _ = writeln!(out, "table ip {table}");
        let _ = writeln!(out, "delete table ip {table}");
        let _ = writeln!(out, "table ip {table} {{");
        let _ = writeln!(out, "\tcomment \"{}\"", self.comment());
        out.push_str(&self.render_chains());
        out.push_str("}\n");
        out
    }

    /// A stable hash (16 hex digits) of everything the table contains. Equal fingerprints
    /// mean equal rulesets; the applier compares it with the comment of the live table.
    pub fn fingerprint(&self) -> String {
        let mut hasher = Fnv1a64::new();
        hasher.write(self.table.as_bytes());
        hasher.write(b"\n");
        hasher.write(self.render_chains().as_bytes());
        format!("{:016x}", hasher.finish())
    }

    /// The table comment that carries the fingerprint: `tether:<fingerprint>`.
    pub fn comment(&self) -> String {
        format!("{FINGERPRINT_COMMENT_PREFIX}{}", self.fingerprint())
    }

    /// The script that removes our table, for teardown (fails if the table is absent; the
    /// applier treats "no such table" as done).
    pub fn render_delete(table: &str) -> String {
        format!("delete table ip {table}\n")
    }

    fn render_chains(&self) -> String {
        let mut out = String::new();
        for chain in &self.chains {
            let _ = writeln!(out, "\tchain {} {{", chain.name);
            let _ = writeln!(
                out,
                "\t\ttype {} hook {} priority {}; policy accept;",
                chain.kind, chain.hook, chain.priority
            );
            for rule in &chain.rules {
                let _ = writeln!(out, "\t\t{rule}");
            }
            out.push_str("\t}\n");
        }
        out
    }
}

/// The fingerprint inside a table comment written by [`Ruleset::render`], if it is one of ours.
pub fn fingerprint_from_comment(comment: &str) -> Option<&str> {
    comment.strip_prefix(FINGERPRINT_COMMENT_PREFIX)
}

/// 64-bit FNV-1a: tiny, dependency-free and stable across Rust versions and platforms, which
/// `std`'s hashers do not promise. Detects drift; it is not a security boundary.
struct Fnv1a64(u64);

impl Fnv1a64 {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
