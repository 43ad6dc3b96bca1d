//! Exports: the memory tables out as files (SQL + format), and the lossless
//! form back in.
//!
//! `jsonl` without a query is the *lossless* form: a header line, then one
//! line per row of `chunks` (every column, embedding included), `entities`,
//! `edges`, `history` and `feedback`, limited to the caller's streams.
//! [`restore`] writes such a file back row for row (upsert by id): no pipeline
//! runs, so nothing is re-derived, re-redacted or re-embedded. Any other
//! export is a query result (default [`DEFAULT_SQL`]) rendered as `jsonl`,
//! `parquet`, `csv` or `markdown`, through the same stream-scoped SQL views
//! as `/v1/sql`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use lancedb::datafusion::arrow::array::RecordBatch;
use lancedb::datafusion::arrow::compute::{concat_batches, sort_to_indices, take_record_batch};

use crate::core::error::{Error, Result};
use crate::core::model::{Chunk, Micros};
use crate::core::Caller;
use crate::service::import::ImportReport;
use crate::service::sql::OutputFormat;
use crate::store::{Filter, Store, CHUNKS, EDGES, ENTITIES, FEEDBACK, HISTORY};

/// The version of the lossless format this build writes and reads.
const LOSSLESS_VERSION: u64 = 1;

/// The tables of the lossless form besides `chunks`, in restore order.
pub const SIDE_TABLES: &[&str] = &[ENTITIES, EDGES, HISTORY, FEEDBACK];

/// What a query-less `parquet`, `csv` or `markdown` export holds.
pub const DEFAULT_SQL: &str = "SELECT * FROM chunks ORDER BY stream, created_at, id";

/// Rows restored per commit.
const RESTORE_CHUNK: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    Jsonl,
    Parquet,
    Csv,
    Markdown,
}

impl std::str::FromStr for ExportFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "jsonl" | "loomem-jsonl" => Ok(ExportFormat::Jsonl),
            "parquet" => Ok(ExportFormat::Parquet),
            "csv" => Ok(ExportFormat::Csv),
            "markdown" | "md" => Ok(ExportFormat::Markdown),
            _ => Err(format!(
                "unknown export format `{s}`; use jsonl, parquet, csv or markdown"
            )),
        }
    }
}

impl ExportFormat {
    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::Jsonl => "jsonl",
            ExportFormat::Parquet => "parquet",
            ExportFormat::Csv => "csv",
            ExportFormat::Markdown => "markdown",
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            ExportFormat::Markdown => "md",
            other => other.name(),
        }
    }

    /// The SQL output format a query export of this format renders in.
    pub fn output(self) -> OutputFormat {
        match self {
            ExportFormat::Jsonl => OutputFormat::Jsonl,
            ExportFormat::Parquet => OutputFormat::Parquet,
            ExportFormat::Csv => OutputFormat::Csv,
            ExportFormat::Markdown => OutputFormat::Markdown,
        }
    }

    pub fn content_type(self) -> &'static str {
        self.output().content_type()
    }
}

/// One export: a format, an optional query, an optional stream.
#[derive(schemars::JsonSchema, Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    pub format: String,
    #[serde(default)]
    pub sql: Option<String>,
    /// Only this stream (else every stream the caller sees).
    #[serde(default)]
    pub stream: Option<String>,
}

/// The caller narrowed to one stream, when the request names one.
pub fn narrow(caller: &Caller, stream: Option<&str>) -> Result<Caller> {
    let Some(stream) = stream else {
        return Ok(caller.clone());
    };
    if !caller.can_see(stream) {
        return Err(Error::Forbidden(format!(
            "stream `{stream}` is not accessible with this API key"
        )));
    }
    Ok(Caller {
        streams: Some(vec![stream.to_string()]),
        ..caller.clone()
    })
}

/// Rows the lossless export reads and writes at a time.
const PAGE: usize = 1000;

fn io_err(what: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Internal(format!("export: {}: {e}", what.display()))
}

/// One export: a format and an optional query, for `caller` (already
/// narrowed to its streams).
pub struct Export<'a> {
    pub store: &'a Store,
    pub caller: &'a Caller,
    pub limits: &'a crate::service::sql::SqlLimits,
    pub format: ExportFormat,
    pub sql: Option<&'a str>,
}

impl Export<'_> {
    /// Write it into the file `out`, a page of rows at a time, so an export
    /// is never held whole in memory; returns its size in bytes. A query
    /// export runs, renders and writes within the SQL timeout; the lossless
    /// form pages through the tables.
    pub async fn write_to(&self, out: &Path) -> Result<u64> {
        if self.format == ExportFormat::Jsonl && self.sql.is_none() {
            return lossless_to(self.store, self.caller, out).await;
        }
        let req = crate::service::sql::SqlRequest {
            sql: self.sql.unwrap_or(DEFAULT_SQL).to_string(),
            params: Vec::new(),
            format: None,
            max_rows: None,
        };
        let file = std::fs::File::create(out).map_err(io_err(out))?;
        let (file, _rows) = crate::service::sql::export_into(
            self.store,
            self.caller,
            self.limits,
            &req,
            self.format.output(),
            std::io::BufWriter::new(file),
        )
        .await?;
        let file = file.into_inner().map_err(|e| io_err(out)(e.into_error()))?;
        Ok(file.metadata().map_err(io_err(out))?.len())
    }

    /// Write it to a file at `path`, whole or not at all (see
    /// [`replace_file`]); returns its size in bytes.
    pub async fn write_file(&self, path: &Path) -> Result<u64> {
        replace_file(path, |tmp| async move { self.write_to(&tmp).await }).await
    }

    /// Write it to a file under `dir` and open that for reading with its name
    /// already removed: the caller streams it out, and its space is freed
    /// when the handle closes (also when the client goes away). Returns the
    /// handle and the size in bytes.
    pub async fn write_unlinked(&self, dir: &Path) -> Result<(std::fs::File, u64)> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let path = dir.join(format!("{}.part", uuid::Uuid::new_v4().simple()));
        let written = self.write_to(&path).await;
        let opened = written.and_then(|bytes| {
            let file = std::fs::File::open(&path).map_err(io_err(&path))?;
            Ok((file, bytes))
        });
        let _ = std::fs::remove_file(&path);
        opened
    }
}

/// Write the file at `path` so a reader sees the old file or the whole new
/// one, never a part: `write` fills a fresh file beside it, which is then
/// synced and renamed over it (and removed if anything fails).
pub async fn replace_file<T, F, Fut>(path: &Path, write: F) -> Result<T>
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let tmp = aside(path).map_err(io_err(path))?;
    let written = async {
        let out = write(tmp.clone()).await?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(io_err(path))?;
        Ok(out)
    }
    .await;
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A fresh name beside `path` (its directory created) to write it under.
fn aside(path: &Path) -> std::io::Result<PathBuf> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{} names no file", path.display())))?;
    Ok(dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        uuid::Uuid::new_v4().simple()
    )))
}

/// Sort a table's rows by `keys` so an export of the same rows is the same file.
fn sorted(batches: Vec<RecordBatch>, key: &str) -> Result<Option<RecordBatch>> {
    let Some(first) = batches.first() else {
        return Ok(None);
    };
    let fail =
        |e: lancedb::arrow::arrow_schema::ArrowError| Error::Internal(format!("export: {e}"));
    let all = concat_batches(&first.schema(), &batches).map_err(fail)?;
    let column = all
        .column_by_name(key)
        .ok_or_else(|| Error::Internal(format!("export: no `{key}` column")))?;
    let order = sort_to_indices(column, None, None).map_err(fail)?;
    Ok(Some(take_record_batch(&all, &order).map_err(fail)?))
}

/// The bytes the header line of a lossless export takes: its JSON, padded
/// with spaces (which JSON readers skip), so it can be written in place once
/// the rows are counted.
const HEADER_WIDTH: usize = 1024;

/// The lossless JSONL form of every memory table, limited to `caller`'s
/// streams, into `out`: chunks by stream and id, the other tables by id, a
/// page at a time. The header (with each table's row count) comes first: its
/// line is reserved, the rows written after it, then the header written into
/// its place.
async fn lossless_to(store: &Store, caller: &Caller, out: &Path) -> Result<u64> {
    use std::io::{Seek, SeekFrom};
    let file = std::fs::File::create(out).map_err(io_err(out))?;
    let mut body = std::io::BufWriter::new(file);
    let mut reserved = vec![b' '; HEADER_WIDTH];
    reserved[HEADER_WIDTH - 1] = b'\n';
    body.write_all(&reserved).map_err(io_err(out))?;
    let rows = lossless_rows(store, caller, &mut body, PAGE).await?;
    let header = serde_json::json!({
        "loomem_export": LOSSLESS_VERSION,
        "exported_at": crate::core::time::to_rfc3339(crate::core::model::now_micros()),
        "embed_dim": store.dim(),
        "rows": rows,
    });
    let line = serde_json::to_vec(&header).map_err(|e| Error::Internal(e.to_string()))?;
    if line.len() >= HEADER_WIDTH {
        return Err(Error::Internal(format!(
            "export: a header of {} bytes does not fit its {HEADER_WIDTH}",
            line.len()
        )));
    }
    let mut file = body.into_inner().map_err(|e| io_err(out)(e.into_error()))?;
    file.seek(SeekFrom::Start(0)).map_err(io_err(out))?;
    file.write_all(&line).map_err(io_err(out))?;
    Ok(file.metadata().map_err(io_err(out))?.len())
}

/// Every row line of the lossless form; the rows written per table.
async fn lossless_rows(
    store: &Store,
    caller: &Caller,
    body: &mut impl Write,
    page: usize,
) -> Result<BTreeMap<String, usize>> {
    let fail = |e: std::io::Error| Error::Internal(format!("export: {e}"));
    let prefix = |name: &str| format!("{{\"table\":\"{name}\",\"row\":");
    let mut rows = BTreeMap::new();
    let mut written = 0;
    let chunk_prefix = prefix(CHUNKS);
    for stream in streams(store, caller).await? {
        let mut ids = store.ids(&Filter::new().stream(&stream)).await?;
        ids.sort();
        for part in ids.chunks(page) {
            let mut chunks = store
                .find(&Filter::new().stream(&stream).ids(part), None)
                .await?;
            chunks.sort_by(|a, b| a.id.cmp(&b.id));
            for c in &chunks {
                body.write_all(chunk_prefix.as_bytes()).map_err(fail)?;
                serde_json::to_writer(&mut *body, c).map_err(|e| Error::Internal(e.to_string()))?;
                body.write_all(b"}\n").map_err(fail)?;
            }
            written += chunks.len();
        }
    }
    rows.insert(CHUNKS.to_string(), written);
    store.graph.settle().await;
    let tables = store.tables();
    let filter = Filter::new().visible_to(caller);
    for name in SIDE_TABLES {
        let table = &tables[name];
        let mut ids = crate::store::scan_ids(table, &filter).await?;
        ids.sort();
        let prefix = prefix(name);
        let mut written = 0;
        for part in ids.chunks(page) {
            let batches = crate::store::scan(table, &filter.clone().ids(part)).await?;
            let Some(batch) = sorted(batches, "id")? else {
                continue;
            };
            written += batch.num_rows();
            let mut writer = arrow_json::LineDelimitedWriter::new(Vec::new());
            writer
                .write(&batch)
                .and_then(|()| writer.finish())
                .map_err(|e| Error::Internal(format!("export: {e}")))?;
            for line in writer.into_inner().split(|b| *b == b'\n') {
                if line.is_empty() {
                    continue;
                }
                body.write_all(prefix.as_bytes()).map_err(fail)?;
                body.write_all(line).map_err(fail)?;
                body.write_all(b"}\n").map_err(fail)?;
            }
        }
        rows.insert(name.to_string(), written);
    }
    Ok(rows)
}

/// The rows of a lossless export, checked and grouped by table.
#[derive(Default)]
struct Parsed {
    /// Each row with the line it came from.
    chunks: Vec<(usize, Chunk)>,
    side: BTreeMap<&'static str, Vec<(usize, serde_json::Value)>>,
}

/// The id a graph row must carry: entity and edge ids spell their stream, so
/// a row restored into one stream can never take over another stream's entity.
fn graph_row_id(table: &str, row: &serde_json::Value) -> Option<String> {
    let f = |k: &str| row[k].as_str().unwrap_or_default();
    match table {
        ENTITIES => Some(format!("{}/{}", f("stream"), f("key"))),
        EDGES => Some(format!(
            "{}/{}/{}/{}",
            f("stream"),
            f("source"),
            f("relation"),
            f("target")
        )),
        _ => None,
    }
}

fn bad_line(line: usize, message: impl std::fmt::Display) -> String {
    format!("line {line}: {message}")
}

/// Check every line of a lossless export before anything is written.
fn parse_lossless(text: &str, caller: &Caller, dim: usize) -> Result<Parsed> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim().is_empty());
    let not_export = || {
        Error::invalid(
            "body",
            "line 1: not a loomem export (the first line must be its {\"loomem_export\": 1, …} header)",
        )
    };
    let (_, first) = lines.next().ok_or_else(not_export)?;
    let header: serde_json::Value = serde_json::from_str(first).map_err(|_| not_export())?;
    match header["loomem_export"].as_u64() {
        Some(LOSSLESS_VERSION) => {}
        Some(v) => {
            return Err(Error::invalid(
                "body",
                format!(
                "line 1: export format version {v}; this build reads version {LOSSLESS_VERSION}"
            ),
            ))
        }
        None => return Err(not_export()),
    }
    if let Some(d) = header["embed_dim"].as_u64() {
        if d as usize != dim {
            return Err(Error::invalid(
                "body",
                format!("line 1: the export holds {d}-dimensional embeddings, this data directory {dim}"),
            ));
        }
    }
    let mut parsed = Parsed::default();
    let mut errors = Vec::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for (n, line) in lines {
        #[derive(serde::Deserialize)]
        struct Line {
            table: String,
            row: serde_json::Value,
        }
        let l: Line = match serde_json::from_str(line) {
            Ok(l) => l,
            Err(e) => {
                errors.push(bad_line(
                    n,
                    format!("not a {{\"table\", \"row\"}} line: {e}"),
                ));
                continue;
            }
        };
        *counts.entry(l.table.clone()).or_default() += 1;
        let stream = l.row["stream"].as_str().unwrap_or_default();
        if !caller.can_see(stream) {
            return Err(Error::Forbidden(format!(
                "line {n}: stream `{stream}` is not accessible with this API key"
            )));
        }
        if l.table == CHUNKS {
            match serde_json::from_value::<Chunk>(l.row) {
                Ok(c) if c.embedding.as_ref().is_some_and(|e| e.len() != dim) => errors.push(
                    bad_line(n, format!("chunk {} has a wrong-sized embedding", c.id)),
                ),
                Ok(c) => parsed.chunks.push((n, c)),
                Err(e) => errors.push(bad_line(n, format!("chunks row: {e}"))),
            }
        } else if let Some(name) = SIDE_TABLES.iter().find(|t| **t == l.table) {
            match graph_row_id(name, &l.row) {
                Some(want) if l.row["id"].as_str() != Some(want.as_str()) => errors.push(bad_line(
                    n,
                    format!("`{name}` row: its id must be `{want}` (stream and key)"),
                )),
                _ => parsed.side.entry(name).or_default().push((n, l.row)),
            }
        } else {
            errors.push(bad_line(n, format!("unknown table `{}`", l.table)));
        }
    }
    // A cut-off file restores nothing: the header says how many rows follow.
    if let Some(rows) = header["rows"].as_object() {
        for (table, want) in rows {
            let got = counts.get(table).copied().unwrap_or(0);
            if want.as_u64() != Some(got as u64) {
                errors.push(format!(
                    "the header promises {want} `{table}` rows, the file holds {got} (truncated?)"
                ));
            }
        }
    }
    if !errors.is_empty() {
        let more = errors.len().saturating_sub(10);
        errors.truncate(10);
        if more > 0 {
            errors.push(format!("and {more} more"));
        }
        return Err(Error::invalid("body", errors.join("; ")));
    }
    Ok(parsed)
}

/// Write a lossless export back, row for row (upsert by id, so a rerun is
/// harmless). Every line is checked first: a bad file writes nothing.
pub async fn restore(store: &Store, caller: &Caller, text: &str) -> Result<ImportReport> {
    let parsed = parse_lossless(text, caller, store.dim())?;
    let mut report = ImportReport::default();
    store.graph.settle().await;
    let tables = store.tables();
    // A row whose id names a row of another stream is refused by line; the
    // rest of the file is restored.
    let ids: Vec<&str> = parsed.chunks.iter().map(|(_, c)| c.id.as_str()).collect();
    let owners = store.owners(&ids).await?;
    let mut chunks = Vec::with_capacity(parsed.chunks.len());
    for (line, c) in parsed.chunks {
        report.read += 1;
        if let Some(why) = owners.get(&c.id).and_then(|o| o.refuses(&c)) {
            report.rejected.push(refused(line, why));
        } else {
            chunks.push(c);
        }
    }
    report.accepted += chunks.len();
    let mut rest = chunks.into_iter().peekable();
    while rest.peek().is_some() {
        let part: Vec<Chunk> = rest.by_ref().take(RESTORE_CHUNK).collect();
        store.upsert(part).await?;
    }
    for (name, rows) in parsed.side {
        let table = &tables[name];
        let id = |row: &serde_json::Value| row["id"].as_str().unwrap_or_default().to_string();
        let ids: Vec<String> = rows.iter().map(|(_, r)| id(r)).collect();
        let owners = crate::store::owners(table, &ids).await?;
        let mut keep = Vec::with_capacity(rows.len());
        for (line, row) in rows {
            report.read += 1;
            let stream = row["stream"].as_str().unwrap_or_default();
            if owners.get(&id(&row)).is_some_and(|s| s != stream) {
                report
                    .rejected
                    .push(refused(line, crate::core::error::id_in_use(&id(&row))));
            } else {
                keep.push(row);
            }
        }
        let schema = table
            .schema()
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        for part in keep.chunks(RESTORE_CHUNK) {
            let batch = crate::store::graph::rows_to_batch(schema.clone(), part)
                .map_err(|e| Error::invalid("body", format!("`{name}` rows: {e}")))?;
            crate::store::upsert_batch(table, batch).await?;
        }
        report.accepted += keep.len();
    }
    report.rejected.sort_by_key(|r| r.line);
    store.feedback.reload().await?;
    // Entity rows came in past the graph's own writes.
    store.graph.forget_known();
    Ok(report)
}

fn refused(line: usize, why: String) -> crate::service::import::Rejected {
    crate::service::import::Rejected {
        line,
        error: format!("id: {why}"),
    }
}

/// The streams a scheduled export writes one file each for.
pub async fn streams(store: &Store, caller: &Caller) -> Result<Vec<String>> {
    let mut streams: Vec<String> = store
        .latest_write_by_stream(&Filter::new().visible_to(caller))
        .await?
        .into_keys()
        .collect();
    streams.sort();
    Ok(streams)
}

/// A path template with its placeholders filled: `{stream}`, `{date}`
/// (YYYY-MM-DD), `{time}` (HHMMSS), `{format}` and `{ext}`.
pub fn expand(template: &str, stream: Option<&str>, at: Micros, format: ExportFormat) -> String {
    let stamp = crate::core::time::to_rfc3339(at);
    let date = &stamp[..10];
    let time: String = stamp[11..19].chars().filter(|c| *c != ':').collect();
    let stream = stream.map(safe_segment).unwrap_or_else(|| "all".into());
    template
        .replace("{stream}", &stream)
        .replace("{date}", date)
        .replace("{time}", &time)
        .replace("{format}", format.name())
        .replace("{ext}", format.extension())
}

/// A stream name as one path segment: no separators, no `..`.
fn safe_segment(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || "-_.@".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.chars().all(|c| c == '.') {
        cleaned.replace('.', "_")
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand_and_stream_names_stay_one_segment() {
        let at = crate::core::time::parse_instant_str("2026-11-22T09:05:07Z").unwrap();
        assert_eq!(
            expand(
                "exports/{stream}/{date}.{ext}",
                Some("team/../x"),
                at,
                ExportFormat::Markdown
            ),
            "exports/team_.._x/2026-11-22.md"
        );
        assert_eq!(
            expand(
                "{stream}-{date}T{time}.{format}",
                None,
                at,
                ExportFormat::Parquet
            ),
            "all-2026-11-22T090507.parquet"
        );
        assert_eq!(safe_segment(".."), "__");
    }

    #[tokio::test]
    async fn the_lossless_form_is_the_same_whatever_the_page_size() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 4, 100).await.unwrap();
        let chunks: Vec<Chunk> = (0..11)
            .map(|i| {
                let stream = if i % 3 == 0 { "x" } else { "y" };
                let mut c = Chunk::new(format!("m{i:02}"), stream.into(), format!("memory {i}"), 2);
                c.embedding = Some(vec![i as f32, 1.0, 0.0, 0.0]);
                c
            })
            .collect();
        store.upsert(chunks).await.unwrap();
        let history = (0..7)
            .map(|i| crate::store::HistoryRow {
                id: format!("h{i}"),
                stream: "y".into(),
                chunk_id: format!("m{i:02}"),
                event: "created".into(),
                reason: String::new(),
                related_ids: Vec::new(),
                created_at: i,
            })
            .collect();
        store.add_history(history).await.unwrap();
        let admin = Caller::admin("test");
        let mut whole = Vec::new();
        let rows = lossless_rows(&store, &admin, &mut whole, 1000)
            .await
            .unwrap();
        assert_eq!((rows[CHUNKS], rows[HISTORY]), (11, 7), "{rows:?}");
        let mut paged = Vec::new();
        lossless_rows(&store, &admin, &mut paged, 2).await.unwrap();
        assert_eq!(
            String::from_utf8(paged).unwrap(),
            String::from_utf8(whole.clone()).unwrap()
        );
        // Chunks by stream, then id.
        let ids: Vec<String> = String::from_utf8(whole)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|l| l["table"] == CHUNKS)
            .map(|l| {
                format!(
                    "{}/{}",
                    l["row"]["stream"].as_str().unwrap(),
                    l["row"]["id"].as_str().unwrap()
                )
            })
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        store.close().await;
    }

    #[tokio::test]
    async fn atomic_writes_replace_whole_files_and_leave_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/out.jsonl");
        let write = |bytes: &'static [u8]| {
            replace_file(&path, move |tmp| async move {
                std::fs::write(&tmp, bytes).map_err(io_err(&tmp))
            })
        };
        write(b"one\n").await.unwrap();
        write(b"two\n").await.unwrap();
        // A write that fails leaves the file as it was, and no temp behind.
        let failed: Result<()> = replace_file(&path, |tmp| async move {
            std::fs::write(&tmp, b"half").map_err(io_err(&tmp))?;
            Err(Error::Internal("cut short".into()))
        })
        .await;
        assert!(failed.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"two\n");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out.jsonl")]);
    }

    #[test]
    fn a_bad_or_cut_off_export_is_refused_whole_with_its_lines() {
        let admin = Caller::admin("t");
        let header = r#"{"loomem_export":1,"embed_dim":4,"rows":{"chunks":1,"history":2}}"#;
        let chunk = Chunk::new("c1".into(), "s".into(), "hello".into(), 1);
        let line = serde_json::json!({"table": "chunks", "row": chunk}).to_string();
        let hist = r#"{"table":"history","row":{"id":"h1","stream":"s"}}"#;
        let ok = format!("{header}\n{line}\n{hist}\n{hist}\n");
        let p = parse_lossless(&ok, &admin, 4).unwrap();
        assert_eq!((p.chunks.len(), p.side["history"].len()), (1, 2));

        let cut = format!("{header}\n{line}\n{hist}\n");
        let e = parse_lossless(&cut, &admin, 4).err().unwrap().to_string();
        assert!(
            e.contains("promises 2 `history` rows, the file holds 1"),
            "{e}"
        );

        let bad = format!("{header}\n{line}\n{{oops\n{hist}\n{hist}\n");
        let e = parse_lossless(&bad, &admin, 4).err().unwrap().to_string();
        assert!(e.contains("line 3:"), "{e}");

        let e = parse_lossless("{\"content\":\"x\"}\n", &admin, 4)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("line 1: not a loomem export"), "{e}");
        let e = parse_lossless(&ok, &admin, 8).err().unwrap().to_string();
        assert!(e.contains("4-dimensional"), "{e}");

        let scoped = Caller {
            streams: Some(vec!["other".into()]),
            ..admin
        };
        assert!(matches!(
            parse_lossless(&ok, &scoped, 4),
            Err(Error::Forbidden(_))
        ));
    }
}
