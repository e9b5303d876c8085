//! A `kube::Client` whose requests a function answers: the base of the in-memory API servers
//! that the controllers' tests run against (no network, no apiserver).

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;

/// A client for `namespace` whose every request `answer` answers from its method, URL path and
/// body.
pub fn client<F>(namespace: &str, answer: F) -> kube::Client
where
    F: Fn(&Method, &str, &[u8]) -> Response<Body> + Send + Sync + 'static,
{
    let answer = Arc::new(answer);
    let service = tower::service_fn(move |req: Request<Body>| {
        let answer = answer.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await?;
            Ok::<_, kube::Error>(answer(&parts.method, parts.uri.path(), &bytes))
        }
    });
    kube::Client::new(service, namespace)
}

/// A JSON response.
pub fn reply(code: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string().into_bytes()));
    *response.status_mut() = code;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// A `Status` failure, as the apiserver sends one (`reason` such as `NotFound`, `Conflict`).
pub fn failure(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "reason": reason, "code": code.as_u16(), "message": message});
    reply(code, &body)
}
