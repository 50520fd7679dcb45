//! cloud-init's part of a node on a cloud, for the suites that run the providers' flavours
//! (`images/kubeadm/*-aws.yaml`, `-gcp`, `-azure`) and the cloud-init example
//! (`images/image-builder/cloud-init/kubelet-authenticator.yaml`), ported from
//! canonical/cloud-init:
//!
//! - the datasources: [`ec2`], [`gce`] and [`azure`] read the cloud's metadata service (a
//!   stand-in of `tests::cloud` or `tests::azure`) into instance data as `DataSourceEc2`,
//!   `DataSourceGCE` (`read_md`) and `DataSourceAzure` (`crawl_metadata`) do
//!   (`cloudinit/sources/`): `ds.meta_data` is the datasource's metadata, `v1` the
//!   standardized keys (`_get_standardized_metadata`; `local_hostname` is the datasource's
//!   `get_hostname()`, the short name);
//! - [`hostname`]: the kernel hostname cloud-init sets (`cc_set_hostname`, that short name);
//! - [`jinja_variables`]: the variables Jinja sees (`cloudinit/handlers/jinja_template.py`,
//!   `convert_jinja_instance_data` with key aliases: every key also under its name with Jinja's
//!   operators, `-` and `.` among them, as `_`; the `v1` keys also at the top level);
//! - [`render_user_data`]: user data whose first line is `## template: jinja`
//!   (`cloudinit/templater.py`, `detect_template`) is rendered without that line, any other is
//!   taken as it is (a `#cloud-config` with `{{ ... }}` is written literally). [`render`]
//!   evaluates `{{ expression }}` as Jinja does: variable paths (`a.b`, `a['k']`, `a["k"]`,
//!   `a[0]`, attribute then item for `.`, item then attribute for `[]`) and `.split(sep)`. An
//!   undefined value renders as `CI_MISSING_JINJA_VAR/<name>` (cloud-init's
//!   `UndefinedJinjaVariable`, which cloud-init warns about); anything done with one is an error,
//!   as is a syntax error: cloud-init then ignores the whole template. Jinja this module does not
//!   evaluate (statements, comments, filters, other calls) is an error too, never rendered wrong.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Map, Value, json};

/// How cloud-init writes an undefined variable.
pub const MISSING_JINJA_PREFIX: &str = "CI_MISSING_JINJA_VAR/";

/// The EC2 metadata API version cloud-init asks for (`DataSourceEc2.extended_metadata_versions`,
/// the first).
pub const EC2_API_VERSION: &str = "2021-03-23";

/// One HTTP/1.1 exchange with a loopback stand-in (`http://host:port/path?query`): status and
/// body.
fn http(method: &str, url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut stream = TcpStream::connect(host).unwrap_or_else(|e| panic!("{url}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: 0\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{url}: not HTTP: {answer:.80}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// `DataSource.get_hostname()` without a domain: the first label of `local-hostname`
/// (`ip-a-b-c-d` for an IPv4 address).
fn short_hostname(local_hostname: &str) -> String {
    if local_hostname.parse::<std::net::Ipv4Addr>().is_ok() {
        return format!("ip-{}", local_hostname.replace('.', "-"));
    }
    local_hostname.split('.').next().unwrap_or_default().to_owned()
}

/// Instance data of `meta_data` with the standardized `v1` keys given.
fn instance_data(meta_data: Value, cloud_name: &str, platform: &str, v1: &[(&str, String)]) -> Value {
    let mut standard = json!({"cloud_name": cloud_name, "cloud-name": cloud_name, "platform": platform});
    for (key, value) in v1 {
        standard[*key] = json!(value);
        standard[key.replace('_', "-")] = json!(value);
    }
    json!({"ds": {"meta_data": meta_data}, "v1": standard})
}

/// `MetadataLeafDecoder`: a JSON object parsed, a multi-line value split into lines.
fn ec2_leaf(text: String) -> Value {
    if text.starts_with('{')
        && let Ok(object) = serde_json::from_str::<Value>(&text)
    {
        return object;
    }
    if text.contains('\n') {
        return json!(text.lines().collect::<Vec<_>>());
    }
    json!(text)
}

/// `MetadataMaterializer`: the folder at `url` (its listing, folders ending in `/`) and
/// everything under it.
fn ec2_crawl(url: &str, token: &str) -> Value {
    let headers = [("X-aws-ec2-metadata-token", token)];
    let (status, listing) = http("GET", url, &headers);
    assert_eq!(status, 200, "{url}: {listing}");
    let mut folder = Map::new();
    for entry in listing.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match entry.strip_suffix('/') {
            Some(name) => {
                folder.insert(name.to_owned(), ec2_crawl(&format!("{url}{entry}"), token));
            }
            None => {
                let (status, value) = http("GET", &format!("{url}{entry}"), &headers);
                assert_eq!(status, 200, "{url}{entry}: {value}");
                folder.insert(entry.to_owned(), ec2_leaf(value));
            }
        }
    }
    Value::Object(folder)
}

/// What `DataSourceEc2` reads from the instance metadata service at `endpoint`
/// (`http://host:port/`): an IMDSv2 session token (`PUT /latest/api/token`, the
/// 21600-second TTL cloud-init asks), then the `/<EC2_API_VERSION>/meta-data/` tree.
/// `v1.availability_zone` is `placement/availability-zone`, `v1.region` `placement/region`,
/// `v1.local_hostname` the short `local-hostname`.
pub fn ec2(endpoint: &str) -> Value {
    let endpoint = format!("{}/", endpoint.trim_end_matches('/'));
    let (status, token) = http(
        "PUT",
        &format!("{endpoint}latest/api/token"),
        &[("X-aws-ec2-metadata-token-ttl-seconds", "21600")],
    );
    assert_eq!(status, 200, "IMDSv2 token: {token}");
    let meta = ec2_crawl(&format!("{endpoint}{EC2_API_VERSION}/meta-data/"), &token);
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let zone = text(&meta["placement"]["availability-zone"]);
    let region = match text(&meta["placement"]["region"]) {
        region if region.is_empty() => zone[..zone.len().saturating_sub(1)].to_owned(),
        region => region,
    };
    let v1 = [
        ("availability_zone", zone),
        ("region", region),
        ("instance_id", text(&meta["instance-id"])),
        ("local_hostname", short_hostname(&text(&meta["local-hostname"]))),
    ];
    instance_data(meta, "aws", "ec2", &v1)
}

/// What `DataSourceGCE`'s `read_md` reads from the metadata server at `host` (`host:port`,
/// `GCE_METADATA_HOST`'s form): `instance-id` (`instance/id`), `availability-zone`
/// (`instance/zone`, its last segment), `local-hostname` (`instance/hostname`),
/// `instance-data` and `project-data` (the attributes, recursive), `public-keys-data`. No
/// project ID. `v1.local_hostname` is the first label of `local-hostname` (its
/// `get_hostname`), `v1.region` the zone without its last `-` part.
pub fn gce(host: &str) -> Value {
    let base = format!("http://{host}/computeMetadata/v1/");
    let get = |path: &str| {
        let (status, body) = http("GET", &format!("{base}{path}"), &[("Metadata-Flavor", "Google")]);
        assert_eq!(status, 200, "{base}{path}: {body}");
        body
    };
    let zone = get("instance/zone").rsplit('/').next().unwrap_or_default().to_owned();
    let local_hostname = get("instance/hostname");
    let attributes = |path: &str| serde_json::from_str::<Value>(&get(&format!("{path}/?recursive=True"))).unwrap();
    let meta = json!({
        "instance-id": get("instance/id"),
        "availability-zone": zone,
        "local-hostname": local_hostname,
        "instance-data": attributes("instance/attributes"),
        "project-data": attributes("project/attributes"),
        "public-keys-data": [],
    });
    let region = zone.rsplit_once('-').map_or(zone.as_str(), |(r, _)| r).to_owned();
    let v1 = [
        ("availability_zone", zone.clone()),
        ("region", region),
        ("instance_id", meta["instance-id"].as_str().unwrap().to_owned()),
        ("local_hostname", short_hostname(&local_hostname)),
    ];
    instance_data(meta, "gce", "gce", &v1)
}

/// What `DataSourceAzure` reads from IMDS at `endpoint` (`http://host:port`,
/// `AZURE_METADATA_ENDPOINT`'s form): the instance document
/// (`/metadata/instance?api-version=2021-08-01&extended=true`, header `Metadata: true`) as
/// `imds`, `local-hostname` from its `compute.osProfile.computerName`, `instance-id` its
/// `compute.vmId`. `v1.availability_zone` is `compute.platformFaultDomain` (as cloud-init's
/// `availability_zone` property has it), `v1.region` `compute.location`.
pub fn azure(endpoint: &str) -> Value {
    let (status, body) = http(
        "GET",
        &format!(
            "{}/metadata/instance?api-version=2021-08-01&extended=true",
            endpoint.trim_end_matches('/')
        ),
        &[("Metadata", "true")],
    );
    assert_eq!(status, 200, "IMDS instance: {body}");
    let imds: Value = serde_json::from_str(&body).unwrap();
    let compute = &imds["compute"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let computer_name = text(&compute["osProfile"]["computerName"]);
    let meta = json!({"local-hostname": computer_name, "instance-id": compute["vmId"], "imds": imds});
    let v1 = [
        ("availability_zone", text(&compute["platformFaultDomain"])),
        ("region", text(&compute["location"])),
        ("instance_id", text(&compute["vmId"])),
        ("local_hostname", short_hostname(&computer_name)),
    ];
    instance_data(meta, "azure", "azure", &v1)
}

/// The kernel hostname cloud-init sets (`cc_set_hostname`: the datasource's `get_hostname()`,
/// no domain): `v1.local_hostname`.
pub fn hostname(instance_data: &Value) -> String {
    instance_data["v1"]["local_hostname"]
        .as_str()
        .expect("v1.local_hostname")
        .to_owned()
}

/// Jinja's operators (`jinja2.lexer.operator_re`), which an alias replaces with `_`.
const JINJA_OPERATORS: &str = "+-/*%~[](){}|.,:;=<>!";

/// `convert_jinja_instance_data(..., include_key_aliases=True)`.
pub fn jinja_variables(instance_data: &Value) -> Value {
    fn convert(data: &Map<String, Value>) -> Map<String, Value> {
        let mut result = Map::new();
        for (key, value) in data {
            let converted = match value {
                Value::Object(object) => {
                    let inner = convert(object);
                    // Keys v1, v2, ... are copied to the top level.
                    if key.len() > 1 && key.starts_with('v') && key[1..].chars().all(|c| c.is_ascii_digit()) {
                        for (k, v) in &inner {
                            result.insert(k.clone(), v.clone());
                        }
                    }
                    Value::Object(inner)
                }
                other => other.clone(),
            };
            let alias: String = key
                .chars()
                .map(|c| if JINJA_OPERATORS.contains(c) { '_' } else { c })
                .collect();
            if alias != *key {
                result.insert(alias, converted.clone());
            }
            result.insert(key.clone(), converted);
        }
        result
    }
    Value::Object(convert(instance_data.as_object().expect("instance data is an object")))
}

/// A value while an expression is evaluated: a JSON value, or Jinja's undefined (its name).
enum Jinja {
    Value(Value),
    Undefined(String),
}

/// The first position in `expression` at or after `at` that is not whitespace.
fn skip_spaces(expression: &[u8], mut at: usize) -> usize {
    while expression.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

/// A name at `at`: its end.
fn name_at(expression: &[u8], at: usize) -> Option<usize> {
    let first = *expression.get(at)?;
    if !(first.is_ascii_alphabetic() || first == b'_') {
        return None;
    }
    let mut end = at + 1;
    while expression
        .get(end)
        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
    {
        end += 1;
    }
    Some(end)
}

/// A quoted string literal at `at` (no escapes): its text and end.
fn string_at(expression: &str, at: usize) -> Option<(String, usize)> {
    let quote = expression[at..].chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let close = expression[at + 1..].find(quote)? + at + 1;
    let text = &expression[at + 1..close];
    (!text.contains('\\')).then(|| (text.to_owned(), close + 1))
}

/// `value.name` (attribute, then item) or `value[key]` (item, then attribute).
fn lookup(value: Jinja, key: &Value, expression: &str) -> Result<Jinja, String> {
    let value = match value {
        Jinja::Value(v) => v,
        Jinja::Undefined(name) => {
            return Err(format!(
                "{expression}: {name} is undefined (UndefinedError: cloud-init ignores the template)"
            ));
        }
    };
    let found = match (&value, key) {
        (Value::Object(object), Value::String(k)) => object.get(k).cloned(),
        (Value::Array(items), Value::Number(n)) => n.as_i64().and_then(|i| {
            let len = i64::try_from(items.len()).ok()?;
            let index = if i < 0 { i + len } else { i };
            usize::try_from(index).ok().and_then(|i| items.get(i).cloned())
        }),
        _ => None,
    };
    Ok(match found {
        Some(v) => Jinja::Value(v),
        None => Jinja::Undefined(match key {
            Value::String(k) => k.clone(),
            other => other.to_string(),
        }),
    })
}

/// Evaluates one `{{ }}` expression.
fn evaluate(expression: &str, variables: &Value) -> Result<Jinja, String> {
    let bytes = expression.as_bytes();
    let unsupported = |at: usize| format!("Jinja this suite does not render: {expression:?} at {at}");
    let mut at = skip_spaces(bytes, 0);
    let end = name_at(bytes, at).ok_or_else(|| unsupported(at))?;
    let mut value = lookup(
        Jinja::Value(variables.clone()),
        &json!(&expression[at..end]),
        expression,
    )?;
    at = skip_spaces(bytes, end);
    while at < bytes.len() {
        match bytes[at] {
            b'.' => {
                let start = skip_spaces(bytes, at + 1);
                let end = name_at(bytes, start).ok_or_else(|| unsupported(start))?;
                let name = &expression[start..end];
                at = skip_spaces(bytes, end);
                if bytes.get(at) == Some(&b'(') {
                    // A method call: str.split only.
                    let argument_at = skip_spaces(bytes, at + 1);
                    let (separator, after) = match string_at(expression, argument_at) {
                        Some((text, after)) => (Some(text), after),
                        None => (None, argument_at),
                    };
                    let close = skip_spaces(bytes, after);
                    if bytes.get(close) != Some(&b')') || name != "split" {
                        return Err(unsupported(at));
                    }
                    at = skip_spaces(bytes, close + 1);
                    value = match value {
                        Jinja::Value(Value::String(text)) => Jinja::Value(match separator.as_deref() {
                            None => json!(text.split_whitespace().collect::<Vec<_>>()),
                            Some("") => return Err(format!("{expression}: ValueError: empty separator")),
                            Some(separator) => json!(text.split(separator).collect::<Vec<_>>()),
                        }),
                        Jinja::Undefined(undefined) => {
                            return Err(format!(
                                "{expression}: {undefined} is undefined (UndefinedError: cloud-init ignores the template)"
                            ));
                        }
                        Jinja::Value(other) => return Err(format!("{expression}: {other} has no split")),
                    };
                } else {
                    value = lookup(value, &json!(name), expression)?;
                }
            }
            b'[' => {
                let start = skip_spaces(bytes, at + 1);
                let (key, after) = match string_at(expression, start) {
                    Some((text, after)) => (json!(text), after),
                    None => {
                        let mut end = start;
                        while bytes.get(end).is_some_and(|c| c.is_ascii_digit() || *c == b'-') {
                            end += 1;
                        }
                        let number: i64 = expression[start..end].parse().map_err(|_| unsupported(start))?;
                        (json!(number), end)
                    }
                };
                let close = skip_spaces(bytes, after);
                if bytes.get(close) != Some(&b']') {
                    return Err(unsupported(close));
                }
                value = lookup(value, &key, expression)?;
                at = skip_spaces(bytes, close + 1);
            }
            _ => return Err(unsupported(at)),
        }
    }
    Ok(value)
}

/// Renders `{{ expression }}`s of `template` with `variables` ([`jinja_variables`]).
pub fn render(template: &str, variables: &Value) -> Result<String, String> {
    if template.contains("{%") || template.contains("{#") {
        return Err(format!(
            "a Jinja statement or comment this suite does not render:\n{template}"
        ));
    }
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find("}}")
            .ok_or_else(|| format!("an unterminated {{{{ (a Jinja syntax error):\n{template}"))?
            + start;
        match evaluate(&rest[start + 2..end], variables)? {
            Jinja::Undefined(name) => out.push_str(&format!("{MISSING_JINJA_PREFIX}{name}")),
            Jinja::Value(Value::String(text)) => out.push_str(&text),
            Jinja::Value(Value::Number(number)) => out.push_str(&number.to_string()),
            Jinja::Value(Value::Bool(b)) => out.push_str(if b { "True" } else { "False" }),
            Jinja::Value(Value::Null) => out.push_str("None"),
            Jinja::Value(other) => {
                return Err(format!(
                    "{{{{{}}}}} renders a list or a dict: {other}",
                    &rest[start + 2..end]
                ));
            }
        }
        rest = &rest[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// User data as cloud-init takes it: rendered without its first line when that is
/// `## template: jinja` (any case, spaces after `##`), taken as it is otherwise.
pub fn render_user_data(text: &str, variables: &Value) -> Result<String, String> {
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    let header = first.strip_prefix("##").map(str::trim_start).and_then(|h| {
        h.get(..9)
            .filter(|t| t.eq_ignore_ascii_case("template:"))
            .map(|_| &h[9..])
    });
    match header.map(|kind| kind.trim().to_ascii_lowercase()) {
        None => Ok(text.to_owned()),
        Some(kind) if kind == "jinja" => render(rest, variables),
        Some(kind) => Err(format!("a template type this suite does not render: {kind}")),
    }
}

/// Every string of a JSON value (a KubeadmConfig's `files` or `joinConfiguration`, which
/// Cluster API's kubeadm bootstrap provider writes into `## template: jinja` user data, each
/// value one YAML scalar) rendered with [`render`].
pub fn render_strings(value: &Value, variables: &Value) -> Result<Value, String> {
    Ok(match value {
        Value::String(text) => Value::String(render(text, variables)?),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| render_strings(v, variables))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(object) => Value::Object(
            object
                .iter()
                .map(|(k, v)| Ok((k.clone(), render_strings(v, variables)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variables() -> Value {
        jinja_variables(&json!({
            "ds": {"meta_data": {"local-hostname": "ip-10-0-1-2.us-west-2.compute.internal", "instance-id": "i-0abc",
                                 "placement": {"availability-zone": "us-west-2a"}}},
            "v1": {"local_hostname": "ip-10-0-1-2", "availability_zone": "us-west-2a"}
        }))
    }

    #[test]
    fn paths_aliases_split_and_v1_at_the_top_are_rendered_as_cloud_init_does() {
        let v = variables();
        let render = |t: &str| render(t, &v).unwrap();
        assert_eq!(
            render("aws:///{{ ds.meta_data.placement.availability_zone }}/{{ ds.meta_data.instance_id }}"),
            "aws:///us-west-2a/i-0abc"
        );
        assert_eq!(
            render("{{ ds.meta_data['local-hostname'] }} {{ ds.meta_data[\"local_hostname\"] }}"),
            "ip-10-0-1-2.us-west-2.compute.internal ip-10-0-1-2.us-west-2.compute.internal"
        );
        assert_eq!(
            render("{{ ds.meta_data.local_hostname.split(\".\")[0] }}"),
            "ip-10-0-1-2"
        );
        assert_eq!(
            render("{{ v1.local_hostname }}={{ local_hostname }}"),
            "ip-10-0-1-2=ip-10-0-1-2"
        );
        assert_eq!(render("{{ ds.meta_data.local_hostname.split('.')[-1] }}"), "internal");
        assert_eq!(render("${GCP_PROJECT} {x}"), "${GCP_PROJECT} {x}");
    }

    #[test]
    fn undefined_values_render_as_cloud_init_writes_them_and_using_one_fails() {
        let v = variables();
        assert_eq!(
            render("gce://{{ ds.meta_data['project-id'] }}/", &v).unwrap(),
            "gce://CI_MISSING_JINJA_VAR/project-id/"
        );
        assert!(render("{{ ds.meta_data.nothing.split('.')[0] }}", &v).is_err());
        assert!(render("{{ ds.meta_data.nothing.deeper }}", &v).is_err());
        assert!(render("{{ ds.meta_data.* }}", &v).is_err(), "a syntax error");
        assert!(
            render("{{ ds.meta_data.local_hostname | lower }}", &v).is_err(),
            "a filter"
        );
        assert!(render("{% if x %}{% endif %}", &v).is_err());
    }

    #[test]
    fn only_user_data_with_the_jinja_header_is_rendered() {
        let v = variables();
        let body = "#cloud-config\nx: \"{{ ds.meta_data.instance_id }}\"\n";
        assert_eq!(render_user_data(body, &v).unwrap(), body, "without the header: literal");
        assert_eq!(
            render_user_data(&format!("## template: jinja\n{body}"), &v).unwrap(),
            "#cloud-config\nx: \"i-0abc\"\n"
        );
        assert_eq!(
            render_user_data(&format!("##Template: JINJA\n{body}"), &v).unwrap(),
            "#cloud-config\nx: \"i-0abc\"\n"
        );
    }
}
