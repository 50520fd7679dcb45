//! A real Prometheus server (Debian's `prometheus` package) for the cluster suites: it scrapes
//! the signer every second, evaluates the shipped alert rules (their `for` shortened, so a
//! suite sees them fire in seconds), and answers queries and the alerts list over its HTTP API.

#![allow(clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The server binary, if installed.
pub fn binary() -> Option<&'static str> {
    ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
}

/// The shipped rules (`config/prometheus/prometheusrule.yaml`) as a Prometheus rule file, every
/// alert's `for` set to `hold`.
pub fn shipped_rules(hold: &str) -> String {
    let path = crate::repo_root().join("config/prometheus/prometheusrule.yaml");
    let rule: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).expect("the PrometheusRule")).expect("YAML");
    let mut groups = rule["spec"]["groups"].clone();
    for group in groups.as_sequence_mut().expect("groups") {
        for rule in group["rules"].as_sequence_mut().expect("rules") {
            if let Some(map) = rule.as_mapping_mut()
                && map.contains_key("for")
            {
                map.insert("for".into(), hold.into());
            }
        }
    }
    let mut file = serde_yaml::Mapping::new();
    file.insert("groups".into(), groups);
    serde_yaml::to_string(&file).expect("rules YAML")
}

/// One Prometheus on loopback; killed on drop.
pub struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    /// Starts Prometheus in `dir` scraping `target` (`host:port`, path `/metrics`) every second
    /// with `rules` evaluated every second.
    pub fn start(dir: &Path, target: &str, rules: &str) -> Self {
        let binary = binary().expect("prometheus is not installed: scripts/deps installs Debian prometheus (as root)");
        std::fs::write(dir.join("rules.yaml"), rules).expect("rules file");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n- rules.yaml\nscrape_configs:\n- job_name: node-attestation-signer\n  static_configs:\n  - targets: ['{target}']\n    labels:\n      namespace: node-attestation-system\n      pod: signer-0\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("config");
        let port = crate::envtest::free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
        let child = Command::new(binary)
            .current_dir(dir)
            .arg("--config.file=prometheus.yml")
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start prometheus");
        let prometheus = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while prometheus.get("/-/ready").is_none_or(|(status, _)| status != 200) {
            assert!(Instant::now() < deadline, "prometheus did not become ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        // Ready is not scraping: target discovery settles for a few seconds first. A counter
        // that rose before the first scrape would look flat to increase().
        while prometheus.query("up == 1").is_empty() {
            assert!(Instant::now() < deadline, "prometheus did not scrape {target}");
            std::thread::sleep(Duration::from_millis(200));
        }
        prometheus
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        // HTTP/1.0: the answer comes whole, never chunked.
        write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        let status = answer.split(' ').nth(1)?.parse().ok()?;
        let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
        Some((status, body))
    }

    /// The result of instant query `expr` (the `data.result` array).
    pub fn query(&self, expr: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", crate::cloud::percent_encode(expr));
        let (status, body) = self.get(&path).expect("prometheus answers");
        let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!(status, 200, "query {expr}: {body}");
        answer["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The alerts now: (name, state, labels).
    pub fn alerts(&self) -> Vec<(String, String, Value)> {
        let (_, body) = self.get("/api/v1/alerts").expect("prometheus answers");
        let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        answer["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|a| {
                (
                    a["labels"]["alertname"].as_str().unwrap_or_default().to_owned(),
                    a["state"].as_str().unwrap_or_default().to_owned(),
                    a["labels"].clone(),
                )
            })
            .collect()
    }

    /// Waits until `name` is `state` ("firing") for an alert whose labels contain `labels`,
    /// or, with `state` "", until no such alert is active; panics with the alerts after
    /// `timeout`.
    pub fn wait_alert(&self, name: &str, state: &str, labels: &[(&str, &str)], timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let alerts = self.alerts();
            let matching = alerts
                .iter()
                .find(|(n, _, l)| n == name && labels.iter().all(|(k, v)| l[*k].as_str() == Some(*v)));
            let done = match (state, matching) {
                ("", None) => true,
                ("", Some(_)) => false,
                (wanted, Some((_, s, _))) => s == wanted,
                (_, None) => false,
            };
            if done {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} {labels:?} is not {}: {alerts:#?}",
                if state.is_empty() { "resolved" } else { state }
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
