//! Read-only SQL over the memory tables with DataFusion (the version lancedb
//! re-exports). A caller never sees a raw table: each table is registered as a
//! view already filtered to the caller's streams, and DDL, DML, COPY and other
//! statements are refused before planning. Time travel comes as table
//! functions: `chunks_valid_at(ts)` (bitemporal validity) and
//! `chunks_as_of(version_or_timestamp)` (the table as it was, a Lance version).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use lancedb::datafusion::arrow::array::RecordBatch;
use lancedb::datafusion::arrow::datatypes::SchemaRef;
use lancedb::datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use lancedb::datafusion::common::{ParamValues, ScalarValue};
use lancedb::datafusion::error::DataFusionError;
use lancedb::datafusion::execution::memory_pool::GreedyMemoryPool;
use lancedb::datafusion::execution::runtime_env::RuntimeEnvBuilder;
use lancedb::datafusion::logical_expr::Expr;
use lancedb::datafusion::prelude::{col, lit, DataFrame, SessionConfig, SessionContext};
use lancedb::datafusion::sql::sqlparser::ast::Statement;
use lancedb::table::datafusion::BaseTableAdapter;
use lancedb::Table;
use regex::Regex;
use serde::Deserialize;

use crate::core::error::{Error, Result};
use crate::core::time::parse_instant_str;
use crate::core::Caller;
use crate::store::{
    Store, CHUNKS, DEAD_LETTERS, EDGES, ENTITIES, FEEDBACK, GRAPH_METRICS, HISTORY, LLM_CALLS,
    RELATIONS,
};

/// Tables every caller can query (as stream-scoped views).
pub const TABLES: &[&str] = &[
    CHUNKS,
    ENTITIES,
    EDGES,
    HISTORY,
    DEAD_LETTERS,
    LLM_CALLS,
    FEEDBACK,
    RELATIONS,
    GRAPH_METRICS,
];

#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlRequest {
    #[schemars(length(min = 1), regex(pattern = r"\S"))]
    pub sql: String,
    /// Values for `$1`, `$2`, … placeholders.
    #[serde(default)]
    pub params: Vec<serde_json::Value>,
    /// `json` (default), `jsonl`, `csv`, `markdown`, `arrow` (IPC stream) or `parquet`.
    pub format: Option<String>,
    /// Most rows returned (default and cap from `[sql]`).
    pub max_rows: Option<usize>,
}

/// Limits that bound one query.
#[derive(Debug, Clone)]
pub struct SqlLimits {
    pub timeout: Duration,
    pub memory_bytes: usize,
    pub default_max_rows: usize,
    pub max_rows_cap: usize,
}

pub struct SqlResult {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    pub truncated: bool,
    /// When the query's time runs out: rendering past it is a timeout too.
    pub deadline: Option<std::time::Instant>,
}

fn timed_out(limits_timeout: Duration) -> Error {
    Error::Timeout(format!(
        "SQL: the query ran past {} ms",
        limits_timeout.as_millis()
    ))
}

fn sql_err(e: DataFusionError) -> Error {
    Error::BadRequest(format!("SQL: {}", e.strip_backtrace()))
}

fn to_scalar(i: usize, v: &serde_json::Value) -> Result<ScalarValue> {
    Ok(match v {
        serde_json::Value::Null => ScalarValue::Null,
        serde_json::Value::Bool(b) => ScalarValue::Boolean(Some(*b)),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => ScalarValue::Int64(Some(i)),
            None => ScalarValue::Float64(n.as_f64()),
        },
        serde_json::Value::String(s) => ScalarValue::Utf8(Some(s.clone())),
        _ => {
            return Err(Error::invalid(
                &format!("params[{i}]"),
                "must be null, a boolean, a number or a string",
            ))
        }
    })
}

/// A table as a DataFrame limited to the caller's streams.
async fn scoped(
    ctx: &SessionContext,
    table: &Table,
    caller: &Caller,
    hide_embedding: bool,
) -> Result<DataFrame> {
    let provider = BaseTableAdapter::try_new(table.base_table().clone())
        .await
        .map_err(|e| Error::Internal(format!("SQL provider: {e}")))?;
    let mut df = ctx.read_table(Arc::new(provider)).map_err(sql_err)?;
    if let Some(streams) = &caller.streams {
        let list: Vec<Expr> = streams.iter().map(|s| lit(s.clone())).collect();
        df = df
            .filter(col("stream").in_list(list, false))
            .map_err(sql_err)?;
    }
    if hide_embedding && df.schema().has_column_with_unqualified_name("embedding") {
        df = df.drop_columns(&["embedding"]).map_err(sql_err)?;
    }
    Ok(df)
}

/// An instant from a table-function argument: Unix seconds or a timestamp string.
fn instant_arg(e: &Expr) -> Option<i64> {
    match e {
        Expr::Literal(ScalarValue::Int64(Some(s)), _) => crate::core::time::from_secs(*s),
        Expr::Literal(ScalarValue::Float64(Some(s)), _) => crate::core::time::from_secs_f64(*s),
        Expr::Literal(ScalarValue::Utf8(Some(s)), _) => parse_instant_str(s),
        _ => None,
    }
}

/// `chunks_valid_at(ts)`: latest-or-not chunks whose validity covers `ts`.
#[derive(Debug)]
struct ValidAt {
    chunks: DataFrame,
}

impl TableFunctionImpl for ValidAt {
    fn call_with_args(
        &self,
        args: TableFunctionArgs,
    ) -> lancedb::datafusion::error::Result<Arc<dyn TableProvider>> {
        let t = match args.exprs() {
            [e] => instant_arg(e),
            _ => None,
        }
        .ok_or_else(|| {
            DataFusionError::Plan(
                "chunks_valid_at takes one argument: Unix seconds or a timestamp string".into(),
            )
        })?;
        let t = lit(ScalarValue::TimestampMicrosecond(Some(t), None));
        let df = self.chunks.clone().filter(
            (col("valid_from")
                .is_null()
                .or(col("valid_from").lt_eq(t.clone())))
            .and(col("valid_until").is_null().or(col("valid_until").gt(t))),
        )?;
        Ok(df.into_view())
    }
}

/// `chunks_as_of(v)`: the chunks table at a Lance version (or the last version at
/// or before a time); versions are opened before planning and looked up here.
#[derive(Debug)]
struct AsOf {
    by_arg: HashMap<String, DataFrame>,
}

fn as_of_key(e: &Expr) -> Option<String> {
    match e {
        Expr::Literal(ScalarValue::Int64(Some(v)), _) => Some(v.to_string()),
        Expr::Literal(ScalarValue::Utf8(Some(s)), _) => Some(s.clone()),
        _ => None,
    }
}

impl TableFunctionImpl for AsOf {
    fn call_with_args(
        &self,
        args: TableFunctionArgs,
    ) -> lancedb::datafusion::error::Result<Arc<dyn TableProvider>> {
        let key = match args.exprs() {
            [e] => as_of_key(e),
            _ => None,
        }
        .ok_or_else(|| {
            DataFusionError::Plan(
                "chunks_as_of takes one literal: a version number or a timestamp".into(),
            )
        })?;
        let df = self.by_arg.get(&key).ok_or_else(|| {
            DataFusionError::Plan(format!("chunks_as_of({key}): no such version"))
        })?;
        Ok(df.clone().into_view())
    }
}

/// The Lance version `arg` names: a version number (small integers), Unix
/// seconds or a timestamp string (the last version committed at or before it).
async fn resolve_version(table: &Table, arg: &str) -> Result<u64> {
    let versions = table
        .list_versions()
        .await
        .map_err(|e| Error::Internal(e.to_string()))?;
    let at = match arg.parse::<i64>() {
        Ok(v) if v < 1_000_000_000 => {
            return versions
                .iter()
                .find(|x| x.version == v as u64)
                .map(|x| x.version)
                .ok_or_else(|| {
                    Error::invalid("sql", format!("chunks_as_of({v}): no such version"))
                });
        }
        Ok(secs) => crate::core::time::from_secs(secs).ok_or_else(|| {
            Error::invalid(
                "sql",
                format!("chunks_as_of({secs}): a timestamp out of range"),
            )
        })?,
        Err(_) => parse_instant_str(arg).ok_or_else(|| {
            Error::invalid(
                "sql",
                format!("chunks_as_of('{arg}'): not a version or timestamp"),
            )
        })?,
    };
    versions
        .iter()
        .filter(|x| x.timestamp.timestamp_micros() <= at)
        .map(|x| x.version)
        .max()
        .ok_or_else(|| {
            Error::invalid(
                "sql",
                format!("chunks_as_of({arg}): the table did not exist yet"),
            )
        })
}

/// Past versions of `chunks` one query may open (each is a table checkout).
const MAX_PAST_VERSIONS: usize = 8;

/// Run one read-only query for `caller`: at most `max_rows` rows (the
/// request's, else `limits.default_max_rows`).
pub async fn query(
    store: &Store,
    caller: &Caller,
    limits: &SqlLimits,
    req: &SqlRequest,
) -> Result<SqlResult> {
    execute(store, caller, limits, req).await
}

/// Every row the query selects (exports), up to `limits.max_rows_cap`: a query
/// that selects more is refused rather than cut short or held whole in memory.
pub async fn query_all(
    store: &Store,
    caller: &Caller,
    limits: &SqlLimits,
    req: &SqlRequest,
) -> Result<SqlResult> {
    let req = SqlRequest {
        max_rows: Some(limits.max_rows_cap),
        ..req.clone()
    };
    let result = execute(store, caller, limits, &req).await?;
    if result.truncated {
        return Err(Error::invalid(
            "sql",
            format!(
                "the export selects more than {} rows (sql.max_rows_cap): narrow it with a query or a stream",
                limits.max_rows_cap
            ),
        ));
    }
    Ok(result)
}

async fn execute(
    store: &Store,
    caller: &Caller,
    limits: &SqlLimits,
    req: &SqlRequest,
) -> Result<SqlResult> {
    let max_rows = match req.max_rows.unwrap_or(limits.default_max_rows) {
        m if m == 0 || m > limits.max_rows_cap => {
            return Err(Error::invalid(
                "max_rows",
                format!("must be between 1 and {}", limits.max_rows_cap),
            ))
        }
        m => m,
    };
    let deadline = std::time::Instant::now() + limits.timeout;
    // Everything that reads the store, opening past versions included, runs
    // within the timeout.
    let run = async {
        let df = plan(store, caller, limits, req).await?;
        let df = df.limit(0, Some(max_rows + 1)).map_err(sql_err)?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await.map_err(sql_err)?;
        Ok::<_, Error>((schema, batches))
    };
    let (schema, mut batches) = tokio::time::timeout(limits.timeout, run)
        .await
        .map_err(|_| timed_out(limits.timeout))??;
    let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let truncated = total > max_rows;
    if truncated {
        let mut keep = max_rows;
        let mut cut = Vec::new();
        for b in batches {
            if keep == 0 {
                break;
            }
            let n = b.num_rows().min(keep);
            cut.push(b.slice(0, n));
            keep -= n;
        }
        batches = cut;
    }
    Ok(SqlResult {
        schema,
        batches,
        truncated,
        deadline: Some(deadline),
    })
}

/// Run a query for an export and render it into `out` batch by batch as
/// DataFusion produces them: one batch in memory at a time, the whole of it
/// (planning, reading, rendering) within the timeout, and more rows than
/// `limits.max_rows_cap` refused rather than cut short. Returns the rows.
pub async fn export_into<W: std::io::Write + Send>(
    store: &Store,
    caller: &Caller,
    limits: &SqlLimits,
    req: &SqlRequest,
    format: OutputFormat,
    out: W,
) -> Result<(W, usize)> {
    use futures::StreamExt;
    let cap = limits.max_rows_cap;
    let run = async {
        let df = plan(store, caller, limits, req).await?;
        let df = df.limit(0, Some(cap + 1)).map_err(sql_err)?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let mut stream = df.execute_stream().await.map_err(sql_err)?;
        let mut renderer = Renderer::new(format, schema, out)?;
        let mut rows = 0;
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(sql_err)?;
            rows += batch.num_rows();
            if rows > cap {
                return Err(Error::invalid(
                    "sql",
                    format!(
                        "the export selects more than {cap} rows (sql.max_rows_cap): narrow it with a query or a stream"
                    ),
                ));
            }
            renderer.write(&batch)?;
        }
        Ok((renderer.finish(false)?, rows))
    };
    tokio::time::timeout(limits.timeout, run)
        .await
        .map_err(|_| timed_out(limits.timeout))?
}

/// The guard every query passes before anything is planned: one plain
/// read-only query (whatever the planner would accept), naming at most
/// [`MAX_PAST_VERSIONS`] distinct `chunks_as_of` versions (even in comments).
/// Returns those versions' arguments. Fuzzed (`fuzz/`): any text is an answer
/// or an error, never a panic.
pub fn check_query(sql: &str) -> Result<Vec<String>> {
    let sql = sql.trim();
    if sql.is_empty() {
        return Err(Error::invalid("sql", "must not be empty"));
    }
    let dialect = lancedb::datafusion::sql::sqlparser::dialect::GenericDialect {};
    let statements = lancedb::datafusion::sql::sqlparser::parser::Parser::parse_sql(&dialect, sql)
        .map_err(|e| Error::BadRequest(format!("SQL: {e}")))?;
    match statements.as_slice() {
        [Statement::Query(_)] => {}
        [_] => {
            return Err(Error::BadRequest(
                "SQL: only read-only queries (SELECT, WITH …) are allowed".into(),
            ))
        }
        _ => {
            return Err(Error::BadRequest(
                "SQL: exactly one statement is allowed".into(),
            ))
        }
    }
    static AS_OF: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?i)chunks_as_of\s*\(\s*(?:'([^']*)'|(\d+))\s*\)").expect("static regex")
    });
    let mut args: Vec<String> = Vec::new();
    for caps in AS_OF.captures_iter(sql) {
        let Some(arg) = caps.get(1).or_else(|| caps.get(2)) else {
            continue;
        };
        if !args.iter().any(|a| a == arg.as_str()) {
            args.push(arg.as_str().to_string());
        }
    }
    if args.len() > MAX_PAST_VERSIONS {
        return Err(Error::invalid(
            "sql",
            format!("at most {MAX_PAST_VERSIONS} distinct chunks_as_of versions in one query"),
        ));
    }
    Ok(args)
}

/// Check a query and plan it over the caller's views (reads the store: run
/// it within the timeout).
async fn plan(
    store: &Store,
    caller: &Caller,
    limits: &SqlLimits,
    req: &SqlRequest,
) -> Result<DataFrame> {
    let sql = req.sql.trim();
    let past_versions = check_query(sql)?;
    let params = req
        .params
        .iter()
        .enumerate()
        .map(|(i, v)| to_scalar(i, v))
        .collect::<Result<Vec<_>>>()?;

    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::new(GreedyMemoryPool::new(limits.memory_bytes)))
        .build_arc()
        .map_err(sql_err)?;
    let ctx = SessionContext::new_with_config_rt(
        SessionConfig::new().with_information_schema(false),
        runtime,
    );

    let options = lancedb::datafusion::execution::context::SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false);
    static EMBEDDING: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(?i)\bembedding\b").expect("static regex"));
    let wants_embedding = EMBEDDING.is_match(sql);
    // The graph's queued rows are answered too.
    store.graph.settle().await;
    let tables = store.tables();
    for name in TABLES {
        let df = scoped(
            &ctx,
            &tables[name],
            caller,
            *name == CHUNKS && !wants_embedding,
        )
        .await?;
        ctx.register_table(*name, df.into_view()).map_err(sql_err)?;
    }
    let chunks = scoped(&ctx, &tables[CHUNKS], caller, !wants_embedding).await?;
    ctx.register_udtf("chunks_valid_at", Arc::new(ValidAt { chunks }));

    let mut by_arg = HashMap::new();
    for arg in past_versions {
        let version = resolve_version(&tables[CHUNKS], &arg).await?;
        let old = store
            .connection()
            .open_table(CHUNKS)
            .execute()
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        old.checkout(version)
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        by_arg.insert(arg, scoped(&ctx, &old, caller, !wants_embedding).await?);
    }
    ctx.register_udtf("chunks_as_of", Arc::new(AsOf { by_arg }));
    let mut df = ctx.sql_with_options(sql, options).await.map_err(sql_err)?;
    if !params.is_empty() {
        df = df
            .with_param_values(ParamValues::List(
                params.into_iter().map(Into::into).collect(),
            ))
            .map_err(sql_err)?;
    }
    Ok(df)
}

/// The forms a query result is rendered in (`/v1/sql`, exports, the CLI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Json,
    Jsonl,
    Csv,
    Markdown,
    Arrow,
    Parquet,
}

impl OutputFormat {
    pub const ALL: [OutputFormat; 6] = [
        OutputFormat::Json,
        OutputFormat::Jsonl,
        OutputFormat::Csv,
        OutputFormat::Markdown,
        OutputFormat::Arrow,
        OutputFormat::Parquet,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OutputFormat::Json => "json",
            OutputFormat::Jsonl => "jsonl",
            OutputFormat::Csv => "csv",
            OutputFormat::Markdown => "markdown",
            OutputFormat::Arrow => "arrow",
            OutputFormat::Parquet => "parquet",
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            OutputFormat::Json => "application/json",
            OutputFormat::Jsonl => "application/x-ndjson",
            OutputFormat::Csv => "text/csv",
            OutputFormat::Markdown => "text/markdown",
            OutputFormat::Arrow => "application/vnd.apache.arrow.stream",
            OutputFormat::Parquet => "application/vnd.apache.parquet",
        }
    }
}

impl std::str::FromStr for OutputFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<OutputFormat> {
        OutputFormat::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = OutputFormat::ALL.iter().map(|f| f.name()).collect();
                Error::invalid("format", format!("`{s}`: use {}", names.join(", ")))
            })
    }
}

/// Render a result in `format`: (content type, body). A result with a
/// deadline (a query's) stops with a timeout once it has passed.
pub fn render(result: &SqlResult, format: OutputFormat) -> Result<(&'static str, Vec<u8>)> {
    let mut renderer = Renderer::new(format, result.schema.clone(), Vec::new())?;
    for b in &result.batches {
        if result
            .deadline
            .is_some_and(|d| std::time::Instant::now() > d)
        {
            return Err(Error::Timeout(
                "SQL: the query's time ran out while its result was rendered".into(),
            ));
        }
        renderer.write(b)?;
    }
    Ok((format.content_type(), renderer.finish(result.truncated)?))
}

fn render_err(e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("rendering: {e}"))
}

/// Writes a result in one format a batch at a time, so a large result can go
/// to a file without being held whole.
pub struct Renderer<W: std::io::Write> {
    rows: usize,
    form: Form<W>,
}

enum Form<W: std::io::Write> {
    /// `{"columns":[…],"rows":[` … `],"row_count":n,"truncated":b}`.
    Json(W),
    Jsonl(W),
    Csv(W),
    Markdown(W),
    Arrow(lancedb::datafusion::arrow::ipc::writer::StreamWriter<W>),
    Parquet(parquet::arrow::ArrowWriter<W>),
}

impl<W: std::io::Write + Send> Renderer<W> {
    pub fn new(format: OutputFormat, schema: SchemaRef, mut out: W) -> Result<Renderer<W>> {
        let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let form = match format {
            OutputFormat::Json => {
                let columns = serde_json::to_string(&names).map_err(render_err)?;
                write!(out, "{{\"columns\":{columns},\"rows\":[").map_err(render_err)?;
                Form::Json(out)
            }
            OutputFormat::Jsonl => Form::Jsonl(out),
            OutputFormat::Csv => {
                let header = csv_header(&names);
                out.write_all(header.as_bytes()).map_err(render_err)?;
                Form::Csv(out)
            }
            OutputFormat::Markdown => {
                let cells: Vec<String> = names.iter().map(|n| md_cell(n)).collect();
                write!(
                    out,
                    "| {} |\n|{}\n",
                    cells.join(" | "),
                    "---|".repeat(cells.len())
                )
                .map_err(render_err)?;
                Form::Markdown(out)
            }
            OutputFormat::Arrow => Form::Arrow(
                lancedb::datafusion::arrow::ipc::writer::StreamWriter::try_new(out, &schema)
                    .map_err(render_err)?,
            ),
            OutputFormat::Parquet => Form::Parquet(
                parquet::arrow::ArrowWriter::try_new(out, schema, None).map_err(render_err)?,
            ),
        };
        Ok(Renderer { rows: 0, form })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        use lancedb::datafusion::arrow::{csv, json};
        let first = self.rows == 0;
        self.rows += batch.num_rows();
        match &mut self.form {
            Form::Json(out) => {
                let mut lines = json::LineDelimitedWriter::new(Vec::new());
                lines.write(batch).map_err(render_err)?;
                lines.finish().map_err(render_err)?;
                let text = lines.into_inner();
                for (i, row) in text
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                    .enumerate()
                {
                    if !(first && i == 0) {
                        out.write_all(b",").map_err(render_err)?;
                    }
                    out.write_all(row).map_err(render_err)?;
                }
            }
            Form::Jsonl(out) => {
                let mut lines = json::LineDelimitedWriter::new(out);
                lines.write(batch).map_err(render_err)?;
                lines.finish().map_err(render_err)?;
            }
            Form::Csv(out) => {
                let mut writer = csv::WriterBuilder::new().with_header(false).build(out);
                writer.write(&nested_as_text(batch)?).map_err(render_err)?;
            }
            Form::Markdown(out) => markdown_rows(out, batch)?,
            Form::Arrow(w) => w.write(batch).map_err(render_err)?,
            Form::Parquet(w) => w.write(batch).map_err(render_err)?,
        }
        Ok(())
    }

    /// Close the output and hand it back.
    pub fn finish(self, truncated: bool) -> Result<W> {
        Ok(match self.form {
            Form::Json(mut out) => {
                write!(
                    out,
                    "],\"row_count\":{},\"truncated\":{truncated}}}",
                    self.rows
                )
                .map_err(render_err)?;
                out
            }
            Form::Jsonl(out) | Form::Csv(out) => out,
            Form::Markdown(mut out) => {
                if truncated {
                    out.write_all(b"\n(truncated at max_rows)")
                        .map_err(render_err)?;
                }
                out
            }
            Form::Arrow(mut w) => {
                w.finish().map_err(render_err)?;
                w.into_inner().map_err(render_err)?
            }
            Form::Parquet(w) => w.into_inner().map_err(render_err)?,
        })
    }
}

/// A CSV header line for these column names.
fn csv_header(names: &[String]) -> String {
    let quoted: Vec<String> = names
        .iter()
        .map(|n| {
            if n.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", n.replace('"', "\"\""))
            } else {
                n.clone()
            }
        })
        .collect();
    format!("{}\n", quoted.join(","))
}

/// CSV has no lists: list columns (tags, entities, embeddings) become their
/// display text, `[a, b]`.
fn nested_as_text(batch: &RecordBatch) -> Result<RecordBatch> {
    use lancedb::datafusion::arrow::array::{ArrayRef, StringArray};
    use lancedb::datafusion::arrow::datatypes::{DataType, Field, Schema};
    use lancedb::datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    let fail = |e: lancedb::datafusion::arrow::error::ArrowError| {
        Error::Internal(format!("rendering: {e}"))
    };
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|f| f.data_type().is_nested())
    {
        return Ok(batch.clone());
    }
    let options = FormatOptions::default().with_null("");
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
        if !f.data_type().is_nested() {
            fields.push(f.as_ref().clone());
            columns.push(c.clone());
            continue;
        }
        let formatter = ArrayFormatter::try_new(c.as_ref(), &options).map_err(fail)?;
        let text: StringArray = (0..c.len())
            .map(|r| (!c.is_null(r)).then(|| formatter.value(r).to_string()))
            .collect();
        fields.push(Field::new(f.name(), DataType::Utf8, true));
        columns.push(Arc::new(text));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(fail)
}

/// A Markdown table cell: one line, pipes escaped.
fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', "<br>")
}

/// A batch's rows as GitHub-flavoured Markdown table rows.
fn markdown_rows(out: &mut impl std::io::Write, b: &RecordBatch) -> Result<()> {
    use lancedb::datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    let options = FormatOptions::default().with_null("");
    let formatters = b
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
        .collect::<Result<Vec<_>, _>>()
        .map_err(render_err)?;
    for r in 0..b.num_rows() {
        let cells: Vec<String> = formatters
            .iter()
            .map(|f| md_cell(&f.value(r).to_string()))
            .collect();
        writeln!(out, "| {} |", cells.join(" | ")).map_err(render_err)?;
    }
    Ok(())
}

/// A plain-text table, for the CLI.
pub fn pretty(result: &SqlResult) -> Result<String> {
    let mut s = lancedb::datafusion::arrow::util::pretty::pretty_format_batches(&result.batches)
        .map_err(|e| Error::Internal(e.to_string()))?
        .to_string();
    if result.truncated {
        s.push_str("\n(truncated at max_rows)");
    }
    Ok(s)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlConfig {
    /// A query running longer is cancelled (504).
    pub timeout_ms: u64,
    /// Memory a query may use for sorts, joins and aggregations.
    pub memory_limit_mb: usize,
    /// Rows returned when a request names no `max_rows`.
    pub default_max_rows: usize,
    /// The largest `max_rows` accepted.
    pub max_rows_cap: usize,
}

impl SqlConfig {
    pub fn limits(&self) -> crate::service::sql::SqlLimits {
        crate::service::sql::SqlLimits {
            timeout: std::time::Duration::from_millis(self.timeout_ms),
            memory_bytes: self.memory_limit_mb * 1024 * 1024,
            default_max_rows: self.default_max_rows,
            max_rows_cap: self.max_rows_cap,
        }
    }
}
