//! JSON documents as `google.protobuf.Struct` and back: the answers of the operations whose shape is
//! a REST document, and the rich bodies a few requests carry (`operations.proto`).

use prost_types::value::Kind;
use serde_json::{Map, Number, Value};

/// A JSON value as a protobuf value (numbers are doubles, as in JSON itself).
pub fn to_pb_value(v: Value) -> prost_types::Value {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.into_iter().map(to_pb_value).collect(),
        }),
        Value::Object(m) => Kind::StructValue(to_struct_map(m)),
    };
    prost_types::Value { kind: Some(kind) }
}

fn to_struct_map(m: Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: m.into_iter().map(|(k, v)| (k, to_pb_value(v))).collect(),
    }
}

/// A JSON document as a Struct (a value that is not an object is put under `value`).
pub fn to_struct(v: Value) -> prost_types::Struct {
    match v {
        Value::Object(m) => to_struct_map(m),
        other => to_struct_map(Map::from_iter([("value".to_string(), other)])),
    }
}

/// A protobuf value as JSON: a whole double becomes an integer (so `"nodes": 2` reads as REST's).
pub fn from_pb_value(v: prost_types::Value) -> Value {
    match v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(b),
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9.0e15 {
                if n < 0.0 {
                    Value::from(n as i64)
                } else {
                    Value::from(n as u64)
                }
            } else {
                Number::from_f64(n).map_or(Value::Null, Value::Number)
            }
        }
        Some(Kind::StringValue(s)) => Value::String(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.into_iter().map(from_pb_value).collect()),
        Some(Kind::StructValue(s)) => from_struct(s),
    }
}

/// A Struct as a JSON object.
pub fn from_struct(s: prost_types::Struct) -> Value {
    Value::Object(s.fields.into_iter().map(|(k, v)| (k, from_pb_value(v))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn documents_survive_the_round_trip() {
        let doc = json!({"id": "a-1", "nodes": 2, "ratio": 0.5, "neg": -3, "ok": true, "none": null,
                         "list": [1, "x", {"k": [false]}], "nested": {"deep": {"n": 7}}});
        assert_eq!(from_struct(to_struct(doc.clone())), doc);
        assert_eq!(from_struct(to_struct(json!(5))), json!({"value": 5}));
    }
}
