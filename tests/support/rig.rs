//! `Rig`: an engine on a given store, with providers `primary` and `fallback`, a manual clock, and its queue left
//! for the test to drive one step at a time.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{Duration, TimeZone, Utc};
use onejob::clock::{Clock, ManualClock};
use onejob::config::Config;
use onejob::domain::{
    AttemptRef, ContractRef, Fingerprint, IdempotencyKey, Job, NewJob, Owner, ProviderName,
};
use onejob::engine::Actor;
use onejob::engine::Engine;
use onejob::providers::ProviderConfig;
use onejob::providers::keys::ProviderKeys;
use onejob::queue::{Delivery, Message};
use onejob::startup::{self, Process, Role};
use onejob::store::JobStore;
use onejob::worker::{Processed, process_attempt, process_message};
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;

use crate::support::faulty::{Call, FaultyStore};

/// An engine on `store`, with providers `primary` and `fallback`, its queue left for the test to drive.
pub(crate) struct Rig {
    pub engine: Arc<Engine>,
    /// The engine's store, for what a test sets up or looks at behind the engine's back.
    pub store: Arc<dyn JobStore>,
    pub clock: Arc<ManualClock>,
    queue: UnboundedReceiver<Delivery>,
    owner: Owner,
}

impl Rig {
    pub(crate) fn new(
        store: Arc<dyn JobStore>,
        primary: ProviderConfig,
        fallback: ProviderConfig,
    ) -> Self {
        Self::configured(store, primary, fallback, |_| {})
    }

    /// [`Rig::new`], with the deployment's settings changed by `adjust` first.
    pub(crate) fn configured(
        store: Arc<dyn JobStore>,
        primary: ProviderConfig,
        fallback: ProviderConfig,
        adjust: impl FnOnce(&mut Config),
    ) -> Self {
        let mut config = Config::default();
        adjust(&mut config);
        config
            .providers
            .insert(ProviderName::parse("primary").unwrap(), primary);
        config
            .providers
            .insert(ProviderName::parse("fallback").unwrap(), fallback);
        let clock = Arc::new(ManualClock::new(
            Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap(),
        ));
        let (process, messages) = Process::local(store.clone(), clock.clone());
        // With AWS settings, signing as the Bedrock stand-ins check: a provider may be of any kind.
        let keys = ProviderKeys::default().with_aws(super::stand_in::aws());
        let engine = startup::engine(&config, Role::COMMAND, &keys, process).unwrap();
        Self {
            engine: Arc::new(engine),
            store,
            clock,
            queue: messages,
            owner: Owner::parse("alice").unwrap(),
        }
    }

    /// The rig creating its jobs for `owner` (alice unless told).
    pub(crate) fn for_owner(mut self, owner: &str) -> Self {
        self.owner = Owner::parse(owner).unwrap();
        self
    }

    /// The rig with a sweep that handles `batch` of each kind at a time (the deployment's is 100): a test of
    /// batch after batch then needs a few dozen jobs, not hundreds, on every store.
    pub(crate) fn sweeping(mut self, batch: usize) -> Self {
        let engine = Arc::get_mut(&mut self.engine).expect("the rig's engine is not shared yet");
        engine.settings.sweep_batch = batch;
        self
    }

    /// Creates a summarize job on the chain primary → fallback; returns it and its dispatched message.
    pub(crate) async fn create(&mut self, key: &str) -> (Job, AttemptRef) {
        let (job, sent) = self.create_sent(key).await;
        (job, sent.attempt)
    }

    /// [`Rig::create`], with the message as the engine sent it (naming the attempt's provider).
    pub(crate) async fn create_sent(&mut self, key: &str) -> (Job, Message) {
        let new = self.intent(key);
        let job = self.engine.create_job(new).await.unwrap().job().clone();
        let sent = self.queue.try_recv().expect("a dispatched message");
        (job, sent.message)
    }

    /// The intent [`Rig::create`] sends: a summarize job on the chain primary → fallback, under `key`.
    pub(crate) fn intent(&self, key: &str) -> NewJob {
        let input = json!({"text": "The projector broke. The meeting moved."});
        let chain = json!(["primary", "fallback"]);
        NewJob {
            owner: self.owner.clone(),
            idempotency_key: IdempotencyKey::parse(key).unwrap(),
            fingerprint: Fingerprint::of_intent("summarize@1", &input, Some(&chain)),
            contract: ContractRef::parse("summarize@1").unwrap(),
            input,
            providers: vec![
                ProviderName::parse("primary").unwrap(),
                ProviderName::parse("fallback").unwrap(),
            ],
        }
    }

    /// The next message the engine dispatched; there must be one.
    pub(crate) fn next_message(&mut self) -> AttemptRef {
        self.queue
            .try_recv()
            .expect("a dispatched message")
            .message
            .attempt
    }

    /// The next message the engine dispatches, waiting for it (a delayed one comes once the clock passes its time).
    pub(crate) async fn message(&mut self) -> AttemptRef {
        tokio::time::timeout(StdDuration::from_secs(20), self.queue.recv())
            .await
            .expect("a message in time")
            .expect("the queue is open")
            .message
            .attempt
    }

    /// The next message as the engine sent it (naming the attempt's provider), waiting for it.
    pub(crate) async fn sent(&mut self) -> Message {
        tokio::time::timeout(StdDuration::from_secs(20), self.queue.recv())
            .await
            .expect("a message in time")
            .expect("the queue is open")
            .message
    }

    /// Runs the step for a message as the engine sent it, in the background.
    pub(crate) fn process_sent_in_background(&self, message: &Message) -> JoinHandle<Processed> {
        let (engine, message) = (self.engine.clone(), message.clone());
        tokio::spawn(async move { process_message(&engine, &message, None).await.unwrap() })
    }

    /// Sweeps, then runs the lookups the sweep sent to the workers (`Message::look_up`), each as a worker would:
    /// what each came to.
    pub(crate) async fn reconcile(&mut self) -> Vec<Processed> {
        let swept = onejob::worker::sweeper::sweep(&self.engine, None)
            .await
            .unwrap();
        let mut done = Vec::new();
        for _ in 0..swept.asked {
            let message = self.queue.try_recv().expect("a lookup sent").message;
            assert!(message.look_up, "{message:?}");
            done.push(process_message(&self.engine, &message, None).await.unwrap());
        }
        done
    }

    pub(crate) fn no_message(&mut self) -> bool {
        self.queue.try_recv().is_err()
    }

    pub(crate) async fn process(&self, message: &AttemptRef) -> Processed {
        process_attempt(&self.engine, message).await.unwrap()
    }

    /// Runs the step in the background, for attempts that wait on the clock or on a gate.
    pub(crate) fn process_in_background(&self, message: &AttemptRef) -> JoinHandle<Processed> {
        let (engine, message) = (self.engine.clone(), message.clone());
        tokio::spawn(async move { process_attempt(&engine, &message).await.unwrap() })
    }

    /// Metric `name` summed over the samples whose labels include `labels`, from the engine's Prometheus text.
    pub(crate) fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        super::metric(&self.engine.metrics.render().unwrap(), name, labels)
    }

    pub(crate) async fn job(&self, job: &Job) -> Job {
        self.engine
            .get_job(&self.owner, &job.id)
            .await
            .unwrap()
            .unwrap()
    }

    /// The error the job's attempt `number` ended with (it ended with one).
    pub(crate) async fn attempt_error(&self, job: &Job, number: u32) -> onejob::domain::ErrorInfo {
        let job = self.job(job).await;
        let attempt = job.attempt(number).expect("the attempt is recorded");
        attempt
            .error
            .clone()
            .expect("the attempt ended with an error")
    }

    /// Moves the clock `ms` on past each backoff `step` waits out between tries of its `call` on `faulty` — once per
    /// try, and never while the provider call, bounded by its own timeout on the same clock, is in flight — until
    /// the step is done. An advance can land just before the step registers its sleep; a step that then stays
    /// asleep for a while of real time (it would hang otherwise) gets one more. The real-time bound only turns a
    /// hang into a failure that says where the step stood.
    pub(crate) async fn drive_backoff<T>(
        &self,
        faulty: &FaultyStore,
        ms: u64,
        call: Call,
        step: &JoinHandle<T>,
    ) {
        let mut woken_after = 0;
        let started = std::time::Instant::now();
        let mut last_advance = started;
        while !step.is_finished() {
            let tries = faulty.calls(call);
            let asleep = self.clock.sleepers() > 0;
            let stalled = last_advance.elapsed() > StdDuration::from_millis(250);
            if tries > 0 && asleep && (tries > woken_after || stalled) {
                woken_after = tries;
                last_advance = std::time::Instant::now();
                self.advance(ms);
            }
            assert!(
                started.elapsed() < StdDuration::from_secs(30),
                "the step hangs: {tries} {call:?} tried, {} sleeps on the clock, {} claims, now {}",
                self.clock.sleepers(),
                faulty.calls(Call::Claim),
                self.clock.now()
            );
            tokio::task::yield_now().await;
        }
    }

    /// Waits on the engine's change feed (not on time) until the job satisfies `ready`.
    pub(crate) async fn until(&self, job: &Job, ready: impl Fn(&Job) -> bool) -> Job {
        let mut changes = self.engine.watch(&job.id);
        let wait = async {
            loop {
                let now = self.job(job).await;
                if ready(&now) {
                    return now;
                }
                changes.changed().await;
            }
        };
        tokio::time::timeout(StdDuration::from_secs(20), wait)
            .await
            .expect("the job never got there")
    }

    pub(crate) fn advance(&self, ms: u64) {
        self.clock.advance(Duration::milliseconds(ms as i64));
    }

    pub(crate) async fn cancel_attempt(&self, job: &Job, number: u32) -> Job {
        self.engine
            .cancel_attempt(&Actor::Owner(self.owner.clone()), &job.id, number, None)
            .await
            .unwrap()
    }
}
