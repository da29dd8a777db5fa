//! What an owner's intents cost, by day and contract: summed from the jobs' bills — their attempts, which keep their
//! usage and cost — so that a billing export agrees with every job's bill; read without the jobs' inputs and
//! results (`JobStore::list_bills`). A job counts on the day (UTC) it was
//! created. A report reads at most [`Usage::MAX_JOBS`] jobs; a longer range is answered from its last day back,
//! in whole days, with the day to continue from.

use std::collections::BTreeMap;

use chrono::{Days, NaiveDate};

use super::Engine;
use crate::domain::{Bill, CallReport, ContractRef, LimitReached, Owner, Share, Spend};
use crate::store::{Cursor, ListQuery, StoreError};

/// One day's usage of one contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    pub date: NaiveDate,
    pub contract: ContractRef,
    /// Jobs created that day.
    pub jobs: u32,
    /// Their bills, added up.
    pub won: Share,
    pub discarded: Share,
    pub failed: Share,
    /// Attempts whose cost is not known (no answer yet), and attempts that reported usage with no price.
    pub unknown_attempts: u32,
    /// Attempts cleared by their provider's retry policy with no answer since (possibly paid twice).
    pub possibly_paid_attempts: u32,
    pub unpriced_attempts: u32,
}

/// An owner's usage over whole days.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// By day, then contract.
    pub rows: Vec<UsageRow>,
    /// When the range held more jobs than a report reads: the days from this one on are complete, the earlier
    /// ones were not read (ask again with this day before it as the range's end).
    pub complete_from: Option<NaiveDate>,
}

impl Usage {
    /// The most jobs one report reads.
    pub const MAX_JOBS: usize = 10_000;
}

impl Engine {
    /// What a call for `owner` reported, added to its day's and month's spend when its limits have a budget: what
    /// the budget is held to. Advisory, after the answer is written; a store that fails here is logged, and the
    /// spend is short by this call.
    pub(super) async fn record_spend(&self, owner: &Owner, report: &CallReport) {
        if self.settings.limits.of(owner).budget.is_none() {
            return;
        }
        let tokens = report.input_tokens.unwrap_or(0) + report.output_tokens.unwrap_or(0);
        let nanos = report.cost_nanos.unwrap_or(0);
        if tokens == 0 && nanos == 0 {
            return;
        }
        let spend = Spend {
            at: self.clock.now(),
            tokens,
            nanos,
        };
        if let Err(e) = self.store.record_spend(owner, &spend).await {
            tracing::warn!(%owner, error = %crate::telemetry::error_chain(&e), "spend not recorded");
        }
    }

    /// Whether `owner`'s budget is spent now: then no call may be ordered for it (invariant 18) — a failover, a
    /// retry or a manual attempt stops with `budget_exceeded`. Without a budget, nothing is read.
    pub(crate) async fn budget_spent(
        &self,
        owner: &Owner,
    ) -> Result<Option<LimitReached>, StoreError> {
        let limits = self.settings.limits.of(owner);
        if limits.budget.is_none() {
            return Ok(None);
        }
        let ledger = self.store.owner_ledger(owner).await?;
        Ok(limits.spent(&ledger, self.clock.now()))
    }

    /// `owner`'s usage on the days `from` to `to` (both included).
    pub async fn usage(
        &self,
        owner: &Owner,
        from: NaiveDate,
        to: NaiveDate,
    ) -> Result<Usage, StoreError> {
        let start = from.and_hms_opt(0, 0, 0).expect("midnight").and_utc();
        let end = (to.checked_add_days(Days::new(1)))
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map_or(chrono::DateTime::<chrono::Utc>::MAX_UTC, |d| d.and_utc());
        let now = self.clock.now();
        let mut rows: BTreeMap<(NaiveDate, ContractRef), UsageRow> = BTreeMap::new();
        let mut cursor: Option<Cursor> = None;
        let mut read = 0;
        let mut complete_from = None;
        'pages: loop {
            let query = ListQuery {
                status: None,
                limit: ListQuery::MAX_LIMIT,
                cursor: cursor.take(),
                created_before: Some(end),
            };
            let page = self.store.list_bills(owner, &query, now).await?;
            for job in &page.jobs {
                if job.created_at < start {
                    break 'pages;
                }
                let date = job.created_at.date_naive();
                if read >= Usage::MAX_JOBS {
                    // Stop at a day's edge: the day being read is dropped whole, the later ones are complete.
                    rows.retain(|(day, _), _| *day > date);
                    complete_from = date.succ_opt();
                    break 'pages;
                }
                read += 1;
                let bill = Bill::of(job);
                let row = rows
                    .entry((date, job.contract.clone()))
                    .or_insert_with(|| UsageRow {
                        date,
                        contract: job.contract.clone(),
                        jobs: 0,
                        won: Share::default(),
                        discarded: Share::default(),
                        failed: Share::default(),
                        unknown_attempts: 0,
                        possibly_paid_attempts: 0,
                        unpriced_attempts: 0,
                    });
                row.jobs += 1;
                row.won = row.won.plus(&bill.won);
                row.discarded = row.discarded.plus(&bill.discarded);
                row.failed = row.failed.plus(&bill.failed);
                row.unknown_attempts += bill.unknown.len() as u32;
                row.possibly_paid_attempts += bill.possibly_paid.len() as u32;
                row.unpriced_attempts += bill.unpriced.len() as u32;
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        Ok(Usage {
            rows: rows.into_values().collect(),
            complete_from,
        })
    }
}
