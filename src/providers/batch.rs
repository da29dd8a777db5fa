//! The batch lane: a provider with `batch = true` makes each call through its batch API (OpenAI's Batch API,
//! Anthropic's Message Batches) as a batch of the one request, under the attempt's identity as its `custom_id`. The
//! kinds say how a batch is submitted, read, listed and its result found ([`BatchApi`]); this module is what they
//! share: the call ([`call`]: submit, then read the batch until it ends, the batch's id left for the attempt) and
//! the lookup ([`look_up`]: by the batch's id, or — for a submit whose answer was lost — by listing the provider's
//! batches and matching, never by submitting again).
//!
//! A batch takes minutes to hours: its attempt is usually still in its batch at its time-out, and goes `unknown`
//! with the batch's id; the reconciler then reads the batch at each sweep until it ends, and its result is the
//! attempt's late answer.

use async_trait::async_trait;
use serde_json::Value;

use super::{Asked, CallName, Lookup, ProviderOutcome, ProviderRequest, Reply};
use crate::clock::Clock;
use crate::domain::Timestamp;

/// The longest id of a call kept on its attempt (a background response's, a batch's: OpenAI's and Anthropic's are
/// under 64 characters).
pub(crate) const MAX_CALL_ID: usize = 256;

/// How far a provider's clock may be from ours: a batch created this long before its call started, or after its
/// worker stopped listening, may still be the call's. (A provider's clock further off makes a lost submit look
/// absent: NTP keeps both within seconds.)
const CLOCK_SKEW_S: i64 = 300;

/// The most pages of the provider's batches a lookup reads for a submit whose answer was lost.
const MAX_PAGES: usize = 20;

/// How long a call waits before its read `n` (0 the first, after the create or submit) of what it created: a
/// quarter of a second, doubled each time up to `cap_ms`.
pub(crate) fn poll_wait(n: u32, cap_ms: i64) -> chrono::Duration {
    chrono::Duration::milliseconds((250_i64 << n.min(8)).min(cap_ms))
}

/// The longest wait between two reads of a batch: batches take minutes to hours.
const BATCH_POLL_CAP_MS: i64 = 30_000;

/// An attempt's `custom_id` in its batch: its identity (`<job id>:<n>`) in the characters Anthropic allows
/// (`^[a-zA-Z0-9_-]{1,64}$`), the `:` made `_` (one-to-one: the attempt's number, after the last `_`, has none).
pub(crate) fn custom_id(request: &ProviderRequest) -> String {
    request.idempotency_key.replace(':', "_")
}

/// Whether a batch listed may be the one a call submitted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ours {
    /// It is.
    Yes,
    /// It cannot be told yet (Anthropic shows a batch's requests only once it has ended).
    Maybe,
    No,
}

/// A page of the provider's batches, newest first.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Page {
    pub batches: Vec<Value>,
    /// Where the next page starts (the last batch's id), if there is one.
    pub next: Option<String>,
}

impl Page {
    /// A page as both APIs list it (`data`, `has_more`, `last_id`). One that says more follow but names no
    /// `last_id` goes on from its last batch's id; one that says more follow and lists nothing cannot be read on.
    pub(crate) fn of(listed: &Value) -> Result<Self, crate::domain::ErrorInfo> {
        let batches = listed["data"].as_array().cloned().unwrap_or_default();
        let next = match listed["has_more"] == true {
            false => None,
            true => (listed["last_id"].as_str())
                .or_else(|| batches.last().and_then(|b| b["id"].as_str()))
                .map(str::to_owned)
                .ok_or_else(|| {
                    crate::domain::ErrorInfo::new(
                        "bad_response",
                        format!(
                            "a page of batches with more to come and no way on: {}",
                            super::unread(&listed.to_string())
                        ),
                    )
                })
                .map(Some)?,
        };
        Ok(Self { batches, next })
    }
}

/// What a kind's batch API does, as its reference says.
#[async_trait]
pub(crate) trait BatchApi: Send + Sync {
    /// Submits a batch of `request` alone under `custom_id`: the batch's id, or the reply that says why not (lost,
    /// where the submit may have landed).
    async fn submit(&self, request: &ProviderRequest, custom_id: &str) -> Result<String, Reply>;

    /// The batch named `id`, as it is now.
    async fn read(&self, id: &str) -> Result<Value, Reply>;

    /// Whether `batch` has ended: its results are final.
    fn ended(&self, batch: &Value) -> bool;

    /// What the ended `batch` did with the request under `custom_id`: its answer (or a definite failure: expired,
    /// refused) as [`Lookup::Found`], [`Lookup::Ended`] if it was cancelled before its work.
    async fn result(&self, batch: &Value, custom_id: &str) -> Lookup;

    /// A page of the provider's batches, newest first, from `after` (the previous page's last batch).
    async fn page(&self, after: Option<&str>) -> Result<Page, Reply>;

    /// When `batch` was created, by the provider's clock.
    fn created_at(&self, batch: &Value) -> Option<Timestamp>;

    /// Whether `batch` is the one submitted for `request` under `custom_id`.
    async fn is_ours(
        &self,
        batch: &Value,
        request: &ProviderRequest,
        custom_id: &str,
    ) -> Result<Ours, Reply>;
}

/// A create or submit the provider answered 2xx — so its work was taken, and will be done and billed — whose
/// answer names it by no id onejob can keep: as good as lost, to be found by asking (never a failure, which would
/// pay for the work again).
pub(crate) fn unnamed(text: &str) -> Reply {
    ProviderOutcome::Lost(crate::domain::ErrorInfo::new(
        "bad_response",
        format!(
            "taken, but named by no id onejob can keep: {}",
            super::unread(text)
        ),
    ))
    .into()
}

/// The id a create or submit answered with, if onejob can keep it and read by it: not empty, not longer than any
/// provider's, and a plain path segment (letters, digits, `-`, `_`, `.`; not `.` or `..`, which a URL would fold
/// into another resource).
pub(crate) fn batch_id(answered: &str) -> Option<String> {
    let created = serde_json::from_str::<Value>(answered).ok()?;
    let id = created["id"].as_str()?;
    let plain = id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let usable = !id.is_empty() && id.len() <= MAX_CALL_ID && plain && id != "." && id != "..";
    usable.then(|| id.to_owned())
}

/// One call through the batch lane: `request` submitted as a batch of its own, its id left in `named`, then the
/// batch read at once and after each [`poll_wait`] until it ends, and its result read. A read that goes wrong is
/// harmless (the batch goes on at the provider); only the submit decides whether the work may have been done with
/// no answer (a submit lost after sending).
pub(crate) async fn call(
    api: &dyn BatchApi,
    clock: &dyn Clock,
    request: &ProviderRequest,
    named: &CallName,
) -> Reply {
    let custom_id = custom_id(request);
    let id = match api.submit(request, &custom_id).await {
        Ok(id) => id,
        Err(reply) => return reply,
    };
    let _ = named.set(id.clone());
    let mut reads = 0;
    loop {
        if reads > 0 {
            clock.sleep(poll_wait(reads - 1, BATCH_POLL_CAP_MS)).await;
        }
        reads = reads.saturating_add(1);
        let batch = match api.read(&id).await {
            Ok(batch) if api.ended(&batch) => batch,
            Ok(_) => continue,
            Err(reply) => {
                tracing::info!(batch = id, ?reply.outcome, "a batch's read went wrong: read again");
                continue;
            }
        };
        match api.result(&batch, &custom_id).await {
            Lookup::Found(reply) => return *reply,
            Lookup::Ended => return super::cancelled_at_provider("batch"),
            looked => {
                tracing::info!(
                    batch = id,
                    ?looked,
                    "a batch's result could not be read: read again"
                );
            }
        }
    }
}

/// What the provider says of the batch a call submitted: by its id where the attempt kept it, else found by
/// listing the batches created since the call started.
pub(crate) async fn look_up(
    api: &dyn BatchApi,
    request: &ProviderRequest,
    asked: Asked<'_>,
) -> Lookup {
    let custom_id = custom_id(request);
    let batch = match asked.call_id {
        Some(id) => api.read(id).await,
        None => match find(api, request, &custom_id, asked).await {
            Ok(Search::Found(batch)) => Ok(batch),
            Ok(Search::Maybe) => return Lookup::Running,
            Ok(Search::None) => return Lookup::NotFound,
            Err(reply) => Err(reply),
        },
    };
    match batch {
        Ok(batch) if api.ended(&batch) => api.result(&batch, &custom_id).await,
        Ok(_) => Lookup::Running,
        Err(reply) => Lookup::unanswered(reply),
    }
}

/// What a search of the provider's batches came to.
enum Search {
    Found(Value),
    /// One may be it but cannot be told yet, or there were more batches than a lookup reads.
    Maybe,
    None,
}

/// Searches the batches created while the call could have submitted one (from its start to its worker's end, give
/// or take the clock skew), newest first, for the one submitted for `request` under `custom_id`.
async fn find(
    api: &dyn BatchApi,
    request: &ProviderRequest,
    custom_id: &str,
    asked: Asked<'_>,
) -> Result<Search, Reply> {
    let skew = chrono::Duration::seconds(CLOCK_SKEW_S);
    let (oldest, newest) = (asked.since - skew, asked.until.map(|until| until + skew));
    let mut found = Search::None;
    let mut after: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let page = api.page(after.as_deref()).await?;
        for batch in page.batches {
            let created = api.created_at(&batch);
            if created.is_some_and(|created| created < oldest) {
                return Ok(found);
            }
            if created
                .zip(newest)
                .is_some_and(|(created, newest)| created > newest)
            {
                continue;
            }
            // A batch that cannot be told (its results unreadable: another's, archived, a 5xx) may be it; the search
            // goes on to the others, one of which may be.
            match api.is_ours(&batch, request, custom_id).await {
                Ok(Ours::Yes) => return Ok(Search::Found(batch)),
                Ok(Ours::Maybe) | Err(_) => found = Search::Maybe,
                Ok(Ours::No) => {}
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(found),
        }
    }
    Ok(Search::Maybe)
}

/// The line of a batch's results (JSONL) under `custom_id`.
pub(crate) fn line_of(results: &str, custom_id: &str) -> Option<Value> {
    results
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["custom_id"] == custom_id)
}

/// A batch that ended without doing the request: expired (not run in its window) or failed as a whole (refused
/// at validation). Definite: nothing was done, nothing is billed.
pub(crate) fn not_run(code: &str, message: impl Into<String>) -> Lookup {
    Lookup::Found(Box::new(Reply::failed(code, message)))
}

/// An ended batch whose results hold nothing for the request: final (an ended batch's results do not change), so
/// a definite failure — not a question to ask again forever.
pub(crate) fn no_result() -> Lookup {
    Lookup::Found(Box::new(Reply::failed(
        "bad_response",
        "the batch ended with no result for the request",
    )))
}

/// A reply from a step of the lane that does no paid work (a file uploaded): whatever went wrong, nothing was
/// submitted — lost is failed (`connection_failed`: safe to try again).
pub(crate) fn nothing_submitted(reply: Reply) -> Reply {
    match reply.outcome {
        ProviderOutcome::Lost(error) => Reply::failed(
            "connection_failed",
            format!("nothing was submitted: {}", error.message),
        ),
        _ => reply,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ContractRef;
    use serde_json::json;

    fn request(key: &str) -> ProviderRequest {
        ProviderRequest {
            idempotency_key: key.into(),
            contract: ContractRef::parse("summarize@1").unwrap(),
            prompt: String::new(),
            input: Value::Null,
            output_schema: Value::Null,
            temperature: 0.0,
            max_output_tokens: 1,
        }
    }

    #[test]
    fn an_attempts_custom_id_is_in_anthropics_characters_and_names_it_alone() {
        let id = custom_id(&request("01JD4ZQ7-job_a:12"));
        assert_eq!(id, "01JD4ZQ7-job_a_12");
        assert!(
            id.len() <= 64
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        );
        // The number is after the last `_`: the job and the attempt come back whole.
        assert_eq!(id.rsplit_once('_'), Some(("01JD4ZQ7-job_a", "12")));
    }

    #[test]
    fn a_result_is_its_custom_ids_line_and_reads_wait_longer_up_to_their_cap() {
        let results =
            "{\"custom_id\":\"a_1\",\"n\":1}\nnot json\n{\"custom_id\":\"a_2\",\"n\":2}\n";
        assert_eq!(line_of(results, "a_2").unwrap()["n"], 2);
        assert_eq!(line_of(results, "a_3"), None);
        let waits: Vec<i64> = (0..12)
            .map(|n| poll_wait(n, 30_000).num_milliseconds())
            .collect();
        assert_eq!(&waits[..4], [250, 500, 1_000, 2_000]);
        assert_eq!(waits[11], 30_000);
        assert_eq!(poll_wait(5, 2_000).num_milliseconds(), 2_000);
        assert_eq!(batch_id("{\"id\":\"\"}"), None);
        assert_eq!(
            batch_id(&format!("{{\"id\":\"{}\"}}", "b".repeat(257))),
            None
        );
        assert_eq!(batch_id("{\"id\":\"batch_1\"}").as_deref(), Some("batch_1"));
        for unusable in ["..", ".", "a/b", "a b", "é", "a?b"] {
            assert_eq!(
                batch_id(&json!({"id": unusable}).to_string()),
                None,
                "{unusable}"
            );
        }
    }

    #[test]
    fn a_page_that_says_more_follow_goes_on_from_its_last_batch_or_cannot_be_read_on() {
        let named = Page::of(
            &json!({"data": [{"id": "b2"}, {"id": "b1"}], "has_more": true, "last_id": "b1"}),
        );
        assert_eq!(named.unwrap().next.as_deref(), Some("b1"));
        let unnamed = Page::of(&json!({"data": [{"id": "b2"}, {"id": "b1"}], "has_more": true}));
        assert_eq!(unnamed.unwrap().next.as_deref(), Some("b1"));
        assert!(Page::of(&json!({"data": [], "has_more": true})).is_err());
        assert_eq!(Page::of(&json!({"data": []})).unwrap().next, None);
    }

    /// Batches listed newest first, each ours, not, or unreadable.
    struct Listed(Vec<(Value, Result<Ours, ()>)>);

    #[async_trait]
    impl BatchApi for Listed {
        async fn submit(&self, _: &ProviderRequest, _: &str) -> Result<String, Reply> {
            unreachable!("a lookup never submits")
        }
        async fn read(&self, _: &str) -> Result<Value, Reply> {
            unreachable!("no id kept")
        }
        fn ended(&self, _: &Value) -> bool {
            true
        }
        async fn result(&self, _: &Value, _: &str) -> Lookup {
            Lookup::Found(Box::new(Reply::failed("found", "the one")))
        }
        async fn page(&self, _: Option<&str>) -> Result<Page, Reply> {
            let batches = self.0.iter().map(|(b, _)| b.clone()).collect();
            Ok(Page {
                batches,
                next: None,
            })
        }
        fn created_at(&self, batch: &Value) -> Option<Timestamp> {
            chrono::DateTime::from_timestamp(batch["at"].as_i64()?, 0)
        }
        async fn is_ours(
            &self,
            batch: &Value,
            _: &ProviderRequest,
            _: &str,
        ) -> Result<Ours, Reply> {
            let (_, ours) = (self.0.iter()).find(|(b, _)| b == batch).unwrap();
            ours.clone()
                .map_err(|()| Reply::failed("provider_refused", "HTTP 404: results gone"))
        }
    }

    #[tokio::test]
    async fn a_lost_submit_is_searched_past_batches_that_cannot_be_told_and_outside_the_calls_window()
     {
        let at = |s: i64| json!({"at": 1_800_000_000 + s});
        let asked = Asked {
            call_id: None,
            since: chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
            until: chrono::DateTime::from_timestamp(1_800_000_100, 0),
        };
        let request = request("job:1");
        let found = |looked: Lookup| matches!(looked, Lookup::Found(reply) if crate::providers::failure_code(&reply) == "found");
        // A newer batch whose results cannot be read does not stop the search: the call's own is further down.
        let api = Listed(vec![(at(90), Err(())), (at(50), Ok(Ours::Yes))]);
        assert!(found(look_up(&api, &request, asked).await));
        // Unreadable, and nothing else: it may be it — waited on, never "not found".
        let api = Listed(vec![(at(90), Err(())), (at(50), Ok(Ours::No))]);
        assert_eq!(look_up(&api, &request, asked).await, Lookup::Running);
        // Batches made after the call's window, or long before it, are not asked about.
        let api = Listed(vec![
            (at(100 + 2 * CLOCK_SKEW_S), Ok(Ours::Maybe)),
            (at(-2 * CLOCK_SKEW_S), Ok(Ours::Maybe)),
        ]);
        assert_eq!(look_up(&api, &request, asked).await, Lookup::NotFound);
    }
}
