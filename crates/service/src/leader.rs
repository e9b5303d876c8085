//! Lease-based leader election (`coordination.k8s.io/v1`): one replica of a Deployment works, the
//! others stand by and take over when the holder stops renewing or lets go.
//!
//! As in client-go: a Lease is expired when its record (holder, renew time) has not changed for a
//! lease duration as measured on this replica's own clock, never by comparing the holder's
//! `renewTime` with local time (clocks differ between nodes); a leader that cannot renew within the
//! renew deadline, shorter than the lease, steps down before anyone else may take over; and a
//! leader that shuts down releases the Lease so a standby takes over at once.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

/// What a candidate does with the Lease it just read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds the Lease, or the holder let it expire: take it.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds a live Lease.
    Follow {
        /// The current holder.
        holder: String,
    },
}

/// Decides from the Lease's spec (if the Lease exists) what `identity` should do, given how long
/// the Lease's record has stayed unchanged as this replica observed it.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration) -> Decision {
    let Some(spec) = spec else {
        return Decision::Acquire;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return Decision::Acquire;
    }
    if holder == identity {
        return Decision::Renew;
    }
    let duration = Duration::from_secs(
        spec.lease_duration_seconds
            .unwrap_or(0)
            .max(0)
            .unsigned_abs()
            .into(),
    );
    if unchanged_for < duration {
        Decision::Follow {
            holder: holder.to_owned(),
        }
    } else {
        Decision::Acquire
    }
}

/// Settings of one election.
#[derive(Clone, Debug)]
pub struct Election {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease, shared by all replicas.
    pub lease_name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it steps down; shorter than the lease.
    pub renew_deadline: Duration,
    /// How often the holder renews and candidates retry.
    pub retry_period: Duration,
}

impl Election {
    /// An election with client-go's timings: lease 15 s, renew deadline 10 s, retry 2 s.
    pub fn new(namespace: &str, lease_name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            lease_name: lease_name.to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The part of a Lease whose change shows its holder is alive.
type Record = (Option<String>, Option<MicroTime>, Option<i32>);

fn record(lease: Option<&Lease>) -> Option<Record> {
    let spec = lease?.spec.as_ref()?;
    Some((
        spec.holder_identity.clone(),
        spec.renew_time.clone(),
        spec.lease_duration_seconds,
    ))
}

/// A candidate: what it last saw of the Lease, and when, on its own clock.
struct Candidate {
    seen: Option<Record>,
    seen_changed: Instant,
}

impl Candidate {
    fn new() -> Self {
        Self {
            seen: None,
            seen_changed: Instant::now(),
        }
    }

    /// One read-decide-write round; `Ok(true)` when this replica holds the Lease afterwards.
    async fn step(&mut self, api: &Api<Lease>, election: &Election) -> Result<bool, kube::Error> {
        let current = api.get_opt(&election.lease_name).await?;
        let now_record = record(current.as_ref());
        if now_record != self.seen {
            self.seen = now_record;
            self.seen_changed = Instant::now();
        }
        let decision = decide(
            current.as_ref().and_then(|l| l.spec.as_ref()),
            &election.identity,
            self.seen_changed.elapsed(),
        );
        let (Decision::Acquire | Decision::Renew) = decision else {
            return Ok(false);
        };
        let now = MicroTime(jiff::Timestamp::now());
        let old_spec = current
            .as_ref()
            .and_then(|l| l.spec.clone())
            .unwrap_or_default();
        let acquiring = decision == Decision::Acquire;
        let spec = LeaseSpec {
            holder_identity: Some(election.identity.clone()),
            lease_duration_seconds: Some(
                election.lease_duration.as_secs().try_into().unwrap_or(15),
            ),
            renew_time: Some(now.clone()),
            acquire_time: if acquiring {
                Some(now)
            } else {
                old_spec.acquire_time.clone()
            },
            lease_transitions: Some(
                old_spec.lease_transitions.unwrap_or(0) + i32::from(acquiring && current.is_some()),
            ),
            ..old_spec
        };
        match write(api, &election.lease_name, current, spec).await {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Creates the Lease or replaces the one read; the resourceVersion read makes a replace a
/// compare-and-swap (a racing writer gets 409).
async fn write(
    api: &Api<Lease>,
    name: &str,
    current: Option<Lease>,
    spec: LeaseSpec,
) -> Result<(), kube::Error> {
    match current {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await?;
        }
        Some(mut lease) => {
            lease.spec = Some(spec);
            api.replace(name, &PostParams::default(), &lease).await?;
        }
    }
    Ok(())
}

/// Runs the election until dropped, publishing whether this replica leads on `leading`.
///
/// The leader steps down (false) when it has not renewed for the renew deadline, which is shorter
/// than the lease, so it stops before any other replica may take the Lease over.
pub async fn run(client: kube::Client, election: Election, leading: watch::Sender<bool>) {
    let api: Api<Lease> = Api::namespaced(client, &election.namespace);
    let mut candidate = Candidate::new();
    let mut last_renewal: Option<Instant> = None;
    loop {
        // A request that hangs counts as a failed one.
        let round = tokio::time::timeout(election.renew_deadline, candidate.step(&api, &election));
        match round.await {
            Ok(Ok(true)) => {
                last_renewal = Some(Instant::now());
                if !*leading.borrow() {
                    tracing::info!(lease = %election.lease_name, identity = %election.identity, "became leader");
                }
                leading.send_replace(true);
            }
            Ok(Ok(false)) => {
                leading.send_replace(false);
            }
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {:?}", election.renew_deadline),
                };
                tracing::warn!(lease = %election.lease_name, %error, "leader election request failed");
                let stale = last_renewal.is_none_or(|t| t.elapsed() >= election.renew_deadline);
                if stale && *leading.borrow() {
                    tracing::error!(
                        "could not renew the lease within the renew deadline; stepping down"
                    );
                    leading.send_replace(false);
                }
            }
        }
        tokio::time::sleep(election.retry_period).await;
    }
}

/// Gives the Lease up if this replica holds it, so a standby takes over without waiting for it to
/// expire. Best effort: a failure is logged.
pub async fn release(client: kube::Client, election: &Election) {
    let api: Api<Lease> = Api::namespaced(client, &election.namespace);
    let released = async {
        let Some(lease) = api.get_opt(&election.lease_name).await? else {
            return Ok::<bool, kube::Error>(false);
        };
        let Some(spec) = lease.spec.clone() else {
            return Ok(false);
        };
        if spec.holder_identity.as_deref() != Some(election.identity.as_str()) {
            return Ok(false);
        }
        let spec = LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..spec
        };
        write(&api, &election.lease_name, Some(lease), spec).await?;
        Ok(true)
    };
    match released.await {
        Ok(true) => tracing::info!(lease = %election.lease_name, "released the leader lease"),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(lease = %election.lease_name, error = %e, "releasing the leader lease failed")
        }
    }
}

/// Leadership was lost while working; the binary should exit so a fresh replica takes over.
#[derive(Debug, thiserror::Error)]
#[error("lost the leader lease {0}; exiting so that a fresh replica can take over")]
pub struct LostLease(pub String);

/// Runs `work` once this replica leads (at once when `election` is `None`), until `work` ends,
/// `shutdown` resolves or the lease is lost. A leader that stops for any reason but a lost lease
/// releases it.
pub async fn lead<W>(
    client: kube::Client,
    election: Option<Election>,
    shutdown: impl std::future::Future<Output = ()>,
    work: W,
) -> Result<(), LostLease>
where
    W: std::future::Future<Output = ()>,
{
    let Some(election) = election else {
        tokio::select! {
            _ = work => {}
            _ = shutdown => {}
        }
        return Ok(());
    };
    let lease = election.lease_name.clone();
    let (leading_tx, mut leading_rx) = watch::channel(false);
    tracing::info!(lease = %lease, identity = %election.identity, "waiting to become leader");
    let elector = tokio::spawn(run(client.clone(), election.clone(), leading_tx));
    tokio::pin!(shutdown);
    let became_leader = tokio::select! {
        _ = &mut shutdown => false,
        result = leading_rx.wait_for(|leading| *leading) => result.is_ok(),
    };
    let result = if became_leader {
        tokio::select! {
            _ = work => Ok(()),
            _ = shutdown => Ok(()),
            _ = leading_rx.wait_for(|leading| !*leading) => Err(LostLease(lease)),
        }
    } else {
        Ok(())
    };
    elector.abort();
    if became_leader && result.is_ok() {
        release(client, &election).await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use crate::fake_api::{self, failure, reply};
    use http::{Method, Response, StatusCode};
    use kube::client::Body;
    use serde_json::{Value, json};

    const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/lead";

    fn lease(holder: &str, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(jiff::Timestamp::from_second(1_000_000).unwrap())),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn decision_table() {
        let follow = |h: &str| Decision::Follow { holder: h.into() };
        let secs = Duration::from_secs;
        let cases = [
            (None, secs(0), Decision::Acquire),
            (Some(LeaseSpec::default()), secs(0), Decision::Acquire),
            (Some(lease("", 15)), secs(0), Decision::Acquire),
            (Some(lease("me", 15)), secs(0), Decision::Renew),
            (Some(lease("me", 15)), secs(100), Decision::Renew),
            (Some(lease("other", 15)), secs(5), follow("other")),
            (Some(lease("other", 15)), secs(15), Decision::Acquire),
            (Some(lease("other", 15)), secs(60), Decision::Acquire),
        ];
        for (spec, unchanged, want) in cases {
            assert_eq!(
                decide(spec.as_ref(), "me", unchanged),
                want,
                "{spec:?} {unchanged:?}"
            );
        }
    }

    /// One Lease behind the API: GET, POST (create), PUT (compare-and-swap on resourceVersion),
    /// and a switch that makes every request fail as an unreachable apiserver would.
    #[derive(Clone, Default)]
    struct FakeLeases {
        lease: Arc<Mutex<Option<Value>>>,
        failing: Arc<Mutex<bool>>,
    }

    fn status(code: StatusCode, reason: &str) -> Response<Body> {
        failure(code, reason, reason)
    }

    impl FakeLeases {
        fn handle(&self, method: &Method, path: &str, body: &[u8]) -> Response<Body> {
            if *self.failing.lock().unwrap() {
                return status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable");
            }
            let mut stored = self.lease.lock().unwrap();
            let version = |v: &Value| {
                v["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            };
            match *method {
                Method::GET if path == PATH => match &*stored {
                    Some(lease) => reply(StatusCode::OK, lease),
                    None => status(StatusCode::NOT_FOUND, "NotFound"),
                },
                Method::POST if stored.is_none() => {
                    let mut lease: Value = serde_json::from_slice(body).unwrap();
                    lease["metadata"]["resourceVersion"] = json!("1");
                    *stored = Some(lease.clone());
                    reply(StatusCode::CREATED, &lease)
                }
                Method::PUT if path == PATH => {
                    let mut lease: Value = serde_json::from_slice(body).unwrap();
                    let current = stored.as_ref().map(version).unwrap_or_default();
                    if version(&lease) != current {
                        return status(StatusCode::CONFLICT, "Conflict");
                    }
                    let next = current.parse::<u64>().unwrap_or(0) + 1;
                    lease["metadata"]["resourceVersion"] = json!(next.to_string());
                    *stored = Some(lease.clone());
                    reply(StatusCode::OK, &lease)
                }
                _ => status(StatusCode::CONFLICT, "AlreadyExists"),
            }
        }

        fn client(&self) -> kube::Client {
            let api = self.clone();
            fake_api::client("ns", move |method, path, body| {
                api.handle(method, path, body)
            })
        }

        fn holder(&self) -> Option<String> {
            let lease = self.lease.lock().unwrap();
            lease.as_ref()?["spec"]["holderIdentity"]
                .as_str()
                .map(str::to_owned)
        }
    }

    fn election(identity: &str) -> Election {
        Election {
            lease_duration: Duration::from_secs(1),
            renew_deadline: Duration::from_millis(500),
            retry_period: Duration::from_millis(50),
            ..Election::new("ns", "lead", identity)
        }
    }

    #[tokio::test]
    async fn one_replica_leads_and_a_release_hands_over_at_once() {
        let fake = FakeLeases::default();
        let api: Api<Lease> = Api::namespaced(fake.client(), "ns");
        let (mut a, mut b) = (Candidate::new(), Candidate::new());
        assert!(a.step(&api, &election("a")).await.unwrap());
        assert!(!b.step(&api, &election("b")).await.unwrap());
        assert!(
            a.step(&api, &election("a")).await.unwrap(),
            "the holder renews"
        );
        assert_eq!(fake.holder().as_deref(), Some("a"));

        release(fake.client(), &election("a")).await;
        assert_eq!(fake.holder(), None);
        // No waiting for the lease to run out: the next round takes it.
        assert!(b.step(&api, &election("b")).await.unwrap());
        assert_eq!(fake.holder().as_deref(), Some("b"));
        // A release by a replica that does not hold the Lease changes nothing.
        release(fake.client(), &election("a")).await;
        assert_eq!(fake.holder().as_deref(), Some("b"));
    }

    #[tokio::test]
    async fn a_silent_holder_is_taken_over_after_a_lease_of_no_change_whatever_its_clock() {
        let fake = FakeLeases::default();
        // The holder's clock runs a day ahead: its renewTime is in our future.
        let ahead = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24);
        *fake.lease.lock().unwrap() = Some(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "lead", "namespace": "ns", "resourceVersion": "7"},
            "spec": {"holderIdentity": "silent", "leaseDurationSeconds": 1,
                     "renewTime": MicroTime(ahead)}}));
        let api: Api<Lease> = Api::namespaced(fake.client(), "ns");
        let mut b = Candidate::new();
        assert!(
            !b.step(&api, &election("b")).await.unwrap(),
            "a fresh observation is followed"
        );
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert!(
            b.step(&api, &election("b")).await.unwrap(),
            "unchanged for a lease: taken over"
        );
        assert_eq!(fake.holder().as_deref(), Some("b"));
    }

    #[tokio::test]
    async fn a_leader_that_cannot_renew_steps_down_before_its_lease_runs_out() {
        let fake = FakeLeases::default();
        let (tx, mut rx) = watch::channel(false);
        let election = Election {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(1),
            ..election("a")
        };
        let elector = tokio::spawn(run(fake.client(), election, tx));
        rx.wait_for(|leading| *leading).await.unwrap();
        *fake.failing.lock().unwrap() = true;
        let failed_at = Instant::now();
        rx.wait_for(|leading| !*leading).await.unwrap();
        let took = failed_at.elapsed();
        elector.abort();
        assert!(
            took < Duration::from_secs(3),
            "stepped down {took:?} after renewals began failing: not before the lease (3 s) ran out"
        );
    }
}
