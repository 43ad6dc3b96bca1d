//! A stream's rows read straight from the chunk table's fragments, for the
//! hot index's loads.
//!
//! A load through lancedb's query plans every read in DataFusion, evaluates
//! the `stream` index, and opens a reader for every fragment, which clones
//! and converts the schema's fields each time; on the 1M arrival store that
//! was about half of a small stream's first search. Here each fragment keeps
//! a reader open and a directory of where each stream's rows lie in it (the
//! ordered merges leave one run a stream), so a load reads those ranges and
//! nothing else.
//!
//! What can be kept and for how long:
//! - a fragment's data files never change, so the directory of the file that
//!   holds `stream` holds for as long as the fragment keeps its files (a
//!   merge or a rewrite gives the rows a new fragment). It counts deleted
//!   rows too; the reader drops them.
//! - the reader reads the fragment as its manifest entry was when opened
//!   (its deletion vector), so it is opened again when the entry changes
//!   (a delete, an update) or the table's schema does.
//!
//! A column of [`SPARSE`] that holds nothing anywhere in a fragment (`tags`
//! where no memory is tagged, `entities` where none were found, the
//! optional fields no writer set) is left out of that fragment's reads, and
//! its rows come back without it (empty lists, no values). Each column read
//! costs Lance a decode scheduler and a read per fragment, whatever the
//! rows; and a list column with no item is a page of nulls with one
//! repetition level a row, whose first wanted row Lance finds by walking
//! the levels from the page's start: for a fragment of half a million rows
//! that walk was a fifth of a small stream's load, every load (README,
//! session 92). Whether a column is empty is learnt with the directory,
//! from the same whole read: [`SPARSE`] holds the columns often empty whose
//! values are short (not `metadata`, nor `extraction_meta`).
//!
//! Likewise a column of [`UNIFORM`] with one value in every row of a
//! fragment (`pinned`, `embed_model`, a new memory's defaults) is left out
//! of its reads and put back from that value, learnt in the same whole
//! read; and `stream`, which every read knows, is never read. A local
//! table's files are read from their mappings on the decoding thread
//! ([`super::mapped`]; README, session 93).

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use arrow_array::{Array, ArrayRef, ListArray, RecordBatch, Scalar, StringArray, UInt32Array};
use arrow_ord::cmp::not_distinct;
use arrow_schema::{ArrowError, DataType, Field, FieldRef, Schema as ArrowSchema};
use arrow_select::take::take;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use lance::dataset::fragment::{FileFragment, FragReadConfig, FragmentReader};
use lance::datatypes::Schema;
use lance::table::format::Fragment;
use lance::Dataset;
use lance_file::reader::FileReaderOptions;
use lance_io::scheduler::ScanScheduler;
use lancedb::connection::LanceFileVersion;
use lancedb::Table;

use super::mapped::{self, MappedStore};
use super::CHUNK_ORDER;

/// Rows a read decodes at once: Lance's own batches.
const BATCH_ROWS: u32 = 8192;

/// Where each stream's rows lie in one fragment: physical row ranges, in
/// order, deleted rows included.
type Directory = HashMap<Box<str>, Arc<[Range<u64>]>>;

/// The columns a fragment's reads leave out where they hold nothing: no
/// value, or for lists no item.
const SPARSE: [&str; 15] = [
    "title",
    "subject",
    "source",
    "tags",
    "entities",
    "user_id",
    "app_id",
    "agent_id",
    "session_id",
    "expires_at",
    "valid_from",
    "valid_until",
    "supersedes",
    "superseded_by",
    "last_accessed_at",
];

/// The columns a fragment's reads leave out where every row holds the same
/// value: short values that most memories share (a new memory's defaults,
/// the one embedding model), put back in each batch from that value.
const UNIFORM: [&str; 10] = [
    "level",
    "memory_type",
    "importance",
    "confidence",
    "surprise",
    "pinned",
    "immutable",
    "version",
    "embed_model",
    "access_count",
];

/// What a fragment's rows hold, learnt once from its data files.
#[derive(Debug)]
struct Contents {
    directory: Directory,
    /// The columns of [`SPARSE`] with nothing in any row (deleted rows
    /// included): not read.
    empty: Vec<&'static str>,
    /// The columns of [`UNIFORM`] with one value in every row (deleted rows
    /// included), each with that value (one row): not read, put back.
    uniform: Vec<(&'static str, ArrayRef)>,
}

impl Contents {
    /// `schema` without the columns not read: the empty and uniform ones,
    /// and `stream`, which every read knows (it reads one stream's rows).
    fn projection(&self, schema: &Schema) -> lancedb::Result<Schema> {
        let read: Vec<&str> = schema
            .fields
            .iter()
            .map(|f| f.name.as_str())
            .filter(|n| {
                *n != CHUNK_ORDER
                    && !self.empty.contains(n)
                    && !self.uniform.iter().any(|(u, _)| u == n)
            })
            .collect();
        schema.project(&read).map_err(lancedb::Error::from)
    }

    /// A batch of `stream`'s rows read from the fragment, with the columns
    /// the read left out but holding something put back: `stream`, and the
    /// uniform columns' values.
    fn fill(&self, batch: RecordBatch, stream: &str) -> Result<RecordBatch, ArrowError> {
        let n = batch.num_rows();
        let (schema, mut columns, _) = batch.into_parts();
        let mut fields: Vec<FieldRef> = schema.fields().iter().cloned().collect();
        let zeros = UInt32Array::from(vec![0u32; n]);
        fields.push(Arc::new(Field::new(CHUNK_ORDER, DataType::Utf8, false)));
        columns.push(Arc::new(StringArray::from_iter_values(
            std::iter::repeat_n(stream, n),
        )));
        for (name, value) in &self.uniform {
            fields.push(Arc::new(Field::new(*name, value.data_type().clone(), true)));
            columns.push(take(value.as_ref(), &zeros, None)?);
        }
        RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns)
    }
}

/// How many fragments are kept open at most: each open reader holds its data
/// files open. Past it (a table whose small fragments wait for their merge)
/// a fragment is opened for each read, as lancedb's query does.
const MAX_OPEN: usize = 256;

/// One fragment as a load reads it.
struct Opened {
    /// The manifest entry the reader was opened for.
    fragment: Fragment,
    /// None when [`MAX_OPEN`] others were open.
    reader: Option<Arc<FragmentReader>>,
    contents: Arc<Contents>,
}

/// The chunk table's fragments, open for loads (see the module's notes).
pub(super) struct StreamReads {
    state: Mutex<State>,
    /// [`MAX_OPEN`], but in tests.
    max_open: usize,
    /// A local table's reads, made on the thread that awaits them
    /// ([`super::mapped`]); made on the first read of a local table.
    local: OnceLock<Local>,
}

/// The scheduler a local table's readers read through, and its store.
struct Local {
    scheduler: Arc<ScanScheduler>,
    store: Arc<MappedStore>,
}

impl Default for StreamReads {
    fn default() -> StreamReads {
        StreamReads {
            state: Mutex::default(),
            max_open: MAX_OPEN,
            local: OnceLock::new(),
        }
    }
}

#[derive(Default)]
struct State {
    /// The schema the readers project (the table's whole schema).
    schema: Option<Schema>,
    fragments: HashMap<u64, Arc<Opened>>,
    /// How many directories were built (for the tests: a delete keeps them).
    built: usize,
}

/// A stream's rows, batch by batch.
pub(super) type Rows = BoxStream<'static, lancedb::Result<RecordBatch>>;

impl StreamReads {
    /// `stream`'s rows in `table`'s latest version, every column; None where
    /// this read cannot serve (not a local Lance table, or one in the legacy
    /// file format or with stable row ids), and the caller asks lancedb.
    pub async fn read(&self, table: &Table, stream: &str) -> lancedb::Result<Option<Rows>> {
        let Some(handle) = table.dataset() else {
            return Ok(None);
        };
        let ds = handle.get().await?;
        let format = ds
            .manifest
            .data_storage_format
            .lance_file_format()
            .to_selector();
        if ds.manifest.uses_stable_row_ids() || format == LanceFileVersion::Legacy {
            return Ok(None);
        }
        let cached: HashMap<u64, Arc<Opened>> = {
            let mut st = self.state.lock().expect("stream reads lock");
            if st.schema.as_ref() != Some(ds.schema()) {
                st.schema = Some(ds.schema().clone());
                st.fragments.clear();
            }
            let live: HashSet<u64> = ds.manifest.fragments.iter().map(|f| f.id).collect();
            st.fragments.retain(|id, _| live.contains(id));
            st.fragments.clone()
        };
        let config = self.config(&ds).await?;
        let mut reads = Vec::new();
        for file in ds.get_fragments() {
            let kept = cached.get(&(file.id() as u64));
            let opened = self.open(&ds, &file, kept, &config).await?;
            let Some(ranges) = opened.contents.directory.get(stream) else {
                continue;
            };
            let reader = match &opened.reader {
                Some(reader) => Arc::clone(reader),
                None => Arc::new(open_reader(&file, &opened.contents, ds.schema(), &config).await?),
            };
            let ranges = Arc::clone(ranges);
            let contents = Arc::clone(&opened.contents);
            reads.push(async move {
                let batches = reader.read_ranges(ranges, BATCH_ROWS).await?;
                lance::Result::Ok((batches, contents))
            });
        }
        let streams = futures::future::try_join_all(reads).await?;
        // The batches are decoded where they are polled: decoding each on
        // a task of its own cost 16 searchers a quarter of their queries and
        // held more batches in memory at once (README, session 62).
        let stream: Arc<str> = stream.into();
        let rows = futures::stream::select_all(streams.into_iter().map(|(s, contents)| {
            let stream = Arc::clone(&stream);
            s.buffered(2).map(move |batch| {
                let batch = batch.map_err(lancedb::Error::from)?;
                contents.fill(batch, &stream).map_err(lancedb::Error::from)
            })
        }));
        Ok(Some(rows.boxed()))
    }

    /// `file` ready for reads: `kept` when it was opened for the same
    /// manifest entry; else opened again (while fewer than [`MAX_OPEN`] are
    /// open, or `kept` was), with `kept`'s contents while the data files
    /// are the same.
    async fn open(
        &self,
        ds: &Dataset,
        file: &FileFragment,
        kept: Option<&Arc<Opened>>,
        config: &FragReadConfig,
    ) -> lancedb::Result<Arc<Opened>> {
        let fragment = file.metadata();
        if let Some(opened) = kept.filter(|o| o.fragment == *fragment) {
            return Ok(Arc::clone(opened));
        }
        let same_rows = |o: &&Arc<Opened>| {
            o.fragment.files == fragment.files && o.fragment.overlays == fragment.overlays
        };
        let (contents, built) = match kept.filter(same_rows) {
            Some(o) => (Arc::clone(&o.contents), false),
            None => (Arc::new(contents(file, ds.schema(), config).await?), true),
        };
        let room = {
            let st = self.state.lock().expect("stream reads lock");
            let open = st.fragments.values().filter(|o| o.reader.is_some());
            open.count() < self.max_open || kept.is_some_and(|o| o.reader.is_some())
        };
        let reader = match room {
            true => Some(Arc::new(
                open_reader(file, &contents, ds.schema(), config).await?,
            )),
            false => None,
        };
        let opened = Arc::new(Opened {
            fragment: fragment.clone(),
            reader,
            contents,
        });
        let mut st = self.state.lock().expect("stream reads lock");
        st.built += usize::from(built);
        st.fragments.insert(opened.fragment.id, Arc::clone(&opened));
        Ok(opened)
    }

    /// How `ds`'s fragments are read: a local table's through
    /// [`super::mapped`], whose handles of files no fragment holds any more
    /// are closed here; else as Lance reads them.
    async fn config(&self, ds: &Dataset) -> lancedb::Result<FragReadConfig> {
        if !ds.object_store(None).await?.is_local() {
            return Ok(FragReadConfig::default());
        }
        let local = self.local.get_or_init(|| {
            let (scheduler, store) = mapped::scheduler();
            Local { scheduler, store }
        });
        let data = ds.data_dir();
        let live: HashSet<object_store::path::Path> = ds
            .manifest
            .fragments
            .iter()
            .flat_map(|f| &f.files)
            .filter(|d| d.base_id.is_none())
            .map(|d| data.clone().join(d.path.as_str()))
            .collect();
        local.store.keep_only(&live);
        Ok(FragReadConfig {
            scan_scheduler: Some(Arc::clone(&local.scheduler)),
            // A read of a mapped file is a slice of it, however long: not
            // split into Lance's 8 MiB parts and copied back together.
            file_reader_options: Some(FileReaderOptions {
                read_chunk_size: u64::MAX,
                ..FileReaderOptions::default()
            }),
            ..FragReadConfig::default()
        })
    }

    /// Keeping at most `max_open` fragments open.
    #[cfg(test)]
    fn keeping(max_open: usize) -> StreamReads {
        StreamReads {
            max_open,
            ..StreamReads::default()
        }
    }

    /// How many data files stay mapped once every file is closed and every
    /// fragment let go: those whose bytes something else still holds.
    #[cfg(test)]
    pub fn mapped_after_closing(&self) -> usize {
        let local = self.local.get().expect("a local table is read mapped");
        self.state
            .lock()
            .expect("stream reads lock")
            .fragments
            .clear();
        local.store.keep_only(&HashSet::new());
        local.store.mapped_files()
    }

    /// How many fragment directories have been built.
    #[cfg(test)]
    pub fn built(&self) -> usize {
        self.state.lock().expect("stream reads lock").built
    }
}

/// `file` open for reads of every column of `schema` that `contents` does
/// not leave out.
async fn open_reader(
    file: &FileFragment,
    contents: &Contents,
    schema: &Schema,
    config: &FragReadConfig,
) -> lancedb::Result<FragmentReader> {
    file.open(&contents.projection(schema)?, config.clone())
        .await
        .map_err(lancedb::Error::from)
}

/// What `file` holds: its `stream` column read whole, deleted rows
/// included, runs of one stream gathered into ranges; and which of
/// [`SPARSE`] hold nothing (read whole beside it).
async fn contents(
    file: &FileFragment,
    schema: &Schema,
    config: &FragReadConfig,
) -> lancedb::Result<Contents> {
    let sparse: Vec<&'static str> = SPARSE
        .into_iter()
        .filter(|n| schema.field(n).is_some())
        .collect();
    let uniform_names: Vec<&'static str> = UNIFORM
        .into_iter()
        .filter(|n| schema.field(n).is_some())
        .collect();
    let columns: Vec<&str> = std::iter::once(CHUNK_ORDER)
        .chain(sparse.iter().copied())
        .chain(uniform_names.iter().copied())
        .collect();
    let projection = schema.project(&columns).map_err(lancedb::Error::from)?;
    let config = FragReadConfig {
        ignore_deletions: true,
        ..config.clone()
    };
    let reader = file
        .open(&projection, config)
        .await
        .map_err(lancedb::Error::from)?;
    let mut batches = reader
        .read_all(BATCH_ROWS)
        .await
        .map_err(lancedb::Error::from)?
        .buffered(2);
    let mut out: HashMap<Box<str>, Vec<Range<u64>>> = HashMap::new();
    let mut at = 0u64;
    let mut run: Option<(Box<str>, u64)> = None;
    let mut held = vec![false; sparse.len()];
    // Each uniform column's first value (one row), until a row differs.
    let mut uniform: Vec<Option<ArrayRef>> = vec![None; uniform_names.len()];
    let mut mixed = vec![false; uniform_names.len()];
    while let Some(batch) = batches.try_next().await.map_err(lancedb::Error::from)? {
        for ((name, first), mixed) in uniform_names.iter().zip(&mut uniform).zip(&mut mixed) {
            if *mixed || batch.num_rows() == 0 {
                continue;
            }
            let Some(column) = batch.column_by_name(name) else {
                *mixed = true;
                continue;
            };
            let value = match first {
                Some(v) => v,
                // A copy, not a slice: the batch's buffers are not kept.
                None => first.insert(
                    take(column, &UInt32Array::from(vec![0u32]), None)
                        .map_err(lancedb::Error::from)?,
                ),
            };
            let same = not_distinct(column, &Scalar::new(Arc::clone(value)))
                .map_err(lancedb::Error::from)?;
            *mixed = same.true_count() != same.len();
        }
        for (held, name) in held.iter_mut().zip(&sparse) {
            *held |= batch.column_by_name(name).is_none_or(|c| {
                match c.as_any().downcast_ref::<ListArray>() {
                    Some(list) => !list.values().is_empty(),
                    None => c.null_count() < c.len(),
                }
            });
        }
        let streams = batch
            .column_by_name(CHUNK_ORDER)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(|| lancedb::Error::Runtime {
                message: "the stream column is not a string column".into(),
            })?;
        for i in 0..streams.len() {
            let s = streams.value(i);
            match &run {
                Some((current, _)) if **current == *s => {}
                _ => {
                    if let Some((name, start)) = run.take() {
                        out.entry(name).or_default().push(start..at);
                    }
                    run = Some((s.into(), at));
                }
            }
            at += 1;
        }
    }
    if let Some((name, start)) = run {
        out.entry(name).or_default().push(start..at);
    }
    Ok(Contents {
        directory: out.into_iter().map(|(s, r)| (s, r.into())).collect(),
        empty: sparse
            .into_iter()
            .zip(held)
            .filter(|(_, held)| !held)
            .map(|(n, _)| n)
            .collect(),
        uniform: uniform_names
            .into_iter()
            .zip(uniform)
            .zip(mixed)
            .filter_map(|((n, value), mixed)| Some((n, value.filter(|_| !mixed)?)))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use futures::TryStreamExt;
    use lancedb::query::{ExecutableQuery, QueryBase};

    use super::{StreamReads, UNIFORM};
    use crate::core::model::{batch_to_chunks, Chunk};
    use crate::store::maintain::{merge_fragments_in_tiers, Maintenance};
    use crate::store::{Filter, Location, Store, CHUNK_ORDER};

    /// (id, text) of every row of `stream`, sorted: read from the fragments
    /// by `reads`, and through lancedb's query.
    async fn both_reads(
        store: &Store,
        reads: &StreamReads,
        stream: &str,
    ) -> (Vec<(String, String)>, Vec<(String, String)>) {
        let whole = |batches: &[arrow_array::RecordBatch]| {
            let mut rows: Vec<Chunk> = batches
                .iter()
                .flat_map(|b| batch_to_chunks(b).unwrap())
                .collect();
            rows.sort_by(|a, b| a.id.cmp(&b.id));
            rows
        };
        let sorted = |batches: Vec<arrow_array::RecordBatch>| {
            let mut rows: Vec<(String, String)> = batches
                .iter()
                .flat_map(|b| batch_to_chunks(b).unwrap())
                .map(|c| {
                    assert_eq!(c.stream, stream);
                    (c.id, c.content)
                })
                .collect();
            rows.sort();
            rows
        };
        let table = store.chunks_table();
        let direct: Vec<arrow_array::RecordBatch> = reads
            .read(table, stream)
            .await
            .unwrap()
            .expect("a local table of the current format is read directly")
            .try_collect()
            .await
            .unwrap();
        let query: Vec<arrow_array::RecordBatch> = table
            .query()
            .only_if(Filter::new().stream(stream).predicate())
            .execute()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        // Every column of every row, the ones a read left out and put
        // back included.
        assert_eq!(whole(&direct), whole(&query), "stream {stream}");
        (sorted(direct), sorted(query))
    }

    /// How many data files `reads` holds open and mapped.
    fn open_files(reads: &StreamReads) -> usize {
        reads
            .local
            .get()
            .expect("a local table is read through its mapping")
            .store
            .open_files()
    }

    async fn agree(store: &Store, reads: &StreamReads, round: &str) {
        for s in ["s0", "s1", "s2", "nowhere"] {
            let (direct, query) = both_reads(store, reads, s).await;
            assert_eq!(direct, query, "stream {s} after {round}");
            assert_eq!(
                direct.is_empty(),
                s == "nowhere",
                "stream {s} after {round}"
            );
        }
    }

    /// Memories `from..from + n`, interleaved over three streams.
    fn interleaved(from: usize, n: usize) -> Vec<Chunk> {
        (from..from + n)
            .map(|i| {
                let mut c = Chunk::new(
                    format!("id{i}"),
                    format!("s{}", i % 3),
                    format!("memory {i}"),
                    0,
                );
                c.embedding = Some(vec![i as f32; 8]);
                c
            })
            .collect()
    }

    /// A store in `dir` that merges nothing itself, holding `commits`
    /// commits of [`interleaved`] memories, four each: a fragment each.
    async fn committed(dir: &std::path::Path, commits: usize) -> Store {
        let store = Store::open_with(&Location::local(dir), 8, 100, None, Maintenance::off())
            .await
            .unwrap();
        for k in 0..commits {
            store.upsert(interleaved(4 * k, 4)).await.unwrap();
        }
        store
    }

    /// A stream read straight from the fragments finds what lancedb's query
    /// finds, through ordered merges, new fragments, deletes and updates;
    /// a delete or an update opens the fragments it touched again but keeps
    /// their directories.
    #[tokio::test]
    async fn a_stream_read_from_the_fragments_is_what_the_query_reads() {
        let tmp = tempfile::tempdir().unwrap();
        let store = committed(tmp.path(), 24).await;
        agree(&store, &store.stream_reads, "24 commits").await;
        // Every fragment's file was read through its mapping, and is held open.
        assert_eq!(open_files(&store.stream_reads), 24);
        merge_fragments_in_tiers(store.chunks_table(), 4, CHUNK_ORDER)
            .await
            .unwrap();
        store
            .chunks_table()
            .dataset()
            .unwrap()
            .reload()
            .await
            .unwrap();
        for k in 24..27 {
            store.upsert(interleaved(4 * k, 4)).await.unwrap();
        }
        agree(
            &store,
            &store.stream_reads,
            "the ordered merge and three commits",
        )
        .await;
        // The merged fragments' files are closed: only the live ones stay.
        let live: usize = {
            let ds = store.chunks_table().dataset().unwrap().get().await.unwrap();
            ds.get_fragments()
                .iter()
                .map(|f| f.metadata().files.len())
                .sum()
        };
        assert!(live < 24, "the merge left {live} files");
        assert_eq!(open_files(&store.stream_reads), live);
        // The ordered fragments hold each stream as one run.
        let runs = {
            let st = store.stream_reads.state.lock().unwrap();
            st.fragments
                .values()
                .filter_map(|o| {
                    o.contents
                        .directory
                        .get("s1")
                        .map(|r| (r.len(), r[0].end - r[0].start))
                })
                .collect::<Vec<_>>()
        };
        assert!(runs.iter().any(|&(n, rows)| n == 1 && rows > 4), "{runs:?}");

        let built = store.stream_reads.built();
        let gone: Vec<String> = [1, 4, 7, 52, 100]
            .iter()
            .map(|i| format!("id{i}"))
            .collect();
        assert_eq!(store.delete(&Filter::new().ids(&gone)).await.unwrap(), 5);
        agree(&store, &store.stream_reads, "a delete").await;
        let (s1, _) = both_reads(&store, &store.stream_reads, "s1").await;
        assert!(s1.iter().all(|(id, _)| !gone.contains(id)), "{s1:?}");
        assert_eq!(
            store.stream_reads.built(),
            built,
            "a delete keeps the directories"
        );

        let mut changed = interleaved(10, 1);
        changed[0].content = "memory 10, changed".into();
        store.upsert(changed).await.unwrap();
        agree(&store, &store.stream_reads, "an update").await;
        let (s1, _) = both_reads(&store, &store.stream_reads, "s1").await;
        assert!(
            s1.contains(&("id10".into(), "memory 10, changed".into())),
            "{s1:?}"
        );
        assert_eq!(
            store.stream_reads.built(),
            built + 1,
            "an update builds the directory of its new fragment alone"
        );
    }

    /// A column with nothing in a fragment (no item in a list, no value) is
    /// left out of that fragment's reads, its rows read with empty lists and
    /// no values; in a fragment where a row holds something, it is read.
    #[tokio::test]
    async fn a_column_with_nothing_in_a_fragment_is_not_read_there() {
        let tmp = tempfile::tempdir().unwrap();
        let store = committed(tmp.path(), 2).await;
        let mut tagged = interleaved(8, 4);
        for c in &mut tagged {
            c.tags = vec![format!("tag of {}", c.id), "shared".into()];
        }
        tagged[1].entities = vec!["an entity".into()];
        tagged[2].title = Some("a title".into());
        store.upsert(tagged).await.unwrap();
        let batches: Vec<arrow_array::RecordBatch> = store
            .stream_reads
            .read(store.chunks_table(), "s1")
            .await
            .unwrap()
            .expect("read directly")
            .try_collect()
            .await
            .unwrap();
        let mut rows: Vec<Chunk> = batches
            .iter()
            .flat_map(|b| batch_to_chunks(b).unwrap())
            .collect();
        let without = |name: &str| {
            batches
                .iter()
                .filter(|b| b.column_by_name(name).is_none())
                .count()
        };
        assert_eq!((without("tags"), without("entities")), (2, 2));
        rows.sort_by_key(|c| c.id[2..].parse::<usize>().unwrap());
        let ids: Vec<&str> = rows.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["id1", "id4", "id7", "id10"]);
        for c in &rows {
            let tags = match c.id.as_str() {
                "id10" => vec!["tag of id10".to_string(), "shared".into()],
                _ => vec![],
            };
            assert_eq!(c.tags, tags, "{}", c.id);
            assert!(c.entities.is_empty(), "{}", c.id);
            let title = (c.id == "id10").then(|| "a title".to_string());
            assert_eq!(c.title, title, "{}", c.id);
        }
        let mut empty: Vec<Vec<&str>> = {
            let st = store.stream_reads.state.lock().unwrap();
            st.fragments
                .values()
                .map(|o| {
                    let mut e = o.contents.empty.clone();
                    e.retain(|c| ["title", "tags", "entities", "expires_at"].contains(c));
                    e
                })
                .collect()
        };
        empty.sort();
        let all = vec!["title", "tags", "entities", "expires_at"];
        assert_eq!(empty, [vec!["expires_at"], all.clone(), all]);
    }

    /// A column with one value in all of a fragment's rows is not read
    /// there but put back from that value; where the values differ it is
    /// read.
    #[tokio::test]
    async fn a_column_with_one_value_in_a_fragment_is_put_back_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        let store = committed(tmp.path(), 1).await;
        // A fragment whose rows share values other than a new memory's.
        let mut shared = interleaved(4, 6);
        for c in &mut shared {
            c.level = 2;
            c.memory_type = "preference".into();
            c.importance = 0.9;
            c.confidence = 0.25;
            c.surprise = 0.75;
            c.pinned = true;
            c.immutable = true;
            c.version = 3;
            c.embed_model = Some("another-model".into());
            c.access_count = 7;
        }
        store.upsert(shared).await.unwrap();
        // And one whose rows differ in some of them.
        let mut mixed = interleaved(10, 6);
        for (k, c) in mixed.iter_mut().enumerate() {
            c.importance = 0.1 * k as f32;
            c.memory_type = ["fact", "event"][k % 2].into();
            c.embed_model = (k == 5).then(|| "m".to_string());
        }
        store.upsert(mixed).await.unwrap();
        agree(&store, &store.stream_reads, "three fragments").await;
        let mut uniform: Vec<(usize, Vec<&str>)> = {
            let st = store.stream_reads.state.lock().unwrap();
            st.fragments
                .values()
                .map(|o| {
                    let rows = o.contents.directory.values().flat_map(|r| r.iter());
                    let rows = rows.map(|r| (r.end - r.start) as usize).sum();
                    let names = o.contents.uniform.iter().map(|(n, _)| *n).collect();
                    (rows, names)
                })
                .collect()
        };
        uniform.sort();
        let every = UNIFORM.to_vec();
        let but_mixed: Vec<&str> = UNIFORM
            .into_iter()
            .filter(|n| !["importance", "memory_type", "embed_model"].contains(n))
            .collect();
        assert_eq!(
            uniform,
            [(4, every.clone()), (6, but_mixed), (6, every)],
            "the fragments of 4, 6 and 6 rows"
        );
    }

    /// Past the fragments it keeps open, a read opens the others for
    /// itself and finds the same rows.
    #[tokio::test]
    async fn past_the_fragments_kept_open_a_read_opens_the_rest_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let store = committed(tmp.path(), 6).await;
        let reads = StreamReads::keeping(2);
        agree(&store, &reads, "six commits").await;
        let st = reads.state.lock().unwrap();
        assert_eq!(st.fragments.len(), 6);
        assert_eq!(
            st.fragments.values().filter(|o| o.reader.is_some()).count(),
            2
        );
    }

    /// A stream whose rows lie in several fragments is loaded whole, each
    /// row with its vector and its text, its groups large enough to be
    /// filed on two threads.
    #[tokio::test]
    async fn a_load_takes_a_stream_from_every_fragment_it_lies_in() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open_with(
            &Location::local(tmp.path()),
            8,
            2000,
            None,
            Maintenance::off(),
        )
        .await
        .unwrap();
        for k in 0..3 {
            store.upsert(interleaved(600 * k, 600)).await.unwrap();
        }
        let indexes = store
            .hot_streams(&Filter::new().stream("s1"))
            .await
            .unwrap()
            .expect("the stream fits the budget");
        let ix = indexes[0].read().unwrap();
        let ids: Vec<usize> = (0..1800).filter(|i| i % 3 == 1).collect();
        assert_eq!(ix.len(), ids.len());
        for i in ids {
            let id = format!("id{i}");
            let (chunk, _) = ix.get(&id).unwrap_or_else(|| panic!("{id} not loaded"));
            assert_eq!(chunk.content, format!("memory {i}"));
            let v = ix
                .vector(&id)
                .unwrap_or_else(|| panic!("{id} has no vector"));
            let want = 1.0 / (8f32).sqrt();
            // Kept in f16: within its rounding.
            assert!(
                v.iter().all(|x| (x - want).abs() < want / 1024.0),
                "{id}: {v:?}"
            );
        }
    }
}
