//! The agent protocol without I/O: what an agent asks the control plane and when, and what it makes
//! of each answer — registration, heartbeats with a strictly increasing sequence (buffered while the
//! control plane is unreachable, replayed in order with the next one), polls for work, exit reports
//! kept until taken, the lease every accepted heartbeat answers and when it runs out, and which of
//! the control plane's endpoints to ask next.
//!
//! [`crate::agent`] drives a [`Session`] with blocking HTTP ([`crate::client`]) and real processes;
//! `lattice-dst` drives the same [`Session`] over its simulated network with simulated
//! processes, so the protocol checked under faults there is the one that runs on nodes.
//!
//! Time is passed in: `now` is monotonic (from any fixed origin), `wall_ms` is milliseconds since the
//! Unix epoch and only stamps buffered heartbeats.

use lattice_agent_protocol::{
    Buffered, CacheOutcome, CachedImage, DataAccess, ExitKind, ExitReport, HeartbeatBody, Metric, Outcome, Output,
    RegisterBody, Startup, TaskEnd, Work, WorkPoll,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::time::Duration;

/// Outcomes an agent reports with its next poll.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reports {
    pub checkpointed: Vec<Outcome>,
    pub wiped: Vec<Outcome>,
    /// Scaling metrics of allocations on this node (built-in and application-reported).
    pub metrics: Vec<Metric>,
    /// Task launches that ended on this node.
    pub task_ends: Vec<TaskEnd>,
    /// Task launches that run on this node now.
    pub tasks_running: Vec<String>,
    /// Outcomes of cache orders, and the cache's contents when they changed.
    pub cache_done: Vec<CacheOutcome>,
    pub cache: Option<Vec<CachedImage>>,
    /// Allocations started here since the last poll: seconds from the work answer that assigned
    /// them to their processes' start (uenv pull and mount included).
    pub startups: Vec<Startup>,
    /// The last telemetry collection's CPU time over its period, percent of one core.
    pub collection_overhead_pct: Option<f64>,
    /// Audit mode: opens under sensitive allocations' data mounts since the last poll.
    pub data_access: Vec<DataAccess>,
}

/// What a heartbeat answered: the node's state and the agent's lease — how long it may keep running
/// its work without another accepted heartbeat (the control plane may requeue it elsewhere after).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Beat {
    pub state: String,
    pub lease: Option<std::time::Duration>,
}

/// Heartbeats kept during a partition (a day at the default 10 s interval); the oldest are dropped
/// (and counted) beyond it.
pub const MAX_BUFFERED: usize = 8640;

/// One request to the control plane: a POST of `body` to `path`.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub path: String,
    pub body: Value,
}

/// Why a request did not succeed, as far as the protocol tells failures apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The control plane does not know this agent (it restarted, or a new leader): register again.
    Unregistered,
    /// Not reached or not answered, not the leader (421), or unavailable (502–504): the request
    /// stands, and the next endpoint is asked.
    Elsewhere,
    /// Refused for good (e.g. the exit of an allocation the control plane no longer runs here).
    Refused,
}

impl Failure {
    /// The failure an answer means: `status` is `None` when there was none.
    pub fn of(status: Option<u16>, body: &str) -> Failure {
        match status {
            None | Some(421 | 502 | 503 | 504) => Failure::Elsewhere,
            Some(_) if body.contains("has not registered") => Failure::Unregistered,
            Some(_) => Failure::Refused,
        }
    }
}

/// A process's end not yet taken by the control plane. Kept on disk beside the agent's state file,
/// so an agent restarted before the control plane took it still reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    pub id: String,
    pub kind: ExitKind,
    pub code: i32,
    /// The newest stdout, for the control plane's log of the allocation.
    pub tail: String,
    /// The newest stderr (absent in an exit an older agent kept on disk).
    #[serde(default)]
    pub err_tail: String,
}

pub fn register(node: &str, caps: &crate::discovery::Capabilities, fingerprint: &str) -> Request {
    register_with(node, caps, fingerprint, None)
}

/// [`register`] with the address of this agent's own service (task launches' fences go there).
pub fn register_with(
    node: &str,
    caps: &crate::discovery::Capabilities,
    fingerprint: &str,
    peer: Option<&str>,
) -> Request {
    let body = RegisterBody {
        fingerprint: Some(fingerprint.to_string()),
        capabilities: Some(json!(caps)),
        peer: peer.map(str::to_string),
    };
    Request {
        path: format!("/v1/nodes/{node}/register"),
        body: wire(&body),
    }
}

pub fn heartbeat(node: &str, seq: u64, buffered: &[Buffered]) -> Request {
    let body = HeartbeatBody {
        seq,
        buffered: buffered.to_vec(),
        rtt_ms: None,
    };
    Request {
        path: format!("/v1/nodes/{node}/heartbeat"),
        body: wire(&body),
    }
}

/// A poll for work, with the new output of followed allocations and the outcomes of checkpoint
/// hints and wipes since the last poll.
pub fn work(node: &str, running: &[String], output: &[Output], reports: &Reports) -> Request {
    let body = WorkPoll {
        running: running.to_vec(),
        output: output.to_vec(),
        checkpointed: reports.checkpointed.clone(),
        wiped: reports.wiped.clone(),
        metrics: reports.metrics.clone(),
        task_ends: reports.task_ends.clone(),
        tasks: reports.tasks_running.clone(),
        cache_done: reports.cache_done.clone(),
        cache: reports.cache.clone(),
        startups: reports.startups.clone(),
        collection_overhead_pct: reports.collection_overhead_pct,
        data_access: reports.data_access.clone(),
    };
    Request {
        path: format!("/v1/nodes/{node}/work"),
        body: wire(&body),
    }
}

pub fn exit(node: &str, e: &Exit) -> Request {
    Request {
        path: format!("/v1/allocations/{}/exit", lattice_util::url::segment(&e.id)),
        body: wire(&ExitReport {
            node: node.to_string(),
            kind: e.kind,
            exit_code: e.code,
            log_tail: Some(e.tail.clone()),
            err_tail: Some(e.err_tail.clone()),
        }),
    }
}

/// A request body as JSON (its keys sorted, as serde_json's map keeps them).
fn wire<T: Serialize>(body: &T) -> Value {
    serde_json::to_value(body).expect("the wire types serialize")
}

/// A heartbeat's answer.
pub fn beat(v: &Value) -> Beat {
    Beat {
        state: v["state"].as_str().unwrap_or_default().to_string(),
        lease: v["lease_ms"].as_u64().map(Duration::from_millis),
    }
}

/// A poll's answer (an answer that is not work is no answer: the poll is asked again).
pub fn parse_work(v: Value) -> Result<Work, String> {
    serde_json::from_value(v).map_err(|e| format!("unexpected answer: {e}"))
}

/// Whether work must stop now: a heartbeat is overdue (none accepted for two intervals) and what is
/// left of the lease — counted from when the last accepted heartbeat was *sent*, no later than the
/// control plane received it — is no more than the processes' stop `grace` and two heartbeats. So
/// the work has stopped before the control plane may requeue it elsewhere.
pub fn lease_over(quiet: Duration, lease: Duration, heartbeat: Duration, grace: Duration) -> bool {
    quiet > 2 * heartbeat && quiet + grace + 2 * heartbeat >= lease
}

/// A lease too short for this agent's stop `grace`: [`lease_over`] is true as soon as two heartbeats
/// are missed, so any leader election stops the work. The control plane's lease is its
/// `agents.heartbeat_timeout` plus `agents.grace`.
pub fn lease_too_short(lease: Duration, heartbeat: Duration, grace: Duration) -> bool {
    lease <= grace + 4 * heartbeat
}

/// What became of a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Beaten {
    /// Taken, with `replayed` buffered ones before it (`dropped` more did not fit the buffer).
    Accepted { replayed: usize, dropped: u64 },
    /// Not delivered: kept for the next one (`first`: the first of a partition).
    Buffered { first: bool },
    /// The control plane does not know this agent: it registers again (a new sequence).
    Unregistered,
    /// Refused (e.g. as a replay): what was buffered is not taken either.
    Refused,
}

/// One agent's side of the protocol.
#[derive(Clone, Debug)]
pub struct Session {
    node: String,
    endpoints: usize,
    target: usize,
    registered: bool,
    seq: u64,
    buffered: VecDeque<Buffered>,
    dropped: u64,
    last_beat: Option<Duration>,
    /// The last accepted heartbeat: when it was sent, and its lease.
    lease: Option<(Duration, Duration)>,
    unreported: Vec<Exit>,
}

impl Session {
    /// A session of `node` with `endpoints` control-plane endpoints, asking `first` first.
    pub fn new(node: &str, endpoints: usize, first: usize) -> Session {
        let endpoints = endpoints.max(1);
        Session {
            node: node.to_string(),
            endpoints,
            target: first % endpoints,
            registered: false,
            seq: 0,
            buffered: VecDeque::new(),
            dropped: 0,
            last_beat: None,
            lease: None,
            unreported: Vec::new(),
        }
    }

    /// The endpoint to ask (an index into the agent's list).
    pub fn target(&self) -> usize {
        self.target
    }

    /// The sequence of the last heartbeat sent under this registration.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether heartbeats are being buffered (the control plane was not reached).
    pub fn partitioned(&self) -> bool {
        !self.buffered.is_empty()
    }

    fn failed(&mut self, f: Failure) {
        match f {
            Failure::Elsewhere => self.target = (self.target + 1) % self.endpoints,
            Failure::Unregistered => self.registered = false,
            Failure::Refused => {}
        }
    }

    /// Whether the agent must register (first, or the control plane forgot it).
    pub fn must_register(&self) -> bool {
        !self.registered
    }

    /// Registers again (e.g. to report a new conformance fingerprint) before the next heartbeat.
    pub fn register_again(&mut self) {
        self.registered = false;
    }

    /// A registration's answer: a new registration starts a new sequence, and what was buffered
    /// belongs to the old one.
    pub fn registered(&mut self, answer: Result<(), Failure>) {
        match answer {
            Ok(()) => {
                self.registered = true;
                self.seq = 0;
                self.buffered.clear();
                self.dropped = 0;
            }
            Err(f) => self.failed(f),
        }
    }

    /// The heartbeat due at `now` (every `every`), with the buffered ones replayed before it.
    pub fn heartbeat_due(&mut self, now: Duration, every: Duration) -> Option<Request> {
        if !self.registered || self.last_beat.is_some_and(|t| now.saturating_sub(t) < every) {
            return None;
        }
        self.seq += 1;
        self.last_beat = Some(now);
        let replay: Vec<Buffered> = self.buffered.iter().copied().collect();
        Some(heartbeat(&self.node, self.seq, &replay))
    }

    /// The last heartbeat's answer (`wall_ms`: now, to stamp it if it is buffered).
    pub fn heartbeat_answered(&mut self, answer: Result<Beat, Failure>, wall_ms: u64) -> Beaten {
        match answer {
            Ok(beat) => {
                if let (Some(l), Some(sent)) = (beat.lease, self.last_beat) {
                    self.lease = Some((sent, l));
                }
                let out = Beaten::Accepted {
                    replayed: self.buffered.len(),
                    dropped: self.dropped,
                };
                self.buffered.clear();
                self.dropped = 0;
                out
            }
            Err(Failure::Unregistered) => {
                self.failed(Failure::Unregistered);
                self.buffered.clear();
                Beaten::Unregistered
            }
            Err(Failure::Elsewhere) => {
                self.failed(Failure::Elsewhere);
                let first = self.buffered.is_empty();
                if self.buffered.len() == MAX_BUFFERED {
                    self.buffered.pop_front();
                    self.dropped += 1;
                }
                self.buffered.push_back(Buffered {
                    seq: self.seq,
                    at_ms: wall_ms,
                });
                Beaten::Buffered { first }
            }
            Err(Failure::Refused) => {
                self.buffered.clear();
                Beaten::Refused
            }
        }
    }

    /// The last accepted heartbeat: when it was sent (on this session's clock) and its lease.
    pub fn lease(&self) -> Option<(Duration, Duration)> {
        self.lease
    }

    /// Takes over the lease a previous agent of this node held (from its state files).
    pub fn renewed(&mut self, sent: Duration, lease: Duration) {
        self.lease = Some((sent, lease));
    }

    /// Whether work must stop at `now` ([`lease_over`]): how long ago the last accepted heartbeat
    /// was sent, and its lease. Never before a heartbeat was accepted.
    pub fn fenced(&self, now: Duration, heartbeat: Duration, grace: Duration) -> Option<(Duration, Duration)> {
        let (sent, lease) = self.lease?;
        let quiet = now.saturating_sub(sent);
        lease_over(quiet, lease, heartbeat, grace).then_some((quiet, lease))
    }

    /// A process ended: its exit is reported until taken.
    pub fn ended(&mut self, e: Exit) {
        if !self.unreported.iter().any(|u| u.id == e.id) {
            self.unreported.push(e);
        }
    }

    /// The exits not yet taken, oldest first.
    pub fn unreported(&self) -> &[Exit] {
        &self.unreported
    }

    /// An exit report's answer: taken or refused for good, it is done (true); otherwise it is asked
    /// again with the next poll.
    pub fn exit_answered(&mut self, id: &str, answer: Result<(), Failure>) -> bool {
        let done = match answer {
            Ok(()) | Err(Failure::Refused) => true,
            Err(f) => {
                self.failed(f);
                false
            }
        };
        if done {
            self.unreported.retain(|e| e.id != id);
        }
        done
    }

    /// A poll's answer: the work to do, without launches of what this node already runs
    /// (`running`) or has ended and not yet reported (a launch sent again before its exit was
    /// taken must not start a second run).
    pub fn work_answered(&mut self, answer: Result<Work, Failure>, running: impl Fn(&str) -> bool) -> Option<Work> {
        match answer {
            Ok(mut w) => {
                w.launch
                    .retain(|l| !running(&l.id) && !self.unreported.iter().any(|e| e.id == l.id));
                Some(w)
            }
            Err(f) => {
                self.failed(f);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_lease_shorter_than_the_stop_grace_is_told_apart() {
        use super::{lease_over, lease_too_short};
        let s = std::time::Duration::from_secs;
        let (hb, grace) = (std::time::Duration::from_millis(200), s(30));
        // The defaults: a 90 s lease rides out a 10 s election.
        assert!(!lease_too_short(s(90), hb, grace));
        assert!(!lease_over(s(10), s(90), hb, grace));
        // 5 s + 10 s: any two missed heartbeats stop the work.
        assert!(lease_too_short(s(15), hb, grace));
        assert!(lease_over(std::time::Duration::from_millis(500), s(15), hb, grace));
    }

    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn registered(endpoints: usize) -> Session {
        let mut s = Session::new("n1", endpoints, 0);
        assert!(s.must_register());
        assert_eq!(
            s.heartbeat_due(Duration::ZERO, S),
            None,
            "no heartbeat before registering"
        );
        s.registered(Ok(()));
        s
    }

    fn seq_of(r: &Request) -> (u64, Vec<u64>) {
        let replay = r.body["buffered"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| b["seq"].as_u64().unwrap())
            .collect();
        (r.body["seq"].as_u64().unwrap(), replay)
    }

    #[test]
    fn answers_are_told_apart_by_status_and_body() {
        assert_eq!(Failure::of(None, ""), Failure::Elsewhere);
        for s in [421, 502, 503, 504] {
            assert_eq!(Failure::of(Some(s), "{}"), Failure::Elsewhere, "{s}");
        }
        assert_eq!(
            Failure::of(Some(400), r#"{"error":"n1 has not registered"}"#),
            Failure::Unregistered
        );
        assert_eq!(
            Failure::of(Some(404), r#"{"error":"no allocation a-1"}"#),
            Failure::Refused
        );
    }

    #[test]
    fn heartbeats_are_due_every_interval_with_a_sequence_that_only_grows() {
        let mut s = registered(1);
        let first = s.heartbeat_due(Duration::ZERO, S).unwrap();
        assert_eq!(first.path, "/v1/nodes/n1/heartbeat");
        assert_eq!(seq_of(&first), (1, vec![]));
        s.heartbeat_answered(Ok(Beat::default()), 0);
        assert_eq!(s.heartbeat_due(S / 2, S), None, "not yet due");
        assert_eq!(seq_of(&s.heartbeat_due(S, S).unwrap()).0, 2);
    }

    #[test]
    fn undelivered_heartbeats_are_replayed_in_order_and_a_new_registration_forgets_them() {
        let mut s = registered(1);
        for t in 0..3u64 {
            s.heartbeat_due(S * t as u32, S).unwrap();
            let b = s.heartbeat_answered(Err(Failure::Elsewhere), 1000 + t);
            assert_eq!(b, Beaten::Buffered { first: t == 0 });
        }
        assert!(s.partitioned());
        let r = s.heartbeat_due(S * 3, S).unwrap();
        assert_eq!(seq_of(&r), (4, vec![1, 2, 3]));
        assert_eq!(r.body["buffered"][2]["at_ms"], 1002);
        let lease = Beat {
            state: "ready".into(),
            lease: Some(S * 30),
        };
        assert_eq!(
            s.heartbeat_answered(Ok(lease), 0),
            Beaten::Accepted {
                replayed: 3,
                dropped: 0
            }
        );
        assert!(!s.partitioned());
        assert_eq!(s.lease(), Some((S * 3, S * 30)), "counted from when it was sent");
        // Buffered again, then the control plane forgot the agent: a new sequence, nothing replayed.
        s.heartbeat_due(S * 4, S).unwrap();
        s.heartbeat_answered(Err(Failure::Elsewhere), 0);
        s.heartbeat_due(S * 5, S).unwrap();
        assert_eq!(
            s.heartbeat_answered(Err(Failure::Unregistered), 0),
            Beaten::Unregistered
        );
        assert!(s.must_register());
        assert_eq!(s.heartbeat_due(S * 6, S), None);
        s.registered(Ok(()));
        assert_eq!(seq_of(&s.heartbeat_due(S * 6, S).unwrap()), (1, vec![]));
    }

    #[test]
    fn the_buffer_keeps_the_newest_heartbeats_and_counts_the_dropped() {
        let mut s = registered(1);
        for t in 0..MAX_BUFFERED as u64 + 5 {
            s.heartbeat_due(S * t as u32, S).unwrap();
            s.heartbeat_answered(Err(Failure::Elsewhere), t);
        }
        let r = s.heartbeat_due(S * 10_000, S).unwrap();
        let (_, replay) = seq_of(&r);
        assert_eq!((replay.len(), replay[0]), (MAX_BUFFERED, 6));
        assert_eq!(
            s.heartbeat_answered(Ok(Beat::default()), 0),
            Beaten::Accepted {
                replayed: MAX_BUFFERED,
                dropped: 5
            }
        );
    }

    #[test]
    fn a_refused_heartbeat_drops_the_batch_it_carried() {
        let mut s = registered(1);
        s.heartbeat_due(Duration::ZERO, S).unwrap();
        s.heartbeat_answered(Err(Failure::Elsewhere), 0);
        s.heartbeat_due(S, S).unwrap();
        assert_eq!(s.heartbeat_answered(Err(Failure::Refused), 0), Beaten::Refused);
        assert_eq!(seq_of(&s.heartbeat_due(S * 2, S).unwrap()), (3, vec![]));
    }

    #[test]
    fn an_unreachable_endpoint_moves_the_agent_to_the_next_one() {
        let mut s = registered(3);
        assert_eq!(s.target(), 0);
        s.heartbeat_due(Duration::ZERO, S).unwrap();
        s.heartbeat_answered(Err(Failure::Elsewhere), 0);
        assert_eq!(s.target(), 1);
        s.work_answered(Err(Failure::Elsewhere), |_| false);
        s.work_answered(Err(Failure::Elsewhere), |_| false);
        assert_eq!(s.target(), 0, "round the list");
        s.work_answered(Err(Failure::Refused), |_| false);
        assert_eq!(s.target(), 0, "a refusal is an answer");
    }

    #[test]
    fn exits_are_kept_until_taken_or_refused_for_good() {
        let mut s = registered(2);
        let e = |id: &str| Exit {
            id: id.into(),
            kind: ExitKind::Exited,
            code: 0,
            tail: String::new(),
            err_tail: String::new(),
        };
        s.ended(e("a-1"));
        s.ended(e("a-1"));
        s.ended(e("a-2"));
        assert_eq!(s.unreported().len(), 2, "one report per exit");
        assert!(!s.exit_answered("a-1", Err(Failure::Elsewhere)));
        assert!(!s.exit_answered("a-1", Err(Failure::Unregistered)));
        assert!(s.must_register());
        assert!(s.exit_answered("a-1", Ok(())));
        assert!(s.exit_answered("a-2", Err(Failure::Refused)));
        assert!(s.unreported().is_empty());
        let r = exit("n1", &e("a-3"));
        assert_eq!(r.path, "/v1/allocations/a-3/exit");
        // Task group elements keep their id; nothing an id holds leaves its path segment.
        assert_eq!(exit("n1", &e("a-1[2]")).path, "/v1/allocations/a-1%5B2%5D/exit");
        assert_eq!(
            exit("n1", &e("../nodes/n1/drain?x")).path,
            "/v1/allocations/..%2Fnodes%2Fn1%2Fdrain%3Fx/exit"
        );
        assert_eq!(exit("n1", &e("..")).path, "/v1/allocations/%2E%2E/exit");
        assert_eq!(r.body["kind"], "exited");
    }

    #[test]
    fn a_launch_of_what_runs_or_awaits_its_report_is_not_started_again() {
        let mut s = registered(1);
        s.ended(Exit {
            id: "a-2".into(),
            kind: ExitKind::Exited,
            code: 0,
            tail: String::new(),
            err_tail: String::new(),
        });
        let launches = ["a-1", "a-2", "a-3"].map(|id| {
            json!({"id": id, "entrypoint": "true", "nodes": ["n1"], "task_index": 0, "walltime_s": null,
                "tenant": "t", "user": null})
        });
        let v = json!({"kill": [], "launch": launches});
        let w = s.work_answered(Ok(parse_work(v).unwrap()), |id| id == "a-1").unwrap();
        let ids: Vec<&str> = w.launch.iter().map(|l| l.id.as_str()).collect();
        assert_eq!(ids, ["a-3"]);
        assert!(parse_work(json!({"launch": 3})).is_err());
    }

    #[test]
    fn work_stops_once_the_lease_less_the_stop_grace_and_two_beats_has_run_out() {
        let mut s = registered(1);
        let (beat, grace) = (S * 10, S * 30);
        assert_eq!(
            s.fenced(S * 500, beat, grace),
            None,
            "never heard back: nothing to count from"
        );
        s.renewed(Duration::ZERO, S * 90);
        // 39 s after the accepted heartbeat was sent: 39 + 30 + 20 < 90.
        assert_eq!(s.fenced(S * 39, beat, grace), None);
        assert_eq!(s.fenced(S * 41, beat, grace), Some((S * 41, S * 90)));
        // A lease shorter than the margin: stopped as soon as a heartbeat is overdue, not before.
        s.renewed(Duration::ZERO, S * 3);
        assert_eq!(s.fenced(S * 19, beat, grace), None);
        assert!(s.fenced(S * 21, beat, grace).is_some());
    }
}
