//! Which optional APIs the cluster serves.

/// What the discovery API says about the cluster.
pub(super) struct Served {
    pub(super) dra: bool,
    pub(super) service_monitors: bool,
}

pub(super) async fn served(client: &kube::Client) -> Served {
    let has = |group: &str, version: &str, plural: &str| {
        let client = client.clone();
        let (group, version, plural) = (group.to_owned(), version.to_owned(), plural.to_owned());
        async move {
            let gv = format!("/apis/{group}/{version}");
            let request = http::Request::get(gv)
                .body(Vec::new())
                .expect("a valid request");
            match client
                .request::<k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList>(request)
                .await
            {
                Ok(list) => list.resources.iter().any(|r| r.name == plural),
                Err(_) => false,
            }
        }
    };
    Served {
        dra: has("resource.k8s.io", "v1", "deviceclasses").await,
        service_monitors: has("monitoring.coreos.com", "v1", "servicemonitors").await,
    }
}

/// Whether the apiserver keeps `DeviceClass.spec.extendedResourceName` (feature DRAExtendedResource,
/// beta and on by default in 1.36): a server-side dry-run create of a class with the field, which
/// an apiserver with the feature off drops.
pub(super) async fn extended_resources_served(client: &kube::Client) -> Result<bool, kube::Error> {
    use k8s_openapi::api::resource::v1::{DeviceClass, DeviceClassSpec};
    let probe = DeviceClass {
        metadata: kube::api::ObjectMeta {
            generate_name: Some("gpu-operator-probe-".into()),
            ..Default::default()
        },
        spec: DeviceClassSpec {
            extended_resource_name: Some("gpu-operator-rs.dev/probe".into()),
            ..Default::default()
        },
    };
    let params = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    let answer = kube::Api::<DeviceClass>::all(client.clone())
        .create(&params, &probe)
        .await?;
    Ok(answer.spec.extended_resource_name.is_some())
}
