//! The SQS adapter against a real SQS-compatible server (moto, started by `scripts/test`): what the engine
//! dispatches arrives as a message a worker can run, and a message delivered twice makes one provider call.

mod support;

use std::sync::Arc;

use chrono::Duration;
use onejob::domain::{AttemptRef, ProviderName};
use onejob::queue::sqs::SqsQueue;
use onejob::queue::{Dispatcher, Message};
use onejob::store::sqlite::SqliteStore;
use onejob::worker::{Processed, process_attempt};
use serde_json::json;
use support::rig::Rig;
use support::stand_in::{StandIn, openai};

async fn sqs() -> Option<aws_sdk_sqs::Client> {
    Some(aws_sdk_sqs::Client::new(&support::aws::sdk_config().await?))
}

async fn receive_all(client: &aws_sdk_sqs::Client, url: &str) -> Vec<Message> {
    let received = client
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .send()
        .await
        .unwrap();
    received
        .messages()
        .iter()
        .map(|m| SqsQueue::parse(m.body().unwrap()).unwrap())
        .collect()
}

#[tokio::test]
async fn dispatched_attempts_arrive_as_messages_naming_them() {
    let Some(client) = sqs().await else { return };
    let url = support::aws::queue_for_test(&client, "dispatch").await;
    let queue = SqsQueue::new(client.clone(), &url);
    let attempt = AttemptRef {
        job_id: onejob::domain::JobId::parse("job_00000000000000000000000000000001").unwrap(),
        number: 1,
    };
    // The provider travels with the message; a sender that names none (an older one) still names the attempt.
    let first = Message::new(
        attempt.clone(),
        Some(ProviderName::parse("primary").unwrap()),
    );
    let second = Message::new(
        AttemptRef {
            number: 2,
            ..attempt
        },
        None,
    );
    queue.dispatch(&first, Duration::zero()).await.unwrap();
    queue.dispatch(&second, Duration::zero()).await.unwrap();
    let mut received = receive_all(&client, &url).await;
    received.sort_by_key(|m| m.attempt.number);
    assert_eq!(received, vec![first, second]);
}

/// A retry's wait travels as the message's delay, in whole seconds rounded up: not there at once, there once its
/// time has come (a long poll waits for it).
#[tokio::test]
async fn a_delayed_dispatch_is_a_delayed_message() {
    let Some(client) = sqs().await else { return };
    let url = support::aws::queue_for_test(&client, "delay").await;
    let queue = SqsQueue::new(client.clone(), &url);
    let attempt = Message::new(
        AttemptRef {
            job_id: onejob::domain::JobId::parse("job_00000000000000000000000000000001").unwrap(),
            number: 2,
        },
        None,
    );
    let sent = std::time::Instant::now();
    queue
        .dispatch(&attempt, Duration::milliseconds(1_200))
        .await
        .unwrap();
    assert_eq!(receive_all(&client, &url).await, vec![]);
    let later = client
        .receive_message()
        .queue_url(&url)
        .wait_time_seconds(10)
        .send()
        .await
        .unwrap();
    let bodies: Vec<Message> = later
        .messages()
        .iter()
        .map(|m| SqsQueue::parse(m.body().unwrap()).unwrap())
        .collect();
    assert_eq!(bodies, vec![attempt]);
    assert!(
        sent.elapsed() >= std::time::Duration::from_secs(2),
        "rounded up to 2 s: {:?}",
        sent.elapsed()
    );
}

#[tokio::test]
async fn a_job_runs_from_its_sqs_message_and_a_duplicate_makes_no_second_call() {
    let Some(client) = sqs().await else { return };
    let url = support::aws::queue_for_test(&client, "engine").await;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("onejob.db")).unwrap());
    let primary = StandIn::answering(json!({"summary": "A"})).await;
    let fallback = StandIn::answering(json!({"summary": "B"})).await;
    let mut rig = Rig::new(
        store,
        openai(primary.base_url()),
        openai(fallback.base_url()),
    );
    let (job, local) = rig.create("k").await;

    let queue = SqsQueue::new(client.clone(), &url);
    let local = Message::new(local, None);
    queue.dispatch(&local, Duration::zero()).await.unwrap();
    queue.dispatch(&local, Duration::zero()).await.unwrap();
    let messages = receive_all(&client, &url).await;
    assert_eq!(messages, vec![local.clone(), local]);
    let mut outcomes = Vec::new();
    for message in &messages {
        outcomes.push(
            process_attempt(&rig.engine, &message.attempt)
                .await
                .unwrap(),
        );
    }
    assert_eq!(outcomes, vec![Processed::Succeeded, Processed::Dropped]);
    assert_eq!(primary.call_count(), 1);
    assert_eq!(rig.job(&job).await.result, Some(json!({"summary": "A"})));
}
