//! `[pipeline]`: where the pipeline definitions live.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Directory of pipeline definitions (`store.toml`, …), relative to the config file.
    pub dir: PathBuf,
}
