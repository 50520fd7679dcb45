//! The signer's alerts (`config/prometheus/prometheusrule.yaml`) under `promtool` (Debian's
//! `prometheus` package; `scripts/deps` installs it): the rules check, every alert's unit test
//! in `tests/prometheus/alerts_test.yaml` passes, and every alert has a runbook section, a
//! firing test, and only bounded labels in its aggregations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use serde_yaml::Value;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn rules() -> Vec<Value> {
    let text = std::fs::read_to_string(root().join("config/prometheus/prometheusrule.yaml")).unwrap();
    let rule: Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"]["groups"].as_sequence().unwrap().clone()
}

fn alerts() -> Vec<Value> {
    rules()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().clone())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

#[test]
#[ignore = "needs promtool: Debian prometheus (scripts/deps installs it as root)"]
fn the_alert_rules_check_and_pass_their_unit_tests_in_promtool() {
    let dir = tempfile::tempdir().unwrap();
    let groups = serde_yaml::Mapping::from_iter([(Value::from("groups"), Value::Sequence(rules()))]);
    std::fs::write(dir.path().join("rules.yaml"), serde_yaml::to_string(&groups).unwrap()).unwrap();
    std::fs::copy(
        root().join("tests/prometheus/alerts_test.yaml"),
        dir.path().join("alerts_test.yaml"),
    )
    .unwrap();
    for args in [["check", "rules", "rules.yaml"], ["test", "rules", "alerts_test.yaml"]] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("promtool");
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_alert_has_a_runbook_a_firing_test_and_bounded_labels() {
    let runbooks = std::fs::read_to_string(root().join("docs/runbooks.md")).unwrap();
    let tests = std::fs::read_to_string(root().join("tests/prometheus/alerts_test.yaml")).unwrap();
    // `what`: node_attestation_csrs_withheld_total's two values (request, metadata);
    // `limitation`: node_attestation_workload_limitations' three (kubernetes_minor::Limitation).
    let bounded = [
        "cluster",
        "reason",
        "binding",
        "state",
        "namespace",
        "pod",
        "le",
        "what",
        "limitation",
    ];
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap();
        assert!(
            runbooks.contains(&format!("\n## {name}\n")),
            "{name}: no section in docs/runbooks.md"
        );
        assert_eq!(
            alert["annotations"]["runbook_url"].as_str(),
            Some(format!("docs/runbooks.md#{}", name.to_ascii_lowercase()).as_str()),
            "{name}"
        );
        let fires = tests
            .split("alertname: ")
            .skip(1)
            .any(|case| case.starts_with(name) && case.contains("exp_labels"));
        assert!(fires, "{name}: no test in which it fires");
        let expr = alert["expr"].as_str().unwrap();
        for group in expr.split(" by (").skip(1) {
            let labels = group.split(')').next().unwrap();
            for label in labels.split(',').map(str::trim) {
                assert!(bounded.contains(&label), "{name}: label {label} is not bounded");
            }
        }
        assert!(alert["labels"]["severity"].is_string(), "{name}: no severity");
    }
}
