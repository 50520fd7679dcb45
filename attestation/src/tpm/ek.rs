//! EK trust by certificate chain (`--tpm-ek-ca-bundle`, SPEC section 5).
//!
//! The EK certificate must carry the EK of the public area the node sent (compared as key
//! material, so an `id-RSAES-OAEP` algorithm identifier is tolerated), and chain, through the
//! node's intermediates, to a certificate of the bundle: signatures and CA constraints are
//! checked; validity dates are not, since EK chains routinely outlive them. Extensions real EK
//! certificates carry (a critical subjectAltName with a directoryName, EKU 2.23.133.8.1) are
//! accepted because nothing here rejects unknown extensions.

use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;

use super::public::TpmPublic;

/// Longest chain followed (leaf, intermediates, root).
const MAX_DEPTH: usize = 6;

/// Trust anchors for EK certificates, indexed by their subject (as an RDN-set key, so a
/// chain step only parses the anchors whose name matches: the vendors' bundle holds hundreds).
#[derive(Debug, Clone, Default)]
pub struct EkTrust {
    roots: Vec<(NameKey, Vec<u8>)>,
}

/// A name as [`same_name`] compares it: RDNs in order, each a sorted set of (type, value).
type NameKey = Vec<Vec<(String, Vec<u8>)>>;

fn name_key(name: &x509_parser::x509::X509Name<'_>) -> NameKey {
    name.iter()
        .map(|rdn| {
            let mut set: Vec<(String, Vec<u8>)> = rdn
                .iter()
                .map(|atv| (atv.attr_type().to_id_string(), atv.attr_value().data.to_vec()))
                .collect();
            set.sort();
            set
        })
        .collect()
}

fn parse(der: &[u8]) -> Result<X509Certificate<'_>, String> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        Ok(_) => Err("trailing bytes after a certificate".into()),
        Err(e) => Err(format!("a certificate does not parse: {e}")),
    }
}

/// The certificate at the start of an EK NV index's contents: real TPMs store the DER
/// certificate followed by padding up to the index size (`0xFF` erased flash, or `0x00`). The
/// outer SEQUENCE's length says where the certificate ends; what follows must be padding of
/// one byte value, so that no second object can ride along unnoticed. SPEC section 5.
pub fn strip_nv_padding(stored: &[u8]) -> Result<&[u8], String> {
    let length = outer_sequence_length(stored)?;
    let (certificate, padding) = stored.split_at(length);
    match padding.first() {
        None => Ok(certificate),
        Some(&fill @ (0x00 | 0xFF)) if padding.iter().all(|b| *b == fill) => Ok(certificate),
        Some(_) => Err(format!(
            "{} bytes after the EK certificate are not padding (0x00 or 0xFF)",
            padding.len()
        )),
    }
}

/// Total length (header included) of the definite-length SEQUENCE `bytes` starts with.
fn outer_sequence_length(bytes: &[u8]) -> Result<usize, String> {
    let malformed = || "the EK certificate does not start with a definite-length SEQUENCE".to_owned();
    let (&tag, rest) = bytes.split_first().ok_or_else(malformed)?;
    let (&first, rest) = rest.split_first().ok_or_else(malformed)?;
    if tag != 0x30 {
        return Err(malformed());
    }
    let (content, header) = match first {
        0x00..=0x7F => (usize::from(first), 2),
        0x81..=0x84 => {
            let count = usize::from(first & 0x7F);
            let octets = rest.get(..count).ok_or_else(malformed)?;
            let content = octets.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b));
            (content, 2 + count)
        }
        _ => return Err(malformed()),
    };
    let total = header.checked_add(content).ok_or_else(malformed)?;
    if total > bytes.len() {
        return Err(format!(
            "the EK certificate claims {total} bytes but {} were sent",
            bytes.len()
        ));
    }
    Ok(total)
}

/// Whether two names are the same: the same RDNs in order, each RDN the same set of attribute
/// types and values whatever their order. Vendor EK and CA certificates may encode a
/// multi-valued RDN unsorted (BER, not DER), so the issuer written in a certificate and the
/// subject of the CA that signed it can differ in bytes while naming the same CA; the
/// signatures are still checked over the bytes as sent.
fn same_name(a: &x509_parser::x509::X509Name<'_>, b: &x509_parser::x509::X509Name<'_>) -> bool {
    a.as_raw() == b.as_raw() || name_key(a) == name_key(b)
}

fn is_ca(cert: &X509Certificate<'_>) -> bool {
    matches!(cert.basic_constraints(), Ok(Some(bc)) if bc.value.ca)
}

fn signed_by(cert: &X509Certificate<'_>, issuer: &X509Certificate<'_>) -> bool {
    same_name(cert.issuer(), issuer.subject()) && cert.verify_signature(Some(issuer.public_key())).is_ok()
}

impl EkTrust {
    /// Anchors from a PEM bundle (the `--tpm-ek-ca-bundle` file).
    pub fn from_pem(bundle: &[u8]) -> Result<Self, String> {
        let blocks = pem::parse_many(bundle).map_err(|e| format!("the EK CA bundle is not PEM: {e}"))?;
        let mut roots = Vec::new();
        for (index, block) in blocks.into_iter().filter(|b| b.tag() == "CERTIFICATE").enumerate() {
            let der = block.into_contents();
            let key = parse(&der)
                .map(|cert| name_key(cert.subject()))
                .map_err(|e| format!("EK CA bundle, certificate {}: {e}", index + 1))?;
            roots.push((key, der));
        }
        if roots.is_empty() {
            return Err("the EK CA bundle holds no CERTIFICATE".into());
        }
        Ok(Self { roots })
    }

    /// How many anchors.
    pub fn len(&self) -> usize {
        self.roots.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// Checks that `cert` is `ek`'s certificate and chains to an anchor through
    /// `intermediates`.
    pub fn verify(&self, ek: &TpmPublic, cert: &[u8], intermediates: &[Vec<u8>]) -> Result<(), String> {
        let cert = strip_nv_padding(cert).map_err(|e| format!("EK certificate: {e}"))?;
        let leaf = parse(cert).map_err(|e| format!("EK certificate: {e}"))?;
        let expected = ek.canonical_spki().map_err(|e| e.to_string())?;
        let (_, expected) = x509_parser::x509::SubjectPublicKeyInfo::from_der(&expected)
            .map_err(|e| format!("canonical EK key: {e}"))?;
        if leaf.public_key().subject_public_key.data != expected.subject_public_key.data {
            return Err("the EK certificate is for another key than the EK public area".into());
        }
        let intermediates: Vec<X509Certificate<'_>> = intermediates
            .iter()
            .map(|der| parse(der).map_err(|e| format!("EK intermediate: {e}")))
            .collect::<Result<_, _>>()?;
        let mut current = &leaf;
        for _ in 0..MAX_DEPTH {
            let issuer = name_key(current.issuer());
            let anchored = self
                .roots
                .iter()
                .filter(|(subject, _)| *subject == issuer)
                .filter_map(|(_, der)| parse(der).ok())
                .any(|root| {
                    signed_by(current, &root) && (is_ca(&root) || root.basic_constraints().ok().flatten().is_none())
                });
            if anchored {
                return Ok(());
            }
            match intermediates.iter().find(|i| is_ca(i) && signed_by(current, i)) {
                Some(next) => current = next,
                None => break,
            }
        }
        Err(format!(
            "the EK certificate (issuer {}) does not chain to --tpm-ek-ca-bundle",
            attestation_name(current)
        ))
    }
}

fn attestation_name(cert: &X509Certificate<'_>) -> String {
    crate::identity::truncate(&cert.issuer().to_string(), 96)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(name: &str) -> Vec<u8> {
        std::fs::read(format!("{}/testdata/tpm/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    fn der_of(pem_name: &str) -> Vec<u8> {
        pem::parse(vector(pem_name)).unwrap().into_contents()
    }

    #[test]
    fn a_swtpm_ek_certificate_chains_through_its_intermediate_to_the_root() {
        let ek = TpmPublic::from_tpm2b(&vector("ek.pub")).unwrap();
        let trust = EkTrust::from_pem(&vector("ek-root.pem")).unwrap();
        assert_eq!(
            trust.verify(&ek, &vector("ekcert.der"), &[der_of("ek-intermediate.pem")]),
            Ok(())
        );
        // Without the intermediate there is no path.
        let why = trust.verify(&ek, &vector("ekcert.der"), &[]).unwrap_err();
        assert!(why.contains("does not chain"), "{why}");
        // The intermediate itself as the anchor works too.
        let intermediate = EkTrust::from_pem(&vector("ek-intermediate.pem")).unwrap();
        assert_eq!(intermediate.verify(&ek, &vector("ekcert.der"), &[]), Ok(()));
    }

    #[test]
    fn another_key_an_untrusted_root_or_a_broken_signature_fail() {
        let ek = TpmPublic::from_tpm2b(&vector("ek.pub")).unwrap();
        let ak = TpmPublic::from_tpm2b(&vector("ak.pub")).unwrap();
        let trust = EkTrust::from_pem(&vector("ek-root.pem")).unwrap();
        let chain = [der_of("ek-intermediate.pem")];
        let why = trust.verify(&ak, &vector("ekcert.der"), &chain).unwrap_err();
        assert!(why.contains("another key"), "{why}");
        let (_, other_root) = rcgen_root();
        let stranger = EkTrust::from_pem(other_root.as_bytes()).unwrap();
        assert!(stranger.verify(&ek, &vector("ekcert.der"), &chain).is_err());
        let mut broken = vector("ekcert.der");
        let last = broken.len() - 1;
        broken[last] ^= 1;
        assert!(trust.verify(&ek, &broken, &chain).is_err());
        assert!(EkTrust::from_pem(b"not pem").is_err());
    }

    #[test]
    fn nv_padding_after_the_certificate_is_ignored_and_anything_else_refused() {
        let ek = TpmPublic::from_tpm2b(&vector("ek.pub")).unwrap();
        let trust = EkTrust::from_pem(&vector("ek-root.pem")).unwrap();
        let chain = [der_of("ek-intermediate.pem")];
        for fill in [0xFF, 0x00] {
            let mut padded = vector("ekcert.der");
            padded.resize(padded.len() + 700, fill);
            assert_eq!(trust.verify(&ek, &padded, &chain), Ok(()), "fill {fill:#x}");
        }
        let mut smuggled = vector("ekcert.der");
        smuggled.extend_from_slice(&[0xFF, 0xFF, 0x30, 0x00]);
        assert!(
            trust
                .verify(&ek, &smuggled, &chain)
                .unwrap_err()
                .contains("not padding")
        );
        let cert = vector("ekcert.der");
        assert!(
            strip_nv_padding(&cert[..cert.len() - 1])
                .unwrap_err()
                .contains("claims")
        );
        assert!(strip_nv_padding(&[0x31, 0x00]).is_err());
        assert!(strip_nv_padding(&[0x30, 0x80, 0x00, 0x00]).is_err());
        assert_eq!(strip_nv_padding(&[0x30, 0x00, 0xFF]), Ok(&[0x30, 0x00][..]));
    }

    /// `SEQUENCE { SET { atv... } }` of (OID arc bytes, PrintableString) pairs, in this order.
    fn name(atvs: &[(&[u8], &str)]) -> Vec<u8> {
        let tlv = |tag: u8, body: &[u8]| [&[tag, u8::try_from(body.len()).unwrap()][..], body].concat();
        let set: Vec<u8> = atvs
            .iter()
            .flat_map(|(oid, value)| tlv(0x30, &[tlv(0x06, oid), tlv(0x13, value.as_bytes())].concat()))
            .collect();
        tlv(0x30, &tlv(0x31, &set))
    }

    #[test]
    fn names_match_as_rdn_sets_whatever_the_order_inside_an_rdn() {
        use x509_parser::x509::X509Name;
        const C: &[u8] = &[0x55, 0x04, 0x06];
        const O: &[u8] = &[0x55, 0x04, 0x0a];
        let sorted = name(&[(C, "TW"), (O, "Nuvoton")]);
        let unsorted = name(&[(O, "Nuvoton"), (C, "TW")]);
        let other = name(&[(C, "TW"), (O, "Nuvotom")]);
        let (_, a) = X509Name::from_der(&sorted).unwrap();
        let (_, b) = X509Name::from_der(&unsorted).unwrap();
        let (_, c) = X509Name::from_der(&other).unwrap();
        assert_ne!(a.as_raw(), b.as_raw());
        assert!(same_name(&a, &b));
        assert!(!same_name(&a, &c));
    }

    fn rcgen_root() -> (rcgen::KeyPair, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "swtpm-localca-rootca");
        let cert = params.self_signed(&key).unwrap();
        (key, cert.pem())
    }
}
