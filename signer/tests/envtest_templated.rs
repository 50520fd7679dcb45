//! A Cluster that runs kubelet-authenticator without being opted in (SPEC section 7, "Told
//! before it breaks"), on a real kube-apiserver (`KUBEBUILDER_ASSETS`; skipped loudly without):
//! its KubeadmControlPlane or a MachineDeployment's KubeadmConfigTemplate carries the plugin,
//! so the signer sets `node_attestation_cluster_templated_not_opted_in` for it and records a
//! Warning Event `TemplatedButNotOptedIn` on it, once; a Cluster with kubeadm's stock templates
//! gets neither, and opting the Cluster in clears the metric.
//!
//! testdata/crds holds only the kinds the signer watches; the three it lists here are given
//! schema-less CRDs (every field kept), enough for a list.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tests::capi;
use tests::envtest::Envtest;
use tests::live::{self, Signer, apply};

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");

/// A CRD of `kind` in `group` (v1beta2), keeping every field.
fn schemaless_crd(group: &str, kind: &str, plural: &str) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{"name": "v1beta2", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

const PLUGIN_KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nusers:\n- name: default-auth\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /usr/local/bin/kubelet-authenticator\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_cluster_templated_with_the_plugin_but_not_opted_in_is_warned_of() {
    let env = Envtest::start("envtest_templated");
    env.install_capi_crds();
    env.apply(&[
        schemaless_crd(
            "controlplane.cluster.x-k8s.io",
            "KubeadmControlPlane",
            "kubeadmcontrolplanes",
        ),
        schemaless_crd(
            "bootstrap.cluster.x-k8s.io",
            "KubeadmConfigTemplate",
            "kubeadmconfigtemplates",
        ),
        schemaless_crd("cluster.x-k8s.io", "MachineDeployment", "machinedeployments"),
    ]);
    let out = env.kubectl(&["wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let admin = live::client(&env.admin_kubeconfig).await;
    apply(
        &admin,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": capi::NAMESPACE}}),
    )
    .await;
    // prod: not opted in, its control plane and its workers' template carry the plugin.
    // stock: not opted in, kubeadm's own templates.
    let cluster = |name: &str| {
        let mut c = capi::cluster("insecure");
        c["metadata"]["name"] = json!(name);
        c["metadata"]["annotations"] = json!({});
        c["metadata"].as_object_mut().unwrap().remove("uid");
        c
    };
    let prod = apply(&admin, &cluster("prod")).await;
    apply(&admin, &cluster("stock")).await;
    let files = json!([{"path": "/etc/kubernetes/kubelet-authenticator.conf", "content": PLUGIN_KUBECONFIG}]);
    apply(
        &admin,
        &json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
            "metadata": {"name": "prod-cp", "namespace": capi::NAMESPACE,
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "prod", "uid": prod["metadata"]["uid"]}]},
            "spec": {"kubeadmConfigSpec": {"files": files}}}),
    )
    .await;
    apply(
        &admin,
        &json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfigTemplate",
            "metadata": {"name": "prod-workers", "namespace": capi::NAMESPACE},
            "spec": {"template": {"spec": {"files": files}}}}),
    )
    .await;
    for (name, cluster, template) in [
        ("prod-md-0", "prod", "prod-workers"),
        ("stock-md-0", "stock", "stock-workers"),
    ] {
        apply(
            &admin,
            &json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                "metadata": {"name": name, "namespace": capi::NAMESPACE},
                "spec": {"clusterName": cluster, "template": {"spec": {"clusterName": cluster,
                    "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfigTemplate", "name": template}}}}}}),
        )
        .await;
    }
    apply(
        &admin,
        &json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfigTemplate",
            "metadata": {"name": "stock-workers", "namespace": capi::NAMESPACE},
            "spec": {"template": {"spec": {"files": []}}}}),
    )
    .await;

    let signer = Signer::start(std::path::Path::new(SIGNER_BIN), &env, &[]).await;
    let flagged = |m: &str, cluster: &str| {
        m.contains(&format!(
            "node_attestation_cluster_templated_not_opted_in{{cluster=\"{}/{cluster}\"}} 1",
            capi::NAMESPACE
        ))
    };
    let mut warned = Vec::new();
    for _ in 0..150 {
        warned = live::events(&env, capi::NAMESPACE)
            .into_iter()
            .filter(|(_, reason, _)| reason == "TemplatedButNotOptedIn")
            .collect();
        if flagged(&signer.metrics(), "prod") && !warned.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        flagged(&signer.metrics(), "prod"),
        "{}\n{}",
        signer.metrics(),
        signer.log()
    );
    assert!(
        !flagged(&signer.metrics(), "stock"),
        "kubeadm's stock templates are not flagged"
    );
    assert_eq!(warned.len(), 1, "{warned:?}");
    let (regarding, _, note) = &warned[0];
    assert_eq!(regarding, "prod");
    assert!(
        note.contains("KubeadmControlPlane prod-cp")
            && note.contains("KubeadmConfigTemplate prod-workers")
            && note.contains("not opted in"),
        "{note}"
    );
    // Said once: later scans (every 2 s here) add no Event.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let again = live::events(&env, capi::NAMESPACE)
        .into_iter()
        .filter(|(_, reason, _)| reason == "TemplatedButNotOptedIn")
        .count();
    assert_eq!(again, 1, "one Event while nothing changed");

    // Opted in: no longer flagged (it is served, or refused for its own reasons, from now on).
    let out = env.kubectl(&[
        "-n",
        capi::NAMESPACE,
        "annotate",
        "clusters.cluster.x-k8s.io",
        "prod",
        &format!("{}=true", attestation::names::ANNOTATION_OPT_IN),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for _ in 0..100 {
        if !flagged(&signer.metrics(), "prod") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!flagged(&signer.metrics(), "prod"), "{}", signer.metrics());
}
