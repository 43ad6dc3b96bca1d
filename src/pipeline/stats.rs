//! Running totals of what each stage did, for `/v1/status`; each batch is
//! also counted in the process's metrics.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

use super::StageReport;

pub struct StageStats {
    pipeline: String,
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
    pub fn new(pipeline: &str, stage: &'static str) -> Self {
        StageStats {
            pipeline: pipeline.to_string(),
            stage,
            totals: Mutex::new(StageStatsSnapshot {
                stage,
                ..Default::default()
            }),
        }
    }

    pub fn record(&self, r: &StageReport) {
        let m = crate::core::metrics::metrics();
        let labels = [self.pipeline.as_str(), self.stage];
        m.stage_in
            .with_label_values(&labels)
            .inc_by(r.records_in as u64);
        m.stage_out
            .with_label_values(&labels)
            .inc_by(r.records_out as u64);
        m.stage_failed
            .with_label_values(&labels)
            .inc_by(r.failed as u64);
        crate::core::metrics::observe_micros(&m.stage_seconds.with_label_values(&labels), r.micros);
        for (reason, n) in &r.dropped {
            m.stage_dropped
                .with_label_values(&[self.pipeline.as_str(), self.stage, reason])
                .inc_by(*n as u64);
        }
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

    /// Time the stage spent on a batch outside its run (its preparation),
    /// added to its total (the per-batch histogram keeps the runs alone).
    pub fn add_micros(&self, micros: u64) {
        self.totals.lock().expect("stats lock").total_micros += micros;
    }

    pub fn snapshot(&self) -> StageStatsSnapshot {
        let mut s = self.totals.lock().expect("stats lock").clone();
        s.stage = self.stage;
        s
    }
}
