//! Reading Kubernetes objects from files: YAML or JSON, one or several documents, `List`s
//! flattened (what `kubectl get -o yaml` writes).

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Every object in a file.
pub fn read_objects(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_objects(&text).with_context(|| format!("{} holds no readable Kubernetes object", path.display()))
}

/// Exactly one object from a file.
pub fn read_one(path: &Path) -> Result<Value> {
    let mut objects = read_objects(path)?;
    match objects.len() {
        1 => Ok(objects.remove(0)),
        n => bail!("{} holds {n} objects; expected one", path.display()),
    }
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
}
