//! create → the demo provider answers at once → `succeeded`, in process.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use onejob::clock::SystemClock;
use onejob::domain::{JobStatus, Owner};
use onejob::providers::keys::ProviderKeys;
use onejob::startup::{self, Process, Role};
use onejob::store::sqlite::SqliteStore;
use tokio::sync::Semaphore;

use super::{Scratch, checkpoint, instant_config, intent, percentiles, preload};

pub(super) async fn lifecycle(jobs: usize, concurrency: usize, preload_n: usize) {
    let dir = Scratch::new("lifecycle");
    let db = dir.join("bench.db");
    let store = Arc::new(SqliteStore::open(&db).unwrap());
    preload(store.as_ref(), preload_n).await;
    checkpoint(&db);
    let config = instant_config();
    let (process, messages) = Process::local(store, Arc::new(SystemClock));
    let engine = startup::engine(&config, Role::COMMAND, &ProviderKeys::default(), process);
    let engine = Arc::new(engine.unwrap());
    let worker = tokio::spawn(onejob::worker::run_local(
        engine.clone(),
        messages,
        config.worker_concurrency,
    ));
    let owner = Owner::parse("alice").unwrap();
    let slots = Arc::new(Semaphore::new(concurrency));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(jobs)));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..jobs {
        let (engine, owner, slots, latencies) = (
            engine.clone(),
            owner.clone(),
            slots.clone(),
            latencies.clone(),
        );
        tasks.spawn(async move {
            let _slot = slots.acquire_owned().await.unwrap();
            let sent = Instant::now();
            let job = engine
                .create_job(intent(&owner, &format!("life-{i}"), "The projector broke."))
                .await
                .unwrap()
                .job()
                .clone();
            // Watch, then read: a change after the create and before the watch is in the first read. As a long
            // poll does, read again after each change, unless the change made the job final and brought it along.
            let mut changes = engine.watch(&job.id);
            let mut now = Arc::new(engine.get_job(&owner, &job.id).await.unwrap().unwrap());
            while now.status() != JobStatus::Succeeded {
                now = match changes.changed().await {
                    Some(last) => last,
                    None => Arc::new(engine.get_job(&owner, &job.id).await.unwrap().unwrap()),
                };
            }
            latencies.lock().unwrap().push(sent.elapsed());
        });
    }
    while tasks.join_next().await.is_some() {}
    let seconds = started.elapsed().as_secs_f64();
    worker.abort();
    let mut samples = std::mem::take(&mut *latencies.lock().unwrap());
    let (p50, p99, _) = percentiles(&mut samples);
    println!(
        "lifecycle: {jobs} jobs, {concurrency} in flight, {preload_n} preloaded: {:.0} jobs/s   create→succeeded p50 {p50:.2} ms   p99 {p99:.2} ms",
        jobs as f64 / seconds
    );
}
