//! SPEC section 7, "Kubernetes minors": the workload apiserver's version, read when the worker
//! starts and once per resync (a control-plane upgrade changes it), kept on the worker for the
//! duties that depend on it, and reported: a gauge of the minor, a gauge per limitation, and
//! one Warning Event on the Cluster while its minor lacks something that changes what its node
//! identities can do ([`attestation::kubernetes_minor`] says what each minor means).

use std::sync::Arc;

use attestation::kubernetes_minor::ApiserverVersion;
use kube::runtime::events::EventType;

use crate::controller::workload::worker::Worker;
use crate::locks::lock;

impl Worker {
    /// Runs until the worker stops: reads `/version`, reports a change.
    pub(in crate::controller::workload) async fn apiserver_version_loop(self: Arc<Self>) {
        loop {
            match self.client.apiserver_version().await {
                Ok(info) => match ApiserverVersion::parse(&info.major, &info.minor, &info.git_version) {
                    Ok(version) => self.saw_version(version),
                    Err(e) => tracing::warn!(error = %e, "cannot tell the workload cluster's Kubernetes minor"),
                },
                // The CSR watch reports an unreachable cluster; this only waits for the next look.
                Err(e) => tracing::debug!(error = %e, "cannot read the workload apiserver's /version"),
            }
            tokio::time::sleep(self.shared.settings.resync).await;
        }
    }

    /// Keeps `version`; on a change, sets the gauges and says what the minor lacks.
    fn saw_version(&self, version: ApiserverVersion) {
        let previous = lock(&self.apiserver).replace(version.clone());
        if previous.as_ref() == Some(&version) {
            return;
        }
        self.shared.metrics.workload_minor(&self.key, &version);
        let lacks = version.limitations();
        if lacks.is_empty() {
            tracing::info!(version = %version.git_version, "workload apiserver");
            return;
        }
        let text = format!(
            "The workload apiserver is {version}: {}",
            lacks.iter().map(|l| l.describe()).collect::<Vec<_>>().join("; ")
        );
        tracing::warn!(version = %version.git_version, limitations = ?lacks, "{text}");
        self.cluster_event(EventType::Warning, "WorkloadKubernetesLimited", &text);
    }

    /// The workload apiserver's version, once read.
    pub fn apiserver_version(&self) -> Option<ApiserverVersion> {
        lock(&self.apiserver).clone()
    }
}
