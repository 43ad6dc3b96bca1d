//! `snapshot`: tag every memory table's current version as
//! `<prefix>-YYYYMMDD-HHMMSS`, then drop the oldest snapshots of that prefix
//! beyond `keep`. Snapshots with other names (taken by hand) are never
//! dropped here.
//!
//! Params: `keep` (7), `prefix` ("auto").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{JobContext, JobReport};
use crate::core::error::{Error, Result};
use crate::service::snapshot;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    #[serde(default = "default_keep")]
    keep: i64,
    #[serde(default = "default_prefix")]
    prefix: String,
}

fn default_keep() -> i64 {
    7
}

fn default_prefix() -> String {
    "auto".into()
}

#[derive(Debug, Serialize)]
struct Report {
    created: String,
    /// The tagged version of each table (absent on a dry run).
    #[serde(skip_serializing_if = "Option::is_none")]
    versions: Option<BTreeMap<String, u64>>,
    dropped: Vec<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    dry_run: bool,
}

pub async fn run_once(ctx: &JobContext) -> Result<JobReport> {
    let p: Params = super::params(ctx, "snapshot")?;
    let keep = p.keep;
    if keep < 1 {
        return Err(Error::invalid(
            "scheduler.jobs.snapshot.params.keep",
            "must be at least 1",
        ));
    }
    let store = &ctx.services.store;
    if ctx.dry_run {
        let (name, dropped) = snapshot::plan_rotating(store, &p.prefix, keep as usize).await?;
        return super::report(&Report {
            created: name,
            versions: None,
            dropped,
            dry_run: true,
        });
    }
    let (created, dropped) = snapshot::create_rotating(store, &p.prefix, keep as usize).await?;
    super::report(&Report {
        created: created.name,
        versions: Some(created.versions),
        dropped,
        dry_run: false,
    })
}
