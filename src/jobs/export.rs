//! `export`: write the configured exports, each a format, an optional SQL
//! query and a path template, atomically (temp file, then rename). A template
//! with `{stream}` writes one file per stream, each holding only that stream's
//! rows; without it, one file holds every stream.
//!
//! Params: `exports`, a list of `{ format, path, sql? }` (default: one
//! lossless `jsonl` per stream, `exports/{stream}/{date}.jsonl`). Relative
//! paths resolve against the config file's directory; a path may also be an
//! object in a bucket (`s3://bucket/exports/{stream}/{date}.jsonl`), written
//! whole through a local spool file. A dry run reports the files it would
//! write and writes none.

use std::path::Path;

use serde::Deserialize;

use super::{JobContext, JobReport};
use crate::core::error::{Error, Result};
use crate::core::model::now_micros;
use crate::core::Caller;
use crate::service::export::{self, ExportFormat};
use crate::store::location;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    format: String,
    path: String,
    #[serde(default)]
    sql: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    #[serde(default = "default_exports")]
    exports: Vec<Spec>,
}

/// One file written (or, dry, to be written).
#[derive(Debug, serde::Serialize)]
struct File {
    path: String,
    stream: Option<String>,
    format: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    files: Vec<File>,
}

fn default_exports() -> Vec<Spec> {
    vec![Spec {
        format: "jsonl".into(),
        path: "exports/{stream}/{date}.jsonl".into(),
        sql: None,
    }]
}

pub async fn run_once(ctx: &JobContext) -> Result<JobReport> {
    let engine = &ctx.services;
    let admin = Caller::admin("scheduler");
    let limits = engine.cfg.sql.limits();
    let now = now_micros();
    let mut files = Vec::new();
    let p: Params = super::params(ctx, "export")?;
    for spec in p.exports {
        let format: ExportFormat = spec.format.parse().map_err(|e: String| {
            Error::invalid("scheduler.jobs.export.params.exports.format", e)
        })?;
        let targets: Vec<(Option<String>, String)> = if spec.path.contains("{stream}") {
            export::streams(&engine.store, &admin)
                .await?
                .into_iter()
                .map(|s| {
                    let path = export::expand(&spec.path, Some(&s), now, format);
                    (Some(s), path)
                })
                .collect()
        } else {
            vec![(None, export::expand(&spec.path, None, now, format))]
        };
        for (stream, path) in targets {
            let object = location::is_object_uri(&path);
            let path = if object {
                path
            } else {
                ctx.resolve(Path::new(&path)).display().to_string()
            };
            if ctx.dry_run {
                files.push(File {
                    path,
                    stream,
                    format: format.name(),
                    bytes: None,
                });
                continue;
            }
            let caller = export::narrow(&admin, stream.as_deref())?;
            let export = export::Export {
                store: &engine.store,
                caller: &caller,
                limits: &limits,
                format,
                sql: spec.sql.as_deref(),
            };
            let bytes = if object {
                let (file, bytes) = export.write_unlinked(&ctx.spool_dir).await?;
                location::upload(file, &path, &ctx.object_settings)
                    .await
                    .map_err(|e| Error::Internal(format!("exporting to {path}: {e}")))?;
                bytes
            } else {
                export.write_file(Path::new(&path)).await?
            };
            files.push(File {
                path,
                stream,
                format: format.name(),
                bytes: Some(bytes),
            });
        }
    }
    super::report(&Report { files })
}
