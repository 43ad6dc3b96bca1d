//! Retrieval through the real server: every search filter, bitemporal
//! `valid_at`, `as_of`, the graph leg, ranking factors (decay, feedback,
//! access), near-duplicate collapse, and the budgeted context endpoints.

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, TOKEN_A};

async fn put(d: &Daemon, body: Value) -> String {
    let (status, resp) = d.call("POST", "/v1/store", Some(body)).await;
    assert_eq!(status, 200, "{resp}");
    resp["id"].as_str().unwrap().to_string()
}

async fn search(d: &Daemon, body: Value) -> Value {
    let (status, resp) = d.call("POST", "/v1/search", Some(body)).await;
    assert_eq!(status, 200, "{resp}");
    resp
}

fn ids(resp: &Value) -> Vec<String> {
    resp["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["chunk_id"].as_str().unwrap().to_string())
        .collect()
}

/// `body` with the fields of `extra` added.
fn with(body: &Value, extra: Value) -> Value {
    let mut b = body.clone();
    b.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_filter_is_applied_before_top_k() {
    let d = Daemon::start(Options::embedded()).await;
    let pref = put(&d, json!({"content": "Alice prefers the Rust language for services", "stream": "f", "memory_type": "preference", "subject": "Alice", "confidence": 0.9})).await;
    let proj = put(&d, json!({"content": "Bob leads the Rust language migration project", "stream": "f", "memory_type": "project", "subject": "Bob", "confidence": 0.4})).await;
    let other = put(&d, json!({"content": "Carol writes the Rust language newsletter", "stream": "g", "subject": "Carol"})).await;
    // Many decoys in the same stream: a filter applied after a top-1 would empty the result.
    for i in 0..12 {
        put(&d, json!({"content": format!("Rust language note number {i} about services"), "stream": "f"})).await;
    }
    let base = json!({"query": "Rust language services", "stream": "f", "top_k": 1});
    assert_eq!(
        ids(&search(&d, with(&base, json!({"fact_type": "project"}))).await),
        vec![proj.clone()]
    );
    assert_eq!(
        ids(&search(&d, with(&base, json!({"subject": "alice"}))).await),
        vec![pref.clone()]
    );
    assert_eq!(
        ids(&search(
            &d,
            with(
                &base,
                json!({"min_confidence": 0.85, "fact_type": "preference"})
            )
        )
        .await),
        vec![pref.clone()]
    );
    assert!(ids(&search(
        &d,
        with(&base, json!({"min_confidence": 0.95, "subject": "Alice"}))
    )
    .await)
    .is_empty());
    // `entity`: the extracted entity, case-insensitively.
    assert_eq!(
        ids(&search(&d, with(&base, json!({"entity": "BOB"}))).await),
        vec![proj.clone()]
    );
    // Several types, tags (any or all), session, agent and user.
    let tagged = put(&d, json!({"content": "Rust language services run on the edge cluster", "stream": "f", "memory_type": "decision", "tags": ["infra", "edge"], "session_id": "s-9", "agent_id": "planner", "user_id": "u-1"})).await;
    let half = put(&d, json!({"content": "Rust language services moved to the infra team", "stream": "f", "tags": ["infra"]})).await;
    let mut two = ids(&search(
        &d,
        with(
            &base,
            json!({"memory_types": ["project", "decision"], "top_k": 5}),
        ),
    )
    .await);
    two.sort();
    let mut expected = vec![proj.clone(), tagged.clone()];
    expected.sort();
    assert_eq!(two, expected);
    let mut any = ids(&search(
        &d,
        with(&base, json!({"tags": ["edge", "infra"], "top_k": 5})),
    )
    .await);
    any.sort();
    let mut expected = vec![tagged.clone(), half.clone()];
    expected.sort();
    assert_eq!(any, expected);
    assert_eq!(
        ids(&search(
            &d,
            with(
                &base,
                json!({"tags": ["edge", "infra"], "tags_mode": "all", "top_k": 5})
            )
        )
        .await),
        vec![tagged.clone()]
    );
    for field in [
        json!({"session_id": "s-9"}),
        json!({"agent_id": "planner"}),
        json!({"user_id": "u-1"}),
    ] {
        assert_eq!(
            ids(&search(&d, with(&base, field)).await),
            vec![tagged.clone()]
        );
    }
    // `min_similarity` per request: 1.0 leaves the vector leg nothing exact,
    // so only BM25 can find; an impossible bar is refused.
    let (s, r) = d
        .call(
            "POST",
            "/v1/search",
            Some(with(&base, json!({"min_similarity": 1.5}))),
        )
        .await;
    assert_eq!(s, 422, "{r}");
    let vector_hits = |answer: &Value| {
        answer["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| !r["trace_info"]["legs"]["vector"].is_null())
            .count()
    };
    let loose = search(&d, with(&base, json!({"trace": true, "top_k": 3}))).await;
    assert!(vector_hits(&loose) > 0, "{loose}");
    let strict = search(
        &d,
        with(
            &base,
            json!({"min_similarity": 1.0, "trace": true, "top_k": 3}),
        ),
    )
    .await;
    assert!(
        !strict["results"].as_array().unwrap().is_empty(),
        "BM25 still finds: {strict}"
    );
    assert_eq!(
        vector_hits(&strict),
        0,
        "no vector hit passes 1.0: {strict}"
    );
    // `streams` spans several; `stream` alone never leaks another.
    let both = ids(&search(
        &d,
        json!({"query": "Rust language newsletter", "streams": ["f", "g"], "subject": "Carol"}),
    )
    .await);
    assert_eq!(both, vec![other.clone()]);
    assert!(!ids(&search(
        &d,
        json!({"query": "Rust language newsletter", "stream": "f", "top_k": 50})
    )
    .await)
    .contains(&other));
    // An aggregation question widens top_k to 30.
    let agg = search(
        &d,
        json!({"query": "how many Rust language notes", "stream": "f", "top_k": 3, "trace": true}),
    )
    .await;
    assert_eq!(agg["trace_metadata"]["top_k"], 30);
    assert!(agg["results"].as_array().unwrap().len() > 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_at_covers_only_the_validity_interval() {
    let d = Daemon::start(Options::embedded()).await;
    let lease = put(&d, json!({"content": "The office lease is at Baker Street", "stream": "v", "valid_from": "2026-01-01", "valid_until": "2026-07-01"})).await;
    let open = put(&d, json!({"content": "The office lease renews with Baker Street owners", "stream": "v", "valid_from": "2026-03-01"})).await;
    let q = json!({"query": "office lease Baker Street", "stream": "v"});
    let at = |t: &str| with(&q, json!({"valid_at": t}));
    assert!(
        ids(&search(&d, at("2025-12-31")).await).is_empty(),
        "before both"
    );
    assert_eq!(
        ids(&search(&d, at("2026-02-01")).await),
        vec![lease.clone()],
        "inside the first only"
    );
    let mut inside = ids(&search(&d, at("2026-04-01")).await);
    inside.sort();
    let mut want = vec![lease.clone(), open.clone()];
    want.sort();
    assert_eq!(inside, want, "inside both");
    // valid_until is exclusive; the open-ended one holds forever.
    assert_eq!(ids(&search(&d, at("2026-07-01")).await), vec![open.clone()]);
    assert_eq!(ids(&search(&d, json!({"query": "office lease Baker Street", "stream": "v", "valid_at": 4_102_444_800i64})).await), vec![open.clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_of_searches_the_store_as_it_was() {
    let d = Daemon::start(Options::embedded()).await;
    let first = put(
        &d,
        json!({"content": "The build server runs Jenkins", "stream": "t"}),
    )
    .await;
    let q = json!({"query": "build server Jenkins GitHub Actions", "stream": "t", "trace": true});
    let then = search(&d, q.clone()).await;
    assert_eq!(ids(&then), vec![first.clone()]);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let cut = chrono::Utc::now().to_rfc3339();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let second = put(
        &d,
        json!({"content": "The build server also runs GitHub Actions runners", "stream": "t"}),
    )
    .await;
    let (_, del) = d
        .call("POST", "/v1/delete", Some(json!({"id": first})))
        .await;
    assert_eq!(del["status"], "deleted");
    assert_eq!(ids(&search(&d, q.clone()).await), vec![second.clone()]);
    // By instant: the deleted memory is back, the later one not yet there.
    let past = search(&d, with(&q, json!({"as_of": cut}))).await;
    assert_eq!(ids(&past), vec![first.clone()]);
    let version = past["trace_metadata"]["as_of_version"].as_u64().unwrap();
    // By version number: the same state.
    assert_eq!(
        ids(&search(&d, with(&q, json!({"as_of": version}))).await),
        vec![first.clone()]
    );
    for bad in [json!(9_999_999), json!("1990-01-01"), json!(true)] {
        let (s, body) = d
            .call("POST", "/v1/search", Some(with(&q, json!({"as_of": bad}))))
            .await;
        assert_eq!(s, 422, "{bad}: {body}");
        assert!(
            body["detail"].as_str().unwrap().starts_with("as_of:"),
            "{body}"
        );
    }
    // Writes continue after time travel (the shared table handle was not checked out).
    put(
        &d,
        json!({"content": "The build server was upgraded", "stream": "t"}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_graph_leg_finds_memories_through_named_entities() {
    let d = Daemon::start(Options::embedded()).await;
    let k8s = put(
        &d,
        json!({"content": "Alice deployed the billing service to Kubernetes", "stream": "g"}),
    )
    .await;
    put(
        &d,
        json!({"content": "Lunch was great today", "stream": "g"}),
    )
    .await;
    let resp = search(
        &d,
        json!({"query": "what runs on kubernetes", "stream": "g", "mode": "graph", "trace": true}),
    )
    .await;
    assert_eq!(ids(&resp), vec![k8s.clone()], "{resp}");
    assert_eq!(resp["results"][0]["trace_info"]["legs"]["graph"]["rank"], 1);
    // In hybrid mode all three legs report.
    let hybrid = search(
        &d,
        json!({"query": "Alice Kubernetes deployment", "stream": "g", "trace": true}),
    )
    .await;
    let legs = hybrid["results"][0]["trace_info"]["legs"]
        .as_object()
        .unwrap()
        .clone();
    assert!(
        legs.contains_key("graph") && legs.contains_key("bm25"),
        "{hybrid}"
    );
    // Another stream's entities are not reachable.
    assert!(ids(&search(
        &d,
        json!({"query": "kubernetes", "stream": "other", "mode": "graph"})
    )
    .await)
    .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decay_weighs_age_by_memory_type_and_spares_pinned() {
    let d = Daemon::start(Options::embedded()).await;
    let project = put(&d, json!({"content": "Sprint goal is the payments dashboard", "stream": "d", "memory_type": "project"})).await;
    let pinned = put(&d, json!({"content": "Payments dashboard owner is Dana", "stream": "d", "memory_type": "project", "pinned": true})).await;
    let pref = put(&d, json!({"content": "Dana likes the payments dashboard dark theme", "stream": "d", "memory_type": "preference", "importance": 1.0})).await;
    let in_30_days = (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339();
    let resp = search(&d, json!({"query": "payments dashboard", "stream": "d", "trace": true, "dry_run": true, "now": in_30_days})).await;
    let factor = |id: &str| {
        resp["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["chunk_id"] == id)
            .unwrap()["trace_info"]["factors"]["decay"]
            .as_f64()
            .unwrap()
    };
    // One project half-life (30 d): 0.7 + 0.3 * 0.5; a preference (180 d) barely moves.
    assert!((factor(&project) - 0.85).abs() < 0.01, "{resp}");
    assert_eq!(factor(&pinned), 1.0);
    assert!(factor(&pref) > 0.96 && factor(&pref) < 1.0);
    // Today nothing has decayed.
    let now = search(
        &d,
        json!({"query": "payments dashboard", "stream": "d", "trace": true, "dry_run": true}),
    )
    .await;
    for r in now["results"].as_array().unwrap() {
        assert!(
            r["trace_info"]["factors"]["decay"].as_f64().unwrap() > 0.999,
            "{r}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_reorders_results_and_is_stream_scoped() {
    let d = Daemon::start(Options::with_auth().env("LOOMEM_SEARCH__ACCESS_FLUSH_MS", "100")).await;
    let a = put(
        &d,
        json!({"content": "Team standup happens at nine", "stream": "a"}),
    )
    .await;
    let b = put(
        &d,
        json!({"content": "Team standup happens at nine thirty on Fridays", "stream": "a"}),
    )
    .await;
    let q = json!({"query": "team standup nine", "stream": "a", "dry_run": true, "trace": true});
    let before = ids(&search(&d, q.clone()).await);
    let (first, second) = (before[0].clone(), before[1].clone());
    assert!([&a, &b].contains(&&first));
    for _ in 0..3 {
        let (s, fb) = d
            .call_as(
                Some(TOKEN_A),
                "POST",
                "/v1/feedback",
                Some(json!({"chunk_id": second, "usefulness": 4})),
            )
            .await;
        assert_eq!(s, 201, "{fb}");
    }
    let (_, fb) = d
        .call(
            "POST",
            "/v1/feedback",
            Some(json!({"chunk_id": first, "usefulness": 1, "harmful": true})),
        )
        .await;
    assert_eq!(fb["tally"]["harmful"], 1);
    assert!(fb["ranking_factor"].as_f64().unwrap() < 1.0);
    let after = search(&d, q.clone()).await;
    assert_eq!(ids(&after)[0], second, "{after}");
    assert!(
        (after["results"][0]["trace_info"]["factors"]["feedback"]
            .as_f64()
            .unwrap()
            - 1.3)
            .abs()
            < 1e-4
    );
    // Bad input and other streams.
    let (s, body) = d
        .call(
            "POST",
            "/v1/feedback",
            Some(json!({"chunk_id": a, "usefulness": 7})),
        )
        .await;
    assert_eq!(s, 422);
    assert!(body["detail"].as_str().unwrap().starts_with("usefulness:"));
    let hidden = put(&d, json!({"content": "Secret roadmap item", "stream": "z"})).await;
    let (s, _) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/feedback",
            Some(json!({"chunk_id": hidden, "usefulness": 4})),
        )
        .await;
    assert_eq!(s, 404);
    let (s, _) = d
        .call_as(
            None,
            "POST",
            "/v1/feedback",
            Some(json!({"chunk_id": a, "usefulness": 4})),
        )
        .await;
    assert_eq!(s, 401);
    // Every signal is a row of the `feedback` table, visible in SQL per stream.
    let (_, rows) = d.call_as(Some(TOKEN_A), "POST", "/v1/sql", Some(json!({"sql": "SELECT caller, count(*) AS n FROM feedback GROUP BY caller ORDER BY caller"}))).await;
    assert_eq!(
        rows["rows"],
        json!([{"caller": "admin", "n": 1}, {"caller": "agent-a", "n": 3}]),
        "{rows}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_count_accesses_in_buffered_batches_unless_dry_run() {
    let d = Daemon::start(Options::embedded().env("LOOMEM_SEARCH__ACCESS_FLUSH_MS", "100")).await;
    let id = put(
        &d,
        json!({"content": "The wifi password lives in the vault", "stream": "w"}),
    )
    .await;
    let q = json!({"query": "wifi password vault", "stream": "w"});
    for _ in 0..3 {
        assert_eq!(ids(&search(&d, q.clone()).await), vec![id.clone()]);
    }
    search(&d, with(&q, json!({"dry_run": true}))).await;
    let mut count = 0;
    for _ in 0..100 {
        let (_, rows) = d
            .call(
                "POST",
                "/v1/sql",
                Some(json!({"sql": "SELECT access_count, last_accessed_at FROM chunks"})),
            )
            .await;
        count = rows["rows"][0]["access_count"].as_i64().unwrap_or(0);
        if count == 3 {
            assert!(
                rows["rows"][0]["last_accessed_at"].is_string()
                    || rows["rows"][0]["last_accessed_at"].is_number(),
                "{rows}"
            );
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(count, 3, "three searches counted, the dry run not");
    let t = search(&d, with(&q, json!({"dry_run": true, "trace": true}))).await;
    assert_eq!(t["results"][0]["trace_info"]["access_count"], 3);
    assert!(
        t["results"][0]["trace_info"]["factors"]["access"]
            .as_f64()
            .unwrap()
            > 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_identical_results_collapse_into_one() {
    let d = Daemon::start(Options::embedded()).await;
    // Imports only dedupe within a pipeline batch: two imports, each
    // committed before the next, store both texts.
    for (n, (id, text)) in [
        (
            "pie-1",
            "Grandma's apple pie recipe uses cinnamon nutmeg and brown sugar",
        ),
        (
            "pie-2",
            "Grandma's apple pie recipe uses cinnamon, nutmeg and brown sugar too",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let line = json!({"id": id, "content": text}).to_string();
        let (s, r) = d
            .post_raw("/v1/import?stream=p&format=jsonl", line.into_bytes())
            .await;
        assert_eq!(s, 200, "{r}");
        let mut total = 0;
        for _ in 0..100 {
            let (_, st) = d
                .call(
                    "POST",
                    "/v1/sql",
                    Some(json!({"sql": "SELECT count(*) AS n FROM chunks WHERE stream = 'p'"})),
                )
                .await;
            total = st["rows"][0]["n"].as_i64().unwrap_or(0);
            if total == n as i64 + 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(total, n as i64 + 1, "{id} stored");
    }
    let resp = search(
        &d,
        json!({"query": "apple pie recipe", "stream": "p", "trace": true}),
    )
    .await;
    assert_eq!(resp["results"].as_array().unwrap().len(), 1, "{resp}");
    assert_eq!(resp["trace_metadata"]["dedup_removed"], 1);
}

/// The vector leg's feedback (`search.vector_feedback`): a memory that shares
/// nothing with the question but much with its best match is found through
/// the match; with the feedback off (in the config or by the request) it is
/// not, and a memory like neither stays out either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vector_feedback_finds_what_the_best_match_is_like() {
    let query = json!({"query": "zebra quokka", "stream": "v", "mode": "vector",
        "min_similarity": 0.1, "top_k": 5});
    let mut found = Vec::new();
    for feedback in ["0.35", "0"] {
        let d = Daemon::start(Options::embedded().env("LOOMEM_SEARCH__VECTOR_FEEDBACK", feedback))
            .await;
        let best = put(&d, json!({"content": "zebra quokka wombat", "stream": "v"})).await;
        let alike = put(&d, json!({"content": "wombat", "stream": "v"})).await;
        put(
            &d,
            json!({"content": "heron pelican osprey", "stream": "v"}),
        )
        .await;
        // A request can turn it off: its scores are then cosines to the query.
        let literal = search(&d, with(&query, json!({"vector_feedback": false}))).await;
        assert_eq!(ids(&literal), vec![best.clone()], "feedback {feedback}");
        found.push((ids(&search(&d, query.clone()).await), best, alike));
    }
    let (with_feedback, best, alike) = &found[0];
    assert_eq!(with_feedback, &vec![best.clone(), alike.clone()]);
    let (without, best, _) = &found[1];
    assert_eq!(without, &vec![best.clone()]);
}

/// The BM25 leg searches what the question is about: the date it names
/// (weighed by the time factor instead), the span of time it reaches back
/// over and the words that make it a question find nothing by themselves;
/// with `search.strip_question_words` and the time factor off they do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bm25_leg_searches_what_the_question_is_about() {
    let cases = [
        (
            "I bought a new air fryer for the kitchen",
            "A few days ago I ran into an old friend at a birthday party",
            "What kitchen appliance did I buy 10 days ago?",
        ),
        (
            "I attended my sister's graduation ceremony in Boston",
            "How many months have I waited? In the past three months I have called twice",
            "How many graduation ceremonies have I attended in the past three months?",
        ),
    ];
    for (strip, expect_noise) in [(true, false), (false, true)] {
        let mut opts = Options::embedded();
        if !strip {
            opts = opts
                .env("LOOMEM_SEARCH__STRIP_QUESTION_WORDS", "false")
                .env("LOOMEM_SEARCH__TIME_WEIGHT", "0")
                .env("LOOMEM_SEARCH__TIME_WEIGHT_DAY", "0");
        }
        let d = Daemon::start(opts).await;
        for (n, (about, noise, question)) in cases.iter().enumerate() {
            let stream = format!("q{n}");
            let about = put(&d, json!({"content": about, "stream": stream})).await;
            let noise = put(&d, json!({"content": noise, "stream": stream})).await;
            let found = ids(&search(
                &d,
                json!({"query": question, "stream": stream, "mode": "bm25", "dry_run": true}),
            )
            .await);
            assert!(found.contains(&about), "{question}: {found:?}");
            if strip {
                assert_eq!(found, vec![about.clone()], "{question}");
            }
            assert_eq!(
                found.contains(&noise),
                expect_noise,
                "{question} (strip {strip}): {found:?}"
            );
        }
    }
}

/// `group_sessions`: the results' conversations, each scored as its best
/// result plus `search.session_rest_weight` (0.1) times the others', best
/// first; memories outside any session are in `results` only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_group_into_sessions_on_request() {
    // Without the access boost, the same search scores alike each time.
    let d = Daemon::start(Options::embedded().env("LOOMEM_SEARCH__ACCESS_BOOST", "0")).await;
    for (session, text) in [
        (
            Some("trip"),
            "We hiked the canyon trail on the first morning",
        ),
        (Some("trip"), "The canyon trail hike took us four hours"),
        (
            Some("trip"),
            "After the hike we camped beside the canyon river",
        ),
        (
            Some("work"),
            "The quarterly canyon trail fundraiser needs a budget",
        ),
        (None, "Canyon trail maps are sold at the visitor centre"),
    ] {
        let mut body = json!({"content": text, "stream": "g"});
        if let Some(s) = session {
            body["session_id"] = json!(s);
        }
        put(&d, body).await;
    }
    let base = json!({"query": "canyon trail hike", "stream": "g", "top_k": 10});
    let plain = search(&d, base.clone()).await;
    assert!(plain.get("sessions").is_none(), "{plain}");
    let resp = search(&d, with(&base, json!({"group_sessions": true}))).await;
    let results = resp["results"].as_array().unwrap();
    assert_eq!(results.len(), 5, "{resp}");
    let sessions = resp["sessions"].as_array().unwrap();
    let names: std::collections::BTreeSet<&str> = sessions
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["trip", "work"].into_iter().collect(), "{resp}");
    let score_of = |id: &str| {
        results
            .iter()
            .find(|r| r["chunk_id"] == id)
            .map(|r| r["score_final"].as_f64().unwrap())
            .unwrap()
    };
    let mut grouped = 0;
    for s in sessions {
        let ids: Vec<&str> = s["chunk_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_str().unwrap())
            .collect();
        grouped += ids.len();
        // In the order of `results`, and scored from their scores.
        let order: Vec<usize> = ids
            .iter()
            .map(|id| results.iter().position(|r| r["chunk_id"] == *id).unwrap())
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{resp}");
        let want = score_of(ids[0]) + 0.1 * ids[1..].iter().map(|i| score_of(i)).sum::<f64>();
        assert!((s["score"].as_f64().unwrap() - want).abs() < 1e-4, "{resp}");
    }
    assert_eq!(
        grouped, 4,
        "the memory without a session is left out: {resp}"
    );
    assert!(
        sessions[0]["score"].as_f64() >= sessions[1]["score"].as_f64(),
        "{resp}"
    );
    // The sessions are ranked over `search.session_pool` (100) results
    // whatever `top_k`: asked for one result, the same sessions, scored
    // from the same memories, the ones below the top named too.
    let one = search(&d, with(&base, json!({"group_sessions": true, "top_k": 1}))).await;
    assert_eq!(one["results"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["results"][0], results[0], "{one}");
    let of = |r: &Value| -> Vec<(String, f64, Value)> {
        r["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let id = s["session_id"].as_str().unwrap().to_string();
                (id, s["score"].as_f64().unwrap(), s["chunk_ids"].clone())
            })
            .collect()
    };
    let (same, want) = (of(&one), of(&resp));
    assert_eq!(same.len(), want.len(), "{one}");
    for ((id, score, ids), (wid, wscore, wids)) in same.iter().zip(&want) {
        assert_eq!((id, ids), (wid, wids), "{one}");
        assert!((score - wscore).abs() < 1e-6, "{one}");
    }
    // The request's field is checked like any other.
    let (status, bad) = d
        .call(
            "POST",
            "/v1/search",
            Some(with(&base, json!({"group_sessions": "yes"}))),
        )
        .await;
    assert_eq!(status, 422, "{bad}");
    assert!(
        bad["detail"].as_str().unwrap().contains("group_sessions"),
        "{bad}"
    );
}
