//! The events side of the store: owners' endpoints, and deliveries armed once per settle, taken by
//! compare-and-swap, listed while due, gone with their job.

use std::sync::Arc;

use onejob::domain::{Deliveries, Endpoint, EventDelivery, JobStatus, SinkKind};
use onejob::store::JobStore;

use super::*;

pub(crate) async fn endpoints_are_kept_per_owner_and_removed(store: Arc<dyn JobStore>) {
    let endpoint = Endpoint::new("https://hooks.example.com/onejob".into(), at(0));
    assert_eq!(store.endpoint(&owner("alice")).await.unwrap(), None);
    store
        .put_endpoint(&owner("alice"), Some(&endpoint))
        .await
        .unwrap();
    assert_eq!(
        store.endpoint(&owner("alice")).await.unwrap(),
        Some(endpoint.clone())
    );
    assert_eq!(store.endpoint(&owner("bob")).await.unwrap(), None);
    let moved = Endpoint {
        url: "https://hooks.example.com/v2".into(),
        ..endpoint
    };
    store
        .put_endpoint(&owner("alice"), Some(&moved))
        .await
        .unwrap();
    assert_eq!(store.endpoint(&owner("alice")).await.unwrap(), Some(moved));
    store.put_endpoint(&owner("alice"), None).await.unwrap();
    store.put_endpoint(&owner("alice"), None).await.unwrap();
    assert_eq!(store.endpoint(&owner("alice")).await.unwrap(), None);
}

pub(crate) async fn deliveries_are_armed_once_per_settle_and_taken_by_compare_and_swap(
    store: Arc<dyn JobStore>,
) {
    let job = fresh_job(store.as_ref()).await;
    let (_, job) = store.cancel_job(&job.owner, &job.id, &by(1)).await.unwrap();
    let settles_at = job.settles_at().unwrap();
    // No endpoint: nothing is armed.
    assert!(!store.arm_deliveries(&job, settles_at).await.unwrap());
    assert_eq!(store.deliveries(&job.id).await.unwrap(), None);

    let endpoint = Endpoint::new("https://hooks.example.com/".into(), at(0));
    store
        .put_endpoint(&job.owner, Some(&endpoint))
        .await
        .unwrap();
    assert!(store.arm_deliveries(&job, settles_at).await.unwrap());
    let (armed, rev) = store.deliveries(&job.id).await.unwrap().unwrap();
    assert_eq!(
        armed,
        Deliveries {
            owner: job.owner.clone(),
            job_id: job.id.clone(),
            due_at: Some(settles_at),
            expires_at: job.expires_at,
            events: Vec::new(),
        }
    );
    // The same settle again (a later write that left it as it was): nothing moves.
    assert!(store.arm_deliveries(&job, settles_at).await.unwrap());
    assert_eq!(store.deliveries(&job.id).await.unwrap().unwrap().1, rev);

    assert!(store.due_deliveries(at(0), 10).await.unwrap().is_empty());
    let due = store.due_deliveries(settles_at, 10).await.unwrap();
    assert_eq!(due, vec![(armed.clone(), rev)]);

    // Taken by one writer: a second one with the same revision is refused.
    let mut tried = armed.clone();
    let event = EventDelivery {
        id: "evt_0".into(),
        sink: SinkKind::Bus,
        status: JobStatus::Cancelled,
        settled_at: settles_at,
        tries: 0,
        delivered_at: None,
        last_error: None,
        next_try_at: None,
    };
    tried.record(&[(event, Some("HTTP 500".into()))], at(2), |_| {
        Duration::seconds(1)
    });
    assert!(store.put_deliveries(&tried, rev).await.unwrap());
    assert!(!store.put_deliveries(&armed, rev).await.unwrap());
    let (stored, rev) = store.deliveries(&job.id).await.unwrap().unwrap();
    assert_eq!(stored, tried);
    assert!(store.due_deliveries(at(2), 10).await.unwrap().is_empty());
    assert_eq!(store.due_deliveries(at(1_002), 10).await.unwrap().len(), 1);

    // Nothing due: not listed however late.
    let idle = Deliveries {
        due_at: None,
        ..stored.clone()
    };
    assert!(store.put_deliveries(&idle, rev).await.unwrap());
    assert!(
        store
            .due_deliveries(at(5_000), 10)
            .await
            .unwrap()
            .is_empty()
    );

    // Another settle (the job reopened and ended again) arms them again, keeping what was tried.
    let later = settles_at + Duration::seconds(7);
    assert!(store.arm_deliveries(&job, later).await.unwrap());
    let (rearmed, _) = store.deliveries(&job.id).await.unwrap().unwrap();
    assert_eq!(rearmed.due_at, Some(later));
    assert_eq!(rearmed.events, tried.events);

    // Gone with the job.
    assert!(
        store
            .due_deliveries(job.expires_at, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A store that arms every job (a deployment with a bus) arms the deliveries of a job whose owner has no endpoint,
/// once per settle.
pub(crate) async fn a_store_arming_every_job_arms_without_an_endpoint(store: Arc<dyn JobStore>) {
    let job = fresh_job(store.as_ref()).await;
    assert_eq!(store.endpoint(&job.owner).await.unwrap(), None);
    let (_, job) = store.cancel_job(&job.owner, &job.id, &by(1)).await.unwrap();
    let settles_at = job.settles_at().unwrap();
    assert!(store.arm_deliveries(&job, settles_at).await.unwrap());
    let (armed, rev) = store.deliveries(&job.id).await.unwrap().unwrap();
    assert_eq!(armed.due_at, Some(settles_at));
    assert!(store.arm_deliveries(&job, settles_at).await.unwrap());
    assert_eq!(store.deliveries(&job.id).await.unwrap().unwrap().1, rev);
    assert_eq!(
        store.due_deliveries(settles_at, 10).await.unwrap(),
        vec![(armed, rev)]
    );
}
