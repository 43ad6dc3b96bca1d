//! Links between memories and the graph routes that walk them: relations
//! CRUD, related memories, the N-hop neighbourhood and shortest paths, all
//! within the key's streams; a snapshot rollback takes relations back too.

use serde_json::{json, Value};

use crate::fixture::{Daemon, Options, TOKEN_A, TOKEN_B};

async fn relate(d: &Daemon, token: &str, body: Value) -> (u16, Value) {
    d.call_as(Some(token), "POST", "/v1/relations", Some(body))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relations_link_memories_and_the_graph_walks_them() {
    let d = Daemon::start(Options::with_auth()).await;
    let cause = d
        .store("The deploy failed because Postgres ran out of disk", "a")
        .await;
    let effect = d.store("The release slipped to Friday", "a").await;
    let fix = d.store("Ops added a disk alert for Postgres", "a").await;
    let lonely = d
        .store("The office plants need water on Mondays", "a")
        .await;
    let elsewhere = d.store("Another note in a2", "a2").await;
    let theirs = d.store("Bob's private plan", "b").await;

    let (s, r) = relate(
        &d,
        TOKEN_A,
        json!({"from_id": effect, "to_id": cause, "relation": "caused_by", "note": "postmortem"}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["status"], "created");
    assert_eq!(
        (r["relation"].as_str(), r["weight"].as_f64()),
        (Some("caused_by"), Some(1.0))
    );
    let rel = r["id"].as_str().unwrap().to_string();
    let (_, again) = relate(
        &d,
        TOKEN_A,
        json!({"from_id": effect, "to_id": cause, "relation": "Caused_By"}),
    )
    .await;
    assert_eq!(
        (again["status"].as_str(), again["id"].as_str()),
        (Some("exists"), Some(rel.as_str()))
    );
    let (s, r) = relate(
        &d,
        TOKEN_A,
        json!({"from_id": fix, "to_id": cause, "relation": "follows", "weight": 2.5}),
    )
    .await;
    assert_eq!(s, 200, "{r}");

    // A search can bring each result's links along.
    let q = json!({"query": "release slipped to Friday", "stream": "a", "top_k": 1});
    let (_, plain) = d
        .call_as(Some(TOKEN_A), "POST", "/v1/search", Some(q.clone()))
        .await;
    assert_eq!(plain["results"][0]["chunk_id"], effect.as_str());
    assert!(plain["results"][0].get("relations").is_none(), "{plain}");
    let mut with_links = q.clone();
    with_links["include_relations"] = json!(true);
    let (s, r) = d
        .call_as(Some(TOKEN_A), "POST", "/v1/search", Some(with_links))
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        r["results"][0]["relations"],
        json!([{"relation_id": rel, "relation": "caused_by", "direction": "outgoing", "memory_id": cause}])
    );

    // Refused: another stream's memory (as unknown), across streams, bad names.
    for (body, status, names) in [
        (
            json!({"from_id": effect, "to_id": theirs, "relation": "supports"}),
            404,
            theirs.as_str(),
        ),
        (
            json!({"from_id": effect, "to_id": elsewhere, "relation": "supports"}),
            422,
            "one stream",
        ),
        (
            json!({"from_id": effect, "to_id": effect, "relation": "supports"}),
            422,
            "itself",
        ),
        (
            json!({"from_id": effect, "to_id": cause, "relation": "no spaces"}),
            422,
            "relation",
        ),
        (
            json!({"from_id": effect, "to_id": cause, "relation": "x", "weight": 11}),
            422,
            "weight",
        ),
    ] {
        let (s, r) = relate(&d, TOKEN_A, body).await;
        assert_eq!(s, status, "{r}");
        assert!(r["detail"].as_str().unwrap().contains(names), "{r}");
    }

    // Listed by memory, both directions; the history of both ends says so.
    let (_, r) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            &format!("/v1/relations?memory_id={cause}"),
            None,
        )
        .await;
    assert_eq!(r["relations"].as_array().unwrap().len(), 2, "{r}");
    let (_, r) = d.call_as(Some(TOKEN_B), "GET", "/v1/relations", None).await;
    assert_eq!(r["relations"], json!([]), "B sees none of A's links");
    let (_, h) = d
        .call("GET", &format!("/v1/memories/{effect}/history"), None)
        .await;
    assert!(
        h.to_string().contains(&format!("caused_by → {cause}")),
        "{h}"
    );

    // Related: by link and by shared entities (Postgres).
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            &format!("/v1/memories/{cause}/related"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let linked: Vec<(&str, &str, &str)> = r["linked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["relation"].as_str().unwrap(),
                l["direction"].as_str().unwrap(),
                l["memory"]["id"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        linked,
        [
            ("follows", "incoming", fix.as_str()),
            ("caused_by", "incoming", effect.as_str())
        ]
    );
    let shared = &r["shared_entities"];
    assert_eq!(shared[0]["memory"]["id"], fix.as_str(), "{r}");
    assert!(
        shared[0]["entities"]
            .as_array()
            .unwrap()
            .contains(&json!("postgresql")),
        "{r}"
    );
    let (_, r) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            &format!("/v1/memories/{cause}/related?relation=caused_by"),
            None,
        )
        .await;
    assert_eq!(r["linked"].as_array().unwrap().len(), 1);

    // The shortest path: effect —caused_by— cause —follows— fix.
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            &format!("/v1/graph/path?from={effect}&to={fix}"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["found"], true);
    assert_eq!(r["hops"], 2, "{r}");
    let kinds: Vec<&str> = r["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["caused_by", "follows"]);
    let (_, r) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            &format!("/v1/graph/path?from={lonely}&to={cause}"),
            None,
        )
        .await;
    assert_eq!(r["found"], false, "{r}");
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            &format!("/v1/graph/path?from=entity:POSTGRES&to={effect}&stream=a"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        (r["found"].as_bool(), r["hops"].as_u64()),
        (Some(true), Some(2)),
        "{r}"
    );
    assert_eq!(
        r["nodes"][0],
        json!({"kind": "entity", "id": "postgresql", "label": "postgresql"})
    );

    // Explore: one hop from the cause reaches its links and its entities only.
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            &format!("/v1/graph/explore?from={cause}&hops=1"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let nodes: Vec<(&str, u64)> = r["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n["hops"].as_u64().unwrap()))
        .collect();
    assert_eq!(nodes[0], (cause.as_str(), 0));
    assert!(
        nodes.contains(&(effect.as_str(), 1)) && nodes.contains(&(fix.as_str(), 1)),
        "{r}"
    );
    assert!(nodes.contains(&("postgresql", 1)), "{r}");
    assert!(!nodes.iter().any(|(id, _)| *id == lonely), "{r}");
    assert!(!r["edges"].as_array().unwrap().is_empty());
    let (_, r) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            &format!("/v1/graph/explore?from={cause}&hops=3&max_nodes=2"),
            None,
        )
        .await;
    assert_eq!(
        (
            r["nodes"].as_array().unwrap().len(),
            r["truncated"].as_bool()
        ),
        (2, Some(true))
    );

    // Another stream's memory as a start is unknown; its stream refused.
    let (s, _) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            &format!("/v1/graph/explore?from={theirs}"),
            None,
        )
        .await;
    assert_eq!(s, 404);
    let (s, _) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            "/v1/graph/path?from=entity:x&to=entity:y&stream=b",
            None,
        )
        .await;
    assert_eq!(s, 403);

    // A snapshot holds the links; removing one is in the history; a
    // rollback brings it back; deleting a memory takes its links with it.
    let (s, _) = d
        .call("POST", "/v1/snapshots", Some(json!({"name": "linked"})))
        .await;
    assert_eq!(s, 201);
    let (s, r) = d
        .call_as(
            Some(TOKEN_B),
            "DELETE",
            &format!("/v1/relations/{rel}"),
            None,
        )
        .await;
    assert_eq!(s, 404, "B cannot remove A's link: {r}");
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "DELETE",
            &format!("/v1/relations/{rel}"),
            None,
        )
        .await;
    assert_eq!((s, r["deleted"].as_str()), (200, Some(rel.as_str())));
    let (_, h) = d
        .call("GET", &format!("/v1/memories/{cause}/history"), None)
        .await;
    assert!(h.to_string().contains("unrelated"), "{h}");
    let (s, _) = d.call("POST", "/v1/snapshots/linked/rollback", None).await;
    assert_eq!(s, 200);
    let (_, r) = d
        .call("GET", &format!("/v1/relations?memory_id={cause}"), None)
        .await;
    assert_eq!(r["relations"].as_array().unwrap().len(), 2, "{r}");
    let rows = d
        .sql("SELECT relation FROM relations ORDER BY relation")
        .await;
    assert_eq!(rows.len(), 2, "relations are queryable in SQL: {rows:?}");
    let (s, _) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/delete",
            Some(json!({"id": cause})),
        )
        .await;
    assert_eq!(s, 200);
    let (_, r) = d.call("GET", "/v1/relations", None).await;
    assert_eq!(r["relations"], json!([]), "links go with their memory");
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// With the `auto_relate` stage in the store pipeline, a new memory is linked
/// to its close stored neighbours, and to nothing unlike it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_relate_links_a_new_memory_to_its_neighbours() {
    let pipelines = tempfile::tempdir().unwrap();
    copy_dir(
        &crate::fixture::repo_root().join("pipelines"),
        pipelines.path(),
    );
    let store_toml = pipelines.path().join("store.toml");
    let text = std::fs::read_to_string(&store_toml).unwrap();
    let on = text
        .replace(
            "# [[stages]]\n# stage = \"auto_relate\"",
            "[[stages]]\nstage = \"auto_relate\"",
        )
        .replace("# min_similarity = 0.8", "min_similarity = 0.5")
        .replace("# max_links = 3", "max_links = 3")
        .replace("# relation = \"relates_to\"", "relation = \"relates_to\"");
    assert_ne!(on, text, "the stanza is in the shipped pipeline");
    std::fs::write(&store_toml, on).unwrap();
    let d = Daemon::start(
        Options::default().env("LOOMEM_PIPELINE__DIR", pipelines.path().to_str().unwrap()),
    )
    .await;
    let first = d
        .store("Alice's cat Miso likes tuna and naps on the sofa", "p")
        .await;
    let other = d.store("Quarterly tax filing is due in April", "p").await;
    let second = d
        .store("Alice's cat Miso naps on the sofa after tuna", "p")
        .await;

    let (_, r) = d
        .call("GET", &format!("/v1/relations?memory_id={second}"), None)
        .await;
    let links = r["relations"].as_array().unwrap();
    assert_eq!(links.len(), 1, "{r}");
    assert_eq!(
        (
            links[0]["from_id"].as_str(),
            links[0]["to_id"].as_str(),
            links[0]["relation"].as_str()
        ),
        (
            Some(second.as_str()),
            Some(first.as_str()),
            Some("relates_to")
        )
    );
    assert!(links[0]["weight"].as_f64().unwrap() >= 0.5);
    let (_, r) = d
        .call("GET", &format!("/v1/relations?memory_id={other}"), None)
        .await;
    assert_eq!(r["relations"], json!([]), "nothing unlike it: {r}");
    let (_, h) = d
        .call("GET", &format!("/v1/memories/{second}/history"), None)
        .await;
    assert!(h.to_string().contains("auto_relate"), "{h}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagerank_and_communities_of_a_streams_graph() {
    let d = Daemon::start(Options::with_auth()).await;
    let db = d.store("Postgres runs the billing service", "a").await;
    d.store("Postgres backups are cached in Redis", "a").await;
    d.store("Redis holds the session cache", "a").await;
    let trip = d.store("Alice flew to Paris for the conference", "a").await;
    d.store("Alice booked a hotel in Paris", "a").await;
    d.store("Alice took the train from Paris to Lyon", "a")
        .await;
    d.store("Bob keeps his plans in Berlin", "b").await;

    // Nothing computed yet: an empty ranking, no error.
    let (s, r) = d
        .call_as(Some(TOKEN_A), "GET", "/v1/graph/rank?stream=a", None)
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        (r["computed_at"].clone(), r["nodes"].clone()),
        (Value::Null, json!([]))
    );

    // A dry run answers and writes nothing.
    let (s, dry) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/graph/analyze",
            Some(json!({"stream": "a", "dry_run": true})),
        )
        .await;
    assert_eq!(s, 200, "{dry}");
    assert_eq!(dry["written"], false);
    assert_eq!(
        d.sql("SELECT count(*) AS n FROM graph_metrics").await[0]["n"],
        0
    );

    let (s, a) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/graph/analyze",
            Some(json!({"stream": "a"})),
        )
        .await;
    assert_eq!(s, 200, "{a}");
    assert_eq!(a["memories"], 6, "{a}");
    let entities = a["entities"].as_u64().unwrap();
    assert!(entities >= 4, "postgres, redis, alice, paris at least: {a}");
    assert_eq!(a["nodes"].as_u64().unwrap(), 6 + entities);
    assert!(a["communities"].as_u64().unwrap() >= 2, "{a}");

    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            "/v1/graph/rank?stream=a&limit=500",
            None,
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert!(r["computed_at"].is_string(), "{r}");
    let nodes = r["nodes"].as_array().unwrap();
    assert_eq!(nodes.len() as u64, 6 + entities);
    let ranks: Vec<f64> = nodes
        .iter()
        .map(|n| n["pagerank"].as_f64().unwrap())
        .collect();
    assert!(ranks.windows(2).all(|w| w[0] >= w[1]), "highest first: {r}");
    assert!(
        (ranks.iter().sum::<f64>() - 1.0).abs() < 1e-6,
        "ranks sum to 1"
    );
    // The most connected node ranks first: an entity named three times.
    let most = nodes
        .iter()
        .map(|n| n["degree"].as_i64().unwrap())
        .max()
        .unwrap();
    assert_eq!(nodes[0]["degree"], most, "{r}");
    assert_eq!(nodes[0]["kind"], "entity", "{r}");
    let community = |id: &str| {
        nodes.iter().find(|n| n["id"] == id).unwrap()["community"]
            .as_i64()
            .unwrap()
    };
    // Databases and travel share no entity: never one community.
    assert_ne!(community(&db), community(&trip));
    let (_, only) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            &format!(
                "/v1/graph/rank?stream=a&kind=memory&community={}",
                community(&trip)
            ),
            None,
        )
        .await;
    let only = only["nodes"].as_array().unwrap().clone();
    assert!(only.iter().any(|n| n["id"] == trip.as_str()), "{only:?}");
    assert!(only
        .iter()
        .all(|n| n["kind"] == "memory" && n["id"] != db.as_str()));

    let (s, c) = d
        .call_as(
            Some(TOKEN_A),
            "GET",
            "/v1/graph/communities?stream=a&min_size=1&members=100",
            None,
        )
        .await;
    assert_eq!(s, 200, "{c}");
    let groups = c["communities"].as_array().unwrap();
    assert_eq!(groups.len() as u64, a["communities"].as_u64().unwrap());
    let sizes: Vec<u64> = groups.iter().map(|g| g["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes.iter().sum::<u64>(), 6 + entities);
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "largest first: {c}");
    for g in groups {
        assert_eq!(
            g["members"].as_array().unwrap().len() as u64,
            g["size"].as_u64().unwrap()
        );
    }

    // In SQL, within the key's streams only.
    let (s, rows) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/sql",
            Some(json!({"sql": "SELECT stream, count(*) AS n FROM graph_metrics GROUP BY stream"})),
        )
        .await;
    assert_eq!(s, 200, "{rows}");
    assert_eq!(rows["rows"], json!([{"stream": "a", "n": 6 + entities}]));
    // The job does every stream; key b then sees its own rows only.
    let (s, run) = d
        .call("POST", "/admin/jobs/graph/run", Some(json!({})))
        .await;
    assert_eq!(
        (s, run["status"].as_str()),
        (200, Some("succeeded")),
        "{run}"
    );
    assert_eq!(
        run["report"]["analyses"].as_array().unwrap().len(),
        2,
        "{run}"
    );
    let (_, rows) = d
        .call_as(
            Some(TOKEN_B),
            "POST",
            "/v1/sql",
            Some(json!({"sql": "SELECT DISTINCT stream FROM graph_metrics"})),
        )
        .await;
    assert_eq!(rows["rows"], json!([{"stream": "b"}]));

    // A deleted memory's row goes with it.
    let (s, r) = d
        .call_as(
            Some(TOKEN_A),
            "POST",
            "/v1/delete",
            Some(json!({"id": trip})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let left = d
        .sql(&format!(
            "SELECT count(*) AS n FROM graph_metrics WHERE node_id = '{trip}'"
        ))
        .await;
    assert_eq!(left[0]["n"], 0);

    // Bad input names the field.
    for (path, field) in [
        ("/v1/graph/rank?kind=person", "kind"),
        ("/v1/graph/rank?limit=0", "limit"),
        ("/v1/graph/communities?members=0", "members"),
    ] {
        let (s, e) = d.call_as(Some(TOKEN_A), "GET", path, None).await;
        assert_eq!(s, 422, "{path}: {e}");
        assert!(e["detail"].as_str().unwrap().contains(field), "{path}: {e}");
    }
}
