//! `lattice logs`: an allocation's (or a task launch's) output, `--follow` to stream it live.

use super::{Client, print_stream};
use anyhow::{Result, bail};

#[derive(clap::Args)]
pub struct LogsArgs {
    /// An allocation (`a-000012`) or a task launch in it (`a-000012.1`).
    pub id: String,
    /// Live tail: print new output as the agents send it, until the allocation ends.
    #[arg(short, long)]
    pub follow: bool,
    /// Only this node's output.
    #[arg(long)]
    pub node: Option<String>,
    /// Only the last N lines (of each node's, or each rank's, output).
    #[arg(long)]
    pub tail: Option<usize>,
    /// Only stderr (printed to stdout). Without it both streams are shown: the processes' stdout
    /// on stdout, their stderr on stderr (a task launch, `a-000012.1`: each rank's stdout).
    #[arg(long)]
    pub stderr: bool,
    /// A task launch: only this rank's output.
    #[arg(long)]
    pub rank: Option<u32>,
    /// Federation: an allocation forwarded to that peer (its stdout, as the peer has it).
    #[arg(long)]
    pub site: Option<String>,
    /// Only output flushed to the log store at or after this instant (`YYYY-MM-DD` or ms since the
    /// epoch).
    #[arg(long, conflicts_with = "follow")]
    pub since: Option<String>,
    /// Only output flushed before this instant.
    #[arg(long, conflicts_with = "follow")]
    pub until: Option<String>,
}

/// `lattice logs ID`.
pub fn run(client: &Client, args: LogsArgs) -> Result<()> {
    match args {
        LogsArgs {
            id,
            site: Some(site),
            tail,
            ..
        } => {
            let v = client.call("GET", &format!("/api/v1/federation/allocations/{site}/{id}/logs"), None)?;
            let nodes = v["nodes"].as_object().cloned().unwrap_or_default();
            let many = nodes.len() > 1;
            for (node, text) in &nodes {
                if many {
                    println!("==> {node} <==");
                }
                print!("{}", crate::launch::last_lines(text.as_str().unwrap_or_default(), tail));
            }
            if nodes.is_empty() {
                eprintln!("{site}/{id}: no output reported yet");
            }
        }
        LogsArgs {
            id,
            follow: false,
            tail,
            stderr,
            rank,
            ..
        } if crate::launch::launch_of(&id).is_some() => {
            // A task launch: each rank's stdout (or stderr), kept apart, in rank order.
            let (alloc, _) = crate::launch::launch_of(&id).expect("matched");
            let v = client.call("GET", &format!("/v1/allocations/{alloc}/tasks/{id}"), None)?;
            print!("{}", crate::launch::rank_logs(&v, stderr, rank, tail));
        }
        LogsArgs {
            id,
            follow: true,
            node,
            stderr,
            ..
        } => follow(client, id, node, stderr)?,
        LogsArgs {
            id,
            follow: false,
            node,
            tail,
            stderr,
            since,
            until,
            ..
        } => {
            // Both streams by default: the job's stdout to ours, its stderr to ours; `--stderr`: only
            // its stderr, to our stdout (to page or grep it).
            let streams: &[&str] = if stderr { &["stderr"] } else { &["stdout", "stderr"] };
            let mut any = false;
            for &stream in streams {
                let stream_name = Some(stream.to_string());
                let q = super::query(&[
                    ("stream", &stream_name),
                    ("node", &node),
                    ("since", &since),
                    ("until", &until),
                ]);
                let path = format!("/v1/allocations/{id}/logs{q}");
                let v = client.call("GET", &path, None)?;
                let nodes = v["nodes"].as_object().cloned().unwrap_or_default();
                any |= !nodes.is_empty();
                let many = nodes.len() > 1;
                for (node, text) in nodes {
                    let text = crate::launch::last_lines(text.as_str().unwrap_or_default(), tail);
                    if text.is_empty() {
                        continue;
                    }
                    let to_stderr = stream == "stderr" && !stderr;
                    if many {
                        print_stream(to_stderr, &format!("==> {node} <==\n"));
                    }
                    print_stream(to_stderr, &text);
                }
            }
            if !any {
                eprintln!("{id}: no output reported yet (agents report it when the processes end)");
            }
        }
    }
    Ok(())
}

/// `lattice logs --follow ID`.
fn follow(client: &Client, id: String, node: Option<String>, stderr: bool) -> Result<()> {
    // Each stream pushed on its own (Server-Sent Events; offsets are per stream) until the
    // allocation ended and its agents' last output arrived; the job's stderr goes to ours.
    let streams: &[&str] = if stderr { &["stderr"] } else { &["stdout", "stderr"] };
    let out = std::sync::Mutex::new(());
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = streams
            .iter()
            .map(|&stream| {
                let (client, node, out, id) = (&client, &node, &out, &id);
                scope.spawn(move || -> Result<()> {
                    // Where each node's output is up to: a stream that closes before its
                    // `end` is opened again from there (nothing twice, nothing lost).
                    let mut after: std::collections::BTreeMap<String, u64> = Default::default();
                    let mut reopened = 0;
                    // Renewals in a row of streams ended at once: a token the server ends at once (its
                    // clock ahead of the IdP's by more than a token's life) must not loop.
                    let mut renewals = 0;
                    while reopened < 20 {
                        let q: Vec<String> = after.iter().map(|(n, o)| format!("{n}:{o}")).collect();
                        let path = format!("/v1/allocations/{id}/logs/stream?stream={stream}&after={}", q.join(","));
                        let (mut ended, mut failed) = (false, None);
                        let token = client.token();
                        let opened = std::time::Instant::now();
                        client.events(&path, |event, data| {
                            match event {
                                "output" => {
                                    let n = data["node"].as_str().unwrap_or_default().to_string();
                                    if node.as_ref().is_none_or(|x| *x == n) {
                                        let _held = out.lock();
                                        print_stream(
                                            stream == "stderr" && !stderr,
                                            data["data"].as_str().unwrap_or_default(),
                                        );
                                    }
                                    after.insert(n, data["next"].as_u64().unwrap_or(0));
                                }
                                "end" => ended = true,
                                "error" => failed = data["error"].as_str().map(str::to_string),
                                _ => {}
                            }
                            !ended && failed.is_none()
                        })?;
                        // A stream that lasted is not a token ended at once.
                        if opened.elapsed() >= std::time::Duration::from_secs(1) {
                            renewals = 0;
                        }
                        match failed {
                            // The server ends a stream when its token expires: with a fresh one
                            // it is opened again from where it was.
                            Some(f) if f == "token expired" && renewals < 3 && client.renew_token(token.as_deref()) => {
                                renewals += 1;
                                continue;
                            }
                            Some(f) => bail!("{id}: the log stream ended: {f}"),
                            None if ended => return Ok(()),
                            None => {}
                        }
                        reopened += 1;
                        std::thread::sleep(std::time::Duration::from_millis(500));
                    }
                    bail!("{id}: the log stream kept closing before the allocation's end")
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a log stream's reader panicked"))??;
        }
        Ok(())
    })?;
    Ok(())
}
