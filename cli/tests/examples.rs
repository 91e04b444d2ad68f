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
