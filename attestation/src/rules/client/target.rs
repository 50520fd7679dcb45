//! The Machine or MachinePool instance a CSR's provider ID names (SPEC rule 9 finds it): the
//! one type rules 7 to 12 ask about it, so that each rule reads a Machine and a pool instance
//! alike.

use super::super::shown;
use crate::claim::ClaimState;
use crate::identity::{NodeName, ProviderId};
use crate::machine::{ConfigRef, MachinePoolView, MachineView, TargetRef};

/// The object the provider ID maps to.
#[derive(Clone, Copy)]
pub(super) enum Target<'a> {
    Machine(&'a MachineView),
    Pool(&'a MachinePoolView),
}

impl<'a> Target<'a> {
    pub(super) fn describe(&self) -> String {
        match self {
            Self::Machine(m) => format!("Machine {}", m.name()),
            Self::Pool(p) => format!("MachinePool {}", p.name),
        }
    }

    pub(super) fn reference(&self) -> TargetRef {
        match self {
            Self::Machine(m) => m.target(),
            Self::Pool(p) => p.target(),
        }
    }

    /// Whether `m` is this target, compared as [`TargetRef`]s are (name, namespace, UID) but
    /// without building one: rules 10 and 11 ask it of every Machine of the Cluster on every
    /// join, and the allocations were a tenth of the signer's CPU in a 500-Machine storm.
    pub(super) fn is_machine(&self, m: &MachineView) -> bool {
        matches!(self, Self::Machine(t) if t.name() == m.name() && t.namespace == m.namespace && t.uid() == m.uid())
    }

    /// Whether `p` is this target (see [`Target::is_machine`]).
    pub(super) fn is_pool(&self, p: &MachinePoolView) -> bool {
        matches!(self, Self::Pool(t) if t.name == p.name && t.namespace == p.namespace && t.uid == p.uid)
    }

    pub(super) fn namespace(&self) -> &'a str {
        match self {
            Self::Machine(m) => &m.namespace,
            Self::Pool(p) => &p.namespace,
        }
    }

    pub(super) fn claim(&self, provider_id: &ProviderId) -> ClaimState {
        match self {
            Self::Machine(m) => m.claim(),
            Self::Pool(p) => p.claims.instance(provider_id.as_str()),
        }
    }

    pub(super) fn bootstrap_config(&self) -> Option<ConfigRef<'a>> {
        match self {
            Self::Machine(m) => m.bootstrap_config(),
            Self::Pool(p) => p.bootstrap_config.as_ref().map(ConfigRef::borrowed),
        }
    }

    pub(super) fn ek_pins(&self) -> Vec<&'a str> {
        match self {
            Self::Machine(m) => m.ek_pins().collect(),
            Self::Pool(p) => p.ek_pins.iter().map(String::as_str).collect(),
        }
    }

    pub(super) fn node_registered(&self, name: &NodeName) -> Option<String> {
        match self {
            Self::Machine(m) => m.node_ref().map(|n| format!("status.nodeRef is {}", shown(n))),
            Self::Pool(p) => p
                .node_refs
                .iter()
                .any(|n| n == name.as_str())
                .then(|| "listed in status.nodeRefs".to_owned()),
        }
    }
}
