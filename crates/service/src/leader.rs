//! Lease-based leader election (`coordination.k8s.io/v1`): one replica of a Deployment works, the
//! others wait and take over when the holder stops renewing.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
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

/// Decides from the Lease's spec (if the Lease exists) what `identity` should do at `now`.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
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
    let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(0).into());
    match &spec.renew_time {
        Some(MicroTime(renewed)) if *renewed + duration > now => Decision::Follow {
            holder: holder.to_owned(),
        },
        _ => Decision::Acquire,
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
    /// How often the holder renews and candidates retry.
    pub retry_period: Duration,
}

/// Runs the election forever, publishing whether this replica leads on `leading`.
///
/// Leadership is given up (false) when renewing fails for a whole lease duration, so two replicas
/// never both believe they lead for longer than that.
pub async fn run(client: kube::Client, election: Election, leading: watch::Sender<bool>) {
    let api: Api<Lease> = Api::namespaced(client, &election.namespace);
    let mut last_renewal: Option<std::time::Instant> = None;
    loop {
        match step(&api, &election).await {
            Ok(true) => {
                last_renewal = Some(std::time::Instant::now());
                if !*leading.borrow() {
                    tracing::info!(lease = %election.lease_name, identity = %election.identity, "became leader");
                }
                leading.send_replace(true);
            }
            Ok(false) => {
                leading.send_replace(false);
            }
            Err(e) => {
                tracing::warn!(lease = %election.lease_name, error = %e, "leader election request failed");
                let stale = last_renewal.is_none_or(|t| t.elapsed() >= election.lease_duration);
                if stale && *leading.borrow() {
                    tracing::error!("could not renew the lease in time; stepping down");
                    leading.send_replace(false);
                }
            }
        }
        tokio::time::sleep(election.retry_period).await;
    }
}

/// Leadership was lost while working; the binary should exit so a fresh replica takes over.
#[derive(Debug, thiserror::Error)]
#[error("lost the leader lease {0}; exiting so that a fresh replica can take over")]
pub struct LostLease(pub String);

/// Runs `work` once this replica leads (at once when `election` is `None`), until `work` ends,
/// `shutdown` resolves or the lease is lost.
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
    let elector = tokio::spawn(run(client, election, leading_tx));
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
    result
}

/// One read-decide-write round; `Ok(true)` when this replica holds the Lease afterwards.
async fn step(api: &Api<Lease>, election: &Election) -> Result<bool, kube::Error> {
    let current = api.get_opt(&election.lease_name).await?;
    let now = Timestamp::now();
    let decision = decide(
        current.as_ref().and_then(|l| l.spec.as_ref()),
        &election.identity,
        now,
    );
    let (Decision::Acquire | Decision::Renew) = decision else {
        return Ok(false);
    };
    let old_spec = current
        .as_ref()
        .and_then(|l| l.spec.clone())
        .unwrap_or_default();
    let acquiring = decision == Decision::Acquire;
    let spec = LeaseSpec {
        holder_identity: Some(election.identity.clone()),
        lease_duration_seconds: Some(election.lease_duration.as_secs().try_into().unwrap_or(15)),
        renew_time: Some(MicroTime(now)),
        acquire_time: if acquiring {
            Some(MicroTime(now))
        } else {
            old_spec.acquire_time.clone()
        },
        lease_transitions: Some(
            old_spec.lease_transitions.unwrap_or(0) + i32::from(acquiring && current.is_some()),
        ),
        ..old_spec
    };
    let result = match current {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(election.lease_name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await
        }
        Some(mut lease) => {
            // The resourceVersion we read makes this a compare-and-swap: a racing writer gets 409.
            lease.spec = Some(spec);
            api.replace(&election.lease_name, &PostParams::default(), &lease)
                .await
        }
    };
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed_secs_ago: i64, duration: i32) -> LeaseSpec {
        let now = Timestamp::from_second(1_000_000).unwrap();
        LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(now - SignedDuration::from_secs(renewed_secs_ago))),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn decision_table() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let follow = |h: &str| Decision::Follow { holder: h.into() };
        let cases = [
            (None, Decision::Acquire),
            (Some(LeaseSpec::default()), Decision::Acquire),
            (Some(lease("", 0, 15)), Decision::Acquire),
            (Some(lease("me", 0, 15)), Decision::Renew),
            (Some(lease("me", 100, 15)), Decision::Renew),
            (Some(lease("other", 5, 15)), follow("other")),
            (Some(lease("other", 15, 15)), Decision::Acquire),
            (Some(lease("other", 60, 15)), Decision::Acquire),
            (
                Some(LeaseSpec {
                    renew_time: None,
                    ..lease("other", 0, 15)
                }),
                Decision::Acquire,
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(decide(spec.as_ref(), "me", now), want, "{spec:?}");
        }
    }
}
