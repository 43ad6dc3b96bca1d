//! The `feedback` table: usefulness and harm signals on memories, with their
//! tallies kept in memory for ranking.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use futures::TryStreamExt;
use lancedb::query::ExecutableQuery;
use lancedb::Table;
use serde::{Deserialize, Serialize};

use super::Result;
use crate::core::model::{Columns, Micros};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FeedbackRow {
    pub id: String,
    pub stream: String,
    pub chunk_id: String,
    /// 0 (not useful) – 4 (crucial).
    pub usefulness: i32,
    pub harmful: bool,
    /// The API key's name.
    pub caller: String,
    pub created_at: Micros,
}

pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("stream", DataType::Utf8, false),
        Field::new("chunk_id", DataType::Utf8, false),
        Field::new("usefulness", DataType::Int32, false),
        Field::new("harmful", DataType::Boolean, false),
        Field::new("caller", DataType::Utf8, false),
        Field::new(
            "created_at",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
    ]))
}

/// What the signals on one memory add up to.
#[derive(schemars::JsonSchema, Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Tally {
    pub count: u32,
    pub harmful: u32,
    /// Sum of the signals: usefulness 4 → +1, 2 → 0, 0 → -1; harmful → -2.
    pub signal: f32,
}

impl Tally {
    fn add(&mut self, usefulness: i32, harmful: bool) {
        self.count += 1;
        if harmful {
            self.harmful += 1;
            self.signal -= 2.0;
        } else {
            self.signal += (usefulness as f32 - 2.0) / 2.0;
        }
    }

    /// The ranking multiplier: `1 + weight * signal`, within [0.1, 3].
    pub fn factor(&self, weight: f32) -> f32 {
        (1.0 + weight * self.signal).clamp(0.1, 3.0)
    }
}

/// The `feedback` table and the tallies by memory id.
pub struct FeedbackBook {
    table: Table,
    tallies: RwLock<HashMap<String, Tally>>,
    gate: super::TableGate,
}

impl FeedbackBook {
    pub async fn open(table: Table, gate: super::TableGate) -> Result<FeedbackBook> {
        let tallies = tally_all(&table).await?;
        Ok(FeedbackBook {
            table,
            tallies: RwLock::new(tallies),
            gate,
        })
    }

    /// Recount every tally from the table (after rows were restored into it).
    pub async fn reload(&self) -> Result<()> {
        let tallies = tally_all(&self.table).await?;
        *self.tallies.write().expect("feedback lock") = tallies;
        Ok(())
    }

    pub fn table(&self) -> &Table {
        &self.table
    }
}

/// Every memory's tally, counted from the feedback table.
async fn tally_all(table: &Table) -> Result<HashMap<String, Tally>> {
    let batches: Vec<RecordBatch> = table.query().execute().await?.try_collect().await?;
    let mut tallies: HashMap<String, Tally> = HashMap::new();
    for b in &batches {
        let c = Columns::new(b);
        for r in 0..b.num_rows() {
            let (Some(id), Some(u)) = (c.str("chunk_id", r), c.i32("usefulness", r)) else {
                continue;
            };
            tallies
                .entry(id)
                .or_default()
                .add(u, c.bool("harmful", r).unwrap_or(false));
        }
    }
    Ok(tallies)
}

impl FeedbackBook {
    pub async fn add(&self, row: &FeedbackRow) -> Result<Tally> {
        let batch = super::graph::rows_to_batch(schema(), std::slice::from_ref(row))?;
        {
            let _gate = self.gate.read().await;
            self.table.add(batch).execute().await?;
        }
        let mut tallies = self.tallies.write().expect("feedback lock");
        let t = tallies.entry(row.chunk_id.clone()).or_default();
        t.add(row.usefulness, row.harmful);
        Ok(*t)
    }

    /// The tally of one memory (default: no signals).
    pub fn tally(&self, chunk_id: &str) -> Tally {
        self.tallies
            .read()
            .expect("feedback lock")
            .get(chunk_id)
            .copied()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_move_the_factor_both_ways() {
        let mut t = Tally::default();
        for _ in 0..3 {
            t.add(4, false);
        }
        assert!((t.factor(0.1) - 1.3).abs() < 1e-6);
        let mut bad = Tally::default();
        bad.add(0, false);
        bad.add(3, true);
        assert!((bad.factor(0.1) - 0.7).abs() < 1e-6);
        assert_eq!(bad.harmful, 1);
        let mut many = Tally::default();
        for _ in 0..100 {
            many.add(0, true);
        }
        assert_eq!(many.factor(0.1), 0.1);
    }
}
