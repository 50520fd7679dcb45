//! The `tpm/v1` attestor: the node side of SPEC section 5, through tss-esapi.
//!
//! Phase 1 sends the EK (default template, RSA-2048 unless ECC P-256 is asked for) with its NV
//! certificate, a fresh AK created under the EK (restricted ECDSA P-256 signing key, fixedTPM,
//! fixedParent, sensitiveDataOrigin), and a quote whose `extraData` is SHA-256 of the CSR key.
//! Phase 2 opens the signer's credential with ActivateCredential (the EK authorised by a
//! PolicySecret(endorsement) session) and quotes `SHA-256(CSR key || secret)` with the same AK.
//!
//! Both phases quote the PCRs a boot policy judges ([`QUOTED_PCRS`]) in the SHA-256 bank, or in
//! SHA-1 on a TPM that has no SHA-256 bank allocated; phase 1 also sends the TCG event log
//! ([`EventLogSource`]) that lets the signer replay them.
//!
//! Every call opens its own TPM context and flushes every transient object and session it
//! made: swtpm, like many TPMs, has three transient slots. The AK's private part (wrapped by
//! the EK, useless off this TPM) is kept between the phases of one attestor.

use std::collections::BTreeMap;
use std::str::FromStr;

use tss_esapi::abstraction::{AsymmetricAlgorithmSelection, KeyCustomization, ak, ek};
use tss_esapi::attributes::{ObjectAttributesBuilder, SessionAttributesBuilder};
use tss_esapi::constants::{CapabilityType, SessionType};
use tss_esapi::handles::{AuthHandle, KeyHandle, ObjectHandle};
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, SignatureSchemeAlgorithm};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::interface_types::session_handles::{AuthSession, PolicySession};
use tss_esapi::structures::{
    CapabilityData, Data, Digest, EncryptedSecret, IdObject, PcrSelectionList, PcrSlot, Private, Public,
    SignatureScheme, SymmetricDefinition,
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

mod event_log_file;

pub use event_log_file::{EventLogFileError, EventLogSource, KERNEL_EVENT_LOG, MAX_EVENT_LOG};

/// The PCRs quoted: 0 and 1 (firmware and its settings), 4 (the boot applications: shim, grub,
/// the kernel), 7 (Secure Boot state and the certificates that verified them), 8 and 9 (grub's
/// commands and kernel command line, the files it loaded: kernel, initrd), 11 (a unified kernel
/// image's sections): every PCR a boot policy judges, SPEC section 5.
pub const QUOTED_PCRS: [PcrSlot; 7] = [
    PcrSlot::Slot0,
    PcrSlot::Slot1,
    PcrSlot::Slot4,
    PcrSlot::Slot7,
    PcrSlot::Slot8,
    PcrSlot::Slot9,
    PcrSlot::Slot11,
];

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
    event_log: EventLogSource,
    ak_attributes: Option<AkAttributes>,
    ak: Option<AkBlob>,
}

impl std::fmt::Debug for TpmAttestor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmAttestor")
            .field("tcti", &self.tcti)
            .field("ek_algorithm", &self.ek_algorithm)
            .field("event_log", &self.event_log)
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
    /// `swtpm:host=127.0.0.1,port=2321`), with an RSA-2048 EK, [`QUOTED_PCRS`] quoted, and the
    /// kernel's event log sent when it can be read.
    pub fn new(tcti: &str) -> Result<Self, AttestError> {
        TctiNameConf::from_str(tcti).map_err(|e| AttestError::DeviceUnavailable(format!("TCTI {tcti:?}: {e}")))?;
        Ok(Self {
            tcti: tcti.to_owned(),
            ek_algorithm: EkAlgorithm::default(),
            pcrs: QUOTED_PCRS.to_vec(),
            event_log: EventLogSource::default(),
            ak_attributes: None,
            ak: None,
        })
    }

    /// Presents this EK instead.
    pub fn with_ek_algorithm(mut self, algorithm: EkAlgorithm) -> Self {
        self.ek_algorithm = algorithm;
        self
    }

    /// Sends this event log with phase 1 instead of the kernel's.
    pub fn with_event_log(mut self, source: EventLogSource) -> Self {
        self.event_log = source;
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

/// The bank quoted: SHA-256, or SHA-1 on a TPM that allocated no SHA-256 PCRs (older firmware
/// allocates SHA-1 only; the event log then carries SHA-1 digests, which the signer replays).
/// `allocated` is each bank with the PCRs allocated in it (`TPM2_GetCapability(PCRS)`).
fn quote_bank(allocated: &[(HashingAlgorithm, Vec<PcrSlot>)]) -> Result<HashingAlgorithm, AttestError> {
    let has = |alg| allocated.iter().any(|(a, pcrs)| *a == alg && !pcrs.is_empty());
    if has(HashingAlgorithm::Sha256) {
        Ok(HashingAlgorithm::Sha256)
    } else if has(HashingAlgorithm::Sha1) {
        Ok(HashingAlgorithm::Sha1)
    } else {
        let banks: Vec<String> = allocated
            .iter()
            .filter(|(_, pcrs)| !pcrs.is_empty())
            .map(|(alg, _)| format!("{alg:?}"))
            .collect();
        Err(AttestError::Failed(format!(
            "the TPM has neither a SHA-256 nor a SHA-1 PCR bank allocated (allocated: {})",
            if banks.is_empty() {
                "none".to_owned()
            } else {
                banks.join(", ")
            }
        )))
    }
}

/// The PCR banks the TPM has allocated, each with its PCRs.
fn allocated_banks(ctx: &mut Context) -> Result<Vec<(HashingAlgorithm, Vec<PcrSlot>)>, AttestError> {
    // TPM2_CAP_PCRS ignores the property; every bank fits in one answer.
    let (data, _) = ctx
        .execute_without_session(|ctx| ctx.get_capability(CapabilityType::AssignedPcr, 0, 8))
        .map_err(failed("GetCapability(PCRS)"))?;
    match data {
        CapabilityData::AssignedPcr(list) => Ok(list
            .get_selections()
            .iter()
            .map(|s| (s.hashing_algorithm(), s.selected()))
            .collect()),
        other => Err(AttestError::Failed(format!(
            "GetCapability(PCRS) answered with another capability: {other:?}"
        ))),
    }
}

/// A quote by `ak` over `extra_data` and `pcrs` in `bank`, with the PCR values it covers.
fn quote(
    ctx: &mut Context,
    ak: KeyHandle,
    bank: HashingAlgorithm,
    pcrs: &[PcrSlot],
    extra_data: &[u8],
) -> Result<Quoted, AttestError> {
    let selection = PcrSelectionList::builder()
        .with_selection(bank, pcrs)
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
        // Read before the TPM is touched, so a named log that cannot be sent fails at once.
        let event_log = match challenge {
            None => self.event_log.read().map_err(|e| AttestError::Failed(e.to_string()))?,
            Some(_) => None,
        };
        let pcrs = self.pcrs.clone();
        let Loaded {
            ek_public,
            ek_certificate,
            ak_public,
            output: (bank, quoted),
        } = self.with_keys(|ctx, ek, ak| {
            let extra = match &challenge {
                None => Zeroizing::new(sha256(spki).to_vec()),
                Some(answer) => {
                    let secret = activate(ctx, ak, ek, answer.annotation)?;
                    Zeroizing::new(phase_two_extra_data(spki, &secret).to_vec())
                }
            };
            let bank = quote_bank(&allocated_banks(ctx)?)?;
            let quoted = quote(ctx, ak, bank, &pcrs, &extra)?;
            Ok((bank, quoted))
        })?;
        let data = TpmData {
            phase: if challenge.is_some() { 2 } else { 1 },
            ek_public: tpm2b(&ek_public.marshall().map_err(failed("marshal EK public"))?)?,
            ek_certificate,
            ek_intermediates: Vec::new(),
            ak_public: tpm2b(&ak_public.marshall().map_err(failed("marshal AK public"))?)?,
            quote: quoted.attest,
            signature: quoted.signature,
            // DATA's `pcrs` names the sha256 bank only (SHA-1 values would be refused there);
            // a SHA-1 quote's values are the log's to explain.
            pcrs: if bank == HashingAlgorithm::Sha256 {
                BTreeMap::from([("sha256".to_owned(), quoted.pcrs)])
            } else {
                BTreeMap::new()
            },
            challenge: challenge.map(|c| ChallengeRef {
                csr_name: c.csr_name.to_owned(),
                csr_uid: c.csr_uid.to_owned(),
            }),
            event_log,
        };
        Ok(Some(data.encode()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_is_quoted_when_allocated_and_sha1_only_without_it() {
        let all = QUOTED_PCRS.to_vec();
        let both = [
            (HashingAlgorithm::Sha1, all.clone()),
            (HashingAlgorithm::Sha256, all.clone()),
        ];
        assert_eq!(quote_bank(&both).unwrap(), HashingAlgorithm::Sha256);
        let sha1_and_empty_sha256 = [
            (HashingAlgorithm::Sha1, all.clone()),
            (HashingAlgorithm::Sha256, Vec::new()),
        ];
        assert_eq!(quote_bank(&sha1_and_empty_sha256).unwrap(), HashingAlgorithm::Sha1);
        let sha384 = [(HashingAlgorithm::Sha384, all), (HashingAlgorithm::Sha256, Vec::new())];
        let error = quote_bank(&sha384).unwrap_err().to_string();
        assert!(error.contains("Sha384"), "{error}");
        assert!(quote_bank(&[]).unwrap_err().to_string().contains("none"));
    }

    #[test]
    fn the_policy_pcrs_are_quoted() {
        let indexes: Vec<u32> = QUOTED_PCRS.iter().map(|s| u32::from(*s).trailing_zeros()).collect();
        assert_eq!(indexes, [0, 1, 4, 7, 8, 9, 11]);
        assert_eq!(TpmAttestor::new(DEFAULT_TCTI).unwrap().pcrs, QUOTED_PCRS);
    }
}
