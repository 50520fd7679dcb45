//! `aws/v1`'s metadata service: [`ImdsV2`], the EC2 instance metadata service over IMDSv2 only
//! (a session token first, asked for again once on a 401), for the instance identity document's
//! PKCS#7 signature and the instance role's credentials, moved into zeroed memory as they are
//! parsed. A room of its own, as the attestation crate's `aws/`; the STS request those
//! credentials sign is built there (`attestation::aws`), not here.

use anyhow::Result;
use attestation::attestor::AttestError;
use attestation::aws::attestor::{Ec2Metadata, RoleCredentials};
use zeroize::Zeroizing;

use super::env_value;
use super::http::{Response, Server, http_endpoint, percent_encode, shown};

/// The environment variable naming the EC2 instance metadata service (a URL), as AWS's SDKs
/// read it.
pub const AWS_EC2_METADATA_SERVICE_ENDPOINT_ENV: &str = "AWS_EC2_METADATA_SERVICE_ENDPOINT";

/// The EC2 instance metadata service's link-local address.
const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254/";

/// IMDSv2 session tokens: where they are issued and the header carrying them.
pub(super) const IMDS_TOKEN_PATH: &str = "/latest/api/token";
const IMDS_TOKEN_TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";
const IMDS_TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";
/// Five minutes: one attestation needs a few seconds of it.
const IMDS_TOKEN_TTL_SECONDS: &str = "300";

const IMDS_RSA2048_PATH: &str = "/latest/dynamic/instance-identity/rsa2048";
const IMDS_ROLES_PATH: &str = "/latest/meta-data/iam/security-credentials/";

const IMDS_SERVICE: &str = "the EC2 instance metadata service";
const NO_ROLE: &str = "the instance has no IAM role: aws/v1 needs an instance profile";

/// [`Ec2Metadata`] over HTTP, IMDSv2 only: a session token first (`PUT`), then each `GET`
/// carrying it. IMDSv1 (no token) is what many instances disable, and what a server-side
/// request forgery on the node reaches most easily; IMDSv2 works wherever the service does.
pub struct ImdsV2 {
    pub(super) server: Server,
    /// The session token, once issued: every request of one attestation shares it.
    token: Option<Zeroizing<String>>,
}

impl std::fmt::Debug for ImdsV2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImdsV2")
            .field("server", &self.server)
            .field("token", &self.token.as_ref().map(|_| "..."))
            .finish()
    }
}

impl ImdsV2 {
    /// The service named by `AWS_EC2_METADATA_SERVICE_ENDPOINT` when it is set (as AWS's SDKs
    /// allow), else `http://169.254.169.254/`.
    pub fn from_env() -> Result<Self> {
        Self::new(env_value(AWS_EC2_METADATA_SERVICE_ENDPOINT_ENV)?.as_deref())
    }

    /// The service at `endpoint` (`http://host[:port][/path]`), or the default one.
    pub fn new(endpoint: Option<&str>) -> Result<Self> {
        let endpoint = endpoint.unwrap_or(DEFAULT_IMDS_ENDPOINT);
        Ok(Self {
            server: http_endpoint(IMDS_SERVICE, endpoint, AWS_EC2_METADATA_SERVICE_ENDPOINT_ENV)?,
            token: None,
        })
    }

    /// The session token, asked for once and kept.
    fn session_token(&mut self) -> Result<Zeroizing<String>, AttestError> {
        if let Some(token) = &self.token {
            return Ok(token.clone());
        }
        let response = self.server.send(
            "PUT",
            IMDS_TOKEN_PATH,
            &[(IMDS_TOKEN_TTL_HEADER, IMDS_TOKEN_TTL_SECONDS)],
        )?;
        let body = self
            .server
            .success(&response, IMDS_TOKEN_PATH, "a session token (IMDSv2)")?;
        let token = std::str::from_utf8(body).map(str::trim).unwrap_or_default();
        // It goes back in a header: visible ASCII only, so nothing can be smuggled in there.
        if token.is_empty() || token.len() > 1024 || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(self.server.bad_body(IMDS_TOKEN_PATH, "the session token is malformed"));
        }
        let token = Zeroizing::new(token.to_owned());
        self.token = Some(token.clone());
        Ok(token)
    }

    /// `GET target` with the session token. A 401 means the token expired or the service
    /// restarted: a new one is asked for, once.
    fn get(&mut self, target: &str) -> Result<Response, AttestError> {
        let mut retried = false;
        loop {
            let token = self.session_token()?;
            let response = self
                .server
                .send("GET", target, &[(IMDS_TOKEN_HEADER, token.as_str())])?;
            if response.status == 401 && !retried {
                self.token = None;
                retried = true;
                continue;
            }
            return Ok(response);
        }
    }
}

impl Ec2Metadata for ImdsV2 {
    fn identity_rsa2048(&mut self) -> Result<String, AttestError> {
        let response = self.get(IMDS_RSA2048_PATH)?;
        let body = self
            .server
            .success(&response, IMDS_RSA2048_PATH, "the instance identity document")?;
        let text = std::str::from_utf8(body).map_err(|_| {
            self.server
                .bad_body(IMDS_RSA2048_PATH, "the identity document's signature is not text")
        })?;
        if text.trim().is_empty() {
            return Err(self
                .server
                .bad_body(IMDS_RSA2048_PATH, "the identity document's signature is empty"));
        }
        Ok(text.to_owned())
    }

    fn role_credentials(&mut self) -> Result<RoleCredentials, AttestError> {
        let listing = self.get(IMDS_ROLES_PATH)?;
        let no_role = || {
            AttestError::Failed(format!(
                "{NO_ROLE} ({IMDS_SERVICE} lists none at {})",
                self.server.url(IMDS_ROLES_PATH)
            ))
        };
        if listing.status == 404 {
            return Err(no_role());
        }
        let body = self
            .server
            .success(&listing, IMDS_ROLES_PATH, "the instance's IAM role")?;
        let role = std::str::from_utf8(body)
            .map_err(|_| self.server.bad_body(IMDS_ROLES_PATH, "the role listing is not UTF-8"))?
            .lines()
            .map(str::trim)
            .find(|line| !line.is_empty())
            .ok_or_else(no_role)?
            .to_owned();
        let target = format!("{IMDS_ROLES_PATH}{}", percent_encode(&role));
        let answer = self.get(&target)?;
        let what = format!("the credentials of role {}", shown(&role));
        let body = self.server.success(&answer, &target, &what)?;
        parse_credentials(body, &what).map_err(|why| self.server.bad_body(&target, &why))
    }
}

/// The credential document's three secrets, moved out of the parsed JSON into zeroed
/// memory. Errors never quote the document.
fn parse_credentials(body: &[u8], what: &str) -> Result<RoleCredentials, String> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| format!("{what} are not JSON (line {}, column {})", e.line(), e.column()))?;
    let serde_json::Value::Object(mut fields) = value else {
        return Err(format!("{what} are not a JSON object"));
    };
    match fields.get("Code").and_then(serde_json::Value::as_str) {
        Some("Success") => {}
        Some(code) => return Err(format!("{what} are not usable: Code is {}", shown(code))),
        None => return Err(format!("{what} have no Code")),
    }
    let mut take = |name: &str| match fields.remove(name) {
        Some(serde_json::Value::String(value)) if !value.is_empty() => Ok(Zeroizing::new(value)),
        _ => Err(format!("{what} have no {name}")),
    };
    let access_key_id = take("AccessKeyId")?;
    let secret_access_key = take("SecretAccessKey")?;
    let session_token = take("Token")?;
    Ok(RoleCredentials {
        access_key_id: access_key_id.to_string(),
        secret_access_key,
        session_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::test_support::{RSA2048, StandIn, answer, failed, ok};

    const CREDENTIALS: &str = r#"{
  "Code" : "Success",
  "LastUpdated" : "2025-01-01T00:00:00Z",
  "Type" : "AWS-HMAC",
  "AccessKeyId" : "ASIAEXAMPLE",
  "SecretAccessKey" : "secret-key-material",
  "Token" : "session-token-material",
  "Expiration" : "2025-01-01T06:00:00Z"
}"#;

    #[test]
    fn the_imds_session_token_is_put_before_the_gets_and_sent_with_each() {
        let stand_in = StandIn::answering(vec![ok("TOKEN-1"), ok(RSA2048), ok(RSA2048)]);
        let mut imds = stand_in.imds();
        assert_eq!(imds.identity_rsa2048().unwrap(), RSA2048);
        assert_eq!(imds.identity_rsa2048().unwrap(), RSA2048, "the token is kept");
        let requests = stand_in.requests();
        assert_eq!(requests.len(), 3, "one PUT, then GETs: {requests:?}");
        assert!(
            requests[0].starts_with("PUT /latest/api/token HTTP/1.1\r\n"),
            "{}",
            requests[0]
        );
        assert!(
            requests[0].contains("\r\nX-aws-ec2-metadata-token-ttl-seconds: 300\r\n"),
            "{}",
            requests[0]
        );
        assert!(requests[0].contains("\r\nContent-Length: 0\r\n"), "{}", requests[0]);
        for get in &requests[1..] {
            assert!(
                get.starts_with("GET /latest/dynamic/instance-identity/rsa2048 HTTP/1.1\r\n"),
                "{get}"
            );
            assert!(get.contains("\r\nX-aws-ec2-metadata-token: TOKEN-1\r\n"), "{get}");
        }
    }

    #[test]
    fn the_role_listing_and_its_credential_document_are_read() {
        let stand_in = StandIn::answering(vec![
            ok("TOKEN-1"),
            ok("\nkubelet-node\nanother-role\n"),
            answer("200 OK", &[("Content-Type", "text/plain")], CREDENTIALS),
        ]);
        let credentials = stand_in.imds().role_credentials().unwrap();
        assert_eq!(credentials.access_key_id, "ASIAEXAMPLE");
        assert_eq!(credentials.secret_access_key.as_str(), "secret-key-material");
        assert_eq!(credentials.session_token.as_str(), "session-token-material");
        let requests = stand_in.requests();
        assert!(requests[1].starts_with("GET /latest/meta-data/iam/security-credentials/ HTTP/1.1\r\n"));
        assert!(requests[2].starts_with("GET /latest/meta-data/iam/security-credentials/kubelet-node HTTP/1.1\r\n"));
        assert!(requests[2].contains("\r\nX-aws-ec2-metadata-token: TOKEN-1\r\n"));
    }

    #[test]
    fn credentials_that_are_not_a_success_are_refused_without_quoting_them() {
        let document = CREDENTIALS.replace("\"Success\"", "\"AssumeRoleUnauthorizedAccess\"");
        let stand_in = StandIn::answering(vec![ok("TOKEN-1"), ok("kubelet-node"), ok(&document)]);
        let message = failed(stand_in.imds().role_credentials());
        assert!(message.contains("AssumeRoleUnauthorizedAccess"), "{message}");
        assert!(message.contains("\"kubelet-node\""), "{message}");
        assert!(!message.contains("secret-key-material"), "{message}");
        assert!(!message.contains("session-token-material"), "{message}");
    }

    #[test]
    fn an_instance_without_a_role_is_told_it_needs_an_instance_profile() {
        for listing in [answer("404 Not Found", &[], "Not Found"), ok("\n\n")] {
            let stand_in = StandIn::answering(vec![ok("TOKEN-1"), listing]);
            let message = failed(stand_in.imds().role_credentials());
            assert!(
                message.starts_with("the instance has no IAM role: aws/v1 needs an instance profile"),
                "{message}"
            );
        }
    }

    #[test]
    fn a_401_asks_for_a_new_session_token_once() {
        let stand_in = StandIn::answering(vec![
            ok("TOKEN-1"),
            answer("401 Unauthorized", &[], ""),
            ok("TOKEN-2"),
            ok(RSA2048),
        ]);
        assert_eq!(stand_in.imds().identity_rsa2048().unwrap(), RSA2048);
        let requests = stand_in.requests();
        assert!(requests[2].starts_with("PUT /latest/api/token "), "{}", requests[2]);
        assert!(
            requests[3].contains("\r\nX-aws-ec2-metadata-token: TOKEN-2\r\n"),
            "{}",
            requests[3]
        );

        let stand_in = StandIn::answering(vec![
            ok("TOKEN-1"),
            answer("401 Unauthorized", &[], ""),
            ok("TOKEN-2"),
            answer("401 Unauthorized", &[], ""),
        ]);
        assert!(failed(stand_in.imds().identity_rsa2048()).contains("401 Unauthorized"));
    }
}
