//! Maintenance jobs through the daemon: manual runs recorded in `job_runs`,
//! compaction, decay, worker pause, and `loomem job run`.

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, TOKEN_A};

async fn run_job(d: &Daemon, name: &str, dry_run: bool) -> Value {
    let (s, run) = d
        .call(
            "POST",
            &format!("/admin/jobs/{name}/run"),
            Some(json!({ "dry_run": dry_run })),
        )
        .await;
    assert_eq!(s, 200, "{run}");
    assert_eq!(run["status"], "succeeded", "{run}");
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_merges_150_commits_and_search_is_unchanged() {
    const N: usize = 150;
    // Routine maintenance off: the job itself must merge 150 commits' fragments
    // (each commit reads every fragment, so the build-up is quadratic: 150
    // shows the merge as well as 500 did, in a tenth of the time).
    let d = Daemon::start(
        Options::embedded()
            .env("LOOMEM_STORAGE__COMPACT_EVERY_COMMITS", "0")
            .env("LOOMEM_STORAGE__MAINTENANCE_CHECK_SECS", "0"),
    )
    .await;
    // Each keeper name occurs in exactly one entry, each lamp colour in 15.
    let keeper = |i: usize| format!("keeper{}x{}", (b'a' + (i % 26) as u8) as char, i / 26);
    let colours = [
        "amber", "crimson", "indigo", "jade", "saffron", "teal", "umber", "violet", "ochre",
        "cobalt", "scarlet", "ivory", "coral", "azure", "olive", "maroon", "russet", "sepia",
        "mauve", "lilac",
    ];
    let colours = &colours[..10];
    let mut ids = Vec::new();
    for i in 0..N {
        ids.push(
            d.store(
                &format!(
                    "Lighthouse entry {i}: {} checked the {} lamp",
                    keeper(i),
                    colours[i % colours.len()]
                ),
                "c",
            )
            .await,
        );
    }
    let exact =
        |who: String| json!({"query": format!("who is {who}"), "stream": "c", "dry_run": true});
    let colour =
        json!({"query": "indigo", "stream": "c", "mode": "bm25", "top_k": 50, "dry_run": true});
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let before_exact = d.search_ids(exact(keeper(123))).await;
    assert_eq!(before_exact[0], ids[123]);
    let before_colour = sorted(d.search_ids(colour.clone()).await);
    assert_eq!(before_colour.len(), N / colours.len());
    let run = run_job(&d, "compact", false).await;
    let chunks = &run["report"]["tables"]["chunks"];
    let (b, a) = (
        chunks["fragments_before"].as_u64().unwrap(),
        chunks["fragments_after"].as_u64().unwrap(),
    );
    assert!(b >= N as u64, "{run}");
    assert!(a < 10, "fragments {b} → {a}");
    assert_eq!(chunks["rows"], N);
    // The same memories answer, now from compacted, indexed fragments.
    assert_eq!(d.search_ids(exact(keeper(123))).await[0], before_exact[0]);
    assert_eq!(sorted(d.search_ids(colour).await), before_colour);
    // The run is listed, newest first.
    let (_, runs) = d.call("GET", "/v1/jobs?job=compact", None).await;
    assert_eq!(runs["runs"][0]["id"], run["id"]);
    assert_eq!(runs["runs"][0]["trigger"], "manual");
}

/// Many single-memory writes leave every table in a handful of fragments with
/// no job run: the writer merges the chunks' small fragments as it goes, and
/// the maintainer merges the other tables'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_keeps_its_fragments_few_under_single_writes() {
    const N: usize = 120;
    let d = Daemon::start(
        Options::embedded()
            .env("LOOMEM_STORAGE__COMPACT_EVERY_COMMITS", "16")
            .env("LOOMEM_STORAGE__MAX_FRAGMENTS", "16")
            .env("LOOMEM_STORAGE__MAINTENANCE_CHECK_SECS", "1"),
    )
    .await;
    let mut ids = Vec::new();
    for i in 0..N {
        let text = format!("Ferry log {i}: captain Ines{i} sailed to Corfu with Marta");
        ids.push(d.store(&text, "f").await);
    }
    // A dry run of the compact job only reports each table's fragments.
    let fragments = |run: &Value| -> Vec<(String, u64)> {
        run["report"]["tables"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(t, r)| (t.clone(), r["fragments_before"].as_u64().unwrap()))
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let run = run_job(&d, "compact", true).await;
        let tables = fragments(&run);
        assert!(tables.iter().any(|(t, _)| t == "chunks"), "{run}");
        // At most one merge interval of fresh fragments on top of merged ones.
        if tables.iter().all(|(_, f)| *f <= 16 + 4) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fragments stay many: {tables:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // Every memory is there and found.
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["chunks"], N, "{st}");
    let hit = d
        .search_ids(json!({"query": "captain Ines77", "stream": "f", "dry_run": true}))
        .await;
    assert_eq!(hit[0], ids[77]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decay_fades_importance_by_type_and_deletes_the_expired() {
    let d = Daemon::start(Options::embedded()).await;
    let sixty_days_ago = (chrono::Utc::now() - chrono::Duration::days(60)).to_rfc3339();
    let store = |body: Value| async {
        let (s, r) = d.call("POST", "/v1/store", Some(body)).await;
        assert_eq!(s, 200, "{r}");
        r["id"].as_str().unwrap().to_string()
    };
    let general = store(json!({"content": "General note about gardening", "stream": "d", "created_at": sixty_days_ago, "importance": 1.0})).await;
    let project = store(json!({"content": "Project note about the garden shed", "stream": "d", "memory_type": "project", "created_at": sixty_days_ago, "importance": 1.0})).await;
    let pinned = store(json!({"content": "Pinned note about compost", "stream": "d", "created_at": sixty_days_ago, "pinned": true, "importance": 1.0})).await;
    let expired = store(
        json!({"content": "Expired note about tulips", "stream": "d", "expires_at": "2020-01-01"}),
    )
    .await;
    let kept = store(json!({"content": "Immutable expired note about roses", "stream": "d", "expires_at": "2020-01-01", "immutable": true})).await;
    let d = &d;
    let importance = |id: String| async move {
        let (_, r) = d
            .call(
                "POST",
                "/v1/sql",
                Some(json!({"sql": format!("SELECT importance FROM chunks WHERE id = '{id}'")})),
            )
            .await;
        r["rows"][0]["importance"].as_f64()
    };
    // (The pipeline's surprise score may have raised the stored importance.)
    let (g0, p0, pin0) = (
        importance(general.clone()).await.unwrap(),
        importance(project.clone()).await.unwrap(),
        importance(pinned.clone()).await.unwrap(),
    );
    // A dry run reports and changes nothing.
    let dry = run_job(&d, "decay", true).await;
    assert_eq!(dry["report"]["expired_deleted"], 1, "{dry}");
    assert_eq!(importance(general.clone()).await, Some(g0));
    run_job(&d, "decay", false).await;
    // One general half-life (60 d) halves it; two project half-lives quarter it.
    let g1 = importance(general.clone()).await.unwrap();
    assert!((g1 / g0 - 0.5).abs() < 0.01, "{g0} → {g1}");
    assert!((importance(project.clone()).await.unwrap() / p0 - 0.25).abs() < 0.01);
    assert_eq!(importance(pinned).await, Some(pin0));
    assert_eq!(importance(expired).await, None, "expired memory deleted");
    assert!(
        importance(kept).await.is_some(),
        "immutable memories are never changed"
    );
    // A second run right after changes (almost) nothing: decay counts from the last one.
    run_job(&d, "decay", false).await;
    assert!((importance(general).await.unwrap() - g1).abs() < 0.01);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_pause_and_jobs_are_admin_only() {
    let d = Daemon::start(Options::with_auth()).await;
    let (s, w) = d.call("GET", "/admin/workers/status", None).await;
    assert_eq!((s, w["paused"].clone()), (200, json!(false)));
    let (_, w) = d.call("POST", "/admin/workers/pause", None).await;
    assert_eq!(w, json!({"paused": true, "message": "All workers paused"}));
    let (_, w) = d.call("GET", "/admin/workers/status", None).await;
    assert_eq!(w["paused"], true);
    let (_, w) = d.call("POST", "/admin/workers/resume", None).await;
    assert_eq!(w["paused"], false);
    for (method, path) in [
        ("POST", "/admin/workers/pause"),
        ("GET", "/admin/workers/status"),
        ("GET", "/v1/jobs"),
        ("POST", "/admin/jobs/decay/run"),
    ] {
        let (s, _) = d
            .call_as(Some(TOKEN_A), method, path, Some(json!({})))
            .await;
        assert_eq!(s, 403, "{method} {path}");
        let (s, _) = d.call_as(None, method, path, Some(json!({}))).await;
        assert_eq!(s, 401, "{method} {path}");
    }
    let (s, err) = d
        .call("POST", "/admin/jobs/teleport/run", Some(json!({})))
        .await;
    assert_eq!(s, 404, "{err}");
    // A failing job is recorded as failed, with its error.
    let (s, reembed) = d
        .call(
            "POST",
            "/admin/jobs/reembed/run",
            Some(json!({"dry_run": true})),
        )
        .await;
    assert_eq!(s, 200, "{reembed}");
    assert_eq!(reembed["report"]["total_missing"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_runs_a_job_against_a_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let (config, env) =
        crate::fixture::daemon_env(&dir.path().join("data"), None, &Options::embedded());
    let out = crate::fixture::cli_ok(&config, &env, ["job", "run", "compact", "--dry-run"]).await;
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["job"], "compact");
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["dry_run"], true);
    let bad = tokio::process::Command::new(env!("CARGO_BIN_EXE_loomem"))
        .arg("--config")
        .arg(&config)
        .args(["job", "run", "teleport"])
        .envs(&env)
        .output()
        .await
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no job `teleport`"));
}
