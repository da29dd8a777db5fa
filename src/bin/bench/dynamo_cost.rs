//! Store requests per operation on DynamoDB, counted at the SDK's interceptor.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use onejob::domain::{CallReport, Job, JobId, Owner, Stamp, WriteToken};
use onejob::store::JobStore;
use onejob::store::dynamodb::{DynamoStore, WriteUnits, item_size, write_units};
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

/// `write-units`: the write capacity units of one job's lifecycle (create, claim, completion) on DynamoDB, by the
/// sizing rules `onejob::store::dynamodb::write_units` states, at each input size and kind.
pub(super) fn write_units_per_lifecycle() {
    println!(
        "write units per job lifecycle (DynamoDB sizing rules; table + by_owner + sweep index entries)"
    );
    println!(
        "  {:<20} {:>10} {:>22} {:>22} {:>22} {:>8} {:>18}",
        "input", "item bytes", "create", "claim", "completion", "total", "create encode µs"
    );
    for kind in [Text::Prose, Text::Base64] {
        for kib in [1usize, 64] {
            let owner = Owner::parse("alice").unwrap();
            let new = Job::new(
                intent(&owner, "units", &kind.text(kib * 1024)),
                RETENTION,
                &Stamp::fresh(at(0)),
            );
            let mut claimed = new.clone();
            claimed.claim(1, at(60_000), &Stamp::fresh(at(1))).unwrap();
            let mut done = claimed.clone();
            let report = CallReport::default();
            done.complete(
                1,
                json!({"summary": "s".repeat(200)}),
                report,
                &Stamp::fresh(at(2)),
            )
            .unwrap();
            let steps = [
                write_units(None, &new),
                write_units(Some(&new), &claimed),
                write_units(Some(&claimed), &done),
            ];
            let show =
                |u: WriteUnits| format!("{} ({}+{}+{})", u.total(), u.table, u.by_owner, u.sweep);
            // What the create spends making its items (the input deflated), the fastest of 50.
            let encode = (0..50)
                .map(|_| {
                    let started = Instant::now();
                    std::hint::black_box(write_units(None, &new));
                    started.elapsed()
                })
                .min()
                .unwrap_or_default();
            println!(
                "  {:<20} {:>10} {:>22} {:>22} {:>22} {:>8} {:>18.1}",
                format!("{kib} KiB {}", kind.name()),
                item_size(&done),
                show(steps[0]),
                show(steps[1]),
                show(steps[2]),
                steps.iter().map(|u| u.total()).sum::<u64>(),
                encode.as_secs_f64() * 1e6
            );
        }
    }
}

/// What an input's text is made of: it decides how far the store's deflate takes it.
#[derive(Clone, Copy)]
enum Text {
    /// English prose: this project's own docs.
    Prose,
    /// What base64 of random bytes (an image, say) looks like: 6 bits a character.
    Base64,
}

impl Text {
    fn name(self) -> &'static str {
        match self {
            Self::Prose => "prose",
            Self::Base64 => "base64",
        }
    }

    /// A text that makes the input `{"text": …}` exactly `bytes` bytes of JSON (give or take an escape).
    fn text(self, bytes: usize) -> String {
        const DOCS: &str = concat!(
            include_str!("../../../docs/decisions.md"),
            include_str!("../../../docs/api.md"),
            include_str!("../../../docs/design.md"),
            include_str!("../../../docs/deploy.md"),
            include_str!("../../../docs/dynamodb.md"),
        );
        const BASE64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut random = std::iter::from_fn(|| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            Some(char::from(BASE64[(state % 64) as usize]))
        });
        let chars: &mut dyn Iterator<Item = char> = match self {
            Self::Prose => &mut DOCS.chars(),
            Self::Base64 => &mut random,
        };
        let mut len = r#"{"text":""}"#.len();
        let mut text = String::new();
        for c in chars {
            len += serde_json::to_string(&c).unwrap().len() - 2;
            if len > bytes {
                break;
            }
            text.push(c);
        }
        text
    }
}

fn at(ms: i64) -> onejob::domain::Timestamp {
    chrono::DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
}
