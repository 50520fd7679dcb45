//! SPEC section 3: kubelet client CSRs for this project's signers.

use time::format_description::well_known::Rfc3339;

use super::{Book, Inputs, NodeLookup, check_subject, check_usages, shown};
use crate::attestor::{Evidence, Verification, Verifier};
use crate::claim::{ClaimState, ClaimWrite, KubeletClaim};
use crate::csr::ParsedCsr;
use crate::decision::{CsrKind, Decision, DenyReason, Issuance, Outcome, Rule, Verdict};
use crate::envelope::{ProviderVersion, RequestEnvelope};
use crate::identity::{NodeName, ProviderId};
use crate::machine::{ConfigRef, MachinePoolView, MachineView, TargetRef};
use crate::names::{
    ANNOTATION_SUPPORTED_VERSIONS, BOOTSTRAP_USER_PREFIX, GROUP_BOOTSTRAPPERS, GROUP_NODES, PROVIDER_ID_OID_DOTTED,
    usage,
};

const ORDER: &[Rule] = &[
    Rule::Request,
    Rule::Signature,
    Rule::Subject,
    Rule::SubjectAltNames,
    Rule::Extensions,
    Rule::Usages,
    Rule::Requester,
    Rule::ProviderId,
    Rule::Machine,
    Rule::NodeName,
    Rule::OneIdentity,
    Rule::Attestation,
];

/// Who filed the CSR.
enum Requester {
    /// A bootstrap-token user: initial issuance.
    Bootstrap { username: String },
    /// The node itself, for a Machine (or pool instance) it has claimed: renewal.
    Node,
    /// The node itself, for a Machine (or pool instance) with no valid claim: adoption of a
    /// node that holds an identity the signer did not issue (kubeadm's on the first
    /// control-plane node, or one issued before the Cluster opted in), SPEC rule 7.
    Adoption,
}

/// The object the provider ID maps to.
#[derive(Clone, Copy)]
enum Target<'a> {
    Machine(&'a MachineView),
    Pool(&'a MachinePoolView),
}

impl<'a> Target<'a> {
    fn describe(&self) -> String {
        match self {
            Self::Machine(m) => format!("Machine {}", m.name()),
            Self::Pool(p) => format!("MachinePool {}", p.name),
        }
    }

    fn reference(&self) -> TargetRef {
        match self {
            Self::Machine(m) => m.target(),
            Self::Pool(p) => p.target(),
        }
    }

    /// Whether `m` is this target, compared as [`TargetRef`]s are (name, namespace, UID) but
    /// without building one: rules 10 and 11 ask it of every Machine of the Cluster on every
    /// join, and the allocations were a tenth of the signer's CPU in a 500-Machine storm.
    fn is_machine(&self, m: &MachineView) -> bool {
        matches!(self, Self::Machine(t) if t.name() == m.name() && t.namespace == m.namespace && t.uid() == m.uid())
    }

    /// Whether `p` is this target (see [`Target::is_machine`]).
    fn is_pool(&self, p: &MachinePoolView) -> bool {
        matches!(self, Self::Pool(t) if t.name == p.name && t.namespace == p.namespace && t.uid == p.uid)
    }

    fn namespace(&self) -> &'a str {
        match self {
            Self::Machine(m) => &m.namespace,
            Self::Pool(p) => &p.namespace,
        }
    }

    fn claim(&self, provider_id: &ProviderId) -> ClaimState {
        match self {
            Self::Machine(m) => m.claim(),
            Self::Pool(p) => p.claims.instance(provider_id.as_str()),
        }
    }

    fn bootstrap_config(&self) -> Option<ConfigRef<'a>> {
        match self {
            Self::Machine(m) => m.bootstrap_config(),
            Self::Pool(p) => p.bootstrap_config.as_ref().map(ConfigRef::borrowed),
        }
    }

    fn ek_pins(&self) -> Vec<&'a str> {
        match self {
            Self::Machine(m) => m.ek_pins().collect(),
            Self::Pool(p) => p.ek_pins.iter().map(String::as_str).collect(),
        }
    }

    fn node_registered(&self, name: &NodeName) -> Option<String> {
        match self {
            Self::Machine(m) => m.node_ref().map(|n| format!("status.nodeRef is {}", shown(n))),
            Self::Pool(p) => p
                .node_refs
                .iter()
                .any(|n| n == name.as_str())
                .then(|| "listed in status.nodeRefs".to_owned()),
        }
    }
}

/// Rule 11's verdict before attestation ran: a claimed Machine can still be re-bootstrapped by
/// the EK on its claim (a node that lost its disk).
enum OneIdentity {
    Settled,
    NeedsClaimedEk {
        ek_sha256: String,
        reason: DenyReason,
        message: String,
    },
}

pub(super) fn decide(inputs: &Inputs<'_>) -> Decision {
    let csr = inputs.csr;
    let mut book = Book::new(CsrKind::KubeletClient, ORDER);

    // Rule 1.
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
            book.skip_rest("the request does not parse");
            return book.finish(&inputs.clock, "", String::new());
        }
    };
    book.pass(
        Rule::Request,
        match &envelope.provider {
            Some(p) => format!("PKCS#10 with attestation provider {p}"),
            None => "PKCS#10 without attestation blocks".to_owned(),
        },
    );

    // Rules 3 to 8: cheap, independent of each other.
    let node_name = match check_subject(&parsed) {
        Ok(name) => {
            book.pass(Rule::Subject, format!("CN=system:node:{name}, O=system:nodes"));
            Some(name)
        }
        Err(message) => {
            book.fail(Rule::Subject, DenyReason::SubjectMismatch, message);
            None
        }
    };
    check_no_san(&mut book, &parsed);
    check_extensions(&mut book, &parsed);
    let optional: &[&str] = if parsed.key_kind.is_rsa() {
        &[usage::KEY_ENCIPHERMENT]
    } else {
        &[]
    };
    match check_usages(&csr.usages, &[usage::DIGITAL_SIGNATURE, usage::CLIENT_AUTH], optional) {
        Ok(()) => book.pass(Rule::Usages, format!("{:?}, key {}", csr.usages, parsed.key_kind)),
        Err(message) => book.fail(Rule::Usages, DenyReason::ForbiddenUsage, message),
    }
    let requester = classify_requester(&mut book, inputs, node_name.as_ref());
    let provider_id = read_provider_id(&mut book, &parsed);

    // Rule 9, then what needs the Machine: 7 (binding), 10, 11.
    let target = provider_id.as_ref().and_then(|pid| find_target(&mut book, inputs, pid));
    // The claim as it stands, read once for rules 7, 10, 11, 12 and the claim write.
    let claim = target.zip(provider_id.as_ref()).map(|(target, pid)| target.claim(pid));
    // The node itself asking for a Machine it has not claimed: an adoption, not a renewal.
    let requester = requester.map(|r| match (r, &claim) {
        (Requester::Node, Some(claim)) if claim.valid().is_none() => Requester::Adoption,
        (r, _) => r,
    });
    let mut one_identity = OneIdentity::Settled;
    if let (Some(target), Some(pid), Some(claim)) = (target, provider_id.as_ref(), &claim) {
        if let Some(requester) = &requester {
            bind_requester(&mut book, inputs, target, claim, requester, node_name.as_ref(), pid);
        }
        if let Some(name) = &node_name {
            let lookup = inputs.nodes.node(name.as_str());
            check_node_name(&mut book, inputs, target, claim, name, pid, &lookup);
            if let Some(requester) = &requester {
                one_identity = check_one_identity(
                    &mut book,
                    inputs,
                    target,
                    claim,
                    requester,
                    name,
                    pid,
                    &lookup,
                    envelope.provider.as_ref().map(|p| p.provider()),
                );
            }
        }
    }

    // Rule 12, the cheap part: which verifier, and whether the Machine is bound to an EK or a
    // cloud instance.
    let mut verifier = select_verifier(&mut book, inputs, &envelope);
    if let (Some((chosen, version)), Some(target), Some(claim)) = (verifier, target, &claim) {
        let refusal = match (
            ek_binding(target, claim),
            claim.valid().and_then(|c| c.instance.as_deref()),
        ) {
            (Some(binding), _) if !chosen.proves_hardware_identity() => Some(format!(
                "{} is bound to an EK ({binding}): it accepts only tpm/v1 proving that EK, not {version}",
                target.describe()
            )),
            (_, Some(instance)) if instance_provider(instance) != Some(version.provider()) => Some(format!(
                "{} is bound to cloud instance {} by its claim: it accepts only {}/v1 proving that instance, not {version}",
                target.describe(),
                shown(instance),
                instance_provider(instance).unwrap_or("its provider")
            )),
            _ => None,
        };
        if let Some(message) = refusal {
            book.fail(Rule::Attestation, DenyReason::AttestationNotAllowed, message);
            verifier = None;
        }
    }

    // Cryptography only once every cheap rule held.
    let mut verified_ek = None;
    let mut verified_instance = None;
    let mut supersedes = None;
    let mut challenge = std::collections::BTreeMap::new();
    let mut cloud_calls = Vec::new();
    book.check_signature(&parsed);
    if let (false, Some((verifier, version)), Some(target), Some(claim), Some(pid)) =
        (book.any_failed(), verifier, target, &claim, provider_id.as_ref())
    {
        let ek_pins = target.ek_pins();
        let evidence = Evidence {
            version,
            data: envelope.data.as_deref(),
            csr: &parsed,
            provider_id: pid,
            object: csr,
            csrs: inputs.csrs,
            cluster: inputs.cluster,
            ek_pins: &ek_pins,
            claim: claim.valid(),
            now: inputs.clock.now,
            first_seen: inputs.clock.first_seen,
        };
        let verification = verifier.verify(&evidence);
        let ek = match &verification {
            Verification::Verified { ek_sha256, .. } | Verification::Challenge { ek_sha256, .. } => ek_sha256.clone(),
            _ => None,
        };
        let conflict =
            ek_conflict(inputs, target, claim, provider_id.as_ref(), ek.as_deref()).or_else(|| match &verification {
                Verification::Verified { instance, .. } => instance_conflict(target, claim, instance.as_deref()),
                _ => None,
            });
        match (verification, conflict) {
            (Verification::Failed { reason, message }, _) | (_, Some((reason, message))) => {
                book.fail(Rule::Attestation, reason, message)
            }
            (
                Verification::Verified {
                    note,
                    supersedes: earlier,
                    instance,
                    ..
                },
                None,
            ) => {
                book.pass(Rule::Attestation, note);
                supersedes = earlier;
                verified_instance = instance;
            }
            (Verification::NeedsCloud { call, message }, None) => {
                book.pending(Rule::Attestation, message);
                cloud_calls.push(call);
            }
            (Verification::Challenge { annotations, note, .. }, None) => {
                book.pending_or(Rule::Attestation, DenyReason::ChallengeFailed, note);
                challenge = annotations;
            }
            (Verification::Pending { message }, None) => book.pending(Rule::Attestation, message),
        }
        // A challenge's EK is proven so far: enough to let the claimed EK's re-bootstrap reach
        // phase 2 (rule 11 below).
        verified_ek = ek;
    } else if verifier.is_some() {
        let why = if book.any_failed() {
            "a cheaper rule failed: no cryptography"
        } else {
            "no Machine to verify against yet"
        };
        book.record(Rule::Attestation, Verdict::NotEvaluated { why: why.into() });
    }
    if let OneIdentity::NeedsClaimedEk {
        ek_sha256,
        reason,
        message,
    } = one_identity
    {
        if verified_ek.as_deref() == Some(ek_sha256.as_str()) {
            book.pass(
                Rule::OneIdentity,
                format!("{message}; re-bootstrap allowed: the attested EK is the claim's"),
            );
        } else {
            book.fail(Rule::OneIdentity, reason, message);
        }
    }

    let approved_reason = envelope.provider.as_ref().map(approval_reason).unwrap_or_default();
    let approved_message = format!(
        "{} attested by {} for {}",
        node_name.as_ref().map(NodeName::username).unwrap_or_default(),
        envelope.provider.as_ref().map(ToString::to_string).unwrap_or_default(),
        target.map(|t| t.describe()).unwrap_or_default(),
    );
    let unsupported = matches!(
        book.verdicts.get(&Rule::Attestation),
        Some(Verdict::Failed {
            reason: DenyReason::UnsupportedAttestationVersion,
            ..
        })
    );
    let mut decision = book.finish(&inputs.clock, &approved_reason, approved_message);
    if unsupported {
        decision.annotations.insert(
            ANNOTATION_SUPPORTED_VERSIONS.to_owned(),
            inputs.verifiers.supported_versions(),
        );
    }
    decision.target = target.map(|t| t.reference());
    if let Outcome::Retry { .. } = decision.outcome {
        decision.annotations.extend(challenge);
        decision.cloud_calls = cloud_calls;
    }
    if let (Outcome::Approved { .. }, Some(target), Some(pid), Some(name)) =
        (&decision.outcome, target, provider_id.as_ref(), node_name.as_ref())
    {
        if let Some(Requester::Bootstrap { .. } | Requester::Adoption) = &requester {
            let current = claim.as_ref().unwrap_or(&ClaimState::Unclaimed);
            decision.claim = claim_write(inputs, target, current, pid, name, verified_ek, verified_instance);
        }
        decision.supersedes = supersedes;
        decision.issuance = Some(Issuance {
            csr: parsed,
            provider_id: pid.clone(),
        });
    }
    decision
}

/// Why a Machine or pool instance is bound to an EK, if it is: an EK pin on it, or an EK on its
/// valid claim (SPEC rule 12). Such a Machine accepts only `tpm/v1` proving that EK.
fn ek_binding(target: Target<'_>, claim: &ClaimState) -> Option<String> {
    let pinned = target
        .ek_pins()
        .into_iter()
        .flat_map(|p| p.split(','))
        .any(|p| !p.trim().is_empty());
    if pinned {
        return Some("it carries an EK pin".to_owned());
    }
    claim
        .valid()
        .and_then(|c| c.ek_sha256.as_deref())
        .map(|ek| format!("its claim records EK {}", shown(ek)))
}

/// The provider a claim's `instance` was proven with: `aws` of `aws:<account>/<id>`.
fn instance_provider(instance: &str) -> Option<&str> {
    instance.split_once(':').map(|(provider, _)| provider)
}

/// A cloud-bound Machine (its valid claim records an instance) accepts only that instance
/// (SPEC rule 12): another one is `AttestationInvalid`, naming both.
fn instance_conflict(target: Target<'_>, claim: &ClaimState, proven: Option<&str>) -> Option<(DenyReason, String)> {
    let claimed = claim.valid()?.instance.as_deref()?;
    match proven {
        Some(proven) if proven == claimed => None,
        proven => Some((
            DenyReason::AttestationInvalid,
            format!(
                "{} is bound to cloud instance {} by its claim, but the attestation proves {}",
                target.describe(),
                shown(claimed),
                proven.map_or_else(|| "no instance".to_owned(), shown)
            ),
        )),
    }
}

/// Another Machine or pool instance of the Cluster that holds `name` (SPEC rule 10): through
/// its valid claim or `status.nodeRef`, and, when `target` is a pool instance (which has no
/// names of its own), through its name, infrastructure name or DNS addresses.
fn name_held_elsewhere(inputs: &Inputs<'_>, target: Target<'_>, name: &NodeName, pid: &ProviderId) -> Option<String> {
    let cluster = inputs.cluster;
    let ours = |namespace: &str, cluster_name: &str| namespace == cluster.namespace && cluster_name == cluster.name;
    let name = name.as_str();
    let for_pool = matches!(target, Target::Pool(_));
    // Every Machine of the Cluster is asked on every join: the one field that can match is read
    // first, and whether it is the target only of a Machine that holds the name.
    let machine = inputs.inventory.machines.iter().find_map(|m| {
        let how = if m.claimed_node() == Some(name) {
            "its claim"
        } else if m.node_ref() == Some(name) {
            "its status.nodeRef"
        } else if for_pool && m.name() == name {
            "its name"
        } else if for_pool && m.infrastructure_name() == Some(name) {
            "its infrastructure name"
        } else if for_pool
            && m.addresses()
                .any(|a| a.is_dns() && a.address.eq_ignore_ascii_case(name))
        {
            "a Hostname/DNS address"
        } else {
            return None;
        };
        if !ours(&m.namespace, &m.cluster_name) || target.is_machine(m) {
            return None;
        }
        Some(format!("Machine {} ({how})", m.name()))
    });
    machine.or_else(|| {
        inputs
            .inventory
            .pools
            .iter()
            .filter(|p| ours(&p.namespace, &p.cluster_name))
            .find_map(|p| {
                let same_pool = target.is_pool(p);
                p.claims
                    .records()
                    .filter(|c| p.provider_ids.contains(&c.provider_id))
                    .filter(|c| !(same_pool && c.provider_id == pid.as_str()))
                    .find(|c| c.node_name == name)
                    .map(|c| {
                        format!(
                            "instance {} of MachinePool {} (its claim)",
                            shown(&c.provider_id),
                            p.name
                        )
                    })
            })
    })
}

/// One EK per Machine: the verified EK must be the claim's (when the claim names one), and no
/// other Machine, MachinePool or pool instance of the Cluster may pin or claim it.
fn ek_conflict(
    inputs: &Inputs<'_>,
    target: Target<'_>,
    claim: &ClaimState,
    provider_id: Option<&ProviderId>,
    ek: Option<&str>,
) -> Option<(DenyReason, String)> {
    let ek = ek?;
    if let Some(claimed) = claim.valid().and_then(|c| c.ek_sha256.as_deref())
        && claimed != ek
    {
        return Some((
            DenyReason::EndorsementKeyMismatch,
            format!(
                "EK {ek} differs from the EK {claimed} on the claim of {}",
                target.describe()
            ),
        ));
    }
    fn held<'c>(ek: &str, mut pins: impl Iterator<Item = &'c str>, mut claimed: impl Iterator<Item = &'c str>) -> bool {
        pins.any(|p| p.split(',').any(|p| p.trim().eq_ignore_ascii_case(ek))) || claimed.any(|c| c == ek)
    }
    let ours = |namespace: &str, cluster: &str| namespace == inputs.cluster.namespace && cluster == inputs.cluster.name;
    let elsewhere = inputs.inventory.machines.iter().find(|m| {
        ours(&m.namespace, &m.cluster_name)
            && !target.is_machine(m)
            && held(ek, m.ek_pins(), m.valid_claim().and_then(|c| c.ek_sha256).into_iter())
    });
    let holder = elsewhere.map(|m| format!("Machine {}", m.name())).or_else(|| {
        inputs
            .inventory
            .pools
            .iter()
            .find(|p| {
                let same = target.is_pool(p);
                // Within the target pool, only the other instances' claims count.
                let others = p
                    .claims
                    .records()
                    .filter(|c| !same || Some(c.provider_id.as_str()) != provider_id.map(ProviderId::as_str))
                    .filter_map(|c| c.ek_sha256.as_deref());
                let pins = p.ek_pins.iter().filter(|_| !same).map(String::as_str);
                ours(&p.namespace, &p.cluster_name) && held(ek, pins, others)
            })
            .map(|p| format!("MachinePool {}", p.name))
    });
    holder.map(|holder| {
        (
            DenyReason::EndorsementKeyMismatch,
            format!("EK {ek} is pinned to or claimed by {holder}: one EK serves one Machine"),
        )
    })
}

fn check_no_san(book: &mut Book, parsed: &ParsedCsr) {
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

fn check_extensions(book: &mut Book, parsed: &ParsedCsr) {
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

fn read_provider_id(book: &mut Book, parsed: &ParsedCsr) -> Option<ProviderId> {
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

fn classify_requester(book: &mut Book, inputs: &Inputs<'_>, node_name: Option<&NodeName>) -> Option<Requester> {
    let csr = inputs.csr;
    let in_group = |g: &str| csr.groups.iter().any(|x| x == g);
    if let Some(id) = csr.username.strip_prefix(BOOTSTRAP_USER_PREFIX)
        && !id.is_empty()
        && in_group(GROUP_BOOTSTRAPPERS)
    {
        return Some(Requester::Bootstrap {
            username: csr.username.clone(),
        });
    }
    if let Some(name) = node_name
        && csr.username == name.username()
        && in_group(GROUP_NODES)
    {
        return Some(Requester::Node);
    }
    let why = if csr.username.starts_with(crate::names::NODE_USER_PREFIX) && in_group(GROUP_NODES) {
        "a node may only renew its own identity"
    } else {
        "only bootstrap-token users (initial) and the node itself (renewal, adoption) may ask"
    };
    book.fail(
        Rule::Requester,
        DenyReason::RequesterNotAllowed,
        format!(
            "requester {} in groups {}: {why}",
            shown(&csr.username),
            shown(&csr.groups.join(","))
        ),
    );
    None
}

fn find_target<'a>(book: &mut Book, inputs: &Inputs<'a>, pid: &ProviderId) -> Option<Target<'a>> {
    let cluster = inputs.cluster;
    let ours = |name: &str, ns: &str, cluster_name: &str| {
        ns == cluster.namespace && cluster_name == cluster.name && !name.is_empty()
    };
    // One pass over the Cluster's Machines (every join asks): no list of them is built.
    let machines = || {
        inputs
            .inventory
            .machines
            .iter()
            .map(AsRef::as_ref)
            .filter(move |m| ours(m.name(), &m.namespace, &m.cluster_name))
    };
    let pools: Vec<&MachinePoolView> = inputs
        .inventory
        .pools
        .iter()
        .map(AsRef::as_ref)
        .filter(|p| ours(&p.name, &p.namespace, &p.cluster_name))
        .collect();

    let matching: Vec<&MachineView> = inputs
        .inventory
        .machines
        .iter()
        .map(AsRef::as_ref)
        .filter(|m| m.provider_id() == Some(pid.as_str()) && ours(m.name(), &m.namespace, &m.cluster_name))
        .collect();
    let target = match matching.as_slice() {
        [one] => Target::Machine(one),
        [] => {
            let listing: Vec<&MachinePoolView> = pools
                .iter()
                .copied()
                .filter(|p| p.provider_ids.iter().any(|x| x == pid.as_str()))
                .collect();
            match listing.as_slice() {
                [one] => Target::Pool(one),
                [] => {
                    let unset = machines().filter(|m| m.provider_id().is_none()).count();
                    let message = format!(
                        "no Machine or MachinePool of Cluster {} has provider ID {}",
                        cluster.name,
                        shown(pid.as_str())
                    );
                    if unset == 0 && pools.is_empty() {
                        book.fail(Rule::Machine, DenyReason::MachineNotFound, message);
                    } else {
                        // A Machine still without providerID, or a pool's list lagging, may be it.
                        book.pending(
                            Rule::Machine,
                            format!(
                                "{message} yet ({unset} Machines without providerID, {} MachinePools)",
                                pools.len()
                            ),
                        );
                    }
                    return None;
                }
                many => {
                    book.fail(
                        Rule::Machine,
                        DenyReason::MachineNotFound,
                        format!(
                            "provider ID {} is listed by {} MachinePools",
                            shown(pid.as_str()),
                            many.len()
                        ),
                    );
                    return None;
                }
            }
        }
        many => {
            let names: Vec<&str> = many.iter().take(4).map(|m| m.name()).collect();
            book.fail(
                Rule::Machine,
                DenyReason::MachineNotFound,
                format!(
                    "provider ID {} is on {} Machines ({})",
                    shown(pid.as_str()),
                    many.len(),
                    names.join(", ")
                ),
            );
            return None;
        }
    };
    let (deleting, ready) = match target {
        Target::Machine(m) => (m.deleting, m.bootstrap_ready),
        Target::Pool(p) => (p.deleting, p.bootstrap_ready),
    };
    if deleting {
        book.fail(
            Rule::Machine,
            DenyReason::MachineNotReady,
            format!("{} is being deleted", target.describe()),
        );
    } else if !ready {
        book.pending(
            Rule::Machine,
            format!("{} has no bootstrap data yet", target.describe()),
        );
    } else {
        book.pass(Rule::Machine, format!("{} owns the provider ID", target.describe()));
    }
    Some(target)
}

fn bind_requester(
    book: &mut Book,
    inputs: &Inputs<'_>,
    target: Target<'_>,
    claim: &ClaimState,
    requester: &Requester,
    node_name: Option<&NodeName>,
    pid: &ProviderId,
) {
    match requester {
        Requester::Bootstrap { username } => match target.bootstrap_config() {
            Some(config) if config.is_kubeadm() => {
                let found = inputs
                    .inventory
                    .kubeadm_configs
                    .iter()
                    // A config labeled for another Cluster is not this one's, whichever
                    // replica holds what (a shard keeps only its Clusters' configs).
                    .find(|k| {
                        k.name() == config.name
                            && *k.namespace == *target.namespace()
                            && k.serves_cluster(&inputs.cluster.name)
                    });
                match found.map(|k| k.join_username()) {
                    None => book.pending(
                        Rule::Requester,
                        format!(
                            "KubeadmConfig {} of {} not found (unlabeled or labeled for Cluster {})",
                            config.name,
                            target.describe(),
                            inputs.cluster.name
                        ),
                    ),
                    Some(Some(expected)) if expected == *username => book.pass(
                        Rule::Requester,
                        format!("{username} is the join token of KubeadmConfig {}", config.name),
                    ),
                    Some(Some(expected)) => book.fail(
                        Rule::Requester,
                        DenyReason::RequesterNotAllowed,
                        format!(
                            "requester {} is not {expected}, the join token of KubeadmConfig {}",
                            shown(username),
                            config.name
                        ),
                    ),
                    Some(None) => book.pass(
                        Rule::Requester,
                        format!("{username}: KubeadmConfig {} names no join token", config.name),
                    ),
                }
            }
            _ => book.pass(Rule::Requester, format!("bootstrap-token user {username}")),
        },
        Requester::Node => match (claim.valid(), node_name) {
            (Some(c), Some(name)) if c.node_name == name.as_str() => book.pass(
                Rule::Requester,
                format!("renewal by {} for its claimed {}", name.username(), target.describe()),
            ),
            (Some(c), _) => book.fail(
                Rule::Requester,
                DenyReason::RequesterNotAllowed,
                format!(
                    "renewal by {} but {} is claimed by node {}",
                    shown(&inputs.csr.username),
                    target.describe(),
                    shown(&c.node_name)
                ),
            ),
            // Turned into an adoption above: a renewal always has a valid claim.
            (None, _) => book.fail(
                Rule::Requester,
                DenyReason::RequesterNotAllowed,
                format!(
                    "renewal by {} but {} holds no valid claim",
                    shown(&inputs.csr.username),
                    target.describe()
                ),
            ),
        },
        Requester::Adoption => match node_name {
            Some(name) => adoption(book, inputs, target, name, pid),
            None => book.fail(
                Rule::Requester,
                DenyReason::RequesterNotAllowed,
                "adoption without a node name",
            ),
        },
    }
}

/// SPEC rule 7, adoption: the node itself, for a Machine or pool instance with no valid claim,
/// is accepted only when it is the node the Machine already names: its `status.nodeRef`, or a
/// registered Node carrying its provider ID under that name. Anyone else (another node's
/// certificate, a node for a Machine that names another) is refused; a Node list that cannot be
/// read waits.
fn adoption(book: &mut Book, inputs: &Inputs<'_>, target: Target<'_>, name: &NodeName, pid: &ProviderId) {
    let username = name.username();
    // The safer rule (documented in docs/decisions.md): a Node object, and so the nodeRef Cluster
    // API derives from its provider ID, is written by the node itself, and any node identity may
    // register a Node carrying another Machine's provider ID. For a Machine the name must also be
    // one of its own, as the infrastructure provider wrote them (its name, infrastructure name,
    // Hostname or DNS address); a pool instance has no names: its attestation binds it.
    if let Target::Machine(m) = target
        && !(m.name() == name.as_str()
            || m.infrastructure_name() == Some(name.as_str())
            || m.addresses()
                .any(|a| a.is_dns() && a.address.eq_ignore_ascii_case(name.as_str())))
    {
        book.fail(
            Rule::Requester,
            DenyReason::RequesterNotAllowed,
            format!(
                "adoption by {} refused: {} is not one of the names {} carries (its name, infrastructure name, Hostname or DNS address): a Node alone, which any node may register, does not name a Machine's node",
                shown(&username),
                name,
                target.describe()
            ),
        );
        return;
    }
    if let Target::Machine(m) = target
        && let Some(node_ref) = m.node_ref()
    {
        if node_ref == name.as_str() {
            book.pass(
                Rule::Requester,
                format!(
                    "adoption: {username} is the node {} names (status.nodeRef) and holds no claim yet",
                    target.describe()
                ),
            );
        } else {
            book.fail(
                Rule::Requester,
                DenyReason::RequesterNotAllowed,
                format!(
                    "adoption by {} refused: {} names node {} (status.nodeRef)",
                    shown(&username),
                    target.describe(),
                    shown(node_ref)
                ),
            );
        }
        return;
    }
    match inputs.nodes.node_with_provider_id(pid.as_str()) {
        NodeLookup::Found(node) if node.name == name.as_str() => book.pass(
            Rule::Requester,
            format!(
                "adoption: {username} is the registered Node carrying the provider ID of {} and holds no claim yet",
                target.describe()
            ),
        ),
        NodeLookup::Found(node) => book.fail(
            Rule::Requester,
            DenyReason::RequesterNotAllowed,
            format!(
                "adoption by {} refused: the Node carrying the provider ID of {} is {}",
                shown(&username),
                target.describe(),
                shown(&node.name)
            ),
        ),
        NodeLookup::Absent => book.fail(
            Rule::Requester,
            DenyReason::RequesterNotAllowed,
            format!(
                "adoption by {} refused: {} holds no valid claim and names no node (no status.nodeRef, no registered Node carrying its provider ID); a new node joins with its bootstrap token",
                shown(&username),
                target.describe()
            ),
        ),
        NodeLookup::Unavailable(why) => book.pending(
            Rule::Requester,
            format!("adoption: cannot tell which Node carries the provider ID of {}: {why}", target.describe()),
        ),
    }
}

fn check_node_name(
    book: &mut Book,
    inputs: &Inputs<'_>,
    target: Target<'_>,
    claim: &ClaimState,
    name: &NodeName,
    pid: &ProviderId,
    lookup: &NodeLookup,
) {
    let fits = match (claim, target) {
        (ClaimState::Valid(c), _) => {
            if c.node_name == name.as_str() {
                Ok("the claim's node name".to_owned())
            } else {
                Err(format!("the claim is for node {}", shown(&c.node_name)))
            }
        }
        (_, Target::Machine(m)) => match m.node_ref() {
            Some(node_ref) if node_ref == name.as_str() => Ok("status.nodeRef.name".to_owned()),
            Some(node_ref) => Err(format!("status.nodeRef.name is {}", shown(node_ref))),
            None => {
                if m.name() == name.as_str() {
                    Ok("the Machine name".to_owned())
                } else if matches!(lookup, NodeLookup::Found(node) if node.provider_id.as_deref() == Some(pid.as_str()))
                {
                    Ok("the registered Node carrying its provider ID".to_owned())
                } else if m.infrastructure_name() == Some(name.as_str()) {
                    Ok("spec.infrastructureRef.name".to_owned())
                } else if let Some(a) = m
                    .addresses()
                    .find(|a| a.is_dns() && a.address.eq_ignore_ascii_case(name.as_str()))
                {
                    Ok(format!("the {} address", a.kind))
                } else {
                    Err(format!(
                        "neither the Machine name {}, its infrastructure name, nor a Hostname/DNS address",
                        shown(m.name())
                    ))
                }
            }
        },
        (_, Target::Pool(_)) => Ok("a MachinePool instance: bound by its claim from now on".to_owned()),
    };
    // A name that fits none of the Machine's own names may still be its registered Node's
    // (adoption): when the Nodes cannot be read, that waits instead of failing.
    if fits.is_err()
        && let (NodeLookup::Unavailable(why), Target::Machine(m)) = (lookup, target)
        && m.node_ref().is_none()
    {
        book.pending(Rule::NodeName, format!("cannot look up Node {name}: {why}"));
        return;
    }
    let fits = fits.and_then(|how| match name_held_elsewhere(inputs, target, name, pid) {
        Some(holder) => Err(format!("the name belongs to {holder}: one node name, one Machine")),
        None => Ok(how),
    });
    match fits {
        Err(why) => book.fail(
            Rule::NodeName,
            DenyReason::NodeNameMismatch,
            format!("node name {} does not fit {}: {why}", name, target.describe()),
        ),
        Ok(how) => match lookup {
            NodeLookup::Found(node) if node.provider_id.as_deref().is_some_and(|p| p != pid.as_str()) => book.fail(
                Rule::NodeName,
                DenyReason::NodeNameMismatch,
                format!(
                    "Node {name} exists with providerID {}",
                    shown(node.provider_id.as_deref().unwrap_or_default())
                ),
            ),
            NodeLookup::Unavailable(why) => book.pending(Rule::NodeName, format!("cannot look up Node {name}: {why}")),
            _ => book.pass(Rule::NodeName, format!("{name} is {how}")),
        },
    }
}

#[allow(clippy::too_many_arguments)]
fn check_one_identity(
    book: &mut Book,
    inputs: &Inputs<'_>,
    target: Target<'_>,
    claim: &ClaimState,
    requester: &Requester,
    name: &NodeName,
    pid: &ProviderId,
    lookup: &NodeLookup,
    provider: Option<&str>,
) -> OneIdentity {
    match (requester, claim) {
        (Requester::Node, _) => {
            book.pass(Rule::OneIdentity, "renewal of the claimed identity");
            return OneIdentity::Settled;
        }
        (Requester::Adoption, ClaimState::Unclaimed | ClaimState::Stale(_)) => {
            book.pass(
                Rule::OneIdentity,
                format!(
                    "adoption of the node {} names: its first attested identity, claimed as for an initial request",
                    target.describe()
                ),
            );
            return OneIdentity::Settled;
        }
        _ => {}
    }
    let hardware = provider
        .and_then(|p| inputs.verifiers.for_provider(p))
        .is_some_and(|v| v.proves_hardware_identity());
    match claim {
        ClaimState::Valid(c) if c.csr_uid == inputs.csr.uid => {
            book.pass(
                Rule::OneIdentity,
                "claimed by this CSR already (resumed after a restart)",
            );
            OneIdentity::Settled
        }
        ClaimState::Valid(c) => {
            let message = format!(
                "{} is claimed by node {} (CSR {}, at {})",
                target.describe(),
                shown(&c.node_name),
                shown(&c.csr_uid),
                shown(&c.claimed_at)
            );
            match (&c.ek_sha256, hardware) {
                (Some(ek), true) => {
                    book.pending(
                        Rule::OneIdentity,
                        format!("{message}: only its claimed EK may re-bootstrap it"),
                    );
                    OneIdentity::NeedsClaimedEk {
                        ek_sha256: ek.clone(),
                        reason: DenyReason::MachineAlreadyClaimed,
                        message,
                    }
                }
                _ => {
                    book.fail(Rule::OneIdentity, DenyReason::MachineAlreadyClaimed, message);
                    OneIdentity::Settled
                }
            }
        }
        ClaimState::Unreadable(why) => {
            book.fail(
                Rule::OneIdentity,
                DenyReason::MachineAlreadyClaimed,
                format!(
                    "{} carries a claim that does not decode ({why}); remove it to release the Machine",
                    target.describe()
                ),
            );
            OneIdentity::Settled
        }
        ClaimState::Unclaimed | ClaimState::Stale(_) => {
            let by_provider_id = inputs.nodes.node_with_provider_id(pid.as_str());
            let registered = target
                .node_registered(name)
                .or_else(|| match lookup {
                    NodeLookup::Found(_) => Some(format!("Node {name} exists in the workload cluster")),
                    _ => None,
                })
                .or_else(|| match &by_provider_id {
                    NodeLookup::Found(node) => Some(format!(
                        "Node {} carries its provider ID {}",
                        shown(&node.name),
                        shown(pid.as_str())
                    )),
                    _ => None,
                });
            match (registered, &by_provider_id) {
                (Some(why), _) => book.fail(
                    Rule::OneIdentity,
                    DenyReason::NodeAlreadyRegistered,
                    format!(
                        "initial request for {} whose node is registered: {why}",
                        target.describe()
                    ),
                ),
                (None, NodeLookup::Unavailable(why)) => book.pending(
                    Rule::OneIdentity,
                    format!(
                        "cannot tell whether a Node already carries provider ID {}: {why}",
                        shown(pid.as_str())
                    ),
                ),
                (None, _) => book.pass(
                    Rule::OneIdentity,
                    format!("{} is unclaimed and its node unregistered", target.describe()),
                ),
            }
            OneIdentity::Settled
        }
    }
}

fn select_verifier<'v, 'e>(
    book: &mut Book,
    inputs: &Inputs<'v>,
    envelope: &'e RequestEnvelope,
) -> Option<(&'v dyn Verifier, &'e ProviderVersion)> {
    let Some(version) = &envelope.provider else {
        book.fail(
            Rule::Attestation,
            DenyReason::AttestationMissing,
            "no ATTESTATION PROVIDER block",
        );
        return None;
    };
    let verifier = inputs
        .verifiers
        .for_provider(version.provider())
        .filter(|v| v.versions().contains(&version.version()));
    let Some(verifier) = verifier else {
        book.fail(
            Rule::Attestation,
            DenyReason::UnsupportedAttestationVersion,
            format!(
                "{version} is not supported (supported: {})",
                inputs.verifiers.supported_versions()
            ),
        );
        return None;
    };
    if !inputs.cluster.allows(version.provider()) {
        book.fail(
            Rule::Attestation,
            DenyReason::AttestationNotAllowed,
            format!(
                "Cluster {} allows attestors {:?}, not {}",
                inputs.cluster.name,
                inputs.cluster.allowed_attestors,
                version.provider()
            ),
        );
        return None;
    }
    if verifier.signer_name() != inputs.csr.signer_name {
        book.fail(
            Rule::Attestation,
            DenyReason::AttestationNotAllowed,
            format!(
                "{version} CSRs go to signer {}, not {}",
                verifier.signer_name(),
                shown(&inputs.csr.signer_name)
            ),
        );
        return None;
    }
    Some((verifier, version))
}

fn claim_write(
    inputs: &Inputs<'_>,
    target: Target<'_>,
    current: &ClaimState,
    pid: &ProviderId,
    name: &NodeName,
    ek_sha256: Option<String>,
    instance: Option<String>,
) -> Option<ClaimWrite> {
    if current.valid().is_some_and(|c| c.csr_uid == inputs.csr.uid) {
        return None;
    }
    let record = KubeletClaim {
        node_name: name.as_str().to_owned(),
        provider_id: pid.as_str().to_owned(),
        csr_uid: inputs.csr.uid.clone(),
        ek_sha256,
        instance,
        claimed_at: inputs.clock.now.format(&Rfc3339).unwrap_or_default(),
    };
    Some(match target {
        Target::Machine(m) => ClaimWrite::machine(m.target(), m.resource_version().map(str::to_owned), record),
        Target::Pool(p) => ClaimWrite::pool(
            p.target(),
            p.resource_version.clone(),
            &p.claims,
            &p.provider_ids,
            record,
        ),
    })
}

/// `insecure/v1` -> `AttestedInsecureV1`.
fn approval_reason(version: &ProviderVersion) -> String {
    let camel = |s: &str| {
        s.split('-')
            .map(|part| {
                let mut chars = part.chars();
                chars
                    .next()
                    .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                    .unwrap_or_default()
            })
            .collect::<String>()
    };
    format!("Attested{}{}", camel(version.provider()), camel(version.version()))
}
