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
