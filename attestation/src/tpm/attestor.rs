//! The `tpm/v1` attestor: the node side of SPEC section 5, through tss-esapi.
//!
//! Phase 1 sends the EK (default template, RSA-2048 unless ECC P-256 is asked for) with its NV
//! certificate, a fresh AK created under the EK (restricted ECDSA P-256 signing key, fixedTPM,
//! fixedParent, sensitiveDataOrigin), and a quote whose `extraData` is SHA-256 of the CSR key.
//! Phase 2 opens the signer's credential with ActivateCredential (the EK authorised by a
//! PolicySecret(endorsement) session) and quotes `SHA-256(CSR key || secret)` with the same AK.
//!
//! Every call opens its own TPM context and flushes every transient object and session it
//! made: swtpm, like many TPMs, has three transient slots. The AK's private part (wrapped by
//! the EK, useless off this TPM) is kept between the phases of one attestor.

use std::collections::BTreeMap;
use std::str::FromStr;

use tss_esapi::abstraction::{AsymmetricAlgorithmSelection, KeyCustomization, ak, ek};
use tss_esapi::attributes::{ObjectAttributesBuilder, SessionAttributesBuilder};
use tss_esapi::constants::SessionType;
use tss_esapi::handles::{AuthHandle, KeyHandle, ObjectHandle};
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, SignatureSchemeAlgorithm};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::interface_types::session_handles::{AuthSession, PolicySession};
use tss_esapi::structures::{
    Data, Digest, EncryptedSecret, IdObject, PcrSelectionList, PcrSlot, Private, Public, SignatureScheme,
    SymmetricDefinition,
};
use tss_esapi::tcti_ldr::TctiNameConf;
use tss_esapi::traits::Marshall;
use tss_esapi::{Context, Error as TssError};
use zeroize::Zeroizing;

use super::data::{ChallengeAnnotation, ChallengeRef, TpmData, phase_two_extra_data};
use super::wire::unwrap_tpm2b;
use crate::attestor::{AttestError, AttestationRequest, Attestor};
use crate::digest::{hex, sha256};
use crate::envelope::ProviderVersion;
use crate::names::{ANNOTATION_TPM_CHALLENGE, SIGNER_TPM};

/// Default TCTI: the kernel's resource manager.
pub const DEFAULT_TCTI: &str = "device:/dev/tpmrm0";

/// Which EK the node presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EkAlgorithm {
    /// RSA-2048, TCG default template (the SPEC's preference).
    #[default]
    Rsa2048,
    /// ECC NIST P-256, TCG default template.
    EccP256,
}

impl EkAlgorithm {
    fn selection(self) -> AsymmetricAlgorithmSelection {
        match self {
            Self::Rsa2048 => AsymmetricAlgorithmSelection::Rsa(RsaKeyBits::Rsa2048),
            Self::EccP256 => AsymmetricAlgorithmSelection::Ecc(EccCurve::NistP256),
        }
    }
}

/// What [`TpmAttestor::with_keys`] read, and its body's output.
struct Loaded<T> {
    ek_public: Public,
    ek_certificate: Option<Vec<u8>>,
    ak_public: Public,
    output: T,
}

/// AK attribute changes, for tests that need a TPM to make a key the signer must refuse.
#[derive(Debug, Clone, Copy)]
pub struct AkAttributes(pub fn(ObjectAttributesBuilder) -> ObjectAttributesBuilder);

impl KeyCustomization for AkAttributes {
    fn attributes(&self, builder: ObjectAttributesBuilder) -> ObjectAttributesBuilder {
        (self.0)(builder)
    }
}

/// The AK of one attestation: created in phase 1, loaded again in phase 2.
struct AkBlob {
    private: Private,
    public: Public,
}

/// Node side of `tpm/v1`.
pub struct TpmAttestor {
    tcti: String,
    ek_algorithm: EkAlgorithm,
    pcrs: Vec<PcrSlot>,
    ak_attributes: Option<AkAttributes>,
    ak: Option<AkBlob>,
}

impl std::fmt::Debug for TpmAttestor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmAttestor")
            .field("tcti", &self.tcti)
            .field("ek_algorithm", &self.ek_algorithm)
            .field("has_ak", &self.ak.is_some())
            .finish_non_exhaustive()
    }
}

fn failed(step: &str) -> impl FnOnce(TssError) -> AttestError + '_ {
    move |e| AttestError::Failed(format!("TPM {step}: {e}"))
}

/// `TPM2B_*` from the structure's own encoding: a big-endian u16 size, then the bytes.
fn tpm2b(inner: &[u8]) -> Result<Vec<u8>, AttestError> {
    let size = u16::try_from(inner.len()).map_err(|_| AttestError::Failed("a TPM structure over 64 KiB".into()))?;
    let mut out = Vec::with_capacity(inner.len() + 2);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(inner);
    Ok(out)
}

impl TpmAttestor {
    /// An attestor talking to the TPM at `tcti` (e.g. `device:/dev/tpmrm0`,
    /// `swtpm:host=127.0.0.1,port=2321`), with an RSA-2048 EK and PCRs 0, 1 and 7 (SHA-256)
    /// reported.
    pub fn new(tcti: &str) -> Result<Self, AttestError> {
        TctiNameConf::from_str(tcti).map_err(|e| AttestError::DeviceUnavailable(format!("TCTI {tcti:?}: {e}")))?;
        Ok(Self {
            tcti: tcti.to_owned(),
            ek_algorithm: EkAlgorithm::default(),
            pcrs: vec![PcrSlot::Slot0, PcrSlot::Slot1, PcrSlot::Slot7],
            ak_attributes: None,
            ak: None,
        })
    }

    /// Presents this EK instead.
    pub fn with_ek_algorithm(mut self, algorithm: EkAlgorithm) -> Self {
        self.ek_algorithm = algorithm;
        self
    }

    /// Changes the AK's attributes (tests of the signer's refusals).
    pub fn with_ak_attributes(mut self, attributes: AkAttributes) -> Self {
        self.ak_attributes = Some(attributes);
        self
    }

    /// Forgets the AK: the next phase 1 creates a new one.
    pub fn reset(&mut self) {
        self.ak = None;
    }

    fn context(&self) -> Result<Context, AttestError> {
        let conf = TctiNameConf::from_str(&self.tcti)
            .map_err(|e| AttestError::DeviceUnavailable(format!("TCTI {:?}: {e}", self.tcti)))?;
        Context::new(conf)
            .map_err(|e| AttestError::DeviceUnavailable(format!("cannot open the TPM at {:?}: {e}", self.tcti)))
    }

    /// Runs `body` with the EK and AK loaded, flushing both whatever happens.
    fn with_keys<T>(
        &mut self,
        body: impl FnOnce(&mut Context, KeyHandle, KeyHandle) -> Result<T, AttestError>,
    ) -> Result<Loaded<T>, AttestError> {
        let mut ctx = self.context()?;
        let ek = ek::create_ek_object_2(&mut ctx, self.ek_algorithm.selection(), None).map_err(failed("create EK"))?;
        let result = (|| {
            let (ek_public, _, _) = ctx.read_public(ek).map_err(failed("read EK public"))?;
            // Not every TPM is provisioned with a certificate; the signer may trust a pin.
            // The NV index may hold padding after the certificate: send the certificate only.
            let ek_certificate = ek::retrieve_ek_pubcert(&mut ctx, self.ek_algorithm.selection())
                .ok()
                .map(|stored| match super::ek::strip_nv_padding(&stored) {
                    Ok(certificate) => certificate.to_vec(),
                    Err(_) => stored,
                });
            if self.ak.is_none() {
                let attributes = self.ak_attributes.unwrap_or(AkAttributes(|b| b));
                let created = ak::create_ak_2(
                    &mut ctx,
                    ek,
                    HashingAlgorithm::Sha256,
                    AsymmetricAlgorithmSelection::Ecc(EccCurve::NistP256),
                    SignatureSchemeAlgorithm::EcDsa,
                    None,
                    attributes,
                )
                .map_err(failed("create AK"))?;
                self.ak = Some(AkBlob {
                    private: created.out_private,
                    public: created.out_public,
                });
            }
            let blob = self.ak.as_ref().ok_or_else(|| AttestError::Failed("no AK".into()))?;
            let ak_handle = ak::load_ak(&mut ctx, ek, None, blob.private.clone(), blob.public.clone())
                .map_err(failed("load AK"))?;
            let ak_public = blob.public.clone();
            let out = body(&mut ctx, ek, ak_handle);
            let _ = ctx.flush_context(ObjectHandle::from(ak_handle));
            out.map(|output| Loaded {
                ek_public,
                ek_certificate,
                ak_public,
                output,
            })
        })();
        let _ = ctx.flush_context(ObjectHandle::from(ek));
        result
    }
}

/// A quote by `ak` over `extra_data` and the SHA-256 `pcrs`, with the PCR values it covers.
fn quote(ctx: &mut Context, ak: KeyHandle, pcrs: &[PcrSlot], extra_data: &[u8]) -> Result<Quoted, AttestError> {
    let selection = PcrSelectionList::builder()
        .with_selection(HashingAlgorithm::Sha256, pcrs)
        .build()
        .map_err(failed("PCR selection"))?;
    let qualifying = Data::try_from(extra_data.to_vec()).map_err(failed("quote data"))?;
    let (attest, signature) = ctx
        .execute_with_nullauth_session(|ctx| ctx.quote(ak, qualifying, SignatureScheme::Null, selection.clone()))
        .map_err(failed("quote"))?;
    let (_, read_selection, digests) = ctx
        .execute_without_session(|ctx| ctx.pcr_read(selection))
        .map_err(failed("PCR read"))?;
    let mut values = BTreeMap::new();
    let slots: Vec<PcrSlot> = read_selection
        .get_selections()
        .iter()
        .flat_map(|s| s.selected())
        .collect();
    for (slot, digest) in slots.iter().zip(digests.value()) {
        let index = u32::from(*slot).trailing_zeros();
        values.insert(index.to_string(), hex(digest.value()));
    }
    Ok(Quoted {
        attest: tpm2b(&attest.marshall().map_err(failed("marshal quote"))?)?,
        signature: signature.marshall().map_err(failed("marshal signature"))?,
        pcrs: values,
    })
}

struct Quoted {
    attest: Vec<u8>,
    signature: Vec<u8>,
    pcrs: BTreeMap<String, String>,
}

/// ActivateCredential: the AK authorised by an empty password, the EK by PolicySecret on the
/// endorsement hierarchy (what the EK's default policy asks).
fn activate(
    ctx: &mut Context,
    ak: KeyHandle,
    ek: KeyHandle,
    annotation: &str,
) -> Result<Zeroizing<Vec<u8>>, AttestError> {
    let challenge: ChallengeAnnotation = serde_json::from_str(annotation)
        .map_err(|e| AttestError::Failed(format!("the signer's challenge does not parse: {e}")))?;
    let blob = unwrap_tpm2b(&challenge.credential_blob, "TPM2B_ID_OBJECT")
        .map_err(|e| AttestError::Failed(format!("challenge: {e}")))?;
    let secret = unwrap_tpm2b(&challenge.encrypted_secret, "TPM2B_ENCRYPTED_SECRET")
        .map_err(|e| AttestError::Failed(format!("challenge: {e}")))?;
    let blob = IdObject::try_from(blob.to_vec()).map_err(failed("credential blob"))?;
    let secret = EncryptedSecret::try_from(secret.to_vec()).map_err(failed("encrypted secret"))?;

    let policy = ctx
        .start_auth_session(
            None,
            None,
            None,
            SessionType::Policy,
            SymmetricDefinition::AES_128_CFB,
            HashingAlgorithm::Sha256,
        )
        .map_err(failed("start policy session"))?
        .ok_or_else(|| AttestError::Failed("the TPM returned no policy session".into()))?;
    let result = (|| {
        let (attributes, mask) = SessionAttributesBuilder::new()
            .with_decrypt(true)
            .with_encrypt(true)
            .build();
        ctx.tr_sess_set_attributes(policy, attributes, mask)
            .map_err(failed("session attributes"))?;
        let policy_session = PolicySession::try_from(policy).map_err(failed("policy session"))?;
        ctx.execute_with_nullauth_session(|ctx| {
            ctx.policy_secret(
                policy_session,
                AuthHandle::Endorsement,
                Default::default(),
                Default::default(),
                Default::default(),
                None,
            )
        })
        .map_err(failed("PolicySecret(endorsement)"))?;
        ctx.execute_with_sessions((Some(AuthSession::Password), Some(policy), None), |ctx| {
            ctx.activate_credential(ak, ek, blob, secret)
        })
        .map(|digest: Digest| Zeroizing::new(digest.value().to_vec()))
        .map_err(failed("ActivateCredential (is the challenge for this TPM and AK?)"))
    })();
    let _ = ctx.flush_context(ObjectHandle::from(tss_esapi::handles::SessionHandle::from(policy)));
    result
}

impl Attestor for TpmAttestor {
    fn provider_version(&self) -> ProviderVersion {
        ProviderVersion::new(super::verifier::PROVIDER, "v1")
    }

    fn signer_name(&self) -> &'static str {
        SIGNER_TPM
    }

    fn challenge_annotation(&self) -> Option<&'static str> {
        Some(ANNOTATION_TPM_CHALLENGE)
    }

    fn attest(&mut self, request: &AttestationRequest<'_>) -> Result<Option<Vec<u8>>, AttestError> {
        let spki = request.spki_der;
        let challenge = request.challenge;
        if challenge.is_none() {
            // Phase 1 starts a new attestation with a new AK.
            self.ak = None;
        } else if self.ak.is_none() {
            return Err(AttestError::Failed(
                "a challenge arrived for an AK this attestor did not create: start again from phase 1".into(),
            ));
        }
        let pcrs = self.pcrs.clone();
        let Loaded {
            ek_public,
            ek_certificate,
            ak_public,
            output: quoted,
        } = self.with_keys(|ctx, ek, ak| {
            let extra = match &challenge {
                None => Zeroizing::new(sha256(spki).to_vec()),
                Some(answer) => {
                    let secret = activate(ctx, ak, ek, answer.annotation)?;
                    Zeroizing::new(phase_two_extra_data(spki, &secret).to_vec())
                }
            };
            let quoted = quote(ctx, ak, &pcrs, &extra)?;
            Ok(quoted)
        })?;
        let data = TpmData {
            phase: if challenge.is_some() { 2 } else { 1 },
            ek_public: tpm2b(&ek_public.marshall().map_err(failed("marshal EK public"))?)?,
            ek_certificate,
            ek_intermediates: Vec::new(),
            ak_public: tpm2b(&ak_public.marshall().map_err(failed("marshal AK public"))?)?,
            quote: quoted.attest,
            signature: quoted.signature,
            pcrs: BTreeMap::from([("sha256".to_owned(), quoted.pcrs)]),
            challenge: challenge.map(|c| ChallengeRef {
                csr_name: c.csr_name.to_owned(),
                csr_uid: c.csr_uid.to_owned(),
            }),
            event_log: None,
        };
        Ok(Some(data.encode()))
    }
}
