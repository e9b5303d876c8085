//! A GPU's compute time-slice (`timeSlicingConfig.interval`), set through the driver's own
//! `nvidia-smi`.
//!
//! NVML publishes no call for the compute time-slice; the driver's tool does it, as
//! `nvidia-smi -i <uuid> -c DEFAULT` (time-slicing needs the default compute mode) then
//! `nvidia-smi compute-policy -i <uuid> --set-timeslice <0-3>`. The tool is the driver root's
//! (`usr/bin` or `bin`), run with the driver's library folder first on the loader's path, so it
//! talks to the same driver the plugin read.

use crate::opaque::Interval;
use futures::future::BoxFuture;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long one `nvidia-smi` run may take before it is killed and the change fails.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// Sets a physical GPU's compute time-slice.
pub trait TimeSlicer: Send + Sync + std::fmt::Debug {
    /// Sets `interval` on the GPU with `gpu_uuid`; the error says what failed.
    fn set<'a>(
        &'a self,
        gpu_uuid: &'a str,
        interval: Interval,
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// The driver's `nvidia-smi`, or where it was looked for.
#[derive(Debug, Clone)]
pub struct NvidiaSmi {
    binary: Result<PathBuf, Vec<PathBuf>>,
    library_dir: Option<PathBuf>,
}

impl NvidiaSmi {
    /// The `nvidia-smi` of the driver installed under `driver_root` (as this process sees it),
    /// whose NVML is `library`.
    pub fn find(driver_root: &Path, library: &Path) -> Self {
        Self {
            binary: crate::driver_tools::find(driver_root, "nvidia-smi")
                .map(|relative| driver_root.join(relative)),
            library_dir: library.parent().map(Path::to_path_buf),
        }
    }

    async fn run(&self, args: &[&str]) -> Result<(), String> {
        let binary = self.binary.as_ref().map_err(|searched| {
            format!(
                "the driver's nvidia-smi, which sets time-slice intervals, is not at {}",
                crate::driver_tools::searched(searched)
            )
        })?;
        let mut command = crate::driver_tools::command(binary, self.library_dir.as_deref());
        command.args(args);
        let shown = format!("nvidia-smi {}", args.join(" "));
        let output = tokio::time::timeout(RUN_TIMEOUT, command.output())
            .await
            .map_err(|_| format!("{shown} did not finish within {RUN_TIMEOUT:?}"))?
            .map_err(|e| format!("{shown} could not run: {e}"))?;
        if output.status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        Err(format!(
            "{shown} failed ({}): {}",
            output.status,
            said.trim().chars().take(400).collect::<String>()
        ))
    }
}

impl TimeSlicer for NvidiaSmi {
    fn set<'a>(
        &'a self,
        gpu_uuid: &'a str,
        interval: Interval,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.run(&["-i", gpu_uuid, "-c", "DEFAULT"]).await?;
            let value = interval.nvidia_smi_value().to_string();
            self.run(&["compute-policy", "-i", gpu_uuid, "--set-timeslice", &value])
                .await
        })
    }
}

/// No way to set intervals: claims that ask for one are refused, saying so.
#[derive(Debug, Clone, Copy)]
pub struct Unavailable;

impl TimeSlicer for Unavailable {
    fn set<'a>(&'a self, _: &'a str, _: Interval) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Err("this plugin was started without the driver's nvidia-smi".into()) })
    }
}

#[cfg(test)]
pub(crate) mod fake {
    use super::*;
    use std::sync::Mutex;

    /// Records the intervals set, and fails for GPUs told to.
    #[derive(Debug, Default)]
    pub struct Recorder {
        /// `(gpu, interval)` in the order set.
        pub calls: Mutex<Vec<(String, Interval)>>,
        /// GPUs whose changes fail.
        pub failing: Mutex<Vec<String>>,
    }

    impl Recorder {
        /// The interval last set on `gpu`.
        pub fn last(&self, gpu: &str) -> Option<Interval> {
            let calls = self.calls.lock().unwrap();
            calls.iter().rev().find(|(g, _)| g == gpu).map(|(_, i)| *i)
        }
    }

    impl TimeSlicer for Recorder {
        fn set<'a>(
            &'a self,
            gpu: &'a str,
            interval: Interval,
        ) -> BoxFuture<'a, Result<(), String>> {
            Box::pin(async move {
                if self.failing.lock().unwrap().iter().any(|g| g == gpu) {
                    return Err(format!("nvidia-smi failed for {gpu}"));
                }
                self.calls.lock().unwrap().push((gpu.to_owned(), interval));
                Ok(())
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_driver_without_nvidia_smi_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let smi = NvidiaSmi::find(dir.path(), &dir.path().join("lib/libnvidia-ml.so.1"));
        let err = smi.set("GPU-a", Interval::Short).await.unwrap_err();
        assert!(err.contains("usr/bin/nvidia-smi or"), "{err}");
    }

    #[tokio::test]
    async fn a_failing_run_reports_its_command_and_output() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let tool = bin.join("nvidia-smi");
        std::fs::write(
            &tool,
            "#!/bin/sh\necho \"args: $*\"\necho \"lib: $LD_LIBRARY_PATH\" >&2\nexit 3\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let smi = NvidiaSmi::find(dir.path(), Path::new("/drv/lib/libnvidia-ml.so.1"));
        let err = smi.set("GPU-a", Interval::Long).await.unwrap_err();
        assert!(
            err.starts_with("nvidia-smi -i GPU-a -c DEFAULT failed"),
            "{err}"
        );
        assert!(err.contains("args: -i GPU-a -c DEFAULT"), "{err}");
        assert!(err.contains("lib: /drv/lib"), "{err}");
    }
}
