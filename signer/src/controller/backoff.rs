//! The controller's one retry schedule: every watch and write that fails waits the same way,
//! so an apiserver that comes back is not met by a thundering herd of fixed-interval retries.

/// Exponential backoff, 250 ms doubling to 30 s.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The delay after the `failures`-th consecutive failure.
    pub fn delay(failures: u32) -> std::time::Duration {
        let ms = 250u64.saturating_mul(1u64 << failures.min(7));
        std::time::Duration::from_millis(ms.min(30_000))
    }

    /// Sleeps for the next delay.
    pub async fn wait(&mut self) {
        tokio::time::sleep(Self::delay(self.failures)).await;
        self.failures = self.failures.saturating_add(1);
    }

    /// Back to the shortest delay.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}
