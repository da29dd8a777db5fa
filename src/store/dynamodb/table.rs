//! The table onejob expects (the template creates the same; a test compares them).

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType,
    PointInTimeRecoverySpecification, Projection, ProjectionType, ScalarAttributeType,
    TimeToLiveSpecification,
};

use super::{DynamoStore, OWNER_INDEX, SWEEP_INDEX, sdk_failure};
use crate::store::StoreError;

impl DynamoStore {
    /// Creates the table with its indexes, TTL and point-in-time recovery; does nothing if it exists.
    pub async fn create_table(&self) -> Result<bool, StoreError> {
        let exists = self
            .client
            .describe_table()
            .table_name(&self.table)
            .send()
            .await;
        match exists {
            Ok(_) => return Ok(false),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) => {}
            Err(e) => return Err(sdk_failure(e)),
        }
        let attribute = |name: &str, kind: ScalarAttributeType| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(kind)
                .build()
                .expect("name and type are set")
        };
        let key = |name: &str, kind: KeyType| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
                .expect("name and type are set")
        };
        // Keys only: a write pays for an entry only when its keys change, and readers fetch the items.
        let index = |name: &str, hash: &str, range: &str| {
            GlobalSecondaryIndex::builder()
                .index_name(name)
                .key_schema(key(hash, KeyType::Hash))
                .key_schema(key(range, KeyType::Range))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::KeysOnly)
                        .build(),
                )
                .build()
                .expect("index fields are set")
        };
        self.client
            .create_table()
            .table_name(&self.table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(attribute("pk", ScalarAttributeType::S))
            .attribute_definitions(attribute("owner", ScalarAttributeType::S))
            .attribute_definitions(attribute("created_key", ScalarAttributeType::S))
            .attribute_definitions(attribute("sweep_pk", ScalarAttributeType::S))
            .attribute_definitions(attribute("sweep_at", ScalarAttributeType::N))
            .key_schema(key("pk", KeyType::Hash))
            .global_secondary_indexes(index(OWNER_INDEX, "owner", "created_key"))
            .global_secondary_indexes(index(SWEEP_INDEX, "sweep_pk", "sweep_at"))
            .send()
            .await
            .map_err(sdk_failure)?;
        self.client
            .update_time_to_live()
            .table_name(&self.table)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name("expires_at")
                    .enabled(true)
                    .build()
                    .expect("ttl fields are set"),
            )
            .send()
            .await
            .map_err(sdk_failure)?;
        self.client
            .update_continuous_backups()
            .table_name(&self.table)
            .point_in_time_recovery_specification(
                PointInTimeRecoverySpecification::builder()
                    .point_in_time_recovery_enabled(true)
                    .build()
                    .expect("pitr field is set"),
            )
            .send()
            .await
            .map_err(sdk_failure)?;
        Ok(true)
    }
}
