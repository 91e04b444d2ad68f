//! Prometheus remote-write 1.0 (the book's TSDB push: VictoriaMetrics or any compatible endpoint):
//! the `WriteRequest` protobuf (messages declared here with prost's derive — the wire format of
//! `prometheus/prompb/remote.proto` and `types.proto`, no code generation needed), compressed with
//! snappy's block format, POSTed with the protocol's headers.

use crate::telemetry::Series;

#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// The request for `series` sampled at `timestamp_ms`: labels sorted by name with `__name__` first
/// (the protocol requires sorted labels).
pub fn request(series: &[Series], timestamp_ms: i64) -> WriteRequest {
    WriteRequest {
        timeseries: series
            .iter()
            .map(|s| {
                let mut labels = vec![Label {
                    name: "__name__".into(),
                    value: s.name.to_string(),
                }];
                let mut rest: Vec<Label> = s
                    .labels
                    .iter()
                    .map(|(k, v)| Label {
                        name: k.to_string(),
                        value: v.clone(),
                    })
                    .collect();
                rest.sort_by(|a, b| a.name.cmp(&b.name));
                labels.extend(rest);
                TimeSeries {
                    labels,
                    samples: vec![Sample {
                        value: s.value,
                        timestamp: timestamp_ms,
                    }],
                }
            })
            .collect(),
    }
}

/// The HTTP body: the protobuf, snappy-compressed (block format).
pub fn encode(req: &WriteRequest) -> Vec<u8> {
    let raw = prost::Message::encode_to_vec(req);
    snap::raw::Encoder::new().compress_vec(&raw).unwrap_or_default()
}

/// The inverse of [`encode`] (for receivers and tests).
pub fn decode(body: &[u8]) -> Result<WriteRequest, String> {
    let raw = snap::raw::Decoder::new()
        .decompress_vec(body)
        .map_err(|e| format!("snappy: {e}"))?;
    <WriteRequest as prost::Message>::decode(raw.as_slice()).map_err(|e| format!("protobuf: {e}"))
}

/// The protocol's headers.
pub const HEADERS: [(&str, &str); 3] = [
    ("content-encoding", "snappy"),
    ("content-type", "application/x-protobuf"),
    ("x-prometheus-remote-write-version", "0.1.0"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_with_sorted_labels() {
        let series = vec![Series {
            name: "lattice_alloc_cpu_seconds_total",
            labels: vec![("node", "n1".into()), ("alloc", "a-1".into())],
            value: 2.5,
        }];
        let body = encode(&request(&series, 1_700_000_000_000));
        let back = decode(&body).unwrap();
        let ts = &back.timeseries[0];
        let names: Vec<&str> = ts.labels.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["__name__", "alloc", "node"]);
        assert_eq!(ts.labels[0].value, "lattice_alloc_cpu_seconds_total");
        assert_eq!(
            ts.samples,
            vec![Sample {
                value: 2.5,
                timestamp: 1_700_000_000_000
            }]
        );
        assert!(decode(b"not snappy").is_err());
    }

    #[test]
    fn the_agent_posts_it_with_the_protocol_headers() {
        use std::io::{BufRead, BufReader, Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/api/v1/write", l.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s);
            let (mut headers, mut line) = (Vec::new(), String::new());
            while r.read_line(&mut line).unwrap() > 0 && line != "\r\n" {
                headers.push(line.trim().to_ascii_lowercase());
                line.clear();
            }
            let len: usize = headers
                .iter()
                .find_map(|h| h.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                .unwrap();
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            r.get_mut()
                .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                .unwrap();
            (headers, body)
        });
        let client = crate::client::Client::new("http://unused", None, &Default::default()).unwrap();
        let series = vec![Series {
            name: "lattice_alloc_processes",
            labels: vec![("alloc", "a-7".into()), ("node", "n1".into())],
            value: 3.0,
        }];
        client.remote_write(&url, encode(&request(&series, 42))).unwrap();
        let (headers, body) = server.join().unwrap();
        for (k, v) in HEADERS {
            assert!(headers.contains(&format!("{k}: {v}")), "{headers:?}");
        }
        let got = decode(&body).unwrap();
        assert_eq!(got.timeseries[0].samples[0].value, 3.0);
        assert_eq!(
            got.timeseries[0].labels[1],
            Label {
                name: "alloc".into(),
                value: "a-7".into()
            }
        );
    }
}
