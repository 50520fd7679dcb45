//! SPEC rules 1, 4, 5 and 8: the request itself. Rule 1 (the PEM envelope and the PKCS#10
//! parse), 4 (no SAN), 5 (only the provider-ID extension, attributes strict) and 8 (the
//! provider-ID extension). Rules 3 (the subject) and 6 (the usages) are shared with serving
//! CSRs and live in the rule engine's `mod.rs`.

use super::super::{Book, shown};
use crate::csr::ParsedCsr;
use crate::csr_object::CsrObject;
use crate::decision::{DenyReason, Rule};
use crate::envelope::RequestEnvelope;
use crate::identity::ProviderId;
use crate::names::PROVIDER_ID_OID_DOTTED;

/// Rule 1: the envelope and its PKCS#10 parse. On failure the rule fails and `None` is
/// returned: no other rule can be read from a request that does not parse.
pub(super) fn parse_request(book: &mut Book, csr: &CsrObject) -> Option<(RequestEnvelope, ParsedCsr)> {
    let parsed = RequestEnvelope::parse(&csr.request)
        .map_err(|e| e.to_string())
        .and_then(|envelope| {
            ParsedCsr::from_der(&envelope.csr_der)
                .map(|p| (envelope, p))
                .map_err(|e| e.to_string())
        });
    let (envelope, parsed) = match parsed {
        Ok(ok) => ok,
        Err(message) => {
            book.fail(Rule::Request, DenyReason::InvalidRequest, message);
            return None;
        }
    };
    book.pass(
        Rule::Request,
        match &envelope.provider {
            Some(p) => format!("PKCS#10 with attestation provider {p}"),
            None => "PKCS#10 without attestation blocks".to_owned(),
        },
    );
    Some((envelope, parsed))
}

/// Rule 4: no SAN of any kind.
pub(super) fn check_no_san(book: &mut Book, parsed: &ParsedCsr) {
    if parsed.attribute_problem.is_some() {
        // Rule 5 refuses the extension request: no SAN is read from it.
        return;
    }
    let san_oid = x509_parser::oid_registry::OID_X509_EXT_SUBJECT_ALT_NAME.to_id_string();
    if parsed.subject_alt_names.is_empty() && !parsed.extensions.iter().any(|e| e.oid == san_oid) {
        book.pass(Rule::SubjectAltNames, "no SAN");
    } else {
        let names: Vec<String> = parsed
            .subject_alt_names
            .iter()
            .take(4)
            .map(ToString::to_string)
            .collect();
        book.fail(
            Rule::SubjectAltNames,
            DenyReason::ForbiddenSan,
            format!("client certificates carry no SAN, got {}", shown(&names.join(", "))),
        );
    }
}

/// Rule 5: only the provider-ID extension, non-critical; the attributes as strict as rule 5 says.
pub(super) fn check_extensions(book: &mut Book, parsed: &ParsedCsr) {
    let provider_oid = PROVIDER_ID_OID_DOTTED;
    let san_oid = x509_parser::oid_registry::OID_X509_EXT_SUBJECT_ALT_NAME.to_id_string();
    if let Some(problem) = &parsed.attribute_problem {
        return book.fail(Rule::Extensions, DenyReason::ForbiddenExtension, problem.to_string());
    }
    // The SAN extension is rule 4's to refuse.
    if let Some(other) = parsed
        .extensions
        .iter()
        .find(|e| e.oid != provider_oid && e.oid != san_oid)
    {
        let what = if other.oid == "2.5.29.19" {
            " (basic constraints)"
        } else {
            ""
        };
        return book.fail(
            Rule::Extensions,
            DenyReason::ForbiddenExtension,
            format!("extension {}{what} is not allowed", other.oid),
        );
    }
    // The parser refuses an extension requested twice (`AttributeProblem::DuplicateExtension`).
    if parsed.provider_id_extensions().any(|e| e.critical) {
        return book.fail(
            Rule::Extensions,
            DenyReason::ForbiddenExtension,
            "the provider-ID extension must not be critical",
        );
    }
    book.pass(Rule::Extensions, "only the provider-ID extension");
}

/// Rule 8: the provider-ID extension, read once for rules 9 to 12.
pub(super) fn read_provider_id(book: &mut Book, parsed: &ParsedCsr) -> Option<ProviderId> {
    if parsed.attribute_problem.is_some() {
        // Rule 5 refuses the extension request: no provider ID is read from it.
        return None;
    }
    let Some(ext) = parsed.provider_id_extensions().next() else {
        book.fail(
            Rule::ProviderId,
            DenyReason::MissingProviderId,
            format!("no provider-ID extension ({PROVIDER_ID_OID_DOTTED})"),
        );
        return None;
    };
    match ProviderId::from_extension_value(&ext.value) {
        Ok(pid) => {
            book.pass(Rule::ProviderId, format!("provider ID {}", shown(pid.as_str())));
            Some(pid)
        }
        Err(e) => {
            book.fail(Rule::ProviderId, DenyReason::MissingProviderId, e.to_string());
            None
        }
    }
}
