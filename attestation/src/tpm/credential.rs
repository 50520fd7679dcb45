//! `TPM2_MakeCredential` in software (TPM 2.0 Part 1, section 24): a secret that only the TPM
//! holding both the EK and the AK named can recover, with `TPM2_ActivateCredential`.
//!
//! For an RSA EK (the default EK template, SHA-256 name, AES-128 CFB symmetric):
//! - seed: 32 random bytes, sent as RSA-OAEP(SHA-256, label `"IDENTITY\0"`) under the EK;
//! - symKey = KDFa(SHA-256, seed, "STORAGE", AK name, -, 128 bits);
//! - encIdentity = AES-128-CFB(symKey, IV 0, TPM2B_DIGEST(secret));
//! - HMACkey = KDFa(SHA-256, seed, "INTEGRITY", -, -, 256 bits);
//! - outerHMAC = HMAC-SHA256(HMACkey, encIdentity || AK name);
//! - credentialBlob = TPM2B_ID_OBJECT(TPM2B_DIGEST(outerHMAC) || encIdentity).
//!
//! For an ECC P-256 EK the seed is agreed instead: an ephemeral key's ECDH with the EK gives Z,
//! seed = KDFe(SHA-256, Z, "IDENTITY", ephemeral x, EK x), and the encrypted secret is the
//! ephemeral point (`TPMS_ECC_POINT`); the rest is the same.

use aws_lc_rs::cipher::{AES_128, EncryptingKey, EncryptionContext, UnboundCipherKey};
use aws_lc_rs::iv::FixedLength;
use aws_lc_rs::rsa::{OAEP_SHA256_MGF1SHA256, OaepPublicEncryptingKey, PublicEncryptingKey};

use super::public::{PublicKey, TpmPublic};
use super::wire::WireError;

/// What MakeCredential produces: both as the TPM wire encodings the node passes to
/// ActivateCredential (size prefixes included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// `TPM2B_ID_OBJECT`.
    pub credential_blob: Vec<u8>,
    /// `TPM2B_ENCRYPTED_SECRET`.
    pub encrypted_secret: Vec<u8>,
}

/// SP 800-108 counter-mode KDF with HMAC-SHA256, as the TPM defines KDFa:
/// `K(i) = HMAC(key, [i]32 || label || 0x00 || context_u || context_v || [bits]32)`.
pub fn kdfa_sha256(key: &[u8], label: &str, context_u: &[u8], context_v: &[u8], bits: u32) -> Vec<u8> {
    let hmac_key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key);
    let bytes = bits.div_ceil(8) as usize;
    let mut out = Vec::with_capacity(bytes + 32);
    let mut counter: u32 = 1;
    while out.len() < bytes {
        let mut ctx = aws_lc_rs::hmac::Context::with_key(&hmac_key);
        ctx.update(&counter.to_be_bytes());
        ctx.update(label.as_bytes());
        ctx.update(&[0]);
        ctx.update(context_u);
        ctx.update(context_v);
        ctx.update(&bits.to_be_bytes());
        out.extend_from_slice(ctx.sign().as_ref());
        counter += 1;
    }
    out.truncate(bytes);
    out
}

fn tpm2b(inner: &[u8]) -> Result<Vec<u8>, WireError> {
    let size = u16::try_from(inner.len()).map_err(|_| WireError::Invalid("a TPM2B over 64 KiB".into()))?;
    let mut out = size.to_be_bytes().to_vec();
    out.extend_from_slice(inner);
    Ok(out)
}

/// MakeCredential for `secret` (at most 32 bytes) to the TPM holding the RSA `ek` and the AK
/// named `ak_name`, with the given 32-byte `seed` (random in production: [`make_credential`]).
pub fn make_credential_with_seed(
    ek: &TpmPublic,
    ak_name: &[u8],
    secret: &[u8],
    seed: &[u8; 32],
) -> Result<Credential, WireError> {
    check_secret(secret)?;
    let PublicKey::Rsa { .. } = ek.key else {
        return Err(WireError::Invalid(
            "a chosen seed is for RSA EKs; ECC EKs derive it".into(),
        ));
    };
    let public = PublicEncryptingKey::from_der(&ek.canonical_spki()?).map_err(|_| crypto("loading the EK"))?;
    let oaep = OaepPublicEncryptingKey::new(public).map_err(|_| crypto("OAEP"))?;
    let mut encrypted = vec![0u8; oaep.ciphertext_size()];
    let encrypted = oaep
        .encrypt(&OAEP_SHA256_MGF1SHA256, seed, &mut encrypted, Some(b"IDENTITY\0"))
        .map_err(|_| crypto("RSA-OAEP"))?
        .to_vec();
    Ok(Credential {
        credential_blob: credential_blob(seed, ak_name, secret)?,
        encrypted_secret: tpm2b(&encrypted)?,
    })
}

fn crypto(what: &str) -> WireError {
    WireError::Invalid(format!("MakeCredential: {what} failed"))
}

fn check_secret(secret: &[u8]) -> Result<(), WireError> {
    if secret.is_empty() || secret.len() > 32 {
        return Err(WireError::Invalid("a credential secret is 1 to 32 bytes".into()));
    }
    Ok(())
}

/// The `TPM2B_ID_OBJECT`: the secret encrypted under KDFa(seed, "STORAGE", AK name) with
/// AES-128-CFB (the EK templates' symmetric algorithm), and its outer HMAC.
fn credential_blob(seed: &[u8], ak_name: &[u8], secret: &[u8]) -> Result<Vec<u8>, WireError> {
    let sym_key = kdfa_sha256(seed, "STORAGE", ak_name, &[], 128);
    let mut enc_identity = tpm2b(secret)?;
    let key = UnboundCipherKey::new(&AES_128, &sym_key).map_err(|_| crypto("AES key"))?;
    EncryptingKey::cfb128(key)
        .map_err(|_| crypto("AES-CFB"))?
        .less_safe_encrypt(
            &mut enc_identity,
            EncryptionContext::Iv128(FixedLength::from([0u8; 16])),
        )
        .map_err(|_| crypto("AES-CFB"))?;

    let hmac_key = kdfa_sha256(seed, "INTEGRITY", &[], &[], 256);
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &hmac_key);
    let mut ctx = aws_lc_rs::hmac::Context::with_key(&key);
    ctx.update(&enc_identity);
    ctx.update(ak_name);
    let outer_hmac = ctx.sign();

    let mut id_object = tpm2b(outer_hmac.as_ref())?;
    id_object.extend_from_slice(&enc_identity);
    tpm2b(&id_object)
}

/// SP 800-56A concatenation KDF with SHA-256, as the TPM defines KDFe, for one block:
/// `SHA-256([1]32 || Z || label || 0x00 || party_u || party_v)`.
pub fn kdfe_sha256(z: &[u8], label: &str, party_u: &[u8], party_v: &[u8]) -> [u8; 32] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(&1u32.to_be_bytes());
    ctx.update(z);
    ctx.update(label.as_bytes());
    ctx.update(&[0]);
    ctx.update(party_u);
    ctx.update(party_v);
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// ECC secret sharing (TPM 2.0 Part 1, "ECDH"): an ephemeral P-256 key agrees with the EK;
/// the seed is KDFe(Z, "IDENTITY", ephemeral x, EK x); the encrypted secret is the ephemeral
/// point (`TPMS_ECC_POINT`).
fn ecc_seed(x: &[u8], y: &[u8]) -> Result<(zeroize::Zeroizing<[u8; 32]>, Vec<u8>), WireError> {
    use aws_lc_rs::agreement::{ECDH_P256, EphemeralPrivateKey, UnparsedPublicKey, agree_ephemeral};
    let mut point = vec![0x04];
    point.extend_from_slice(x);
    point.extend_from_slice(y);
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let ephemeral = EphemeralPrivateKey::generate(&ECDH_P256, &rng).map_err(|_| crypto("ephemeral key"))?;
    let public = ephemeral.compute_public_key().map_err(|_| crypto("ephemeral key"))?;
    let (ex, ey) = public.as_ref()[1..].split_at(32);
    let seed = agree_ephemeral(
        ephemeral,
        UnparsedPublicKey::new(&ECDH_P256, &point),
        crypto("ECDH"),
        |z| Ok(zeroize::Zeroizing::new(kdfe_sha256(z, "IDENTITY", ex, x))),
    )?;
    let mut encrypted = tpm2b(ex)?;
    encrypted.extend_from_slice(&tpm2b(ey)?);
    Ok((seed, encrypted))
}

/// MakeCredential with a fresh seed: random and RSA-OAEP encrypted to an RSA EK, or agreed by
/// ECDH with an ECC P-256 EK.
pub fn make_credential(ek: &TpmPublic, ak_name: &[u8], secret: &[u8]) -> Result<Credential, WireError> {
    check_secret(secret)?;
    match &ek.key {
        PublicKey::Rsa { .. } => {
            let mut seed = zeroize::Zeroizing::new([0u8; 32]);
            aws_lc_rs::rand::fill(seed.as_mut_slice()).map_err(|_| WireError::Invalid("no randomness".into()))?;
            make_credential_with_seed(ek, ak_name, secret, &seed)
        }
        PublicKey::EccP256 { x, y } => {
            let (seed, point) = ecc_seed(x, y)?;
            Ok(Credential {
                credential_blob: credential_blob(seed.as_slice(), ak_name, secret)?,
                encrypted_secret: tpm2b(&point)?,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kdfa_lengths_and_separation() {
        let a = kdfa_sha256(b"seed", "STORAGE", b"name", &[], 128);
        assert_eq!(a.len(), 16);
        assert_ne!(a, kdfa_sha256(b"seed", "INTEGRITY", b"name", &[], 128)[..]);
        let long = kdfa_sha256(b"seed", "X", &[], &[], 512);
        assert_eq!(long.len(), 64);
        assert_ne!(long[..32], long[32..], "counter blocks differ");
        assert_ne!(
            kdfa_sha256(b"seed", "X", &[], &[], 256)[..],
            long[..32],
            "the length is bound in"
        );
    }

    #[test]
    fn blobs_have_the_wire_shape_and_depend_on_the_ak_name() {
        let ek = TpmPublic::from_tpm2b(
            &std::fs::read(format!("{}/testdata/tpm/ek.pub", env!("CARGO_MANIFEST_DIR"))).unwrap(),
        )
        .unwrap();
        let seed = [7u8; 32];
        let one =
            make_credential_with_seed(&ek, b"\x00\x0bname-one", b"0123456789abcdef0123456789abcdef", &seed).unwrap();
        assert_eq!(one.encrypted_secret.len(), 2 + 256);
        // ID object: 2 (size) + 2 + 32 (HMAC) + 2 + 32 (encrypted TPM2B_DIGEST).
        assert_eq!(one.credential_blob.len(), 2 + 2 + 32 + 2 + 32);
        let two =
            make_credential_with_seed(&ek, b"\x00\x0bname-two", b"0123456789abcdef0123456789abcdef", &seed).unwrap();
        assert_ne!(one.credential_blob, two.credential_blob);
        assert!(make_credential_with_seed(&ek, b"n", &[0; 33], &seed).is_err());
    }
}
