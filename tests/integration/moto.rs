//! A real S3-compatible server for the tests and benches: moto (PyPI
//! `moto[server]`, installed by scripts/setup-tests.sh) on a free loopback
//! port. It honours conditional puts (`If-None-Match: *`), which Lance's
//! commits need.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::nats::free_port;

/// A moto S3 server on a free loopback port, killed on drop.
pub struct Moto {
    child: Child,
    pub endpoint: String,
}

impl Moto {
    pub async fn start() -> Moto {
        let port = free_port();
        let child = Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let mut moto = Moto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let started = Instant::now();
        loop {
            if let Ok(r) = reqwest::get(&moto.endpoint).await {
                if r.status().is_success() {
                    return moto;
                }
            }
            if let Ok(Some(exit)) = moto.child.try_wait() {
                panic!("moto exited ({exit}): run `bash scripts/setup-tests.sh` (moto[server])");
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "moto did not answer"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Make the bucket `name`.
    pub async fn bucket(&self, name: &str) {
        let r = reqwest::Client::new()
            .put(format!("{}/{name}", self.endpoint))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "create bucket: {}", r.status());
    }

    /// The environment of a daemon that keeps its data at `uri`
    /// (`s3://bucket/prefix`) on this server.
    pub fn env(&self, uri: &str) -> Vec<(String, String)> {
        [
            ("LOOMEM_STORAGE__DATA_DIR", uri),
            ("LOOMEM_STORAGE__OBJECT_STORE__AWS_ENDPOINT", &self.endpoint),
            ("LOOMEM_STORAGE__OBJECT_STORE__AWS_ALLOW_HTTP", "true"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "loomem-test"),
            ("AWS_SECRET_ACCESS_KEY", "loomem-test"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// A client of `bucket` on this server (signed, as moto wants for objects).
    fn client(&self, bucket: &str) -> object_store::aws::AmazonS3 {
        object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_access_key_id("loomem-test")
            .with_secret_access_key("loomem-test")
            .build()
            .unwrap()
    }

    /// Every key under `prefix` in `bucket`.
    pub async fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        use futures::TryStreamExt;
        use object_store::ObjectStore;
        let prefix = object_store::path::Path::from(prefix);
        self.client(bucket)
            .list(Some(&prefix))
            .map_ok(|meta| meta.location.to_string())
            .try_collect()
            .await
            .unwrap()
    }

    /// The object's text, if it exists.
    pub async fn get(&self, bucket: &str, key: &str) -> Option<String> {
        use object_store::ObjectStoreExt;
        let got = self.client(bucket).get(&key.into()).await;
        match got {
            Ok(got) => Some(String::from_utf8(got.bytes().await.unwrap().to_vec()).unwrap()),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => panic!("get {key}: {e}"),
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
