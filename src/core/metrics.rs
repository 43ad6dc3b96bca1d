//! The daemon's Prometheus metrics (`GET /metrics`): one registry for the
//! process, as Prometheus exporters keep it, so every floor records into the
//! same families without a handle threaded through it. Events are counted
//! where they happen (a request, a stage's batch, a commit, a search, a job
//! run); levels that live elsewhere (table rows and versions, the bus's
//! pending messages) are set by `service::status::refresh_metrics` just
//! before a scrape.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Every metric the daemon exports. Names and labels are listed in the
/// README's Metrics section and used by `deploy/grafana-dashboard.json`.
pub struct Metrics {
    registry: Registry,
    /// Requests by method, matched route and status.
    pub http_requests: IntCounterVec,
    pub http_seconds: HistogramVec,
    /// Records that entered a stage, by pipeline and stage.
    pub stage_in: IntCounterVec,
    pub stage_out: IntCounterVec,
    /// Records a stage dropped, by pipeline, stage and reason.
    pub stage_dropped: IntCounterVec,
    pub stage_failed: IntCounterVec,
    /// A stage's time on one batch.
    pub stage_seconds: HistogramVec,
    /// Texts in one embedding call, by model and caller (`pipeline`, `query`).
    pub embed_batch: HistogramVec,
    pub embed_seconds: HistogramVec,
    /// Messages the bus delivered again (an earlier delivery was not acked).
    pub bus_redeliveries: IntCounter,
    /// Messages on the bus not yet delivered to the pipeline, by bus stream.
    pub bus_pending: IntGaugeVec,
    /// One pipeline commit of the chunk writer, and its rows.
    pub commit_seconds: Histogram,
    pub commit_rows: Histogram,
    /// Search time by phase: `total`, `embed`, `bm25`, `vector`, `graph`,
    /// `fetch`, `rank`.
    pub search_seconds: HistogramVec,
    /// Job runs by job and outcome (`succeeded`, `failed`).
    pub job_runs: IntCounterVec,
    pub job_seconds: HistogramVec,
    /// Requests refused by a rate limit, by role and budget (`normal`,
    /// `expensive`).
    pub rate_limited: IntCounterVec,
    /// Rows and Lance version of each table.
    pub table_rows: IntGaugeVec,
    pub table_version: IntGaugeVec,
}

/// Buckets from 100 µs to ~100 s, for every duration.
fn seconds_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.0001, 2.5, 16).expect("static buckets")
}

/// Buckets for counts of rows or texts: 1 to ~16k.
fn size_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(1.0, 2.0, 15).expect("static buckets")
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .expect("valid metric");
    registry
        .register(Box::new(h.clone()))
        .expect("unique metric");
    h
}

impl Metrics {
    fn new() -> Metrics {
        let r = Registry::new();
        let commit_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "loomem_writer_commit_seconds",
                "Time of one pipeline commit of the chunk writer",
            )
            .buckets(seconds_buckets()),
        )
        .expect("valid metric");
        let commit_rows = Histogram::with_opts(
            HistogramOpts::new(
                "loomem_writer_commit_rows",
                "Rows written by one pipeline commit",
            )
            .buckets(size_buckets()),
        )
        .expect("valid metric");
        let bus_redeliveries = IntCounter::new(
            "loomem_bus_redeliveries_total",
            "Messages delivered again because an earlier delivery was not acknowledged",
        )
        .expect("valid metric");
        for c in [
            Box::new(commit_seconds.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(commit_rows.clone()),
            Box::new(bus_redeliveries.clone()),
        ] {
            r.register(c).expect("unique metric");
        }
        Metrics {
            http_requests: counter(
                &r,
                "loomem_http_requests_total",
                "HTTP requests by method, route and status",
                &["method", "route", "status"],
            ),
            http_seconds: histogram(
                &r,
                "loomem_http_request_duration_seconds",
                "HTTP request latency by method, route and status",
                &["method", "route", "status"],
                seconds_buckets(),
            ),
            stage_in: counter(
                &r,
                "loomem_pipeline_records_in_total",
                "Records that entered a pipeline stage",
                &["pipeline", "stage"],
            ),
            stage_out: counter(
                &r,
                "loomem_pipeline_records_out_total",
                "Records a pipeline stage kept",
                &["pipeline", "stage"],
            ),
            stage_dropped: counter(
                &r,
                "loomem_pipeline_records_dropped_total",
                "Records a pipeline stage dropped, by reason",
                &["pipeline", "stage", "reason"],
            ),
            stage_failed: counter(
                &r,
                "loomem_pipeline_records_failed_total",
                "Records a pipeline stage failed",
                &["pipeline", "stage"],
            ),
            stage_seconds: histogram(
                &r,
                "loomem_pipeline_stage_seconds",
                "A pipeline stage's time on one batch",
                &["pipeline", "stage"],
                seconds_buckets(),
            ),
            embed_batch: histogram(
                &r,
                "loomem_embed_batch_size",
                "Texts in one embedding call",
                &["model", "caller"],
                size_buckets(),
            ),
            embed_seconds: histogram(
                &r,
                "loomem_embed_seconds",
                "Time of one embedding call",
                &["model", "caller"],
                seconds_buckets(),
            ),
            bus_redeliveries,
            bus_pending: gauge(
                &r,
                "loomem_bus_pending_messages",
                "Messages on the bus not yet delivered to the pipeline",
                &["stream"],
            ),
            commit_seconds,
            commit_rows,
            search_seconds: histogram(
                &r,
                "loomem_search_seconds",
                "Search time by phase (total, embed, bm25, vector, graph, fetch, rank)",
                &["phase"],
                seconds_buckets(),
            ),
            job_runs: counter(
                &r,
                "loomem_job_runs_total",
                "Job runs by job and outcome",
                &["job", "outcome"],
            ),
            job_seconds: histogram(
                &r,
                "loomem_job_duration_seconds",
                "Job run time by job and outcome",
                &["job", "outcome"],
                seconds_buckets(),
            ),
            rate_limited: counter(
                &r,
                "loomem_rate_limited_total",
                "Requests refused by a rate limit, by role and budget",
                &["role", "class"],
            ),
            table_rows: gauge(&r, "loomem_table_rows", "Rows in each table", &["table"]),
            table_version: gauge(
                &r,
                "loomem_table_version",
                "The Lance version of each table",
                &["table"],
            ),
            registry: r,
        }
    }

    /// Series that exist before their first event (so a dashboard shows 0).
    fn with_zero_series(self) -> Metrics {
        for role in ["reader", "writer", "admin"] {
            for class in ["normal", "expensive"] {
                self.rate_limited.with_label_values(&[role, class]);
            }
        }
        self
    }

    /// Every family in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into memory");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics::new().with_zero_series());
    &METRICS
}

/// Observe `elapsed` in seconds.
pub fn observe(h: &Histogram, elapsed: Duration) {
    h.observe(elapsed.as_secs_f64());
}

/// Observe a duration given in microseconds.
pub fn observe_micros(h: &Histogram, micros: u64) {
    h.observe(micros as f64 / 1e6);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_exported_once_observed() {
        let m = metrics();
        m.http_requests
            .with_label_values(&["GET", "/v1/status", "200"])
            .inc();
        m.search_seconds
            .with_label_values(&["total"])
            .observe(0.004);
        let text = m.render();
        assert!(
            text.contains("# TYPE loomem_http_requests_total counter"),
            "{text}"
        );
        assert!(
            text.contains(
                r#"loomem_http_requests_total{method="GET",route="/v1/status",status="200"}"#
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE loomem_search_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE loomem_writer_commit_seconds histogram"),
            "{text}"
        );
    }
}
