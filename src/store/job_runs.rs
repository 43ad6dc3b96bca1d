//! The `job_runs` table: one row per run of a maintenance job.

use arrow_array::RecordBatch;
use futures::TryStreamExt;
use lancedb::query::{ExecutableQuery, QueryBase};

use super::{Filter, Result};

use crate::core::model::Micros;

/// One run of a job, as the `job_runs` table keeps it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobRun {
    pub id: String,
    pub job: String,
    /// `schedule`, `catch_up` or `manual`.
    pub trigger: String,
    pub started_at: Micros,
    pub finished_at: Micros,
    /// `succeeded`, `failed` or `skipped`.
    pub status: String,
    /// The job's report (JSON text).
    pub report: Option<String>,
    pub error: Option<String>,
    pub dry_run: bool,
}

pub fn job_run_schema() -> arrow_schema::SchemaRef {
    use arrow_schema::{DataType, Field, Schema, TimeUnit};
    let ts = || DataType::Timestamp(TimeUnit::Microsecond, None);
    std::sync::Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("job", DataType::Utf8, false),
        Field::new("trigger", DataType::Utf8, false),
        Field::new("started_at", ts(), false),
        Field::new("finished_at", ts(), false),
        Field::new("status", DataType::Utf8, false),
        Field::new("report", DataType::Utf8, true),
        Field::new("error", DataType::Utf8, true),
        Field::new("dry_run", DataType::Boolean, false),
    ]))
}

impl super::Store {
    /// Record one run of a scheduled or manual job.
    pub async fn add_job_run(&self, run: &JobRun) -> Result<()> {
        let batch =
            crate::store::graph::rows_to_batch(job_run_schema(), std::slice::from_ref(run))?;
        self.job_runs.add(batch).execute().await?;
        Ok(())
    }

    /// Job runs matching a filter, newest first, at most `limit`.
    pub async fn job_runs(&self, filter: &Filter, limit: usize) -> Result<Vec<JobRun>> {
        let mut q = self.job_runs.query();
        if let Some(f) = filter.sql() {
            q = q.only_if(f);
        }
        let batches: Vec<RecordBatch> = q.execute().await?.try_collect().await?;
        let mut runs = Vec::new();
        for b in &batches {
            let c = crate::core::model::Columns::new(b);
            for r in 0..b.num_rows() {
                runs.push(JobRun {
                    id: c.str("id", r).unwrap_or_default(),
                    job: c.str("job", r).unwrap_or_default(),
                    trigger: c.str("trigger", r).unwrap_or_default(),
                    started_at: c.time("started_at", r).unwrap_or(0),
                    finished_at: c.time("finished_at", r).unwrap_or(0),
                    status: c.str("status", r).unwrap_or_default(),
                    report: c.str("report", r),
                    error: c.str("error", r),
                    dry_run: c.bool("dry_run", r).unwrap_or(false),
                });
            }
        }
        runs.sort_by(|a, b| b.started_at.cmp(&a.started_at).then(a.id.cmp(&b.id)));
        runs.truncate(limit);
        Ok(runs)
    }
}
