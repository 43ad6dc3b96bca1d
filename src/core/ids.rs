//! Ids derived from what a record is (an import line, a conversation's fact, a
//! dream's summary), so that writing it again names the same memory.
//!
//! The derivation is keyed with a secret of the deployment: were it public
//! (a fixed UUIDv5 namespace), anyone could compute the id a given text gets in
//! another stream and, by trying to write under that id, learn whether that
//! stream holds the text.

use std::io::Write;
use std::path::Path;

/// The secret-keyed namespace derived ids are made in.
#[derive(Clone, PartialEq, Eq)]
pub struct IdKey(uuid::Uuid);

impl std::fmt::Debug for IdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdKey(…)")
    }
}

/// The file in the data directory that holds the deployment's secret.
pub const ID_KEY_FILE: &str = "id-key";

/// The namespace the secret is hashed into (UUID v5).
const ROOT: uuid::Uuid = uuid::Uuid::from_bytes([
    0x6c, 0x6f, 0x6f, 0x6d, 0x65, 0x6d, 0x2d, 0x69, 0x6d, 0x70, 0x6f, 0x72, 0x74, 0x2d, 0x69, 0x64,
]);

impl IdKey {
    /// A key from a known secret (tests and benchmarks).
    pub fn from_secret(secret: &[u8]) -> IdKey {
        IdKey(uuid::Uuid::new_v5(&ROOT, secret))
    }

    /// A new secret: 244 random bits, as text.
    pub fn new_secret() -> String {
        format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        )
    }

    /// The deployment's key, kept in `dir/id-key`: read when it exists, made
    /// from 244 random bits otherwise. Processes that share the directory
    /// share the key (the first to start writes it; a racing second reads it).
    pub fn load_or_create(dir: &Path) -> std::io::Result<IdKey> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(ID_KEY_FILE);
        let secret = IdKey::new_secret();
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(secret.as_bytes())?;
                f.sync_all()?;
                Ok(IdKey::from_secret(secret.as_bytes()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // A process that lost the race may read before the winner wrote.
                for _ in 0..50 {
                    let text = std::fs::read_to_string(&path)?;
                    if !text.trim().is_empty() {
                        return Ok(IdKey::from_secret(text.trim().as_bytes()));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(std::io::Error::other(format!(
                    "{} is empty; remove it to make a new key",
                    path.display()
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// The id of the record these parts describe.
    pub fn derive(&self, parts: &[&str]) -> String {
        uuid::Uuid::new_v5(&self.0, parts.join("\u{1f}").as_bytes()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_for_a_key_and_differ_between_keys() {
        let dir = tempfile::tempdir().unwrap();
        let a = IdKey::load_or_create(dir.path()).unwrap();
        let again = IdKey::load_or_create(dir.path()).unwrap();
        assert_eq!(
            a.derive(&["s", "jsonl", "1"]),
            again.derive(&["s", "jsonl", "1"])
        );
        let other = IdKey::load_or_create(tempfile::tempdir().unwrap().path()).unwrap();
        assert_ne!(
            a.derive(&["s", "jsonl", "1"]),
            other.derive(&["s", "jsonl", "1"])
        );
        assert_ne!(a.derive(&["s", "a"]), a.derive(&["s", "b"]));
    }
}
