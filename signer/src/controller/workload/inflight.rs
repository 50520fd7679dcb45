//! How many CSRs the whole fleet works on at once, sized by what the apiservers answer, and
//! handed to clusters in turn.
//!
//! A join is a handful of round trips (the claim, `/approval`, the re-check, `/status`), so
//! where the apiservers have cores to spare the signer is bound by how many it keeps in flight,
//! not by its CPU (where they do not, their CPU bounds everyone, and the window only keeps
//! requests from queueing in them: `signer-load` prints CPU per issued CSR). A fixed count per
//! cluster is too few for one cluster's scale-up and too many for a thousand clusters' at once;
//! so the count is one number for the fleet, adapted the way TCP and Netflix's
//! `concurrency-limits` (Gradient2) adapt a window:
//!
//! - while a slot's round trips take no longer than [`Tuning::tolerance`] times the long-run
//!   average, the limit grows by about its square root per window: the apiservers keep up;
//! - when they take longer, it shrinks in proportion: requests would only queue in the
//!   apiserver, where they are no faster, cost its memory and are not shared fairly;
//! - an overload answer (429, 5xx, a timeout, a broken connection) halves it at once, at most
//!   once per [`Tuning::backoff_interval`].
//!
//! Slots are handed out in turn among the clusters that wait for one, not in arrival order:
//! a cluster flooded with 5,000 CSRs gets one slot for every slot each other waiting cluster
//! gets, whatever the length of its queue.
//!
//! The state machine is pure ([`Window`] takes latencies and answers), so its behaviour is
//! tested without a clock.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::controller::metrics::InFlightGauges;

/// The limiter's constants.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// Limit at start.
    pub initial: f64,
    /// Never fewer slots than this.
    pub min: f64,
    /// Never more slots than this (it also bounds connections and memory).
    pub max: f64,
    /// Latency up to this multiple of the long-run average counts as "keeping up".
    pub tolerance: f64,
    /// Least time between two halvings on overload answers.
    pub backoff_interval: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            initial: 16.0,
            min: 2.0,
            max: 128.0,
            tolerance: 2.0,
            backoff_interval: Duration::from_secs(1),
        }
    }
}

/// How a slot's work ended, as far as the apiservers are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The apiservers answered (any answer but an overload: a 409 or 404 is an answer too).
    Answered,
    /// 429, 5xx, a timeout or a broken connection.
    Overloaded,
    /// Nothing was asked (a CSR that needed no round trip): no signal either way.
    Idle,
}

/// The adaptive window: pure arithmetic over completions.
#[derive(Debug, Clone)]
pub struct Window {
    tuning: Tuning,
    limit: f64,
    /// Slow-moving average latency (seconds): what "normal" is lately.
    long: Option<f64>,
    /// Fast-moving average latency (seconds): what it is now.
    short: Option<f64>,
    last_backoff: Option<Instant>,
}

impl Window {
    /// A window at `tuning.initial`.
    pub fn new(tuning: Tuning) -> Self {
        Self {
            limit: tuning.initial.clamp(tuning.min, tuning.max),
            tuning,
            long: None,
            short: None,
            last_backoff: None,
        }
    }

    /// The whole number of slots now.
    pub fn limit(&self) -> usize {
        self.limit as usize
    }

    /// Takes one completion into account.
    pub fn complete(&mut self, answer: Answer, latency: Duration, now: Instant) {
        let t = self.tuning;
        match answer {
            Answer::Idle => {}
            Answer::Overloaded => {
                if self
                    .last_backoff
                    .is_none_or(|at| now.saturating_duration_since(at) >= t.backoff_interval)
                {
                    self.limit = (self.limit / 2.0).max(t.min);
                    self.last_backoff = Some(now);
                }
            }
            Answer::Answered => {
                let rtt = latency.as_secs_f64().max(1e-4);
                let short = self.short.map_or(rtt, |s| s + (rtt - s) * 0.1);
                let mut long = self.long.map_or(rtt, |l| l + (rtt - l) * 0.004);
                // A long average far above the current one (load went away) follows it down
                // faster, so a past storm does not make the next one look normal.
                if long / short > 2.0 {
                    long *= 0.95;
                }
                self.short = Some(short);
                self.long = Some(long);
                let gradient = (t.tolerance * long / short).clamp(0.5, 1.0);
                let headroom = self.limit.sqrt();
                let target = self.limit * gradient + headroom;
                // Smoothed: one completion moves the limit a fifth of the way to the target.
                self.limit = (self.limit * 0.8 + target * 0.2).clamp(t.min, t.max);
            }
        }
    }
}

#[derive(Debug)]
struct State {
    window: Window,
    in_flight: usize,
    /// Waiters per cluster, oldest first.
    waiting: HashMap<Arc<str>, VecDeque<oneshot::Sender<Slot>>>,
    /// Clusters with waiters, in the order their turn comes.
    turns: VecDeque<Arc<str>>,
}

/// The fleet's slots.
#[derive(Debug)]
pub struct InFlight {
    state: Mutex<State>,
    gauges: InFlightGauges,
}

/// One unit of work in flight; dropping it frees the slot and reports how it went.
#[must_use = "the slot is freed when dropped"]
#[derive(Debug)]
pub struct Slot {
    owner: Arc<InFlight>,
    started: Instant,
    answer: Answer,
}

impl Slot {
    /// Marks how the work ended (default: [`Answer::Answered`]).
    pub fn answer(&mut self, answer: Answer) {
        self.answer = answer;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.owner.release(self.answer, self.started.elapsed());
    }
}

impl InFlight {
    /// A limiter with `tuning`, reporting to `gauges`.
    pub fn new(tuning: Tuning, gauges: InFlightGauges) -> Arc<Self> {
        Arc::new(Self {
            gauges,
            state: Mutex::new(State {
                window: Window::new(tuning),
                in_flight: 0,
                waiting: HashMap::new(),
                turns: VecDeque::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current limit and the slots taken.
    #[cfg(test)]
    fn usage(&self) -> (usize, usize) {
        let state = self.lock();
        (state.window.limit(), state.in_flight)
    }

    fn report(&self, state: &State) {
        self.gauges.in_flight.set(state.in_flight as i64);
        self.gauges.limit.set(state.window.limit() as i64);
    }

    fn slot(self: &Arc<Self>) -> Slot {
        Slot {
            owner: Arc::clone(self),
            started: Instant::now(),
            answer: Answer::Answered,
        }
    }

    /// Waits for a slot for `cluster`'s work. Cancel-safe: a waiter dropped before or after
    /// its turn comes never holds a slot.
    pub async fn acquire(self: &Arc<Self>, cluster: &Arc<str>) -> Slot {
        let receiver = {
            let mut guard = self.lock();
            let state = &mut *guard;
            if state.turns.is_empty() && state.in_flight < state.window.limit() {
                state.in_flight += 1;
                self.report(state);
                drop(guard);
                return self.slot();
            }
            let (sender, receiver) = oneshot::channel();
            let queue = state.waiting.entry(Arc::clone(cluster)).or_default();
            if queue.is_empty() {
                state.turns.push_back(Arc::clone(cluster));
            }
            queue.push_back(sender);
            receiver
        };
        match receiver.await {
            Ok(slot) => slot,
            // The limiter dropped the sender: only when it is gone itself. Work unthrottled
            // rather than never.
            Err(_) => self.slot(),
        }
    }

    fn release(self: &Arc<Self>, answer: Answer, latency: Duration) {
        // Slots whose waiter went away are dropped after the lock is released (their drop
        // comes back here).
        let mut unwanted = Vec::new();
        {
            let mut guard = self.lock();
            let state = &mut *guard;
            state.in_flight = state.in_flight.saturating_sub(1);
            state.window.complete(answer, latency, Instant::now());
            while state.in_flight < state.window.limit() {
                let Some(cluster) = state.turns.pop_front() else {
                    break;
                };
                let Some(queue) = state.waiting.get_mut(&cluster) else {
                    continue;
                };
                let Some(sender) = queue.pop_front() else {
                    state.waiting.remove(&cluster);
                    continue;
                };
                if queue.is_empty() {
                    state.waiting.remove(&cluster);
                } else {
                    state.turns.push_back(cluster);
                }
                if sender.is_closed() {
                    continue;
                }
                state.in_flight += 1;
                let slot = Slot {
                    owner: Arc::clone(self),
                    started: Instant::now(),
                    answer: Answer::Idle,
                };
                match sender.send(slot) {
                    Ok(()) => {}
                    Err(mut slot) => {
                        slot.answer = Answer::Idle;
                        unwanted.push(slot);
                    }
                }
            }
            self.report(state);
        }
        drop(unwanted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limiter of exactly one slot.
    fn one_slot() -> Arc<InFlight> {
        InFlight::new(
            Tuning {
                initial: 1.0,
                min: 1.0,
                max: 1.0,
                ..Tuning::default()
            },
            InFlightGauges::default(),
        )
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn grows_while_latency_holds_and_shrinks_when_it_climbs() {
        let now = Instant::now();
        let mut w = Window::new(Tuning::default());
        for _ in 0..200 {
            w.complete(Answer::Answered, ms(20), now);
        }
        assert_eq!(w.limit(), 128, "steady latency: up to the cap");
        for _ in 0..30 {
            w.complete(Answer::Answered, ms(200), now);
        }
        assert!(
            w.limit() < 64,
            "ten times slower: well under the cap, got {}",
            w.limit()
        );
        let shrunk = w.limit();
        for _ in 0..3000 {
            w.complete(Answer::Answered, ms(200), now);
        }
        assert!(
            w.limit() >= shrunk,
            "a sustained new normal stops the shrinking: {} < {shrunk}",
            w.limit()
        );
    }

    #[test]
    fn overload_halves_at_most_once_per_interval() {
        let now = Instant::now();
        let mut w = Window::new(Tuning::default());
        w.complete(Answer::Overloaded, ms(5), now);
        assert_eq!(w.limit(), 8);
        w.complete(Answer::Overloaded, ms(5), now + ms(10));
        assert_eq!(w.limit(), 8, "one burst of errors is one signal");
        w.complete(Answer::Overloaded, ms(5), now + ms(1100));
        assert_eq!(w.limit(), 4);
        for i in 0..10 {
            w.complete(Answer::Overloaded, ms(5), now + Duration::from_secs(2 + i));
        }
        assert_eq!(w.limit(), 2, "never under the floor");
        w.complete(Answer::Idle, ms(500), now);
        assert_eq!(w.limit(), 2, "idle completions say nothing");
    }

    #[tokio::test]
    async fn slots_go_to_waiting_clusters_in_turn() {
        let limiter = one_slot();
        let (flood, quiet): (Arc<str>, Arc<str>) = ("flood".into(), "quiet".into());
        let first = limiter.acquire(&flood).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, cluster) in [&flood, &flood, &flood, &quiet].into_iter().enumerate() {
            let (shared, cluster, order) = (Arc::clone(&limiter), Arc::clone(cluster), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                let slot = shared.acquire(&cluster).await;
                order.lock().unwrap().push((i, cluster.to_string()));
                tokio::task::yield_now().await;
                drop(slot);
            }));
            // Each waiter queued before the next.
            while limiter.lock().waiting.values().map(VecDeque::len).sum::<usize>() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        drop(first);
        for task in tasks {
            task.await.unwrap();
        }
        let order: Vec<String> = order.lock().unwrap().iter().map(|(_, c)| c.clone()).collect();
        assert_eq!(
            order,
            ["flood", "quiet", "flood", "flood"],
            "the quiet cluster's turn comes second"
        );
        assert_eq!(limiter.usage().1, 0, "every slot freed");
        assert_eq!(limiter.gauges.in_flight.get(), 0);
        assert_eq!(limiter.gauges.limit.get(), 1);
    }

    #[tokio::test]
    async fn a_waiter_that_goes_away_holds_no_slot() {
        let limiter = one_slot();
        let cluster: Arc<str> = "c".into();
        let held = limiter.acquire(&cluster).await;
        let gone = {
            let limiter = Arc::clone(&limiter);
            let cluster = Arc::clone(&cluster);
            tokio::spawn(async move { limiter.acquire(&cluster).await })
        };
        while limiter.lock().waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        drop(held);
        assert_eq!(limiter.usage().1, 0);
        let again = tokio::time::timeout(Duration::from_secs(1), limiter.acquire(&cluster)).await;
        assert!(again.is_ok(), "the slot came back");
    }
}
