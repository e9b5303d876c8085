//! Follows the cluster's GPUClasses for the shares the plugin publishes ([`crate::sharing`]).

use api::GPUClass;
use api::gpuclass::variants::SharedOffer;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

/// Follows the cluster's GPUClasses and sends their shared offers whenever those change. Runs
/// until `tx` has no receiver; a missing CRD or a failing watch is retried with backoff.
pub async fn follow_classes(client: Client, tx: watch::Sender<Vec<SharedOffer>>) {
    let api: Api<GPUClass> = Api::all(client);
    let (store, writer) = reflector::store();
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .boxed();
    let mut warned = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Ok(_) => {}
            Err(e) => {
                if !warned {
                    tracing::info!(error = %e, "cannot watch GPUClasses (is the GPUClass CRD installed?); no GPU is shared until it can");
                    warned = true;
                }
                continue;
            }
        }
        let classes = store.state();
        let now = crate::sharing::offers(classes.iter().map(|c| c.as_ref()));
        tx.send_if_modified(|current| {
            if *current == now {
                return false;
            }
            let names: Vec<&str> = now.iter().map(|o| o.class.as_str()).collect();
            tracing::info!(classes = ?names, "GPU classes offering shares changed");
            *current = now;
            true
        });
        if tx.is_closed() {
            return;
        }
    }
}
