//! The bench-recall runner on a small LongMemEval-format set: haystacks go
//! through the real import pipeline into fresh streams, questions are searched
//! in each mode, rankings are scored with the official metrics.

use loomem::app::config::Config;
use loomem::app::Engine;
use loomem::bench_recall::run::{run, Keys, Roles, RunOptions, SessionRank};
use serde_json::json;

use crate::fixture::{daemon_env, Options};
use crate::llm_stub::stub_llm;

fn dataset() -> String {
    let turn = |role: &str, content: &str| json!({"role": role, "content": content});
    let evidence = json!({"role": "user", "content": "I adopted a greyhound named Pixel from the shelter last month", "has_answer": true});
    json!([
        {
            "question_id": "q-pet", "question_type": "single-session-user",
            "question": "What is the name of the greyhound I adopted?", "answer": "Pixel",
            "question_date": "2023/06/10 (Sat) 09:00",
            "haystack_session_ids": ["s-bread", "s-pet", "s-paris", "s-dup"],
            "haystack_dates": ["2023/05/01 (Mon) 10:00", "2023/05/02 (Tue) 10:00", "2023/05/03 (Wed) 10:00", "2023/05/04 (Thu) 10:00"],
            "haystack_sessions": [
                [turn("user", "Can you give me a recipe for banana bread?"), turn("assistant", "Sure: mash three ripe bananas and mix them with flour, sugar and butter.")],
                [evidence.clone(), turn("assistant", "Congratulations on adopting your new dog!")],
                [turn("user", "What is the weather like in Paris in spring?"), turn("assistant", "Mild, with some rain.")],
                [evidence]
            ],
            "answer_session_ids": ["s-pet", "s-dup"]
        },
        {
            "question_id": "q-car_abs", "question_type": "single-session-user",
            "question": "What colour is my car?", "answer": "unknown",
            "question_date": "2023/06/10 (Sat) 09:00",
            "haystack_session_ids": ["s-tea"],
            "haystack_dates": ["2023/05/05 (Fri) 10:00"],
            "haystack_sessions": [[turn("user", "I drink green tea every morning")]],
            "answer_session_ids": []
        },
        {"question_id": "broken"}
    ])
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_ingests_searches_and_scores_each_question() {
    let dir = tempfile::tempdir().unwrap();
    let (path, env) = daemon_env(&dir.path().join("data"), None, &Options::embedded());
    let engine = Engine::start(Config::load(&path, &env).unwrap(), &env)
        .await
        .unwrap();
    let (questions, skipped) = loomem::bench_recall::load(&dataset()).unwrap();
    assert_eq!(questions.len(), 2);
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].0, 2);

    let mut seen = Vec::new();
    let opts = RunOptions::default();
    let report = run(&engine, &questions, &opts, |done, total| {
        seen.push((done, total))
    })
    .await
    .unwrap();
    assert_eq!(seen, vec![(1, 2), (2, 2)]);
    assert_eq!(report.questions, 2);
    assert_eq!(report.results.len(), 6);
    // User turns only: four in the first haystack, one in the second.
    assert_eq!(report.turns_ingested, 5);

    for mode in ["bm25", "vector", "hybrid"] {
        let r = report
            .results
            .iter()
            .find(|r| r.question_id == "q-pet" && r.mode == mode)
            .unwrap();
        // The evidence turn is told twice; the duplicate is stored once and
        // stands for both sessions, so all evidence is found at k = 3.
        assert_eq!(r.turn[&1].recall_any, 1.0, "{mode}: {r:?}");
        assert_eq!(r.session[&1].recall_any, 1.0, "{mode}: {r:?}");
        assert_eq!(r.session[&3].recall_all, 1.0, "{mode}: {r:?}");
        assert!(r.session[&3].ndcg_any > 0.99, "{mode}: {r:?}");
        assert!(r.latency_us > 0);
        let summary = &report.modes[mode];
        assert_eq!(summary.session.questions, 1, "abstention is left out");
        assert!(summary.latency_us_p50 > 0);
        let abs = report
            .results
            .iter()
            .find(|r| r.question_id == "q-car_abs" && r.mode == mode)
            .unwrap();
        assert!(abs.abstention && abs.session.is_empty());
    }
    let md = loomem::bench_recall::run::markdown(&report);
    assert!(
        md.contains("| bm25 | session | recall_any | 1.000 |"),
        "{md}"
    );
    assert!(md.contains("| hybrid | single-session-user | 1 |"), "{md}");

    // Each question's stream is removed after it is scored.
    assert_eq!(
        engine
            .store
            .count(&loomem::store::Filter::new())
            .await
            .unwrap(),
        0
    );

    // Indexing every role stores the assistant turns too.
    let all = run(
        &engine,
        &questions,
        &RunOptions {
            roles: Roles::All,
            modes: vec!["bm25".into()],
            ..opts
        },
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(all.turns_ingested, 8);
    assert_eq!(all.keys_sent, 0);

    // Sessions ranked where their first turn is found (`--sessions turns`)
    // rather than grouped: the duplicate still stands for both sessions.
    let by_turns = run(
        &engine,
        &questions,
        &RunOptions {
            session_rank: SessionRank::Turns,
            modes: vec!["bm25".into()],
            ..RunOptions::default()
        },
        |_, _| {},
    )
    .await
    .unwrap();
    let pet = by_turns
        .results
        .iter()
        .find(|r| r.question_id == "q-pet")
        .unwrap();
    assert_eq!(pet.session[&3].recall_all, 1.0, "{pet:?}");

    // Fact keys: the rule extractor's facts of each user turn are stored
    // beside it and count for it; a turn is scored once, at the rank of the
    // first memory that stands for it.
    let keyed = run(
        &engine,
        &questions,
        &RunOptions {
            keys: Keys::Facts,
            modes: vec!["hybrid".into()],
            candidates: true,
            ..RunOptions::default()
        },
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(keyed.turns_ingested, 5, "keys are not turns");
    assert!(keyed.keys_sent >= 1, "{}", keyed.keys_sent);
    let pet = &keyed.candidates[0];
    let rows = pet["candidates"].as_array().unwrap();
    let fact = rows
        .iter()
        .find(|c| {
            let text = c["content"].as_str().unwrap();
            text.starts_with("user: User ") && text.contains("greyhound")
        })
        .unwrap_or_else(|| panic!("no fact key among {rows:?}"));
    assert!(
        fact["turns"]
            .as_array()
            .unwrap()
            .contains(&json!("s-pet_1")),
        "{fact}"
    );
    let pet_rows = rows
        .iter()
        .filter(|c| c["turns"].as_array().unwrap().contains(&json!("s-pet_1")))
        .count();
    assert_eq!(pet_rows, 2, "the turn and its key: {rows:?}");
    assert_eq!(pet["corpus_turns"], 4);
    let r = keyed
        .results
        .iter()
        .find(|r| r.question_id == "q-pet")
        .unwrap();
    assert_eq!(r.turn[&1].recall_any, 1.0, "{r:?}");
    // The evidence turn and its key are one turn: the ideal ranking is met.
    assert!((r.turn[&3].ndcg_any - 1.0).abs() < 1e-9, "{r:?}");
    assert!(r.turn[&3].ndcg_any <= 1.0 + 1e-9);
    assert_eq!(r.session[&3].recall_all, 1.0, "{r:?}");
    engine.shutdown().await;
}

/// The shipped set: generated from the shipped ingredients, and as the issue
/// asks — at least 60 questions over the six types plus abstention, haystacks of
/// at least 30 sessions holding their evidence.
#[test]
fn the_shipped_dataset_is_its_ingredients_generated_and_complete() {
    let root = crate::fixture::repo_root().join("datasets/recall");
    let ingredients: loomem::bench_recall::gen::Ingredients =
        serde_json::from_str(&std::fs::read_to_string(root.join("ingredients.json")).unwrap())
            .unwrap();
    let shipped = std::fs::read_to_string(root.join("loomem_recall_s30.json")).unwrap();
    let generated = loomem::bench_recall::gen::generate(&ingredients, 30, 7).unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&shipped).unwrap(),
        serde_json::Value::Array(generated),
        "regenerate with `loomem bench-recall gen --ingredients datasets/recall/ingredients.json --sessions 30 --seed 7 --out datasets/recall/loomem_recall_s30.json`"
    );
    let (questions, skipped) = loomem::bench_recall::load(&shipped).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    assert!(questions.len() >= 60, "{}", questions.len());
    for t in loomem::bench_recall::QUESTION_TYPES {
        assert!(
            questions
                .iter()
                .any(|q| q.question_type == *t && !q.abstention),
            "no {t} question"
        );
    }
    assert!(questions.iter().filter(|q| q.abstention).count() >= 5);
    for q in &questions {
        let sessions = q.sessions();
        assert!(
            sessions.len() >= 30,
            "{}: {} sessions",
            q.id,
            sessions.len()
        );
        if !q.abstention {
            assert!(!q.answer_sessions.is_empty(), "{} has no evidence", q.id);
            assert!(
                q.answer_sessions.iter().all(|s| sessions.contains(s)),
                "{}",
                q.id
            );
            assert!(
                !q.answer_turns().is_empty(),
                "{} has no has_answer turn",
                q.id
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_qa_mode_answers_from_the_retrieved_memories_and_judges_by_type() {
    let llm = stub_llm().await;
    llm.answer(
        "bench_answer",
        &json!({"answer": "Your greyhound is called Pixel."}).to_string(),
    );
    llm.answer("bench_judgement", &json!({"correct": true}).to_string());
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::embedded()
        .env("LOOMEM_LLM__BASE_URL", &llm.url)
        .env("LOOMEM_LLM__MODEL", "stub-chat-1")
        .env("LOOMEM_LLM__NER", "false")
        .env("LOOMEM_LLM__JUDGE_CONTRADICTIONS", "false");
    let (path, env) = daemon_env(&dir.path().join("data"), None, &opts);
    let engine = Engine::start(Config::load(&path, &env).unwrap(), &env)
        .await
        .unwrap();
    let (questions, _) = loomem::bench_recall::load(&dataset()).unwrap();
    let report = run(
        &engine,
        &questions,
        &RunOptions {
            modes: vec!["bm25".into(), "hybrid".into()],
            qa: true,
            ..RunOptions::default()
        },
        |_, _| {},
    )
    .await
    .unwrap();
    // One answer and one verdict per question, on the hybrid search only.
    assert_eq!(report.qa["overall"].judged, 2, "{:?}", report.qa);
    assert_eq!(report.qa["overall"].correct, 2);
    assert_eq!(report.qa["single-session-user"].judged, 1);
    assert_eq!(report.qa["abstention"].judged, 1);
    let answers = llm.requests_for("bench_answer");
    assert_eq!(answers.len(), 2);
    let prompt = answers[0]["messages"][1]["content"].as_str().unwrap();
    assert!(
        prompt.contains("greyhound named Pixel")
            && prompt.contains("Question: What is the name of the greyhound"),
        "{prompt}"
    );
    let judged = llm.requests_for("bench_judgement");
    let abstention = judged[1]["messages"][1]["content"].as_str().unwrap();
    assert!(abstention.contains("cannot be answered"), "{abstention}");
    assert!(abstention.contains("Model response: Your greyhound is called Pixel."));
    let with_qa: Vec<_> = report.results.iter().filter(|r| r.qa.is_some()).collect();
    assert!(with_qa.iter().all(|r| r.mode == "hybrid"));
    assert!(loomem::bench_recall::run::markdown(&report).contains("| overall | 2 | 2 | 1.000 |"));
    engine.shutdown().await;

    // Without an LLM the QA mode is refused up front.
    let dir = tempfile::tempdir().unwrap();
    let (path, env) = daemon_env(&dir.path().join("data"), None, &Options::embedded());
    let plain = Engine::start(Config::load(&path, &env).unwrap(), &env)
        .await
        .unwrap();
    let err = run(
        &plain,
        &questions,
        &RunOptions {
            qa: true,
            ..RunOptions::default()
        },
        |_, _| {},
    )
    .await
    .err()
    .unwrap();
    assert!(err.to_string().contains("[llm]"), "{err}");
    plain.shutdown().await;
}

/// `loomem bench-recall run` stores the haystacks in a scratch directory
/// beside its results and removes it: the configured data directory (a
/// daemon's own store) is never written, and two runs at once do not share
/// a store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_run_keeps_out_of_the_configured_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (config, env) = daemon_env(&data, None, &Options::embedded());
    let file = dir.path().join("set.json");
    std::fs::write(&file, dataset()).unwrap();
    let out_dir = dir.path().join("results");
    let args: Vec<std::ffi::OsString> = vec![
        "bench-recall".into(),
        "run".into(),
        file.into(),
        "--modes".into(),
        "hybrid".into(),
        "--out".into(),
        out_dir.clone().into(),
    ];
    crate::fixture::cli_ok(&config, &env, args).await;
    let written: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let report = written
        .iter()
        .find(|f| f.starts_with("recall-") && f.ends_with(".json"))
        .unwrap_or_else(|| panic!("no report written: {written:?}"));
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join(report)).unwrap()).unwrap();
    assert_eq!(doc["sessions"], "grouped", "how sessions were ranked");
    assert!(
        !written.iter().any(|f| f.starts_with(".data-")),
        "the scratch store is removed: {written:?}"
    );
    assert!(
        !data.join("chunks.lance").exists(),
        "the configured data directory holds no tables"
    );

    // An unknown key kind or session reading is refused, naming the flag,
    // before anything runs.
    for (flag, value, why) in [
        (
            "--keys",
            "sentences",
            "--keys sentences: must be none or facts",
        ),
        (
            "--sessions",
            "pages",
            "--sessions pages: must be grouped or turns",
        ),
    ] {
        let refused = tokio::process::Command::new(env!("CARGO_BIN_EXE_loomem"))
            .arg("--config")
            .arg(&config)
            .args(["bench-recall", "run"])
            .arg(dir.path().join("set.json"))
            .args([flag, value, "--out"])
            .arg(dir.path().join("refused"))
            .envs(&env)
            .output()
            .await
            .unwrap();
        assert!(!refused.status.success());
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains(why), "{stderr}");
        assert!(!dir.path().join("refused").exists(), "nothing was written");
    }
}
