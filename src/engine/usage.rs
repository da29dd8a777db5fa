//! What an owner's intents cost, by day and contract: summed from the jobs' bills — their attempts, which keep their
//! usage and cost — so that a billing export agrees with every job's bill; read without the jobs' inputs and
//! results (`JobStore::list_bills`). A job counts on the day (UTC) it was
//! created. A report reads at most [`Usage::MAX_JOBS`] jobs; a longer range is answered from its last day back,
//! in whole days, with the day to continue from.

use std::collections::BTreeMap;

use chrono::{Days, NaiveDate};

use super::Engine;
use crate::domain::{
    Bill, Bound, Budget, CallReport, ContractRef, Job, LimitReached, Owner, ProviderName, Refusal,
    Share, Timestamp, WriteToken,
};
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
    /// The most the unknown and possibly paid attempts can have cost: each call's worst case.
    pub reserved: Bound,
}

/// Where an owner's budget stands now.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetStanding {
    pub budget: Budget,
    /// The current period's key.
    pub current: String,
    /// What its ended calls cost this period.
    pub settled: Bound,
    /// What its calls not settled yet hold, at their worst case.
    pub reserved: Bound,
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
    /// What `report`'s usage costs on `provider` by the price table: the batch price (half) for a provider that
    /// calls through a batch API.
    pub(super) fn priced(&self, provider: &ProviderName, report: &CallReport) -> Option<u64> {
        let configured = self.providers.get(provider);
        let model = configured.and_then(|p| p.config.model());
        let cost = (self.settings.prices).cost_nanos(provider, model, report);
        let in_batch = configured.is_some_and(|p| p.config.kind.kind().in_batch());
        cost.map(|nanos| if in_batch { nanos / 2 } else { nanos })
    }

    /// The worst case of one call of an intent on `contract` with `input` ([`Bound`]): its prompt's bytes and its
    /// output schema's with the framing, and the contract's output budget, priced at the dearest of `providers`
    /// (the chain, and an attempt's own provider) that has a price.
    pub fn bound<'a>(
        &self,
        contract: &ContractRef,
        input: &serde_json::Value,
        providers: impl IntoIterator<Item = &'a ProviderName>,
    ) -> Bound {
        let Some(contract) = self.contracts.get(contract) else {
            return Bound::default();
        };
        let (input_tokens, output_tokens) = contract.worst_case_tokens(input);
        let worst = CallReport {
            input_tokens: Some(input_tokens),
            output_tokens: Some(output_tokens),
            ..CallReport::default()
        };
        let nanos = providers
            .into_iter()
            .filter_map(|p| self.priced(p, &worst))
            .max();
        Bound {
            tokens: input_tokens + output_tokens,
            nanos: nanos.unwrap_or(0),
        }
    }

    /// [`Engine::bound`] of a call of `job`, on its chain or on `also`.
    pub fn bound_of(&self, job: &Job, also: Option<&ProviderName>) -> Bound {
        self.bound(&job.contract, &job.input, job.providers.iter().chain(also))
    }

    /// Whether a call of `job` (on its chain or on `also`) would not fit its owner's budget now: then no call is
    /// ordered for it (invariant 18) — a failover, a retry or a manual attempt stops with `budget_exceeded`. The
    /// job's own reservation is left out: it is settled before the next call of the job is reserved (which holds
    /// the call to the budget exactly: [`crate::store::JobStore::reserve`]). Without a budget, nothing is read.
    pub(crate) async fn budget_left(
        &self,
        job: &Job,
        also: Option<&ProviderName>,
    ) -> Result<Option<LimitReached>, StoreError> {
        let limits = self.settings.limits.of(&job.owner);
        if limits.budget.is_none() {
            return Ok(None);
        }
        let mut ledger = self.store.owner_ledger(&job.owner).await?;
        ledger.places.remove(job.id.intent());
        Ok(limits.fits(&ledger, self.clock.now(), self.bound_of(job, also)))
    }

    /// Before attempt `number` of `job` calls its provider, under a budget: its worst case reserved, or the
    /// reservation its create or manual attempt made kept ([`crate::store::JobStore::reserve`]), tried again while
    /// the store fails until the step's answer deadline (`deadline`): the write is the same each time. `Some`
    /// refusal: the call does not fit, and is not made.
    pub(super) async fn reserve(
        &self,
        job: &Job,
        number: u32,
        token: &WriteToken,
        deadline: Option<Timestamp>,
    ) -> Result<Option<LimitReached>, StoreError> {
        let limits = self.settings.limits.of(&job.owner);
        if limits.budget.is_none() {
            return Ok(None);
        }
        let provider = job.attempt(number).map(|a| &a.provider);
        let bound = self.bound_of(job, provider);
        let until = self.answer_deadline(deadline);
        let reserved = self.persist("reservation", token, until, |stamp| {
            (self.store).reserve(job, number, limits, bound, stamp.now)
        });
        match reserved.await {
            Ok(()) => {
                self.metrics.budget(&job.owner, "reserved", bound);
                Ok(None)
            }
            Err(StoreError::Refused(Refusal::Limit(limit))) => Ok(Some(limit)),
            Err(e) => Err(e),
        }
    }

    /// Where `owner`'s budget stands now, if it has one: its ledger read.
    pub async fn budget_standing(
        &self,
        owner: &Owner,
    ) -> Result<Option<BudgetStanding>, StoreError> {
        let Some(budget) = self.settings.limits.of(owner).budget else {
            return Ok(None);
        };
        let ledger = self.store.owner_ledger(owner).await?;
        let (current, _) = budget.period.of(self.clock.now());
        let spend = ledger.spend_of(budget.period);
        let settled = match spend.period == current {
            true => Bound {
                tokens: spend.tokens,
                nanos: spend.nanos,
            },
            false => Bound::default(),
        };
        Ok(Some(BudgetStanding {
            budget,
            current,
            settled,
            reserved: ledger.reserved(),
        }))
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
                        reserved: Bound::default(),
                    });
                row.jobs += 1;
                row.won = row.won.plus(&bill.won);
                row.discarded = row.discarded.plus(&bill.discarded);
                row.failed = row.failed.plus(&bill.failed);
                row.unknown_attempts += bill.unknown.len() as u32;
                row.possibly_paid_attempts += bill.possibly_paid.len() as u32;
                row.unpriced_attempts += bill.unpriced.len() as u32;
                let uncertain = (bill.unknown.len() + bill.possibly_paid.len()) as u64;
                if uncertain > 0 {
                    let worst = self.bound_of(job, None);
                    row.reserved = row.reserved.plus(Bound {
                        tokens: worst.tokens * uncertain,
                        nanos: worst.nanos * uncertain,
                    });
                }
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
