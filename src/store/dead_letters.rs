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
}
