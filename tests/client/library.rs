//! The client library (`Intent`, `Client`) behind the scripted proxy: an intent keeps its key through a lost answer, a
//! gateway's 504 and a 429, and one that gives up returns its key to resume with.

use super::*;

pub(crate) fn summarize_intent() -> Intent {
    Intent::new(JobSpec {
        contract: "summarize@1".into(),
        input: serde_json::json!({"text": "The projector broke. The meeting moved."}),
        providers: None,
    })
}

/// The library against every way an answer goes missing, one after the other: the first answer dropped after the
/// server made the job, a gateway's HTML 504, a 429 asking for a second. One key on every try, one job, the last
/// try a replay that came no sooner than the `Retry-After` (the backoff itself is at most a few milliseconds here),
/// and the wait ends with the job settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_keeps_its_key_through_a_lost_answer_a_gateway_504_and_a_429() {
    let app = App::start().await;
    let proxy = Proxy::spawn(
        app.running.addr,
        vec![Act::DropAnswer, Act::GatewayTimeout, Act::RateLimited],
    )
    .await;
    let policy = Tries {
        base: Duration::from_millis(1),
        ..Tries::default()
    };
    let client = Client::new(&proxy.url, "dev-token-alice", policy);
    let intent = summarize_intent();
    let started = Instant::now();
    let created = client.submit(&intent).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After honoured: {:?}",
        started.elapsed()
    );
    assert_eq!(created.tries, 4);
    assert!(created.replayed, "the first try made the job");
    assert_eq!(proxy.keys(), vec![Some(intent.key().to_owned()); 4]);
    assert_eq!(app.creates("created"), 1.0);
    let job = client.wait(&intent, &created, |_| {}).await.unwrap();
    assert_eq!(job["status"], "succeeded");
    assert_eq!(job["id"], created.job["id"]);
}

/// A give-up hands back the intent's key; the same intent submitted again (here resumed from the key alone, as a
/// program that kept it would) finds the job the lost tries made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_that_gives_up_returns_its_key_and_resuming_it_finds_the_job() {
    let app = App::start().await;
    let proxy = Proxy::spawn(app.running.addr, vec![Act::DropAnswer, Act::DropAnswer]).await;
    let policy = Tries {
        retries: 1,
        base: Duration::from_millis(1),
        ..Tries::default()
    };
    let client = Client::new(&proxy.url, "dev-token-alice", policy);
    let intent = summarize_intent();
    let gave_up = client.submit(&intent).await.unwrap_err();
    assert_eq!(gave_up.key, intent.key());
    assert!(gave_up.may_exist(), "{gave_up}");
    assert!(matches!(
        gave_up.source,
        ClientError::GaveUp { tries: 2, .. }
    ));
    let resumed = Intent::resume(gave_up.key, intent.job().clone());
    let created = client.submit(&resumed).await.unwrap();
    assert!(created.replayed);
    assert_eq!(app.creates("created"), 1.0, "one job for the intent");
    assert_eq!(proxy.keys().len(), 3);
}
