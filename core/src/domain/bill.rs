//! What one intent cost. Each attempt keeps the usage its provider reported, even when its answer was discarded,
//! broke the contract or came late, priced by the deployment's table when it was recorded ([`Price`]); a job's
//! [`Bill`] sums them by what became of each answer. An attempt whose call may have been billed but whose usage is
//! not known (no answer yet) is listed as such: its cost is unknown, never zero.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::attempt::{Attempt, AttemptState, ClearedBy};
use super::failover::NOT_DONE;
use super::ids::ProviderName;
use super::job::Job;
use super::limits::Bound;
use super::report::CallReport;

/// A deployment's price table (`[prices]`): what providers' calls cost, in one currency, per million tokens — by
/// provider name or by model name. A call is priced when its usage is recorded (the attempt keeps its cost), so a
/// later change of the table does not re-price what was billed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PriceTable {
    /// The currency of every price (an ISO 4217 code, say): what bills, usage and metrics are in.
    pub currency: String,
    /// Per million tokens, keyed by a provider's name or its model's (a provider's own name wins).
    pub per_million: BTreeMap<String, Price>,
}

impl Default for PriceTable {
    fn default() -> Self {
        Self {
            currency: "USD".into(),
            per_million: BTreeMap::new(),
        }
    }
}

impl PriceTable {
    /// The price of `provider`'s calls (on `model`, as configured), if the table has one.
    pub fn of(&self, provider: &ProviderName, model: Option<&str>) -> Option<&Price> {
        (self.per_million.get(provider.as_str()))
            .or_else(|| model.and_then(|m| self.per_million.get(m)))
    }

    /// What `report` cost on `provider` (on `model`), in billionths of the currency; none when it reported no
    /// usage or the table has no price for it.
    pub fn cost_nanos(
        &self,
        provider: &ProviderName,
        model: Option<&str>,
        report: &CallReport,
    ) -> Option<u64> {
        self.of(provider, model)?.cost_nanos(report)
    }

    /// The checks serde cannot make.
    pub fn check(&self) -> Result<(), String> {
        if self.currency.trim().is_empty() {
            return Err("prices.currency: name the currency the prices are in".into());
        }
        for (key, price) in &self.per_million {
            price
                .check()
                .map_err(|e| format!("prices.per_million.{key}: {e}"))?;
        }
        Ok(())
    }
}

/// An amount of billionths of a currency as a number of the currency (for views: six or more decimals).
pub fn amount(nanos: u64) -> f64 {
    nanos as f64 / 1e9
}

/// What a million tokens cost, in the price table's currency.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Prompt tokens.
    pub input: f64,
    /// Answer tokens, reasoning included.
    pub output: f64,
    /// Prompt tokens read from the provider's cache; default: `input`.
    pub cached_input: Option<f64>,
}

impl Price {
    /// What `report`'s usage costs, in billionths of the currency; none when it reported no usage.
    pub fn cost_nanos(&self, report: &CallReport) -> Option<u64> {
        if report.input_tokens.is_none() && report.output_tokens.is_none() {
            return None;
        }
        let input = report.input_tokens.unwrap_or(0);
        let cached = report.cached_input_tokens.unwrap_or(0).min(input);
        let output = report.output_tokens.unwrap_or(0);
        let per_million = (input - cached) as f64 * self.input
            + cached as f64 * self.cached_input.unwrap_or(self.input)
            + output as f64 * self.output;
        // A millionth of the price per token is a thousand billionths.
        Some((per_million * 1_000.0).round() as u64)
    }

    /// The checks serde cannot make.
    pub fn check(&self) -> Result<(), String> {
        let prices = [Some(self.input), Some(self.output), self.cached_input];
        if prices
            .into_iter()
            .flatten()
            .all(|p| p.is_finite() && p >= 0.0)
        {
            Ok(())
        } else {
            Err("a price is a number of at least 0 (per million tokens)".into())
        }
    }
}

/// What some attempts of a job reported, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Share {
    pub attempts: u32,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_input_tokens: u64,
    pub reasoning_tokens: u64,
    /// Billionths of the currency, of the attempts that were priced.
    pub cost_nanos: u64,
}

impl Share {
    fn add(&mut self, report: Option<&CallReport>) {
        self.attempts += 1;
        let Some(report) = report else { return };
        self.input_tokens += report.input_tokens.unwrap_or(0);
        self.output_tokens += report.output_tokens.unwrap_or(0);
        self.cached_input_tokens += report.cached_input_tokens.unwrap_or(0);
        self.reasoning_tokens += report.reasoning_tokens.unwrap_or(0);
        self.cost_nanos += report.cost_nanos.unwrap_or(0);
    }

    /// Both shares together.
    pub fn plus(mut self, other: &Self) -> Self {
        self.attempts += other.attempts;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
        self.cost_nanos += other.cost_nanos;
        self
    }
}

/// A job's bill: its attempts' usage by what became of their answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Bill {
    /// The answer that won the result slot.
    pub won: Share,
    /// Answers paid for and thrown away: they lost the slot, or came after the job was cancelled.
    pub discarded: Share,
    /// Attempts that failed: answers that broke the contract or that the model refused (paid for), and errors
    /// (usually not) — also those that came to a cancelled attempt.
    pub failed: Share,
    /// Attempts whose call may have been billed and whose usage is not known: `unknown`, in flight, or cancelled
    /// after their call began with no answer since. Their cost is known only if their answer arrives.
    pub unknown: Vec<u32>,
    /// Attempts cleared by their provider's retry policy (`unknown_retry_after_ms`) with no answer since: their
    /// call may have been billed as well as the retry's. Their cost is known only if their answer arrives.
    pub possibly_paid: Vec<u32>,
    /// Attempts that reported usage no price was configured for: tokens counted, cost not.
    pub unpriced: Vec<u32>,
}

impl Bill {
    /// The bill of `job` as it stands.
    pub fn of(job: &Job) -> Self {
        let mut bill = Self::default();
        for attempt in &job.attempts {
            let report = attempt.report.as_ref();
            match attempt.state {
                AttemptState::Succeeded => bill.won.add(report),
                AttemptState::Discarded => bill.discarded.add(report),
                AttemptState::Failed => bill.failed.add(report),
                // A cancelled attempt whose provider answered without a result after all: what it said is kept.
                AttemptState::Cancelled if attempt.error.is_some() => bill.failed.add(report),
                AttemptState::Unknown | AttemptState::Started => bill.unknown.push(attempt.number),
                // The provider, asked, had no such call: nothing was done, nothing billed.
                AttemptState::Cancelled if cleared(attempt, ClearedBy::Lookup) => {}
                AttemptState::Cancelled
                    if called(attempt) && cleared(attempt, ClearedBy::Policy) =>
                {
                    bill.possibly_paid.push(attempt.number);
                }
                AttemptState::Cancelled if called(attempt) => bill.unknown.push(attempt.number),
                AttemptState::Cancelled | AttemptState::Queued => {}
            }
            let used =
                report.is_some_and(|r| r.input_tokens.is_some() || r.output_tokens.is_some());
            if used && report.is_some_and(|r| r.cost_nanos.is_none()) {
                bill.unpriced.push(attempt.number);
            }
        }
        bill
    }

    /// Every known share together.
    pub fn total(&self) -> Share {
        self.won.plus(&self.discarded).plus(&self.failed)
    }

    /// Whether the total is the whole cost: no attempt's cost is unknown, possibly paid or unpriced.
    pub fn complete(&self) -> bool {
        self.unknown.is_empty() && self.possibly_paid.is_empty() && self.unpriced.is_empty()
    }
}

impl Job {
    /// What attempt `number`'s call cost, as its record says, for a budget that reserved `reserved` for it: `None`
    /// while the attempt is live (queued, running or `unknown`: not known yet). Its usage where it reported one (its
    /// priced cost; the tokens of an unpriced one). Nothing where no call was made or the provider said it did no
    /// work: never claimed, refused (`provider_refused`, a 4xx) or not done ([`super::failover::NOT_DONE`]), or a lookup found no such
    /// call. Else the call may have been paid with no usage known (a cleared time-out, a cancel after the call
    /// began, an answer without usage): the reservation, whole.
    pub fn settlement(&self, number: u32, reserved: Bound) -> Option<Bound> {
        let Some(attempt) = self.attempt(number) else {
            return Some(Bound::default());
        };
        if attempt.state.is_live() {
            return None;
        }
        let usage = (attempt.report.as_ref())
            .filter(|r| r.input_tokens.is_some() || r.output_tokens.is_some());
        if let Some(report) = usage {
            return Some(Bound {
                tokens: report.input_tokens.unwrap_or(0) + report.output_tokens.unwrap_or(0),
                nanos: report.cost_nanos.unwrap_or(0),
            });
        }
        let not_done = attempt.started_at.is_none()
            || cleared(attempt, ClearedBy::Lookup)
            || (attempt.error.as_ref()).is_some_and(|e| {
                NOT_DONE.contains(&e.code.as_str()) || e.code == "provider_refused"
            });
        Some(if not_done { Bound::default() } else { reserved })
    }
}

/// Whether the attempt left `unknown` by `by`.
fn cleared(attempt: &Attempt, by: ClearedBy) -> bool {
    attempt.cleared.is_some_and(|c| c.by == by)
}

/// Whether a cancelled attempt's call had begun (it was claimed) with no answer recorded since.
fn called(attempt: &Attempt) -> bool {
    attempt.started_at.is_some() && attempt.report.is_none()
}
