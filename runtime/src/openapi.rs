//! The REST API as an OpenAPI 3.1 document, served at `GET /openapi.json`. Each route of
//! [`crate::api::router`] is described by an [`Op`] in [`crate::api::documented`], next to the
//! router. Its request body, query parameters and answer are JSON Schemas derived (schemars) from the
//! very types the handlers deserialize and serialize, doc comments included, so the document cannot
//! drift from what the server accepts. A test checks both directions: every route the router serves is
//! documented, and every documented route exists on a live server.

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{Map, Value, json};

type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// One documented operation.
#[derive(Clone)]
pub struct Op {
    pub method: &'static str,
    pub path: &'static str,
    pub tag: &'static str,
    pub summary: &'static str,
    /// Needs no token (`/healthz`, `/metrics`, this document).
    pub open: bool,
    body: Option<SchemaFn>,
    query: Option<SchemaFn>,
    /// The success answer: its status and body (`None`: JSON not described further).
    status: u16,
    answer: Option<SchemaFn>,
    /// The answer wraps a list of `answer` under this key (`{"allocations": [...]}`).
    list_key: Option<&'static str>,
    text: bool,
}

impl Op {
    fn new(method: &'static str, path: &'static str, tag: &'static str, summary: &'static str) -> Op {
        Op {
            method,
            path,
            tag,
            summary,
            open: false,
            body: None,
            query: None,
            status: 200,
            answer: None,
            list_key: None,
            text: false,
        }
    }

    pub fn get(path: &'static str, tag: &'static str, summary: &'static str) -> Op {
        Op::new("get", path, tag, summary)
    }

    pub fn post(path: &'static str, tag: &'static str, summary: &'static str) -> Op {
        Op::new("post", path, tag, summary)
    }

    pub fn put(path: &'static str, tag: &'static str, summary: &'static str) -> Op {
        Op::new("put", path, tag, summary)
    }

    pub fn patch(path: &'static str, tag: &'static str, summary: &'static str) -> Op {
        Op::new("patch", path, tag, summary)
    }

    pub fn delete(path: &'static str, tag: &'static str, summary: &'static str) -> Op {
        Op::new("delete", path, tag, summary)
    }

    pub fn open(mut self) -> Op {
        self.open = true;
        self
    }

    pub fn text(mut self) -> Op {
        self.text = true;
        self
    }

    pub fn status(mut self, status: u16) -> Op {
        self.status = status;
        self
    }

    pub fn body<T: JsonSchema>(mut self) -> Op {
        self.body = Some(|g| g.subschema_for::<T>());
        self
    }

    pub fn query<T: JsonSchema>(mut self) -> Op {
        self.query = Some(|g| g.root_schema_for::<T>());
        self
    }

    pub fn answer<T: JsonSchema>(mut self) -> Op {
        self.answer = Some(|g| g.subschema_for::<T>());
        self
    }

    pub fn answer_list<T: JsonSchema>(mut self, key: &'static str) -> Op {
        self.answer = Some(|g| g.subschema_for::<T>());
        self.list_key = Some(key);
        self
    }
}

/// The document for `ops`.
pub fn document(ops: &[Op]) -> Value {
    let mut g = SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "/components/schemas".into())
        .into_generator();
    let mut paths: Map<String, Value> = Map::new();
    for op in ops {
        let mut params: Vec<Value> = op
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        if let Some(q) = op.query {
            let s = q(&mut g).to_value();
            let required: Vec<&str> = s["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            for (name, schema) in s["properties"].as_object().into_iter().flatten() {
                let mut schema = schema.clone();
                let description = schema.as_object_mut().and_then(|o| o.remove("description"));
                let mut p = json!({"name": name, "in": "query", "required": required.contains(&name.as_str()),
                    "schema": schema});
                if let Some(d) = description {
                    p["description"] = d;
                }
                params.push(p);
            }
        }
        let ok_body = match (op.answer, op.list_key, op.text) {
            (_, _, true) => json!({"text/plain": {"schema": {"type": "string"}}}),
            (Some(a), Some(key), _) => {
                let item = a(&mut g).to_value();
                json!({"application/json": {"schema": {"type": "object", "required": [key],
                    "properties": {key: {"type": "array", "items": item}}}}})
            }
            (Some(a), None, _) => json!({"application/json": {"schema": a(&mut g).to_value()}}),
            (None, _, _) => json!({"application/json": {"schema": {"type": "object"}}}),
        };
        let mut o = json!({
            "operationId": operation_id(op),
            "summary": op.summary,
            "tags": [op.tag],
            "parameters": params,
            "responses": {
                op.status.to_string(): {"description": "Success", "content": ok_body},
                "default": {"$ref": "#/components/responses/Error"},
            },
        });
        if let Some(b) = op.body {
            o["requestBody"] = json!({"required": true,
                "content": {"application/json": {"schema": b(&mut g).to_value()}}});
        }
        if op.open {
            o["security"] = json!([]);
        }
        paths
            .entry(op.path.to_string())
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .expect("an object")
            .insert(op.method.to_string(), o);
    }
    let schemas: Map<String, Value> = g.take_definitions(true).into_iter().collect();
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Lattice REST API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The control plane's REST API (book: \"API Design\"). Bearer JWTs on every route but the open ones; errors are {\"error\", \"field\"}.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
            "responses": {"Error": {
                "description": "An error: what is wrong, and the request field it concerns when there is one (400 invalid, 401 no valid token, 403 not allowed, 404 no such object, 409 wrong state, 429 rate limited with Retry-After, 503 not the leader or not yet durable).",
                "content": {"application/json": {"schema": {"type": "object", "required": ["error"],
                    "properties": {"error": {"type": "string"}, "field": {"type": "string"}}}}},
            }},
        },
        "security": [{"bearer": []}],
    })
}

/// `get_v1_allocations_id` for `GET /v1/allocations/{id}`.
fn operation_id(op: &Op) -> String {
    let mut id = op.method.to_string();
    for seg in op.path.split('/').filter(|s| !s.is_empty()) {
        id.push('_');
        id.extend(
            seg.chars()
                .filter(|c| !matches!(c, '{' | '}'))
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
        );
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(JsonSchema, serde::Deserialize)]
    #[allow(dead_code)]
    struct Q {
        /// Only these.
        state: Option<String>,
        limit: u32,
    }

    #[derive(JsonSchema, serde::Deserialize)]
    #[allow(dead_code)]
    struct B {
        name: String,
    }

    #[test]
    fn operations_parameters_and_schemas() {
        let doc = document(&[
            Op::get("/v1/things/{id}", "things", "A thing")
                .query::<Q>()
                .answer::<B>(),
            Op::post("/v1/things", "things", "Make one").body::<B>().status(201),
            Op::get("/healthz", "meta", "Up").open(),
        ]);
        let get = &doc["paths"]["/v1/things/{id}"]["get"];
        assert_eq!(get["operationId"], "get_v1_things_id");
        let params = get["parameters"].as_array().unwrap();
        assert_eq!(params[0]["name"], "id");
        assert_eq!(params[0]["in"], "path");
        let state = params.iter().find(|p| p["name"] == "state").unwrap();
        assert_eq!(
            (state["required"].as_bool(), state["description"].as_str()),
            (Some(false), Some("Only these."))
        );
        assert_eq!(params.iter().find(|p| p["name"] == "limit").unwrap()["required"], true);
        assert_eq!(
            get["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/B"
        );
        assert!(
            doc["components"]["schemas"]["B"]["properties"]["name"].is_object(),
            "{doc}"
        );
        assert!(doc["paths"]["/v1/things"]["post"]["responses"]["201"].is_object());
        assert_eq!(doc["paths"]["/healthz"]["get"]["security"], json!([]));
    }
}
