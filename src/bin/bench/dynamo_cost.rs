//! Store requests per operation on DynamoDB, counted at the SDK's interceptor.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use onejob::domain::{CallReport, JobId, Owner, Stamp, WriteToken};
use onejob::store::JobStore;
use onejob::store::dynamodb::DynamoStore;
use serde_json::json;

use super::{RETENTION, intent, percentiles, preload};

/// Runs one store call; answers how many requests it sent and how long it took. It must succeed.
async fn counted<T, E: std::fmt::Debug>(
    counter: &Counter,
    call: impl Future<Output = Result<T, E>>,
) -> (usize, Duration) {
    let before = counter.0.load(Ordering::Relaxed);
    let started = Instant::now();
    call.await.unwrap();
    (
        counter.0.load(Ordering::Relaxed) - before,
        started.elapsed(),
    )
}

/// Counts the requests the SDK sends.
#[derive(Debug, Clone, Default)]
struct Counter(Arc<AtomicUsize>);

impl aws_sdk_dynamodb::config::Intercept for Counter {
    fn name(&self) -> &'static str {
        "bench-request-counter"
    }

    fn read_before_transmit(
        &self,
        _: &aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_sdk_dynamodb::config::RuntimeComponents,
        _: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

pub(super) async fn dynamo_cost(preload_n: usize, reps: usize) {
    let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") else {
        eprintln!("dynamo-cost needs AWS_ENDPOINT_URL (moto: see BENCHMARKS.md)");
        std::process::exit(2);
    };
    let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(onejob::startup::https_client())
        .endpoint_url(&endpoint)
        .load()
        .await;
    let counter = Counter::default();
    let config = aws_sdk_dynamodb::config::Builder::from(&shared)
        .interceptor(counter.clone())
        .build();
    let table = format!("bench-{}", std::process::id());
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::from_conf(config), &table);
    store.create_table().await.unwrap();
    preload(&store, preload_n).await;

    let owner = Owner::parse("alice").unwrap();
    let now = chrono::Utc::now();
    let lease = now + chrono::Duration::minutes(5);
    let mut costs: Vec<(&str, &str, Vec<usize>)> = vec![
        ("create", "1 write", vec![]),
        ("replay", "1 request", vec![]),
        ("conflict", "1 request", vec![]),
        ("claim", "1 conditional write", vec![]),
        ("completion (winner)", "1 conditional write", vec![]),
        ("completion (race loss)", "1 conditional write", vec![]),
        ("job cancel", "1 conditional write", vec![]),
        ("create, repeated", "(answer lost: +1)", vec![]),
        ("claim, repeated", "(answer lost: +1)", vec![]),
        ("completion, repeated", "(answer lost: +1)", vec![]),
    ];
    let mut timings: Vec<Vec<Duration>> = vec![Vec::new(); costs.len()];
    let mut record = |i: usize, (requests, took): (usize, Duration)| {
        costs[i].2.push(requests);
        timings[i].push(took);
    };
    let at = |token: &WriteToken| Stamp::new(token.clone(), now);
    let fresh = async |key: String| {
        let new = intent(&owner, &key, "x");
        let id = JobId::derive(&owner, &new.idempotency_key, now);
        store
            .create_job(new, RETENTION, &Stamp::fresh(now))
            .await
            .unwrap();
        id
    };
    for r in 0..reps {
        let new = intent(&owner, &format!("cost-{r}"), "x");
        let id = JobId::derive(&owner, &new.idempotency_key, now);
        let create = WriteToken::new();
        record(
            0,
            counted(
                &counter,
                store.create_job(new.clone(), RETENTION, &at(&create)),
            )
            .await,
        );
        record(
            7,
            counted(
                &counter,
                store.create_job(new.clone(), RETENTION, &at(&create)),
            )
            .await,
        );
        record(
            1,
            counted(
                &counter,
                store.create_job(new, RETENTION, &Stamp::fresh(now)),
            )
            .await,
        );
        let other = intent(&owner, &format!("cost-{r}"), "y");
        record(
            2,
            counted(
                &counter,
                store.create_job(other, RETENTION, &Stamp::fresh(now)),
            )
            .await,
        );
        let claim = WriteToken::new();
        record(
            3,
            counted(&counter, store.claim_attempt(&id, 1, lease, &at(&claim))).await,
        );
        record(
            8,
            counted(&counter, store.claim_attempt(&id, 1, lease, &at(&claim))).await,
        );

        let win = fresh(format!("win-{r}")).await;
        let step = WriteToken::new();
        store
            .claim_attempt(&win, 1, lease, &at(&step))
            .await
            .unwrap();
        let result = json!({"summary": "w"});
        let stamp = at(&step);
        let completion =
            store.complete_attempt(&win, 1, result.clone(), CallReport::default(), &stamp);
        record(4, counted(&counter, completion).await);
        let completion = store.complete_attempt(&win, 1, result, CallReport::default(), &stamp);
        record(9, counted(&counter, completion).await);

        // The loser: its job was cancelled (the slot taken) while it ran.
        let lose = fresh(format!("lose-{r}")).await;
        let step = WriteToken::new();
        store
            .claim_attempt(&lose, 1, lease, &at(&step))
            .await
            .unwrap();
        store
            .cancel_job(&owner, &lose, &Stamp::fresh(now))
            .await
            .unwrap();
        let result = json!({"summary": "l"});
        let stamp = at(&step);
        let completion = store.complete_attempt(&lose, 1, result, CallReport::default(), &stamp);
        record(5, counted(&counter, completion).await);

        let cancel = fresh(format!("cancel-{r}")).await;
        record(
            6,
            counted(
                &counter,
                store.cancel_job(&owner, &cancel, &Stamp::fresh(now)),
            )
            .await,
        );
    }
    println!(
        "dynamo-cost: {reps} repetitions each, {preload_n} jobs preloaded, moto at {endpoint}"
    );
    println!(
        "  {:<24} {:>9} {:>22} {:>10}",
        "operation", "requests", "budget", "p50 ms"
    );
    for ((name, budget, counts), mut times) in costs.into_iter().zip(timings) {
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        let requests = if min == max {
            min.to_string()
        } else {
            format!("{min}-{max}")
        };
        let (p50, _, _) = percentiles(&mut times);
        println!("  {name:<24} {requests:>9} {budget:>22} {p50:>10.2}");
    }
}
