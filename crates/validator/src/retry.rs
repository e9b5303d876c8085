//! The retry loop both checks share: try, and with wait on, try again every interval until the
//! check passes, the timeout ends, or SIGTERM arrives.

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::time::Instant;

/// How to retry.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Retry at all.
    pub with_wait: bool,
    /// Time between attempts.
    pub interval: Duration,
    /// Stop retrying after this long.
    pub timeout: Option<Duration>,
}

/// Why no attempt passed.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop<E> {
    /// The only attempt failed (wait off).
    Failed(E),
    /// Retried until the timeout; the last failure.
    TimedOut {
        /// The timeout.
        after: Duration,
        /// The last attempt's error.
        last: E,
    },
    /// SIGTERM (or SIGINT) arrived while waiting.
    Terminated,
}

/// How a command ends when its check does not pass, or the status file cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum CommandError<E: std::error::Error + 'static> {
    /// The check failed and was not retried.
    #[error("{0}")]
    Failed(E),
    /// The check kept failing until the timeout.
    #[error("gave up after {}s: {last}", after.as_secs())]
    TimedOut {
        /// The timeout.
        after: Duration,
        /// The last failure.
        last: E,
    },
    /// SIGTERM (or SIGINT) arrived before the check passed.
    #[error("terminated before the check passed")]
    Terminated,
    /// The status file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl<E: std::error::Error + 'static> From<Stop<E>> for CommandError<E> {
    fn from(stop: Stop<E>) -> Self {
        match stop {
            Stop::Failed(e) => Self::Failed(e),
            Stop::TimedOut { after, last } => Self::TimedOut { after, last },
            Stop::Terminated => Self::Terminated,
        }
    }
}

/// Runs `attempt` under `policy`; each failed attempt that will be retried logs one line.
pub async fn retry<T, E: Display, F: Future<Output = ()>>(
    policy: Policy,
    shutdown: Pin<&mut F>,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> Result<T, Stop<E>> {
    retry_async(policy, shutdown, || std::future::ready(attempt())).await
}

/// [`retry`] for attempts that wait on I/O; a shutdown ends a waiting attempt too.
pub async fn retry_async<
    T,
    E: Display,
    F: Future<Output = ()>,
    A: Future<Output = Result<T, E>>,
>(
    policy: Policy,
    mut shutdown: Pin<&mut F>,
    mut attempt: impl FnMut() -> A,
) -> Result<T, Stop<E>> {
    let deadline = policy.timeout.map(|t| Instant::now() + t);
    let mut tries = 0u64;
    loop {
        tries += 1;
        let outcome = tokio::select! {
            biased;
            outcome = attempt() => outcome,
            () = &mut shutdown => return Err(Stop::Terminated),
        };
        let error = match outcome {
            Ok(value) => return Ok(value),
            Err(e) if !policy.with_wait => return Err(Stop::Failed(e)),
            Err(e) => e,
        };
        let now = Instant::now();
        let pause = match deadline {
            Some(end) if now >= end => {
                return Err(Stop::TimedOut {
                    after: policy.timeout.unwrap_or_default(),
                    last: error,
                });
            }
            Some(end) => policy.interval.min(end - now),
            None => policy.interval,
        };
        tracing::warn!(
            "attempt {tries} failed, retrying in {:.1}s: {error}",
            pause.as_secs_f64()
        );
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = &mut shutdown => return Err(Stop::Terminated),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn policy(with_wait: bool, timeout: Option<u64>) -> Policy {
        Policy {
            with_wait,
            interval: Duration::from_secs(5),
            timeout: timeout.map(Duration::from_secs),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn wait_off_fails_after_one_attempt() {
        let calls = Cell::new(0);
        let never = std::pin::pin!(std::future::pending::<()>());
        let got: Result<(), _> = retry(policy(false, None), never, || {
            calls.set(calls.get() + 1);
            Err("missing")
        })
        .await;
        assert_eq!((got, calls.get()), (Err(Stop::Failed("missing")), 1));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_on_retries_until_it_passes() {
        let calls = Cell::new(0);
        let never = std::pin::pin!(std::future::pending::<()>());
        let got = retry(policy(true, None), never, || {
            calls.set(calls.get() + 1);
            if calls.get() < 4 {
                Err("missing")
            } else {
                Ok(calls.get())
            }
        })
        .await;
        assert_eq!(got, Ok(4));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_on_ends_at_the_timeout_with_the_last_error() {
        let calls = Cell::new(0);
        let never = std::pin::pin!(std::future::pending::<()>());
        let got: Result<(), _> = retry(policy(true, Some(12)), never, || {
            calls.set(calls.get() + 1);
            Err(calls.get())
        })
        .await;
        // Attempts at 0 s, 5 s, 10 s and 12 s (the deadline).
        assert_eq!(
            got,
            Err(Stop::TimedOut {
                after: Duration::from_secs(12),
                last: 4
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_the_wait() {
        let now = std::pin::pin!(std::future::ready(()));
        let got: Result<(), _> = retry(policy(true, None), now, || Err("missing")).await;
        assert_eq!(got, Err(Stop::Terminated));
    }
}
