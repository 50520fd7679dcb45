//! The identity document's PKCS#7 signature (`rsa2048`): SignedData with the document as its
//! encapsulated content, no certificates, one signer, possibly BER. The reading is the clouds'
//! shared one ([`crate::cloud::pkcs7`], AWS's profile); the region's certificate the operator
//! trusts checks the signature.

pub use crate::cloud::pkcs7::MAX_PKCS7_BYTES;
use crate::cloud::pkcs7::{Profile, SignedStatement};

/// A decoded, not yet verified, signed identity document.
#[derive(Debug, Clone)]
pub struct SignedDocument(SignedStatement);

impl SignedDocument {
    /// Decodes the PKCS#7 (BER or DER).
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        SignedStatement::parse(bytes, Profile::AWS).map(Self)
    }

    /// The identity document (JSON), not yet verified.
    pub fn content(&self) -> &[u8] {
        self.0.content()
    }

    /// Checks the signature with the certificate's RSA key (DER certificate); certificates
    /// inside the message, if any, are ignored.
    pub fn verify(&self, certificate_der: &[u8]) -> Result<(), String> {
        self.0.verify(certificate_der, "the region's AWS certificate")
    }
}
