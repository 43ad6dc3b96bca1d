//! What agents load before they work: context packs, ambient snippets, the
//! profile, the MEMORY.md proposal, and the entity graph endpoints.

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, TOKEN_A};

/// A stream with preferences, decisions, projects and a recent event.
async fn seed(d: &Daemon, stream: &str) {
    let mut items = vec![
        json!({"content": "User prefers dark mode in every editor", "memory_type": "preference"}),
        json!({"content": "User prefers tea over coffee in the morning", "memory_type": "preference"}),
        json!({"content": "User decided to migrate the dashboard to Svelte", "memory_type": "decision"}),
        json!({"content": "User works as a data engineer at Acme", "memory_type": "fact", "importance": 1.5}),
        json!({"content": "The dashboard project deadline is April 15", "memory_type": "project"}),
        json!({"content": "User flew to Lisbon for a conference yesterday", "memory_type": "event"}),
    ];
    for i in 0..24 {
        items.push(json!({"content": format!("Dashboard note {i}: the chart widget {i} needs a refactor of its data loader and tests")}));
    }
    for mut item in items {
        item["stream"] = json!(stream);
        let (s, r) = d.call("POST", "/v1/store", Some(item)).await;
        assert_eq!(s, 200, "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_packs_never_exceed_the_budget() {
    let d = Daemon::start(Options::embedded()).await;
    seed(&d, "c").await;
    let mut previous_total = 0;
    for budget in [30, 120, 400, 4000] {
        let (s, pack) = d
            .call(
                "POST",
                "/v1/context-pack",
                Some(
                    json!({"query": "dashboard migration", "stream": "c", "budget_tokens": budget}),
                ),
            )
            .await;
        assert_eq!(s, 200, "{pack}");
        let context = pack["context"].as_str().unwrap();
        let total = pack["total_tokens"].as_u64().unwrap() as usize;
        assert!(total <= budget, "{budget}: {total}");
        // The one tokenizer used everywhere agrees with the reported count.
        assert_eq!(loomem::core::tokens::count(context), total);
        assert!(total >= previous_total, "a larger budget never holds less");
        previous_total = total;
        let sources = pack["sources"].as_array().unwrap();
        for src in sources {
            let section = src["section"].as_str().unwrap();
            assert!(pack["sections_included"]
                .as_array()
                .unwrap()
                .contains(&json!(section)));
        }
        let mut ids: Vec<&str> = sources
            .iter()
            .map(|s| s["chunk_id"].as_str().unwrap())
            .collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "a memory appears once");
        if budget == 120 {
            assert!(
                !pack["sections_truncated"].as_array().unwrap().is_empty(),
                "{pack}"
            );
        }
        if budget == 4000 {
            // Everything fits: all three sections, nothing cut.
            assert_eq!(
                pack["sections_included"],
                json!(["profile", "relevant", "recent"]),
                "{pack}"
            );
            assert_eq!(pack["sections_truncated"], json!([]));
            assert!(
                context.contains("- User decided to migrate the dashboard to Svelte"),
                "{context}"
            );
            // Every memory once: stable facts in the profile, the project
            // deadline and the event among the relevant or recent ones.
            assert_eq!(sources.len(), 30);
            assert!(
                context.starts_with("## Profile\n- User prefers"),
                "{context}"
            );
        }
    }
    // One section asked for: it gets the whole budget.
    let (_, only) = d
        .call("POST", "/v1/context-pack", Some(json!({"query": "dashboard", "stream": "c", "budget_tokens": 300, "sections": ["relevant"]})))
        .await;
    assert_eq!(only["sections_included"], json!(["relevant"]));
    assert!(
        only["total_tokens"].as_u64().unwrap() > 150,
        "unused shares flow to relevant: {only}"
    );
    // Without a query, no relevant section; profile and recent share the budget.
    let (_, noq) = d
        .call(
            "POST",
            "/v1/context-pack",
            Some(json!({"stream": "c", "budget_tokens": 500})),
        )
        .await;
    assert_eq!(
        noq["sections_included"],
        json!(["profile", "recent"]),
        "{noq}"
    );
    for (body, field) in [
        (json!({"budget_tokens": 0}), "budget_tokens:"),
        (json!({"sections": ["gossip"]}), "sections:"),
        (json!({"budget_tokens": "lots"}), "budget_tokens"),
    ] {
        let (s, err) = d.call("POST", "/v1/context-pack", Some(body)).await;
        assert_eq!(s, 422, "{err}");
        assert!(err["detail"].as_str().unwrap().starts_with(field), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambient_snippets_are_plain_and_budgeted() {
    let d = Daemon::start(Options::embedded()).await;
    seed(&d, "am").await;
    for (body, budget) in [
        (
            json!({"query": "what does the user drink", "stream": "am", "budget_tokens": 40}),
            40,
        ),
        (json!({"stream": "am"}), 250),
    ] {
        let (s, a) = d.call("POST", "/v1/ambient", Some(body)).await;
        assert_eq!(s, 200, "{a}");
        let snippets = a["snippets"].as_array().unwrap();
        assert!(!snippets.is_empty() && snippets.len() <= 8, "{a}");
        let texts: Vec<&str> = snippets
            .iter()
            .map(|s| s["text"].as_str().unwrap())
            .collect();
        assert!(texts
            .iter()
            .all(|t| !t.contains('\n') && !t.starts_with('#')));
        assert_eq!(
            loomem::core::tokens::count(&texts.join("\n")),
            a["total_tokens"].as_u64().unwrap() as usize
        );
        assert!(a["total_tokens"].as_u64().unwrap() as usize <= budget);
    }
    let (_, a) = d
        .call(
            "POST",
            "/v1/ambient",
            Some(json!({"query": "tea or coffee", "stream": "am", "budget_tokens": 40})),
        )
        .await;
    assert!(
        a["snippets"][0]["text"].as_str().unwrap().contains("tea"),
        "{a}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_profile_is_cached_until_the_stream_changes() {
    let d = Daemon::start(Options::embedded()).await;
    seed(&d, "pr").await;
    let (s, p) = d.call("GET", "/v1/profile?stream=pr", None).await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(p["cached"], false);
    let stable = p["stable_facts"].as_array().unwrap();
    assert!(stable.len() <= 30 && !stable.is_empty());
    // Lasting truths only: the event and the project deadline are not among them.
    let stable_text: Vec<&str> = stable
        .iter()
        .map(|f| f["content"].as_str().unwrap())
        .collect();
    assert!(stable_text.iter().any(|t| t.contains("dark mode")));
    assert!(!stable_text
        .iter()
        .any(|t| t.contains("Lisbon") || t.contains("April 15")));
    // Preferences (importance 2) rank above plain notes.
    assert!(
        stable_text[..4].iter().any(|t| t.contains("dark mode")),
        "{stable_text:?}"
    );
    let recent = p["recent_context"].as_array().unwrap();
    assert_eq!(recent.len(), 15, "capped at 15");
    assert_eq!(p["summary_source"], "extractive");
    assert!(
        p["summary"].as_str().unwrap().starts_with("30 memories"),
        "{p}"
    );

    let (_, again) = d
        .call("GET", "/v1/profile?stream=pr&format=markdown", None)
        .await;
    assert_eq!(again["cached"], true);
    assert!(again["markdown"]
        .as_str()
        .unwrap()
        .starts_with("# Profile\n"));
    // A write to the stream ends the cached profile; one elsewhere does not.
    d.store("Some other stream's note", "elsewhere").await;
    let (_, still) = d.call("GET", "/v1/profile?stream=pr", None).await;
    assert_eq!(still["cached"], true);
    d.store(
        "User prefers mechanical keyboards with brown switches",
        "pr",
    )
    .await;
    let (_, fresh) = d.call("GET", "/v1/profile?stream=pr", None).await;
    assert_eq!(fresh["cached"], false);
    assert!(fresh["stable_facts"]
        .to_string()
        .contains("mechanical keyboards"));
    let (s, err) = d
        .call("GET", "/v1/profile?stream=pr&format=yaml", None)
        .await;
    assert_eq!(s, 422, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_md_groups_the_best_memories_by_kind() {
    let d = Daemon::start(Options::embedded()).await;
    seed(&d, "md").await;
    let (s, md) = d
        .call(
            "GET",
            "/v1/generate-memory-md?stream=md&max_chunks=10",
            None,
        )
        .await;
    assert_eq!(s, 200, "{md}");
    let proposal = md["proposal"].as_str().unwrap();
    assert!(proposal.starts_with("# Memory\n"));
    let prefs = proposal
        .split("## Preferences\n")
        .nth(1)
        .expect("a preferences section");
    assert!(prefs.starts_with("- User prefers"), "{proposal}");
    assert!(proposal.contains("## Decisions\n- User decided to migrate the dashboard to Svelte"));
    assert_eq!(md["metadata"]["chunks_considered"], 10);
    assert_eq!(
        md["metadata"]["sections"].as_u64().unwrap() as usize,
        proposal.matches("\n## ").count()
    );
    let (s, _) = d
        .call("GET", "/v1/generate-memory-md?max_chunks=banana", None)
        .await;
    assert_eq!(s, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_endpoints_show_an_entity_its_neighbours_and_totals() {
    let d = Daemon::start(Options::with_auth()).await;
    let first = d
        .store("Alice uses Cursor for the billing service", "a")
        .await;
    let second = d
        .store("The billing service of Alice runs on Kubernetes", "a")
        .await;
    d.store("Bob uses Cursor too", "b").await;

    let (s, e) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            "/v1/graph/entity/alice?stream=a",
            None,
        )
        .await;
    assert_eq!(s, 200, "{e}");
    assert_eq!(e["entity"]["name"], "Alice");
    assert_eq!(e["entity"]["chunk_count"], 2);
    assert_eq!(e["chunk_ids"], json!([second, first]), "newest first");
    let neighbours: Vec<(String, String)> = e["neighbors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["entity"].as_str().unwrap().to_string(),
                n["direction"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(neighbours.iter().any(|(n, _)| n == "Cursor"), "{e}");
    assert!(neighbours.iter().any(|(n, _)| n == "Kubernetes"), "{e}");
    let uses = e["neighbors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["relation"] == "uses")
        .cloned();
    if let Some(u) = uses {
        assert_eq!(u["direction"], "outgoing", "{u}");
    }
    // Per stream: Bob lives in b only; the scoped token cannot read b.
    let (s, _) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/graph/entity/bob?stream=a", None)
        .await;
    assert_eq!(s, 404);
    let (s, _) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/graph/entity/bob?stream=b", None)
        .await;
    assert_eq!(s, 403);
    let (s, err) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/graph/entity/alice", None)
        .await;
    assert_eq!(s, 422);
    assert!(
        err["detail"].as_str().unwrap().starts_with("stream:"),
        "{err}"
    );

    let (s, mine) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/graph/stats", None)
        .await;
    assert_eq!(s, 200, "{mine}");
    let (_, all) = d.call("GET", "/v1/graph/stats", None).await;
    let n = |v: &Value, k: &str| v[k].as_f64().unwrap();
    assert!(n(&mine, "total_entities") >= 3.0, "{mine}");
    assert!(
        n(&all, "total_entities") > n(&mine, "total_entities"),
        "{all} vs {mine}"
    );
    assert!(n(&mine, "total_edges") >= 1.0);
    assert!(n(&mine, "avg_chunks_per_entity") >= 1.0);
    let (s, _) = d.call_as(None, "GET", "/v1/graph/stats", None).await;
    assert_eq!(s, 401);
}
