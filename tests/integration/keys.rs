//! Keys made at runtime and roles: create, list, rotate, revoke and expiry,
//! honoured by a second daemon on the same data directory at its next
//! request; every route of the role table refused to a role below its need.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, ADMIN_TOKEN};

async fn create(d: &Daemon, body: Value) -> Value {
    let (s, key) = d.call("POST", "/admin/keys", Some(body)).await;
    assert_eq!(s, 201, "{key}");
    key
}

fn secret(key: &Value) -> String {
    key["secret"].as_str().expect("secret").to_string()
}

async fn status_as(d: &Daemon, token: &str, method: &str, path: &str, body: Option<Value>) -> u16 {
    d.call_as(Some(token), method, path, body).await.0
}

/// Poll until `token`'s request answers `want` (or fail after `secs`).
async fn wait_answer(d: &Daemon, token: &str, want: u16, secs: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let got = status_as(d, token, "GET", "/v1/whoami", None).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: still {got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_made_at_runtime_work_in_every_process_until_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let a = Daemon::start_at(
        &data,
        Options {
            auth: true,
            embedded: true,
            ..Default::default()
        },
    )
    .await;
    let b = Daemon::start_at(
        &data,
        Options {
            auth: true,
            embedded: true,
            ..Default::default()
        },
    )
    .await;

    let key = create(
        &a,
        json!({"name": "ci-bot", "role": "writer", "streams": ["k", "k2"]}),
    )
    .await;
    let first = secret(&key);
    assert!(first.starts_with("lmk_") && first.len() > 60, "{first}");
    assert_eq!(key["state"], "active");
    assert_eq!(key["streams"], json!(["k", "k2"]));
    let id = key["id"].as_str().unwrap().to_string();

    // The other daemon takes it at once, scoped to its streams.
    let (s, who) = b.call_as(Some(&first), "GET", "/v1/whoami", None).await;
    assert_eq!(s, 200, "{who}");
    assert_eq!(
        (who["name"].as_str(), who["role"].as_str()),
        (Some("ci-bot"), Some("writer"))
    );
    assert_eq!(who["active_stream"], "k");
    let (s, stored) = b
        .call_as(
            Some(&first),
            "POST",
            "/v1/store",
            Some(json!({"content": "kites fly in spring"})),
        )
        .await;
    assert_eq!(s, 200, "{stored}");
    assert_eq!(
        status_as(
            &b,
            &first,
            "POST",
            "/v1/store",
            Some(json!({"content": "x", "stream": "other"}))
        )
        .await,
        403
    );

    // Listed without a secret or digest, with its last use.
    let deadline = Instant::now() + Duration::from_secs(20);
    let listed = loop {
        let (s, list) = a.call("GET", "/admin/keys", None).await;
        assert_eq!(s, 200, "{list}");
        let k = list["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["id"] == id.as_str())
            .cloned()
            .unwrap();
        if k["last_used_at"].is_string() || Instant::now() > deadline {
            break k;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(listed["last_used_at"].is_string(), "{listed}");
    let text = listed.to_string();
    assert!(
        !text.contains(&first) && listed.get("secret").is_none() && listed.get("digest").is_none(),
        "{text}"
    );
    assert!(first.starts_with(listed["prefix"].as_str().unwrap()));

    // Rotation: the new secret works; the old one for its grace period only.
    let (s, rotated) = a
        .call(
            "POST",
            &format!("/admin/keys/{id}/rotate"),
            Some(json!({"grace_secs": 600})),
        )
        .await;
    assert_eq!(s, 200, "{rotated}");
    let second = secret(&rotated);
    assert_ne!(second, first);
    assert!(rotated["previous_valid_until"].is_string(), "{rotated}");
    assert_eq!(status_as(&b, &second, "GET", "/v1/whoami", None).await, 200);
    assert_eq!(
        status_as(&b, &first, "GET", "/v1/whoami", None).await,
        200,
        "within the grace period"
    );
    let (s, rotated) = a
        .call(
            "POST",
            &format!("/admin/keys/{id}/rotate"),
            Some(json!({"grace_secs": 0})),
        )
        .await;
    assert_eq!(s, 200, "{rotated}");
    let third = secret(&rotated);
    assert_eq!(
        status_as(&b, &second, "GET", "/v1/whoami", None).await,
        401,
        "no grace"
    );
    assert_eq!(status_as(&b, &first, "GET", "/v1/whoami", None).await, 401);
    assert_eq!(status_as(&b, &third, "GET", "/v1/whoami", None).await, 200);

    // Revoked on one daemon: refused by the other at its next request.
    let (s, revoked) = a.call("DELETE", &format!("/admin/keys/{id}"), None).await;
    assert_eq!(s, 200, "{revoked}");
    assert_eq!(revoked["state"], "revoked");
    assert_eq!(status_as(&b, &third, "GET", "/v1/whoami", None).await, 401);
    assert_eq!(status_as(&a, &third, "GET", "/v1/whoami", None).await, 401);
    let (s, _) = a
        .call("POST", &format!("/admin/keys/{id}/rotate"), Some(json!({})))
        .await;
    assert_eq!(s, 409, "a revoked key is not rotated back to life");

    // Expiry.
    let short = create(
        &a,
        json!({"name": "brief", "role": "reader", "streams": ["k"], "expires_in_secs": 2}),
    )
    .await;
    let short = secret(&short);
    assert_eq!(status_as(&b, &short, "GET", "/v1/whoami", None).await, 200);
    wait_answer(&b, &short, 401, 30, "an expired key").await;

    // Bad requests name the field; scoped keys cannot manage keys.
    for (body, field) in [
        (
            json!({"name": "x", "role": "owner", "streams": ["k"]}),
            "role",
        ),
        (json!({"name": "x", "role": "reader"}), "streams"),
        (
            json!({"name": "x", "role": "admin", "streams": ["k"]}),
            "streams",
        ),
        (
            json!({"name": " ", "role": "reader", "streams": ["k"]}),
            "name",
        ),
    ] {
        let (s, r) = a.call("POST", "/admin/keys", Some(body)).await;
        assert!(s == 400 || s == 422, "{s} {r}");
        assert!(r["detail"].as_str().unwrap().contains(field), "{r}");
    }
    assert_eq!(
        status_as(&a, crate::fixture::TOKEN_A, "GET", "/admin/keys", None).await,
        403
    );
    let _ = (a.stop().await, b.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_a_role_below_its_need() {
    let d = Daemon::start(Options {
        auth: true,
        embedded: true,
        ..Default::default()
    })
    .await;
    let reader =
        secret(&create(&d, json!({"name": "r", "role": "reader", "streams": ["s"]})).await);
    let writer =
        secret(&create(&d, json!({"name": "w", "role": "writer", "streams": ["s"]})).await);
    let admin = secret(&create(&d, json!({"name": "boss", "role": "admin"})).await);

    // What a reader and a writer may do in their stream.
    let id = d.store("herons stand still in the shallows", "s").await;
    let memory = format!("/v1/memories/{id}");
    let cases: [(&str, &str, &str, Option<Value>, u16); 7] = [
        (
            &reader,
            "POST",
            "/v1/search",
            Some(json!({"query": "herons"})),
            200,
        ),
        (
            &reader,
            "POST",
            "/v1/sql",
            Some(json!({"sql": "SELECT count(*) FROM chunks"})),
            200,
        ),
        (&reader, "GET", &memory, None, 200),
        (
            &reader,
            "POST",
            "/v1/store",
            Some(json!({"content": "no"})),
            403,
        ),
        (
            &reader,
            "PATCH",
            &memory,
            Some(json!({"pinned": true})),
            403,
        ),
        (
            &writer,
            "POST",
            "/v1/store",
            Some(json!({"content": "egrets too"})),
            200,
        ),
        (
            &writer,
            "PATCH",
            &memory,
            Some(json!({"pinned": true})),
            200,
        ),
    ];
    for (token, method, path, body, want) in cases {
        assert_eq!(
            status_as(&d, token, method, path, body).await,
            want,
            "{method} {path}"
        );
    }
    assert_eq!(status_as(&d, &admin, "GET", "/admin/keys", None).await, 200);
    let (_, who) = d.call_as(Some(&admin), "GET", "/v1/whoami", None).await;
    assert_eq!(who["accessible_streams"], json!(["*"]));

    // Every entry of the role table, asked by each role below its need.
    let mut checked = 0;
    for (method, route, need) in loomem::api::needs() {
        let uri = route
            .replace("{id}", "no-such-id")
            .replace("{name}", "no-such-name");
        let below: Vec<&str> = match need {
            loomem::core::Role::Admin => vec![&reader, &writer],
            loomem::core::Role::Writer => vec![&reader],
            loomem::core::Role::Reader => vec![],
        };
        for token in below {
            let (s, body) = if route.starts_with("/compat/neuroloom/") {
                d.call_token(token, method, &uri, Some(json!({}))).await
            } else {
                d.call_as(Some(token), method, &uri, Some(json!({}))).await
            };
            assert_eq!(s, 403, "{method} {route}: {body}");
            assert!(
                body["detail"].as_str().unwrap().contains("needs"),
                "{method} {route}: {body}"
            );
            checked += 1;
        }
    }
    assert!(checked > 40, "{checked}");
    let (s, _) = d
        .call_as(Some(&reader), "POST", "/mcp", Some(json!({})))
        .await;
    assert_eq!(s, 403, "MCP stores too: a reader is refused");
    // The admin's env key keeps working beside the runtime ones.
    assert_eq!(
        status_as(&d, ADMIN_TOKEN, "GET", "/admin/keys", None).await,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_manages_the_keys_a_running_daemon_honours() {
    let d = Daemon::start(Options {
        auth: true,
        embedded: true,
        ..Default::default()
    })
    .await;
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_loomem"))
            .arg("--config")
            .arg(crate::fixture::repo_root().join("config.toml"))
            .args(args)
            .env("LOOMEM_STORAGE__DATA_DIR", &d.data_dir)
            .env("LOOMEM_LOG", "error")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, out, err) = cli(&[
        "keys",
        "create",
        "--name",
        "from-cli",
        "--role",
        "reader",
        "--streams",
        "s,t",
    ]);
    assert!(ok, "{err}");
    let key: Value = serde_json::from_str(&out).unwrap();
    let token = secret(&key);
    let (s, who) = d.call_as(Some(&token), "GET", "/v1/whoami", None).await;
    assert_eq!(s, 200, "{who}");
    assert_eq!(who["accessible_streams"], json!(["s", "t"]));
    assert_eq!(who["role"], "reader");

    let (ok, out, _) = cli(&["keys", "list"]);
    assert!(ok);
    assert!(out.contains("from-cli") && !out.contains(&token), "{out}");
    let id = key["id"].as_str().unwrap();
    let (ok, _, err) = cli(&["keys", "revoke", id]);
    assert!(ok, "{err}");
    assert_eq!(status_as(&d, &token, "GET", "/v1/whoami", None).await, 401);

    let (ok, _, err) = cli(&[
        "keys",
        "create",
        "--name",
        "x",
        "--role",
        "owner",
        "--streams",
        "s",
    ]);
    assert!(!ok);
    assert!(
        err.contains("--role") && err.contains("admin, writer or reader"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_the_limit_is_a_429_with_retry_after() {
    let d = Daemon::start(
        Options {
            auth: true,
            embedded: true,
            ..Default::default()
        }
        .env("LOOMEM_SERVER__RATE_LIMIT__WRITER_PER_SEC", "0.05")
        .env("LOOMEM_SERVER__RATE_LIMIT__WRITER_BURST", "5")
        .env("LOOMEM_SERVER__RATE_LIMIT__EXPENSIVE_PER_SEC", "0.05")
        .env("LOOMEM_SERVER__RATE_LIMIT__EXPENSIVE_BURST", "2"),
    )
    .await;
    let writer =
        secret(&create(&d, json!({"name": "w", "role": "writer", "streams": ["s"]})).await);
    let other = secret(
        &create(
            &d,
            json!({"name": "w2", "role": "writer", "streams": ["s"]}),
        )
        .await,
    );

    // The expensive budget (2) runs out first, on SQL.
    let sql = Some(json!({"sql": "SELECT count(*) AS n FROM chunks"}));
    assert_eq!(
        status_as(&d, &writer, "POST", "/v1/sql", sql.clone()).await,
        200
    );
    assert_eq!(
        status_as(&d, &writer, "POST", "/v1/sql", sql.clone()).await,
        200
    );
    let resp = d
        .http
        .post(format!("{}/v1/sql", d.url))
        .bearer_auth(&writer)
        .json(&sql)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=20).contains(&retry), "{retry}");
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["detail"].as_str().unwrap().contains("expensive"),
        "{body}"
    );

    // Then the key's own budget: 5 in all, the 2 SQL queries included.
    let mut codes = Vec::new();
    for i in 0..6 {
        codes.push(
            status_as(
                &d,
                &writer,
                "POST",
                "/v1/search",
                Some(json!({"query": format!("q{i}")})),
            )
            .await,
        );
    }
    assert_eq!(codes, vec![200, 200, 200, 429, 429, 429], "{codes:?}");
    // Another key, the env admin key: their own budgets.
    assert_eq!(
        status_as(
            &d,
            &other,
            "POST",
            "/v1/search",
            Some(json!({"query": "q"}))
        )
        .await,
        200
    );
    for _ in 0..20 {
        assert_eq!(
            status_as(&d, ADMIN_TOKEN, "POST", "/v1/sql", sql.clone()).await,
            200
        );
    }
    // Counted in the status and the metrics.
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["rate_limits"]["refused_expensive"], 1, "{st}");
    assert_eq!(st["rate_limits"]["refused_normal"], 3, "{st}");
    let metrics = d
        .http
        .get(format!("{}/metrics", d.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("loomem_rate_limited_total{class=\"normal\",role=\"writer\"}"),
        "{metrics}"
    );
}
