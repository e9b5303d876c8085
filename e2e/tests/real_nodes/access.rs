//! What each component's own token may do, as the API answers it: the discovery agent and the
//! kubelet plugin are confined to their node by admission policies, the operator and the labeler
//! hold what their Roles grant and no more.

use anyhow::ensure;
use e2e::real_nodes::{H100_NODE, L4_NODE, OPERATOR_NS, RealNodes};

/// Asserts each (what was asked, the API's answer, what the answer must contain).
fn answered(cases: &[(&str, String, &str)]) -> anyhow::Result<()> {
    let wrong: Vec<String> = cases
        .iter()
        .filter(|(_, answer, wanted)| !answer.contains(wanted))
        .map(|(asked, answer, wanted)| format!("{asked}: {:?}, want {wanted:?}", answer.trim()))
        .collect();
    ensure!(wrong.is_empty(), "{}", wrong.join("; "));
    Ok(())
}

/// What `kubectl auth can-i VERB RESOURCE [SCOPE...]` answers with `kubeconfig`'s identity, for
/// each (verb, resource): `VERB RESOURCE=yes|no`. `scope` gives the flags a resource is asked in
/// (a namespace, `-A`).
fn can_i(
    cluster: &RealNodes,
    kubeconfig: &std::path::Path,
    asks: &[(&str, &str)],
    scope: impl Fn(&str) -> Vec<&'static str>,
) -> anyhow::Result<Vec<String>> {
    let mut said = Vec::new();
    for (verb, resource) in asks {
        let mut ask = vec!["auth", "can-i", verb, resource];
        ask.extend(scope(resource));
        let answer = cluster.kubectl_as(kubeconfig, &ask)?;
        said.push(format!(
            "{verb} {resource}={}",
            answer.lines().next().unwrap_or_default()
        ));
    }
    Ok(said)
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn the_discovery_agents_own_token_may_change_only_gpu_labels_of_its_node()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    cluster
        .step(
            "the discovery agent's pod token may change its GPU labels on its node, and is refused another node, another label key and spec.unschedulable",
            H100_NODE,
            async {
                // The token the kubelet projected into the agent's pod, read where it lies.
                let pod = cluster
                    .operand_pod("app.kubernetes.io/name=gpu-node-discovery", H100_NODE)
                    .await?;
                let uid = pod.metadata.uid.unwrap_or_default();
                let token = cluster.node_exec(
                    H100_NODE,
                    &[
                        "sh",
                        "-c",
                        &format!(
                            "cat /var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~projected/*/token"
                        ),
                    ],
                )?;
                let kubeconfig = cluster.token_kubeconfig("discovery-agent", token.trim())?;
                let as_agent = |args: &[&str]| {
                    cluster.kubectl_as(&kubeconfig, &[args, &["--dry-run=server"]].concat())
                };
                answered(&[
                    (
                        "its own GPU label",
                        as_agent(&["label", "node", H100_NODE, "nvidia.com/gpu.family=test", "--overwrite"])?,
                        "labeled (server dry run)",
                    ),
                    (
                        "another node",
                        as_agent(&["label", "node", L4_NODE, "nvidia.com/gpu.family=test", "--overwrite"])?,
                        "may only change its own Node (real-gpu-0), not real-gpu-1",
                    ),
                    (
                        "another label key",
                        as_agent(&["label", "node", H100_NODE, "example.com/team=gpu"])?,
                        "may only change GPU discovery labels, not example.com/team",
                    ),
                    (
                        "a cordon",
                        as_agent(&["patch", "node", H100_NODE, "-p", r#"{"spec":{"unschedulable":true}}"#])?,
                        "may only change labels and annotations of a Node",
                    ),
                ])
            },
        )
        .await
}

/// A ResourceSlice of no device for `driver` on `node`.
fn empty_slice(name: &str, driver: &str, node: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {{name: {name}}}\nspec: {{driver: {driver}, nodeName: {node}, pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}, devices: []}}\n"
    )
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn a_plugin_pods_token_may_write_slices_only_of_its_driver_and_node() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    cluster
        .step(
            "the plugin pod's token cannot write a slice of another driver on its node, nor one of another node",
            H100_NODE,
            async {
                let kubeconfig = cluster.plugin_kubeconfig(H100_NODE).await?;
                let dir = cluster.env.cluster_dir.clone();
                let mut answers = Vec::new();
                for (name, driver, node) in [
                    ("intruder-driver", "other.vendor.com", H100_NODE),
                    ("intruder-node", "gpu.nvidia.com", L4_NODE),
                ] {
                    let file = dir.join(format!("{name}.yaml"));
                    std::fs::write(&file, empty_slice(name, driver, node))?;
                    let file = file.display().to_string();
                    answers.push(cluster.kubectl_as(&kubeconfig, &["create", "-f", &file])?);
                }
                let [driver, node] = <[String; 2]>::try_from(answers).expect("two asked");
                answered(&[
                    ("a slice of another driver", driver, "may only write ResourceSlices of the drivers"),
                    ("a slice of another node", node, "may only write ResourceSlices of that node"),
                ])
            },
        )
        .await
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn the_operator_and_labeler_tokens_hold_what_their_roles_grant_and_no_more()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    cluster
        .step(
            "the operator's and the labeler's tokens can do what their Roles grant and no more",
            H100_NODE,
            async {
                let mut said = Vec::new();
                for (deployment, asks) in [
                    ("gpu-operator", [("patch", "nodes"), ("get", "secrets"), ("create", "daemonsets")]),
                    (
                        "gpu-operator-node-labeler",
                        [("patch", "nodes"), ("create", "daemonsets"), ("get", "secrets")],
                    ),
                ] {
                    let sa = cluster.jsonpath(
                        "deployment",
                        deployment,
                        Some(OPERATOR_NS),
                        "{.spec.template.spec.serviceAccountName}",
                    )?;
                    let kubeconfig = cluster.sa_kubeconfig(&sa, None)?;
                    let in_namespace = |resource: &str| {
                        if resource == "nodes" { vec![] } else { vec!["-n", OPERATOR_NS] }
                    };
                    for answer in can_i(&cluster, &kubeconfig, &asks, in_namespace)? {
                        said.push(format!("{deployment} {answer}"));
                    }
                }
                let said = said.join(", ");
                ensure!(
                    said == "gpu-operator patch nodes=no, gpu-operator get secrets=no, gpu-operator create daemonsets=yes, \
                             gpu-operator-node-labeler patch nodes=yes, gpu-operator-node-labeler create daemonsets=no, \
                             gpu-operator-node-labeler get secrets=no",
                    "tokens' permissions: {said}"
                );
                Ok(())
            },
        )
        .await
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn the_dcgm_exporters_token_reads_pods_and_slices_to_name_a_metrics_pod_and_writes_nothing()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    cluster
        .step(
            "the DCGM exporter's pod token (its DRA mode maps GPUs to pods through pods and ResourceSlices) may read those cluster-wide and write nothing",
            L4_NODE,
            async {
                let pod = cluster
                    .operand_pod("app=nvidia-dcgm-exporter-dra", L4_NODE)
                    .await?;
                let sa = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.service_account_name.clone())
                    .unwrap_or_default();
                let name = pod.metadata.name.clone().unwrap_or_default();
                let kubeconfig = cluster.sa_kubeconfig(&sa, Some(&name))?;
                let asks = [
                    ("list", "pods"),
                    ("watch", "resourceslices.resource.k8s.io"),
                    ("patch", "pods"),
                    ("create", "resourceslices.resource.k8s.io"),
                    ("get", "secrets"),
                ];
                let said = can_i(&cluster, &kubeconfig, &asks, |_| vec!["-A"])?.join(", ");
                ensure!(
                    said == "list pods=yes, watch resourceslices.resource.k8s.io=yes, patch pods=no, \
                             create resourceslices.resource.k8s.io=no, get secrets=no",
                    "the exporter's token ({sa}): {said}"
                );
                Ok(())
            },
        )
        .await
}
