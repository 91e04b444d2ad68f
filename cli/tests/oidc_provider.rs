//! `lattice` against a real OpenID provider: `oidc-provider` (the certified Node.js implementation,
//! `tests/oidc/idp.mjs`, installed from the npm registry) issuing RS256 JWT access tokens with standard
//! claims only (`preferred_username`, `groups`, `scope`; no `tenant`, no `roles`). The runtime finds
//! the IdP's keys through its discovery document; `lattice login` runs the device flow and the
//! manual paste flow (authorization code with PKCE) while the test plays the user's browser; the IdP rotates its signing key; tokens live a few seconds, so a
//! stream outlives its token.

use lattice_testkit::process::Proc;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Access tokens live this long (seconds).
const TTL: u64 = 6;

fn idp_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oidc")
}

/// Installs the IdP's locked dependencies when they are missing. False (the test is skipped) where
/// Node.js or npm is missing, except under CI, which must have them.
fn idp_installed() -> bool {
    let dir = idp_dir();
    if dir.join("node_modules/oidc-provider/package.json").exists() {
        return true;
    }
    let npm = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(&dir)
        .status();
    match npm {
        Ok(s) if s.success() => true,
        other => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must have Node.js and npm to install oidc-provider ({other:?})"
            );
            eprintln!("skipped: npm could not install oidc-provider ({other:?})");
            false
        }
    }
}

/// The IdP on a free loopback port: its process and issuer URL.
fn start_idp(log: &Path) -> (Proc, String) {
    let port = lattice_testkit::http::free_port();
    let mut child = Command::new("node")
        .arg(idp_dir().join("idp.mjs"))
        .args(["serve", &port.to_string(), &TTL.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("node runs");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let proc = Proc(child);
    let ready = rx.recv_timeout(Duration::from_secs(30));
    assert_eq!(
        ready.as_deref(),
        Ok("ready"),
        "the IdP did not start: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    (proc, format!("http://127.0.0.1:{port}"))
}

fn lattice_cmd(endpoint: &str, home: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lattice"));
    c.args(args)
        .env("LATTICE_ENDPOINT", endpoint)
        .env("LATTICE_TENANT", "physics")
        .env("HOME", home)
        .env_remove("LATTICE_TOKEN");
    c
}

fn lattice(endpoint: &str, home: &Path, args: &[&str]) -> Output {
    lattice_cmd(endpoint, home, args).output().expect("lattice runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `lattice ARGS` with its standard streams piped, and what it printed on stderr up to the first
/// line `until` picks (returned too).
fn spawn_until(
    endpoint: &str,
    home: &Path,
    args: &[&str],
    until: impl Fn(&str) -> Option<String>,
) -> (
    std::process::Child,
    BufReader<std::process::ChildStderr>,
    String,
    String,
) {
    let mut child = lattice_cmd(endpoint, home, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lattice login runs");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut shown = String::new();
    let picked = loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "lattice login showed no address: {shown}"
        );
        shown.push_str(&line);
        if let Some(p) = until(&line) {
            break p;
        }
    };
    (child, err, shown, picked)
}

/// The IdP's browser (`idp.mjs MODE URL LOGIN`): its output.
fn browser(mode: &str, url: &str, login: &str) -> String {
    let o = Command::new("node")
        .arg(idp_dir().join("idp.mjs"))
        .args([mode, url, login])
        .output()
        .expect("node runs");
    assert!(o.status.success(), "the browser's sign-in failed: {}", text(&o.stderr));
    text(&o.stdout)
}

/// `lattice login` (device flow) while the user signs in as `login` in a browser: the IdP's
/// `approve` opens the verification URL the CLI printed, confirms the code and signs in.
fn login(endpoint: &str, home: &Path, login: &str, scope: &str) -> Output {
    let (child, _err, shown, url) = spawn_until(endpoint, home, &["login", "--scope", scope], |line| {
        let u = line.trim().strip_prefix("(or open ")?.strip_suffix(')')?;
        Some(u.to_string())
    });
    assert!(shown.contains("enter the code"), "{shown}");
    browser("approve", &url, login);
    let out = child.wait_with_output().unwrap();
    Output {
        stderr: [shown.into_bytes(), out.stderr].concat(),
        ..out
    }
}

/// `lattice login --flow manual` while the user signs in as `login` in a browser elsewhere: the
/// IdP's `authorize` opens the address the CLI printed, signs in, and gives back the address the
/// browser was sent to, which `edit` may change before it is pasted into the CLI.
fn manual_login(endpoint: &str, home: &Path, login: &str, edit: impl Fn(String) -> String) -> Output {
    use std::io::Write;
    let (mut child, mut err, mut shown, url) = spawn_until(endpoint, home, &["login", "--flow", "manual"], |line| {
        line.starts_with("http").then(|| line.trim().to_string())
    });
    assert!(url.contains("code_challenge_method=S256"), "PKCE: {url}");
    let sent_to = browser("authorize", &url, login).trim().to_string();
    assert!(
        sent_to.starts_with("http://127.0.0.1/lattice/callback?") && sent_to.contains("code="),
        "{sent_to}"
    );
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", edit(sent_to)).unwrap();
    drop(stdin);
    std::io::Read::read_to_string(&mut err, &mut shown).unwrap();
    let out = child.wait_with_output().unwrap();
    Output {
        stderr: [shown.into_bytes(), out.stderr].concat(),
        ..out
    }
}

/// The cached login of `endpoint` in `home`.
fn cached(home: &Path, endpoint: &str) -> serde_json::Value {
    let all: serde_json::Value =
        serde_json::from_slice(&std::fs::read(home.join(".config/lattice/tokens.json")).unwrap()).unwrap();
    all[endpoint].clone()
}

/// The JSON of a JWT's header and claims.
fn jwt_parts(token: &str) -> (serde_json::Value, serde_json::Value) {
    use base64::Engine;
    let part = |i: usize| {
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.split('.').nth(i).unwrap())
            .unwrap();
        serde_json::from_slice(&raw).unwrap()
    };
    (part(0), part(1))
}

fn http_agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

#[test]
fn lattice_login_against_a_real_openid_provider() {
    if !idp_installed() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("lattice-oidc-provider-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (_idp, issuer) = start_idp(&dir.join("idp.log"));
    // The site's rules: the user from preferred_username, the tenant from the `tenant:` group; the
    // role from the token's scopes, else User.
    let cfg = lattice_runtime::RuntimeConfig::parse(
        "oidc.yaml",
        &format!(
            "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 2\ncycle: 100ms\n\
             auth:\n  mode: jwt\n  issuer: {issuer}\n  audience: lattice\n  client_id: lattice\n  jwks_refresh_min_s: 1\n  \
             claims:\n    user_claim: preferred_username\n    tenant_claim: groups\n    tenant_prefix: 'tenant:'\n",
            dir.display()
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let running = rt.block_on(lattice_runtime::start(cfg, true)).unwrap();
    let ep = format!("http://{}", running.rest_addr);
    let alice = dir.join("alice");
    let run = |args: &[&str]| lattice(&ep, &alice, args);

    // Not logged in: refused.
    assert!(text(&run(&["status"]).stderr).contains("Not logged in"));

    // The device flow with the real IdP: the code shown, the user signs in, the tokens cached.
    let o = login(&ep, &alice, "alice", "openid offline_access");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains(&format!("Logged in to {ep}")),
        "{}",
        text(&o.stdout)
    );
    let entry = cached(&alice, &ep);
    assert!(entry["refresh_token"].is_string(), "{entry}");
    let (header, claims) = jwt_parts(entry["access_token"].as_str().unwrap());
    assert_eq!(
        (header["alg"].as_str(), header["kid"].as_str()),
        (Some("RS256"), Some("key-1"))
    );
    // Standard claims only: no custom tenant or roles claim.
    assert_eq!(claims["iss"], issuer.as_str());
    assert_eq!(claims["aud"], "lattice");
    assert!(
        claims.get("tenant").is_none() && claims.get("roles").is_none(),
        "{claims}"
    );

    // Mapped to user alice of tenant physics.
    let o = run(&["submit", "--nodes=1", "--walltime=10m", "--", "sleep", "30"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let id = text(&o.stdout).trim().to_string();
    let o = run(&["status", &id, "-o", "json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["user"].as_str(), v["tenant"].as_str()),
        (Some("alice"), Some("physics")),
        "{v}"
    );
    // A User: an operator's command is refused, and nothing was drained.
    let o = run(&["node", "drain", "sim-000"]);
    assert!(
        !o.status.success() && text(&o.stderr).contains("403"),
        "{}",
        text(&o.stderr)
    );
    let o = run(&["nodes", "-o", "json"]);
    assert!(!text(&o.stdout).contains("drain"), "{}", text(&o.stdout));

    // A stream outlives its token: the server ends it when the token expires ...
    let started = Instant::now();
    let token = lattice_cli_token(&ep, &alice);
    let url = format!("{ep}/v1/allocations/{id}/logs/stream");
    let mut r = http_agent()
        .get(&url)
        .header("Authorization", format!("Bearer {token}"))
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body = r.body_mut().read_to_string().unwrap_or_default();
    assert!(
        body.contains("event: error") && body.contains("token expired"),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(TTL + 5),
        "{:?}",
        started.elapsed()
    );
    // ... and `lattice logs --follow`, whose token expires on the way, renews it and follows to the
    // allocation's end.
    let following = Instant::now();
    let o = run(&["logs", "--follow", &id]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        following.elapsed() > Duration::from_secs(TTL),
        "the stream outlived no token"
    );
    let o = run(&["status", &id, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["state"], "completed", "the follow ended before the allocation: {v}");

    // The IdP rotates its signing key: the next refreshed token names a key the runtime does not
    // know yet; it fetches the IdP's keys again and accepts it.
    let mut r = http_agent()
        .post(&format!("{issuer}/_test/rotate"))
        .send_empty()
        .unwrap();
    let rotated: serde_json::Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(rotated["signing_kid"], "key-2");
    expire_cached(&alice, &ep);
    let o = run(&["status"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let (header, _) = jwt_parts(cached(&alice, &ep)["access_token"].as_str().unwrap());
    assert_eq!(header["kid"], "key-2");

    // Scopes map to roles: olga asks for `operator` and drains a node.
    let olga = dir.join("olga");
    let o = login(&ep, &olga, "olga", "openid offline_access operator");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = lattice(&ep, &olga, &["node", "drain", "sim-000"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = lattice(&ep, &olga, &["nodes", "-o", "json"]);
    assert!(text(&o.stdout).contains("drain"), "{}", text(&o.stdout));

    // The manual paste flow: the address the browser was sent to, pasted back, is exchanged for
    // tokens (PKCE); a pasted address of another login (its state changed) is refused and nothing
    // is cached.
    let manual_home = dir.join("alice-manual");
    let o = manual_login(&ep, &manual_home, "alice", |u| u.replace("state=", "state=x"));
    assert!(
        !o.status.success() && text(&o.stderr).contains("belongs to another login"),
        "{}",
        text(&o.stderr)
    );
    assert!(
        !manual_home.join(".config/lattice/tokens.json").exists(),
        "nothing cached"
    );
    let o = manual_login(&ep, &manual_home, "alice", |u| u);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains(&format!("Logged in to {ep}")),
        "{}",
        text(&o.stdout)
    );
    let entry = cached(&manual_home, &ep);
    assert!(entry["refresh_token"].is_string(), "{entry}");
    let (_, claims) = jwt_parts(entry["access_token"].as_str().unwrap());
    assert!(
        claims.get("tenant").is_none() && claims.get("roles").is_none(),
        "{claims}"
    );
    let o = lattice(&ep, &manual_home, &["status", &id, "-o", "json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["user"], "alice", "{v}");

    // Logout revokes the refresh token at the IdP: it no longer gives tokens.
    let refresh = cached(&alice, &ep)["refresh_token"].as_str().unwrap().to_string();
    let o = run(&["logout"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = http_agent()
        .post(&format!("{issuer}/token"))
        .send_form([
            ("grant_type", "refresh_token"),
            ("refresh_token", &refresh),
            ("client_id", "lattice"),
        ])
        .unwrap();
    assert_eq!(r.status().as_u16(), 400, "a revoked refresh token still works");
    assert!(text(&run(&["status"]).stderr).contains("Not logged in"));
    rt.block_on(running.shutdown());
}

/// A fresh access token of the cached login (any `lattice` command refreshes one about to expire).
fn lattice_cli_token(ep: &str, home: &Path) -> String {
    let o = lattice(ep, home, &["status"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    cached(home, ep)["access_token"].as_str().unwrap().to_string()
}

/// Marks the cached access token expired (the next command refreshes it).
fn expire_cached(home: &Path, ep: &str) {
    let path = home.join(".config/lattice/tokens.json");
    let mut all: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    all[ep]["expires_at"] = serde_json::json!(0);
    std::fs::write(&path, serde_json::to_vec_pretty(&all).unwrap()).unwrap();
}
