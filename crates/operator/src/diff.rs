//! Whether a live object already holds what we want, so unchanged objects cause no write.
//!
//! The question is the one server-side apply answers: would applying `want` change anything?
//! Fields other managers set (a webhook's sidecar or env var, defaults, status) are not ours and do
//! not count; fields we set before and no longer want do, since applying would remove them. What
//! is ours comes from the live object's `managedFields` entry of our field manager (`fieldsV1`).

use serde_json::Value;

/// True when applying `want` as `manager` would not change `live`: every field of `want` is in
/// `live` with the same value, and `live` holds no field `manager` owns that `want` dropped.
/// Lists of objects with a `name` (containers, env, volumes, mounts, ...) match by name, in any
/// order, as the apiserver merges them; other lists are atomic and match element by element.
pub fn contains(live: &Value, want: &Value, manager: &str) -> bool {
    let owned = owned_fields(live, manager);
    holds(live, want, owned)
}

/// The `fieldsV1` set of `manager`'s Apply entry in `live`'s `managedFields`.
fn owned_fields<'a>(live: &'a Value, manager: &str) -> Option<&'a Value> {
    live["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|m| m["manager"] == manager && m["operation"] == "Apply")
        .and_then(|m| m.get("fieldsV1"))
}

fn holds(live: &Value, want: &Value, owned: Option<&Value>) -> bool {
    match (live, want) {
        (Value::Object(live), Value::Object(want)) => {
            let wanted = want.iter().all(|(k, w)| {
                let sub = owned.and_then(|o| o.get(format!("f:{k}")));
                live.get(k).is_some_and(|l| holds(l, w, sub))
                    || is_empty(w) && live.get(k).is_none_or(is_empty)
            });
            // A field we own that `want` no longer has: applying removes it.
            let dropped = owned.and_then(Value::as_object).is_some_and(|o| {
                o.keys()
                    .filter_map(|f| f.strip_prefix("f:"))
                    .any(|k| !want.contains_key(k) && live.get(k).is_some_and(|v| !is_empty(v)))
            });
            wanted && !dropped
        }
        (Value::Array(live), Value::Array(want)) => match (names(live), names(want)) {
            (Some(live_names), Some(want_names)) => {
                let wanted = want.iter().zip(&want_names).all(|(w, name)| {
                    let sub = owned.and_then(|o| o.get(name_key(name)));
                    live.iter()
                        .zip(&live_names)
                        .find(|(_, n)| *n == name)
                        .is_some_and(|(l, _)| holds(l, w, sub))
                });
                let dropped = live_names.iter().any(|n| {
                    !want_names.contains(n) && owned.is_some_and(|o| o.get(name_key(n)).is_some())
                });
                wanted && !dropped
            }
            _ => live.len() == want.len() && live.iter().zip(want).all(|(l, w)| holds(l, w, None)),
        },
        (Value::Number(l), Value::Number(w)) => l.as_f64() == w.as_f64(),
        _ => live == want,
    }
}

/// The `name` of every element, when every element is an object with a string `name`.
fn names(list: &[Value]) -> Option<Vec<&str>> {
    if list.is_empty() {
        return None;
    }
    list.iter().map(|v| v.get("name")?.as_str()).collect()
}

/// How `fieldsV1` names the element of a list keyed by `name`.
fn name_key(name: &str) -> String {
    format!("k:{}", serde_json::json!({ "name": name }))
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

    const ME: &str = "gpu-operator";

    #[test]
    fn subset_rules() {
        let live = json!({"a": 1, "b": {"c": [ {"x": 1, "y": 2} ], "d": "v"}, "extra": true});
        let contains = |want: Value| contains(&live, &want, ME);
        assert!(contains(json!({"a": 1})));
        assert!(contains(json!({"b": {"c": [{"x": 1}]}})));
        assert!(contains(json!({"a": 1.0})));
        assert!(contains(json!({"empty": {}, "none": null, "list": []})));
        assert!(!contains(json!({"a": 2})));
        assert!(!contains(json!({"b": {"c": [{"x": 1}, {"x": 2}]}})));
        assert!(!contains(json!({"b": {"d": "w"}})));
        assert!(!contains(json!({"missing": "x"})));
    }

    /// A DaemonSet as we apply it, and as the API shows it after a mutating webhook added a
    /// sidecar container and an env var to ours, with our managed fields.
    fn applied_and_mutated() -> (Value, Value) {
        let want = json!({"metadata": {"name": "plugin"}, "spec": {"template": {"spec": {
            "containers": [{"name": "gpus", "image": "p:1", "env": [{"name": "A", "value": "1"}]}]}}}});
        let live = json!({
            "metadata": {"name": "plugin", "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "fieldsV1": {}},
                {"manager": ME, "operation": "Apply", "fieldsV1": {
                    "f:metadata": {"f:name": {}},
                    "f:spec": {"f:template": {"f:spec": {"f:containers": {
                        "k:{\"name\":\"gpus\"}": {".": {}, "f:name": {}, "f:image": {},
                            "f:env": {"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}}}}}}}}}]},
            "spec": {"template": {"spec": {"containers": [
                {"name": "proxy", "image": "mesh:1"},
                {"name": "gpus", "image": "p:1", "imagePullPolicy": "IfNotPresent",
                 "env": [{"name": "INJECTED", "value": "x"}, {"name": "A", "value": "1"}]}]}}},
            "status": {"numberReady": 1}});
        (want, live)
    }

    #[test]
    fn what_a_webhook_added_is_not_a_change() {
        let (want, live) = applied_and_mutated();
        assert!(contains(&live, &want, ME));
    }

    #[test]
    fn a_change_to_our_fields_is_a_change_in_any_list_order() {
        let (mut want, live) = applied_and_mutated();
        want["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = json!("2");
        assert!(!contains(&live, &want, ME));
        let (mut want, live) = applied_and_mutated();
        want["spec"]["template"]["spec"]["containers"][0]["image"] = json!("p:2");
        assert!(!contains(&live, &want, ME));
    }

    #[test]
    fn a_field_we_set_before_and_no_longer_want_is_a_change() {
        // Our env var dropped from what we want: applying removes it.
        let (mut want, live) = applied_and_mutated();
        want["spec"]["template"]["spec"]["containers"][0]["env"] = json!([]);
        assert!(!contains(&live, &want, ME));
        // Our container's image dropped: same.
        let (mut want, live) = applied_and_mutated();
        want["spec"]["template"]["spec"]["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("image");
        assert!(!contains(&live, &want, ME));
    }

    #[test]
    fn without_managed_fields_extra_live_fields_are_not_ours() {
        let (want, mut live) = applied_and_mutated();
        live["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        assert!(contains(&live, &want, ME));
    }
}
