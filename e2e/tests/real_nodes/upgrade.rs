//! The product upgraded under running claims: for each earlier release in `hack/releases` (its
//! chart and images, built by `hack/release-images.sh` and tagged `<appVersion>-<commit>`), `helm
//! upgrade` down to it and back up to this tree's chart, with the install's own values, while GPU
//! pods run on two nodes. No pod restarts, every claim stays prepared (its CDI spec and checkpoint
//! entry), the earlier release's plugin prepares a claim that this one unprepares, and every
//! unprepare after the way back up succeeds. `hack/test/real-nodes.sh` runs it after the other
//! scenarios: it replaces the whole install twice per release.

use anyhow::{Context, bail, ensure};
use e2e::eventually;
use e2e::helm::{chart_dir, helm_ok};
use e2e::real_nodes::{
    GPU_NODES, GuidePod, H100_NODE, L4_NODE, LIST_GPUS, OPERATOR_NS, RealNodes, plugin_ready,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The Helm release `hack/test/real-nodes.sh` installs.
const RELEASE: &str = "gpu-operator";

/// An earlier release of the product, as `hack/release-images.sh` built it.
struct EarlierRelease {
    /// The commit it was built from (7 digits).
    commit: String,
    /// Its images' tag.
    tag: String,
    /// Its chart.
    chart: PathBuf,
}

/// The releases `hack/releases` lists, newest first; an error naming the command that builds one
/// that is missing.
fn earlier_releases(cluster: &RealNodes) -> anyhow::Result<Vec<EarlierRelease>> {
    let list = std::fs::read_to_string(e2e::manifest_dir().join("../hack/releases"))?;
    let built = cluster
        .env
        .tools_dir
        .parent()
        .context("the tools folder has no parent")?
        .join("releases");
    let mut releases = Vec::new();
    for line in list
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default())
    {
        let Some(commit) = line.split_whitespace().next() else {
            continue;
        };
        ensure!(
            commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
            "hack/releases: {commit} is not a commit hash (7 digits or more)"
        );
        let short = &commit[..7];
        let dir = built.join(short);
        let tag = std::fs::read_to_string(dir.join("tag")).with_context(|| {
            format!(
                "release {short} is not built in {}: run hack/release-images.sh",
                dir.display()
            )
        })?;
        releases.push(EarlierRelease {
            commit: short.to_owned(),
            tag: tag.trim().to_owned(),
            chart: dir.join("chart"),
        });
    }
    ensure!(!releases.is_empty(), "hack/releases lists no release");
    Ok(releases)
}

/// Puts this tree's chart back with the install's values when dropped before [`Self::done`], so
/// a failure on an earlier release leaves the cluster as the install made it.
struct ThisChart<'a> {
    cluster: &'a RealNodes,
    values: &'a Path,
    armed: bool,
}

impl ThisChart<'_> {
    /// `helm upgrade` to this tree's chart with the install's values; its output.
    fn upgrade(&self) -> anyhow::Result<String> {
        let chart = chart_dir();
        helm_upgrade(self.cluster, &chart, self.values, None)
    }

    fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for ThisChart<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = self.upgrade()
        {
            eprintln!("     putting this tree's chart back failed: {e:#}");
        }
    }
}

/// `helm upgrade` of the release to `chart` with the `values` file and, for an earlier release,
/// its images' `tag`; waits for the chart's own workloads.
fn helm_upgrade(
    cluster: &RealNodes,
    chart: &Path,
    values: &Path,
    tag: Option<&str>,
) -> anyhow::Result<String> {
    let chart = chart.display().to_string();
    let values = values.display().to_string();
    let mut args = vec![
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        OPERATOR_NS,
        "-f",
        &values,
        "--wait",
        "--timeout",
        "4m",
    ];
    let sets: Vec<String> = tag
        .map(|t| {
            vec![
                format!("operator.version={t}"),
                format!("kubeletPlugin.version={t}"),
            ]
        })
        .unwrap_or_default();
    for set in &sets {
        args.extend(["--set", set]);
    }
    helm_ok(&cluster.env, &args)
}

/// A workload pod holding a GPU, as it was when first seen running.
struct Held {
    pod: &'static str,
    node: &'static str,
    pod_uid: String,
    claim_uid: String,
}

impl Held {
    /// Starts pod `pod` on `node` holding one GPU and waits for it to run.
    async fn start(
        cluster: &RealNodes,
        pod: &'static str,
        node: &'static str,
    ) -> anyhow::Result<Self> {
        let script = format!("{LIST_GPUS}; sleep 3600");
        cluster.apply(&GuidePod::new(pod).on(node).script(&script).yaml())?;
        cluster
            .wait_running(&[pod], Duration::from_secs(120))
            .await?;
        let pod_uid = cluster
            .pod(pod)
            .await?
            .and_then(|p| p.metadata.uid)
            .with_context(|| format!("pod {pod} has no uid"))?;
        let claim_uid = cluster
            .claim_of(pod)
            .await?
            .metadata
            .uid
            .with_context(|| format!("the claim of {pod} has no uid"))?;
        Ok(Self {
            pod,
            node,
            pod_uid,
            claim_uid,
        })
    }

    /// The same pod still runs, no container restarted, and its claim is still prepared: its CDI
    /// spec is on the node and the checkpoint records it completed.
    async fn kept(&self, cluster: &RealNodes) -> anyhow::Result<()> {
        let Self {
            pod,
            node,
            pod_uid,
            claim_uid,
        } = self;
        let now = cluster
            .pod(pod)
            .await?
            .with_context(|| format!("{pod} is gone"))?;
        ensure!(
            now.metadata.uid.as_ref() == Some(pod_uid),
            "{pod} was replaced"
        );
        let status = now.status.unwrap_or_default();
        let restarts: i32 = status
            .container_statuses
            .iter()
            .flatten()
            .map(|c| c.restart_count)
            .sum();
        ensure!(
            status.phase.as_deref() == Some("Running") && restarts == 0,
            "{pod} is {:?} with {restarts} restarts",
            status.phase
        );
        let spec = cluster.claim_spec(node, claim_uid);
        ensure!(spec.exists(), "{pod}'s CDI spec {} is gone", spec.display());
        let state = cluster.checkpointed(node, claim_uid)?;
        ensure!(
            state == "PrepareCompleted",
            "{node}'s checkpoint records {pod}'s claim as {state:?}"
        );
        Ok(())
    }

    /// Its claim was unprepared: CDI spec and checkpoint entry gone.
    async fn unprepared(&self, cluster: &RealNodes) -> anyhow::Result<()> {
        let Self {
            pod,
            node,
            claim_uid,
            ..
        } = self;
        let spec = cluster.claim_spec(node, claim_uid);
        eventually(
            Duration::from_secs(90),
            &format!("{pod}'s claim unprepared"),
            || async {
                let state = cluster.checkpointed(node, claim_uid)?;
                if !spec.exists() && state.is_empty() {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!(
                        "CDI spec present {}, checkpoint {state:?}",
                        spec.exists()
                    ))
                }
            },
        )
        .await
    }
}

/// Waits until the kubelet plugin on every GPU node runs image tag `tag`, ready, and the
/// GPUCluster says ready.
async fn plugins_on(cluster: &RealNodes, tag: &str) -> anyhow::Result<()> {
    let suffix = format!(":{tag}");
    eventually(
        Duration::from_secs(240),
        &format!("every plugin on {tag}"),
        || async {
            let mut behind = Vec::new();
            for node in GPU_NODES {
                let pods = cluster
                    .operand_pods(Some("app=nvidia-dra-driver-kubelet-plugin"), Some(node))
                    .await?;
                // The pod's other container runs NVIDIA's compute-domain plugin, not ours.
                let on_tag = pods.iter().any(|p| {
                    let mut containers = p.spec.iter().flat_map(|s| s.containers.iter());
                    let ours = containers.any(|c| {
                        c.name == "gpus" && c.image.as_deref().is_some_and(|i| i.ends_with(&suffix))
                    });
                    ours && plugin_ready(p) && p.metadata.deletion_timestamp.is_none()
                });
                if pods.len() != 1 || !on_tag {
                    behind.push(format!("{node} ({} plugin pods)", pods.len()));
                }
            }
            let state = cluster.gpu_cluster("{.status.state}")?;
            if behind.is_empty() && state == "ready" {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!(
                    "not yet on {tag}: {behind:?}; GPUCluster {state:?}"
                ))
            }
        },
    )
    .await
}

#[tokio::test]
#[ignore = "needs real nodes and the earlier releases' images: make test-real-nodes runs it after the other scenarios"]
async fn helm_down_to_each_earlier_release_and_back_keeps_every_running_claim() -> anyhow::Result<()>
{
    let cluster = RealNodes::connect().await?;
    let releases = earlier_releases(&cluster)?;
    let this_tag = app_version(&chart_dir())?;
    let values = cluster.env.cluster_dir.join("install-values.yaml");
    std::fs::write(
        &values,
        helm_ok(
            &cluster.env,
            &["get", "values", RELEASE, "-n", OPERATOR_NS, "-o", "yaml"],
        )?,
    )?;
    const NAMES: &[&str] = &["before-h100", "before-l4", "during"];
    let _cleanup = cluster.cleanup(&[("pod", NAMES), ("resourceclaimtemplate", NAMES)]);
    for release in &releases {
        let EarlierRelease { commit, tag, chart } = release;
        let back = ThisChart {
            cluster: &cluster,
            values: &values,
            armed: true,
        };
        let before = cluster
            .step(
                "GPU pods run on real-gpu-0 and real-gpu-1 under this tree's chart",
                H100_NODE,
                async {
                    Ok([
                        Held::start(&cluster, "before-h100", H100_NODE).await?,
                        Held::start(&cluster, "before-l4", L4_NODE).await?,
                    ])
                },
            )
            .await?;
        cluster
            .step(
                &format!("helm upgrade down to release {commit} ({tag}): its plugins serve every GPU node, the GPUCluster is ready, both pods run on, unrestarted, their claims prepared"),
                H100_NODE,
                async {
                    helm_upgrade(&cluster, chart, &values, Some(tag))?;
                    plugins_on(&cluster, tag).await?;
                    for held in &before {
                        held.kept(&cluster).await?;
                    }
                    Ok(())
                },
            )
            .await?;
        let during = cluster
            .step(
                &format!("release {commit}'s plugin prepares a new claim on real-gpu-0"),
                H100_NODE,
                Held::start(&cluster, "during", H100_NODE),
            )
            .await?;
        cluster
            .step(
                &format!("helm upgrade back up from {commit} to this tree's chart: its plugins serve every GPU node; all three pods run on, unrestarted, their claims prepared"),
                H100_NODE,
                async {
                    back.upgrade()?;
                    plugins_on(&cluster, &this_tag).await?;
                    for held in before.iter().chain([&during]) {
                        held.kept(&cluster).await?;
                    }
                    Ok(())
                },
            )
            .await?;
        back.done();
        cluster.delete("pod", NAMES)?;
        cluster
            .step(
                &format!("this tree's plugin unprepares the claims prepared before it, {commit}'s included, once their pods are deleted"),
                H100_NODE,
                async {
                    for held in before.iter().chain([&during]) {
                        held.unprepared(&cluster).await?;
                    }
                    Ok(())
                },
            )
            .await?;
        cluster.delete("resourceclaimtemplate", NAMES)?;
        eventually(Duration::from_secs(60), "the pods to go", || async {
            for name in NAMES {
                if cluster.pod(name).await?.is_some() {
                    return Err(anyhow::anyhow!("{name} is still there"));
                }
            }
            Ok(Some(()))
        })
        .await?;
    }
    Ok(())
}

/// The `appVersion` of the chart in `chart`: its images' tag.
fn app_version(chart: &Path) -> anyhow::Result<String> {
    let file = chart.join("Chart.yaml");
    let text = std::fs::read_to_string(&file)?;
    match text.lines().find_map(|l| l.strip_prefix("appVersion:")) {
        Some(version) => Ok(version.trim().trim_matches('"').to_owned()),
        None => bail!("{} has no appVersion", file.display()),
    }
}
