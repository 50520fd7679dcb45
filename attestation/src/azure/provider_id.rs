//! The VM a Cluster API Provider Azure (CAPZ) provider ID names: `azure:///subscriptions/<sub>/
//! resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachines/<name>`, or a scale-set VM,
//! `.../virtualMachineScaleSets/<vmss>/virtualMachines/<instanceId>` (SPEC section 5).
//!
//! ARM resource IDs compare case-insensitively in their fixed segments and in the resource
//! group (CAPZ writes it lower-cased, ARM answers with the case it was created with). The
//! names become an ARM URL path, so each is held to the characters ARM allows in it: nothing a
//! URL would read as a separator, an escape or a dot segment.

/// Which VM.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VmKind {
    /// A standalone VM (`virtualMachines/<name>`).
    Vm {
        /// Its name.
        name: String,
    },
    /// A scale set's instance (`virtualMachineScaleSets/<vmss>/virtualMachines/<id>`).
    ScaleSetVm {
        /// The scale set's name.
        scale_set: String,
        /// The instance ID (digits).
        instance_id: String,
    },
}

/// A VM of Azure Resource Manager, as a provider ID names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AzureVm {
    /// Subscription ID (a GUID, lower-cased).
    pub subscription: String,
    /// Resource group, as written.
    pub resource_group: String,
    /// The VM.
    pub kind: VmKind,
}

/// The provider ID's scheme and the ARM resource-ID prefix CAPZ puts after it.
const SCHEME: &str = "azure://";

/// Whether `text` is a GUID (8-4-4-4-12 hex digits).
pub fn is_guid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A name ARM allows in a resource ID segment, and that is safe in a URL path: letters, digits,
/// `-`, `_`, `.`, `(`, `)`, not only dots, at most 90 characters (a resource group's limit; VM
/// names are shorter).
fn is_segment(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 90
        && text.bytes().any(|b| b != b'.')
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'(' | b')'))
}

impl AzureVm {
    /// Parses a CAPZ provider ID.
    pub fn parse(provider_id: &str) -> Result<Self, String> {
        let shown = crate::identity::truncate(provider_id, 160);
        let rest = provider_id
            .strip_prefix(SCHEME)
            .ok_or_else(|| format!("provider ID {shown:?} is not azure://..."))?;
        let segments: Vec<&str> = rest.split('/').collect();
        let bad = |why: &str| format!("provider ID {shown:?} is not a CAPZ VM ID: {why}");
        let fixed = |index: usize, word: &str| segments.get(index).is_some_and(|s| s.eq_ignore_ascii_case(word));
        // "", subscriptions, <sub>, resourceGroups, <rg>, providers, Microsoft.Compute, ...
        if !(segments.first() == Some(&"")
            && fixed(1, "subscriptions")
            && fixed(3, "resourceGroups")
            && fixed(5, "providers")
            && fixed(6, "Microsoft.Compute"))
        {
            return Err(bad(
                "expected azure:///subscriptions/<id>/resourceGroups/<rg>/providers/Microsoft.Compute/...",
            ));
        }
        let subscription = segments.get(2).copied().unwrap_or_default();
        if !is_guid(subscription) {
            return Err(bad("the subscription is not a GUID"));
        }
        let resource_group = segments.get(4).copied().unwrap_or_default();
        if !is_segment(resource_group) {
            return Err(bad("the resource group has characters ARM does not allow"));
        }
        let kind = match &segments[7.min(segments.len())..] {
            [kind, name] if kind.eq_ignore_ascii_case("virtualMachines") && is_segment(name) => VmKind::Vm {
                name: (*name).to_owned(),
            },
            [kind, scale_set, vms, id]
                if kind.eq_ignore_ascii_case("virtualMachineScaleSets")
                    && vms.eq_ignore_ascii_case("virtualMachines")
                    && is_segment(scale_set)
                    && !id.is_empty()
                    && id.len() <= 20
                    && id.bytes().all(|b| b.is_ascii_digit()) =>
            {
                VmKind::ScaleSetVm {
                    scale_set: (*scale_set).to_owned(),
                    instance_id: (*id).to_owned(),
                }
            }
            _ => {
                return Err(bad(
                    "expected .../virtualMachines/<name> or .../virtualMachineScaleSets/<name>/virtualMachines/<instance id>",
                ));
            }
        };
        Ok(Self {
            subscription: subscription.to_ascii_lowercase(),
            resource_group: resource_group.to_owned(),
            kind,
        })
    }

    /// The ARM resource ID (`/subscriptions/.../virtualMachines/<name>`), the path of its GET.
    pub fn resource_id(&self) -> String {
        let base = format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute",
            self.subscription, self.resource_group
        );
        match &self.kind {
            VmKind::Vm { name } => format!("{base}/virtualMachines/{name}"),
            VmKind::ScaleSetVm { scale_set, instance_id } => {
                format!("{base}/virtualMachineScaleSets/{scale_set}/virtualMachines/{instance_id}")
            }
        }
    }

    /// The same VM, whatever the case of its resource group: the key ARM's answers are kept by.
    pub fn cache_key(&self) -> String {
        self.resource_id().to_ascii_lowercase()
    }
}

impl std::fmt::Display for AzureVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.resource_id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUB: &str = "8a205152-b25a-417f-a676-80465535a6c9";

    #[test]
    fn capz_provider_ids_of_vms_and_scale_set_vms_parse_case_insensitively() {
        let vm = AzureVm::parse(&format!(
            "azure:///subscriptions/{SUB}/resourceGroups/my-rg/providers/Microsoft.Compute/virtualMachines/prod-md-0-abcde"
        ))
        .unwrap();
        assert_eq!(
            vm.kind,
            VmKind::Vm {
                name: "prod-md-0-abcde".into()
            }
        );
        assert_eq!(
            vm.resource_id(),
            format!(
                "/subscriptions/{SUB}/resourceGroups/my-rg/providers/Microsoft.Compute/virtualMachines/prod-md-0-abcde"
            )
        );
        let upper = AzureVm::parse(&format!(
            "azure:///subscriptions/{}/resourcegroups/MY-RG/providers/microsoft.compute/virtualmachines/prod-md-0-abcde",
            SUB.to_uppercase()
        ))
        .unwrap();
        assert_eq!(upper.subscription, SUB);
        assert_eq!(upper.cache_key(), vm.cache_key(), "one VM, whatever the case");
        let ss = AzureVm::parse(&format!(
            "azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/pool-0/virtualMachines/12"
        ))
        .unwrap();
        assert_eq!(
            ss.kind,
            VmKind::ScaleSetVm {
                scale_set: "pool-0".into(),
                instance_id: "12".into()
            }
        );
    }

    #[test]
    fn anything_else_or_anything_a_url_would_read_differently_is_refused() {
        for bad in [
            "aws:///us-east-1a/i-0abc".to_owned(),
            format!("azure://subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm"),
            "azure:///subscriptions/not-a-guid/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm"
                .to_owned(),
            format!("azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Network/virtualMachines/vm"),
            format!(
                "azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm/extra"
            ),
            format!("azure:///subscriptions/{SUB}/resourceGroups/../providers/Microsoft.Compute/virtualMachines/vm"),
            format!(
                "azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm%2F.."
            ),
            format!(
                "azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm?x=1"
            ),
            format!("azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/"),
            format!(
                "azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines/1a"
            ),
            format!(
                "azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines"
            ),
        ] {
            assert!(AzureVm::parse(&bad).is_err(), "{bad}");
        }
    }
}
