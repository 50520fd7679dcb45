//! Reading Kubernetes objects from files: YAML or JSON, one or several documents, `List`s
//! flattened (what `kubectl get -o yaml` writes). Every object must have a `kind`: one without
//! is refused here, naming what the flag accepts (the views would compare an empty kind).

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Every object in a file; `accepted` names the kinds the caller takes (for the error about an
/// object without a kind).
pub fn read_objects(path: &Path, accepted: &str) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let objects =
        parse_objects(&text).with_context(|| format!("{} holds no readable Kubernetes object", path.display()))?;
    if let Some(at) = objects.iter().position(|o| kind(o).is_none()) {
        match objects.len() {
            1 => bail!("{} has no kind: expected {accepted}", path.display()),
            n => bail!(
                "object {} of {n} in {} has no kind: expected {accepted}",
                at + 1,
                path.display()
            ),
        }
    }
    Ok(objects)
}

/// Exactly one object from a file (`accepted` as for [`read_objects`]).
pub fn read_one(path: &Path, accepted: &str) -> Result<Value> {
    let mut objects = read_objects(path, accepted)?;
    match objects.len() {
        1 => Ok(objects.remove(0)),
        n => bail!("{} holds {n} objects; expected one", path.display()),
    }
}

/// An object's `kind`, when it has a non-empty one.
pub fn kind(object: &Value) -> Option<&str> {
    object.get("kind").and_then(Value::as_str).filter(|k| !k.is_empty())
}

/// Parses YAML (a superset of JSON) documents, flattening `kind: *List`.
pub fn parse_objects(text: &str) -> Result<Vec<Value>> {
    use serde::Deserialize;
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = Value::deserialize(document).context("not valid YAML or JSON")?;
        flatten(value, &mut objects);
    }
    if objects.is_empty() {
        bail!("no object found");
    }
    Ok(objects)
}

fn flatten(value: Value, into: &mut Vec<Value>) {
    match value {
        Value::Null => {}
        Value::Object(ref map)
            if map
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k.ends_with("List")) =>
        {
            if let Some(Value::Array(items)) = map.get("items") {
                for item in items.clone() {
                    flatten(item, into);
                }
            }
        }
        other => into.push(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_multi_documents_are_flattened() {
        let text = "kind: List\nitems:\n- kind: A\n- kind: B\n---\n{\"kind\": \"C\"}\n---\n";
        let kinds: Vec<_> = parse_objects(text)
            .unwrap()
            .iter()
            .map(|o| o["kind"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(kinds, ["A", "B", "C"]);
    }

    #[test]
    fn empty_and_broken_input_are_errors() {
        assert!(parse_objects("").is_err());
        assert!(parse_objects("kind: [").is_err());
    }

    #[test]
    fn an_object_without_a_kind_is_said_to_have_none_with_what_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let one = dir.path().join("one.yaml");
        std::fs::write(&one, "metadata:\n  name: x\n").unwrap();
        let said = format!("{:#}", read_one(&one, "a Cluster").unwrap_err());
        assert_eq!(said, format!("{} has no kind: expected a Cluster", one.display()));
        let several = dir.path().join("several.yaml");
        std::fs::write(&several, "kind: Machine\n---\nkind: \"\"\n").unwrap();
        let said = format!("{:#}", read_objects(&several, "Machine or MachinePool").unwrap_err());
        assert_eq!(
            said,
            format!(
                "object 2 of 2 in {} has no kind: expected Machine or MachinePool",
                several.display()
            )
        );
        assert!(kind(&serde_json::json!({"kind": 5})).is_none());
    }
}
