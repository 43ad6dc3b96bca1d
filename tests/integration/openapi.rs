//! The OpenAPI description (`/openapi.json`) against the router it
//! describes, and schemathesis against the live daemon with it.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::fixture::{Daemon, Options, ADMIN_TOKEN, TOKEN_A};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_the_router_answers_is_described() {
    let d = Daemon::start(Options {
        embedded: true,
        ..Options::with_auth()
    })
    .await;
    let (s, doc) = d.call("GET", "/openapi.json", None).await;
    assert_eq!(s, 200, "{doc}");
    let described: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(|m| (m.to_uppercase(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    // What the router answers: 405 for a method a path does not have,
    // anything else for one it has (asked with a scoped key, so nothing of
    // the admin's runs).
    let mut answered = BTreeSet::new();
    let paths = loomem::api::route_paths()
        .into_iter()
        .chain(["/health"])
        // The peers' APIs are described by their own documents.
        .filter(|p| *p != "/mcp" && !p.starts_with("/compat/"));
    for path in paths {
        let uri = path.replace("{id}", "x").replace("{name}", "x");
        for method in ["GET", "POST", "DELETE", "PUT", "PATCH"] {
            let (status, _) = d.call_as(Some(TOKEN_A), method, &uri, None).await;
            if status != 405 {
                answered.insert((method.to_string(), path.to_string()));
            }
        }
    }
    assert_eq!(answered, described);
    assert_eq!(doc["openapi"], "3.1.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_error_and_no_answer_off_the_description() {
    let d = Daemon::start(Options::with_auth()).await;
    for text in [
        "I prefer Cursor over VSCode as my editor",
        "Alice moved to Lisbon in March",
    ] {
        d.store(text, "main").await;
    }
    let checks = [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
        "unsupported_method",
        "missing_required_header",
        "ignored_auth",
    ]
    .join(",");
    let scratch = tempfile::tempdir().unwrap();
    let mut run = tokio::process::Command::new("schemathesis");
    run.args([
        "run",
        &format!("{}/openapi.json", d.url),
        "--header",
        &format!("Authorization: Bearer {ADMIN_TOKEN}"),
        "--checks",
        &checks,
        "--max-examples",
        "15",
        // One worker: CPython 3.11's parser is not safe to run from two
        // threads at once, and hypothesis parses lambda sources to name its
        // strategies ("AST constructor recursion depth mismatch" on POST
        // /v1/import once, with two workers).
        "--workers",
        "1",
        "--seed",
        "20261124",
        "--request-timeout",
        "60",
    ])
    .env("NO_COLOR", "1")
    // Its cache and reports go to a temp dir, not the checkout.
    .current_dir(&scratch)
    .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(600), run.output())
        .await
        .expect("schemathesis ran past 10 minutes")
        .expect("schemathesis is installed (scripts/setup.sh)");
    let report = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    // It did exercise the API: every operation it selected, many cases.
    let count = |label: &str| -> Vec<u64> {
        report
            .lines()
            .find_map(|l| l.trim().strip_prefix(label))
            .map(|rest| {
                rest.split('/')
                    .filter_map(|n| n.trim().parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let (selected, tested) = (count("Selected:"), count("Tested:"));
    assert!(
        selected.len() == 2
            && selected[0] == selected[1]
            && tested == vec![selected[0]]
            && selected[0] >= 40,
        "{selected:?} {tested:?}\n{report}"
    );
    let generated: u64 = report
        .lines()
        .find_map(|l| l.trim().split_once(" generated,")?.0.parse().ok())
        .unwrap_or(0);
    assert!(generated > 500, "{report}");
    // And the daemon is whole after it.
    let (s, status) = d.call("GET", "/v1/status", None).await;
    assert_eq!(s, 200, "{status}");
}
