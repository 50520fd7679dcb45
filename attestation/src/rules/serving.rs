//! SPEC section 4: kubelet serving CSRs (`kubernetes.io/kubelet-serving`), approved here and
//! signed by the workload cluster's kube-controller-manager.
//!
//! The Machine is found through `status.nodeRef.name` or the signer's claim, never through the
//! Node's `spec.providerID`, which the kubelet writes itself.

use std::net::IpAddr;

use super::{Book, Inputs, check_subject, check_usages, shown};
use crate::csr::{ParsedCsr, SubjectAltName};
use crate::decision::{CsrKind, Decision, DenyReason, Rule};
use crate::envelope::RequestEnvelope;
use crate::identity::NodeName;
use crate::machine::{MachineAddress, TargetRef};
use crate::names::{GROUP_NODES, usage};

const ORDER: &[Rule] = &[
    Rule::Request,
    Rule::Signature,
    Rule::Subject,
    Rule::SubjectAltNames,
    Rule::Extensions,
    Rule::Usages,
    Rule::Requester,
    Rule::Machine,
];

/// The Machine (or pool instance) a serving CSR belongs to.
struct Owner<'a> {
    target: TargetRef,
    described: String,
    /// `None` for a MachinePool instance: pools carry no per-instance addresses.
    addresses: Option<Vec<MachineAddress<'a>>>,
}

pub(super) fn decide(inputs: &Inputs<'_>) -> Decision {
    let csr = inputs.csr;
    let mut book = Book::new(CsrKind::KubeletServing, ORDER);

    let parsed = RequestEnvelope::parse(&csr.request)
        .map_err(|e| e.to_string())
        .and_then(|envelope| {
            if envelope.provider.is_some() {
                return Err("serving requests carry no attestation blocks".to_owned());
            }
            ParsedCsr::from_der(&envelope.csr_der).map_err(|e| e.to_string())
        });
    let parsed = match parsed {
        Ok(parsed) => parsed,
        Err(message) => {
            book.fail(Rule::Request, DenyReason::InvalidRequest, message);
            book.skip_rest("the request does not parse");
            return book.finish(&inputs.clock, "", String::new());
        }
    };
    book.pass(Rule::Request, "PKCS#10");

    let requester_ok =
        csr.username.starts_with(crate::names::NODE_USER_PREFIX) && csr.groups.iter().any(|g| g == GROUP_NODES);
    let node_name = match check_subject(&parsed) {
        Ok(name) if csr.username == name.username() => {
            book.pass(Rule::Subject, format!("CN={} equals the requester", name.username()));
            Some(name)
        }
        // A requester that is no node fails the requester rule; CN == requester is moot then.
        Ok(name) if !requester_ok => {
            book.pass(Rule::Subject, format!("CN={}, O=system:nodes", name.username()));
            None
        }
        Ok(name) => {
            book.fail(
                Rule::Subject,
                DenyReason::SubjectMismatch,
                format!("CN {} is not the requester {}", name.username(), shown(&csr.username)),
            );
            None
        }
        Err(message) => {
            book.fail(Rule::Subject, DenyReason::SubjectMismatch, message);
            None
        }
    };
    if requester_ok {
        book.pass(Rule::Requester, format!("{} in {GROUP_NODES}", csr.username));
    } else {
        book.fail(
            Rule::Requester,
            DenyReason::RequesterNotAllowed,
            format!(
                "requester {} in groups {}: only a node may ask for its serving certificate",
                shown(&csr.username),
                shown(&csr.groups.join(","))
            ),
        );
    }
    // Kubelets before 1.27 ask for key encipherment with ECDSA keys too: tolerated for any key.
    match check_usages(
        &csr.usages,
        &[usage::DIGITAL_SIGNATURE, usage::SERVER_AUTH],
        &[usage::KEY_ENCIPHERMENT],
    ) {
        Ok(()) => book.pass(Rule::Usages, format!("{:?}", csr.usages)),
        Err(message) => book.fail(Rule::Usages, DenyReason::ForbiddenUsage, message),
    }
    // The controller-manager copies only SANs from a serving request; other extensions are
    // inert. The attributes must still be rule 5's one shape, so the SANs read here are the
    // ones kube-controller-manager (Go) reads; when they are not, no SAN is read at all.
    let sans_ok = match &parsed.attribute_problem {
        Some(problem) => {
            book.fail(Rule::Extensions, DenyReason::ForbiddenExtension, problem.to_string());
            false
        }
        None => {
            book.pass(Rule::Extensions, "only SANs are used by the kubelet-serving signer");
            check_san_kinds(&mut book, &parsed)
        }
    };

    let owner = node_name.as_ref().and_then(|name| find_owner(&mut book, inputs, name));
    if let (true, Some(owner)) = (sans_ok, &owner) {
        check_sans_against_addresses(&mut book, &parsed, owner);
    }

    book.check_signature(&parsed);
    let message = format!(
        "serving certificate for {} matches {}",
        csr.username,
        owner.as_ref().map(|o| o.described.as_str()).unwrap_or_default()
    );
    let mut decision = book.finish(&inputs.clock, "KubeletServingAddressesVerified", message);
    decision.target = owner.map(|o| o.target);
    decision
}

/// At least one DNS or IP SAN, nothing else. Returns whether the SAN kinds are acceptable.
fn check_san_kinds(book: &mut Book, parsed: &ParsedCsr) -> bool {
    if let Some(bad) = parsed
        .subject_alt_names
        .iter()
        .find(|s| !matches!(s, SubjectAltName::Dns(_) | SubjectAltName::Ip(_)))
    {
        book.fail(
            Rule::SubjectAltNames,
            DenyReason::ForbiddenSan,
            format!("SAN {} is not allowed: only DNS and IP", shown(&bad.to_string())),
        );
        return false;
    }
    if parsed.subject_alt_names.is_empty() {
        book.fail(
            Rule::SubjectAltNames,
            DenyReason::ForbiddenSan,
            "a serving certificate needs at least one DNS or IP SAN",
        );
        return false;
    }
    true
}

fn find_owner<'a>(book: &mut Book, inputs: &Inputs<'a>, name: &NodeName) -> Option<Owner<'a>> {
    let cluster = inputs.cluster;
    let inventory = inputs.inventory;
    let index = inventory.index();
    let machines: Vec<_> = index
        .machines_holding_node(name.as_str())
        .iter()
        .map(|&at| &inventory.machines[at])
        .filter(|m| *m.namespace == *cluster.namespace && *m.cluster_name == *cluster.name)
        .filter(|m| {
            m.node_ref() == Some(name.as_str()) || m.valid_claim().is_some_and(|c| c.node_name == name.as_str())
        })
        .collect();
    let pools: Vec<_> = index
        .pools_with_claimed_node(name.as_str())
        .iter()
        .map(|&at| &inventory.pools[at])
        .filter(|p| *p.namespace == *cluster.namespace && *p.cluster_name == *cluster.name)
        .filter(|p| {
            p.provider_ids.iter().any(|pid| {
                p.claims
                    .instance(pid)
                    .valid()
                    .is_some_and(|c| c.node_name == name.as_str())
            })
        })
        .collect();
    let owner = match (machines.as_slice(), pools.as_slice()) {
        ([m], []) => Owner {
            target: m.target(),
            described: format!("Machine {}", m.name()),
            addresses: Some(m.addresses().collect()),
        },
        ([], [p]) => Owner {
            target: p.target(),
            described: format!("MachinePool {}", p.name),
            addresses: None,
        },
        ([], []) => {
            book.pending(
                Rule::Machine,
                format!(
                    "no Machine of Cluster {} has node {name} (by status.nodeRef or claim) yet",
                    cluster.name
                ),
            );
            return None;
        }
        (m, p) => {
            book.fail(
                Rule::Machine,
                DenyReason::MachineNotFound,
                format!("node {name} maps to {} Machines and {} MachinePools", m.len(), p.len()),
            );
            return None;
        }
    };
    book.pass(Rule::Machine, format!("node {name} belongs to {}", owner.described));
    Some(owner)
}

fn check_sans_against_addresses(book: &mut Book, parsed: &ParsedCsr, owner: &Owner<'_>) {
    let Some(addresses) = &owner.addresses else {
        book.pending_or(
            Rule::SubjectAltNames,
            DenyReason::ForbiddenSan,
            format!("{} instances carry no addresses to check SANs against", owner.described),
        );
        return;
    };
    let unmatched: Vec<String> = parsed
        .subject_alt_names
        .iter()
        .filter(|san| match san {
            SubjectAltName::Dns(dns) => !addresses
                .iter()
                .any(|a| a.is_dns() && a.address.eq_ignore_ascii_case(dns)),
            SubjectAltName::Ip(ip) => !addresses.iter().any(|a| {
                a.is_ip()
                    && a.address
                        .parse::<IpAddr>()
                        .is_ok_and(|addr| canonical(addr) == canonical(*ip))
            }),
            _ => true,
        })
        .map(ToString::to_string)
        .collect();
    if unmatched.is_empty() {
        book.pass(
            Rule::SubjectAltNames,
            format!(
                "{} SANs are addresses of {}",
                parsed.subject_alt_names.len(),
                owner.described
            ),
        );
    } else {
        // Machine addresses can lag the node: wait, then deny ForbiddenSAN.
        book.pending_or(
            Rule::SubjectAltNames,
            DenyReason::ForbiddenSan,
            format!(
                "SANs {} are not (yet) addresses of {}",
                shown(&unmatched.join(", ")),
                owner.described
            ),
        );
    }
}

/// IPv4-mapped IPv6 compares equal to its IPv4 form.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}
