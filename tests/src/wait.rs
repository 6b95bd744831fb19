//! Bounded waits.

use std::future::Future;
use std::time::Duration;

/// Retries `attempt` until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
