//! `[scheduler]`: which maintenance jobs run when, with what params.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    #[serde(default)]
    pub enabled: bool,
    /// A stream quiet this many seconds after a write is dreamed once (its
    /// memories consolidated); 0 = never. Independent of `enabled`.
    #[serde(default = "default_dream_after_idle")]
    pub dream_after_idle_secs: u64,
    /// Per job (`dream`, `decay`, `compact`, …): its cron and params.
    #[serde(default)]
    pub jobs: BTreeMap<String, JobConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// Six fields (seconds first) or seven (with years); day names
    /// (`MON-FRI`) rather than numbers.
    pub cron: String,
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
    /// The job's own parameters.
    #[serde(default)]
    pub params: toml::Table,
}

fn default_dream_after_idle() -> u64 {
    1800
}

impl Default for SchedulerConfig {
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            enabled: false,
            dream_after_idle_secs: default_dream_after_idle(),
            jobs: BTreeMap::new(),
        }
    }
}

fn enabled_by_default() -> bool {
    true
}
