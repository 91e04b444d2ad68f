//! The TSDB the agents push their telemetry to (book: "TSDB Query"): a client of the Prometheus HTTP
//! API (`/api/v1/query`, `/api/v1/query_range`), which Prometheus, VictoriaMetrics and Thanos all
//! serve. `lattice top ID`, `lattice compare` and the diagnostics read allocations' series through it.

use crate::http::{Http, HttpConfig, HttpError};
use std::collections::BTreeMap;

/// One series of an instant query: its labels and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// One series of a range query: its labels and `(unix seconds, value)` points.
#[derive(Clone, Debug, PartialEq)]
pub struct RangeSeries {
    pub labels: BTreeMap<String, String>,
    pub points: Vec<(f64, f64)>,
}

pub struct Tsdb {
    http: Http,
}

/// `k=v&...` with the values percent-encoded (form encoding, as the API reads them).
fn form(params: &[(&str, String)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params.iter().map(|(k, v)| (*k, v.as_str())))
        .finish()
}

impl Tsdb {
    pub fn new(cfg: HttpConfig) -> Result<Tsdb, HttpError> {
        Ok(Tsdb { http: Http::new(cfg)? })
    }

    async fn get(&self, path: &str, params: &[(&str, String)]) -> Result<serde_json::Value, HttpError> {
        let v = self
            .http
            .call(reqwest::Method::GET, &format!("{path}?{}", form(params)), None)
            .await?;
        if v["status"] != "success" {
            return Err(HttpError::Decode {
                method: "GET".into(),
                url: path.into(),
                message: format!("status {}: {}", v["status"], v["error"]),
            });
        }
        Ok(v["data"]["result"].clone())
    }

    /// `promql` evaluated at `at` (unix seconds).
    pub async fn instant(&self, promql: &str, at: f64) -> Result<Vec<Sample>, HttpError> {
        let r = self
            .get(
                "/api/v1/query",
                &[("query", promql.into()), ("time", format!("{at:.3}"))],
            )
            .await?;
        Ok(r.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| {
                Some(Sample {
                    labels: labels(&s["metric"]),
                    value: number(&s["value"][1])?,
                })
            })
            .collect())
    }

    /// `promql` over `[start, end]` (unix seconds) every `step` seconds.
    pub async fn range(&self, promql: &str, start: f64, end: f64, step: f64) -> Result<Vec<RangeSeries>, HttpError> {
        let r = self
            .get(
                "/api/v1/query_range",
                &[
                    ("query", promql.into()),
                    ("start", format!("{start:.3}")),
                    ("end", format!("{end:.3}")),
                    ("step", format!("{step:.3}")),
                ],
            )
            .await?;
        Ok(r.as_array()
            .into_iter()
            .flatten()
            .map(|s| RangeSeries {
                labels: labels(&s["metric"]),
                points: s["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| Some((p[0].as_f64()?, number(&p[1])?)))
                    .collect(),
            })
            .collect())
    }
}

fn labels(v: &serde_json::Value) -> BTreeMap<String, String> {
    v.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// The API's values are strings (`"1.5"`, `"NaN"`, `"+Inf"`); only finite numbers are kept.
fn number(v: &serde_json::Value) -> Option<f64> {
    v.as_str()?.parse::<f64>().ok().filter(|x| x.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::{Json, Router, extract::Query, routing::get};

    #[tokio::test]
    async fn reads_vectors_and_matrices_and_refuses_an_error_answer() {
        async fn query(Query(q): Query<BTreeMap<String, String>>) -> Json<serde_json::Value> {
            if q["query"] == "bad(" {
                return Json(serde_json::json!({"status": "error", "error": "parse error"}));
            }
            Json(
                serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": [
                    {"metric": {"node": "n1", "q": q["query"]}, "value": [q["time"].parse::<f64>().unwrap(), "2.5"]},
                    {"metric": {"node": "n2"}, "value": [1.0, "NaN"]}
                ]}}),
            )
        }
        async fn range(Query(q): Query<BTreeMap<String, String>>) -> Json<serde_json::Value> {
            assert_eq!(q["step"], "2.000");
            Json(
                serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": [
                    {"metric": {"alloc": "a-1"}, "values": [[10.0, "1"], [12.0, "3"]]}
                ]}}),
            )
        }
        let app = Router::new()
            .route("/api/v1/query", get(query))
            .route("/api/v1/query_range", get(range));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        let t = Tsdb::new(HttpConfig::new(&format!("http://{addr}"))).unwrap();
        // The PromQL travels intact through the query string (braces, quotes, `=~`, `|`, spaces).
        let q = r#"sum by (node) (rate(x{alloc="a-1",node=~"n1|n2"}[30s]))"#;
        let v = t.instant(q, 100.0).await.unwrap();
        assert_eq!(v.len(), 1, "NaN is dropped");
        assert_eq!(v[0].value, 2.5);
        assert_eq!(v[0].labels["q"], q);
        let r = t.range("x", 10.0, 12.0, 2.0).await.unwrap();
        assert_eq!(r[0].points, vec![(10.0, 1.0), (12.0, 3.0)]);
        let e = t.instant("bad(", 1.0).await.unwrap_err().to_string();
        assert!(e.contains("parse error"), "{e}");
    }
}
