//! What a kube-apiserver's `/metrics` says about its clients, for the scale harnesses: requests
//! by verb and resource, their time and answer sizes, and the watches open now.

use std::collections::BTreeMap;

/// The value of `label` in one exposition line (`name{a="x",b="y"} 1`), if present.
fn label<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    let start = line.find(&format!("{label}=\""))? + label.len() + 2;
    let rest = line.get(start..)?;
    rest.get(..rest.find('"')?)
}

/// The samples of `name` (a counter, or a histogram's `_sum` / `_count`) whose `verb` label is
/// `verb`, summed by their `resource` label.
pub fn by_resource(metrics: &str, name: &str, verb: &str) -> BTreeMap<String, f64> {
    let mut by: BTreeMap<String, f64> = BTreeMap::new();
    let prefix = format!("{name}{{");
    for line in metrics
        .lines()
        .filter(|l| l.starts_with(&prefix) && label(l, "verb") == Some(verb))
    {
        let resource = label(line, "resource").unwrap_or("?").to_owned();
        let value: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        *by.entry(resource).or_default() += value;
    }
    by
}

/// Open WATCH requests by resource (`apiserver_longrunning_requests`), the resources with any.
pub fn watches(metrics: &str) -> Vec<(String, f64)> {
    by_resource(metrics, "apiserver_longrunning_requests", "WATCH")
        .into_iter()
        .filter(|(_, n)| *n > 0.0)
        .collect()
}

/// `later - earlier` per key (a key missing from `earlier` counts from zero), the keys that moved.
pub fn delta(earlier: &BTreeMap<String, f64>, later: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    later
        .iter()
        .map(|(k, v)| (k.clone(), v - earlier.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d != 0.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"apiserver_request_total{code="200",component="apiserver",dry_run="",group="cluster.x-k8s.io",resource="machines",scope="namespace",subresource="",verb="LIST",version="v1beta2"} 12
apiserver_request_total{code="429",component="apiserver",dry_run="",group="cluster.x-k8s.io",resource="machines",scope="namespace",subresource="",verb="LIST",version="v1beta2"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="WATCH",version="v1"} 7
apiserver_longrunning_requests{component="apiserver",group="",resource="nodes",scope="cluster",subresource="",verb="WATCH",version="v1"} 5
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 0
"#;

    #[test]
    fn sums_by_resource_for_one_verb() {
        let lists = by_resource(TEXT, "apiserver_request_total", "LIST");
        assert_eq!(lists.get("machines"), Some(&15.0));
        assert_eq!(lists.len(), 1);
        assert_eq!(watches(TEXT), vec![("nodes".to_owned(), 5.0)]);
    }

    #[test]
    fn delta_keeps_what_moved() {
        let before = BTreeMap::from([("a".to_owned(), 1.0), ("b".to_owned(), 2.0)]);
        let after = BTreeMap::from([("a".to_owned(), 1.0), ("b".to_owned(), 5.0), ("c".to_owned(), 1.0)]);
        let d = delta(&before, &after);
        assert_eq!(d, BTreeMap::from([("b".to_owned(), 3.0), ("c".to_owned(), 1.0)]));
    }
}
