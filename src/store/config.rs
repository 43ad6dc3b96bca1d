//! `[storage]`: where the tables live and how the writer batches.

#[allow(unused_imports)]
use std::collections::BTreeMap;
#[allow(unused_imports)]
use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    pub data_dir: PathBuf,
    /// Most rows the writer folds into one Lance commit.
    pub write_batch_max_rows: usize,
    /// Reads see commits made by other loomem processes within this many ms.
    pub read_consistency_ms: u64,
}
