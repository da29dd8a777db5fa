//! A job's bill: every answer paid for is in it, by what became of it; a call whose usage is not known is listed as
//! unknown, never counted as free.

use serde_json::json;

use super::*;

/// A report of `input` prompt tokens (`cached` of them from the cache) and `output` answer tokens, priced.
fn usage(input: u64, cached: u64, output: u64) -> CallReport {
    let mut report = CallReport {
        input_tokens: Some(input),
        output_tokens: Some(output),
        cached_input_tokens: Some(cached),
        ..CallReport::default()
    };
    report.cost_nanos = PRICE.cost_nanos(&report);
    report
}

/// $2 a million prompt tokens, $0.50 a million cached, $8 a million answer tokens.
const PRICE: Price = Price {
    input: 2.0,
    output: 8.0,
    cached_input: Some(0.5),
};

#[test]
fn a_price_per_million_tokens_is_billionths_per_token() {
    // 1,000 fresh prompt tokens at $2/M = $0.002; 500 cached at $0.50/M = $0.00025; 100 answer tokens at $8/M =
    // $0.0008: $0.00305.
    assert_eq!(usage(1_500, 500, 100).cost_nanos, Some(3_050_000));
    assert_eq!(
        PRICE.cost_nanos(&CallReport::default()),
        None,
        "no usage, no cost"
    );
    let uncached = Price {
        cached_input: None,
        ..PRICE
    };
    assert_eq!(uncached.cost_nanos(&usage(1_500, 500, 0)), Some(3_000_000));
    assert!(
        Price {
            input: -1.0,
            ..PRICE
        }
        .check()
        .is_err()
    );
    assert!(
        Price {
            output: f64::NAN,
            ..PRICE
        }
        .check()
        .is_err()
    );
}

/// The race of breakpoint 4: A leaves first and answers last, B wins. Both answers were paid for; the bill shows
/// both, one kept, and nothing unknown.
#[test]
fn a_losing_answer_is_billed_beside_the_winner() {
    let mut job = job();
    job.claim(1, at(10_000), &by(1)).unwrap();
    job.mark_unknown(1, None, &by(2)).unwrap();
    let mut pending = Bill::of(&job);
    assert_eq!(pending.unknown, [1], "no answer yet: its cost is not known");
    assert!(!pending.complete());
    job.cancel_attempt(1, &to(&["b"]), &by(3)).unwrap();
    pending = Bill::of(&job);
    assert_eq!(
        pending.unknown,
        [1],
        "cancelled after its call began: still unknown"
    );
    job.claim(2, at(20_000), &by(4)).unwrap();
    job.complete(2, json!({"s": "b"}), usage(1_000, 0, 50), &by(5))
        .unwrap();
    job.complete(1, json!({"s": "a"}), usage(2_000, 0, 70), &by(6))
        .unwrap();
    let bill = Bill::of(&job);
    assert_eq!((bill.won.attempts, bill.won.input_tokens), (1, 1_000));
    assert_eq!(
        (bill.discarded.attempts, bill.discarded.input_tokens),
        (1, 2_000)
    );
    assert!(bill.complete(), "{bill:?}");
    assert_eq!(
        bill.total().cost_nanos,
        bill.won.cost_nanos + bill.discarded.cost_nanos
    );
    assert_eq!(bill.total().cost_nanos, 2_400_000 + 4_560_000);
}

#[test]
fn an_answer_that_broke_the_contract_is_billed_as_failed_and_an_unpriced_one_is_said() {
    let mut job = job();
    job.claim(1, at(10_000), &by(1)).unwrap();
    let broke = ErrorInfo::new("output_invalid", "extra key");
    job.fail(1, broke, usage(100, 0, 10), &to(&["b"]), &by(2))
        .unwrap();
    job.claim(2, at(20_000), &by(3)).unwrap();
    let unpriced = CallReport {
        input_tokens: Some(100),
        output_tokens: Some(10),
        ..CallReport::default()
    };
    job.complete(2, json!({"s": "b"}), unpriced, &by(4))
        .unwrap();
    let bill = Bill::of(&job);
    assert_eq!(bill.failed.attempts, 1);
    assert_eq!(bill.failed.cost_nanos, 280_000);
    assert_eq!(bill.won.input_tokens, 100, "tokens counted without a price");
    assert_eq!(bill.unpriced, [2]);
    assert!(!bill.complete());
    // A queued attempt never called costs nothing and is not unknown.
    assert!(Bill::of(&super::job()).complete());
}
