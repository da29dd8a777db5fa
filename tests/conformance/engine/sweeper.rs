//! The sweeper's batches on every store: batch after batch, until nothing is due or the time is up.

use super::*;

/// More settled jobs than a sweep's batch: the scheduled sweeper's delivery goes on a batch at a time until none is
/// due, each event once; with no time left for a second batch, it stops after the first.
pub(crate) async fn the_sweeper_delivers_batch_after_batch_until_none_is_due(
    store: Arc<dyn JobStore>,
) {
    let receiver = answering("heard").await;
    let unused = answering("B").await;
    let rig = Rig::configured(
        store,
        openai(unused.base_url()),
        openai(unused.base_url()),
        |config| config.allow_private_endpoints = true,
    )
    .sweeping(SMALL_BATCH);
    let owner = onejob::domain::Owner::parse("alice").unwrap();
    let url = format!("{}/chat/completions", receiver.base_url());
    let url = rig.engine.check_endpoint(&url).await.unwrap();
    rig.engine.put_endpoint(&owner, url).await.unwrap();
    let batch = rig.engine.settings.sweep_batch;
    let jobs = 2 * batch + batch / 2;
    for i in 0..jobs {
        let job = rig.engine.create_job(rig.intent(&format!("k{i}"))).await;
        let job = job.unwrap().job().clone();
        (rig.engine)
            .cancel_job(&Actor::Owner(owner.clone()), &job.id, None)
            .await
            .unwrap();
    }
    let engine = &rig.engine;
    let delivered =
        |deadline| async move { sweep(engine, Some(deadline)).await.unwrap().delivered };
    let now = rig.clock.now();
    assert_eq!(delivered(now).await, batch);
    // Time for more: the next full batch and the half one after it.
    let later = now + chrono::Duration::hours(1);
    assert_eq!(delivered(later).await, jobs - batch);
    assert_eq!(delivered(later).await, 0);
    let ids: std::collections::BTreeSet<String> = receiver
        .calls()
        .iter()
        .map(|c| c.body["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!((receiver.call_count(), ids.len()), (jobs, jobs));
}

/// More expired leases and unclaimed attempts than a sweep's batch (a provider that hung with every attempt in
/// flight, dispatches lost): the scheduled sweeper goes on a batch at a time until none is left, each attempt once;
/// with no time left for a second batch, it stops after the first.
pub(crate) async fn the_sweeper_expires_and_dispatches_again_batch_after_batch(
    store: Arc<dyn JobStore>,
) {
    let unused = answering("A").await;
    let mut rig =
        Rig::new(store, openai(unused.base_url()), openai(unused.base_url())).sweeping(SMALL_BATCH);
    let batch = rig.engine.settings.sweep_batch;
    let each = 2 * batch + batch / 2;
    let now = rig.clock.now();
    let mut hung = Vec::new();
    let mut lost = std::collections::BTreeSet::new();
    for i in 0..each {
        let (job, message) = rig.create(&format!("hung-{i}")).await;
        let lease = now + rig.engine.lease();
        let stamp = onejob::domain::Stamp::fresh(now);
        let claim = rig
            .store
            .claim_attempt(&job.id, message.number, lease, &stamp);
        claim.await.unwrap();
        hung.push(job);
        let (job, _) = rig.create(&format!("lost-{i}")).await;
        lost.insert(job.id);
    }
    rig.advance(rig.engine.lease().num_milliseconds() as u64 + 1);

    let deadline = rig.clock.now();
    let first = sweep(&rig.engine, Some(deadline)).await.unwrap();
    assert_eq!((first.expired, first.redispatched), (batch, batch));
    let later = deadline + chrono::Duration::hours(1);
    let rest = sweep(&rig.engine, Some(later)).await.unwrap();
    assert_eq!(
        (rest.expired, rest.redispatched),
        (each - batch, each - batch)
    );
    let after = sweep(&rig.engine, Some(later)).await.unwrap();
    assert_eq!((after.expired, after.redispatched), (0, 0));

    for job in &hung {
        assert_eq!(state(&rig.job(job).await, 1), AttemptState::Unknown);
    }
    let sent: std::collections::BTreeSet<_> =
        (0..each).map(|_| rig.next_message().job_id).collect();
    assert_eq!(sent, lost, "each lost dispatch sent again, once");
    assert!(rig.no_message());
}
