//! Branches of a stream: made by copying its memories, written and searched
//! as a stream of their own, compared with the base, merged back (append,
//! then mirror) and dropped; within the key's streams; and Memoria's branch
//! API with checkout on top.

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, TOKEN_A, TOKEN_B};

async fn a(d: &Daemon, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    d.call_as(Some(TOKEN_A), method, path, body).await
}

fn contents(list: &Value) -> Vec<String> {
    let mut out: Vec<String> = list
        .as_array()
        .expect("a list")
        .iter()
        .map(|m| m["content"].as_str().expect("content").to_string())
        .collect();
    out.sort();
    out
}

async fn current(d: &Daemon, stream: &str) -> Vec<String> {
    let (s, l) = a(
        d,
        "GET",
        &format!("/v1/memories?stream={stream}&limit=500"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{l}");
    contents(&l["memories"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_is_copied_changed_compared_merged_and_dropped() {
    let d = Daemon::start(Options::with_auth()).await;
    let mut ids = Vec::new();
    for text in [
        "The staging database is Postgres 16",
        "Deploys happen on Tuesdays",
        "The team uses Grafana for dashboards",
    ] {
        let (s, r) = a(
            &d,
            "POST",
            "/v1/store",
            Some(json!({"content": text, "stream": "a"})),
        )
        .await;
        assert_eq!(s, 200, "{r}");
        ids.push(r["id"].as_str().unwrap().to_string());
    }
    let (s, r) = a(
        &d,
        "POST",
        "/v1/relations",
        Some(json!({"from_id": ids[0], "to_id": ids[1], "relation": "relates_to"})),
    )
    .await;
    assert_eq!(s, 200, "{r}");

    // Bad names, a branch of nothing, another key's stream.
    let (s, e) = a(
        &d,
        "POST",
        "/v1/branches",
        Some(json!({"name": "no spaces", "stream": "a"})),
    )
    .await;
    assert_eq!(s, 422, "{e}");
    let (s, e) = a(
        &d,
        "POST",
        "/v1/branches",
        Some(json!({"name": "x", "stream": "a2"})),
    )
    .await;
    assert_eq!(s, 409, "an empty stream has nothing to branch: {e}");
    let (s, _) = d
        .call_as(
            Some(TOKEN_B),
            "POST",
            "/v1/branches",
            Some(json!({"name": "x", "stream": "a"})),
        )
        .await;
    assert_eq!(s, 403);

    // Make it: every memory copied, with its links and entities.
    let (s, b) = a(
        &d,
        "POST",
        "/v1/branches",
        Some(json!({"name": "exp", "stream": "a"})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(
        (b["stream"].as_str(), b["memories"].as_u64()),
        (Some("a~exp"), Some(3)),
        "{b}"
    );
    let (s, e) = a(
        &d,
        "POST",
        "/v1/branches",
        Some(json!({"name": "exp", "stream": "a"})),
    )
    .await;
    assert_eq!(s, 409, "{e}");
    assert_eq!(current(&d, "a~exp").await, current(&d, "a").await);
    let (_, rel) = a(&d, "GET", "/v1/relations?stream=a~exp", None).await;
    assert_eq!(
        rel["relations"].as_array().unwrap().len(),
        1,
        "links copied: {rel}"
    );
    let (_, found) = a(
        &d,
        "POST",
        "/v1/search",
        Some(json!({"query": "Grafana dashboards", "stream": "a~exp", "top_k": 1})),
    )
    .await;
    let copy = found["results"][0]["chunk_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!ids.contains(&copy), "the branch holds copies: {found}");
    let (_, g) = a(&d, "GET", "/v1/graph/entity/Grafana?stream=a~exp", None).await;
    assert_eq!(
        g["chunk_ids"],
        json!([copy]),
        "the branch has its own entity graph: {g}"
    );
    let (_, l) = a(&d, "GET", "/v1/memories?limit=500", None).await;
    assert_eq!(
        l["total"], 3,
        "a listing of the key's streams leaves branches out: {l}"
    );

    // Work in the branch: add, change, remove; the base does not move.
    a(
        &d,
        "POST",
        "/v1/store",
        Some(json!({"content": "On-call rotates every Monday", "stream": "a~exp"})),
    )
    .await;
    let (_, found) = a(
        &d,
        "POST",
        "/v1/search",
        Some(json!({"query": "Deploys Tuesdays", "stream": "a~exp", "top_k": 1})),
    )
    .await;
    let deploys = found["results"][0]["chunk_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, e) = a(
        &d,
        "PATCH",
        &format!("/v1/memories/{deploys}"),
        Some(json!({"content": "Deploys happen on Thursdays"})),
    )
    .await;
    assert_eq!(s, 200, "{e}");
    let (s, _) = a(&d, "POST", "/v1/delete", Some(json!({"id": copy}))).await;
    assert_eq!(s, 200);
    assert_eq!(current(&d, "a").await.len(), 3);

    let (s, diff) = a(&d, "GET", "/v1/branches/exp/diff?stream=a", None).await;
    assert_eq!(s, 200, "{diff}");
    assert_eq!(
        contents(&diff["added"]),
        vec!["On-call rotates every Monday"],
        "{diff}"
    );
    assert_eq!(
        diff["changed"][0]["base"]["content"], "Deploys happen on Tuesdays",
        "{diff}"
    );
    assert_eq!(
        diff["changed"][0]["branch"]["content"],
        "Deploys happen on Thursdays"
    );
    assert_eq!(
        contents(&diff["removed"]),
        vec!["The team uses Grafana for dashboards"]
    );
    assert_eq!(diff["conflicts"], json!([]));
    let (_, list) = a(&d, "GET", "/v1/branches?stream=a", None).await;
    assert_eq!(list["branches"][0]["memories"], 3, "{list}");
    assert!(list["branches"][0]["created_at"].is_string(), "{list}");

    // Merge: a dry run changes nothing; append brings additions and changes.
    let (s, dry) = a(
        &d,
        "POST",
        "/v1/branches/exp/merge",
        Some(json!({"stream": "a", "dry_run": true})),
    )
    .await;
    assert_eq!(s, 200, "{dry}");
    assert_eq!(
        (
            dry["added"].as_array().unwrap().len(),
            dry["changed"].as_array().unwrap().len()
        ),
        (1, 1),
        "{dry}"
    );
    assert_eq!(current(&d, "a").await.len(), 3);
    let (s, m) = a(
        &d,
        "POST",
        "/v1/branches/exp/merge",
        Some(json!({"stream": "a", "strategy": "append"})),
    )
    .await;
    assert_eq!(s, 200, "{m}");
    assert_eq!(m["removed"], json!([]), "{m}");
    assert_eq!(
        current(&d, "a").await,
        vec![
            "Deploys happen on Thursdays",
            "On-call rotates every Monday",
            "The staging database is Postgres 16",
            "The team uses Grafana for dashboards"
        ]
    );
    let (_, h) = a(&d, "GET", &format!("/v1/memories/{}/history", ids[1]), None).await;
    assert!(h.to_string().contains("merged from branch `exp`"), "{h}");
    let (_, again) = a(&d, "GET", "/v1/branches/exp/diff?stream=a", None).await;
    assert_eq!(
        (again["added"].clone(), again["changed"].clone()),
        (json!([]), json!([])),
        "merged once: {again}"
    );
    let (_, m) = a(
        &d,
        "POST",
        "/v1/branches/exp/merge",
        Some(json!({"stream": "a", "strategy": "mirror"})),
    )
    .await;
    assert_eq!(m["removed"].as_array().unwrap().len(), 1, "{m}");
    assert_eq!(current(&d, "a").await, current(&d, "a~exp").await);
    let (s, _) = a(
        &d,
        "POST",
        "/v1/branches/exp/merge",
        Some(json!({"stream": "a", "strategy": "rebase"})),
    )
    .await;
    assert_eq!(s, 422);

    // Another key reaches none of it.
    for (method, path, body) in [
        ("GET", "/v1/branches?stream=a", None),
        ("GET", "/v1/branches/exp/diff?stream=a", None),
        (
            "POST",
            "/v1/branches/exp/merge",
            Some(json!({"stream": "a"})),
        ),
        ("DELETE", "/v1/branches/exp?stream=a", None),
        ("GET", "/v1/memories?stream=a~exp", None),
        (
            "POST",
            "/v1/store",
            Some(json!({"content": "x", "stream": "a~exp"})),
        ),
    ] {
        let (s, e) = d.call_as(Some(TOKEN_B), method, path, body).await;
        assert_eq!(s, 403, "{method} {path}: {e}");
    }

    // Drop it.
    let (s, dropped) = a(&d, "DELETE", "/v1/branches/exp?stream=a", None).await;
    assert_eq!(s, 200, "{dropped}");
    assert_eq!(
        dropped["deleted_count"], 4,
        "every row, the edited copy's old version too: {dropped}"
    );
    assert!(current(&d, "a~exp").await.is_empty());
    assert_eq!(current(&d, "a").await.len(), 3);
    let (s, _) = a(&d, "GET", "/v1/branches/exp/diff?stream=a", None).await;
    assert_eq!(s, 404);
    let (_, list) = a(&d, "GET", "/v1/branches?stream=a", None).await;
    assert_eq!(list["branches"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memorias_branches_check_out_diff_merge_and_delete() {
    let d = Daemon::start(Options::with_auth()).await;
    let m = |method: &'static str, path: &'static str, body: Option<Value>| {
        let d = &d;
        async move {
            d.call_as(
                Some(TOKEN_A),
                method,
                &format!("/compat/memoria{path}"),
                body,
            )
            .await
        }
    };
    m(
        "POST",
        "/v1/memories",
        Some(json!({"content": "The staging database is Postgres 16"})),
    )
    .await;
    let (s, b) = m("POST", "/v1/branches", Some(json!({"name": "trial"}))).await;
    assert_eq!(s, 201, "{b}");
    let (_, list) = m("GET", "/v1/branches", None).await;
    assert_eq!(
        list["branches"][0],
        json!({"name": "main", "active": true}),
        "{list}"
    );
    assert_eq!(list["branches"][1]["name"], "trial");

    // Checked out, the key's Memoria calls work in the branch.
    let (s, co) = m("POST", "/v1/branches/trial/checkout", None).await;
    assert_eq!(s, 200, "{co}");
    let (s, stored) = m(
        "POST",
        "/v1/memories",
        Some(json!({"content": "We are trying CockroachDB"})),
    )
    .await;
    assert_eq!(s, 201, "{stored}");
    let (_, items) = m("GET", "/v1/memories", None).await;
    assert_eq!(
        contents(&items["items"]),
        vec![
            "The staging database is Postgres 16",
            "We are trying CockroachDB"
        ],
        "{items}"
    );
    let (_, list) = m("GET", "/v1/branches", None).await;
    assert_eq!(list["branches"][1]["active"], true, "{list}");
    let (s, _) = m("POST", "/v1/branches/nope/checkout", None).await;
    assert_eq!(s, 404);

    // Back on main: the branch's memory is not there until merged.
    m("POST", "/v1/branches/main/checkout", None).await;
    let (_, items) = m("GET", "/v1/memories", None).await;
    assert_eq!(
        contents(&items["items"]),
        vec!["The staging database is Postgres 16"]
    );
    let (_, diff) = m("GET", "/v1/branches/trial/diff", None).await;
    assert_eq!(
        contents(&diff["added"]),
        vec!["We are trying CockroachDB"],
        "{diff}"
    );
    let (s, merged) = m(
        "POST",
        "/v1/branches/trial/merge",
        Some(json!({"strategy": "append"})),
    )
    .await;
    assert_eq!(s, 200, "{merged}");
    let (_, items) = m("GET", "/v1/memories", None).await;
    assert_eq!(items["items"].as_array().unwrap().len(), 2, "{items}");
    let (s, _) = m("DELETE", "/v1/branches/trial", None).await;
    assert_eq!(s, 200);
    let (_, list) = m("GET", "/v1/branches", None).await;
    assert_eq!(list["branches"].as_array().unwrap().len(), 1, "{list}");
    // Another key sees no branch of this one's.
    let (_, theirs) = d
        .call_as(Some(TOKEN_B), "GET", "/compat/memoria/v1/branches", None)
        .await;
    assert_eq!(theirs["branches"].as_array().unwrap().len(), 1, "{theirs}");
}
