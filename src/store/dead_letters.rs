//! The `dead_letters` table: messages that kept failing, with their error.

use super::{Filter, Result};
use crate::core::model::{dead_letters_to_batch, DeadLetter};

impl super::Store {
    /// Keep messages the pipeline gave up on (rare: written directly, not batched).
    pub async fn dead_letter(&self, rows: Vec<DeadLetter>) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        self.dead_letters
            .add(dead_letters_to_batch(&rows)?)
            .execute()
            .await?;
        Ok(())
    }

    pub async fn count_dead_letters(&self, filter: &Filter) -> Result<usize> {
        Ok(self.dead_letters.count_rows(filter.sql()).await?)
    }

    /// The payload of the first dead letter `filter` matches.
    pub async fn dead_letter_payload(&self, filter: &Filter) -> Result<Option<String>> {
        use arrow_array::{Array, StringArray};
        for batch in super::scan(&self.dead_letters, filter).await? {
            let Some(payloads) = batch
                .column_by_name("payload")
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            else {
                continue;
            };
            if !payloads.is_empty() && payloads.is_valid(0) {
                return Ok(Some(payloads.value(0).to_string()));
            }
        }
        Ok(None)
    }

    /// Remove the dead letters `filter` matches (after a retry).
    pub async fn delete_dead_letters(&self, filter: &Filter) -> Result<()> {
        if let Some(predicate) = filter.sql() {
            self.dead_letters.delete(&predicate).await?;
        }
        Ok(())
    }
}
