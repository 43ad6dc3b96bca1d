//! Running totals of what each stage did, for `/v1/status`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

use super::StageReport;

pub struct StageStats {
    stage: &'static str,
    totals: Mutex<StageStatsSnapshot>,
}

#[derive(schemars::JsonSchema, Debug, Clone, Default, Serialize)]
pub struct StageStatsSnapshot {
    pub stage: &'static str,
    pub batches: u64,
    pub records_in: u64,
    pub records_out: u64,
    pub dropped: BTreeMap<&'static str, u64>,
    pub failed: u64,
    pub total_micros: u64,
}

impl StageStats {
    pub fn new(stage: &'static str) -> Self {
        StageStats {
            stage,
            totals: Mutex::new(StageStatsSnapshot {
                stage,
                ..Default::default()
            }),
        }
    }

    pub fn record(&self, r: &StageReport) {
        let mut t = self.totals.lock().expect("stats lock");
        t.batches += 1;
        t.records_in += r.records_in as u64;
        t.records_out += r.records_out as u64;
        t.failed += r.failed as u64;
        t.total_micros += r.micros;
        for (reason, n) in &r.dropped {
            *t.dropped.entry(reason).or_default() += *n as u64;
        }
    }

    pub fn snapshot(&self) -> StageStatsSnapshot {
        let mut s = self.totals.lock().expect("stats lock").clone();
        s.stage = self.stage;
        s
    }
}
