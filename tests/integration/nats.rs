//! A real `nats-server -js` on a free port, owned by a test and killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct NatsServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
}

fn binary() -> PathBuf {
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/usr/local/bin"])
    {
        let p = Path::new(dir).join("nats-server");
        if p.is_file() {
            return p;
        }
    }
    panic!("nats-server is not installed: run `bash scripts/setup.sh`");
}

impl NatsServer {
    /// Start on a free port with JetStream storage under `dir`.
    pub fn start(dir: &Path) -> NatsServer {
        std::fs::create_dir_all(dir).unwrap();
        let child = Command::new(binary())
            .args(["-js", "-a", "127.0.0.1", "-p", "-1", "-sd"])
            .arg(dir.join("js"))
            .arg("--ports_file_dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        let ports = dir.join(format!("nats-server_{}.ports", child.id()));
        let started = Instant::now();
        let port = loop {
            if let Ok(text) = std::fs::read_to_string(&ports) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                    let url = v["nats"][0].as_str().unwrap_or_default().to_string();
                    if let Some(p) = url.rsplit(':').next().and_then(|p| p.parse().ok()) {
                        break p;
                    }
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "nats-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        NatsServer {
            child: Some(child),
            port,
            dir: dir.to_path_buf(),
        }
    }

    /// A handle on a server someone else owns (stopping it does nothing).
    pub fn external(url: &str) -> NatsServer {
        NatsServer {
            child: None,
            port: url
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .expect("port in url"),
            dir: PathBuf::new(),
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kill the server (its JetStream data stays on disk).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same port and storage.
    pub fn restart(&mut self) {
        self.stop();
        let child = Command::new(binary())
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(self.dir.join("js"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "nats-server did not restart"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A free loopback port (bound, then let go).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A three-node JetStream cluster on loopback, each node killable with -9
/// and restartable on its port and storage.
pub struct NatsCluster {
    nodes: Vec<Option<Child>>,
    pub ports: Vec<u16>,
    routes: Vec<u16>,
    dir: PathBuf,
}

impl NatsCluster {
    pub fn start(dir: &Path) -> NatsCluster {
        let mut c = NatsCluster {
            nodes: vec![None, None, None],
            ports: (0..3).map(|_| free_port()).collect(),
            routes: (0..3).map(|_| free_port()).collect(),
            dir: dir.to_path_buf(),
        };
        for i in 0..3 {
            c.spawn(i);
        }
        c
    }

    /// The node's server name.
    pub fn name(i: usize) -> String {
        format!("n{i}")
    }

    fn spawn(&mut self, i: usize) {
        let dir = self.dir.join(Self::name(i));
        std::fs::create_dir_all(&dir).unwrap();
        let routes: Vec<String> = self
            .routes
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect();
        let child = Command::new(binary())
            .args(["-js", "-n", &Self::name(i), "-a", "127.0.0.1"])
            .args(["-p", &self.ports[i].to_string(), "-sd"])
            .arg(dir.join("js"))
            .args(["--cluster_name", "loomem-test", "--cluster"])
            .arg(format!("nats://127.0.0.1:{}", self.routes[i]))
            .args(["--routes", &routes.join(",")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log")).expect("a log file"))
            .spawn()
            .expect("spawn nats-server");
        self.nodes[i] = Some(child);
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.ports[i])).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "cluster node {i} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Once the cluster has elected its JetStream metadata leader, which it
    /// needs before it takes streams: a three-replica probe stream is made.
    pub async fn ready(&self) {
        let js = self.jetstream().await;
        let probe = async_nats::jetstream::stream::Config {
            name: "PROBE".into(),
            subjects: vec!["probe.>".into()],
            num_replicas: 3,
            ..Default::default()
        };
        let started = Instant::now();
        while js.get_or_create_stream(probe.clone()).await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the cluster never formed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        js.delete_stream("PROBE").await.expect("the probe goes");
    }

    /// A JetStream client of the cluster's own (any node).
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        let addrs: Vec<async_nats::ServerAddr> =
            self.urls().split(',').map(|u| u.parse().unwrap()).collect();
        let client = async_nats::ConnectOptions::new()
            .connect(addrs)
            .await
            .expect("a client of the cluster");
        async_nats::jetstream::new(client)
    }

    /// Every node's URL, comma-separated (loomem's `bus.nats_url`).
    pub fn urls(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `kill -9` node `i` (its storage stays).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start node `i` again on its port and storage.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..3 {
            self.kill(i);
        }
    }
}
