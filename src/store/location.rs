//! Where the tables live: a local directory (the default) or a prefix in an
//! S3-compatible bucket (`s3://bucket/prefix`).
//!
//! Lance commits a new table version by writing its manifest with a
//! conditional put (`If-None-Match: *`): of two processes committing the same
//! version one wins and the other gets a conflict, re-reads and retries. So
//! several loomem processes may share one bucket with nothing beside it (no
//! lock table), as long as the store honours conditional puts (AWS S3 since
//! 2024, MinIO, Cloudflare R2, moto). The deployment's id secret is an object
//! beside the tables, created the same way.
//!
//! Settings for the bucket (endpoint, region, credentials, `allow_http`) come
//! from `AWS_*` environment variables and from `[storage.object_store]`, which
//! wins; both use object_store's names (`aws_endpoint`, `aws_region`, …).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lancedb::connection::LanceFileVersion;
use lancedb::database::listing::ListingDatabaseOptions;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};

use crate::core::ids::{IdKey, ID_KEY_FILE};

/// The Lance file format new tables are written in: 2.1, not lance's
/// default 2.2. A 2.2 file keeps a column whose page holds one value (a
/// stream's `pinned`, `version`, `access_count`, …) as a constant page, and
/// reading rows from one walks the page row by row up to each row read: on
/// a 1M-row fragment ~5 ms a column, whatever the number of rows. Loading a
/// stream of a few hundred memories into the hot index read 42 ms in 2.2,
/// 7 ms in 2.1 (`benches/search.rs`, 1M over 1,000 streams). Tables made
/// before keep their format.
pub const TABLE_FORMAT: LanceFileVersion = LanceFileVersion::V2_1;

/// `schema` with the encoding its text columns are written in: LZ4 blocks
/// instead of Lance's default FSST, whose symbol table is built afresh for
/// every page written. Small commits, merges and index refreshes rewrite
/// pages all the time: `fsst::compress` was 6.5% of a bulk import's CPU.
pub(super) fn encoded(schema: &arrow_schema::Schema) -> arrow_schema::SchemaRef {
    use arrow_schema::{DataType, Field};
    let text = |t: &DataType| match t {
        DataType::Utf8 | DataType::LargeUtf8 => true,
        DataType::List(f) | DataType::LargeList(f) => {
            matches!(f.data_type(), DataType::Utf8 | DataType::LargeUtf8)
        }
        _ => false,
    };
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let f = f.as_ref().clone();
            if !text(f.data_type()) {
                return f;
            }
            let mut meta = f.metadata().clone();
            meta.insert("lance-encoding:compression".into(), "lz4".into());
            f.with_metadata(meta)
        })
        .collect();
    std::sync::Arc::new(arrow_schema::Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    ))
}

/// A data location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A directory on this machine.
    Local(PathBuf),
    /// `s3://bucket/prefix`, with the object store settings it is opened with.
    Bucket(Bucket),
}

/// A prefix in an S3-compatible bucket.
#[derive(Clone, PartialEq, Eq)]
pub struct Bucket {
    pub bucket: String,
    /// The key prefix the tables live under, without slashes at either end.
    pub prefix: String,
    /// object_store settings (`aws_endpoint`, `aws_region`, …): the `AWS_*`
    /// environment, overlaid with the configured ones.
    options: BTreeMap<String, String>,
}

impl std::fmt::Debug for Bucket {
    // The options may hold a secret key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bucket({})", self.uri())
    }
}

/// Why a location cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    #[error("{0}")]
    Invalid(String),
    #[error("object store: {0}")]
    Object(#[from] object_store::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Location {
    /// `text` as a location: `s3://bucket/prefix` names a bucket (opened
    /// with `settings`, see [`settings`]); another URI scheme is refused;
    /// anything else is a directory (relative ones against `base`).
    pub fn parse(
        text: &str,
        base: &Path,
        settings: &BTreeMap<String, String>,
    ) -> Result<Location, LocationError> {
        let Some((scheme, rest)) = text.split_once("://") else {
            let path = Path::new(text);
            return Ok(Location::Local(if path.is_absolute() {
                path.to_path_buf()
            } else {
                base.join(path)
            }));
        };
        if scheme != "s3" {
            return Err(LocationError::Invalid(format!(
                "`{scheme}://` is not supported: a local directory or s3://bucket/prefix"
            )));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(LocationError::Invalid(format!("{text} names no bucket")));
        }
        Ok(Location::Bucket(Bucket {
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            options: settings.clone(),
        }))
    }

    /// A local directory.
    pub fn local(dir: &Path) -> Location {
        Location::Local(dir.to_path_buf())
    }

    /// The directory, when the tables are on this machine.
    pub fn local_dir(&self) -> Option<&Path> {
        match self {
            Location::Local(dir) => Some(dir),
            Location::Bucket(_) => None,
        }
    }

    /// What lancedb connects to.
    pub fn uri(&self) -> String {
        match self {
            Location::Local(dir) => dir.to_string_lossy().into_owned(),
            Location::Bucket(b) => b.uri(),
        }
    }

    /// A lancedb connection to it (a local directory is created first);
    /// reads see other processes' commits within `read_consistency`, and
    /// tables it creates are written in [`TABLE_FORMAT`].
    pub async fn connect(
        &self,
        read_consistency: Option<Duration>,
    ) -> lancedb::Result<lancedb::Connection> {
        let mut connect = lancedb::connect(&self.uri());
        match self {
            Location::Local(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| lancedb::Error::Runtime {
                    message: format!("cannot create data dir {}: {e}", dir.display()),
                })?;
            }
            Location::Bucket(b) => {
                connect = connect.storage_options(b.options.clone());
            }
        }
        if let Some(interval) = read_consistency {
            connect = connect.read_consistency_interval(interval);
        }
        connect
            .database_options(
                &ListingDatabaseOptions::builder()
                    .data_storage_version(TABLE_FORMAT)
                    .build(),
            )
            .execute()
            .await
    }

    /// The deployment's id key: in a local directory its `id-key` file (see
    /// [`IdKey::load_or_create`]); in a bucket the object `<prefix>/id-key`,
    /// created with a conditional put, so processes starting together on an
    /// empty bucket agree on one key.
    pub async fn id_key(&self) -> Result<IdKey, LocationError> {
        match self {
            Location::Local(dir) => Ok(IdKey::load_or_create(dir)?),
            Location::Bucket(b) => {
                let secret = b.create_or_read(ID_KEY_FILE, IdKey::new_secret()).await?;
                Ok(IdKey::from_secret(secret.trim().as_bytes()))
            }
        }
    }
}

/// The settings a bucket is opened with: the `AWS_*` variables of `env`,
/// overlaid with the configured `options` (`[storage.object_store]`), all
/// by object_store's lower-case names. A configured name S3 does not know is
/// refused.
pub fn settings(
    options: &BTreeMap<String, String>,
    env: &std::collections::HashMap<String, String>,
) -> Result<BTreeMap<String, String>, LocationError> {
    let mut merged: BTreeMap<String, String> = env
        .iter()
        .filter(|(k, _)| k.starts_with("AWS_"))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
        .collect();
    for (k, v) in options {
        let key = k.to_ascii_lowercase();
        key.parse::<AmazonS3ConfigKey>().map_err(|_| {
            LocationError::Invalid(format!(
                "`{k}` is not an S3 setting (aws_endpoint, aws_region, aws_access_key_id, aws_secret_access_key, aws_allow_http, ...)"
            ))
        })?;
        merged.insert(key, v.clone());
    }
    Ok(merged)
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Local(dir) => write!(f, "{}", dir.display()),
            Location::Bucket(b) => f.write_str(&b.uri()),
        }
    }
}

impl Bucket {
    pub fn uri(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    /// The object store client for this bucket.
    pub fn client(&self) -> Result<impl ObjectStore, LocationError> {
        let mut builder = AmazonS3Builder::new().with_bucket_name(&self.bucket);
        for (k, v) in &self.options {
            if let Ok(key) = k.parse::<AmazonS3ConfigKey>() {
                builder = builder.with_config(key, v);
            }
        }
        Ok(builder.build()?)
    }

    /// The object `name` under the prefix.
    pub fn object(&self, name: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(name)
        } else {
            ObjectPath::from(format!("{}/{name}", self.prefix))
        }
    }

    /// The text of the object `name`, which is written as `text` if it does
    /// not exist yet (of racing writers, the first wins and all read its text).
    async fn create_or_read(&self, name: &str, text: String) -> Result<String, LocationError> {
        let client = self.client()?;
        let path = self.object(name);
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match client.put_opts(&path, text.clone().into(), create).await {
            Ok(_) => Ok(text),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => {
                let bytes = client.get(&path).await?.bytes().await?;
                String::from_utf8(bytes.to_vec()).map_err(|_| {
                    LocationError::Invalid(format!("{}/{name} is not text", self.uri()))
                })
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Whether `path` names an object (`s3://…`) rather than a local file.
pub fn is_object_uri(path: &str) -> bool {
    path.contains("://")
}

/// Upload the local file `file` to `uri` (`s3://bucket/key`), whole: a reader
/// sees the old object or the new one. `settings` as for [`Location::parse`].
pub async fn upload(
    file: std::fs::File,
    uri: &str,
    settings: &BTreeMap<String, String>,
) -> Result<(), LocationError> {
    let Location::Bucket(b) = Location::parse(uri, Path::new("/"), settings)? else {
        return Err(LocationError::Invalid(format!("{uri} is not an s3:// URI")));
    };
    if b.prefix.is_empty() {
        return Err(LocationError::Invalid(format!("{uri} names no object")));
    }
    let client: std::sync::Arc<dyn ObjectStore> = std::sync::Arc::new(b.client()?);
    let path = ObjectPath::from(b.prefix.as_str());
    let mut out = object_store::buffered::BufWriter::new(client, path);
    let mut file = tokio::fs::File::from_std(file);
    tokio::io::copy(&mut file, &mut out).await?;
    tokio::io::AsyncWriteExt::shutdown(&mut out).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_path_is_local_and_an_s3_uri_a_bucket() {
        let none = BTreeMap::new();
        let base = Path::new("/etc/loomem");
        assert_eq!(
            Location::parse("./data", base, &none).unwrap(),
            Location::Local(PathBuf::from("/etc/loomem/./data"))
        );
        assert_eq!(
            Location::parse("/var/lib/loomem", base, &none).unwrap(),
            Location::Local(PathBuf::from("/var/lib/loomem"))
        );
        let Location::Bucket(b) = Location::parse("s3://mem/prod/", base, &none).unwrap() else {
            panic!("a bucket");
        };
        assert_eq!((b.bucket.as_str(), b.prefix.as_str()), ("mem", "prod"));
        assert_eq!(b.uri(), "s3://mem/prod");
        assert_eq!(b.object("id-key"), ObjectPath::from("prod/id-key"));
        let Location::Bucket(b) = Location::parse("s3://mem", base, &none).unwrap() else {
            panic!("a bucket");
        };
        assert_eq!(b.object("id-key"), ObjectPath::from("id-key"));
    }

    #[test]
    fn settings_come_from_the_environment_and_the_config_wins() {
        let env = HashMap::from([
            ("AWS_REGION".to_string(), "eu-west-1".to_string()),
            ("AWS_ENDPOINT".to_string(), "http://env:9000".to_string()),
            ("HOME".to_string(), "/root".to_string()),
        ]);
        let cfg = BTreeMap::from([("aws_endpoint".to_string(), "http://cfg:9000".to_string())]);
        let merged = settings(&cfg, &env).unwrap();
        let Location::Bucket(b) = Location::parse("s3://m/p", Path::new("/"), &merged).unwrap()
        else {
            panic!("a bucket");
        };
        assert_eq!(b.options["aws_region"], "eu-west-1");
        assert_eq!(b.options["aws_endpoint"], "http://cfg:9000");
        assert!(!b.options.contains_key("home"));
        assert!(
            !format!("{b:?}").contains("cfg:9000"),
            "options stay out of logs"
        );
    }

    #[tokio::test]
    async fn a_new_store_writes_its_tables_in_the_pinned_format() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(tmp.path(), 4, 100).await.unwrap();
        let tables = store.tables();
        assert!(tables.len() >= 10, "{:?}", tables.keys());
        for (name, table) in tables {
            let manifest = table.as_native().expect("local").manifest().await.unwrap();
            assert_eq!(
                manifest.data_storage_format.version.to_string(),
                TABLE_FORMAT.to_string(),
                "{name}"
            );
        }
    }

    #[tokio::test]
    async fn a_new_store_writes_its_text_columns_with_lz4() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(tmp.path(), 4, 100).await.unwrap();
        for (name, table) in store.tables() {
            let schema = table.schema().await.unwrap();
            for field in schema.fields() {
                let codec = field.metadata().get("lance-encoding:compression");
                let text = matches!(field.data_type(), arrow_schema::DataType::Utf8)
                    || matches!(field.data_type(), arrow_schema::DataType::List(f) if f.data_type() == &arrow_schema::DataType::Utf8);
                assert_eq!(
                    codec.map(String::as_str),
                    text.then_some("lz4"),
                    "{name}.{}",
                    field.name()
                );
            }
        }
    }

    #[test]
    fn bad_locations_are_named() {
        let env = HashMap::new();
        let none = BTreeMap::new();
        let err = |text: &str| {
            Location::parse(text, Path::new("/"), &none)
                .unwrap_err()
                .to_string()
        };
        assert!(err("gs://b/p").contains("gs://"));
        assert!(err("s3:///p").contains("no bucket"));
        let typo = BTreeMap::from([("aws_endpoitn".to_string(), "x".to_string())]);
        let refused = settings(&typo, &env).unwrap_err().to_string();
        assert!(
            refused.contains("`aws_endpoitn` is not an S3 setting"),
            "{refused}"
        );
    }
}
