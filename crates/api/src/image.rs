//! Container image fields of a CR and the rule that turns them into one image reference.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// When the kubelet pulls an operand's image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PullPolicy {
    /// Pull on every pod start.
    Always,
    /// Pull only when the node does not have the image.
    #[default]
    IfNotPresent,
    /// Never pull; the image must already be on the node.
    Never,
}

impl PullPolicy {
    /// The Kubernetes spelling of the policy.
    pub const fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// Image fields shared by every operand section of the spec.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    /// Image registry and path, e.g. `nvcr.io/nvidia`. Set together with `image` and `version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// Image name, e.g. `dra-driver-nvidia-gpu`; alone (without repository and version) it is used
    /// verbatim as a full image reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Image tag, e.g. `v0.5.0`, or a digest `sha256:...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Image pull policy: `Always`, `IfNotPresent` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Names of Secrets in the operator namespace used to pull the image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
}

/// An image triple that names some of `repository`, `image`, `version` but not all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{field}: incomplete image reference, missing {}; set repository, image and version together, \
     or image alone as a full reference",
    missing.join(" and ")
)]
pub struct ImageError {
    /// Path of the spec section, e.g. `spec.draDriver`.
    pub field: String,
    /// The fields that must be added.
    pub missing: Vec<&'static str>,
}

impl ImageSpec {
    /// Resolves the image reference this section asks for.
    ///
    /// `Ok(None)` means the section sets no image and the operator default applies. Otherwise the
    /// triple gives `repository/image:version`, or `repository/image@sha256:...` for a digest, and an
    /// `image` alone is used verbatim. `field` is the section's path, used in the error.
    pub fn reference(&self, field: &str) -> Result<Option<String>, ImageError> {
        fn part(v: &Option<String>) -> Option<&str> {
            v.as_deref().map(str::trim).filter(|s| !s.is_empty())
        }
        match (
            part(&self.repository),
            part(&self.image),
            part(&self.version),
        ) {
            (None, None, None) => Ok(None),
            (None, Some(image), None) => Ok(Some(image.to_owned())),
            (Some(repo), Some(image), Some(version)) => {
                let repo = repo.trim_end_matches('/');
                let sep = if version.starts_with("sha256:") {
                    '@'
                } else {
                    ':'
                };
                Ok(Some(format!("{repo}/{image}{sep}{version}")))
            }
            (repo, image, version) => Err(ImageError {
                field: field.to_owned(),
                missing: [("repository", repo), ("image", image), ("version", version)]
                    .into_iter()
                    .filter_map(|(name, v)| v.is_none().then_some(name))
                    .collect(),
            }),
        }
    }

    /// The pull policy, `IfNotPresent` when unset.
    pub fn pull_policy(&self) -> PullPolicy {
        self.image_pull_policy.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(repo: &str, image: &str, version: &str) -> ImageSpec {
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        ImageSpec {
            repository: opt(repo),
            image: opt(image),
            version: opt(version),
            ..ImageSpec::default()
        }
    }

    #[test]
    fn image_rule_table() {
        let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        // (repository, image, version, Ok(reference) or Err(missing fields))
        type Case = (
            &'static str,
            &'static str,
            &'static str,
            Result<Option<String>, Vec<&'static str>>,
        );
        let cases: &[Case] = &[
            ("", "", "", Ok(None)),
            (
                "nvcr.io/nvidia",
                "dra-driver-nvidia-gpu",
                "v0.5.0",
                Ok(Some("nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0".into())),
            ),
            (
                "nvcr.io/nvidia/",
                "dra-driver-nvidia-gpu",
                "v0.5.0",
                Ok(Some("nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0".into())),
            ),
            (
                "nvcr.io/nvidia",
                "dra-driver-nvidia-gpu",
                digest,
                Ok(Some(format!(
                    "nvcr.io/nvidia/dra-driver-nvidia-gpu@{digest}"
                ))),
            ),
            (
                "",
                "registry.local/gpu/plugin:dev",
                "",
                Ok(Some("registry.local/gpu/plugin:dev".into())),
            ),
            ("nvcr.io/nvidia", "", "", Err(vec!["image", "version"])),
            ("", "", "v0.5.0", Err(vec!["repository", "image"])),
            (
                "nvcr.io/nvidia",
                "dra-driver-nvidia-gpu",
                "",
                Err(vec!["version"]),
            ),
            ("nvcr.io/nvidia", "", "v0.5.0", Err(vec!["image"])),
            (
                "",
                "dra-driver-nvidia-gpu",
                "v0.5.0",
                Err(vec!["repository"]),
            ),
            ("  ", "img:tag", "", Ok(Some("img:tag".into()))),
        ];
        for (repo, image, version, want) in cases {
            let got = spec(repo, image, version).reference("spec.draDriver");
            let want = want.clone().map_err(|missing| ImageError {
                field: "spec.draDriver".into(),
                missing,
            });
            assert_eq!(
                got, want,
                "repository={repo:?} image={image:?} version={version:?}"
            );
        }
    }

    #[test]
    fn partial_triple_message_names_the_section_and_missing_field() {
        let err = spec("nvcr.io/nvidia", "dra-driver-nvidia-gpu", "")
            .reference("spec.validator")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.validator: incomplete image reference, missing version; set repository, image and \
             version together, or image alone as a full reference"
        );
    }
}
