//! `gpu-operator cleanup`: the chart's pre-delete hook. Deletes the `GPUCluster` and waits until its
//! finalizer has drained the operands and the object is gone, then, once the node plugins' pods are
//! gone too, deletes the PhysicalGPUs they kept (nothing would keep them current any more), so
//! `helm uninstall` leaves nothing behind and needs no image but the operator's own.

use std::time::Duration;

use api::GPUCluster;
use api::contract::{GPU_CLUSTER_NAME, objects as o};
use api::physicalgpu::PhysicalGPU;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};

/// How often the GPUCluster is looked at while waiting.
const POLL: Duration = Duration::from_secs(1);

/// Why the cleanup did not finish.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// The API refused or failed a call.
    #[error("GPUCluster {GPU_CLUSTER_NAME}: {0}")]
    Api(#[from] kube::Error),
    /// Deleting the PhysicalGPUs failed.
    #[error("deleting the PhysicalGPUs: {0}")]
    PhysicalGpus(kube::Error),
    /// The object was still there when the time was up.
    #[error(
        "GPUCluster {GPU_CLUSTER_NAME} still exists after {0:?}: its finalizer has not finished \
         (is the gpu-operator Deployment running? kubectl describe gpucluster {GPU_CLUSTER_NAME})"
    )]
    TimedOut(Duration),
}

/// Parses a duration the way the chart's `cleanupHook.timeout` is written: `300s`, `5m`, `1h30m`.
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    let bad = || format!("timeout {text:?}: expected a number with s, m or h, e.g. 300s or 1h30m");
    let mut total = 0u64;
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            _ => return Err(bad()),
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(bad)?;
        digits.clear();
    }
    if !digits.is_empty() || text.is_empty() {
        return Err(bad());
    }
    Ok(Duration::from_secs(total))
}

/// Deletes the GPUCluster (absent is fine) and waits up to `timeout` for it to be gone.
pub async fn run(client: kube::Client, timeout: Duration) -> Result<(), CleanupError> {
    let api: Api<GPUCluster> = Api::all(client.clone());
    match api.delete(GPU_CLUSTER_NAME, &DeleteParams::default()).await {
        Ok(_) => tracing::info!("GPUCluster {GPU_CLUSTER_NAME} deleted; waiting for its finalizer"),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            tracing::info!("GPUCluster {GPU_CLUSTER_NAME} does not exist; no operand to drain");
            let deadline = tokio::time::Instant::now() + timeout;
            return remove_physical_gpus(&client, deadline).await;
        }
        Err(e) => return Err(e.into()),
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if api.get_opt(GPU_CLUSTER_NAME).await?.is_none() {
            tracing::info!("GPUCluster {GPU_CLUSTER_NAME} is gone");
            return remove_physical_gpus(&client, deadline).await;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CleanupError::TimedOut(timeout));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits (until `deadline`) for the node plugins' pods in the client's namespace to go, then
/// deletes every PhysicalGPU. Pods still there at the deadline are logged, and the PhysicalGPUs
/// deleted all the same: the uninstall goes on. A cluster without the CRD has none to delete.
async fn remove_physical_gpus(
    client: &kube::Client,
    deadline: tokio::time::Instant,
) -> Result<(), CleanupError> {
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let plugins = ListParams::default().labels(&format!(
        "app in ({}, {})",
        o::KUBELET_PLUGIN_DAEMONSET,
        o::DEVICE_PLUGIN_DAEMONSET
    ));
    loop {
        let left = pods.list_metadata(&plugins).await?.items.len();
        if left == 0 {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                pods = left,
                "node plugin pods are still there; deleting the PhysicalGPUs anyway"
            );
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    match Api::<PhysicalGPU>::all(client.clone())
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
    {
        Ok(_) => tracing::info!("PhysicalGPUs deleted"),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            tracing::info!("the PhysicalGPU CRD is not installed; no PhysicalGPU to delete");
        }
        Err(e) => return Err(CleanupError::PhysicalGpus(e)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_timeout;
    use std::time::Duration;

    #[test]
    fn timeouts_read_like_the_chart_writes_them() {
        assert_eq!(parse_timeout("300s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_timeout("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_timeout("1h30m"), Ok(Duration::from_secs(5400)));
        for bad in ["", "300", "5x", "m5", "1.5h"] {
            assert!(parse_timeout(bad).is_err(), "{bad:?} accepted");
        }
    }
}
