//! Makes and destroys the MIG partitions of dynamic MIG, one NVML step per call, so the driver
//! can commit each step to the checkpoint before it is taken ([`crate::driver`]).

use futures::future::BoxFuture;
use gpu_discovery::partitioning::MigModeChange;
use gpu_discovery::{MigPlacement, NvmlSession};
use std::sync::Arc;

/// One step of making or destroying a partition; the error says what failed.
pub trait Partitioner: Send + Sync + std::fmt::Debug {
    /// Turns MIG on (`on`) or off on GPU `gpu` (a UUID) where it is not so already.
    fn set_mig<'a>(&'a self, gpu: &'a str, on: bool) -> BoxFuture<'a, Result<(), String>>;
    /// Creates a GPU instance of `profile_id` at `placement`; answers its id.
    fn create_gpu_instance<'a>(
        &'a self,
        gpu: &'a str,
        profile_id: u32,
        placement: MigPlacement,
    ) -> BoxFuture<'a, Result<u32, String>>;
    /// Creates the compute instance spanning GPU instance `gi` (`slices` compute slices);
    /// answers its id.
    fn create_compute_instance<'a>(
        &'a self,
        gpu: &'a str,
        gi: u32,
        slices: u32,
    ) -> BoxFuture<'a, Result<u32, String>>;
    /// The UUID of the MIG device of compute instance `ci` in GPU instance `gi`.
    fn mig_uuid<'a>(
        &'a self,
        gpu: &'a str,
        gi: u32,
        ci: u32,
    ) -> BoxFuture<'a, Result<String, String>>;
    /// Destroys GPU instance `gi` (of `profile_id`) and its compute instances; what is gone
    /// already is no error.
    fn destroy<'a>(
        &'a self,
        gpu: &'a str,
        profile_id: u32,
        gi: u32,
    ) -> BoxFuture<'a, Result<(), String>>;
    /// Turns MIG off on `gpu` if no GPU instance is left on it.
    fn release<'a>(&'a self, gpu: &'a str) -> BoxFuture<'a, Result<(), String>>;
    /// The GPU instances of `profile_id` at `placement` on `gpu`.
    fn find<'a>(
        &'a self,
        gpu: &'a str,
        profile_id: u32,
        placement: MigPlacement,
    ) -> BoxFuture<'a, Result<Vec<u32>, String>>;
}

/// NVML, through an open session of the driver's library.
#[derive(Debug, Clone)]
pub struct Nvml(pub Arc<NvmlSession>);

impl Nvml {
    /// Runs `call` on the session off the async threads (NVML calls block).
    fn run<'a, T: Send + 'static>(
        &'a self,
        call: impl FnOnce(&NvmlSession) -> Result<T, String> + Send + 'static,
    ) -> BoxFuture<'a, Result<T, String>> {
        let session = Arc::clone(&self.0);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || call(&session))
                .await
                .unwrap_or_else(|e| Err(format!("the NVML call did not finish: {e}")))
        })
    }
}

impl Partitioner for Nvml {
    fn set_mig<'a>(&'a self, gpu: &'a str, on: bool) -> BoxFuture<'a, Result<(), String>> {
        let gpu = gpu.to_owned();
        self.run(move |s| {
            let mode = if on { "on" } else { "off" };
            match s.set_mig(&gpu, on).map_err(|e| e.to_string())? {
                MigModeChange::Unchanged | MigModeChange::Changed => Ok(()),
                MigModeChange::NeedsReset => Err(format!(
                    "turning MIG {mode} on {gpu} waits for a GPU reset"
                )),
                MigModeChange::InUse => Err(format!(
                    "MIG cannot be turned {mode} on {gpu}: the GPU is in use (processes or MIG devices on it)"
                )),
            }
        })
    }

    fn create_gpu_instance<'a>(
        &'a self,
        gpu: &'a str,
        profile_id: u32,
        placement: MigPlacement,
    ) -> BoxFuture<'a, Result<u32, String>> {
        let gpu = gpu.to_owned();
        self.run(move |s| {
            s.create_gpu_instance(&gpu, profile_id, placement)
                .map_err(|e| e.to_string())
        })
    }

    fn create_compute_instance<'a>(
        &'a self,
        gpu: &'a str,
        gi: u32,
        slices: u32,
    ) -> BoxFuture<'a, Result<u32, String>> {
        let gpu = gpu.to_owned();
        self.run(move |s| {
            s.create_compute_instance(&gpu, gi, slices)
                .map_err(|e| e.to_string())
        })
    }

    fn mig_uuid<'a>(
        &'a self,
        gpu: &'a str,
        gi: u32,
        ci: u32,
    ) -> BoxFuture<'a, Result<String, String>> {
        let gpu = gpu.to_owned();
        self.run(move |s| s.mig_device_uuid(&gpu, gi, ci).map_err(|e| e.to_string()))
    }

    fn destroy<'a>(
        &'a self,
        gpu: &'a str,
        profile_id: u32,
        gi: u32,
    ) -> BoxFuture<'a, Result<(), String>> {
        let gpu = gpu.to_owned();
        self.run(move |s| {
            let found = s
                .gpu_instances(&gpu, &[profile_id])
                .map_err(|e| e.to_string())?;
            let Some(instance) = found.into_iter().find(|i| i.id == gi) else {
                return Ok(());
            };
            for ci in instance.compute_instances {
                s.destroy_compute_instance(&gpu, gi, ci)
                    .map_err(|e| e.to_string())?;
            }
            s.destroy_gpu_instance(&gpu, gi).map_err(|e| e.to_string())
        })
    }

    fn release<'a>(&'a self, gpu: &'a str) -> BoxFuture<'a, Result<(), String>> {
        let gpu = gpu.to_owned();
        self.run(move |s| s.release_mig(&gpu).map(drop).map_err(|e| e.to_string()))
    }

    fn find<'a>(
        &'a self,
        gpu: &'a str,
        profile_id: u32,
        placement: MigPlacement,
    ) -> BoxFuture<'a, Result<Vec<u32>, String>> {
        let gpu = gpu.to_owned();
        self.run(move |s| {
            let found = s
                .gpu_instances(&gpu, &[profile_id])
                .map_err(|e| e.to_string())?;
            Ok(found
                .into_iter()
                .filter(|i| i.placement == placement)
                .map(|i| i.id)
                .collect())
        })
    }
}

/// No way to make partitions: every step fails with why.
#[derive(Debug, Clone)]
pub struct Unavailable(pub String);

impl Unavailable {
    fn fail<'a, T: Send + 'a>(&'a self) -> BoxFuture<'a, Result<T, String>> {
        Box::pin(async move { Err(self.0.clone()) })
    }
}

impl Partitioner for Unavailable {
    fn set_mig<'a>(&'a self, _: &'a str, _: bool) -> BoxFuture<'a, Result<(), String>> {
        self.fail()
    }

    fn create_gpu_instance<'a>(
        &'a self,
        _: &'a str,
        _: u32,
        _: MigPlacement,
    ) -> BoxFuture<'a, Result<u32, String>> {
        self.fail()
    }

    fn create_compute_instance<'a>(
        &'a self,
        _: &'a str,
        _: u32,
        _: u32,
    ) -> BoxFuture<'a, Result<u32, String>> {
        self.fail()
    }

    fn mig_uuid<'a>(&'a self, _: &'a str, _: u32, _: u32) -> BoxFuture<'a, Result<String, String>> {
        self.fail()
    }

    fn destroy<'a>(&'a self, _: &'a str, _: u32, _: u32) -> BoxFuture<'a, Result<(), String>> {
        self.fail()
    }

    fn release<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), String>> {
        self.fail()
    }

    fn find<'a>(
        &'a self,
        _: &'a str,
        _: u32,
        _: MigPlacement,
    ) -> BoxFuture<'a, Result<Vec<u32>, String>> {
        self.fail()
    }
}
