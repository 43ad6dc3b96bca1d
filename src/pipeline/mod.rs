//! Staged pipelines: a batch of records goes through the stages a
//! `pipelines/<name>.toml` file names, in order; each stage keeps, drops (with a
//! reason) or fails records and the runner counts what each stage did.

pub mod config;
pub mod ner;
pub mod stages;
mod stats;
pub mod worker;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::core::model::Chunk;
use crate::providers::embed::Embedder;
use crate::store::{HistoryRow, Neighbor, Store};

pub use stats::{StageStats, StageStatsSnapshot};

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("pipeline {file}: {message}")]
    Definition { file: String, message: String },
    #[error("stage `{stage}`: {message}")]
    Config { stage: String, message: String },
    #[error("stage `{stage}` failed on the batch: {message}")]
    Batch {
        stage: &'static str,
        message: String,
    },
}

/// What a stage decided about one record.
#[derive(Debug, Clone, PartialEq)]
pub enum Disposition {
    Keep,
    /// Deliberately not stored; `existing_id` names the stored memory it duplicates.
    Drop {
        reason: &'static str,
        existing_id: Option<String>,
    },
    /// This record cannot be processed; the rest of the batch goes on.
    Fail(String),
}

#[derive(Debug, Clone)]
pub struct Record {
    pub chunk: Chunk,
    pub disposition: Disposition,
    /// Other chunks this record changes (e.g. the memory it supersedes); the
    /// `write` stage commits them with the batch.
    pub also_write: Vec<Chunk>,
    /// Changes to record in `history`, written with the batch's commit.
    pub history: Vec<HistoryRow>,
    /// Links to other memories, written after the batch commits.
    pub relations: Vec<crate::store::relations::RelationRow>,
    /// The closest stored memories of the same stream, best first (filled once,
    /// by the first stage that needs them).
    pub neighbors: Option<Vec<Neighbor>>,
    /// Side writes a stage started in the background (the entity graph's
    /// group commit). The worker answers the batch's writers once `write`
    /// has committed their memories, and acknowledges the messages to the
    /// bus only when these are committed too (a crash redelivers them).
    pub pending: Vec<PendingWrite>,
    /// No stored row can have this record's id (minted by the server, first
    /// delivery): `write` appends it instead of merging on `id`.
    pub new_id: bool,
    /// What `extract_entities` recorded in the graph for this record, so
    /// `write` can take it back when the record is not stored after all.
    pub graph_refs: crate::store::graph::ChunkRefs,
    /// The record's highest similarity to an earlier record of its stream in
    /// the batch, found by `dedupe`'s within-batch scan, for
    /// `score_surprise` to reuse rather than scan the batch again.
    pub earlier_best: Option<EarlierBest>,
    /// `dedupe`'s within-batch scan of this record, done while the batch
    /// before it was written (see [`Stage::prepare`]).
    pub scanned: Option<Scanned>,
}

/// One record's row in a within-batch scan done ahead: the record's stream
/// group (its vectors, as scanned), its position there, the positions
/// before it whose similarity may pass `threshold` (None past
/// [`NEAR_CAP`] of them: the group is scanned again), all of the records
/// the group held when scanned. Records dropped since are still in the
/// group; whoever reads it skips them.
#[derive(Clone)]
pub struct Scanned {
    pub group: Arc<StreamVectors>,
    pub position: usize,
    pub maybe: Option<Vec<usize>>,
    pub threshold: f32,
}

impl std::fmt::Debug for Scanned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scanned({} of {})", self.position, self.group.idx.len())
    }
}

/// A record's highest similarity to an earlier kept, embedded record of its
/// stream in the same batch (0 when none is positive), and that record's
/// position in the batch (None when the highest is 0). It holds while that
/// record is still kept, since the records kept later are a subset of those
/// scanned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EarlierBest {
    pub similarity: f32,
    pub at: Option<usize>,
}

/// A write running beside the pipeline; cloneable so records stay `Clone`.
#[derive(Clone)]
pub struct PendingWrite {
    done: futures::future::Shared<BoxFuture<'static, Result<(), String>>>,
    /// Asks the write not to wait for company (a group commit's linger)
    /// when someone waits for it.
    urge: Option<std::sync::Arc<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for PendingWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingWrite")
    }
}

impl PendingWrite {
    /// Run `write` on the runtime now; its result is collected by [`settle`].
    pub fn spawn(
        write: impl std::future::Future<Output = Result<(), String>> + Send + 'static,
    ) -> PendingWrite {
        use futures::FutureExt;
        let handle = tokio::spawn(write);
        let fut: BoxFuture<'static, Result<(), String>> = Box::pin(async move {
            handle
                .await
                .unwrap_or_else(|e| Err(format!("side write panicked: {e}")))
        });
        PendingWrite {
            done: fut.shared(),
            urge: None,
        }
    }

    /// The same, with a way to hurry it when it is waited for.
    pub fn urged_by(mut self, urge: impl Fn() + Send + Sync + 'static) -> PendingWrite {
        self.urge = Some(std::sync::Arc::new(urge));
        self
    }

    /// Wait for the write to be done, without hurrying it.
    pub async fn done(self) -> Result<(), String> {
        self.done.await
    }
}

/// A batch's write that joined the entity graph's next group commit: its
/// acknowledgements wait for it, and waiting for it hurries the commit.
pub fn wait_for_graph(
    batch: &mut [Record],
    store: &std::sync::Arc<crate::store::Store>,
    committed: impl std::future::Future<Output = crate::store::Result<()>> + Send + 'static,
) {
    let store = store.clone();
    let write = PendingWrite::spawn(async move { committed.await.map_err(|e| e.to_string()) })
        .urged_by(move || store.graph.urge());
    if let Some(first) = batch.first_mut() {
        first.pending.push(write);
    }
}

/// Wait for every background side write the batch's stages started.
pub async fn settle(batch: &mut [Record], stage: &'static str) -> Result<(), PipelineError> {
    let pending: Vec<PendingWrite> = batch
        .iter_mut()
        .flat_map(|r| std::mem::take(&mut r.pending))
        .collect();
    for urge in pending.iter().filter_map(|p| p.urge.as_ref()) {
        urge();
    }
    for p in pending {
        p.done()
            .await
            .map_err(|message| PipelineError::Batch { stage, message })?;
    }
    Ok(())
}

impl Record {
    pub fn new(chunk: Chunk) -> Record {
        Record {
            chunk,
            disposition: Disposition::Keep,
            also_write: Vec::new(),
            history: Vec::new(),
            relations: Vec::new(),
            neighbors: None,
            pending: Vec::new(),
            new_id: false,
            graph_refs: Default::default(),
            earlier_best: None,
            scanned: None,
        }
    }

    pub fn is_kept(&self) -> bool {
        self.disposition == Disposition::Keep
    }
}

/// The records of a batch that are still kept.
pub fn kept(batch: &mut [Record]) -> impl Iterator<Item = &mut Record> {
    batch.iter_mut().filter(|r| r.is_kept())
}

/// A step of a pipeline. It sees the whole batch and acts on the kept records.
pub trait Stage: Send + Sync {
    fn name(&self) -> &'static str;
    /// An `Err` fails the whole batch (to be retried); per-record trouble is a `Disposition`.
    fn process<'a>(&'a self, batch: &'a mut [Record]) -> BoxFuture<'a, Result<(), PipelineError>>;
    /// True when what the stage does to a record depends on the record alone,
    /// not on the store or the batches before it: such a stage may run on a
    /// batch while the batch before it is still being written.
    fn runs_ahead(&self) -> bool {
        false
    }
    /// The part of the stage's work that reads the batch alone (not the
    /// store, nor the batches before it), done as the batch's stages that
    /// run ahead end, while the batch before it is still written; only the
    /// first stage after those is asked. What it leaves on the records must
    /// hold whichever of them the stage finds dropped when it runs.
    fn prepare<'a>(&'a self, _batch: &'a mut [Record]) -> BoxFuture<'a, Result<(), PipelineError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// A stage that looks at one record at a time.
pub trait RecordStage: Send + Sync {
    fn name(&self) -> &'static str;
    fn apply(&self, record: &mut Record);
}

impl<T: RecordStage> Stage for T {
    fn name(&self) -> &'static str {
        RecordStage::name(self)
    }

    fn runs_ahead(&self) -> bool {
        true
    }

    fn process<'a>(&'a self, batch: &'a mut [Record]) -> BoxFuture<'a, Result<(), PipelineError>> {
        for r in kept(batch) {
            self.apply(r);
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

/// What the stages may hold on to when built.
#[derive(Clone)]
pub struct BuildContext {
    pub store: Arc<Store>,
    pub embedder: Arc<dyn Embedder>,
    /// The configured LLM (stages with an LLM path use it when present).
    pub llm: Option<Arc<crate::providers::llm::Llm>>,
    /// The LLM entity queue (present when the LLM is configured with `ner`).
    pub ner: Option<crate::pipeline::ner::NerQueue>,
    /// Where the pipeline files live; stage files named in parameters resolve here.
    pub dir: std::path::PathBuf,
}

/// The embeddings of a batch's kept records, grouped by stream and copied into
/// one contiguous matrix per stream (batch order kept), for the within-batch
/// O(n^2) similarity scans of dedupe and score_surprise.
///
/// The scans read int8 codes of the vectors (a quarter of the bytes, four
/// times the products an instruction) and compute the exact f32 similarity
/// only for the rows whose approximate one, widened by its error bound,
/// could decide the answer: the answers are the exact scan's.
pub struct StreamVectors {
    /// Batch positions of the rows.
    pub idx: Vec<usize>,
    flat: Vec<f32>,
    codes: Vec<i8>,
    scales: Vec<f32>,
    /// Per row: the length of the quantisation error `v − scale·code`, the
    /// length of `v` and of `scale·code` (the terms of the error bound).
    err: Vec<f32>,
    norm: Vec<f32>,
    code_norm: Vec<f32>,
    /// The largest `norm` and `err` of the group, for a bound of every row's.
    max_norm: f32,
    max_err: f32,
    dim: usize,
    /// The codes' largest magnitude: the CPU's fastest for the scan
    /// ([`crate::core::vector::scan_top`]); the bounds follow the codes.
    top: i8,
}

/// The squared lengths of `v − scale·code`, of `v` and of `scale·code`, in
/// eight lanes the compiler keeps in one vector register each (a single
/// running sum each is a chain of dependent adds it may not reorder).
fn error_terms(v: &[f32], code: &[i8], scale: f32) -> [f32; 3] {
    const LANES: usize = 8;
    let mut sums = [[0.0f32; LANES]; 3];
    let (vs, cs) = (v.chunks_exact(LANES), code.chunks_exact(LANES));
    let (v_rest, c_rest) = (vs.remainder(), cs.remainder());
    for (x, c) in vs.zip(cs) {
        for l in 0..LANES {
            let y = scale * f32::from(c[l]);
            sums[0][l] += (x[l] - y) * (x[l] - y);
            sums[1][l] += x[l] * x[l];
            sums[2][l] += y * y;
        }
    }
    for (x, c) in v_rest.iter().zip(c_rest) {
        let y = scale * f32::from(*c);
        sums[0][0] += (x - y) * (x - y);
        sums[1][0] += x * x;
        sums[2][0] += y * y;
    }
    sums.map(|lanes| lanes.iter().sum())
}

/// Every text of up to `most` of `pieces`, one after another (the empty one
/// first): the inputs a stage's fast path is checked on against its
/// general one.
#[cfg(test)]
pub(crate) fn every_text(pieces: &[&str], most: usize) -> Vec<String> {
    let mut all = vec![String::new()];
    let mut last = all.clone();
    for _ in 0..most {
        last = last
            .iter()
            .flat_map(|t| pieces.iter().map(move |p| format!("{t}{p}")))
            .collect();
        all.extend(last.iter().cloned());
    }
    all
}

/// Added to every error bound: the rounding of the f32 sums themselves.
const ROUNDING_SLACK: f32 = 1e-3;

impl StreamVectors {
    /// Group the kept, embedded records of `batch` by stream.
    pub fn of(batch: &[Record]) -> Vec<StreamVectors> {
        let mut groups: BTreeMap<&str, StreamVectors> = BTreeMap::new();
        for (i, r) in batch.iter().enumerate() {
            let Some(v) = r.chunk.embedding.as_deref().filter(|_| r.is_kept()) else {
                continue;
            };
            let g = groups
                .entry(r.chunk.stream.as_str())
                .or_insert_with(|| StreamVectors {
                    idx: Vec::new(),
                    flat: Vec::new(),
                    codes: Vec::new(),
                    scales: Vec::new(),
                    err: Vec::new(),
                    norm: Vec::new(),
                    code_norm: Vec::new(),
                    max_norm: 0.0,
                    max_err: 0.0,
                    dim: v.len(),
                    top: crate::core::vector::scan_top(),
                });
            if v.len() == g.dim {
                g.push(i, v);
            }
        }
        groups.into_values().collect()
    }

    fn push(&mut self, i: usize, v: &[f32]) {
        let at = self.codes.len();
        self.codes.resize(at + v.len(), 0);
        let code = &mut self.codes[at..];
        let scale = crate::core::vector::quantize_i8_within(v, code, self.top);
        let [err, norm, code_norm] = error_terms(v, code, scale);
        self.idx.push(i);
        self.flat.extend_from_slice(v);
        self.scales.push(scale);
        self.err.push(err.sqrt());
        self.norm.push(norm.sqrt());
        self.code_norm.push(code_norm.sqrt());
        self.max_norm = self.max_norm.max(norm.sqrt());
        self.max_err = self.max_err.max(err.sqrt());
    }

    /// Cosine similarity of rows `p` and `q`.
    fn sim(&self, p: usize, q: usize) -> f32 {
        let d = self.dim;
        crate::providers::embed::dot(
            &self.flat[p * d..(p + 1) * d],
            &self.flat[q * d..(q + 1) * d],
        )
    }

    /// The int8 dots of row `p`'s code with each row before it.
    fn dots_of(&self, p: usize) -> Vec<i32> {
        let d = self.dim;
        let mut dots = vec![0i32; p];
        crate::core::vector::dot_i8_rows(
            &self.codes[p * d..(p + 1) * d],
            &self.codes[..p * d],
            &mut dots,
        );
        dots
    }

    /// Row `p` against the rows before it, from its int8 dots with them:
    /// `head` with the first rows, `tail` with those after them (the two
    /// parts of a four-row scan). The approximate similarities go to
    /// `approx`, a buffer a scan reuses from row to row; one plain loop a
    /// part, which the compiler vectorises.
    fn earlier<'a>(
        &'a self,
        p: usize,
        head: &[i32],
        tail: &[i32],
        approx: &'a mut Vec<f32>,
    ) -> Earlier<'a> {
        let sp = self.scales[p];
        let (sh, st) = self.scales[..head.len() + tail.len()].split_at(head.len());
        approx.clear();
        for (dots, scales) in [(head, sh), (tail, st)] {
            approx.extend(
                dots.iter()
                    .zip(scales)
                    .map(|(&dot, &sq)| sp * sq * dot as f32),
            );
        }
        Earlier {
            g: self,
            p,
            top: crate::core::vector::highest(approx),
            approx,
            widest: self.bound(p, self.max_norm, self.max_err),
        }
    }

    /// How far row `p`'s approximate similarity to a row of length `nq` and
    /// quantisation error `eq` can be from the exact one:
    /// v_p·v_q − v̂_p·v̂_q = (v_p − v̂_p)·v_q + v̂_p·(v_q − v̂_q).
    fn bound(&self, p: usize, nq: f32, eq: f32) -> f32 {
        self.err[p] * nq + self.code_norm[p] * eq + ROUNDING_SLACK
    }

    /// Row `p` alone against the rows before it (`approx`: its buffer).
    fn earlier_alone<'a>(&'a self, p: usize, approx: &'a mut Vec<f32>) -> Earlier<'a> {
        self.earlier(p, &self.dots_of(p), &[], approx)
    }

    /// The first row before `p` (in batch order) more similar to it than
    /// `threshold` that `accept` takes; `maybe` is the row's list from
    /// [`Self::scan_earlier`] for the same threshold. `accept` is asked
    /// first: a cheap test spares the exact similarity of the rows it
    /// refuses.
    pub fn first_earlier_above(
        &self,
        p: usize,
        threshold: f32,
        maybe: Option<&[usize]>,
        mut accept: impl FnMut(usize) -> bool,
    ) -> Option<usize> {
        let mut exact = |q: usize| accept(q) && self.sim(p, q) > threshold;
        match maybe {
            Some(rows) => rows.iter().copied().find(|&q| exact(q)),
            None => self
                .earlier_alone(p, &mut Vec::new())
                .maybe_above(threshold)
                .find(|&q| exact(q)),
        }
    }

    /// For each row, the highest similarity to a row before it (0 when none
    /// is positive). Rows are scanned in parallel.
    pub fn max_earlier(&self) -> Vec<f32> {
        self.per_row(|earlier| earlier.best().0)
    }

    /// Row `p`'s [`Self::max_earlier`] alone.
    pub fn max_earlier_of(&self, p: usize) -> f32 {
        self.earlier_alone(p, &mut Vec::new()).best().0
    }

    /// One scan for both of `dedupe`'s questions: for each row, the rows
    /// before it (in order) whose similarity may pass `threshold`, None past
    /// [`NEAR_CAP`] of them (a batch of near-copies, for
    /// [`Self::first_earlier_above`] to rescan); and its highest similarity
    /// to a row before it with that row (None when the highest is 0), which
    /// `score_surprise` reuses.
    pub fn scan_earlier(&self, threshold: f32) -> Vec<ScannedRow> {
        self.per_row(|earlier| {
            let mut rows = earlier.maybe_above(threshold);
            let listed: Vec<usize> = rows.by_ref().take(NEAR_CAP).collect();
            let maybe = rows.next().is_none().then_some(listed);
            (maybe, earlier.best())
        })
    }

    /// `f` of every row against the rows before it, in row order. Rows are
    /// taken four at a time, so the codes before them are streamed once for
    /// all four ([`crate::core::vector::dot_i8_rows4`]); large groups spread
    /// over the CPUs in interleaved blocks (row `p` costs `p` dot products).
    fn per_row<T: Send>(&self, f: impl Fn(&Earlier<'_>) -> T + Sync) -> Vec<T> {
        let n = self.idx.len();
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get().min(4));
        if n < PARALLEL_SCAN_ROWS || threads == 1 {
            let mut out = Vec::with_capacity(n);
            self.scan(0..n, &f, &mut out);
            return out.into_iter().map(|(_, v)| v).collect();
        }
        let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
        std::thread::scope(|scope| {
            let f = &f;
            let parts: Vec<_> = (0..threads)
                .map(|t| {
                    scope.spawn(move || {
                        let mut part = Vec::new();
                        for start in (t * SCAN_BLOCK..n).step_by(threads * SCAN_BLOCK) {
                            self.scan(start..(start + SCAN_BLOCK).min(n), f, &mut part);
                        }
                        part
                    })
                })
                .collect();
            for part in parts {
                for (p, v) in part.join().expect("scan thread") {
                    out[p] = Some(v);
                }
            }
        });
        out.into_iter()
            .map(|v| v.expect("every row scanned"))
            .collect()
    }

    /// `f` of the rows of `rows`, four at a time, into `out`.
    fn scan<T>(
        &self,
        rows: std::ops::Range<usize>,
        f: &impl Fn(&Earlier<'_>) -> T,
        out: &mut Vec<(usize, T)>,
    ) {
        let d = self.dim;
        let mut p0 = rows.start;
        let (mut shared, mut approx, mut near) = (Vec::new(), Vec::new(), [0i32; 3]);
        while p0 < rows.end {
            if p0 + 4 > rows.end {
                out.push((p0, f(&self.earlier_alone(p0, &mut approx))));
                p0 += 1;
                continue;
            }
            // The four rows against every row before the first of them...
            shared.clear();
            shared.resize(4 * p0, 0);
            crate::core::vector::dot_i8_rows4(
                &self.codes[p0 * d..(p0 + 4) * d],
                &self.codes[..p0 * d],
                &mut shared,
                self.top,
            );
            for k in 0..4 {
                // ...and each against those of the four before it.
                let p = p0 + k;
                let tail = &mut near[..k];
                crate::core::vector::dot_i8_rows(
                    &self.codes[p * d..(p + 1) * d],
                    &self.codes[p0 * d..p * d],
                    tail,
                );
                let head = &shared[k * p0..(k + 1) * p0];
                out.push((p, f(&self.earlier(p, head, tail, &mut approx))));
            }
            p0 += 4;
        }
    }
}

/// What [`StreamVectors::scan_earlier`] finds for one row: the rows before
/// it that may pass the threshold (None past [`NEAR_CAP`]), and its highest
/// similarity to a row before it with that row.
pub type ScannedRow = (Option<Vec<usize>>, (f32, Option<usize>));

/// Row `p` of a group against the rows before it: their approximate
/// similarities and the highest of them; the exact similarity to row `q`
/// lies within `g.bound(p, norm[q], err[q])` of `approx[q]`, and within
/// `widest` for every row.
struct Earlier<'a> {
    g: &'a StreamVectors,
    p: usize,
    approx: &'a [f32],
    top: f32,
    widest: f32,
}

impl Earlier<'_> {
    /// The upper bound of the similarity to row `q`.
    fn upper(&self, q: usize) -> f32 {
        self.approx[q] + self.g.bound(self.p, self.g.norm[q], self.g.err[q])
    }

    /// The rows whose similarity may pass `threshold`, in order.
    fn maybe_above(&self, threshold: f32) -> impl Iterator<Item = usize> + '_ {
        let widest = self.widest;
        positions(self.approx, move |a| a + widest > threshold)
            .filter(move |&q| self.upper(q) > threshold)
    }

    /// The highest similarity (0 when none is positive) and its first row.
    fn best(&self) -> (f32, Option<usize>) {
        // The exact maximum is at least the best approximate one less the
        // widest bound, so only rows whose upper bound reaches that can hold it.
        let floor = (self.top - self.widest).max(0.0);
        let widest = self.widest;
        positions(self.approx, move |a| a + widest >= floor)
            .filter(|&q| self.upper(q) >= floor)
            .map(|q| (self.g.sim(self.p, q), q))
            .fold(
                (0.0f32, None),
                |best, (s, q)| {
                    if s > best.0 {
                        (s, Some(q))
                    } else {
                        best
                    }
                },
            )
    }
}

/// The positions of the values `keep` takes, in order. A scan's tests take
/// few of them, so each run of 16 is first tested as a whole, which the
/// compiler does in vector registers, and only a run with one is looked
/// through.
fn positions<'a>(
    values: &'a [f32],
    keep: impl Fn(f32) -> bool + Copy + 'a,
) -> impl Iterator<Item = usize> + 'a {
    values
        .chunks(POSITION_RUN)
        .enumerate()
        .filter(move |(_, run)| run.iter().fold(false, |any, &v| any | keep(v)))
        .flat_map(move |(r, run)| {
            run.iter()
                .enumerate()
                .filter(move |&(_, &v)| keep(v))
                .map(move |(i, _)| r * POSITION_RUN + i)
        })
}

/// Values [`positions`] tests as a whole.
const POSITION_RUN: usize = 16;

/// Rows a within-batch scan keeps as maybe-near per row before it gives up
/// and rescans that row when asked.
const NEAR_CAP: usize = 64;
/// Groups at least this large are scanned on several threads...
const PARALLEL_SCAN_ROWS: usize = 512;
/// ...in blocks of this many rows.
const SCAN_BLOCK: usize = 32;

/// Fill `neighbors` (the `k` most similar latest memories of the record's
/// stream) for every kept, embedded record that lacks them: one batched vector
/// search per stream.
pub async fn ensure_neighbors(
    store: &Store,
    batch: &mut [Record],
    k: usize,
) -> Result<(), PipelineError> {
    let mut by_stream: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, r) in batch.iter().enumerate() {
        if r.is_kept() && r.neighbors.is_none() && r.chunk.embedding.is_some() {
            by_stream.entry(r.chunk.stream.clone()).or_default().push(i);
        }
    }
    for (stream, idx) in by_stream {
        let vectors: Vec<&[f32]> = idx
            .iter()
            .map(|i| batch[*i].chunk.embedding.as_deref().expect("filtered"))
            .collect();
        let found = store
            .nearest_many(&stream, &vectors, k)
            .await
            .map_err(|e| PipelineError::Batch {
                stage: "neighbors",
                message: e.to_string(),
            })?;
        for (i, n) in idx.into_iter().zip(found) {
            batch[i].neighbors = Some(n);
        }
    }
    Ok(())
}

/// What one stage did to one batch.
#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    pub stage: &'static str,
    pub records_in: usize,
    pub records_out: usize,
    pub dropped: BTreeMap<&'static str, usize>,
    pub failed: usize,
    pub micros: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineFile {
    #[serde(default)]
    description: String,
    stages: Vec<StageDef>,
}

#[derive(Debug, Deserialize)]
struct StageDef {
    stage: String,
    #[serde(flatten)]
    params: toml::Table,
}

pub struct Pipeline {
    pub name: String,
    pub description: String,
    stages: Vec<Box<dyn Stage>>,
    stats: Vec<StageStats>,
}

impl Pipeline {
    /// Build a pipeline from the text of its definition file.
    pub fn from_toml(
        name: &str,
        text: &str,
        ctx: &BuildContext,
    ) -> Result<Pipeline, PipelineError> {
        let def_err = |message: String| PipelineError::Definition {
            file: format!("{name}.toml"),
            message,
        };
        let file: PipelineFile = toml::from_str(text).map_err(|e| def_err(e.to_string()))?;
        if file.stages.last().map(|s| s.stage.as_str()) != Some("write") {
            return Err(def_err("the last stage must be `write`".into()));
        }
        let mut stages = Vec::new();
        for def in file.stages {
            stages.push(stages::build(&def.stage, def.params, ctx)?);
        }
        let stats = stages
            .iter()
            .map(|s| StageStats::new(name, s.name()))
            .collect();
        Ok(Pipeline {
            name: name.to_string(),
            description: file.description,
            stages,
            stats,
        })
    }

    pub fn stage_names(&self) -> Vec<&'static str> {
        self.stages.iter().map(|s| s.name()).collect()
    }

    /// Run only the stage called `name` (as this pipeline configured it) over
    /// stored memories, and wait for its side writes; nothing is committed.
    /// Maintenance uses it to redo one step (`retag-all`, `score-all`).
    pub async fn rerun(&self, name: &str, batch: &mut [Record]) -> Result<bool, PipelineError> {
        let Some(stage) = self.stages.iter().find(|s| s.name() == name) else {
            return Ok(false);
        };
        stage.process(batch).await?;
        settle(batch, stage.name()).await?;
        Ok(true)
    }

    /// Run the batch through every stage; the `write` stage commits what is kept.
    pub async fn run(&self, batch: &mut [Record]) -> Result<Vec<StageReport>, PipelineError> {
        let mut reports = self.run_ahead(batch).await?;
        reports.extend(self.run_rest(batch).await?);
        Ok(reports)
    }

    /// How many leading stages may run ahead (see [`Stage::runs_ahead`]).
    fn ahead(&self) -> usize {
        self.stages.iter().take_while(|s| s.runs_ahead()).count()
    }

    /// The leading stages that may run while earlier batches are written.
    /// Then the next stage's preparation (see [`Stage::prepare`]), counted
    /// in that stage's time.
    pub async fn run_ahead(&self, batch: &mut [Record]) -> Result<Vec<StageReport>, PipelineError> {
        let ahead = self.ahead();
        let reports = self.run_stages(batch, 0..ahead).await?;
        if let (Some(next), Some(stats)) = (self.stages.get(ahead), self.stats.get(ahead)) {
            let started = Instant::now();
            next.prepare(batch).await?;
            stats.add_micros(started.elapsed().as_micros() as u64);
        }
        Ok(reports)
    }

    /// The stages after [`Pipeline::run_ahead`]'s, in batch order.
    pub async fn run_rest(&self, batch: &mut [Record]) -> Result<Vec<StageReport>, PipelineError> {
        self.run_stages(batch, self.ahead()..self.stages.len())
            .await
    }

    async fn run_stages(
        &self,
        batch: &mut [Record],
        range: std::ops::Range<usize>,
    ) -> Result<Vec<StageReport>, PipelineError> {
        let mut reports = Vec::with_capacity(range.len());
        for (stage, stats) in self.stages[range.clone()].iter().zip(&self.stats[range]) {
            let before: Vec<bool> = batch.iter().map(Record::is_kept).collect();
            let records_in = before.iter().filter(|k| **k).count();
            let started = Instant::now();
            stage.process(batch).await?;
            let micros = started.elapsed().as_micros() as u64;
            let mut report = StageReport {
                stage: stage.name(),
                records_in,
                records_out: 0,
                dropped: BTreeMap::new(),
                failed: 0,
                micros,
            };
            for (r, was_kept) in batch.iter().zip(before) {
                match (&r.disposition, was_kept) {
                    (Disposition::Keep, _) => report.records_out += 1,
                    (Disposition::Drop { reason, .. }, true) => {
                        *report.dropped.entry(reason).or_default() += 1
                    }
                    (Disposition::Fail(_), true) => report.failed += 1,
                    _ => {}
                }
            }
            stats.record(&report);
            reports.push(report);
        }
        Ok(reports)
    }

    pub fn stats(&self) -> Vec<StageStatsSnapshot> {
        self.stats.iter().map(StageStats::snapshot).collect()
    }
}

/// Every pipeline defined in a directory, by file stem.
pub struct Pipelines {
    by_name: HashMap<String, Arc<Pipeline>>,
}

impl Pipelines {
    /// Load every `*.toml` in `dir`; `required` names must be among them.
    pub fn load(
        dir: &Path,
        required: &[&str],
        ctx: &BuildContext,
    ) -> Result<Pipelines, PipelineError> {
        let dir_err = |message: String| PipelineError::Definition {
            file: dir.display().to_string(),
            message,
        };
        let entries = std::fs::read_dir(dir).map_err(|e| dir_err(e.to_string()))?;
        let mut by_name = HashMap::new();
        for entry in entries {
            let path = entry.map_err(|e| dir_err(e.to_string()))?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("toml") {
                continue;
            }
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            let text = std::fs::read_to_string(&path).map_err(|e| dir_err(e.to_string()))?;
            by_name.insert(
                name.clone(),
                Arc::new(Pipeline::from_toml(&name, &text, ctx)?),
            );
        }
        for name in required {
            if !by_name.contains_key(*name) {
                return Err(dir_err(format!("no pipeline `{name}.toml`")));
            }
        }
        Ok(Pipelines { by_name })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Pipeline>> {
        self.by_name.get(name)
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<Pipeline>> {
        self.by_name.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::embed::HashEmbedder;

    /// The scan's run-at-a-time test gives what a plain loop gives, at
    /// every length around its runs, wherever the values it picks lie.
    #[test]
    fn the_positions_taken_are_the_plain_loops_answers() {
        for n in 0..70usize {
            // A few values stand out, in different runs for each length.
            let values: Vec<f32> = (0..n)
                .map(|i| match (i * 7 + n) % 23 {
                    0 => 2.0 + i as f32,
                    _ => ((i * 37 + n * 11) % 101) as f32 / 100.0 - 0.5,
                })
                .collect();
            for cut in [-1.0, 0.0, 0.45, 1.5, 10.0] {
                let want: Vec<usize> = (0..n).filter(|&i| values[i] > cut).collect();
                let got: Vec<usize> = positions(&values, |v| v > cut).collect();
                assert_eq!(got, want, "length {n}, cut {cut}");
            }
        }
    }

    /// The int8 scans with their exact checks give the exact scan's answers.
    #[test]
    fn within_batch_scans_answer_as_the_exact_scan_does() {
        let e = HashEmbedder::new(384);
        let words = [
            "tea",
            "coffee",
            "Lisbon",
            "Berlin",
            "cello",
            "Rust",
            "April",
            "dark mode",
        ];
        let batch: Vec<Record> = (0..1200usize)
            .map(|i| {
                // Overlapping texts: many pairs are close, some are equal.
                let text = format!(
                    "Alice likes {} and {} on {}",
                    words[i % 8],
                    words[(i / 8) % 8],
                    words[(i * 7 / 5) % 8]
                );
                let mut c = Chunk::new(format!("r{i}"), format!("s{}", i % 2), text.clone(), 0);
                c.embedding = Some(e.embed_one(&text));
                Record::new(c)
            })
            .collect();
        let groups = StreamVectors::of(&batch);
        assert_eq!(groups.len(), 2);
        let best: Vec<Vec<f32>> = groups.iter().map(StreamVectors::max_earlier).collect();
        let scanned: Vec<Vec<(f32, Vec<ScannedRow>)>> = groups
            .iter()
            .map(|g| {
                [0.5, 0.8, 0.92, 0.999]
                    .into_iter()
                    .map(|t| (t, g.scan_earlier(t)))
                    .collect()
            })
            .collect();
        // Some rows have too many close ones to list; they are rescanned.
        assert!(scanned
            .iter()
            .flatten()
            .any(|(_, m)| m.iter().any(|(listed, _)| listed.is_none())));
        let (mut close, mut equal) = (0, 0);
        for (gi, g) in groups.iter().enumerate() {
            for p in 0..g.idx.len() {
                let exact = (0..p).map(|q| g.sim(p, q)).fold(0.0f32, f32::max);
                assert_eq!(best[gi][p], exact, "row {p}");
                assert_eq!(g.max_earlier_of(p), exact, "row {p}");
                for (threshold, scanned) in &scanned[gi] {
                    // The same highest, and the row that has it.
                    let (similarity, at) = scanned[p].1;
                    assert_eq!(similarity, exact, "row {p}");
                    match at {
                        Some(q) => assert!(q < p && g.sim(p, q) == exact, "row {p}"),
                        None => assert_eq!(exact, 0.0, "row {p}"),
                    }
                    let odd = |q: &usize| q % 2 == 1;
                    let want = (0..p).find(|q| g.sim(p, *q) > *threshold && odd(q));
                    for listed in [scanned[p].0.as_deref(), None] {
                        assert_eq!(
                            g.first_earlier_above(p, *threshold, listed, |q| odd(&q)),
                            want,
                            "row {p}, threshold {threshold}"
                        );
                    }
                }
                close += usize::from(exact > 0.8);
                equal += usize::from(exact > 0.999);
            }
        }
        assert!(close > 50 && equal > 10, "{close} close, {equal} equal");
    }

    async fn ctx(dir: &Path) -> BuildContext {
        BuildContext {
            store: Arc::new(Store::open(dir, 16, 100).await.unwrap()),
            embedder: Arc::new(HashEmbedder::new(16)),
            llm: None,
            ner: None,
            dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines"),
        }
    }

    #[tokio::test]
    async fn every_shipped_pipeline_builds() {
        let tmp = tempfile::tempdir().unwrap();
        let ctx = ctx(tmp.path()).await;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines");
        let all = Pipelines::load(&dir, &["store", "import", "ingest"], &ctx).unwrap();
        assert_eq!(
            all.get("store").unwrap().stage_names(),
            vec![
                "sanitize",
                "redact_pii",
                "extract_entities",
                "embed",
                "dedupe",
                "score_surprise",
                "detect_contradictions",
                "write"
            ]
        );
    }

    #[tokio::test]
    async fn definitions_are_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let ctx = ctx(tmp.path()).await;
        let bad = [
            (
                "[[stages]]\nstage = \"sanitize\"\n",
                "last stage must be `write`",
            ),
            (
                "[[stages]]\nstage = \"teleport\"\n[[stages]]\nstage = \"write\"\n",
                "unknown stage",
            ),
            (
                "[[stages]]\nstage = \"redact_pii\"\nemail = true\n[[stages]]\nstage = \"write\"\n",
                "unknown field `email`",
            ),
        ];
        for (text, want) in bad {
            let err = Pipeline::from_toml("t", text, &ctx)
                .err()
                .expect("refused")
                .to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[tokio::test]
    async fn the_runner_reports_what_each_stage_did() {
        let tmp = tempfile::tempdir().unwrap();
        let ctx = ctx(tmp.path()).await;
        let text = "[[stages]]\nstage = \"sanitize\"\n[[stages]]\nstage = \"embed\"\n[[stages]]\nstage = \"write\"\n";
        let p = Pipeline::from_toml("t", text, &ctx).unwrap();
        let mut batch = vec![
            Record::new(Chunk::new("1".into(), "s".into(), "<b>kept</b>".into(), 1)),
            Record::new(Chunk::new("2".into(), "s".into(), "<br>".into(), 1)),
        ];
        let reports = p.run(&mut batch).await.unwrap();
        assert_eq!(reports[0].records_in, 2);
        assert_eq!(reports[0].records_out, 1);
        assert_eq!(reports[0].dropped["empty_after_sanitize"], 1);
        assert_eq!(reports[2].records_out, 1);
        let stored = ctx.store.get("1").await.unwrap().unwrap();
        assert_eq!(stored.content, "kept");
        assert_eq!(stored.embed_model.as_deref(), Some("hash-16"));
        assert!(ctx.store.get("2").await.unwrap().is_none());
        assert_eq!(p.stats()[0].records_in, 2);
    }
}
