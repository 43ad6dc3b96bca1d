//! The `job_runs` table's row: one run of a maintenance job.

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
