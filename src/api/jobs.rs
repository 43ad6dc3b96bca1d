//! Background workers and maintenance jobs (admin only): pause and resume the
//! scheduler, list recent runs, run a job now.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::{ApiJson, ApiQuery};
use crate::app::Engine;
use crate::core::error::{Error, Result};
use crate::core::Caller;
use crate::jobs::RunView;

#[derive(schemars::JsonSchema, Serialize)]
pub struct Workers {
    paused: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'static str>,
}

pub async fn pause(State(engine): State<Arc<Engine>>, caller: Caller) -> Result<Json<Workers>> {
    caller.require_admin()?;
    engine.workers.set(true);
    Ok(Json(Workers {
        paused: true,
        message: Some("All workers paused"),
    }))
}

pub async fn resume(State(engine): State<Arc<Engine>>, caller: Caller) -> Result<Json<Workers>> {
    caller.require_admin()?;
    engine.workers.set(false);
    Ok(Json(Workers {
        paused: false,
        message: Some("All workers resumed"),
    }))
}

pub async fn status(State(engine): State<Arc<Engine>>, caller: Caller) -> Result<Json<Workers>> {
    caller.require_admin()?;
    Ok(Json(Workers {
        paused: engine.workers.get(),
        message: None,
    }))
}

/// One job of the schedule.
#[derive(schemars::JsonSchema, Serialize)]
pub struct JobEntry {
    name: &'static str,
    /// The cron expression, when the job is scheduled.
    cron: Option<String>,
    /// Scheduled and enabled (it runs only while the scheduler is on and
    /// maintenance is not paused).
    enabled: bool,
    /// The next time the schedule fires (RFC 3339).
    next_run: Option<String>,
}

#[derive(schemars::JsonSchema, Serialize)]
pub struct Schedule {
    scheduler_enabled: bool,
    paused: bool,
    jobs: Vec<JobEntry>,
}

/// `GET /admin/jobs`: every job, its schedule and next run (admin).
pub async fn schedule(State(engine): State<Arc<Engine>>, caller: Caller) -> Result<Json<Schedule>> {
    caller.require_admin()?;
    let jobs = crate::jobs::JOB_NAMES
        .iter()
        .map(|name| {
            let cfg = engine.cfg.scheduler.jobs.get(*name);
            let next_run = cfg
                .filter(|c| c.enabled)
                .and_then(|c| crate::jobs::scheduler::Scheduled::new(name, &c.cron).ok())
                .and_then(|s| s.schedule.upcoming(chrono::Utc).next())
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
            JobEntry {
                name,
                cron: cfg.map(|c| c.cron.clone()),
                enabled: cfg.is_some_and(|c| c.enabled),
                next_run,
            }
        })
        .collect();
    Ok(Json(Schedule {
        scheduler_enabled: engine.cfg.scheduler.enabled,
        paused: engine.workers.get(),
        jobs,
    }))
}

#[derive(schemars::JsonSchema, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunsQuery {
    job: Option<String>,
    limit: Option<usize>,
}

pub async fn runs(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<RunsQuery>,
) -> Result<Json<serde_json::Value>> {
    caller.require_admin()?;
    let limit = q.limit.unwrap_or(50);
    if limit == 0 || limit > 1000 {
        return Err(Error::invalid("limit", "must be between 1 and 1000"));
    }
    let filter = match q.job.as_deref() {
        Some(job) => crate::store::Filter::new().job(job),
        None => crate::store::Filter::new(),
    };
    let runs: Vec<RunView> = engine
        .store
        .job_runs(&filter, limit)
        .await?
        .into_iter()
        .map(RunView::from)
        .collect();
    Ok(Json(serde_json::json!({
        "scheduler_enabled": engine.cfg.scheduler.enabled,
        "paused": engine.workers.get(),
        "runs": runs,
    })))
}

#[derive(schemars::JsonSchema, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    #[serde(default)]
    dry_run: bool,
}

pub async fn run(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(name): Path<String>,
    ApiJson(req): ApiJson<RunRequest>,
) -> Result<Json<RunView>> {
    caller.require_admin()?;
    Ok(Json(engine.run_job(&name, req.dry_run).await?.into()))
}

#[derive(schemars::JsonSchema, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    name: Option<String>,
}

/// `POST /v1/snapshots`: tag every memory table now (default name
/// `snap-YYYYMMDD-HHMMSS`).
pub async fn snapshot_create(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<SnapshotRequest>,
) -> Result<(
    axum::http::StatusCode,
    Json<crate::service::snapshot::Snapshot>,
)> {
    caller.require_admin()?;
    let name = req.name.unwrap_or_else(|| {
        crate::service::snapshot::timestamped("snap", crate::core::model::now_micros())
    });
    let snapshot = crate::service::snapshot::create(&engine.store, &name).await?;
    Ok((axum::http::StatusCode::CREATED, Json(snapshot)))
}

pub async fn snapshot_list(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
) -> Result<Json<serde_json::Value>> {
    caller.require_admin()?;
    let snapshots = crate::service::snapshot::list(&engine.store).await?;
    Ok(Json(serde_json::json!({ "snapshots": snapshots })))
}

pub async fn snapshot_delete(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>> {
    caller.require_admin()?;
    crate::service::snapshot::delete(&engine.store, &name).await?;
    Ok(Json(serde_json::json!({ "deleted": name })))
}

pub async fn snapshot_rollback(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<crate::service::snapshot::Rollback>> {
    caller.require_admin()?;
    Ok(Json(
        crate::service::snapshot::rollback(&engine, &name).await?,
    ))
}

/// The maintenance calls whose body (`{"stream": …}`) may be empty.
macro_rules! maintenance {
    ($($handler:ident => $service:ident),* $(,)?) => {$(
        pub async fn $handler(
            State(engine): State<Arc<Engine>>,
            caller: Caller,
            ApiJson(req): ApiJson<crate::service::maintenance::ScopeRequest>,
        ) -> Result<Json<crate::service::maintenance::Report>> {
            Ok(Json(crate::service::maintenance::$service(&engine, &caller, req).await?))
        }
    )*};
}

maintenance! {
    retag_all => retag_all,
    score_all => score_all,
    reset_importance => reset_importance,
    reset_backfill => reset_backfill,
    build_graph => build_graph,
}

pub async fn extract_entities(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<crate::service::maintenance::ScopeRequest>,
) -> Result<(axum::http::StatusCode, Json<serde_json::Value>)> {
    let queued = crate::service::maintenance::extract_entities(&engine, &caller, req).await?;
    Ok((axum::http::StatusCode::ACCEPTED, Json(queued)))
}

pub async fn boost(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<crate::service::maintenance::BoostRequest>,
) -> Result<Json<serde_json::Value>> {
    Ok(Json(
        crate::service::maintenance::boost(&engine, &caller, req).await?,
    ))
}
