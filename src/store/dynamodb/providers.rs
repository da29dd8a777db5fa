//! The [`ProviderStore`] port on DynamoDB: what onejob knows of each provider, in the jobs' table.
//!
//! - Qualification evidence, one item per (contract fingerprint, provider fingerprint):
//!   `pk = qualification#<contract fp>#<provider fp>`, `passed` (BOOL), `evidence` (S, JSON), `digest` (S: the first
//!   128 bits of SHA-256 of the evidence's text, what a production note's compare-and-swap names). No TTL.
//! - A provider's breaker, `pk = breaker#<provider>`, `breaker` (S, JSON), guarded by `rev` (N).
//!
//! Neither key can be a job id (those start `job_`), and neither item carries `owner` or `sweep_pk`: no index sees
//! them.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::codec::json_text;
use super::item::read;
use super::{DynamoStore, Item, n, s, sdk_failure};
use crate::domain::{Breaker, Fingerprint, ProviderName, Qualification};
use crate::store::{CallSlot, ProviderStore, StoreError};

/// A qualification's item.
#[derive(Debug, Serialize, Deserialize)]
struct QualificationItem {
    pk: String,
    passed: bool,
    #[serde(with = "json_text")]
    evidence: Qualification,
    /// Absent from items written before notes were compared-and-swapped: no note replaces them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    digest: Option<String>,
}

/// A provider's breaker's item, guarded by `rev`.
#[derive(Debug, Serialize, Deserialize)]
struct BreakerItem {
    pk: String,
    rev: u64,
    #[serde(with = "json_text")]
    breaker: Breaker,
}

fn breaker_key(provider: &ProviderName) -> String {
    format!("breaker#{provider}")
}

fn encode_breaker(provider: &ProviderName, breaker: &Breaker, rev: u64) -> Item {
    serde_dynamo::to_item(BreakerItem {
        pk: breaker_key(provider),
        rev,
        breaker: breaker.clone(),
    })
    .expect("a breaker always encodes")
}

fn decode_breaker(item: &Item) -> Result<(Breaker, u64), StoreError> {
    read::<BreakerItem>(item).map(|b| (b.breaker, b.rev))
}

fn qualification_key(contract: &Fingerprint, provider: &Fingerprint) -> String {
    format!("qualification#{contract}#{provider}")
}

/// What names one version of `evidence` in a compare-and-swap.
fn digest(evidence: &Qualification) -> String {
    let text = serde_json::to_string(evidence).expect("evidence always serialises");
    hex::encode(&Sha256::digest(text.as_bytes())[..16])
}

/// The item holding a qualification's evidence.
fn encode_qualification(evidence: &Qualification) -> Item {
    serde_dynamo::to_item(QualificationItem {
        pk: qualification_key(
            &evidence.contract_fingerprint,
            &evidence.provider_fingerprint,
        ),
        passed: evidence.passed,
        evidence: evidence.clone(),
        digest: Some(digest(evidence)),
    })
    .expect("evidence always encodes")
}

fn decode_qualification(item: &Item) -> Result<Qualification, StoreError> {
    read::<QualificationItem>(item).map(|q| q.evidence)
}

#[async_trait]
impl ProviderStore for DynamoStore {
    async fn put_qualification(&self, evidence: &Qualification) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(encode_qualification(evidence)))
            .send()
            .await
            .map_err(sdk_failure)?;
        Ok(())
    }

    async fn qualification(
        &self,
        contract: &Fingerprint,
        provider: &Fingerprint,
    ) -> Result<Option<Qualification>, StoreError> {
        let key = qualification_key(contract, provider);
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(&key))
            .consistent_read(true)
            .send()
            .await
            .map_err(sdk_failure)?;
        let Some(item) = out.item else {
            return Ok(None);
        };
        decode_qualification(&item).map(Some)
    }

    async fn breaker(&self, provider: &ProviderName) -> Result<(Breaker, u64), StoreError> {
        match self.get(&breaker_key(provider)).await? {
            None => Ok((Breaker::default(), 0)),
            Some(item) => decode_breaker(&item),
        }
    }

    async fn replace_qualification(
        &self,
        seen: &Qualification,
        evidence: &Qualification,
    ) -> Result<bool, StoreError> {
        let item = encode_qualification(evidence);
        self.put_if(item, "digest = :seen", (":seen", s(&digest(seen))))
            .await
    }

    async fn put_breaker(
        &self,
        provider: &ProviderName,
        breaker: &Breaker,
        rev: u64,
    ) -> Result<bool, StoreError> {
        let item = encode_breaker(provider, breaker, rev + 1);
        let first_or_seen = "attribute_not_exists(pk) OR rev = :rev";
        self.put_if(item, first_or_seen, (":rev", n(rev as i64)))
            .await
    }

    async fn take_call_slot(
        &self,
        provider: &ProviderName,
        holder: &str,
        slot: CallSlot,
    ) -> Result<bool, StoreError> {
        self.slot(provider, holder, Some(slot)).await
    }

    async fn free_call_slot(
        &self,
        provider: &ProviderName,
        holder: &str,
    ) -> Result<(), StoreError> {
        self.slot(provider, holder, None).await.map(|_| ())
    }
}
