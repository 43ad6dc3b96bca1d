//! Reads of a local table's data files on the thread that asks for them,
//! for the hot index's loads (`stream_read`).
//!
//! Lance reads a local file through a blocking-pool task a read: each of a
//! load's reads (a column of a fragment, some 200 for a small stream of the
//! 1M store) spawned a task, woke a thread and woke the decoder back, and
//! those hand-offs took more of the load's CPU than the reads did. A read of
//! a few kilobytes from the page cache takes microseconds, so here it is made
//! where Lance's decoder asks for it: [`scheduler`] gives Lance an object
//! store whose reads are made on the calling thread, under Lance's lite I/O
//! scheduler (which polls a read only when its reader awaits it, instead of
//! spawning a task for it).
//!
//! A file is mapped whole when first read, and a read is a view of the
//! mapping: Lance decodes straight from the page cache, where a `pread`
//! first copied each read into a buffer of its own (a 4,000-memory stream
//! of the 1M store reads some 6 MB of embeddings; the copy and the faults of
//! its fresh buffers were a tenth of a load). A short read
//! ([`COPY_BELOW`]) is copied out instead: Lance keeps some of what it reads
//! (a page's chunk sizes, its dictionary) in its caches, and a view kept
//! there would keep its whole file mapped, and a merged-away file's disk
//! space taken, for as long as the cache holds it.
//!
//! The store only reads: the writer and every other path keep Lance's own
//! local store. Data files never change once written, so a file stays open
//! and mapped while its fragment lives ([`MappedStore::keep_only`]), and
//! after that while a view of it is held.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use lance::io::ObjectStore as LanceStore;
use lance_io::scheduler::{ScanScheduler, SchedulerConfig};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// Lance's reads of a local table's files under the lite scheduler, each
/// made where it is awaited, from the file's mapping; the store, to prune
/// its handles.
pub(super) fn scheduler() -> (Arc<ScanScheduler>, Arc<MappedStore>) {
    let store = Arc::new(MappedStore::default());
    let location = url::Url::parse("loomem-mapped:///").expect("a valid url");
    let lance = Arc::new(LanceStore::new(
        store.clone(),
        location,
        // The local store's block size: Lance joins reads closer than this.
        Some(4096),
        None,
        false,
        true,
        IO_PARALLELISM,
        0,
        None,
    ));
    let config = SchedulerConfig::max_bandwidth(&lance).with_lite_scheduler();
    (ScanScheduler::new(lance, config), store)
}

/// Reads a scheduler lets run at once (all of them run on the thread that
/// awaits them).
const IO_PARALLELISM: usize = 16;

/// Local files read from their mappings on the calling thread; read-only.
#[derive(Default)]
pub(super) struct MappedStore {
    files: Mutex<HashMap<Path, Arc<Opened>>>,
    /// How many files are mapped: those open, and those closed whose
    /// bytes a reader still holds.
    mapped: Arc<AtomicUsize>,
    /// Maps a location to its file, as Lance's local store does.
    local: LocalFileSystem,
}

/// A data file open for reads, with what its metadata said (it never
/// changes).
struct Opened {
    map: Mapped,
    modified: chrono::DateTime<chrono::Utc>,
}

/// A file mapped whole, read-only (nothing when it is empty).
struct Mapped {
    at: *const u8,
    len: usize,
    /// The store's count of mapped files.
    count: Arc<AtomicUsize>,
}

// SAFETY: the mapping is read-only and lives until `Mapped` is dropped;
// reading it from any thread is sound.
unsafe impl Send for Mapped {}
unsafe impl Sync for Mapped {}

impl Mapped {
    fn new(file: &File, len: u64, count: &Arc<AtomicUsize>) -> std::io::Result<Mapped> {
        let len = usize::try_from(len).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        count.fetch_add(1, Ordering::Relaxed);
        let count = Arc::clone(count);
        if len == 0 {
            return Ok(Mapped {
                at: std::ptr::null(),
                len,
                count,
            });
        }
        // SAFETY: a fresh read-only shared mapping of `len` bytes of an
        // open file; Lance never changes a data file once written (a
        // cleaned-up file is unlinked, and its pages stay while mapped).
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            count.fetch_sub(1, Ordering::Relaxed);
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapped {
            at: at.cast(),
            len,
            count,
        })
    }

    fn bytes(&self) -> &[u8] {
        match self.len {
            0 => &[],
            // SAFETY: `at` maps `len` readable bytes until `self` drops.
            len => unsafe { std::slice::from_raw_parts(self.at, len) },
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
        if self.len > 0 {
            // SAFETY: `at` and `len` are the mapping made in `new`, and no
            // slice of it outlives `self` (each holds its `Opened`).
            unsafe { libc::munmap(self.at.cast_mut().cast(), self.len) };
        }
    }
}

/// Reads shorter than this are copied out of the mapping: Lance keeps some
/// of what it reads (a page's chunk sizes, dictionaries) in its caches, and
/// a kept view would keep its whole file mapped.
const COPY_BELOW: usize = 256 << 10;

/// A range of a mapped file, as the bytes a read returns: it holds the
/// file's mapping open.
struct Slice {
    file: Arc<Opened>,
    range: Range<usize>,
}

impl AsRef<[u8]> for Slice {
    fn as_ref(&self) -> &[u8] {
        &self.file.map.bytes()[self.range.clone()]
    }
}

impl MappedStore {
    /// `location`'s file, opened on its first read.
    fn file(&self, location: &Path) -> object_store::Result<Arc<Opened>> {
        if let Some(f) = self.files.lock().expect("mapped files lock").get(location) {
            return Ok(Arc::clone(f));
        }
        let path = self.local.path_to_filesystem(location)?;
        let file = File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => object_store::Error::NotFound {
                path: path.display().to_string(),
                source: e.into(),
            },
            _ => generic(e),
        })?;
        let meta = file.metadata().map_err(generic)?;
        let file = Arc::new(Opened {
            map: Mapped::new(&file, meta.len(), &self.mapped).map_err(generic)?,
            modified: meta.modified().map_err(generic)?.into(),
        });
        self.files
            .lock()
            .expect("mapped files lock")
            .insert(location.clone(), Arc::clone(&file));
        Ok(file)
    }

    /// Closes the handles of every file but `live`'s (a merged or deleted
    /// fragment's files are removed from disk once cleaned up; an open
    /// handle would keep their space).
    pub fn keep_only(&self, live: &HashSet<Path>) {
        self.files
            .lock()
            .expect("mapped files lock")
            .retain(|p, _| live.contains(p));
    }

    /// How many files are open.
    #[cfg(test)]
    pub fn open_files(&self) -> usize {
        self.files.lock().expect("mapped files lock").len()
    }

    /// How many files are mapped: open, or closed but still held.
    #[cfg(test)]
    pub fn mapped_files(&self) -> usize {
        self.mapped.load(Ordering::Relaxed)
    }
}

fn generic(e: impl std::error::Error + Send + Sync + 'static) -> object_store::Error {
    object_store::Error::Generic {
        store: "loomem-mapped",
        source: Box::new(e),
    }
}

fn read_only(operation: &str) -> object_store::Error {
    object_store::Error::NotImplemented {
        operation: operation.into(),
        implementer: "loomem-mapped (read-only)".into(),
    }
}

impl fmt::Display for MappedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("loomem-mapped")
    }
}

impl fmt::Debug for MappedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MappedStore")
    }
}

#[async_trait]
impl ObjectStore for MappedStore {
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let file = self.file(location)?;
        let len = file.map.len as u64;
        let range = match &options.range {
            Some(r) => r.as_range(len).map_err(generic)?,
            None => 0..len,
        };
        let meta = ObjectMeta {
            location: location.clone(),
            last_modified: file.modified,
            size: len,
            e_tag: None,
            version: None,
        };
        let range_in = range.start as usize..range.end as usize;
        let bytes = match options.head {
            true => Bytes::new(),
            false if range_in.len() < COPY_BELOW => {
                Bytes::copy_from_slice(&file.map.bytes()[range_in])
            }
            false => Bytes::from_owner(Slice {
                range: range_in,
                file,
            }),
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(futures::stream::once(async { Ok(bytes) }).boxed()),
            meta,
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    async fn put_opts(
        &self,
        _: &Path,
        _: PutPayload,
        _: PutOptions,
    ) -> object_store::Result<PutResult> {
        Err(read_only("put"))
    }

    async fn put_multipart_opts(
        &self,
        _: &Path,
        _: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(read_only("put_multipart"))
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        locations.map(|_| Err(read_only("delete"))).boxed()
    }

    fn list(&self, _: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        futures::stream::once(async { Err(read_only("list")) }).boxed()
    }

    async fn list_with_delimiter(&self, _: Option<&Path>) -> object_store::Result<ListResult> {
        Err(read_only("list"))
    }

    async fn copy_opts(&self, _: &Path, _: &Path, _: CopyOptions) -> object_store::Result<()> {
        Err(read_only("copy"))
    }
}

#[cfg(test)]
mod tests {
    use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};

    use super::{MappedStore, COPY_BELOW};

    /// The test file's length: reads of all of it are views of the mapping.
    const LEN: usize = COPY_BELOW + 10_000;

    async fn get(store: &MappedStore, path: &object_store::path::Path, range: GetRange) -> Vec<u8> {
        let options = GetOptions {
            range: Some(range),
            ..GetOptions::default()
        };
        let got = store.get_opts(path, options).await.unwrap();
        assert_eq!(got.meta.size, LEN as u64);
        got.bytes().await.unwrap().to_vec()
    }

    #[tokio::test]
    async fn a_read_is_the_files_bytes_in_its_range_and_a_closed_handle_reopens() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("data.lance");
        let data: Vec<u8> = (0..LEN as u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&file, &data).unwrap();
        let path = object_store::path::Path::from_absolute_path(&file).unwrap();
        let store = MappedStore::default();

        assert_eq!(
            get(&store, &path, GetRange::Bounded(100..4200)).await,
            data[100..4200]
        );
        assert_eq!(
            get(&store, &path, GetRange::Offset(9_000)).await,
            data[9_000..]
        );
        assert_eq!(
            get(&store, &path, GetRange::Suffix(16)).await,
            data[LEN - 16..]
        );
        // Past the end: the rest of the file, as object stores answer.
        assert_eq!(
            get(
                &store,
                &path,
                GetRange::Bounded(LEN as u64 - 10..LEN as u64 + 10_000)
            )
            .await,
            data[LEN - 10..]
        );
        let whole = store.get_opts(&path, GetOptions::default()).await.unwrap();
        assert_eq!(whole.bytes().await.unwrap().to_vec(), data);
        assert_eq!(store.open_files(), 1);

        // A read past its last byte is refused, and nothing else changes.
        let past = GetOptions {
            range: Some(GetRange::Bounded(LEN as u64..LEN as u64 + 10)),
            ..GetOptions::default()
        };
        assert!(store.get_opts(&path, past).await.is_err());

        // Bytes read before a file is closed stay readable: a long read holds
        // its mapping, a short one is a copy.
        let held = store
            .get_opts(&path, GetOptions::default())
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let short = store
            .get_opts(
                &path,
                GetOptions {
                    range: Some(GetRange::Bounded(0..COPY_BELOW as u64 - 1)),
                    ..GetOptions::default()
                },
            )
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        store.keep_only(&Default::default());
        assert_eq!(store.open_files(), 0);
        assert_eq!(held.to_vec(), data);
        assert_eq!(store.mapped_files(), 1, "a view keeps its file mapped");
        drop(held);
        assert_eq!(store.mapped_files(), 0, "a copy does not");
        assert_eq!(short.to_vec(), data[..COPY_BELOW - 1]);
        assert_eq!(
            get(&store, &path, GetRange::Bounded(0..10)).await,
            data[..10]
        );

        // An empty file reads as nothing.
        let empty = tmp.path().join("empty.lance");
        std::fs::write(&empty, b"").unwrap();
        let empty = object_store::path::Path::from_absolute_path(&empty).unwrap();
        let got = store.get_opts(&empty, GetOptions::default()).await.unwrap();
        assert!(got.bytes().await.unwrap().is_empty());

        let missing =
            object_store::path::Path::from_absolute_path(tmp.path().join("gone")).unwrap();
        match store.get_opts(&missing, GetOptions::default()).await {
            Err(object_store::Error::NotFound { .. }) => {}
            other => panic!("a missing file: {other:?}"),
        }
        assert!(store.delete(&path).await.is_err(), "the store only reads");
        assert!(file.exists());
    }
}
