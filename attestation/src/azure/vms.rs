//! What Azure Resource Manager says of a VM: its `properties.vmId`, the only link between the
//! VM a provider ID names and the `vmId` an attested document carries (SPEC section 5).
//!
//! The verifier stays pure: ARM's answers reach it through [`VirtualMachines`], which the signer
//! implements over a cache it fills by asking ARM ([`crate::cloud::CloudCall::AzureVm`]), and
//! `check` over a file holding ARM's answer.

use super::provider_id::AzureVm;

/// ARM's answer about one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmAnswer {
    /// The VM exists, with this `vmId`.
    Found {
        /// `properties.vmId`.
        vm_id: String,
    },
    /// ARM says there is no such VM (404): the document is of another VM.
    Missing,
    /// ARM could not be asked or did not answer (a transient gap, retried): why.
    Unavailable(String),
    /// Not asked yet: the controller asks, and decides again.
    NotAsked,
}

/// ARM's answers, as the signer holds them.
pub trait VirtualMachines: Send + Sync {
    /// What ARM said of `vm`.
    fn answer(&self, vm: &AzureVm) -> VmAnswer;

    /// When ARM said it, if the holder knows: a refusal on an answer older than the CSR (a VM
    /// deleted and created again under the same name since, say) asks ARM again first.
    fn asked_at(&self, _vm: &AzureVm) -> Option<time::OffsetDateTime> {
        None
    }
}

/// Reads `properties.vmId` from ARM's JSON for a VM or scale-set VM (`GET` of its resource ID).
pub fn vm_id_of(arm_json: &[u8]) -> Result<String, String> {
    let value: serde_json::Value =
        serde_json::from_slice(arm_json).map_err(|e| format!("ARM's answer is not JSON: {e}"))?;
    let vm_id = value
        .pointer("/properties/vmId")
        .and_then(serde_json::Value::as_str)
        .ok_or("ARM's answer has no properties.vmId")?;
    if !super::provider_id::is_guid(vm_id) {
        return Err(format!(
            "ARM's properties.vmId {:?} is not a GUID",
            crate::identity::truncate(vm_id, 48)
        ));
    }
    Ok(vm_id.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vm_id_is_read_from_arms_answer_and_only_a_guid_counts() {
        let answer = br#"{"name":"vm","id":"/subscriptions/x","properties":{"vmId":"B1310A36-D400-46F6-82CB-6217DF846586","provisioningState":"Succeeded"}}"#;
        assert_eq!(vm_id_of(answer).unwrap(), "b1310a36-d400-46f6-82cb-6217df846586");
        assert!(vm_id_of(br#"{"properties":{}}"#).is_err());
        assert!(vm_id_of(br#"{"properties":{"vmId":"../x"}}"#).is_err());
        assert!(vm_id_of(b"<html>").is_err());
    }
}
