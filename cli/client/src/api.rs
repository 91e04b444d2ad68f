//! Typed calls: the API's operations on its own request and view types (`lattice-control`'s
//! `SubmitRequest`, `AllocationView`, `NodeView`, `TaskRequest`, `LaunchView`), for Rust programs and
//! the `lattice` binary. Every other operation is one [`Client::call`] away (`/openapi.json` lists
//! them).

use crate::error::{Error, Result};
use crate::transport::Client;
use lattice_control::tasks::{LaunchView, TaskRequest};
use lattice_control::{AllocationView, NodeView, SubmitRequest};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What a submission answers: the allocation's id (and a task group's elements).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Submitted {
    pub id: String,
    #[serde(default)]
    pub elements: Vec<String>,
}

/// Which allocations to list (each one given narrows the list).
#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub tenant: Option<String>,
    pub user: Option<String>,
    /// One state, or several comma-separated (`pending,running`).
    pub state: Option<String>,
    pub vcluster: Option<String>,
    /// The caller's own allocations only.
    pub mine: bool,
}

/// `?k=v&...` of the given parameters, percent-encoded.
pub fn query(params: &[(&str, &Option<String>)]) -> String {
    let parts: Vec<String> = params
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", lattice_util::url::component(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// A path segment (an id), percent-encoded (task-group elements have brackets).
fn seg(id: &str) -> String {
    lattice_util::url::component(id)
}

/// `v[key]` (or `v` itself with no key) as `T`.
fn decode<T: DeserializeOwned>(what: &str, v: Value, key: Option<&str>) -> Result<T> {
    let v = match key {
        Some(k) => v.get(k).cloned().unwrap_or(Value::Null),
        None => v,
    };
    serde_json::from_value(v).map_err(|e| Error::Unexpected {
        what: what.into(),
        why: e.to_string(),
    })
}

impl Client {
    /// Queues an allocation (or a task group).
    pub fn submit(&self, request: &SubmitRequest) -> Result<Submitted> {
        let body = serde_json::to_value(request).map_err(|e| Error::Request(e.to_string()))?;
        decode("a submission", self.call("POST", "/v1/allocations", Some(&body))?, None)
    }

    /// One allocation.
    pub fn allocation(&self, id: &str) -> Result<AllocationView> {
        let v = self.call("GET", &format!("/v1/allocations/{}", seg(id)), None)?;
        decode("an allocation", v, None)
    }

    /// The allocations the caller sees, narrowed by `filter`.
    pub fn allocations(&self, filter: &ListFilter) -> Result<Vec<AllocationView>> {
        let mine = filter.mine.then(|| "true".to_string());
        let q = query(&[
            ("tenant", &filter.tenant),
            ("user", &filter.user),
            ("state", &filter.state),
            ("vcluster", &filter.vcluster),
            ("mine", &mine),
        ]);
        let v = self.call("GET", &format!("/v1/allocations{q}"), None)?;
        decode("the allocations", v, Some("allocations"))
    }

    /// Cancels an allocation (a task group: every element); the state it is in afterwards.
    pub fn cancel(&self, id: &str) -> Result<String> {
        let v = self.call("DELETE", &format!("/v1/allocations/{}", seg(id)), None)?;
        decode("a cancel", v, Some("state"))
    }

    /// Waits until the allocation has ended (looking every `every`), for at most `within`: its view
    /// then, or the view it had when the time ran out as [`Error::Request`].
    pub fn wait(&self, id: &str, every: Duration, within: Duration) -> Result<AllocationView> {
        let t0 = Instant::now();
        loop {
            let v = self.allocation(id)?;
            if v.ended_ms.is_some() {
                return Ok(v);
            }
            if t0.elapsed() >= within {
                return Err(Error::Request(format!(
                    "{id} is still {} after {} s",
                    v.state,
                    within.as_secs()
                )));
            }
            std::thread::sleep(every);
        }
    }

    /// The nodes and their state.
    pub fn nodes(&self) -> Result<Vec<NodeView>> {
        decode("the nodes", self.call("GET", "/v1/nodes", None)?, Some("nodes"))
    }

    /// An allocation's stored output of `stream` (`stdout` or `stderr`), by node.
    pub fn logs(&self, id: &str, stream: &str) -> Result<BTreeMap<String, String>> {
        let path = format!("/v1/allocations/{}/logs?stream={}", seg(id), seg(stream));
        decode("the logs", self.call("GET", &path, None)?, Some("nodes"))
    }

    /// Follows an allocation's output of `stream` live, handing each (node, text) to `each`, until it
    /// has ended: the state it ended in.
    pub fn follow_logs(&self, id: &str, stream: &str, mut each: impl FnMut(&str, &str)) -> Result<String> {
        let path = format!("/v1/allocations/{}/logs/stream?stream={}", seg(id), seg(stream));
        let mut end = None;
        let mut failed = None;
        self.events(&path, |event, data| match event {
            "output" => {
                each(
                    data["node"].as_str().unwrap_or_default(),
                    data["data"].as_str().unwrap_or_default(),
                );
                true
            }
            "end" => {
                end = data["state"].as_str().map(str::to_string);
                false
            }
            "error" => {
                failed = Some(data["error"].as_str().unwrap_or("the stream failed").to_string());
                false
            }
            _ => true,
        })?;
        match (end, failed) {
            (Some(state), _) => Ok(state),
            (None, Some(why)) => Err(Error::Request(format!("the log stream ended: {why}"))),
            (None, None) => Err(Error::Request("the log stream ended before the allocation did".into())),
        }
    }

    /// Launches tasks (ranks with a PMI server) in a running allocation.
    pub fn launch(&self, id: &str, request: &TaskRequest) -> Result<LaunchView> {
        let body = serde_json::to_value(request).map_err(|e| Error::Request(e.to_string()))?;
        let v = self.call("POST", &format!("/v1/allocations/{}/tasks", seg(id)), Some(&body))?;
        decode("a task launch", v, None)
    }

    /// One task launch, as it is now (its ranks' exits once they ended).
    pub fn task_launch(&self, id: &str, launch: &str) -> Result<LaunchView> {
        let v = self.call(
            "GET",
            &format!("/v1/allocations/{}/tasks/{}", seg(id), seg(launch)),
            None,
        )?;
        decode("a task launch", v, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_encoded_and_absent_parameters_left_out() {
        assert_eq!(query(&[("a", &None)]), "");
        let q = query(&[
            ("tenant", &Some("phy sics".into())),
            ("user", &None),
            ("state", &Some("running".into())),
        ]);
        assert_eq!(q, "?tenant=phy%20sics&state=running");
        assert_eq!(seg("a-1[3]"), "a-1%5B3%5D");
    }

    #[test]
    fn answers_that_do_not_decode_say_what_was_expected() {
        let e = decode::<Submitted>("a submission", serde_json::json!({"nope": 1}), None).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unexpected answer to a submission: missing field `id`"),
            "{e}"
        );
        let ok: Submitted = decode("a submission", serde_json::json!({"id": "a-1"}), None).unwrap();
        assert_eq!(
            ok,
            Submitted {
                id: "a-1".into(),
                elements: vec![]
            }
        );
    }
}
