//! The audit log's seven-year cold tier, against a real S3-compatible server (moto's standalone
//! server, started on loopback): a real `lattice-runtime` with `services.archive` moves audit
//! entries past its hot window to write-once objects and drops them from the quorum's state; a
//! query reaching back reads them from the bucket, the chain verifying across archive and held
//! log; after a SIGKILL and restart the archived entries are read back unchanged; an object changed
//! in the bucket makes the chain not valid; a backup and a session recording are archived beside
//! them, byte for byte, never replaced.

mod common;
use common::{Proc, call, free_port, runtime_process_env, wait_until};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const BUCKET: &str = "sensitive-audit";
const CREDS: [(&str, &str); 2] = [("ARCHIVE_KEY", "testing"), ("ARCHIVE_SECRET", "testing")];

/// moto's S3 server on `port` (installed by `.ci/run` from PyPI).
fn moto(port: u16, log: &Path) -> Proc {
    let out = std::fs::File::create(log).unwrap();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("moto_server runs (`pip install 'moto[server]'`; .ci/run installs it)");
    let p = Proc(child);
    wait_until("moto's S3 server", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    p
}

/// A signed request URL for the bucket (moto checks the signature's form, not the secret).
fn signed(port: u16, action: impl FnOnce(&rusty_s3::Bucket, &rusty_s3::Credentials) -> String) -> String {
    let bucket = rusty_s3::Bucket::new(
        format!("http://127.0.0.1:{port}").parse().unwrap(),
        rusty_s3::UrlStyle::Path,
        BUCKET,
        "us-east-1",
    )
    .unwrap();
    action(&bucket, &rusty_s3::Credentials::new("testing", "testing"))
}

const FOR: Duration = Duration::from_secs(60);

/// The bucket's object at `key`.
fn object(port: u16, key: &str) -> Vec<u8> {
    use rusty_s3::S3Action;
    let url = signed(port, |b, c| b.get_object(Some(c), key).sign(FOR).to_string());
    ureq::get(&url).call().unwrap().body_mut().read_to_vec().unwrap()
}

/// Replaces the object at `key` (what the archive never does; an intruder might).
fn overwrite(port: u16, key: &str, bytes: &[u8]) {
    use rusty_s3::S3Action;
    let url = signed(port, |b, c| b.put_object(Some(c), key).sign(FOR).to_string());
    ureq::put(&url).send(bytes).unwrap();
}

/// Keys under `prefix` in the bucket.
fn keys(port: u16, prefix: &str) -> Vec<String> {
    use rusty_s3::S3Action;
    let url = signed(port, |b, c| {
        let mut l = b.list_objects_v2(Some(c));
        l.with_prefix(prefix);
        l.sign(FOR).to_string()
    });
    let xml = ureq::get(&url).call().unwrap().body_mut().read_to_string().unwrap();
    rusty_s3::actions::ListObjectsV2::parse_response(&xml)
        .unwrap()
        .contents
        .into_iter()
        .map(|c| c.key)
        .collect()
}

fn raft_status(base: &str) -> Value {
    call("GET", &format!("{base}/v1/admin/raft/status"), None).1
}

/// Every entry of the log, as (seq, hash), and whether the answer's chain verified.
fn whole_log(base: &str) -> (Vec<(u64, String)>, bool) {
    let (status, v) = call("GET", &format!("{base}/v1/audit/logs"), None);
    assert_eq!(status, 200, "{v}");
    let entries = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["seq"].as_u64().unwrap(), e["hash"].as_str().unwrap().to_string()))
        .collect();
    (entries, v["chain_valid"] == true)
}

#[test]
fn old_audit_entries_and_backups_live_in_the_s3_archive_and_read_back_verified() {
    let dir = std::env::temp_dir().join(format!("lattice-archive-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let s3 = free_port();
    let _moto = moto(s3, &dir.join("moto.log"));
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let config = dir.join("runtime.yaml");
    std::fs::write(
        &config,
        format!(
            "rest_listen: 127.0.0.1:{port}\ngrpc_listen: 127.0.0.1:{grpc}\ndata_dir: {data}\n\
             simulated_nodes: 4\ncycle: 100ms\nagents:\n  simulated_wipe: 100ms\n\
             services:\n  archive:\n    endpoint: http://127.0.0.1:{s3}\n    bucket: {BUCKET}\n\
             \x20   prefix: site-a\n    hot_window: 1500ms\n    every: 300ms\n    max_entries: 4\n\
             \x20   access_key_env: ARCHIVE_KEY\n    secret_key_env: ARCHIVE_SECRET\n",
            grpc = free_port(),
            data = dir.join("data").display(),
        ),
    )
    .unwrap();
    let log = dir.join("runtime.log");
    let start = || runtime_process_env(&config, &log, true, &CREDS);
    let mut rt = start();
    wait_until("the runtime to serve", Duration::from_secs(30), || {
        call("GET", &format!("{base}/v1/nodes"), None).0 == 200
    });

    // Three sensitive claims, each claimed, started, released and wiped: audit entries.
    let mut ids = Vec::new();
    for _ in 0..3 {
        let body = json!({"tenant": "physics", "user": "dr-x", "entrypoint": "sleep 0.2", "sensitive": true,
            "resources": {"nodes": 1}, "lifecycle": {"type": "bounded", "walltime": "10m"}});
        let (status, v) = call("POST", &format!("{base}/v1/allocations"), Some(body));
        assert_eq!(status, 201, "{v}");
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    wait_until("the claims to end and be wiped", Duration::from_secs(60), || {
        ids.iter()
            .all(|id| call("GET", &format!("{base}/v1/allocations/{id}"), None).1["state"] == "completed")
            && raft_status(&base)["audit_entries"].as_u64() >= Some(12)
    });
    // Past the hot window everything leaves the quorum's state, in objects of at most 4 entries.
    wait_until("every entry archived", Duration::from_secs(30), || {
        let st = raft_status(&base);
        st["audit_held"] == 0 && st["audit_entries"].as_u64() >= Some(12)
    });
    let st = raft_status(&base);
    assert_eq!(st["audit_chain_valid"], true, "{st}");
    let total = st["audit_entries"].as_u64().unwrap();
    let objects = keys(s3, "site-a/audit/");
    assert_eq!(
        objects.len() as u64,
        st["audit_archived_objects"].as_u64().unwrap(),
        "{objects:?}"
    );
    assert!(objects.len() as u64 >= total.div_ceil(4), "{objects:?}");
    let mut lines = 0;
    for k in &objects {
        let text = String::from_utf8(object(s3, k)).unwrap();
        let n = text.lines().count();
        assert!((1..=4).contains(&n), "{k}: {n} entries");
        lines += n as u64;
    }
    assert_eq!(lines, total, "each entry in exactly one object");

    // A query reaching back reads the archive: the whole chain, in order, verified.
    let (before, valid) = whole_log(&base);
    assert!(valid);
    assert_eq!(before.len() as u64, total);
    assert!(before.iter().enumerate().all(|(i, (seq, _))| *seq == i as u64));
    let one = call("GET", &format!("{base}/v1/audit/logs?allocation={}", ids[1]), None).1;
    let actions: Vec<&str> = one["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert!(
        ["claim", "start", "release", "wipe"]
            .iter()
            .all(|a| actions.contains(a)),
        "{actions:?}"
    );
    // A range inside the hot window does not need the archive.
    let recent = call("GET", &format!("{base}/v1/audit/logs?since=99999999999999"), None).1;
    assert_eq!(recent["entries"].as_array().unwrap().len(), 0);

    // A backup goes to the archive as well, the same bytes as the member's file.
    let (status, b) = call("POST", &format!("{base}/api/v1/admin/backup"), Some(json!({})));
    assert_eq!(status, 200, "{b}");
    let key = b["archived"].as_str().unwrap_or_else(|| panic!("{b}"));
    assert!(key.starts_with("site-a/backups/"), "{key}");
    let local = std::fs::read(b["path"].as_str().unwrap()).unwrap();
    assert_eq!(object(s3, key), local);
    assert_eq!(b["audit_entries"].as_u64(), Some(total), "{b}");

    // A sensitive session's recording goes beside them (what a session's end does), write-once.
    let archive = {
        // SAFETY: set before any thread of this test reads the environment.
        unsafe {
            std::env::set_var("ARCHIVE_KEY", "testing");
            std::env::set_var("ARCHIVE_SECRET", "testing");
        }
        let cfg: lattice_runtime::archive::ArchiveConfig = serde_json::from_value(json!({
            "endpoint": format!("http://127.0.0.1:{s3}"), "bucket": BUCKET, "prefix": "site-a",
            "access_key_env": "ARCHIVE_KEY", "secret_key_env": "ARCHIVE_SECRET"}))
        .unwrap();
        lattice_runtime::archive::Archive::from_config(&cfg).unwrap()
    };
    let cast = dir.join("a-000001-1-0.cast");
    std::fs::write(&cast, "{\"version\": 2}\n[0.1, \"o\", \"$ \"]\n").unwrap();
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let key = tokio
        .block_on(archive.archive_recording(&cast, "physics", &ids[0]))
        .unwrap();
    assert_eq!(
        key,
        format!("site-a/recordings/physics/{}/sessions/a-000001-1-0.cast", ids[0])
    );
    assert_eq!(object(s3, &key), std::fs::read(&cast).unwrap());
    std::fs::write(&cast, "other bytes").unwrap();
    let again = tokio.block_on(archive.archive_recording(&cast, "physics", &ids[0]));
    assert!(again.unwrap_err().contains("never replaced"), "write-once");
    assert_ne!(object(s3, &key), b"other bytes".to_vec());

    // SIGKILLed and restarted: the archived entries read back from the bucket, unchanged.
    drop(rt);
    rt = start();
    wait_until("the restarted runtime to serve", Duration::from_secs(30), || {
        call("GET", &format!("{base}/v1/nodes"), None).0 == 200 && raft_status(&base)["audit_entries"].is_u64()
    });
    let (after, valid) = whole_log(&base);
    assert!(valid);
    assert_eq!(&after[..before.len()], &before[..], "the same chain after the restart");

    // An object changed in the bucket (and read fresh by a restarted member): not valid.
    let first = &objects[0];
    let text = String::from_utf8(object(s3, first)).unwrap().replace("dr-x", "dr-y");
    overwrite(s3, first, text.as_bytes());
    drop(rt);
    let _rt = start();
    wait_until("the runtime to serve again", Duration::from_secs(30), || {
        call("GET", &format!("{base}/v1/nodes"), None).0 == 200 && raft_status(&base)["audit_entries"].is_u64()
    });
    let (tampered, valid) = whole_log(&base);
    assert!(!valid, "a changed archive object must not verify");
    assert!(
        tampered.len() < before.len(),
        "the changed object's entries are not served as valid"
    );
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains(first.as_str()) && log_text.contains("SHA-256"),
        "the log names the object"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
