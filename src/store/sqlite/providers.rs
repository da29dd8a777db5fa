//! The [`ProviderStore`] port on SQLite: `qualifications` (one row per pair of fingerprints, the evidence as JSON
//! text) and `breakers` (one row per provider, guarded by `rev`).

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::rows::{from_json, json_text};
use crate::domain::{Breaker, Fingerprint, ProviderName, Qualification};
use crate::store::{CallSlot, ProviderStore, StoreError};

#[async_trait]
impl ProviderStore for SqliteStore {
    async fn put_qualification(&self, evidence: &Qualification) -> Result<(), StoreError> {
        let row = (
            evidence.contract_fingerprint.to_string(),
            evidence.provider_fingerprint.to_string(),
            json_text(evidence),
        );
        self.write(move |tx| {
            tx.execute(
                "INSERT INTO qualifications (contract_fingerprint, provider_fingerprint, evidence) \
                 VALUES (?1, ?2, ?3) \
                 ON CONFLICT (contract_fingerprint, provider_fingerprint) DO UPDATE SET evidence = ?3",
                params![row.0, row.1, row.2],
            )?;
            Ok(())
        })
        .await
    }

    async fn qualification(
        &self,
        contract: &Fingerprint,
        provider: &Fingerprint,
    ) -> Result<Option<Qualification>, StoreError> {
        let key = (contract.to_string(), provider.to_string());
        self.read(move |conn| {
            let evidence: Option<String> = conn
                .prepare_cached(
                    "SELECT evidence FROM qualifications \
                     WHERE contract_fingerprint = ?1 AND provider_fingerprint = ?2",
                )?
                .query_row(params![key.0, key.1], |row| row.get(0))
                .optional()?;
            evidence.map(|e| from_json("evidence", &e)).transpose()
        })
        .await
    }

    async fn replace_qualification(
        &self,
        seen: &Qualification,
        evidence: &Qualification,
    ) -> Result<bool, StoreError> {
        let row = (
            evidence.contract_fingerprint.to_string(),
            evidence.provider_fingerprint.to_string(),
            json_text(evidence),
            json_text(seen),
        );
        self.write(move |tx| {
            // The stored text is what was read: evidence written since (a qualification, another note) is kept.
            let replaced = tx.execute(
                "UPDATE qualifications SET evidence = ?3 \
                 WHERE contract_fingerprint = ?1 AND provider_fingerprint = ?2 AND evidence = ?4",
                params![row.0, row.1, row.2, row.3],
            )?;
            Ok(replaced == 1)
        })
        .await
    }

    async fn breaker(&self, provider: &ProviderName) -> Result<(Breaker, u64), StoreError> {
        let name = provider.to_string();
        self.read(move |conn| {
            let row: Option<(String, i64)> = conn
                .prepare_cached("SELECT state, rev FROM breakers WHERE provider = ?1")?
                .query_row([&name], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()?;
            match row {
                None => Ok((Breaker::default(), 0)),
                Some((state, rev)) => Ok((
                    from_json("breaker", &state)?,
                    u64::try_from(rev).unwrap_or_default(),
                )),
            }
        })
        .await
    }

    async fn put_breaker(
        &self,
        provider: &ProviderName,
        breaker: &Breaker,
        rev: u64,
    ) -> Result<bool, StoreError> {
        let (name, state, rev) = (provider.to_string(), json_text(breaker), rev as i64);
        self.write(move |tx| {
            // Inserted at revision 1 if none is stored, else moved on from `rev`: a stale writer changes nothing.
            let changed = tx.execute(
                "INSERT INTO breakers (provider, state, rev) VALUES (?1, ?2, 1) \
                 ON CONFLICT (provider) DO UPDATE SET state = ?2, rev = rev + 1 WHERE rev = ?3",
                params![name, state, rev],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    async fn take_call_slot(
        &self,
        provider: &ProviderName,
        holder: &str,
        slot: CallSlot,
    ) -> Result<bool, StoreError> {
        let (provider, holder) = (provider.to_string(), holder.to_owned());
        self.write(move |tx| super::owners::take_slot(tx, &provider, &holder, slot))
            .await
    }

    async fn free_call_slot(
        &self,
        provider: &ProviderName,
        holder: &str,
    ) -> Result<(), StoreError> {
        let (provider, holder) = (provider.to_string(), holder.to_owned());
        self.write(move |tx| super::owners::free_slot(tx, &provider, &holder))
            .await
    }
}
