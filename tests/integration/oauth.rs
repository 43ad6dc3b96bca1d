//! OAuth 2.1 for remote MCP clients: the flow by hand (PKCE, redirect URIs,
//! single-use codes and refresh tokens, revocation) and a real client, the
//! official MCP Python SDK, that registers, is authorised, lists the tools
//! and stores and searches within its grant only.

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::Digest;

use crate::fixture::{repo_root, Daemon, Options, ADMIN_TOKEN, TOKEN_A, TOKEN_B};

const REDIRECT: &str = "http://127.0.0.1:9/callback";

fn challenge(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(verifier.as_bytes()))
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn register(d: &Daemon, redirect: &str) -> (u16, Value) {
    let r = d
        .http
        .post(format!("{}/oauth/register", d.url))
        .json(&json!({"client_name": "hand-rolled", "redirect_uris": [redirect]}))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn authorize_params(client: &str, verifier: &str) -> Vec<(&'static str, String)> {
    vec![
        ("response_type", "code".into()),
        ("client_id", client.into()),
        ("redirect_uri", REDIRECT.into()),
        ("state", "xyz-state".into()),
        ("code_challenge", challenge(verifier)),
        ("code_challenge_method", "S256".into()),
    ]
}

/// Approve on the consent page; the status and, on success, the code.
async fn approve(
    d: &Daemon,
    client: &str,
    verifier: &str,
    key: &str,
    role: &str,
    streams: &str,
) -> (u16, Option<String>, String) {
    let mut form = authorize_params(client, verifier);
    form.extend([
        ("api_key", key.to_string()),
        ("role", role.into()),
        ("streams", streams.into()),
    ]);
    let r = no_redirects()
        .post(format!("{}/oauth/authorize", d.url))
        .form(&form)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let location = r
        .headers()
        .get("location")
        .map(|l| l.to_str().unwrap().to_string());
    let body = r.text().await.unwrap();
    let code = location.map(|l| {
        assert!(
            l.starts_with(REDIRECT) && l.contains("state=xyz-state"),
            "{l}"
        );
        l.split("code=")
            .nth(1)
            .unwrap()
            .split('&')
            .next()
            .unwrap()
            .to_string()
    });
    (status, code, body)
}

async fn token(d: &Daemon, form: &[(&str, &str)]) -> (u16, Value) {
    let r = d
        .http
        .post(format!("{}/oauth/token", d.url))
        .form(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["cache-control"], "no-store");
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flow_checks_pkce_redirects_single_use_and_revocation() {
    let d = Daemon::start(Options::with_auth()).await;
    let (_, meta) = d
        .call_as(None, "GET", "/.well-known/oauth-authorization-server", None)
        .await;
    assert_eq!(meta["issuer"], d.url.as_str());
    assert_eq!(meta["code_challenge_methods_supported"], json!(["S256"]));
    assert_eq!(meta["token_endpoint"], format!("{}/oauth/token", d.url));
    let (_, prm) = d
        .call_as(
            None,
            "GET",
            "/.well-known/oauth-protected-resource/mcp",
            None,
        )
        .await;
    assert_eq!(prm["resource"], format!("{}/mcp", d.url));
    assert_eq!(prm["authorization_servers"], json!([d.url]));
    let r = d
        .http
        .post(format!("{}/mcp", d.url))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let www = r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        www.contains(&format!(
            r#"resource_metadata="{}/.well-known/oauth-protected-resource/mcp""#,
            d.url
        )),
        "{www}"
    );
    // The refusal leaves the body unread and the connection is closed after
    // it: the answer says so, so that no client reuses it and races the close.
    assert_eq!(r.headers()["connection"], "close");

    // Registration: loopback redirects only (by default).
    let (s, err) = register(&d, "https://evil.example/cb").await;
    assert_eq!(
        (s, err["error"].as_str()),
        (400, Some("invalid_redirect_uri")),
        "{err}"
    );
    let (s, client) = register(&d, REDIRECT).await;
    assert_eq!(s, 201, "{client}");
    assert_eq!(client["token_endpoint_auth_method"], "none");
    let client = client["client_id"].as_str().unwrap().to_string();

    // The consent page; a redirect URI not registered is never redirected to.
    let verifier = "a-verifier-of-enough-length-0123456789-abcdefghijklmnop";
    let page = d
        .http
        .get(format!("{}/oauth/authorize", d.url))
        .query(&authorize_params(&client, verifier))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let html = page.text().await.unwrap();
    assert!(
        html.contains("hand-rolled") && html.contains(r#"name="api_key""#),
        "{html}"
    );
    let mut bad = authorize_params(&client, verifier);
    bad[2].1 = "http://127.0.0.1:9/elsewhere".into();
    let r = no_redirects()
        .get(format!("{}/oauth/authorize", d.url))
        .query(&bad)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.headers().get("location").is_none());
    let mut plain = authorize_params(&client, verifier);
    plain[5].1 = "plain".into();
    let r = d
        .http
        .get(format!("{}/oauth/authorize", d.url))
        .query(&plain)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400, "PKCE S256 only");

    // The key decides what may be granted.
    assert_eq!(
        approve(&d, &client, verifier, "wrong-key", "writer", "a")
            .await
            .0,
        401
    );
    assert_eq!(
        approve(&d, &client, verifier, TOKEN_A, "admin", "").await.0,
        403
    );
    assert_eq!(
        approve(&d, &client, verifier, TOKEN_A, "writer", "b")
            .await
            .0,
        403
    );

    // A wrong verifier spends the code.
    let (s, code, _) = approve(&d, &client, verifier, TOKEN_A, "writer", "a").await;
    assert_eq!(s, 302);
    let code = code.unwrap();
    let exchange = |code: String, verifier: String| {
        let client = client.clone();
        let d = &d;
        async move {
            token(
                d,
                &[
                    ("grant_type", "authorization_code"),
                    ("code", &code),
                    ("redirect_uri", REDIRECT),
                    ("client_id", &client),
                    ("code_verifier", &verifier),
                ],
            )
            .await
        }
    };
    let (s, err) = exchange(
        code.clone(),
        "not-the-verifier-0123456789-0123456789-abcdef".into(),
    )
    .await;
    assert_eq!(
        (s, err["error"].as_str()),
        (400, Some("invalid_grant")),
        "{err}"
    );
    let (s, err) = exchange(code, verifier.into()).await;
    assert_eq!(
        (s, err["error"].as_str()),
        (400, Some("invalid_grant")),
        "a code works once: {err}"
    );

    let (_, code, _) = approve(&d, &client, verifier, TOKEN_A, "writer", "a").await;
    let (s, tokens) = exchange(code.unwrap(), verifier.into()).await;
    assert_eq!(s, 200, "{tokens}");
    assert_eq!(tokens["token_type"], "Bearer");
    let access = tokens["access_token"].as_str().unwrap().to_string();
    let refresh = tokens["refresh_token"].as_str().unwrap().to_string();
    let (_, who) = d.call_as(Some(&access), "GET", "/v1/whoami", None).await;
    assert_eq!(
        (who["role"].as_str(), who["accessible_streams"].clone()),
        (Some("writer"), json!(["a"])),
        "{who}"
    );
    let (s, _) = d
        .call_as(
            Some(&access),
            "POST",
            "/v1/store",
            Some(json!({"content": "granted write"})),
        )
        .await;
    assert_eq!(s, 200);
    let (s, _) = d
        .call_as(
            Some(&access),
            "POST",
            "/v1/store",
            Some(json!({"content": "x", "stream": "a2"})),
        )
        .await;
    assert_eq!(s, 403, "only the granted stream, not all of the key's");
    // The access token is a key an admin sees and can revoke.
    let (_, keys) = d.call("GET", "/admin/keys", None).await;
    assert!(
        keys["keys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["name"] == "oauth:hand-rolled"),
        "{keys}"
    );

    // Refresh: new tokens; the old access token and the old refresh token die.
    let (s, fresh) = token(
        &d,
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", &refresh),
            ("client_id", &client),
        ],
    )
    .await;
    assert_eq!(s, 200, "{fresh}");
    let access2 = fresh["access_token"].as_str().unwrap().to_string();
    let refresh2 = fresh["refresh_token"].as_str().unwrap().to_string();
    assert_eq!(
        d.call_as(Some(&access), "GET", "/v1/whoami", None).await.0,
        401
    );
    assert_eq!(
        d.call_as(Some(&access2), "GET", "/v1/whoami", None).await.0,
        200
    );
    let (s, err) = token(
        &d,
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", &refresh),
            ("client_id", &client),
        ],
    )
    .await;
    assert_eq!(
        (s, err["error"].as_str()),
        (400, Some("invalid_grant")),
        "{err}"
    );

    // Revocation of the refresh token ends the grant and its access token.
    let r = d
        .http
        .post(format!("{}/oauth/revoke", d.url))
        .form(&[("token", &refresh2)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        d.call_as(Some(&access2), "GET", "/v1/whoami", None).await.0,
        401
    );
    let (s, _) = token(
        &d,
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", &refresh2),
            ("client_id", &client),
        ],
    )
    .await;
    assert_eq!(s, 400);
    // An admin key may grant admin.
    let (s, _, _) = approve(&d, &client, verifier, ADMIN_TOKEN, "admin", "").await;
    assert_eq!(s, 302);
}

async fn sdk_client(d: &Daemon, key: &str, streams: &str, content: &str, query: &str) -> Value {
    let out = tokio::process::Command::new("python3")
        .arg(repo_root().join("tests/oauth/sdk_client.py"))
        .args([d.url.as_str(), key, streams, content, query])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), out)
        .await
        .expect("the SDK client finishes")
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "the MCP SDK client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_mcp_sdk_connects_with_oauth_within_its_grant() {
    let d = Daemon::start(Options::with_auth()).await;
    let first = sdk_client(
        &d,
        TOKEN_A,
        "a",
        "The red kite nests in the old oak",
        "red kite",
    )
    .await;
    assert_eq!(first["tools"].as_array().unwrap().len(), 14, "{first}");
    assert_eq!(first["stored_error"], false, "{first}");
    assert!(
        first["found"].as_str().unwrap().contains("red kite nests"),
        "{first}"
    );
    assert_eq!(first["has_refresh_token"], true);
    let second = sdk_client(
        &d,
        TOKEN_B,
        "b",
        "The blue heron fishes at dawn",
        "red kite",
    )
    .await;
    assert_ne!(second["client_id"], first["client_id"]);
    assert!(
        !second["found"].as_str().unwrap().contains("red kite"),
        "the second grant sees nothing of the first: {second}"
    );
    // Each memory is in its grant's stream.
    let rows = d
        .sql("SELECT stream, content FROM chunks ORDER BY stream")
        .await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        (rows[0]["stream"].as_str(), rows[1]["stream"].as_str()),
        (Some("a"), Some("b"))
    );
}
