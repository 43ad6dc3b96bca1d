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
