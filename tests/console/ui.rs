//! The console end to end in a real headless Chromium (Debian's `chromium`,
//! driven by `playwright-core` from `ui-tests/`): sign in, find stored
//! memories, edit one and see its history, the search trace, the graph, SQL
//! with a CSV download, a job run, snapshots, and a scoped key that sees only
//! its streams. The browser steps and their checks are in
//! `ui-tests/console.mjs`; each page's screenshot is written to
//! `$CARGO_TARGET_DIR/console-screenshots/` (the README's are from there).

use std::path::PathBuf;
use std::time::Duration;

use crate::fixture::{repo_root, Daemon, Options, ADMIN_TOKEN, TOKEN_A};

fn shots_dir() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("target"));
    target.join("console-screenshots")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser() {
    let _turn = crate::serial().await;
    let tests = repo_root().join("ui-tests");
    assert!(
        tests.join("node_modules/playwright-core").is_dir(),
        "playwright-core is not installed in ui-tests/: run `bash scripts/setup-tests.sh` (just test does)"
    );
    let d = Daemon::start(Options::with_auth()).await;
    for text in [
        "Alice moved to Lisbon in March",
        "Bob works at Acme on the dashboard project",
        "I prefer Cursor over VSCode as my editor",
    ] {
        d.store(text, "a").await;
    }
    let carol = d.store("Carol keeps bees in Kent", "b").await;

    let shots = shots_dir();
    let _ = std::fs::remove_dir_all(&shots);
    let run = tokio::process::Command::new("node")
        .arg("console.mjs")
        .current_dir(&tests)
        .env("LOOMEM_URL", &d.url)
        .env("ADMIN_KEY", ADMIN_TOKEN)
        .env("SCOPED_KEY", TOKEN_A)
        .env("B_MEMORY", &carol)
        .env("SHOTS", &shots)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the browser run finishes within 5 minutes")
        .expect("node runs");
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the console checks failed:\n{log}");
    assert!(log.contains("every check passed"), "{log}");
    for page in [
        "sign-in",
        "streams",
        "memories",
        "memory",
        "search",
        "graph",
        "sql",
        "ingestion",
        "jobs",
        "snapshots",
        "scoped-key",
    ] {
        let png = std::fs::read(shots.join(format!("{page}.png")))
            .unwrap_or_else(|e| panic!("no screenshot of {page}: {e}"));
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 5_000,
            "{page}"
        );
    }

    // What the browser did is in the store: the edit made a second version.
    let rows = d
        .sql("SELECT count(*) AS n FROM chunks WHERE stream = 'a' AND content LIKE 'Alice moved to%'")
        .await;
    assert_eq!(rows[0]["n"], 2);
    d.stop().await;
}
