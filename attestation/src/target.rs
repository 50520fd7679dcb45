//! The object a CSR maps to: a Machine, or a MachinePool for one of its instances. Decisions
//! name it, claims are written on it, and Events are recorded on it.

use serde::Serialize;

/// Machine or MachinePool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TargetKind {
    /// A Machine.
    Machine,
    /// A MachinePool instance.
    MachinePool,
}

/// The object a CSR maps to, for claims and Events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TargetRef {
    /// Machine or MachinePool.
    pub kind: TargetKind,
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its UID.
    pub uid: String,
}

impl TargetRef {
    /// A Machine reference.
    pub fn machine(name: &str, namespace: &str, uid: &str) -> Self {
        Self {
            kind: TargetKind::Machine,
            name: name.into(),
            namespace: namespace.into(),
            uid: uid.into(),
        }
    }

    /// A MachinePool reference.
    pub fn pool(name: &str, namespace: &str, uid: &str) -> Self {
        Self {
            kind: TargetKind::MachinePool,
            name: name.into(),
            namespace: namespace.into(),
            uid: uid.into(),
        }
    }

    /// `Machine` or `MachinePool`, for messages.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            TargetKind::Machine => "Machine",
            TargetKind::MachinePool => "MachinePool",
        }
    }
}
