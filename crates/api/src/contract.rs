//! Every name of the compatibility contract (DESIGN §2): labels, annotations, env vars, paths,
//! sockets and object names that users, charts and other components already rely on.

/// The DRA driver name in ResourceSlices, claims' allocation results and DeviceClass selectors.
pub const DRIVER_NAME: &str = "gpu.nvidia.com";
/// The DRA driver name of ComputeDomain devices (the kubelet plugin pod's `compute-domains` container).
pub const COMPUTE_DOMAIN_DRIVER_NAME: &str = "compute-domain.nvidia.com";
/// The only `GPUCluster` name that is reconciled.
pub const GPU_CLUSTER_NAME: &str = "gpu-cluster";
/// Finalizer that holds a `GPUCluster` until claim consumers are drained.
pub const GPU_CLUSTER_FINALIZER: &str = "gpucluster.nvidia.com/dra-resourceclaim";

/// The upstream operator's `ClusterPolicy` (`clusterpolicies.nvidia.com/v1`, cluster-scoped): the
/// device-plugin plane's CR. Watched, never written; while one exists that plane is its operator's.
/// Keys of the device taints the DRA plugin puts on unhealthy GPUs in its ResourceSlices; a claim
/// tolerates them by key (`spec.devices.requests[].exactly.tolerations`).
pub mod taints {
    /// The GPU is gone (XID 79, or NVML reports it lost): effect `NoExecute`, so the pods
    /// using it are evicted. Value: `xid-79` or `nvml`, whichever said so.
    pub const GPU_LOST: &str = "gpu.nvidia.com/gpu-lost";
    /// A fatal XID other than 79: effect `NoSchedule`. Value: the XID number (`unknown` when
    /// NVML did not give it).
    pub const XID: &str = "gpu.nvidia.com/xid";
    /// A double-bit (uncorrectable) ECC error: effect `NoSchedule`. Value: `double-bit`.
    pub const ECC: &str = "gpu.nvidia.com/ecc";
    /// NVML could not read the GPU: effect `NoSchedule`. No value.
    pub const UNREADABLE: &str = "gpu.nvidia.com/unreadable";
}

pub mod cluster_policy {
    /// Its kind, as the API serves it.
    pub fn api_resource() -> kube::api::ApiResource {
        kube::api::ApiResource {
            group: "nvidia.com".into(),
            version: "v1".into(),
            api_version: "nvidia.com/v1".into(),
            kind: "ClusterPolicy".into(),
            plural: "clusterpolicies".into(),
        }
    }
}

/// Node labels and annotations.
pub mod labels {
    /// `true` on GPU nodes, `false` once their GPU labels disappear.
    pub const GPU_PRESENT: &str = "nvidia.com/gpu.present";
    /// `dra` or `device-plugin`: which stack serves the node.
    pub const ALLOCATION_MODE: &str = "nvidia.com/gpu-operator.resource-allocation.mode";
    /// Prefix of every operand deploy label.
    pub const DEPLOY_PREFIX: &str = "nvidia.com/gpu.deploy.";
    /// Kill switch: `false` removes every deploy label the labeler owns.
    pub const DEPLOY_OPERANDS: &str = "nvidia.com/gpu.deploy.operands";
    /// Selects nodes for the DRA kubelet plugin DaemonSet.
    pub const DEPLOY_DRA_DRIVER: &str = "nvidia.com/gpu.deploy.dra-driver";
    /// Selects nodes for the DRA validator DaemonSet.
    pub const DEPLOY_DRA_VALIDATOR: &str = "nvidia.com/gpu.deploy.dra-validator";
    /// Selects nodes for the standalone DCGM DaemonSet of the DRA plane.
    pub const DEPLOY_DCGM_DRA: &str = "nvidia.com/gpu.deploy.dcgm-dra";
    /// Selects nodes for the DCGM exporter DaemonSet of the DRA plane.
    pub const DEPLOY_DCGM_EXPORTER_DRA: &str = "nvidia.com/gpu.deploy.dcgm-exporter-dra";
    /// Selects nodes for the driver; shared by both planes.
    pub const DEPLOY_DRIVER: &str = "nvidia.com/gpu.deploy.driver";

    /// Deploy keys of the DRA plane (GPUCluster), each defaulting to `"true"`.
    pub const DRA_PLANE_KEYS: [&str; 5] = [
        DEPLOY_DRIVER,
        DEPLOY_DRA_DRIVER,
        DEPLOY_DRA_VALIDATOR,
        DEPLOY_DCGM_DRA,
        DEPLOY_DCGM_EXPORTER_DRA,
    ];

    /// Selects the device plugin's DaemonSet.
    pub const DEPLOY_DEVICE_PLUGIN: &str = "nvidia.com/gpu.deploy.device-plugin";
    /// Selects the device-plugin plane's validator.
    pub const DEPLOY_OPERATOR_VALIDATOR: &str = "nvidia.com/gpu.deploy.operator-validator";
    /// Deploy keys that only the device-plugin plane uses; swept from DRA nodes.
    pub const DEVICE_PLUGIN_ONLY_KEYS: [&str; 16] = [
        "nvidia.com/gpu.deploy.gpu-feature-discovery",
        "nvidia.com/gpu.deploy.container-toolkit",
        "nvidia.com/gpu.deploy.device-plugin",
        "nvidia.com/gpu.deploy.dcgm",
        "nvidia.com/gpu.deploy.dcgm-exporter",
        "nvidia.com/gpu.deploy.node-status-exporter",
        "nvidia.com/gpu.deploy.operator-validator",
        "nvidia.com/gpu.deploy.client",
        "nvidia.com/gpu.deploy.sandbox-device-plugin",
        "nvidia.com/gpu.deploy.kata-sandbox-device-plugin",
        "nvidia.com/gpu.deploy.sandbox-validator",
        "nvidia.com/gpu.deploy.vfio-manager",
        "nvidia.com/gpu.deploy.kata-manager",
        "nvidia.com/gpu.deploy.cc-manager",
        "nvidia.com/gpu.deploy.vgpu-device-manager",
        "nvidia.com/gpu.deploy.mig-manager",
    ];

    /// Deploy keys of the device-plugin plane (ClusterPolicy, `container` workloads), each `"true"`.
    pub const DEVICE_PLUGIN_PLANE_KEYS: [&str; 9] = [
        DEPLOY_DRIVER,
        "nvidia.com/gpu.deploy.gpu-feature-discovery",
        "nvidia.com/gpu.deploy.container-toolkit",
        "nvidia.com/gpu.deploy.device-plugin",
        "nvidia.com/gpu.deploy.dcgm",
        "nvidia.com/gpu.deploy.dcgm-exporter",
        "nvidia.com/gpu.deploy.node-status-exporter",
        "nvidia.com/gpu.deploy.operator-validator",
        "nvidia.com/gpu.deploy.client",
    ];
    /// Deploy key of the MIG manager, added to the device-plugin plane on MIG-capable nodes.
    pub const DEPLOY_MIG_MANAGER: &str = "nvidia.com/gpu.deploy.mig-manager";
    /// Deploy keys of the operands that hold the driver open (plugins, validators, DCGM and its
    /// exporter, GPU feature discovery, the MIG manager): paused for a driver upgrade.
    pub const DRIVER_CLIENT_KEYS: [&str; 11] = [
        DEPLOY_DRA_DRIVER,
        DEPLOY_DRA_VALIDATOR,
        DEPLOY_DCGM_DRA,
        DEPLOY_DCGM_EXPORTER_DRA,
        "nvidia.com/gpu.deploy.gpu-feature-discovery",
        "nvidia.com/gpu.deploy.device-plugin",
        "nvidia.com/gpu.deploy.dcgm",
        "nvidia.com/gpu.deploy.dcgm-exporter",
        "nvidia.com/gpu.deploy.node-status-exporter",
        "nvidia.com/gpu.deploy.operator-validator",
        DEPLOY_MIG_MANAGER,
    ];
    /// `true` on nodes whose GPUs support MIG (written by GPU feature discovery).
    pub const MIG_CAPABLE: &str = "nvidia.com/mig.capable";
    /// The GPU product name (written by GPU feature discovery or NFD rules).
    pub const GPU_PRODUCT: &str = "nvidia.com/gpu.product";
    /// How many GPUs the node has (GPU feature discovery's label).
    pub const GPU_COUNT: &str = "nvidia.com/gpu.count";
    /// Present on vGPU host nodes; they never get the MIG manager.
    pub const VGPU_HOST_DRIVER_VERSION: &str = "nvidia.com/vgpu.host-driver-version";

    /// Node Feature Discovery labels whose value `true` marks a node as having an NVIDIA GPU.
    pub const NFD_GPU_LABELS: [&str; 3] = [
        "feature.node.kubernetes.io/pci-10de.present",
        "feature.node.kubernetes.io/pci-0302_10de.present",
        "feature.node.kubernetes.io/pci-0300_10de.present",
    ];

    /// The NFD label GPU node discovery writes on nodes with an NVIDIA display or 3D controller
    /// (the name NFD gives it as the GPU Operator configures NFD).
    pub const NFD_PCI_NVIDIA: &str = NFD_GPU_LABELS[0];
    /// Framebuffer MiB of the node's first GPU (GPU feature discovery's label).
    pub const GPU_MEMORY: &str = "nvidia.com/gpu.memory";
    /// Architecture family of the node's first GPU, lower case (`hopper`, `ada-lovelace`).
    pub const GPU_FAMILY: &str = "nvidia.com/gpu.family";
    /// CUDA compute capability of the node's first GPU, major part.
    pub const GPU_COMPUTE_MAJOR: &str = "nvidia.com/gpu.compute.major";
    /// CUDA compute capability of the node's first GPU, minor part.
    pub const GPU_COMPUTE_MINOR: &str = "nvidia.com/gpu.compute.minor";
    /// Driver version parts (`580`, `95`, `05`), GPU feature discovery's older names.
    pub const CUDA_DRIVER_MAJOR: &str = "nvidia.com/cuda.driver.major";
    /// See [`CUDA_DRIVER_MAJOR`].
    pub const CUDA_DRIVER_MINOR: &str = "nvidia.com/cuda.driver.minor";
    /// See [`CUDA_DRIVER_MAJOR`].
    pub const CUDA_DRIVER_REV: &str = "nvidia.com/cuda.driver.rev";
    /// Driver version parts and the whole version, GPU feature discovery's newer names.
    pub const CUDA_DRIVER_VERSION_MAJOR: &str = "nvidia.com/cuda.driver-version.major";
    /// See [`CUDA_DRIVER_VERSION_MAJOR`].
    pub const CUDA_DRIVER_VERSION_MINOR: &str = "nvidia.com/cuda.driver-version.minor";
    /// See [`CUDA_DRIVER_VERSION_MAJOR`].
    pub const CUDA_DRIVER_VERSION_REVISION: &str = "nvidia.com/cuda.driver-version.revision";
    /// See [`CUDA_DRIVER_VERSION_MAJOR`].
    pub const CUDA_DRIVER_VERSION_FULL: &str = "nvidia.com/cuda.driver-version.full";
    /// The CUDA version the driver supports (`13.0`), major part (GPU feature discovery's older name).
    pub const CUDA_RUNTIME_MAJOR: &str = "nvidia.com/cuda.runtime.major";
    /// See [`CUDA_RUNTIME_MAJOR`].
    pub const CUDA_RUNTIME_MINOR: &str = "nvidia.com/cuda.runtime.minor";
    /// The CUDA version the driver supports, newer names.
    pub const CUDA_RUNTIME_VERSION_MAJOR: &str = "nvidia.com/cuda.runtime-version.major";
    /// See [`CUDA_RUNTIME_VERSION_MAJOR`].
    pub const CUDA_RUNTIME_VERSION_MINOR: &str = "nvidia.com/cuda.runtime-version.minor";
    /// See [`CUDA_RUNTIME_VERSION_MAJOR`].
    pub const CUDA_RUNTIME_VERSION_FULL: &str = "nvidia.com/cuda.runtime-version.full";
    /// Every label GPU node discovery may write; nothing else is ever written or removed by it, and
    /// the chart's admission policy allows its ServiceAccount exactly these.
    pub const DISCOVERY_KEYS: [&str; 20] = [
        NFD_PCI_NVIDIA,
        GPU_PRODUCT,
        GPU_COUNT,
        GPU_MEMORY,
        GPU_FAMILY,
        GPU_COMPUTE_MAJOR,
        GPU_COMPUTE_MINOR,
        MIG_CAPABLE,
        CUDA_DRIVER_MAJOR,
        CUDA_DRIVER_MINOR,
        CUDA_DRIVER_REV,
        CUDA_DRIVER_VERSION_MAJOR,
        CUDA_DRIVER_VERSION_MINOR,
        CUDA_DRIVER_VERSION_REVISION,
        CUDA_DRIVER_VERSION_FULL,
        CUDA_RUNTIME_MAJOR,
        CUDA_RUNTIME_MINOR,
        CUDA_RUNTIME_VERSION_MAJOR,
        CUDA_RUNTIME_VERSION_MINOR,
        CUDA_RUNTIME_VERSION_FULL,
    ];
    /// Annotation listing (comma-separated) the labels of [`DISCOVERY_KEYS`] GPU node discovery
    /// wrote on the node, as NFD records its own: a label another writer set is never taken over,
    /// and only recorded labels are removed when the GPU or the driver goes.
    pub const DISCOVERY_OWNED: &str = "gpu-operator-rs.dev/discovery-labels";

    /// Deploy-label value written by the driver manager while it pauses an operand.
    pub const PAUSED_FOR_DRIVER_UPGRADE: &str = "paused-for-driver-upgrade";
    /// Suffix the driver manager appends to other values while it pauses an operand.
    pub const PAUSED_SUFFIX: &str = "_paused-for-driver-upgrade";

    /// `false` on a node leaves it to neither plane: no mode is chosen for it and our deploy keys go
    /// (the product's opt-out, beside the upstream kill switch [`DEPLOY_OPERANDS`]).
    pub const ENABLED: &str = "gpu-operator-rs.dev/enabled";
    /// Role label of control-plane nodes; only a plane-policy rule that names it gives them a mode.
    pub const CONTROL_PLANE_ROLE: &str = "node-role.kubernetes.io/control-plane";
    /// Node annotation: the mode the labeler last chose for the node (by plane-policy rule or
    /// default). While the mode label equals it the policy may change the mode; a mode label set
    /// to anything else is an admin's and wins.
    pub const CHOSEN_MODE: &str = "gpu-operator-rs.dev/chosen-allocation-mode";

    /// Node label: the plane that serves the node, `dra` or `device-plugin`, set only while that
    /// plane is ready there (its validator passed).
    pub const GPU_STACK: &str = "gpu-operator-rs.dev/gpu-stack";
    /// Node label: `true` while the node's plane is ready (set and removed with [`GPU_STACK`]).
    pub const GPU_SETUP_COMPLETE: &str = "gpu-operator-rs.dev/gpu-setup-complete";
    /// Node annotation: the node's hand-over between planes, as JSON (`api::handover::Handover`).
    pub const HANDOVER: &str = "gpu-operator-rs.dev/plane-handover";

    /// Node annotation: `true` when the active CR's driver upgrade policy is on.
    pub const DRIVER_UPGRADE_ENABLED: &str = "nvidia.com/gpu-driver-upgrade-enabled";
    /// Node label: where the node's driver upgrade stands, in the driver manager's values
    /// (`upgrade-required`, `drain-required`, `pod-restart-required`, `validation-required`,
    /// `upgrade-done`, `upgrade-failed`). Set to `upgrade-required` by hand, it asks for one.
    pub const DRIVER_UPGRADE_STATE: &str = "nvidia.com/gpu-driver-upgrade-state";
    /// Node annotation: `true` asks for a driver upgrade of the node (removed once it is done).
    pub const DRIVER_UPGRADE_REQUESTED: &str = "nvidia.com/gpu-driver-upgrade-requested";
    /// Node annotation a driver container sets before it loads a new driver, then waits until it
    /// is removed: the node must be drained and the driver's clients stopped first.
    pub const DRIVER_WAIT_FOR_SAFE_LOAD: &str =
        "nvidia.com/gpu-driver-upgrade.driver-wait-for-safe-load";
    /// Node annotation: the node's driver upgrade as the labeler runs it, as JSON
    /// (`api::driver_upgrade::DriverUpgrade`).
    pub const DRIVER_UPGRADE: &str = "gpu-operator-rs.dev/driver-upgrade";
    /// Pod label of the driver container's pods (the driver DaemonSet's).
    pub const DRIVER_POD_APP: &str = "nvidia-driver-daemonset";

    /// Namespace label that allows admin-access ResourceClaims in the operator namespace.
    pub const ADMIN_ACCESS_NAMESPACE: &str = "resource.kubernetes.io/admin-access";
    /// Label on every object the operator owns, with value [`MANAGED_BY_VALUE`].
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    /// Value of [`MANAGED_BY`].
    pub const MANAGED_BY_VALUE: &str = "gpu-operator";
    /// Pod label shared by both validators; the driver manager and upgrade gates match it.
    pub const VALIDATOR_APP: &str = "nvidia-operator-validator";
}

/// Environment variables read by our binaries or set on operands.
pub mod env {
    /// Operator/labeler env: default allocation mode for new GPU nodes.
    pub const DEFAULT_GPU_ALLOCATION_MODE: &str = "DEFAULT_GPU_ALLOCATION_MODE";
    /// Operator env: the default DRA driver (kubelet plugin) image.
    pub const DRA_DRIVER_IMAGE: &str = "DRA_DRIVER_IMAGE";
    /// Operator env: the default validator image (also the init container's).
    pub const VALIDATOR_IMAGE: &str = "VALIDATOR_IMAGE";
    /// Operator env: the default DCGM image.
    pub const DCGM_IMAGE: &str = "DCGM_IMAGE";
    /// Operator env: the default DCGM exporter image.
    pub const DCGM_EXPORTER_IMAGE: &str = "DCGM_EXPORTER_IMAGE";
    /// Operator env: the namespace operands live in.
    pub const OPERATOR_NAMESPACE: &str = "OPERATOR_NAMESPACE";

    /// `driver-ready` key: `true` when the driver is installed on the host.
    pub const IS_HOST_DRIVER: &str = "IS_HOST_DRIVER";
    /// `driver-ready` key: the driver root on the host.
    pub const NVIDIA_DRIVER_ROOT: &str = "NVIDIA_DRIVER_ROOT";
    /// `driver-ready` key: where the driver root is mounted in the plugin container.
    pub const DRIVER_ROOT_CTR_PATH: &str = "DRIVER_ROOT_CTR_PATH";
    /// `driver-ready` key: the root of the driver's device nodes on the host.
    pub const NVIDIA_DEV_ROOT: &str = "NVIDIA_DEV_ROOT";
    /// `driver-ready` key: where the dev root is mounted in the plugin container.
    pub const DEV_ROOT_CTR_PATH: &str = "DEV_ROOT_CTR_PATH";
    /// The `driver-ready` keys, in the order they are written.
    pub const DRIVER_READY_KEYS: [&str; 5] = [
        IS_HOST_DRIVER,
        NVIDIA_DRIVER_ROOT,
        DRIVER_ROOT_CTR_PATH,
        NVIDIA_DEV_ROOT,
        DEV_ROOT_CTR_PATH,
    ];

    /// Validator env: the host root mount.
    pub const HOST_ROOT: &str = "HOST_ROOT";
    /// Validator env: the container driver root on the host.
    pub const DRIVER_INSTALL_DIR: &str = "DRIVER_INSTALL_DIR";
    /// Validator env: where the container driver root is mounted.
    pub const DRIVER_INSTALL_DIR_CTR_PATH: &str = "DRIVER_INSTALL_DIR_CTR_PATH";
    /// Validator env: retry until the driver appears.
    pub const WITH_WAIT: &str = "WITH_WAIT";

    /// Plugin env: the node the plugin serves.
    pub const NODE_NAME: &str = "NODE_NAME";
    /// Plugin env: where CDI specs are written.
    pub const CDI_ROOT: &str = "CDI_ROOT";
    /// Plugin env: the kubelet's plugin registration directory.
    pub const KUBELET_REGISTRAR_DIRECTORY_PATH: &str = "KUBELET_REGISTRAR_DIRECTORY_PATH";
    /// Plugin env: the kubelet's plugins directory.
    pub const KUBELET_PLUGINS_DIRECTORY_PATH: &str = "KUBELET_PLUGINS_DIRECTORY_PATH";
    /// Plugin env: gRPC health port.
    pub const HEALTHCHECK_PORT: &str = "HEALTHCHECK_PORT";
    /// Plugin env: metrics endpoint address.
    pub const HTTP_ENDPOINT: &str = "HTTP_ENDPOINT";
    /// Plugin env: feature gates, `Name=bool` pairs.
    pub const FEATURE_GATES: &str = "FEATURE_GATES";
    /// GPU plugin env: how MIG devices come to be, `static` or `dynamic`.
    pub const MIG_PARTITIONING: &str = "MIG_PARTITIONING";
    /// GPU plugin env: `disabled`, `memory`, `unlimited` or a number of shares per device.
    pub const CONSUMABLE_SHARES: &str = "CONSUMABLE_SHARES";
    /// GPU plugin env: its pod's namespace, where it runs claims' MPS control daemons.
    pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
    /// GPU plugin env: the image of claims' MPS control daemon pods (the plugin's own).
    pub const MPS_CONTROL_DAEMON_IMAGE: &str = "MPS_CONTROL_DAEMON_IMAGE";
    /// GPU plugin env: that image's pull policy.
    pub const MPS_CONTROL_DAEMON_IMAGE_PULL_POLICY: &str = "MPS_CONTROL_DAEMON_IMAGE_PULL_POLICY";
    /// The validator's `driver-ready` file a plugin reads its roots from.
    pub const DRIVER_READY_FILE: &str = "DRIVER_READY_FILE";
    /// The folder whose `proc/` a plugin reads MIG capabilities from.
    pub const PROCFS_ROOT: &str = "PROCFS_ROOT";
    /// The kubelet's device-plugins directory, as the device plugin takes it.
    pub const DEVICE_PLUGIN_PATH: &str = "DEVICE_PLUGIN_PATH";
    /// The device plugin's MIG strategy (`none`, `single`, `mixed`).
    pub const MIG_STRATEGY: &str = "MIG_STRATEGY";
    /// The device plugin's config file (upstream's format).
    pub const CONFIG_FILE: &str = "CONFIG_FILE";
    /// Where GPU node discovery reads the host's sysfs (`<root>/bus/pci/devices`).
    pub const SYSFS_ROOT: &str = "SYSFS_ROOT";
    /// Seconds between two scans of GPU node discovery.
    pub const DISCOVERY_INTERVAL_SECONDS: &str = "DISCOVERY_INTERVAL_SECONDS";
}

/// Paths on a node and inside operand containers.
pub mod paths {
    /// Directory of the validators' status files.
    pub const VALIDATIONS_DIR: &str = "/run/nvidia/validations";
    /// File name of the driver validator's env file inside [`VALIDATIONS_DIR`].
    pub const DRIVER_READY_FILE: &str = "driver-ready";
    /// Default container driver root on the host.
    pub const DEFAULT_DRIVER_INSTALL_DIR: &str = "/run/nvidia/driver";
    /// Default kubelet root directory.
    pub const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";
    /// Where the host root is mounted in operand containers.
    pub const HOST_ROOT_CTR_PATH: &str = "/host";
    /// Where the container driver root is mounted in operand containers.
    pub const DRIVER_ROOT_CTR_PATH: &str = "/driver-root";
    /// Directories searched, under a driver root, for `libnvidia-ml.so.1`, in order.
    pub const LIBRARY_SEARCH_DIRS: [&str; 7] = [
        "/",
        "/usr/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/lib64",
        "/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
    ];
    /// Directories searched, under a driver root, for `nvidia-smi`, in order.
    pub const BINARY_SEARCH_DIRS: [&str; 5] = ["/", "/usr/bin", "/usr/sbin", "/bin", "/sbin"];
    /// The NVML library's file name.
    pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";
    /// Default CDI spec directory.
    pub const CDI_ROOT: &str = "/var/run/cdi";
    /// Host directory of the MPS control daemons: one per GPU at `<this>/<GPU UUID>`, its
    /// `CUDA_MPS_PIPE_DIRECTORY`.
    pub const MPS_ROOT: &str = "/run/nvidia/mps";
    /// Where a container sharing a GPU through MPS finds its daemon's pipe directory.
    pub const MPS_PIPE_CTR_PATH: &str = "/tmp/nvidia-mps";
    /// Registration socket file name, inside the kubelet's `plugins_registry`.
    pub const REGISTRATION_SOCKET: &str = "gpu.nvidia.com-reg.sock";
    /// DRA socket path relative to the kubelet's `plugins` directory.
    pub const DRA_SOCKET: &str = "gpu.nvidia.com/dra.sock";
}

/// CDI naming.
pub mod cdi {
    /// CDI vendor of the specs the plugin writes.
    pub const VENDOR: &str = "k8s.gpu.nvidia.com";
    /// CDI class of the specs the plugin writes.
    pub const CLASS: &str = "claim";
    /// CDI kind of the device plugin's spec, the one the upstream device plugin uses in its CDI
    /// mode; its devices are named by UUID.
    pub const DEVICE_PLUGIN_KIND: &str = "k8s.device-plugin.nvidia.com/gpu";
    /// File name of the device plugin's spec in the CDI root.
    pub const DEVICE_PLUGIN_SPEC_FILE: &str = "k8s.device-plugin.nvidia.com-gpu.yaml";
}

/// The extended resource of a whole GPU, on either plane: the device plugin's resource, and the
/// one DeviceClass `gpu.nvidia.com` maps where the apiserver serves extended-resource mapping.
pub const GPU_EXTENDED_RESOURCE: &str = "nvidia.com/gpu";

/// Names of the objects the operator owns.
pub mod objects {
    /// DaemonSet of the DRA kubelet plugin.
    pub const KUBELET_PLUGIN_DAEMONSET: &str = "nvidia-dra-driver-kubelet-plugin";
    /// DaemonSet of the device plugin on `device-plugin` nodes (upstream's name).
    pub const DEVICE_PLUGIN_DAEMONSET: &str = "nvidia-device-plugin-daemonset";
    /// ConfigMap of the device plugin's config file, rendered from `spec.devicePlugin.config.sharing`.
    pub const DEVICE_PLUGIN_CONFIGMAP: &str = "nvidia-device-plugin-config";
    /// DaemonSet of the device-plugin plane's validator (upstream's name).
    pub const OPERATOR_VALIDATOR_DAEMONSET: &str = "nvidia-operator-validator";
    /// Its ServiceAccount (shipped by the chart): it reads its node and runs a validation pod.
    pub const OPERATOR_VALIDATOR_SERVICE_ACCOUNT: &str = "nvidia-operator-validator";
    /// Deployment of the ComputeDomain controller.
    pub const COMPUTE_DOMAIN_CONTROLLER: &str = "nvidia-dra-driver-controller";
    /// DaemonSet of the allocation-path validator.
    pub const VALIDATOR_DAEMONSET: &str = "nvidia-dra-validator";
    /// ResourceClaimTemplate of the validator's GPU claim.
    pub const VALIDATOR_CLAIM_TEMPLATE: &str = "nvidia-dra-validator-gpu";
    /// DaemonSet (and Service) of the DCGM exporter on DRA nodes.
    pub const DCGM_EXPORTER_DAEMONSET: &str = "nvidia-dcgm-exporter-dra";
    /// DaemonSet (and Service) of standalone DCGM on DRA nodes.
    pub const DCGM_DAEMONSET: &str = "nvidia-dcgm-dra";
    /// ValidatingAdmissionPolicy (and binding) confining plugins to their node's slices.
    pub const RESOURCESLICE_POLICY: &str = "resourceslices-policy-nvidia-dra-driver";
    /// ValidatingAdmissionPolicy (and binding) confining plugins to their node's PhysicalGPUs.
    pub const PHYSICALGPU_POLICY: &str = "physicalgpus-policy-gpu-operator";
    /// ServiceAccount of the device plugin pods (shipped by the chart): it writes its node's
    /// PhysicalGPUs.
    pub const DEVICE_PLUGIN_SERVICE_ACCOUNT: &str = "nvidia-device-plugin";
    /// ResourceClaimTemplate of the DCGM exporter's admin-access claim.
    pub const DCGM_EXPORTER_CLAIM_TEMPLATE: &str = "nvidia-dcgm-exporter-admin";
    /// ResourceClaimTemplate of standalone DCGM's admin-access claim.
    pub const DCGM_CLAIM_TEMPLATE: &str = "nvidia-dcgm-admin";
    /// ServiceAccount of the kubelet plugin pods (shipped by the chart).
    pub const KUBELET_PLUGIN_SERVICE_ACCOUNT: &str = "nvidia-dra-driver-kubeletplugin";
    /// ServiceAccount of the ComputeDomain controller (shipped by the chart).
    pub const COMPUTE_DOMAIN_CONTROLLER_SERVICE_ACCOUNT: &str = "nvidia-dra-driver-controller";
    /// ServiceAccount of the validator pods (shipped by the chart).
    pub const VALIDATOR_SERVICE_ACCOUNT: &str = "nvidia-dra-validator";
    /// ServiceAccount of the DCGM exporter pods (shipped by the chart).
    pub const DCGM_EXPORTER_SERVICE_ACCOUNT: &str = "nvidia-dcgm-exporter";
    /// ServiceAccount of standalone DCGM pods (shipped by the chart).
    pub const DCGM_SERVICE_ACCOUNT: &str = "nvidia-dcgm";
    /// DeviceClass of full GPUs.
    pub const DEVICE_CLASS_GPU: &str = "gpu.nvidia.com";
    /// DeviceClass of MIG devices.
    pub const DEVICE_CLASS_MIG: &str = "mig.nvidia.com";
    /// DeviceClass of the operator's own admin-access claims (validator, DCGM, DCGM exporter): whole
    /// GPUs and MIG devices of `gpu.nvidia.com`, so those operands run on a node whose GPUs are all
    /// in MIG mode. No GPUClass can name it (theirs are `<class>[-<variant>].gpu-operator-rs.dev`).
    pub const DEVICE_CLASS_OPERANDS: &str = "gpu-or-mig.operands.gpu-operator-rs.dev";
    /// DeviceClass of GPUs bound to vfio-pci for passthrough.
    pub const DEVICE_CLASS_VFIO: &str = "vfio.gpu.nvidia.com";
    /// DeviceClass of ComputeDomain daemons.
    pub const DEVICE_CLASS_CD_DAEMON: &str = "compute-domain-daemon.nvidia.com";
    /// DeviceClass of ComputeDomain default channels.
    pub const DEVICE_CLASS_CD_CHANNEL: &str = "compute-domain-default-channel.nvidia.com";
}

/// Well-known ports.
pub mod ports {
    /// gRPC health port of the `gpus` kubelet-plugin container.
    pub const GPU_PLUGIN_HEALTH: u16 = 51516;
    /// gRPC health port of the `compute-domains` kubelet-plugin container.
    pub const COMPUTE_DOMAIN_PLUGIN_HEALTH: u16 = 51515;
    /// Standalone DCGM host engine port.
    pub const DCGM: u16 = 5555;
}

#[cfg(test)]
mod tests {
    use super::labels::*;

    #[test]
    fn plane_key_sets_are_disjoint_deploy_labels() {
        for key in DRA_PLANE_KEYS.iter().chain(&DEVICE_PLUGIN_ONLY_KEYS) {
            assert!(key.starts_with(DEPLOY_PREFIX), "{key}");
        }
        for key in DRA_PLANE_KEYS {
            assert!(
                !DEVICE_PLUGIN_ONLY_KEYS.contains(&key),
                "{key} is in both planes"
            );
        }
    }
}
