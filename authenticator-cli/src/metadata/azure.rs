//! `azure/v1`'s metadata service: [`AzureImdsHttp`], Azure's instance metadata service
//! (`Metadata: true`, each request asked again as IMDS says, [`AZURE_TRIES`] tries at most), for
//! the attested document of a nonce and the VM's resource ID, which [`capz_provider_id`] writes
//! as the provider ID CAPZ gives the VM's Machine. A room of its own, as the attestation crate's
//! `azure/`.

use std::time::{Duration, Instant};

use anyhow::Result;
use attestation::attestor::AttestError;
use attestation::azure::attestor::{AzureImds, nonce_of};

use super::env_value;
use super::http::{Response, Server, http_endpoint, percent_encode, shown};

/// The environment variable naming Azure's instance metadata service (a URL,
/// `http://host[:port][/path]`): for Azure Stack Hub, an emulator or a test's stand-in. No Azure
/// SDK reads one for IMDS as a whole (see the `metadata` module's documentation).
pub const AZURE_METADATA_ENDPOINT_ENV: &str = "AZURE_METADATA_ENDPOINT";

/// Azure's instance metadata service's link-local address (the same in every Azure cloud).
const DEFAULT_AZURE_IMDS_ENDPOINT: &str = "http://169.254.169.254/";

/// The IMDS API version asked for: the attested document carries `subscriptionId` from
/// 2020-09-01 on, which `azure/v1` needs.
const AZURE_API_VERSION: &str = "2021-02-01";

const AZURE_DOCUMENT_PATH: &str = "/metadata/attested/document";
const AZURE_RESOURCE_ID_PATH: &str = "/metadata/instance/compute/resourceId";
const AZURE_SERVICE: &str = "the Azure instance metadata service";

/// How many times one Azure IMDS request is made before giving up, when IMDS asks for it to be
/// made again.
pub const AZURE_TRIES: u32 = 5;

/// The wait before the second try, doubled before each later one: 1 + 2 + 4 + 8 = 15 seconds
/// of waiting at most, besides the requests' own bounded time.
const AZURE_FIRST_DELAY: Duration = Duration::from_secs(1);

/// [`AzureImds`] over HTTP: Azure's Instance Metadata Service, every request with
/// `Metadata: true` (IMDS refuses one without it). A request IMDS asks to be made again (429:
/// more than its 5 requests a second; 410 and 5xx: not ready, as while the VM starts) is made
/// again after 1, 2, 4 and 8 seconds, [`AZURE_TRIES`] tries in all; so is one answered with a
/// stale attested document, whose nonce is not the one asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AzureImdsHttp {
    server: Server,
    /// [`AZURE_TRIES`].
    tries: u32,
    /// [`AZURE_FIRST_DELAY`]; shorter in tests.
    pub(super) first_delay: Duration,
}

/// One answer of Azure's IMDS, read.
enum Answered<T> {
    /// What was asked for.
    Got(T),
    /// Not it, and worth asking again: why, for the message if the tries run out.
    Again(String),
}

impl AzureImdsHttp {
    /// The service named by `AZURE_METADATA_ENDPOINT` when it is set, else
    /// `http://169.254.169.254/`.
    pub fn from_env() -> Result<Self> {
        Self::new(env_value(AZURE_METADATA_ENDPOINT_ENV)?.as_deref())
    }

    /// The service at `endpoint` (`http://host[:port][/path]`), or the default one.
    pub fn new(endpoint: Option<&str>) -> Result<Self> {
        let endpoint = endpoint.unwrap_or(DEFAULT_AZURE_IMDS_ENDPOINT);
        Ok(Self {
            server: http_endpoint(AZURE_SERVICE, endpoint, AZURE_METADATA_ENDPOINT_ENV)?,
            tries: AZURE_TRIES,
            first_delay: AZURE_FIRST_DELAY,
        })
    }

    /// `GET target` until `read` takes an answer, IMDS's retry statuses and `read`'s
    /// [`Answered::Again`] asked again, [`Self::tries`] times at most. An unreachable service
    /// is not asked again: the node is not on Azure, or IMDS is away for longer than this waits.
    fn get<T>(
        &self,
        target: &str,
        what: &str,
        mut read: impl FnMut(&Response) -> Result<Answered<T>, AttestError>,
    ) -> Result<T, AttestError> {
        let started = Instant::now();
        let mut delay = self.first_delay;
        let mut last = String::new();
        for attempt in 1..=self.tries {
            if attempt > 1 {
                std::thread::sleep(delay);
                delay = delay.saturating_mul(2);
            }
            let response = self.server.send("GET", target, &[("Metadata", "true")])?;
            if matches!(response.status, 410 | 429 | 500..=599) {
                last = format!("it answered {} {}", response.status, response.reason)
                    .trim_end()
                    .to_owned();
                continue;
            }
            match read(&response)? {
                Answered::Got(value) => return Ok(value),
                Answered::Again(why) => last = why,
            }
        }
        Err(AttestError::Failed(format!(
            "{} at {} gave no usable answer to the request for {what} in {} tries over {:.1}s (the last: {last}); giving up",
            self.server.service,
            self.server.url(target),
            self.tries,
            started.elapsed().as_secs_f64()
        )))
    }

    /// The VM's provider ID as CAPZ writes it on its Machine ([`capz_provider_id`]), from the
    /// VM's ARM resource ID (`/metadata/instance/compute/resourceId`, as text).
    pub fn provider_id(&self) -> Result<String, AttestError> {
        let target = format!("{AZURE_RESOURCE_ID_PATH}?api-version={AZURE_API_VERSION}&format=text");
        let what = "the VM's resource ID";
        self.get(&target, what, |response| {
            let body = self.server.success(response, &target, what)?;
            let text =
                std::str::from_utf8(body).map_err(|_| self.server.bad_body(&target, "the resource ID is not UTF-8"))?;
            capz_provider_id(text.trim())
                .map(Answered::Got)
                .map_err(|why| self.server.bad_body(&target, &why))
        })
    }
}

impl AzureImds for AzureImdsHttp {
    fn attested_document(&mut self, nonce: &str) -> Result<String, AttestError> {
        let target = format!(
            "{AZURE_DOCUMENT_PATH}?api-version={AZURE_API_VERSION}&nonce={}",
            percent_encode(nonce)
        );
        let what = "the attested document";
        self.get(&target, what, |response| {
            let body = self.server.success(response, &target, what)?;
            let signature = attested_signature(body).map_err(|why| self.server.bad_body(&target, &why))?;
            // IMDS may answer with the document it made for an earlier request: ask again.
            match nonce_of(&signature) {
                Ok(answered) if answered == nonce => Ok(Answered::Got(signature)),
                Ok(answered) => Ok(Answered::Again(format!(
                    "it answered a document of nonce {}, a stale one",
                    shown(&answered)
                ))),
                Err(why) => Err(self
                    .server
                    .bad_body(&target, &format!("the attested document does not read: {why}"))),
            }
        })
    }
}

/// The `signature` of IMDS's `{"encoding": "pkcs7", "signature": "<base64>"}`.
fn attested_signature(body: &[u8]) -> Result<String, String> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| format!("the answer is not JSON (line {}, column {})", e.line(), e.column()))?;
    match value.get("encoding").and_then(serde_json::Value::as_str) {
        Some(encoding) if encoding.eq_ignore_ascii_case("pkcs7") => {}
        Some(encoding) => return Err(format!("the document's encoding is {}, not pkcs7", shown(encoding))),
        None => return Err("the answer has no encoding".into()),
    }
    value
        .get("signature")
        .and_then(serde_json::Value::as_str)
        .map(str::trim)
        .filter(|signature| !signature.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| "the answer has no signature".into())
}

/// The longest resource ID taken: a provider ID is at most 512 bytes, and ARM's names are short.
const MAX_RESOURCE_ID: usize = 400;

/// The provider ID CAPZ writes on the Machine of the VM whose ARM resource ID is
/// `resource_id`, byte for byte. CAPZ writes `ConvertResourceGroupNameToLower("azure://" + id)`
/// for a VM (`azure/services/virtualmachines/virtualmachines.go`), and `"azure://"` before the
/// same function's result for a scale-set VM (`azure/converters/vmss.go`, `SDKToVMSSVM`; the
/// VMs of a flexible scale set are VM resources, and `azure/types.go` writes theirs in a VM's
/// form). That function, cloud-provider-azure's, finds the resource group with the
/// case-sensitive pattern `.*/subscriptions/(?:.*)/resourceGroups/(.+)/providers/(?:.*)` and
/// lower-cases the first occurrence of that text in the whole ID (Go's `strings.Replace(id, rg,
/// lower(rg), 1)`), which is the resource-group segment unless the same text stands earlier.
/// Both are done here as Go does them, so even that case comes out as CAPZ's. The result must
/// be a VM or scale-set VM ID the signer reads ([`attestation::azure::AzureVm`]).
pub fn capz_provider_id(resource_id: &str) -> Result<String, String> {
    let bad = |why: &str| format!("resource ID {} is not a VM's: {why}", shown(resource_id));
    if resource_id.is_empty()
        || resource_id.len() > MAX_RESOURCE_ID
        || !resource_id.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(bad(&format!(
            "empty, longer than {MAX_RESOURCE_ID} bytes, or not printable ASCII"
        )));
    }
    let provider_id = format!("azure://{resource_id}");
    let group = resource_group_as_capz_finds_it(&provider_id)
        .ok_or_else(|| bad("no /subscriptions/.../resourceGroups/<name>/providers/... in it"))?;
    let provider_id = provider_id.replacen(group, &group.to_ascii_lowercase(), 1);
    attestation::azure::AzureVm::parse(&provider_id).map_err(|e| bad(&e))?;
    Ok(provider_id)
}

/// The group of `.*/subscriptions/(?:.*)/resourceGroups/(.+)/providers/(?:.*)` in `text` as Go's
/// regexp reports it (leftmost-first, each `*` and `+` as long as the rest allows): the last
/// `/subscriptions/` that leads to a match, then the last `/resourceGroups/` after it that does,
/// then the last `/providers/` after that. `text` is printable ASCII (no newline for `.` to miss).
fn resource_group_as_capz_finds_it(text: &str) -> Option<&str> {
    const SUBSCRIPTIONS: &str = "/subscriptions/";
    const RESOURCE_GROUPS: &str = "/resourceGroups/";
    const PROVIDERS: &str = "/providers/";
    // Every position, overlapping ones too (each marker's last `/` can be the next one's first).
    let bytes = text.as_bytes();
    let at = |marker: &str| -> Vec<usize> {
        (0..bytes.len())
            .filter(|i| bytes[*i..].starts_with(marker.as_bytes()))
            .collect()
    };
    let (subscriptions, groups, providers) = (at(SUBSCRIPTIONS), at(RESOURCE_GROUPS), at(PROVIDERS));
    for s in subscriptions.iter().rev() {
        for g in groups.iter().rev().filter(|g| **g >= s + SUBSCRIPTIONS.len()) {
            let start = g + RESOURCE_GROUPS.len();
            if let Some(p) = providers.iter().rev().find(|p| **p > start) {
                return text.get(start..*p);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;
    use crate::metadata::test_support::{StandIn, answer, failed, ok};

    /// Real attested documents (testdata/azure): this one's nonce is `20260728-192400`...
    const DOCUMENT: &str = include_str!("../../../testdata/azure/taskcluster-public-2026-07-28.p7b.b64");
    const NONCE: &str = "20260728-192400";
    /// ...and this one's `20260626-005645`: a stale answer to a request for [`NONCE`].
    const STALE: &str = include_str!("../../../testdata/azure/coder-public-2026-06-25.p7b.b64");

    /// IMDS's answer to `/metadata/attested/document`.
    fn attested(signature: &str) -> Vec<u8> {
        answer(
            "200 OK",
            &[("Content-Type", "application/json; charset=utf-8")],
            &format!(r#"{{"encoding":"pkcs7","signature":"{}"}}"#, signature.trim()),
        )
    }

    const SUB: &str = "8a205152-b25a-417f-a676-80465535a6c9";

    #[test]
    fn the_attested_document_is_asked_for_with_the_nonce_and_metadata_true_directly() {
        let stand_in = StandIn::answering(vec![attested(DOCUMENT)]);
        let document = stand_in.azure().attested_document(NONCE).unwrap();
        assert_eq!(document, DOCUMENT.trim(), "the signature as served");
        let requests = stand_in.requests();
        assert_eq!(requests.len(), 1);
        let request = &requests[0];
        assert!(
            request.starts_with(&format!(
                "GET /metadata/attested/document?api-version=2021-02-01&nonce={NONCE} HTTP/1.1\r\n"
            )),
            "{request}"
        );
        assert!(request.contains("\r\nMetadata: true\r\n"), "{request}");
        assert!(
            request.contains(&format!("\r\nHost: {}\r\n", stand_in.address)),
            "{request}"
        );
        // Straight to the service: nothing a proxy adds, which IMDS would refuse.
        assert!(!request.to_ascii_lowercase().contains("forwarded"), "{request}");

        let imds = AzureImdsHttp::new(None).unwrap();
        assert_eq!(imds.server.base_url(), "http://169.254.169.254");
        assert_eq!((imds.tries, imds.first_delay), (5, Duration::from_secs(1)));
        let imds = AzureImdsHttp::new(Some("http://127.0.0.1:8080/azure-stack/")).unwrap();
        assert_eq!(
            imds.server.url(AZURE_DOCUMENT_PATH),
            "http://127.0.0.1:8080/azure-stack/metadata/attested/document"
        );
        let error = AzureImdsHttp::new(Some("https://169.254.169.254")).unwrap_err();
        assert!(
            format!("{error:#}").starts_with("AZURE_METADATA_ENDPOINT \"https://169.254.169.254\": not an http:// URL"),
            "{error:#}"
        );
    }

    #[test]
    fn what_imds_says_to_retry_is_asked_again_after_a_delay() {
        let stand_in = StandIn::answering(vec![
            answer("429 Too Many Requests", &[], "Too many requests"),
            answer("410 Gone", &[], ""),
            answer("503 Service Unavailable", &[], ""),
            attested(DOCUMENT),
        ]);
        let started = Instant::now();
        assert_eq!(stand_in.azure().attested_document(NONCE).unwrap(), DOCUMENT.trim());
        assert!(
            started.elapsed() >= Duration::from_millis(10 + 20 + 40),
            "waited between tries"
        );
        let requests = stand_in.requests();
        assert_eq!(requests.len(), 4);
        assert!(requests.iter().all(|r| r == &requests[0]), "the same request each time");
    }

    #[test]
    fn a_stale_document_is_asked_for_again() {
        let stand_in = StandIn::answering(vec![attested(STALE), attested(DOCUMENT)]);
        assert_eq!(stand_in.azure().attested_document(NONCE).unwrap(), DOCUMENT.trim());
        assert_eq!(stand_in.requests().len(), 2);
    }

    #[test]
    fn imds_is_given_up_after_five_tries_saying_why() {
        let too_many = answer("429 Too Many Requests", &[], "");
        let stand_in = StandIn::answering(vec![too_many; 6]);
        let started = Instant::now();
        let message = failed(stand_in.azure().attested_document(NONCE));
        assert!(
            started.elapsed() >= Duration::from_millis(10 + 20 + 40 + 80),
            "{message}"
        );
        assert_eq!(stand_in.requests().len(), 5, "five tries, not six");
        assert!(
            message.starts_with(&format!(
                "the Azure instance metadata service at http://{}/metadata/attested/document?api-version=2021-02-01&nonce={NONCE} gave no usable answer to the request for the attested document in 5 tries over ",
                stand_in.address
            )),
            "{message}"
        );
        assert!(
            message.ends_with("(the last: it answered 429 Too Many Requests); giving up"),
            "{message}"
        );

        let stand_in = StandIn::answering(vec![attested(STALE); 5]);
        let message = failed(stand_in.azure().attested_document(NONCE));
        assert!(
            message
                .ends_with("(the last: it answered a document of nonce \"20260626-005645\", a stale one); giving up"),
            "{message}"
        );
    }

    #[test]
    fn an_answer_that_is_no_attested_document_fails_at_once() {
        for (body, expected) in [
            (ok("<html>"), "the answer is not JSON (line 1, column 1)"),
            (
                ok(r#"{"encoding":"base64","signature":"TUlJ"}"#),
                "the document's encoding is \"base64\", not pkcs7",
            ),
            (ok(r#"{"encoding":"pkcs7"}"#), "the answer has no signature"),
            (
                ok(r#"{"encoding":"pkcs7","signature":"TUlJ"}"#),
                "the attested document does not read: ",
            ),
            (
                answer(
                    "400 Bad Request",
                    &[],
                    "Bad request. Required metadata header not specified",
                ),
                "answered 400 Bad Request to the request for the attested document",
            ),
        ] {
            let stand_in = StandIn::answering(vec![body.clone(), body]);
            let message = failed(stand_in.azure().attested_document(NONCE));
            assert!(message.contains(expected), "{message}");
            assert!(
                message.contains(&format!("http://{}/metadata/attested/document?", stand_in.address)),
                "{message}"
            );
            assert!(
                !message.contains("Required metadata header"),
                "no body quoted: {message}"
            );
            assert_eq!(stand_in.requests().len(), 1, "not asked again: {message}");
        }
    }

    #[test]
    fn an_unreachable_imds_is_device_unavailable_at_once() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut imds = AzureImdsHttp::new(Some(&format!("http://127.0.0.1:{port}"))).unwrap();
        let started = Instant::now();
        match imds.attested_document(NONCE) {
            Err(AttestError::DeviceUnavailable(message)) => assert!(
                message.starts_with(&format!(
                    "the Azure instance metadata service at http://127.0.0.1:{port} is unreachable: "
                )),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < Duration::from_millis(900), "no retry, no wait");
        assert!(matches!(imds.provider_id(), Err(AttestError::DeviceUnavailable(_))));
    }

    #[test]
    fn the_provider_id_is_the_vms_resource_id_as_capz_writes_it() {
        let resource_id =
            format!("/subscriptions/{SUB}/resourceGroups/CAPZ-RG/providers/Microsoft.Compute/virtualMachines/worker-0");
        let stand_in = StandIn::answering(vec![
            answer("429 Too Many Requests", &[], ""),
            answer("200 OK", &[("Content-Type", "text/plain; charset=utf-8")], &resource_id),
        ]);
        assert_eq!(
            stand_in.azure().provider_id().unwrap(),
            format!(
                "azure:///subscriptions/{SUB}/resourceGroups/capz-rg/providers/Microsoft.Compute/virtualMachines/worker-0"
            )
        );
        let requests = stand_in.requests();
        assert_eq!(requests.len(), 2);
        assert!(
            requests[1].starts_with(
                "GET /metadata/instance/compute/resourceId?api-version=2021-02-01&format=text HTTP/1.1\r\n"
            ),
            "{}",
            requests[1]
        );
        assert!(requests[1].contains("\r\nMetadata: true\r\n"), "{}", requests[1]);

        let stand_in = StandIn::answering(vec![ok(&format!("/subscriptions/{SUB}/resourceGroups/rg"))]);
        let message = failed(stand_in.azure().provider_id());
        assert!(
            message.contains("/metadata/instance/compute/resourceId?api-version=2021-02-01&format=text: resource ID"),
            "{message}"
        );
    }

    #[test]
    fn capz_provider_ids_lower_case_the_resource_group_as_cloud_provider_azures_function_does() {
        let vm = |rg: &str, name: &str| {
            format!("/subscriptions/{SUB}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}")
        };
        for (resource_id, expected) in [
            // The resource group lower-cased, the VM's name as it is.
            (vm("My-RG", "Worker-0"), format!("azure://{}", vm("my-rg", "Worker-0"))),
            (
                vm("capz-rg", "worker-0"),
                format!("azure://{}", vm("capz-rg", "worker-0")),
            ),
            (
                format!(
                    "/subscriptions/{SUB}/resourceGroups/MC_Pool/providers/Microsoft.Compute/virtualMachineScaleSets/Pool-0/virtualMachines/12"
                ),
                format!(
                    "azure:///subscriptions/{SUB}/resourceGroups/mc_pool/providers/Microsoft.Compute/virtualMachineScaleSets/Pool-0/virtualMachines/12"
                ),
            ),
            // Go's strings.Replace(id, rg, lower(rg), 1): the first occurrence of the group's
            // text, which for a group named `G` is in `resourceGroups`. CAPZ writes this.
            (
                vm("G", "vm-0"),
                format!(
                    "azure:///subscriptions/{SUB}/resourcegroups/G/providers/Microsoft.Compute/virtualMachines/vm-0"
                ),
            ),
            // Only the first: the same text later (the VM's name) is left as it is.
            (vm("Prod", "Prod-0"), format!("azure://{}", vm("prod", "Prod-0"))),
        ] {
            assert_eq!(capz_provider_id(&resource_id).unwrap(), expected, "{resource_id}");
        }
        for bad in [
            String::new(),
            "/subscriptions/x".to_owned(),
            // The pattern is case-sensitive: CAPZ fails on this ID too.
            format!("/subscriptions/{SUB}/resourcegroups/rg/providers/Microsoft.Compute/virtualMachines/vm"),
            format!("/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/vnet"),
            vm("rg", "vm 0"),
            vm("rg", "vm\u{e9}"),
            vm("rg", &"v".repeat(400)),
        ] {
            assert!(capz_provider_id(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            resource_group_as_capz_finds_it(
                "azure:///subscriptions/s/resourceGroups/a/providers/x/resourceGroups/b/providers/y"
            ),
            Some("b"),
            "greedy, as the regexp: the last resourceGroups that leads to a match"
        );
        assert_eq!(
            resource_group_as_capz_finds_it("/subscriptions/\u{e9}/resourceGroups/\u{e9}\u{e9}/providers/x"),
            Some("\u{e9}\u{e9}"),
            "bytes, not characters: no slice inside one"
        );
    }
}
