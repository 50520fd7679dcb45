//! Kubelet-shaped CSRs, and the ways an attacker or a buggy client bends them.

use std::sync::OnceLock;

use attestation::CsrObject;
use attestation::envelope::{ProviderVersion, RequestEnvelope};
use attestation::identity::{NodeName, ProviderId};
use attestation::names::{GROUP_BOOTSTRAPPERS, GROUP_NODES, PROVIDER_ID_OID, SIGNER_INSECURE, usage};
use attestation::request::{KeyAlgorithm, NodeKey};
use rcgen::{CertificateParams, CustomExtension, DistinguishedName, DnType, SanType};

/// Keys are slow to make (RSA above all) and their identity does not matter here: one per type.
pub fn key(algorithm: KeyAlgorithm) -> &'static NodeKey {
    static P256: OnceLock<NodeKey> = OnceLock::new();
    static P384: OnceLock<NodeKey> = OnceLock::new();
    static RSA: OnceLock<NodeKey> = OnceLock::new();
    static ED: OnceLock<NodeKey> = OnceLock::new();
    let cell = match algorithm {
        KeyAlgorithm::EcdsaP384 => &P384,
        KeyAlgorithm::Rsa2048 => &RSA,
        KeyAlgorithm::Ed25519 => &ED,
        _ => &P256,
    };
    cell.get_or_init(|| NodeKey::generate(algorithm).expect("key generation"))
}

/// Everything that shapes a client CSR's `spec.request`.
#[derive(Clone)]
pub struct RequestSpec {
    /// Subject; default `O=system:nodes, CN=system:node:<node>`.
    pub subject: DistinguishedName,
    /// Provider-ID extension value (DER); `None` leaves the extension out.
    pub provider_id_extension: Option<Vec<u8>>,
    /// Whether the provider-ID extension is marked critical.
    pub provider_id_critical: bool,
    /// SANs to request.
    pub sans: Vec<SanType>,
    /// Further extensions to request.
    pub extra_extensions: Vec<CustomExtension>,
    /// Key type.
    pub key: KeyAlgorithm,
    /// A key rcgen generates on the spot (for algorithms the signer refuses).
    pub unusual_key: Option<&'static rcgen::SignatureAlgorithm>,
    /// PROVIDER block; `None` leaves it out.
    pub provider: Option<String>,
    /// DATA block.
    pub data: Option<Vec<u8>>,
    /// Flip a bit of the signature.
    pub corrupt_signature: bool,
    /// A request assembled from DER parts, used instead of rcgen's (subject, provider-ID and
    /// extra extensions, SANs and key above are then ignored).
    pub raw: Option<crate::pkcs10::Pkcs10>,
}

impl RequestSpec {
    /// A well-formed insecure/v1 request for `node` with `provider_id`.
    pub fn kubelet(node: &str, provider_id: &str) -> Self {
        Self {
            subject: subject(&[
                (DnType::OrganizationName, GROUP_NODES),
                (DnType::CommonName, &format!("system:node:{node}")),
            ]),
            provider_id_extension: Some(ProviderId::new(provider_id).expect("provider ID").to_extension_value()),
            provider_id_critical: false,
            sans: Vec::new(),
            extra_extensions: Vec::new(),
            key: KeyAlgorithm::EcdsaP256,
            unusual_key: None,
            provider: Some("insecure/v1".to_owned()),
            data: None,
            corrupt_signature: false,
            raw: None,
        }
    }

    /// A kubelet serving request for `node` with `sans`.
    pub fn serving(node: &str, sans: Vec<SanType>) -> Self {
        Self {
            provider_id_extension: None,
            provider: None,
            sans,
            ..Self::kubelet(node, "unused")
        }
    }

    /// The `spec.request` bytes.
    pub fn build(&self) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name = self.subject.clone();
        params.subject_alt_names = self.sans.clone();
        if let Some(value) = &self.provider_id_extension {
            let mut ext = CustomExtension::from_oid_content(PROVIDER_ID_OID, value.clone());
            ext.set_criticality(self.provider_id_critical);
            params.custom_extensions.push(ext);
        }
        params.custom_extensions.extend(self.extra_extensions.iter().cloned());
        let owned;
        let key_pair: &rcgen::KeyPair = match self.unusual_key {
            Some(algorithm) => {
                owned = rcgen::KeyPair::generate_for(algorithm).expect("key");
                &owned
            }
            None => key(self.key).key_pair(),
        };
        let mut der = match &self.raw {
            Some(raw) => raw.sign(),
            None => params.serialize_request(key_pair).expect("CSR").der().to_vec(),
        };
        if self.corrupt_signature {
            let last = der.len() - 1;
            der[last] ^= 0x01;
        }
        RequestEnvelope {
            csr_der: der,
            provider: self
                .provider
                .as_deref()
                .map(|p| ProviderVersion::parse(p).expect("provider block")),
            data: self.data.clone(),
        }
        .encode()
        .into_bytes()
    }
}

/// A distinguished name from attributes, in order.
pub fn subject(attributes: &[(DnType, &str)]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for (ty, value) in attributes {
        dn.push(ty.clone(), *value);
    }
    dn
}

/// A CSR object for a client request filed by a bootstrap-token user.
pub fn client_csr_object(request: Vec<u8>, token_id: &str) -> CsrObject {
    CsrObject {
        name: "csr-abc12".into(),
        uid: "3f1c2a9e-0000-4000-8000-000000000001".into(),
        request,
        signer_name: SIGNER_INSECURE.into(),
        usages: vec![usage::DIGITAL_SIGNATURE.into(), usage::CLIENT_AUTH.into()],
        username: format!("system:bootstrap:{token_id}"),
        groups: vec![GROUP_BOOTSTRAPPERS.into(), "system:authenticated".into()],
        expiration_seconds: None,
        created: None,
        ..CsrObject::default()
    }
}

/// A CSR object for a serving request filed by the node.
pub fn serving_csr_object(request: Vec<u8>, node: &str) -> CsrObject {
    CsrObject {
        name: "csr-serving".into(),
        uid: "3f1c2a9e-0000-4000-8000-000000000002".into(),
        request,
        signer_name: attestation::names::SIGNER_KUBELET_SERVING.into(),
        usages: vec![usage::DIGITAL_SIGNATURE.into(), usage::SERVER_AUTH.into()],
        username: NodeName::new(node).expect("node name").username(),
        groups: vec![GROUP_NODES.into(), "system:authenticated".into()],
        expiration_seconds: None,
        created: None,
        ..CsrObject::default()
    }
}
