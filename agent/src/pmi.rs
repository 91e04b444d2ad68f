//! The PMI wire protocols the node agent serves to the ranks it starts (book: "MPI Process
//! Management", PMI-2 Wire Protocol), without I/O: bytes in, commands out, replies as bytes.
//!
//! - **PMI-2**: each message is a 6-character decimal length, then `cmd=NAME;key=value;...;`
//!   (a `;` inside a value is doubled). `fullinit`, `job-getid`, `info-getjobattr`,
//!   `info-putnodeattr`/`info-getnodeattr`, `kvs-put`, `kvs-get`, `kvs-fence`, `finalize`, `abort`.
//! - **PMI-1** (what Debian's MPICH 4.0 client speaks): lines `cmd=NAME key=value ...\n`. `init`,
//!   `get_maxes`, `get_appnum`, `get_my_kvsname`, `get_universe_size`, `put`, `get`, `barrier_in`
//!   (the fence), `finalize`, `abort`. A PMI-1 `init` asking for version 2 answers in PMI-1 and
//!   switches the connection to PMI-2 framing, as MPICH's PMI-2 client expects.
//!
//! A connection's rank comes from how it was started (`PMI_FD` is one socket per rank), so a
//! `fullinit` naming another rank is refused. [`Kvs`] is one node's view of the launch's key-value
//! space: puts are visible at once on the node and travel to the other nodes at the next fence.

use std::collections::BTreeMap;

/// The framing a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    V1,
    V2,
}

/// Longest key, value and KVS name (as MPICH's Hydra: 64, 1024, 256).
pub const KEY_MAX: usize = 64;
pub const VAL_MAX: usize = 1024;
pub const KVSNAME_MAX: usize = 256;
/// Longest message accepted (a PMI-2 length field has six digits).
pub const MESSAGE_MAX: usize = 999_999;

/// One decoded command: its name and its arguments in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    pub name: String,
    pub args: Vec<(String, String)>,
}

impl Command {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.args.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// What the server does with a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send these bytes back.
    Reply(Vec<u8>),
    /// The rank entered a fence: answer with [`Conn::fence_done`] once every rank of the launch is in.
    Fence,
    /// The rank finalized: send the reply; the rank may now exit.
    Finalized(Vec<u8>),
    /// The rank asks to abort the launch (its exit code and message).
    Abort { code: i32, message: String },
    /// A node attribute it waits for is not there yet: answer with [`Conn::node_attr_ready`] later.
    WaitNodeAttr(String),
}

/// A protocol error: the connection is closed and the rank's launch aborted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("PMI: {0}")]
pub struct PmiError(pub String);

/// The launch as one node sees it: the job's attributes and its key-value space.
#[derive(Clone, Debug, Default)]
pub struct Kvs {
    /// The KVS (job) name the ranks see.
    pub jobid: String,
    pub size: u32,
    /// `PMI_process_mapping`: which ranks share a node ([`process_mapping`]).
    pub mapping: String,
    /// Every key known here: this node's puts and all nodes' puts of past fences.
    pub values: BTreeMap<String, String>,
    /// This node's puts since the last fence (sent with the next one).
    pub pending: Vec<(String, String)>,
    /// Node attributes (`info-putnodeattr`), local to this node.
    pub node_attrs: BTreeMap<String, String>,
}

impl Kvs {
    pub fn new(jobid: &str, size: u32, mapping: String) -> Kvs {
        Kvs {
            jobid: jobid.to_string(),
            size,
            mapping,
            ..Kvs::default()
        }
    }

    fn put(&mut self, key: &str, value: &str) {
        self.values.insert(key.to_string(), value.to_string());
        self.pending.push((key.to_string(), value.to_string()));
    }

    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "PMI_process_mapping" => Some(self.mapping.as_str()),
            _ => self.values.get(key).map(String::as_str),
        }
    }

    /// A fence completed: every node's puts are now known here.
    pub fn merge(&mut self, merged: Vec<(String, String)>) {
        self.pending.clear();
        self.values.extend(merged);
    }
}

/// `PMI_process_mapping` for ranks laid out in blocks: `(vector,(first_node,nodes,ranks_per_node),...)`,
/// one triple per run of nodes with the same number of ranks.
pub fn process_mapping(ranks_per_node: &[u32]) -> String {
    let mut out = String::from("(vector");
    let mut i = 0;
    while i < ranks_per_node.len() {
        let n = ranks_per_node[i];
        let mut j = i;
        while j < ranks_per_node.len() && ranks_per_node[j] == n {
            j += 1;
        }
        out.push_str(&format!(",({i},{},{n})", j - i));
        i = j;
    }
    out.push(')');
    out
}

/// One rank's connection: its framing, what has arrived but not yet formed a message, its rank.
#[derive(Clone, Debug)]
pub struct Conn {
    pub wire: Wire,
    pub rank: u32,
    buf: Vec<u8>,
    /// The framing is not known until the first bytes arrive.
    sniffed: bool,
    pub finalized: bool,
}

impl Conn {
    pub fn new(rank: u32) -> Conn {
        Conn {
            wire: Wire::V1,
            rank,
            buf: Vec::new(),
            sniffed: false,
            finalized: false,
        }
    }

    /// Takes `bytes`; the complete commands they finish, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Command>, PmiError> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            if !self.sniffed {
                let Some(first) = self.buf.first() else { break };
                // A PMI-2 message starts with its length: a digit or a padding space.
                self.wire = if first.is_ascii_digit() { Wire::V2 } else { Wire::V1 };
                self.sniffed = true;
            }
            let cmd = match self.wire {
                Wire::V1 => {
                    let Some(end) = self.buf.iter().position(|b| *b == b'\n') else {
                        if self.buf.len() > MESSAGE_MAX {
                            return Err(PmiError("a PMI-1 line longer than the limit".into()));
                        }
                        break;
                    };
                    let line: Vec<u8> = self.buf.drain(..=end).collect();
                    parse_v1(&line[..line.len() - 1])?
                }
                Wire::V2 => {
                    if self.buf.len() < 6 {
                        break;
                    }
                    let head = std::str::from_utf8(&self.buf[..6])
                        .ok()
                        .and_then(|h| h.trim().parse::<usize>().ok())
                        .ok_or_else(|| {
                            PmiError(format!(
                                "bad PMI-2 length {:?}",
                                String::from_utf8_lossy(&self.buf[..6])
                            ))
                        })?;
                    if self.buf.len() < 6 + head {
                        break;
                    }
                    let body: Vec<u8> = self.buf.drain(..6 + head).skip(6).collect();
                    parse_v2(&body)?
                }
            };
            // A PMI-1 init asking for version 2: later messages come framed as PMI-2.
            let switch = self.wire == Wire::V1 && cmd.name == "init" && cmd.get("pmi_version") == Some("2");
            out.push(cmd);
            if switch {
                self.wire = Wire::V2;
            }
        }
        Ok(out)
    }

    /// What to do with `cmd` (already decoded from this connection).
    pub fn handle(&mut self, kvs: &mut Kvs, cmd: &Command) -> Result<Action, PmiError> {
        let rank = self.rank;
        let reply = |wire: Wire, name: &str, args: &[(&str, &str)]| Action::Reply(encode(wire, name, args));
        // The reply to a PMI-1 `init` that switched to PMI-2 still goes out as PMI-1.
        if cmd.name == "init" {
            let v = cmd.get("pmi_version").unwrap_or("1");
            let sub = cmd.get("pmi_subversion").unwrap_or("1");
            let (v, sub) = match v {
                "1" => ("1", sub),
                "2" => ("2", "0"),
                other => {
                    return Ok(reply(
                        Wire::V1,
                        "response_to_init",
                        &[("pmi_version", other), ("pmi_subversion", sub), ("rc", "-1")],
                    ));
                }
            };
            return Ok(reply(
                Wire::V1,
                "response_to_init",
                &[("pmi_version", v), ("pmi_subversion", sub), ("rc", "0")],
            ));
        }
        let w = self.wire;
        let size = kvs.size.to_string();
        let rank_s = rank.to_string();
        Ok(match (w, cmd.name.as_str()) {
            // PMI-1.
            (Wire::V1, "get_maxes") => reply(
                w,
                "maxes",
                &[
                    ("kvsname_max", &KVSNAME_MAX.to_string()),
                    ("keylen_max", &KEY_MAX.to_string()),
                    ("vallen_max", &VAL_MAX.to_string()),
                ],
            ),
            (Wire::V1, "get_appnum") => reply(w, "appnum", &[("appnum", "0")]),
            (Wire::V1, "get_my_kvsname") => reply(w, "my_kvsname", &[("kvsname", &kvs.jobid)]),
            (Wire::V1, "get_universe_size") => reply(w, "universe_size", &[("size", &size)]),
            (Wire::V1, "put") => {
                let (Some(key), Some(value)) = (cmd.get("key"), cmd.get("value")) else {
                    return Ok(reply(
                        w,
                        "put_result",
                        &[("rc", "-1"), ("msg", "key_and_value_required")],
                    ));
                };
                if key.len() > KEY_MAX || value.len() > VAL_MAX {
                    return Ok(reply(w, "put_result", &[("rc", "-1"), ("msg", "too_long")]));
                }
                kvs.put(key, value);
                reply(w, "put_result", &[("rc", "0"), ("msg", "success")])
            }
            (Wire::V1, "get") => match cmd.get("key").and_then(|k| kvs.get(k)) {
                Some(v) => reply(w, "get_result", &[("rc", "0"), ("msg", "success"), ("value", v)]),
                None => reply(w, "get_result", &[("rc", "-1"), ("msg", "key_not_found")]),
            },
            (Wire::V1, "barrier_in") => Action::Fence,
            (Wire::V1, "finalize") => {
                self.finalized = true;
                Action::Finalized(encode(w, "finalize_ack", &[]))
            }
            (Wire::V1, "abort") => Action::Abort {
                code: cmd.get("exitcode").and_then(|c| c.parse().ok()).unwrap_or(1),
                message: cmd.get("message").unwrap_or("").to_string(),
            },
            // PMI-2.
            (Wire::V2, "fullinit") => {
                let asked = cmd.get("pmirank").or(cmd.get("pmiid"));
                if let Some(r) = asked
                    && r.parse::<u32>().ok() != Some(rank)
                {
                    return Err(PmiError(format!("rank {rank} asked for rank {r}")));
                }
                reply(
                    w,
                    "fullinit-response",
                    &[
                        ("pmi-version", "2"),
                        ("pmi-subversion", "0"),
                        ("rank", &rank_s),
                        ("size", &size),
                        ("appnum", "0"),
                        ("debugged", "FALSE"),
                        ("pmiverbose", "FALSE"),
                        ("rc", "0"),
                    ],
                )
            }
            (Wire::V2, "job-getid") => reply(w, "job-getid-response", &[("jobid", &kvs.jobid), ("rc", "0")]),
            (Wire::V2, "info-getjobattr") => {
                let value = match cmd.get("key") {
                    Some("PMI_process_mapping") => Some(kvs.mapping.clone()),
                    Some("universeSize") => Some(size.clone()),
                    _ => None,
                };
                match value {
                    Some(v) => reply(
                        w,
                        "info-getjobattr-response",
                        &[("found", "TRUE"), ("value", &v), ("rc", "0")],
                    ),
                    None => reply(w, "info-getjobattr-response", &[("found", "FALSE"), ("rc", "0")]),
                }
            }
            (Wire::V2, "info-putnodeattr") => {
                let (Some(key), Some(value)) = (cmd.get("key"), cmd.get("value")) else {
                    return Ok(reply(w, "info-putnodeattr-response", &[("rc", "-1")]));
                };
                kvs.node_attrs.insert(key.to_string(), value.to_string());
                reply(w, "info-putnodeattr-response", &[("rc", "0")])
            }
            (Wire::V2, "info-getnodeattr") => {
                let key = cmd.get("key").unwrap_or("");
                match kvs.node_attrs.get(key) {
                    Some(v) => reply(
                        w,
                        "info-getnodeattr-response",
                        &[("found", "TRUE"), ("value", v), ("rc", "0")],
                    ),
                    None if cmd.get("wait") == Some("TRUE") => Action::WaitNodeAttr(key.to_string()),
                    None => reply(w, "info-getnodeattr-response", &[("found", "FALSE"), ("rc", "0")]),
                }
            }
            (Wire::V2, "kvs-put") => {
                let (Some(key), Some(value)) = (cmd.get("key"), cmd.get("value")) else {
                    return Ok(reply(
                        w,
                        "kvs-put-response",
                        &[("rc", "-1"), ("errmsg", "key and value required")],
                    ));
                };
                if key.len() > KEY_MAX || value.len() > VAL_MAX {
                    return Ok(reply(w, "kvs-put-response", &[("rc", "-1"), ("errmsg", "too long")]));
                }
                kvs.put(key, value);
                reply(w, "kvs-put-response", &[("rc", "0")])
            }
            (Wire::V2, "kvs-get") => match cmd.get("key").and_then(|k| kvs.get(k)) {
                Some(v) => reply(w, "kvs-get-response", &[("found", "TRUE"), ("value", v), ("rc", "0")]),
                None => reply(w, "kvs-get-response", &[("found", "FALSE"), ("rc", "0")]),
            },
            (Wire::V2, "kvs-fence") => Action::Fence,
            (Wire::V2, "finalize") => {
                self.finalized = true;
                Action::Finalized(encode(w, "finalize-response", &[("rc", "0")]))
            }
            (Wire::V2, "abort") => Action::Abort {
                code: 1,
                message: cmd.get("message").unwrap_or("").to_string(),
            },
            // Spawning, name publishing and the rest are not served: a clear refusal, not a hang.
            (Wire::V1, name) => reply(
                w,
                &format!("{name}_result"),
                &[("rc", "-1"), ("msg", "not_supported_by_lattice")],
            ),
            (Wire::V2, name) => reply(
                w,
                &format!("{name}-response"),
                &[("rc", "-1"), ("errmsg", "not supported by Lattice")],
            ),
        })
    }

    /// The reply that ends a fence for this rank.
    pub fn fence_done(&self) -> Vec<u8> {
        match self.wire {
            Wire::V1 => encode(Wire::V1, "barrier_out", &[("rc", "0")]),
            Wire::V2 => encode(Wire::V2, "kvs-fence-response", &[("rc", "0")]),
        }
    }

    /// The reply to a waiting `info-getnodeattr` once its key is there.
    pub fn node_attr_ready(&self, value: &str) -> Vec<u8> {
        encode(
            Wire::V2,
            "info-getnodeattr-response",
            &[("found", "TRUE"), ("value", value), ("rc", "0")],
        )
    }
}

fn parse_v1(line: &[u8]) -> Result<Command, PmiError> {
    let text = std::str::from_utf8(line).map_err(|_| PmiError("a PMI-1 line that is not UTF-8".into()))?;
    let mut name = None;
    let mut args = Vec::new();
    for tok in text.split_ascii_whitespace() {
        let (k, v) = tok.split_once('=').unwrap_or((tok, ""));
        if (k == "cmd" || k == "mcmd") && name.is_none() {
            name = Some(v.to_string());
        } else {
            args.push((k.to_string(), v.to_string()));
        }
    }
    let name = name.ok_or_else(|| PmiError(format!("a PMI-1 line without cmd=: {text:?}")))?;
    Ok(Command { name, args })
}

fn parse_v2(body: &[u8]) -> Result<Command, PmiError> {
    let text = std::str::from_utf8(body).map_err(|_| PmiError("a PMI-2 message that is not UTF-8".into()))?;
    // Split on single `;`; `;;` is a literal semicolon.
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ';' {
            if chars.peek() == Some(&';') {
                chars.next();
                cur.push(';');
            } else {
                fields.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(c);
        }
    }
    if !cur.is_empty() {
        fields.push(cur);
    }
    let mut name = None;
    let mut args = Vec::new();
    for f in fields {
        let (k, v) = f.split_once('=').unwrap_or((f.as_str(), ""));
        if k == "cmd" && name.is_none() {
            name = Some(v.to_string());
        } else {
            args.push((k.to_string(), v.to_string()));
        }
    }
    let name = name.ok_or_else(|| PmiError(format!("a PMI-2 message without cmd=: {text:?}")))?;
    Ok(Command { name, args })
}

/// A message in `wire`'s framing.
pub fn encode(wire: Wire, name: &str, args: &[(&str, &str)]) -> Vec<u8> {
    match wire {
        Wire::V1 => {
            let mut s = format!("cmd={name}");
            for (k, v) in args {
                s.push_str(&format!(" {k}={v}"));
            }
            s.push('\n');
            s.into_bytes()
        }
        Wire::V2 => {
            let mut s = format!("cmd={name};");
            for (k, v) in args {
                s.push_str(&format!("{k}={};", v.replace(';', ";;")));
            }
            let mut out = format!("{:<6}", s.len()).into_bytes();
            out.extend_from_slice(s.as_bytes());
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(body: &str) -> Vec<u8> {
        let mut m = format!("{:<6}", body.len()).into_bytes();
        m.extend_from_slice(body.as_bytes());
        m
    }

    fn reply_text(a: Action) -> String {
        match a {
            Action::Reply(b) | Action::Finalized(b) => String::from_utf8(b).unwrap(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn pmi1_session_as_mpich_speaks_it() {
        let mut kvs = Kvs::new("kvs_a-1.0", 4, process_mapping(&[2, 2]));
        let mut c = Conn::new(1);
        // Split across reads, two lines in one read.
        let mut cmds = c.feed(b"cmd=init pmi_version=1 pmi_").unwrap();
        assert!(cmds.is_empty());
        cmds.extend(c.feed(b"subversion=1\ncmd=get_maxes\n").unwrap());
        assert_eq!(cmds.len(), 2);
        let texts: Vec<String> = cmds
            .iter()
            .map(|m| reply_text(c.handle(&mut kvs, m).unwrap()))
            .collect();
        assert_eq!(texts[0], "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
        assert_eq!(texts[1], "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n");
        let one = |c: &mut Conn, kvs: &mut Kvs, line: &str| {
            let m = c.feed(line.as_bytes()).unwrap().pop().unwrap();
            c.handle(kvs, &m).unwrap()
        };
        assert_eq!(
            reply_text(one(&mut c, &mut kvs, "cmd=get_my_kvsname\n")),
            "cmd=my_kvsname kvsname=kvs_a-1.0\n"
        );
        assert_eq!(
            reply_text(one(&mut c, &mut kvs, "cmd=get_universe_size\n")),
            "cmd=universe_size size=4\n"
        );
        assert_eq!(
            reply_text(one(
                &mut c,
                &mut kvs,
                "cmd=put kvsname=kvs_a-1.0 key=bc-1 value=abc=def\n"
            )),
            "cmd=put_result rc=0 msg=success\n"
        );
        assert_eq!(kvs.pending, vec![("bc-1".to_string(), "abc=def".to_string())]);
        assert_eq!(
            reply_text(one(
                &mut c,
                &mut kvs,
                "cmd=get kvsname=kvs_a-1.0 key=PMI_process_mapping\n"
            )),
            "cmd=get_result rc=0 msg=success value=(vector,(0,2,2))\n"
        );
        assert_eq!(
            reply_text(one(&mut c, &mut kvs, "cmd=get kvsname=kvs_a-1.0 key=bc-3\n")),
            "cmd=get_result rc=-1 msg=key_not_found\n"
        );
        assert_eq!(one(&mut c, &mut kvs, "cmd=barrier_in\n"), Action::Fence);
        assert_eq!(c.fence_done(), b"cmd=barrier_out rc=0\n");
        kvs.merge(vec![("bc-3".into(), "xyz".into())]);
        assert!(kvs.pending.is_empty());
        assert_eq!(
            reply_text(one(&mut c, &mut kvs, "cmd=get kvsname=kvs_a-1.0 key=bc-3\n")),
            "cmd=get_result rc=0 msg=success value=xyz\n"
        );
        assert_eq!(
            one(&mut c, &mut kvs, "cmd=abort exitcode=7\n"),
            Action::Abort {
                code: 7,
                message: String::new()
            }
        );
        assert_eq!(
            reply_text(one(&mut c, &mut kvs, "cmd=finalize\n")),
            "cmd=finalize_ack\n"
        );
        assert!(c.finalized);
        // Something not served: refused, not ignored.
        assert!(reply_text(one(&mut c, &mut kvs, "cmd=publish_name service=x port=y\n")).contains("rc=-1"));
    }

    #[test]
    fn pmi2_session_framing_escapes_and_the_switch_from_pmi1_init() {
        let mut kvs = Kvs::new("kvs_a-1.0", 2, process_mapping(&[1, 1]));
        let mut c = Conn::new(1);
        // MPICH's PMI-2 client opens with a PMI-1 init for version 2, then frames by length.
        let mut bytes = b"cmd=init pmi_version=2 pmi_subversion=0\n".to_vec();
        bytes.extend(v2("cmd=fullinit;pmirank=1;threaded=FALSE;"));
        let cmds = c.feed(&bytes).unwrap();
        assert_eq!(cmds.len(), 2);
        assert_eq!(c.wire, Wire::V2);
        assert_eq!(
            reply_text(c.handle(&mut kvs, &cmds[0]).unwrap()),
            "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n"
        );
        let r = reply_text(c.handle(&mut kvs, &cmds[1]).unwrap());
        assert!(
            r.starts_with(&format!("{:<6}cmd=fullinit-response;", r.len() - 6)),
            "{r}"
        );
        assert!(r.contains(";rank=1;size=2;"), "{r}");
        // A value with a semicolon, split over three reads.
        let m = v2("cmd=kvs-put;key=k;value=a;;b;");
        let (a, b) = m.split_at(4);
        let (b, d) = b.split_at(10);
        assert!(c.feed(a).unwrap().is_empty());
        assert!(c.feed(b).unwrap().is_empty());
        let put = c.feed(d).unwrap().pop().unwrap();
        assert_eq!(put.get("value"), Some("a;b"));
        c.handle(&mut kvs, &put).unwrap();
        let get = c
            .feed(&v2("cmd=kvs-get;jobid=kvs_a-1.0;srcid=-1;key=k;"))
            .unwrap()
            .pop()
            .unwrap();
        let r = reply_text(c.handle(&mut kvs, &get).unwrap());
        assert!(r.ends_with("cmd=kvs-get-response;found=TRUE;value=a;;b;rc=0;"), "{r}");
        let attr = c
            .feed(&v2("cmd=info-getjobattr;key=PMI_process_mapping;"))
            .unwrap()
            .pop()
            .unwrap();
        assert!(reply_text(c.handle(&mut kvs, &attr).unwrap()).contains("value=(vector,(0,2,1))"));
        let wait = c
            .feed(&v2("cmd=info-getnodeattr;key=shm;wait=TRUE;"))
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(c.handle(&mut kvs, &wait).unwrap(), Action::WaitNodeAttr("shm".into()));
        let fence = c.feed(&v2("cmd=kvs-fence;")).unwrap().pop().unwrap();
        assert_eq!(c.handle(&mut kvs, &fence).unwrap(), Action::Fence);
        assert!(
            String::from_utf8(c.fence_done())
                .unwrap()
                .ends_with("cmd=kvs-fence-response;rc=0;")
        );
        let fin = c.feed(&v2("cmd=finalize;")).unwrap().pop().unwrap();
        assert!(reply_text(c.handle(&mut kvs, &fin).unwrap()).ends_with("cmd=finalize-response;rc=0;"));
    }

    #[test]
    fn a_rank_cannot_claim_another_ranks_place_and_garbage_is_an_error() {
        let mut kvs = Kvs::new("k", 2, process_mapping(&[2]));
        let mut c = Conn::new(0);
        let m = c.feed(&v2("cmd=fullinit;pmirank=1;")).unwrap().pop().unwrap();
        assert!(c.handle(&mut kvs, &m).is_err());
        assert!(Conn::new(0).feed(b"12345x").is_err());
        assert!(Conn::new(0).feed(b"hello\n").is_err());
        assert!(Conn::new(0).feed(&[0xff, b'\n']).is_err());
    }

    #[test]
    fn the_process_mapping_groups_equal_nodes() {
        assert_eq!(process_mapping(&[2, 2]), "(vector,(0,2,2))");
        assert_eq!(process_mapping(&[3, 3, 1]), "(vector,(0,2,3),(2,1,1))");
        assert_eq!(process_mapping(&[1]), "(vector,(0,1,1))");
    }
}
