//! `GET /metrics`: after a known workload every counter moved by what that
//! workload did, and the exposition parses as the Prometheus text format.

use std::collections::HashMap;

use prometheus_parse::{Sample, Scrape, Value as PromValue};
use serde_json::json;

use crate::fixture::{Daemon, Options, TOKEN_A};

/// One scrape, parsed: (metric name, sorted labels) → value, and the names
/// of the families it declares.
struct Metrics(
    HashMap<(String, Vec<(String, String)>), f64>,
    std::collections::HashSet<String>,
);

impl Metrics {
    async fn scrape(d: &Daemon) -> Metrics {
        let resp = d
            .http
            .get(format!("{}/metrics", d.url))
            .bearer_auth(crate::fixture::ADMIN_TOKEN)
            .send()
            .await
            .expect("scrape");
        assert_eq!(resp.status().as_u16(), 200);
        let content_type = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "{content_type}"
        );
        let text = resp.text().await.expect("body");
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .unwrap_or_else(|e| panic!("not the Prometheus text format: {e}\n{text}"));
        assert!(!scrape.samples.is_empty());
        let families = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect();
        let mut out = HashMap::new();
        for Sample {
            metric,
            labels,
            value,
            ..
        } in scrape.samples
        {
            let mut labels: Vec<(String, String)> = labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            labels.sort();
            match value {
                PromValue::Counter(v) | PromValue::Gauge(v) | PromValue::Untyped(v) => {
                    out.insert((metric, labels), v);
                }
                PromValue::Histogram(buckets) => {
                    // The parser folds `_bucket` lines into the family; the
                    // `+Inf` bucket is the count.
                    let count = buckets
                        .iter()
                        .find(|b| b.less_than.is_infinite())
                        .map(|b| b.count)
                        .unwrap_or(0.0);
                    out.insert((format!("{metric}_count"), labels), count);
                }
                PromValue::Summary(_) => {}
            }
        }
        Metrics(out, families)
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut key: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        key.sort();
        self.0.get(&(name.to_string(), key)).copied().unwrap_or(0.0)
    }

    fn has(&self, name: &str) -> bool {
        self.0.keys().any(|(n, _)| n == name)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_a_known_workload_and_parse() {
    let _turn = crate::serial().await;
    let d = Daemon::start(Options::with_auth()).await;
    let before = Metrics::scrape(&d).await;

    for i in 0..5 {
        d.store(&format!("metrics fact number {i} about apricot trees"), "m")
            .await;
    }
    let (status, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "metrics fact number 0 about apricot trees", "stream": "m"})),
        )
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("duplicate")),
        "{body}"
    );
    for q in ["apricot", "trees", "fact"] {
        let (status, _) = d
            .call(
                "POST",
                "/v1/search",
                Some(json!({"query": q, "stream": "m"})),
            )
            .await;
        assert_eq!(status, 200);
    }
    let (status, body) = d
        .call("POST", "/admin/jobs/decay/run", Some(json!({})))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = d.call("GET", "/v1/does-not-exist", None).await;
    assert_eq!(status, 404);

    let after = Metrics::scrape(&d).await;
    let moved =
        |name: &str, labels: &[(&str, &str)]| after.get(name, labels) - before.get(name, labels);

    let store = [
        ("method", "POST"),
        ("route", "/v1/store"),
        ("status", "200"),
    ];
    assert_eq!(moved("loomem_http_requests_total", &store), 6.0);
    assert_eq!(
        moved(
            "loomem_http_request_duration_seconds_count",
            &[
                ("method", "POST"),
                ("route", "/v1/store"),
                ("status", "200")
            ]
        ),
        6.0
    );
    let unmatched = [("method", "GET"), ("route", "unmatched"), ("status", "404")];
    assert_eq!(moved("loomem_http_requests_total", &unmatched), 1.0);
    // Six stores, the last a repeat of the first: dedupe drops it.
    let flow = |stage: &str| {
        let labels = [("pipeline", "store"), ("stage", stage)];
        (
            moved("loomem_pipeline_records_in_total", &labels),
            moved("loomem_pipeline_records_out_total", &labels),
        )
    };
    assert_eq!(flow("sanitize"), (6.0, 6.0));
    assert_eq!(flow("dedupe"), (6.0, 5.0));
    assert_eq!(flow("write"), (5.0, 5.0));
    assert_eq!(
        moved(
            "loomem_pipeline_records_dropped_total",
            &[
                ("pipeline", "store"),
                ("stage", "dedupe"),
                ("reason", "duplicate")
            ]
        ),
        1.0
    );
    assert!(
        moved(
            "loomem_pipeline_stage_seconds_count",
            &[("pipeline", "store"), ("stage", "embed")]
        ) >= 1.0
    );
    assert!(
        moved(
            "loomem_embed_batch_size_count",
            &[("model", "hash-384"), ("caller", "pipeline")]
        ) >= 1.0
    );
    assert_eq!(
        moved(
            "loomem_embed_batch_size_count",
            &[("model", "hash-384"), ("caller", "query")]
        ),
        3.0,
        "three new queries, each embedded once"
    );
    assert!(moved("loomem_writer_commit_seconds_count", &[]) >= 1.0);
    for phase in ["total", "bm25", "vector", "graph", "rank"] {
        assert_eq!(
            moved("loomem_search_seconds_count", &[("phase", phase)]),
            3.0,
            "{phase}"
        );
    }
    let decay = [("job", "decay"), ("outcome", "succeeded")];
    assert_eq!(moved("loomem_job_runs_total", &decay), 1.0);
    assert_eq!(moved("loomem_job_duration_seconds_count", &decay), 1.0);
    assert_eq!(after.get("loomem_table_rows", &[("table", "chunks")]), 5.0);
    assert!(after.get("loomem_table_version", &[("table", "chunks")]) >= 1.0);
    assert!(after.has("loomem_bus_pending_messages"));
    assert!(after.has("loomem_bus_redeliveries_total"));

    // The shipped Grafana dashboard asks only for families the daemon exports.
    let dashboard =
        std::fs::read_to_string(crate::fixture::repo_root().join("deploy/grafana-dashboard.json"))
            .expect("deploy/grafana-dashboard.json");
    let names = regex::Regex::new(r"loomem_[a-z_]+").unwrap();
    let mut asked = 0;
    for m in names.find_iter(&dashboard) {
        let name = m.as_str();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| after.1.contains(*f)))
            .unwrap_or(name);
        assert!(
            after.1.contains(family),
            "the dashboard asks for {name}, which is not exported"
        );
        asked += 1;
    }
    assert!(asked >= 15, "{asked}");

    // Daemon-wide numbers: an admin's only.
    let (status, body) = d.call_as(Some(TOKEN_A), "GET", "/metrics", None).await;
    assert_eq!(status, 403, "{body}");
    assert!(body["detail"].is_string());
    let (status, _) = d.call_as(None, "GET", "/metrics", None).await;
    assert_eq!(status, 401);
    d.stop().await;
}
