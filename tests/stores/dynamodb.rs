//! The store conformance suite (and the engine's suite) on the DynamoDB store, against a real DynamoDB-compatible
//! server (moto, started by `scripts/test`), each test on its own table; plus the request budget (`docs/design.md`).

use std::sync::Arc;

use crate::conformance::{Fixture, RETENTION, at, by, new_job};
use crate::support::aws::{
    RequestCounter, WireFault, sdk_config, stack_table, table_for_test, unique_name,
};
use onejob::domain::{CallReport, Completion, Fingerprint, JobCancel};
use onejob::store::dynamodb::DynamoStore;
use onejob::store::{CreateOutcome, JobStore, ListQuery, ProviderStore};
use serde_json::json;

/// A store on a fresh table, and the counter of the requests its client sends.
async fn dynamodb_counted() -> Option<(DynamoStore, RequestCounter)> {
    dynamodb_on_table()
        .await
        .map(|(store, counter, _)| (store, counter))
}

/// [`dynamodb_counted`], with a client (uncounted) that reads the table behind the store's back.
async fn dynamodb_on_table() -> Option<(DynamoStore, RequestCounter, TableReader)> {
    let config = sdk_config().await?;
    let counter = RequestCounter::default();
    let (store, reader) = store_with(&config, counter.clone()).await;
    assert!(
        !store.create_table().await.unwrap(),
        "creating it again does nothing"
    );
    Some((store, counter, reader))
}

/// A store on a fresh table whose client runs `interceptor`, and a reader of that table that does not.
async fn store_with(
    config: &aws_config::SdkConfig,
    interceptor: impl aws_sdk_dynamodb::config::Intercept + 'static,
) -> (DynamoStore, TableReader) {
    let client_config = aws_sdk_dynamodb::config::Builder::from(config)
        .interceptor(interceptor)
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(client_config);
    let table = unique_name("onejob");
    table_for_test(&client, &table).await;
    let reader = TableReader {
        client: aws_sdk_dynamodb::Client::new(config),
        table: table.clone(),
    };
    (DynamoStore::new(client, table), reader)
}

struct TableReader {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl TableReader {
    /// The keys of every item in the table.
    async fn keys(&self) -> Vec<String> {
        let out = self
            .client
            .scan()
            .table_name(&self.table)
            .send()
            .await
            .unwrap();
        let mut keys: Vec<String> = out
            .items()
            .iter()
            .map(|item| item["pk"].as_s().unwrap().clone())
            .collect();
        keys.sort();
        keys
    }
}

async fn dynamodb() -> Option<Fixture> {
    let (store, _) = dynamodb_counted().await?;
    Some(Fixture {
        store: Arc::new(store),
        model_cases: 12,
        long_owner_creates: 150,
        _keep: Box::new(()),
    })
}

crate::conformance_suite!(dynamodb());

#[tokio::test]
async fn a_store_arming_every_job_arms_without_an_endpoint() {
    let Some((store, _)) = dynamodb_counted().await else {
        return;
    };
    crate::conformance::a_store_arming_every_job_arms_without_an_endpoint(Arc::new(
        store.arming_every_job(true),
    ))
    .await;
}

/// The request budget: create 1, replay 1, conflict 1, claim 1, time-out 1, completion 1 (winner and loser), cancel 1.
#[tokio::test]
async fn each_operation_costs_the_requests_the_spec_budgets() {
    let Some((store, counter)) = dynamodb_counted().await else {
        return;
    };
    let spent = |expected: usize, what: &str, last: &mut usize| {
        let now = counter.count();
        assert_eq!(now - *last, expected, "{what}");
        *last = now;
    };
    let mut last = counter.count();

    let CreateOutcome::Created(a) = store
        .create_job(
            new_job("alice", "a", json!({"text": "a"})),
            RETENTION,
            &by(0),
        )
        .await
        .unwrap()
    else {
        panic!("expected a new job")
    };
    spent(1, "create", &mut last);
    let replay = store
        .create_job(
            new_job("alice", "a", json!({"text": "a"})),
            RETENTION,
            &by(1),
        )
        .await
        .unwrap();
    assert!(matches!(replay, CreateOutcome::Replayed(_)));
    spent(1, "replay", &mut last);
    let conflict = store
        .create_job(
            new_job("alice", "a", json!({"text": "other"})),
            RETENTION,
            &by(1),
        )
        .await
        .unwrap();
    assert!(matches!(conflict, CreateOutcome::Conflict(_)));
    spent(1, "conflict", &mut last);

    store
        .claim_attempt(&a.id, 1, at(60_000), &by(2))
        .await
        .unwrap();
    spent(1, "claim", &mut last);
    store.mark_unknown(&a.id, 1, None, &by(3)).await.unwrap();
    spent(1, "mark unknown", &mut last);
    let (won, _) = store
        .complete_attempt(&a.id, 1, json!({"summary": "a"}), usage(), &by(4))
        .await
        .unwrap();
    assert_eq!(won, Completion::Won);
    spent(1, "completion (winner)", &mut last);

    let b = store
        .create_job(
            new_job("alice", "b", json!({"text": "b"})),
            RETENTION,
            &by(0),
        )
        .await
        .unwrap()
        .job()
        .clone();
    store
        .claim_attempt(&b.id, 1, at(60_000), &by(2))
        .await
        .unwrap();
    last = counter.count();
    let (cancelled, _) = store.cancel_job(&b.owner, &b.id, &by(3)).await.unwrap();
    assert_eq!(cancelled, JobCancel::Cancelled);
    spent(1, "cancel", &mut last);
    let (again, _) = store.cancel_job(&b.owner, &b.id, &by(4)).await.unwrap();
    assert_eq!(again, JobCancel::AlreadyCancelled);
    spent(1, "cancel again", &mut last);
    let (lost, _) = store
        .complete_attempt(&b.id, 1, json!({"summary": "late"}), usage(), &by(5))
        .await
        .unwrap();
    assert_eq!(lost, Completion::Lost { winner: None });
    spent(1, "completion (loser)", &mut last);
    // The failover gate's question: one read.
    let fingerprint = Fingerprint::of_value(&json!("any"));
    let none = store
        .qualification(&fingerprint, &fingerprint)
        .await
        .unwrap();
    assert_eq!(none, None);
    spent(1, "qualification lookup", &mut last);
}

/// A large input is written once, in an item of its own: its create costs a read and two writes, its replay one
/// read and nothing written, and each transition one write plus the read of the input for the answer; the table
/// then holds the job and its input, nothing more.
#[tokio::test]
async fn a_large_input_is_written_once() {
    let Some((store, counter, table)) = dynamodb_on_table().await else {
        return;
    };
    let spent = |expected: usize, what: &str, last: &mut usize| {
        let now = counter.count();
        assert_eq!(now - *last, expected, "{what}");
        *last = now;
    };
    let input = json!({"text": "x".repeat(64 * 1024)});
    let new = || new_job("alice", "large", input.clone());
    let mut last = counter.count();
    let job = store
        .create_job(new(), RETENTION, &by(0))
        .await
        .unwrap()
        .job()
        .clone();
    spent(3, "create", &mut last);
    let replay = store.create_job(new(), RETENTION, &by(1)).await.unwrap();
    assert!(matches!(&replay, CreateOutcome::Replayed(j) if j.input == input));
    spent(1, "replay", &mut last);
    let claimed = store
        .claim_attempt(&job.id, 1, at(60_000), &by(2))
        .await
        .unwrap();
    assert_eq!(claimed.input, input);
    spent(2, "claim", &mut last);
    let (won, done) = store
        .complete_attempt(&job.id, 1, json!({"summary": "a"}), usage(), &by(3))
        .await
        .unwrap();
    assert_eq!((won, &done.input), (Completion::Won, &input));
    spent(2, "completion", &mut last);

    let keys = table.keys().await;
    assert_eq!(keys.len(), 2, "the job and its input: {keys:?}");

    // A listing for bills (usage) reads the job, never its input kept apart: one query, one read.
    let query = ListQuery {
        status: None,
        limit: 10,
        cursor: None,
        created_before: None,
    };
    let owner = onejob::domain::Owner::parse("alice").unwrap();
    let bills = store
        .list_bills(&owner, &query, at(3_600_000))
        .await
        .unwrap();
    spent(2, "a listing for bills", &mut last);
    let billed = &bills.jobs[0];
    assert_eq!(
        (billed.input.clone(), billed.result.clone()),
        (json!(null), None)
    );
    assert_eq!(billed.attempts, done.attempts);
    let listed = store
        .list_jobs(&owner, &query, at(3_600_000))
        .await
        .unwrap();
    spent(3, "a listing with inputs", &mut last);
    assert_eq!(listed.jobs[0].input, input);
}

/// Invariant 11's price: a write repeated with its token after its answer was lost costs one request — the failed
/// condition returns the item, and the domain finds its own token there. Nothing is written twice.
#[tokio::test]
async fn a_repeated_write_costs_one_request_and_writes_nothing() {
    let Some((store, counter)) = dynamodb_counted().await else {
        return;
    };
    let spent = |expected: usize, what: &str, last: &mut usize| {
        let now = counter.count();
        assert_eq!(now - *last, expected, "{what}");
        *last = now;
    };
    let create = by(0);
    let new = || new_job("alice", "a", json!({"text": "a"}));
    let job = store
        .create_job(new(), RETENTION, &create)
        .await
        .unwrap()
        .job()
        .clone();
    let mut last = counter.count();
    let again = store.create_job(new(), RETENTION, &create).await.unwrap();
    assert_eq!(again, CreateOutcome::Created(job.clone()));
    spent(1, "create, repeated", &mut last);

    let claim = by(1);
    let claimed = store
        .claim_attempt(&job.id, 1, at(60_000), &claim)
        .await
        .unwrap();
    last = counter.count();
    assert_eq!(
        store
            .claim_attempt(&job.id, 1, at(60_000), &claim)
            .await
            .unwrap(),
        claimed
    );
    spent(1, "claim, repeated", &mut last);

    let complete = by(2);
    let (won, done) = store
        .complete_attempt(&job.id, 1, json!({"summary": "a"}), usage(), &complete)
        .await
        .unwrap();
    last = counter.count();
    let repeated = store
        .complete_attempt(&job.id, 1, json!({"summary": "a"}), usage(), &complete)
        .await
        .unwrap();
    assert_eq!((won, repeated), (Completion::Won, (Completion::Won, done)));
    spent(1, "completion, repeated", &mut last);
}

fn usage() -> CallReport {
    CallReport {
        model: Some("m".into()),
        input_tokens: Some(40),
        output_tokens: Some(5),
        ..CallReport::default()
    }
}

/// The table `template.yaml` makes (its stack created on moto's CloudFormation by `scripts/test`) is the table the
/// code makes with `onejob table create`: the same keys, attributes, indexes and projections, the same billing. (The
/// TTL, which moto's CloudFormation leaves off, is checked in the translated template by `infra/stack.py`.)
#[tokio::test]
async fn the_stack_makes_the_table_the_code_makes() {
    let Some(config) = sdk_config().await else {
        return;
    };
    let Some(stack) = stack_table() else {
        assert!(
            std::env::var("CI").is_err(),
            "ONEJOB_TEST_STACK_TABLE is not set: scripts/test creates the stack"
        );
        return;
    };
    let client = aws_sdk_dynamodb::Client::new(&config);
    let ours = unique_name("onejob-code");
    DynamoStore::new(client.clone(), &ours)
        .create_table()
        .await
        .unwrap();
    let shape = |table: aws_sdk_dynamodb::types::TableDescription| {
        let mut attributes: Vec<String> = table
            .attribute_definitions()
            .iter()
            .map(|a| format!("{} {}", a.attribute_name(), a.attribute_type()))
            .collect();
        attributes.sort();
        let keys = |schema: &[aws_sdk_dynamodb::types::KeySchemaElement]| {
            schema
                .iter()
                .map(|k| format!("{} {}", k.attribute_name(), k.key_type()))
                .collect::<Vec<_>>()
        };
        let mut indexes: Vec<String> = table
            .global_secondary_indexes()
            .iter()
            .map(|i| {
                format!(
                    "{} {:?} {:?}",
                    i.index_name().unwrap(),
                    keys(i.key_schema()),
                    i.projection().and_then(|p| p.projection_type())
                )
            })
            .collect();
        indexes.sort();
        let billing = table
            .billing_mode_summary()
            .and_then(|b| b.billing_mode().cloned());
        (attributes, keys(table.key_schema()), indexes, billing)
    };
    let describe = |name: String| {
        let client = client.clone();
        async move {
            client
                .describe_table()
                .table_name(name)
                .send()
                .await
                .unwrap()
                .table
                .unwrap()
        }
    };
    let (made, expected) = (describe(stack).await, describe(ours).await);
    assert_eq!(shape(made), shape(expected));
}

/// The create of a large input is two writes — the input's item, then the job's — and each may fail at the wire
/// either side of the store: the input's write never sent or its answer lost, the job's write never sent (the
/// caller repeats it with its token, as the engine does) or its answer lost. Every way ends with one job, created
/// by that write, holding its input, and the table holding the job and its input, nothing more.
#[tokio::test]
async fn a_large_create_that_fails_at_the_wire_is_created_once() {
    let Some(config) = sdk_config().await else {
        return;
    };
    let input_write = "\"input#";
    let job_write = "attribute_not_exists(pk)";
    for (marker, lose_answer) in [
        (input_write, false),
        (input_write, true),
        (job_write, false),
        (job_write, true),
    ] {
        let fault = WireFault::new(marker, lose_answer);
        let (store, reader) = store_with(&config, fault.clone()).await;
        let input = json!({"text": "w".repeat(8 * 1024)});
        let stamp = by(0);
        let first = store
            .create_job(new_job("alice", "wire", input.clone()), RETENTION, &stamp)
            .await;
        let case = format!("{marker} lose_answer={lose_answer}");
        assert!(fault.fired(), "{case}: the fault was not hit");
        let outcome = match first {
            Ok(outcome) => outcome,
            // Never sent: the caller repeats the create with the same token.
            Err(_) if !lose_answer => store
                .create_job(new_job("alice", "wire", input.clone()), RETENTION, &stamp)
                .await
                .unwrap(),
            Err(e) => panic!("{case}: a lost answer is the SDK's to repeat: {e}"),
        };
        let CreateOutcome::Created(job) = outcome else {
            panic!("{case}: {outcome:?}")
        };
        assert_eq!(job.input, input, "{case}");
        let read = store.get_job(&job.owner, &job.id, at(1)).await.unwrap();
        assert_eq!(read.map(|j| j.input), Some(input), "{case}");
        assert_eq!(
            reader.keys().await.len(),
            2,
            "{case}: the job and its input"
        );
    }
}
