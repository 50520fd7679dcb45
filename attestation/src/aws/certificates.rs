//! AWS's regional certificates for the `rsa2048` identity document signature.
//!
//! The file format is PEM with a comment line before each certificate naming the regions it
//! serves: `# regions: us-east-1, us-east-2`. The project ships AWS's published set
//! ([`RegionCertificates::shipped`]); `--aws-iid-certificates` replaces it (new regions, a
//! partition of its own, tests).

use x509_parser::prelude::FromDer;

/// The certificates the project ships (`aws-iid-rsa2048.pem` beside this module).
const SHIPPED: &str = include_str!("aws-iid-rsa2048.pem");

/// Certificates by region.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionCertificates {
    entries: Vec<(Vec<String>, Vec<u8>)>,
}

impl RegionCertificates {
    /// The set shipped with the project.
    pub fn shipped() -> Self {
        // The shipped file is tested to parse (`the_shipped_set_parses_and_covers_the_main_regions`).
        Self::from_pem(SHIPPED).unwrap_or_default()
    }

    /// Reads the file format above. Every certificate must name its regions, parse, and carry
    /// an RSA key of at least 2048 bits; a region named twice is refused.
    pub fn from_pem(text: &str) -> Result<Self, String> {
        let mut entries: Vec<(Vec<String>, Vec<u8>)> = Vec::new();
        let mut regions: Option<Vec<String>> = None;
        let mut body: Option<String> = None;
        for (number, line) in text.lines().enumerate() {
            let line = line.trim_end();
            let at = || format!("line {}", number + 1);
            if let Some(pem_body) = body.as_mut() {
                pem_body.push_str(line);
                pem_body.push('\n');
                if line == "-----END CERTIFICATE-----" {
                    let block = pem::parse(pem_body.as_bytes()).map_err(|e| format!("{}: {e}", at()))?;
                    let names = regions
                        .take()
                        .ok_or_else(|| format!("{}: a certificate without a '# regions:' line", at()))?;
                    check_certificate(block.contents()).map_err(|e| format!("{} ({}): {e}", at(), names.join(",")))?;
                    if let Some(twice) = names.iter().find(|r| entries.iter().any(|(rs, _)| rs.contains(r))) {
                        return Err(format!("{}: region {twice} is named twice", at()));
                    }
                    entries.push((names, block.into_contents()));
                    body = None;
                }
            } else if let Some(list) = line.strip_prefix("# regions:") {
                let names: Vec<String> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|r| !r.is_empty())
                    .map(str::to_owned)
                    .collect();
                if names.is_empty() {
                    return Err(format!("{}: '# regions:' names no region", at()));
                }
                regions = Some(names);
            } else if line == "-----BEGIN CERTIFICATE-----" {
                body = Some(format!("{line}\n"));
            }
        }
        if body.is_some() {
            return Err("a certificate is not terminated".into());
        }
        if entries.is_empty() {
            return Err("no certificate with a '# regions:' line".into());
        }
        Ok(Self { entries })
    }

    /// The certificate (DER) for `region`.
    pub fn for_region(&self, region: &str) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|(regions, _)| regions.iter().any(|r| r == region))
            .map(|(_, der)| der.as_slice())
    }

    /// Every region covered.
    pub fn regions(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().flat_map(|(r, _)| r.iter().map(String::as_str))
    }

    /// How many certificates.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn check_certificate(der: &[u8]) -> Result<(), String> {
    let (rest, certificate) =
        x509_parser::certificate::X509Certificate::from_der(der).map_err(|e| format!("not a certificate: {e}"))?;
    if !rest.is_empty() {
        return Err("bytes after the certificate".into());
    }
    match certificate.public_key().parsed() {
        Ok(x509_parser::public_key::PublicKey::RSA(rsa)) if rsa.key_size() >= 2048 => Ok(()),
        Ok(x509_parser::public_key::PublicKey::RSA(rsa)) => Err(format!(
            "a {}-bit RSA key: the rsa2048 form needs 2048 bits or more",
            rsa.key_size()
        )),
        _ => Err("not an RSA key".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_set_parses_and_covers_the_main_regions() {
        let set = RegionCertificates::from_pem(SHIPPED).unwrap();
        for region in ["us-east-1", "us-west-2", "eu-west-1", "ap-northeast-1"] {
            assert!(set.for_region(region).is_some(), "{region}");
        }
        assert!(set.for_region("xx-nowhere-1").is_none());
    }

    #[test]
    fn a_file_without_regions_or_with_a_region_twice_is_refused() {
        let (_, pem) = SHIPPED.split_once("-----BEGIN").unwrap();
        let one = format!(
            "-----BEGIN{}",
            pem.split_inclusive("-----END CERTIFICATE-----\n").next().unwrap()
        );
        assert!(RegionCertificates::from_pem(&one).unwrap_err().contains("regions"));
        let twice = format!("# regions: a, b\n{one}# regions: b\n{one}");
        assert!(RegionCertificates::from_pem(&twice).unwrap_err().contains("twice"));
        let ok = format!("# regions: a, b\n{one}");
        assert_eq!(
            RegionCertificates::from_pem(&ok).unwrap().regions().collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(RegionCertificates::from_pem("").is_err());
    }
}
