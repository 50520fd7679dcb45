//! Differential test: what the signer reads from unusual PKCS#10 encodings against what OpenSSL
//! reads from the same bytes (SPEC rule 5: "what the signer reads must be what any other X.509
//! parser reads").
//!
//! Hundreds of requests are assembled from DER parts (attribute layouts, extension placement
//! and critical flags, subject string types, versions, trailing bytes at several levels), each
//! validly self-signed. For each, the signer decides it as a kubelet client CSR, and
//! `openssl req -text` prints its view. Whenever the signer's parse and its subject and
//! extension rules accept a request, OpenSSL must parse it too, verify its signature, and show
//! exactly the same subject (attribute types, string types, values), the same requested
//! extensions (OID, criticality, value) and no other attribute. Any request on which the two
//! views differ must therefore be refused; the test counts those too.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Stdio};

use attestation::csr::{ParsedCsr, StringKind, SubjectAltName};
use attestation::envelope::{ProviderVersion, RequestEnvelope};
use attestation::{Decision, Rule, Verdict};
use tests::csr::client_csr_object;
use tests::pkcs10::{
    Critical, Pkcs10, attribute, attributes, ca_true_extension, extension, extension_request, name, oid, oids,
    provider_id_extension, san_extension, seq, set, string, tag, tlv,
};
use tests::worker0::Worker0;
use time::macros::datetime;

use tests::worker0::PID;

/// One request to compare.
struct Case {
    name: String,
    der: Vec<u8>,
}

fn case(name: impl Into<String>, pkcs10: &Pkcs10) -> Case {
    Case {
        name: name.into(),
        der: pkcs10.sign(),
    }
}

/// The extension lists placed into the attribute layouts below.
fn extension_lists() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let pid = provider_id_extension(PID);
    let pid_value = string(tag::UTF8_STRING, PID);
    vec![
        ("provider ID", vec![pid.clone()]),
        (
            "provider ID critical",
            vec![extension(oids::PROVIDER_ID, Critical::True, &pid_value)],
        ),
        (
            "provider ID with critical FALSE written out",
            vec![extension(oids::PROVIDER_ID, Critical::ExplicitFalse, &pid_value)],
        ),
        (
            "provider ID with a BER TRUE critical flag",
            vec![extension(oids::PROVIDER_ID, Critical::BerTrue, &pid_value)],
        ),
        ("provider ID twice", vec![pid.clone(), pid.clone()]),
        ("provider ID and CA:TRUE", vec![pid.clone(), ca_true_extension()]),
        ("CA:TRUE and provider ID", vec![ca_true_extension(), pid.clone()]),
        (
            "provider ID and a SAN",
            vec![pid.clone(), san_extension(&["worker-0"], &[[10, 0, 0, 7]])],
        ),
        (
            "provider ID and keyUsage",
            vec![
                pid.clone(),
                extension(oids::KEY_USAGE, Critical::True, &tlv(tag::BIT_STRING, &[0x07, 0x80])),
            ],
        ),
        (
            "provider ID and an unknown extension",
            vec![
                pid.clone(),
                extension("1.2.3.4", Critical::Absent, &tlv(tag::NULL, &[])),
            ],
        ),
        ("no extension", vec![]),
    ]
}

/// `[0]` contents around one extension list, in the shapes parsers disagree on.
fn attribute_layouts(extensions: &[Vec<u8>]) -> Vec<(&'static str, Vec<u8>)> {
    let ca = || seq(&[ca_true_extension()]);
    let challenge = || attribute(oids::CHALLENGE_PASSWORD, &[string(tag::PRINTABLE_STRING, "secret")]);
    let values = seq(extensions);
    let mut garbage_in_set = values.clone();
    garbage_in_set.push(0x01);
    let mut after_last_extension = extensions.concat();
    after_last_extension.extend([tag::NULL, 0]);
    vec![
        ("one extensionRequest", attributes(&[extension_request(extensions)])),
        (
            "a second value with CA:TRUE",
            attributes(&[attribute(oids::EXTENSION_REQUEST, &[values.clone(), ca()])]),
        ),
        (
            "the same value twice",
            attributes(&[attribute(oids::EXTENSION_REQUEST, &[values.clone(), values.clone()])]),
        ),
        (
            "a NULL second value",
            attributes(&[attribute(
                oids::EXTENSION_REQUEST,
                &[values.clone(), tlv(tag::NULL, &[])],
            )]),
        ),
        (
            "the extensions after an empty SET",
            attributes(&[seq(&[oid(oids::EXTENSION_REQUEST), set(&[]), values.clone()])]),
        ),
        (
            "CA:TRUE after the SET",
            attributes(&[seq(&[
                oid(oids::EXTENSION_REQUEST),
                set(std::slice::from_ref(&values)),
                ca(),
            ])]),
        ),
        (
            "two extensionRequests",
            attributes(&[
                extension_request(extensions),
                attribute(oids::EXTENSION_REQUEST, &[ca()]),
            ]),
        ),
        (
            "two extensionRequests, CA:TRUE first",
            attributes(&[
                attribute(oids::EXTENSION_REQUEST, &[ca()]),
                extension_request(extensions),
            ]),
        ),
        (
            "challengePassword after",
            attributes(&[extension_request(extensions), challenge()]),
        ),
        (
            "challengePassword before",
            attributes(&[challenge(), extension_request(extensions)]),
        ),
        (
            "an unstructuredName",
            attributes(&[
                extension_request(extensions),
                attribute(oids::UNSTRUCTURED_NAME, &[string(tag::IA5_STRING, "x")]),
            ]),
        ),
        (
            "in a Microsoft extension request",
            attributes(&[attribute(oids::MS_EXTENSION_REQUEST, std::slice::from_ref(&values))]),
        ),
        (
            "with CA:TRUE in a Microsoft extension request",
            attributes(&[
                extension_request(extensions),
                attribute(oids::MS_EXTENSION_REQUEST, &[ca()]),
            ]),
        ),
        (
            "a stray byte after the value in the SET",
            attributes(&[seq(&[oid(oids::EXTENSION_REQUEST), tlv(tag::SET, &garbage_in_set)])]),
        ),
        (
            "bytes after the last extension",
            attributes(&[attribute(
                oids::EXTENSION_REQUEST,
                &[tlv(tag::SEQUENCE, &after_last_extension)],
            )]),
        ),
        (
            "Extensions written as a SET",
            attributes(&[attribute(oids::EXTENSION_REQUEST, &[set(extensions)])]),
        ),
    ]
}

fn cases() -> Vec<Case> {
    let base = || Pkcs10::kubelet("worker-0", PID);
    let mut cases = Vec::new();
    for (extensions_name, extensions) in extension_lists() {
        for (layout_name, layout) in attribute_layouts(&extensions) {
            cases.push(case(
                format!("{extensions_name}, {layout_name}"),
                &Pkcs10 {
                    attributes: layout,
                    ..base()
                },
            ));
        }
    }
    // Attributes without the extensions.
    for (what, layout) in [
        ("no attribute", attributes(&[])),
        ("no attributes field", Vec::new()),
        (
            "an empty extensionRequest SET",
            attributes(&[attribute(oids::EXTENSION_REQUEST, &[])]),
        ),
        (
            "a challengePassword alone",
            attributes(&[attribute(
                oids::CHALLENGE_PASSWORD,
                &[string(tag::UTF8_STRING, "secret")],
            )]),
        ),
        (
            "an unknown attribute alone",
            attributes(&[attribute("1.2.3.4", &[string(tag::PRINTABLE_STRING, "x")])]),
        ),
        (
            "an attribute with an empty SET",
            attributes(&[attribute(oids::CHALLENGE_PASSWORD, &[])]),
        ),
    ] {
        cases.push(case(
            what,
            &Pkcs10 {
                attributes: layout,
                ..base()
            },
        ));
    }
    // Subjects: every pair of string types for O and CN, then odd shapes.
    let types = [
        ("PrintableString", tag::PRINTABLE_STRING),
        ("UTF8String", tag::UTF8_STRING),
        ("IA5String", tag::IA5_STRING),
        ("TeletexString", tag::TELETEX_STRING),
        ("BMPString", tag::BMP_STRING),
    ];
    for (o_name, o_tag) in types {
        for (cn_name, cn_tag) in types {
            cases.push(case(
                format!("subject O {o_name}, CN {cn_name}"),
                &Pkcs10 {
                    subject: name(&[
                        (oids::ORGANIZATION, string(o_tag, "system:nodes")),
                        (oids::COMMON_NAME, string(cn_tag, "system:node:worker-0")),
                    ]),
                    ..base()
                },
            ));
        }
    }
    let o = || (oids::ORGANIZATION, string(tag::PRINTABLE_STRING, "system:nodes"));
    let cn = || (oids::COMMON_NAME, string(tag::PRINTABLE_STRING, "system:node:worker-0"));
    let atv = |(type_oid, value): (&str, Vec<u8>)| seq(&[oid(type_oid), value]);
    let mut name_with_end = name(&[o(), cn()]);
    name_with_end.extend([tag::NULL, 0]);
    name_with_end[1] += 2;
    let mut atv_with_end = atv(cn());
    atv_with_end.extend(string(tag::UTF8_STRING, "system:node:other"));
    atv_with_end[1] += 19;
    for (what, subject) in [
        ("CN before O", name(&[cn(), o()])),
        ("a multi-valued RDN", seq(&[set(&[atv(o()), atv(cn())])])),
        (
            "a country too",
            name(&[(oids::COUNTRY, string(tag::PRINTABLE_STRING, "US")), o(), cn()]),
        ),
        ("CN twice", name(&[o(), cn(), cn()])),
        ("an empty RDN", seq(&[set(&[atv(o())]), set(&[]), set(&[atv(cn())])])),
        ("a NULL after the last RDN", name_with_end),
        (
            "a second value inside the CN AttributeTypeAndValue",
            seq(&[set(&[atv(o())]), set(&[atv_with_end])]),
        ),
        (
            "a PrintableString with an underscore",
            name(&[
                o(),
                (oids::COMMON_NAME, string(tag::PRINTABLE_STRING, "system:node:worker_0")),
            ]),
        ),
        (
            "a UTF8String that is not UTF-8",
            name(&[o(), (oids::COMMON_NAME, tlv(tag::UTF8_STRING, b"system:node:w\xff"))]),
        ),
        ("no subject at all", seq(&[])),
    ] {
        cases.push(case(format!("subject with {what}"), &Pkcs10 { subject, ..base() }));
    }
    // Versions.
    for (what, version) in [
        ("version v1 (0)", tlv(tag::INTEGER, &[0])),
        ("version v2 (1)", tlv(tag::INTEGER, &[1])),
        ("version v3 (2)", tlv(tag::INTEGER, &[2])),
        ("version -1", tlv(tag::INTEGER, &[0xff])),
        ("version 0 in two bytes", tlv(tag::INTEGER, &[0, 0])),
        ("version as an OCTET STRING", tlv(tag::OCTET_STRING, &[0])),
    ] {
        cases.push(case(what, &Pkcs10 { version, ..base() }));
    }
    // Trailing bytes outside the attributes.
    for (what, info_trailing, trailing) in [
        ("a NULL inside the CertificationRequestInfo", vec![tag::NULL, 0], vec![]),
        ("a stray byte inside the CertificationRequestInfo", vec![0x01], vec![]),
        ("a byte after the request", vec![], vec![0]),
        ("a second request after the request", vec![], base().sign()),
    ] {
        cases.push(case(
            what,
            &Pkcs10 {
                info_trailing,
                trailing,
                ..base()
            },
        ));
    }
    cases
}

/// What a parser read: the subject as `(attribute name, string type, value)` per attribute
/// (`+` joins a multi-valued RDN), the requested extensions as `(OID, critical, value)` with
/// values rendered as OpenSSL prints them, and the attributes other than extension requests.
#[derive(Debug, Clone, PartialEq, Eq)]
struct View {
    version_v1: bool,
    subject: Vec<String>,
    extensions: Vec<(String, bool, String)>,
    other_attributes: Vec<String>,
}

/// The signer's decision on `der` as a kubelet client CSR, and its parse.
fn signer(der: &[u8]) -> (Decision, Option<ParsedCsr>) {
    let request = RequestEnvelope {
        csr_der: der.to_vec(),
        provider: Some(ProviderVersion::parse("insecure/v1").unwrap()),
        data: None,
    }
    .encode()
    .into_bytes();
    let csr = client_csr_object(request, "abcdef");
    let decision = Worker0::new("insecure").decide(&csr, datetime!(2026-11-22 08:00 UTC));
    (decision, ParsedCsr::from_der(der).ok())
}

/// Whether the signer's parse and its subject and extension rules accept the request (the
/// signature, when the rules get that far, must verify too).
fn signer_accepts(decision: &Decision) -> bool {
    let verdict = |rule| decision.rules.iter().find(|r| r.rule == rule).map(|r| &r.verdict);
    let passed = |rule| matches!(verdict(rule), Some(Verdict::Passed { .. }));
    passed(Rule::Request)
        && passed(Rule::Subject)
        && passed(Rule::Extensions)
        && !matches!(verdict(Rule::Signature), Some(Verdict::Failed { .. }))
}

fn signer_view(parsed: &ParsedCsr) -> View {
    let subject = parsed
        .subject
        .iter()
        .map(|a| {
            let name = match a.oid.as_str() {
                oids::ORGANIZATION => "organizationName",
                oids::COMMON_NAME => "commonName",
                oids::COUNTRY => "countryName",
                other => other,
            };
            let kind = match a.kind {
                StringKind::Printable => "PRINTABLESTRING",
                StringKind::Utf8 => "UTF8STRING",
                StringKind::Other => "OTHER",
            };
            format!("{name}={kind}:{}", a.value.as_deref().unwrap_or("?"))
        })
        .collect();
    let extensions = parsed
        .extensions
        .iter()
        .map(|e| {
            let value = match e.oid.as_str() {
                oids::SUBJECT_ALT_NAME => parsed
                    .subject_alt_names
                    .iter()
                    .map(|n| match n {
                        SubjectAltName::Dns(d) => format!("DNS:{d}"),
                        SubjectAltName::Ip(ip) => format!("IP Address:{ip}"),
                        other => other.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                oids::BASIC_CONSTRAINTS => basic_constraints(&e.value),
                _ => hex(&e.value),
            };
            (e.oid.clone(), e.critical, value)
        })
        .collect();
    View {
        version_v1: true,
        subject,
        extensions,
        other_attributes: Vec::new(),
    }
}

/// `BasicConstraints` as OpenSSL prints it (`CA:TRUE`, `CA:FALSE`, `, pathlen:N`).
fn basic_constraints(value: &[u8]) -> String {
    match value {
        [0x30, 0x00] => "CA:FALSE".into(),
        [0x30, 0x03, 0x01, 0x01, 0xff] => "CA:TRUE".into(),
        other => format!("unrendered {}", hex(other)),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// OpenSSL's view of `der`, or why it has none (it does not parse, or its extensions do not).
fn openssl_view(der: &[u8]) -> Result<(View, bool), String> {
    let mut child = Command::new("openssl")
        .args(["req", "-inform", "DER"])
        .args([
            "-noout",
            "-text",
            "-verify",
            "-nameopt",
            "multiline,show_type,utf8,-esc_msb",
            "-reqopt",
            "ext_dump,no_pubkey,no_sigdump",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl runs");
    child.stdin.take().unwrap().write_all(der).unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() || !stdout.contains("Certificate Request:") {
        return Err(format!("does not parse: {}", stderr.lines().next().unwrap_or_default()));
    }
    let verified = stderr.contains("verify OK");
    parse_openssl_text(&stdout).map(|view| (view, verified))
}

/// Reads `openssl req -text -nameopt multiline,show_type -reqopt ext_dump,no_pubkey,no_sigdump`.
fn parse_openssl_text(text: &str) -> Result<View, String> {
    let indent = |line: &str| line.len() - line.trim_start().len();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let section = |header: &str| -> Vec<&str> {
        let Some(start) = lines.iter().position(|l| l.trim_end() == header) else {
            return Vec::new();
        };
        let depth = indent(lines[start]);
        lines[start + 1..]
            .iter()
            .take_while(|l| indent(l) > depth)
            .copied()
            .collect()
    };
    let version_v1 = lines.iter().any(|l| l.trim() == "Version: 1 (0x0)");
    let subject = section("        Subject:")
        .iter()
        .map(|l| {
            l.split(" + ")
                .map(|part| {
                    let (name, value) = part.split_once(" = ").unwrap_or((part, ""));
                    format!("{}={value}", name.trim())
                })
                .collect::<Vec<_>>()
                .join(" + ")
        })
        .collect();
    let attributes = section("        Attributes:");
    if !attributes.iter().any(|l| l.trim() == "Requested Extensions:") {
        return Err("OpenSSL could not read the requested extensions".into());
    }
    let other_attributes = attributes
        .iter()
        .filter(|l| indent(l) == 12 && l.trim() != "Requested Extensions:" && l.trim() != "(none)")
        .map(|l| l.trim().to_owned())
        .collect();
    let mut extensions: Vec<(String, bool, String)> = Vec::new();
    for line in section("            Requested Extensions:") {
        if indent(line) == 16 {
            let (name, flag) = line.trim().split_once(':').ok_or("extension line without ':'")?;
            let oid = match name {
                "X509v3 Basic Constraints" => oids::BASIC_CONSTRAINTS,
                "X509v3 Subject Alternative Name" => oids::SUBJECT_ALT_NAME,
                "X509v3 Key Usage" => oids::KEY_USAGE,
                dotted if dotted.chars().all(|c| c.is_ascii_digit() || c == '.') => dotted,
                other => return Err(format!("extension {other:?}: add its OID to the test")),
            };
            extensions.push((oid.to_owned(), flag.trim() == "critical", String::new()));
        } else {
            let Some(last) = extensions.last_mut() else {
                return Err(format!("value before any extension: {line:?}"));
            };
            last.2.push_str(&dumped(line.trim(), &last.0));
        }
    }
    Ok(View {
        version_v1,
        subject,
        extensions,
        other_attributes,
    })
}

/// One value line: the bytes of a `BIO_dump` line (`0000 - 0c 08 61-...  ascii`) for
/// extensions OpenSSL does not know, the text itself for those it prints.
fn dumped(line: &str, oid: &str) -> String {
    let known = [oids::BASIC_CONSTRAINTS, oids::SUBJECT_ALT_NAME, oids::KEY_USAGE];
    if known.contains(&oid) {
        return line.to_owned();
    }
    let Some(hex_part) = line.get(7..) else {
        return format!("unreadable dump {line:?}");
    };
    let mut out = String::new();
    for i in 0..16 {
        match hex_part.get(3 * i..3 * i + 2) {
            Some(byte) if byte.chars().all(|c| c.is_ascii_hexdigit()) => out.push_str(byte),
            _ => break,
        }
    }
    out
}

#[test]
fn what_the_signer_accepts_openssl_reads_the_same_way() {
    let version = Command::new("openssl").arg("version").output();
    match version {
        Ok(output) if output.status.success() => {}
        _ => panic!("`openssl` is not installed or does not run: scripts/deps installs it"),
    }
    let cases = cases();
    let (mut accepted, mut differing, mut openssl_refused) = (0, 0, 0);
    let mut failures = Vec::new();
    for case in &cases {
        let (decision, parsed) = signer(&case.der);
        let accepts = signer_accepts(&decision);
        let theirs = openssl_view(&case.der);
        let ours = parsed.as_ref().map(signer_view);
        let same = matches!((&ours, &theirs), (Some(ours), Ok((theirs, _))) if ours == theirs);
        if theirs.is_err() {
            openssl_refused += 1;
        }
        if !same {
            differing += 1;
        }
        if std::env::var_os("DIFFERENTIAL_VERBOSE").is_some() {
            eprintln!(
                "{:<8} {:<9} {:<15} {}",
                if accepts { "accepts" } else { "refuses" },
                if same { "same" } else { "different" },
                match &theirs {
                    Ok(_) => "openssl reads",
                    Err(_) => "openssl refuses",
                },
                case.name
            );
        }
        if !accepts {
            continue;
        }
        accepted += 1;
        match (&ours, &theirs) {
            (Some(ours), Ok((theirs, verified))) if ours == theirs && *verified => {}
            _ => failures.push(format!(
                "{}: the signer accepts it, but its view differs from OpenSSL's\n  signer:  {ours:?}\n  openssl: {theirs:?}\n  DER: {}",
                case.name,
                hex(&case.der)
            )),
        }
    }
    eprintln!(
        "differential: {} encodings compared with OpenSSL: {accepted} accepted by the signer (read \
         the same by OpenSSL), {differing} read differently (all refused), {openssl_refused} OpenSSL \
         cannot read",
        cases.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(cases.len() >= 200, "only {} cases", cases.len());
    // The comparison means something only if both sides of it occur.
    assert!(
        accepted >= 8,
        "only {accepted} requests accepted: the generator lost its baseline"
    );
    assert!(differing >= 50, "only {differing} requests read differently");
}
