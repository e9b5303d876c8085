//! Whether a live object already holds what we want, so unchanged objects cause no write.

use serde_json::Value;

/// True when every field of `want` is in `live` with the same value. Objects may have extra keys
/// in `live` (defaults, status, other managers' fields); arrays must have the same length and match
/// element by element.
pub fn contains(live: &Value, want: &Value) -> bool {
    match (live, want) {
        (Value::Object(live), Value::Object(want)) => want.iter().all(|(k, w)| {
            live.get(k).is_some_and(|l| contains(l, w))
                || is_empty(w) && live.get(k).is_none_or(is_empty)
        }),
        (Value::Array(live), Value::Array(want)) => {
            live.len() == want.len() && live.iter().zip(want).all(|(l, w)| contains(l, w))
        }
        (Value::Number(l), Value::Number(w)) => l.as_f64() == w.as_f64(),
        _ => live == want,
    }
}

/// Empty maps, lists and nulls, which the apiserver drops.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subset_rules() {
        let live = json!({"a": 1, "b": {"c": [ {"x": 1, "y": 2} ], "d": "v"}, "extra": true});
        assert!(contains(&live, &json!({"a": 1})));
        assert!(contains(&live, &json!({"b": {"c": [{"x": 1}]}})));
        assert!(contains(&live, &json!({"a": 1.0})));
        assert!(contains(
            &live,
            &json!({"empty": {}, "none": null, "list": []})
        ));
        assert!(!contains(&live, &json!({"a": 2})));
        assert!(!contains(&live, &json!({"b": {"c": [{"x": 1}, {"x": 2}]}})));
        assert!(!contains(&live, &json!({"b": {"d": "w"}})));
        assert!(!contains(&live, &json!({"missing": "x"})));
    }
}
