//! `[storage]`: where the tables live, how the writer batches, and how the
//! tables are kept in shape.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::maintain::Maintenance;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// A directory, or `s3://bucket/prefix` (see [`super::Location`]).
    pub data_dir: PathBuf,
    /// Settings of the bucket `data_dir` names, by object_store's names
    /// (`aws_endpoint`, `aws_region`, `aws_allow_http`, …); over `AWS_*`.
    #[serde(default, deserialize_with = "scalar_map")]
    pub object_store: BTreeMap<String, String>,
    /// Most rows the writer folds into one Lance commit.
    pub write_batch_max_rows: usize,
    /// Reads see commits made by other loomem processes within this many ms.
    pub read_consistency_ms: u64,
    /// The chunk writer merges small fragments after this many commits (0 = never).
    #[serde(default = "default_compact_every_commits")]
    pub compact_every_commits: usize,
    /// A routine merge builds fragments of up to this many rows.
    #[serde(default = "default_target_rows")]
    pub target_rows_per_fragment: usize,
    /// The other tables are checked this often, in seconds (0 = never).
    #[serde(default = "default_check_secs")]
    pub maintenance_check_secs: u64,
    /// A table with more fragments than this is merged at the next check.
    #[serde(default = "default_max_fragments")]
    pub max_fragments: usize,
    /// Memory for the hot vector index, in MiB (0 = vector reads go to Lance).
    #[serde(default = "default_hot_index_mb")]
    pub hot_index_mb: usize,
    /// A bulk delete first snapshots every table as `pre-delete-…`; the
    /// newest this many of those are kept.
    #[serde(default = "default_pre_delete_snapshots")]
    pub pre_delete_snapshots: usize,
}

/// A table of settings whose values may be written as strings, booleans or
/// numbers (`aws_allow_http = true`, or `LOOMEM_…=true`), kept as text.
fn scalar_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Text(String),
        Flag(bool),
        Int(i64),
        Float(f64),
    }
    let raw = BTreeMap::<String, Scalar>::deserialize(d)?;
    Ok(raw
        .into_iter()
        .map(|(k, v)| {
            let text = match v {
                Scalar::Text(s) => s,
                Scalar::Flag(b) => b.to_string(),
                Scalar::Int(i) => i.to_string(),
                Scalar::Float(f) => f.to_string(),
            };
            (k, text)
        })
        .collect())
}

fn default_pre_delete_snapshots() -> usize {
    20
}

fn default_hot_index_mb() -> usize {
    super::hot::DEFAULT_BUDGET >> 20
}

fn default_compact_every_commits() -> usize {
    Maintenance::default().compact_every_commits
}
fn default_target_rows() -> usize {
    Maintenance::default().target_rows_per_fragment
}
fn default_check_secs() -> u64 {
    Maintenance::default().check_every.as_secs()
}
fn default_max_fragments() -> usize {
    Maintenance::default().max_fragments
}

impl StorageConfig {
    /// The hot index's budget in bytes.
    pub fn hot_index_bytes(&self) -> usize {
        self.hot_index_mb.saturating_mul(1 << 20)
    }

    /// The routine maintenance these settings ask for.
    pub fn maintenance(&self) -> Maintenance {
        Maintenance {
            compact_every_commits: self.compact_every_commits,
            target_rows_per_fragment: self.target_rows_per_fragment,
            check_every: Duration::from_secs(self.maintenance_check_secs),
            max_fragments: self.max_fragments,
        }
    }
}
