//! Examples must not rot: every `rm-replay …` command in a fenced `sh` block of README.md and
//! docs/*.md (and `cargo run --release --bin rm-replay -- …`, run with the binary under test) is run
//! as written, in document order, on the bundled and shared traces. A block right after the line
//! `<!-- examples: skip (needs a running service) -->` is not run. Each document runs in a sandbox of
//! its own: the repository's folders linked in, `../shared` beside it, outputs in its own `out/`.

mod common;
use std::path::{Path, PathBuf};
use std::process::Command;

const SKIP: &str = "<!-- examples: skip (needs a running service) -->";

/// An example: the document, the line its command starts on, the command.
#[derive(Debug)]
struct Example {
    doc: String,
    line: usize,
    command: String,
}

/// The rm-replay commands of `text`'s `sh` blocks, continuation lines joined.
fn examples(doc: &str, text: &str) -> Vec<Example> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        if !(fence == "```sh" || fence == "```bash" || fence == "```shell") {
            i += 1;
            continue;
        }
        let skip = i > 0 && lines[i - 1].trim() == SKIP;
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            let start = i;
            let mut cmd = String::new();
            loop {
                let l = lines[i].trim_end();
                match l.strip_suffix('\\') {
                    Some(head) if i + 1 < lines.len() => {
                        cmd.push_str(head);
                        cmd.push(' ');
                        i += 1;
                    }
                    _ => {
                        cmd.push_str(l);
                        break;
                    }
                }
            }
            i += 1;
            let c = cmd.trim();
            let runs =
                c.starts_with("rm-replay ") || c == "rm-replay" || c.starts_with("cargo run --release --bin rm-replay");
            if runs && !skip {
                out.push(Example {
                    doc: doc.to_string(),
                    line: start + 1,
                    command: c.to_string(),
                });
            }
        }
        i += 1;
    }
    out
}

/// A sandbox for one document: `dir/main` holds links to the repository's entries (not `out/`),
/// `dir/shared` links to the shared traces.
fn sandbox(dir: &Path) -> PathBuf {
    let root = common::root().canonicalize().unwrap();
    let main = dir.join("main");
    std::fs::create_dir_all(&main).unwrap();
    for e in std::fs::read_dir(&root).unwrap().flatten() {
        let name = e.file_name();
        if name == "out" || name == "target" || name == ".git" {
            continue;
        }
        std::os::unix::fs::symlink(e.path(), main.join(&name)).unwrap();
    }
    let shared = root.join("../shared");
    if shared.exists() {
        std::os::unix::fs::symlink(shared.canonicalize().unwrap(), dir.join("shared")).unwrap();
    }
    main
}

#[test]
fn every_documented_rm_replay_command_runs() {
    let root = common::root();
    let mut docs = vec![root.join("README.md")];
    let mut guides: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    guides.sort();
    docs.extend(guides);
    assert!(docs.len() >= 5, "README.md and the four guides: {docs:?}");

    // `rm-replay` on PATH is the binary under test.
    let tmp = common::tmp("examples");
    let bin = tmp.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rm-replay"), bin.join("rm-replay")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());

    let mut ran = 0;
    let mut failures = Vec::new();
    for doc in &docs {
        let name = doc.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(doc).unwrap();
        let dir = tmp.join(name.trim_end_matches(".md"));
        let main = sandbox(&dir);
        for ex in examples(&name, &text) {
            let cmd = ex
                .command
                .replacen("cargo run --release --bin rm-replay --", "rm-replay", 1)
                .replacen("cargo run --release --bin rm-replay", "rm-replay", 1);
            let o = Command::new("/bin/sh")
                .arg("-c")
                .arg(&cmd)
                .current_dir(&main)
                .env("PATH", &path)
                .output()
                .unwrap();
            ran += 1;
            if !o.status.success() {
                failures.push(format!(
                    "{}:{}: `{}` exited {:?}:\n{}{}",
                    ex.doc,
                    ex.line,
                    ex.command,
                    o.status.code(),
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} examples failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The README's main command and tour, and the guides' worked examples, are all here.
    assert!(ran >= 20, "only {ran} examples found");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn the_extractor_joins_continuations_and_honours_the_skip_marker() {
    let text = format!(
        "intro\n```sh\nrm-replay --trace a \\\n    --output out/x   # note\ncurl localhost\ncargo run --release --bin rm-replay\n```\n{SKIP}\n```sh\nrm-replay --needs-service\n```\n```text\nrm-replay --trace T\n```\n"
    );
    let ex = examples("d.md", &text);
    let cmds: Vec<(usize, &str)> = ex.iter().map(|e| (e.line, e.command.as_str())).collect();
    assert_eq!(
        cmds,
        [
            (3, "rm-replay --trace a      --output out/x   # note"),
            (6, "cargo run --release --bin rm-replay")
        ]
    );
}

/// The marker of the blocks `the_one_machine_setup_runs_as_documented` runs, in document order, as
/// one script.
const ONE_MACHINE: &str = "<!-- examples: one machine -->";

/// The text of each fenced block right after a line `marker`, in order.
fn marked_blocks(text: &str, marker: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.trim() != marker || !lines.get(i + 1).is_some_and(|f| f.trim_start().starts_with("```")) {
            continue;
        }
        let body: Vec<&str> = lines[i + 2..]
            .iter()
            .take_while(|l| !l.trim_start().starts_with("```"))
            .copied()
            .collect();
        out.push(body.join("\n"));
    }
    out
}

/// docs/operators.md's "One machine with real agents", as written: a member, two real agents on one
/// machine (each its own `--peer-listen`), a job on both nodes, and a task launch whose 4 ranks span
/// the two agents. Run with the debug binaries in place of `./target/release/`, in a scratch copy of
/// the repository (its own `lattice-data/`), with `/tmp/` moved into the scratch folder.
#[test]
fn the_one_machine_setup_runs_as_documented() {
    let root = common::root();
    let text = std::fs::read_to_string(root.join("docs/operators.md")).unwrap();
    let blocks = marked_blocks(&text, ONE_MACHINE);
    assert_eq!(blocks.len(), 2, "the setup and the task launch");
    // The documented ports must be free (a developer's own runtime on 8080 would answer instead).
    for port in [8080, 50051, 7011, 7012] {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "port {port} is taken: the documented setup needs it"
        );
    }
    let tmp = common::tmp("one-machine");
    let main = sandbox(&tmp);
    // The configuration copied, not linked: the quorum's data lands in the scratch copy.
    std::fs::remove_file(main.join("runtime")).unwrap();
    std::fs::create_dir_all(main.join("runtime/config")).unwrap();
    for e in std::fs::read_dir(root.join("runtime")).unwrap().flatten() {
        if e.file_name() != "config" {
            std::os::unix::fs::symlink(
                e.path().canonicalize().unwrap(),
                main.join("runtime").join(e.file_name()),
            )
            .unwrap();
        }
    }
    for f in ["dev-agents.yaml", "dev-nodes.yaml"] {
        std::fs::copy(root.join("runtime/config").join(f), main.join("runtime/config").join(f)).unwrap();
    }
    let bin = tmp.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, path) in [
        ("lattice", PathBuf::from(env!("CARGO_BIN_EXE_lattice"))),
        ("lattice-runtime", lattice_testkit::process::bin("lattice-runtime")),
        ("lattice-agent", lattice_testkit::process::agent_binary()),
    ] {
        std::os::unix::fs::symlink(path, bin.join(name)).unwrap();
    }
    let scratch = tmp.join("tmp");
    std::fs::create_dir_all(&scratch).unwrap();
    let script: String = blocks
        .join("\n")
        .lines()
        .map(|l| if l.starts_with("cargo build") { ":" } else { l })
        .collect::<Vec<_>>()
        .join("\n")
        .replace("/tmp/", &format!("{}/", scratch.display()))
        .replace("./target/release/", &format!("{}/", bin.display()));
    // Its own process group, killed whole afterwards (the member and agents it started in the
    // background), however the script ends; a minute at most.
    let mut child = Command::new("setsid")
        .args(["bash", "-e", "-c", &format!("{script}\n")])
        .current_dir(&main)
        .env_remove("LATTICE_TOKEN")
        .env("HOME", &tmp)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("bash runs");
    let pgid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut o = String::new();
        let mut e = String::new();
        let mut out = out;
        let mut err = err;
        let t = std::thread::spawn(move || {
            let _ = std::io::Read::read_to_string(&mut err, &mut e);
            e
        });
        let _ = std::io::Read::read_to_string(&mut out, &mut o);
        let _ = tx.send((o, t.join().unwrap_or_default()));
    });
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > std::time::Duration::from_secs(90) {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    // SAFETY: kill takes plain integers.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = child.wait();
    let (stdout, stderr) = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("the setup did not finish in 90 s:\n{stdout}{stderr}"));
    assert!(
        status.success(),
        "the documented setup failed ({status}):\n{stdout}\n{stderr}"
    );
    for t in 0..2 {
        assert!(
            stdout.contains(&format!("hello from task {t} of 2")),
            "{stdout}\n{stderr}"
        );
    }
    // 4 ranks over the two agents, 2 per node.
    for r in 0..4 {
        let line = format!("rank {r} of 4 on node {}", r / 2);
        assert!(stdout.contains(&line), "`{line}` missing:\n{stdout}\n{stderr}");
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn marked_blocks_are_found_in_order() {
    let text =
        format!("a\n{ONE_MACHINE}\n```sh\none\ntwo\n```\nb\n```sh\nnot\n```\n{ONE_MACHINE}\n```sh\nthree\n```\n");
    assert_eq!(marked_blocks(&text, ONE_MACHINE), ["one\ntwo", "three"]);
}

const CLI: &str = "<!-- examples: cli -->";

/// The `lattice` examples of docs/api.md, one block per command group, run as written in one shell
/// (later blocks use the ids earlier ones made) against a live runtime with simulated agents started
/// in-process; every command must succeed.
#[test]
fn the_cli_examples_of_the_api_guide_run() {
    let root = common::root();
    let text = std::fs::read_to_string(root.join("docs/api.md")).unwrap();
    let blocks = marked_blocks(&text, CLI);
    assert!(blocks.len() >= 6, "an example per command group: {}", blocks.len());
    let tmp = common::tmp("cli-examples");
    let (_rt, running) = lattice_testkit::control_plane(&tmp.join("member"), 8, "");
    let bin = tmp.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_lattice"), bin.join("lattice")).unwrap();
    let scratch = tmp.join("tmp");
    std::fs::create_dir_all(&scratch).unwrap();
    let script = blocks.join("\n").replace("/tmp/", &format!("{}/", scratch.display()));
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let o = Command::new("timeout")
        .args(["120", "bash", "-e", "-o", "pipefail", "-c", &script])
        .env("PATH", path)
        .env("LATTICE_ENDPOINT", format!("http://{}", running.rest_addr))
        .env("LATTICE_TENANT", "physics")
        .env_remove("LATTICE_TOKEN")
        .env("HOME", &tmp)
        .output()
        .expect("bash runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(
        o.status.success(),
        "the examples failed ({}):\n{stdout}\n{stderr}",
        o.status
    );
    // What each group shows: a finished allocation, a DAG's edge, a drained node, the raft state.
    for want in ["completed", "train", "draining", "Leader", "cycle_interval"] {
        assert!(
            stdout.contains(want) || stderr.contains(want),
            "`{want}` missing:\n{stdout}\n{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
