//! The signer's software MakeCredential, answered by a real TPM 2.0 (swtpm): ActivateCredential
//! under the endorsement policy session recovers the secret only for the AK the credential
//! names. The EK and AK come from the TPM, parsed by `attestation::tpm`. Skipped loudly without
//! swtpm and tpm2-tools.

#![allow(clippy::unwrap_used)]

use attestation::tpm::credential::make_credential;
use attestation::tpm::public::TpmPublic;
use tests::swtpm::Swtpm;

/// tpm2-tools' credential file: magic, version, TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET.
fn credential_file(blob: &[u8], secret: &[u8]) -> Vec<u8> {
    let mut out = 0xBADC_C0DEu32.to_be_bytes().to_vec();
    out.extend_from_slice(&1u32.to_be_bytes());
    out.extend_from_slice(blob);
    out.extend_from_slice(secret);
    out
}

fn activate(tpm: &Swtpm, ak_ctx: &str, file: &str) -> Result<Vec<u8>, String> {
    tpm.ok(&["tpm2_flushcontext", "-t"]);
    tpm.ok(&["tpm2_startauthsession", "--policy-session", "-S", "session.ctx"]);
    tpm.ok(&["tpm2_policysecret", "-S", "session.ctx", "-c", "e"]);
    let out = tpm.tool(&[
        "tpm2_activatecredential",
        "-c",
        ak_ctx,
        "-C",
        "ek.ctx",
        "-i",
        file,
        "-o",
        "recovered.bin",
        "-P",
        "session:session.ctx",
    ]);
    tpm.ok(&["tpm2_flushcontext", "session.ctx"]);
    if out.status.success() {
        Ok(std::fs::read(tpm.path("recovered.bin")).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
#[ignore = "needs swtpm"]
fn a_real_tpm_recovers_the_secret_only_for_the_named_ak() {
    let tpm = Swtpm::start("tpm_credential");
    tpm.ok(&[
        "tpm2_createek",
        "-c",
        "ek.ctx",
        "-G",
        "rsa",
        "-u",
        "ek.pub",
        "-f",
        "tss",
    ]);
    for ak in ["ak", "other"] {
        tpm.ok(&[
            "tpm2_createak",
            "-C",
            "ek.ctx",
            "-c",
            &format!("{ak}.ctx"),
            "-G",
            "rsa",
            "-g",
            "sha256",
            "-s",
            "rsassa",
            "-u",
            &format!("{ak}.pub"),
            "-f",
            "tss",
            "-n",
            &format!("{ak}.name"),
        ]);
        tpm.ok(&["tpm2_flushcontext", "-t"]);
    }
    let ek = TpmPublic::from_tpm2b(&std::fs::read(tpm.path("ek.pub")).unwrap()).unwrap();
    let ak = TpmPublic::from_tpm2b(&std::fs::read(tpm.path("ak.pub")).unwrap()).unwrap();
    assert_eq!(
        ak.name(),
        std::fs::read(tpm.path("ak.name")).unwrap(),
        "our Name is the TPM's"
    );

    let secret = *b"challenge-secret-0123456789abcde";
    let credential = make_credential(&ek, &ak.name(), &secret).unwrap();
    std::fs::write(
        tpm.path("cred.bin"),
        credential_file(&credential.credential_blob, &credential.encrypted_secret),
    )
    .unwrap();
    assert_eq!(
        activate(&tpm, "ak.ctx", "cred.bin").unwrap(),
        secret,
        "ActivateCredential recovers it"
    );

    // The same credential offered with another AK of the same TPM: the TPM refuses it.
    let refused = activate(&tpm, "other.ctx", "cred.bin");
    assert!(
        refused.is_err(),
        "a credential for another AK must not activate: {refused:?}"
    );

    // The EK certificate swtpm_setup wrote into NV chains to swtpm_localca's root.
    tpm.ok(&["tpm2_nvread", "0x1c00002", "-o", "ekcert.der"]);
    let localca = tests::swtpm::localca_dir();
    let root = std::fs::read(localca.join("swtpm-localca-rootca-cert.pem")).unwrap();
    let intermediate = pem::parse(std::fs::read(localca.join("issuercert.pem")).unwrap())
        .unwrap()
        .into_contents();
    let trust = attestation::tpm::ek::EkTrust::from_pem(&root).unwrap();
    let ek_cert = std::fs::read(tpm.path("ekcert.der")).unwrap();
    assert_eq!(
        trust.verify(&ek, &ek_cert, &[intermediate]),
        Ok(()),
        "the TPM's EK certificate is trusted"
    );
    assert!(trust.verify(&ak, &ek_cert, &[]).is_err());

    // A tampered blob fails the TPM's integrity check.
    let mut tampered = credential.credential_blob.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    std::fs::write(
        tpm.path("tampered.bin"),
        credential_file(&tampered, &credential.encrypted_secret),
    )
    .unwrap();
    assert!(activate(&tpm, "ak.ctx", "tampered.bin").is_err());
}
