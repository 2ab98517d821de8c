//! The cluster keys: where they come from (`MC_TE_AUTH_KEY_FILE`,
//! `MC_TE_AUTH_KEY`) and the keys themselves, loaded once when an engine
//! is created.
//!
//! A key is at least [`MIN_KEY_LEN`] bytes of secret. A key file (or the
//! variable's value) is read as, in this order: **hex** if it is only hex
//! digits (an even number, surrounding whitespace ignored: `openssl rand
//! -hex 32`), else **base64** if it is padded standard base64 (surrounding
//! whitespace ignored: `openssl rand -base64 32`), else the **raw** bytes
//! of the file as they are (`head -c 32 /dev/urandom`). Up to two keys are
//! accepted, `new,old`: proofs are made with both, a peer holding either
//! gets in (see the rotation procedure in `docs/security.md`).
//!
//! Nothing here logs a key or puts one in an error message, and `Debug`
//! shows no key.

use crate::error::{Error, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, KeyInit};
use sha2::Sha256;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use tracing::warn;

/// HMAC-SHA256, the proof of a key.
pub type HmacSha256 = Hmac<Sha256>;

/// Fewest bytes of a key (after decoding).
pub const MIN_KEY_LEN: usize = 32;
/// Most keys at once (the new one and the old one, during a rotation).
pub const MAX_KEYS: usize = 2;
/// Largest key file read (a key is a few dozen bytes).
pub const MAX_KEY_FILE: u64 = 4096;

/// Where an engine's keys come from. Parsed from the process environment
/// by `Config::from_env`; the keys are read when
/// an engine is created ([`AuthConfig::load`]). Without either variable
/// there is no authentication, as in Mooncake.
#[derive(Clone, Default, PartialEq)]
pub struct AuthConfig {
    /// `MC_TE_AUTH_KEY_FILE`: one or two key files, `new[,old]`.
    key_files: Option<String>,
    /// `MC_TE_AUTH_KEY`: one or two keys themselves, `new[,old]` (for
    /// tests: the environment of a process is not a place for secrets).
    key_value: Option<String>,
}

impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthConfig")
            .field("key_files", &self.key_files)
            .field("key_value", &self.key_value.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl AuthConfig {
    /// The documentation of the peer-authentication settings, read by
    /// [`AuthConfig::from_vars`] (two variables that make one
    /// setting, with their own warnings).
    pub(crate) fn doc() -> crate::settings::PartDoc {
        crate::settings::PartDoc {
            name: "auth",
            rows: vec![
                crate::settings::RowDoc {
                    vars: &["MC_TE_AUTH_KEY_FILE"],
                    doc: "`new[,old]`: hex, base64 or raw key files of at least 32 bytes, at \
                          most two",
                    default: "unset (no key)".to_string(),
                    allowed: "paths".to_string(),
                    mooncake: "",
                    unsupported: None,
                },
                crate::settings::RowDoc {
                    vars: &["MC_TE_AUTH_KEY"],
                    doc: "the key itself, for tests; warns; ignored when `MC_TE_AUTH_KEY_FILE` \
                          is set",
                    default: "unset".to_string(),
                    allowed: "text".to_string(),
                    mooncake: "",
                    unsupported: None,
                },
            ],
        }
    }

    /// The peer-authentication settings as in effect, in the order of
    /// [`AuthConfig::doc`]: the key files' paths, and whether a key is
    /// given itself (never the key).
    pub(crate) fn effective(
        &self,
        r: &crate::settings::Reader<'_>,
    ) -> Vec<crate::settings::Effective> {
        let set_by = |var: &'static str| r.raw(var).map(|_| var);
        vec![
            crate::settings::Effective {
                vars: &["MC_TE_AUTH_KEY_FILE"],
                value: self
                    .key_files
                    .clone()
                    .unwrap_or_else(|| "unset".to_string()),
                set_by: set_by("MC_TE_AUTH_KEY_FILE"),
            },
            crate::settings::Effective {
                vars: &["MC_TE_AUTH_KEY"],
                value: if self.key_value.is_some() {
                    "<set>"
                } else {
                    "unset"
                }
                .to_string(),
                set_by: set_by("MC_TE_AUTH_KEY"),
            },
        ]
    }

    /// From the values of `MC_TE_AUTH_KEY_FILE` and `MC_TE_AUTH_KEY`, and
    /// the warnings they deserve.
    pub fn from_vars(
        key_files: Option<String>,
        key_value: Option<String>,
    ) -> (AuthConfig, Vec<String>) {
        let mut warnings = Vec::new();
        let key_value = match (&key_files, key_value) {
            (Some(_), Some(_)) => {
                warnings.push(
                    "MC_TE_AUTH_KEY is ignored: MC_TE_AUTH_KEY_FILE is set and its keys are used"
                        .to_string(),
                );
                None
            }
            (None, Some(v)) => {
                warnings.push(
                    "MC_TE_AUTH_KEY holds the cluster key in the process environment (readable \
                     in /proc/<pid>/environ, inherited by child processes); use it for tests \
                     only and MC_TE_AUTH_KEY_FILE otherwise"
                        .to_string(),
                );
                Some(v)
            }
            (_, None) => None,
        };
        (
            AuthConfig {
                key_files,
                key_value,
            },
            warnings,
        )
    }

    /// Keys read from `path` (`new[,old]`, as `MC_TE_AUTH_KEY_FILE`), for
    /// callers that name the file themselves (the Python binding's
    /// `initialize_ext`).
    pub fn from_files(path: &str) -> AuthConfig {
        AuthConfig {
            key_files: Some(path.to_string()),
            key_value: None,
        }
    }

    /// Whether a key is configured.
    pub fn enabled(&self) -> bool {
        self.key_files.is_some() || self.key_value.is_some()
    }

    /// Reads the keys; `None` without any. An unreadable file, a key
    /// shorter than [`MIN_KEY_LEN`] bytes, an empty entry or more than two
    /// keys is an error: an engine never runs without the authentication
    /// its configuration asks for.
    pub fn load(&self) -> Result<Option<Arc<Keys>>> {
        let (var, list) = match (&self.key_files, &self.key_value) {
            (Some(files), _) => ("MC_TE_AUTH_KEY_FILE", files),
            (None, Some(value)) => ("MC_TE_AUTH_KEY", value),
            (None, None) => return Ok(None),
        };
        let entries: Vec<&str> = list.split(',').map(str::trim).collect();
        if entries.len() > MAX_KEYS {
            return Err(Error::InvalidArgument(format!(
                "{var} names {} keys; at most {MAX_KEYS} (new,old) are accepted",
                entries.len()
            )));
        }
        let mut secrets = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let which = if i == 0 { "first" } else { "second" };
            if entry.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "{var}: its {which} entry is empty"
                )));
            }
            let (secret, what) = if self.key_files.is_some() {
                let path = Path::new(entry);
                let bytes = read_key_file(path)?;
                (decode(&bytes), format!("key file {entry}"))
            } else {
                (decode(entry.as_bytes()), format!("the {which} key"))
            };
            let (secret, encoding) = secret;
            if secret.len() < MIN_KEY_LEN {
                return Err(Error::InvalidArgument(format!(
                    "{var}: {what} holds {} bytes of key ({encoding}); at least {MIN_KEY_LEN} \
                     are needed (e.g. `openssl rand -hex 32`)",
                    secret.len()
                )));
            }
            secrets.push(secret);
        }
        Ok(Some(Arc::new(Keys::new(&secrets))))
    }
}

/// Reads a key file (a regular file of at most [`MAX_KEY_FILE`] bytes,
/// opened without blocking: `/dev/zero` or a FIFO fail at once), warning
/// when other users may read it.
fn read_key_file(path: &Path) -> Result<Vec<u8>> {
    let file = crate::small_file::read(path, MAX_KEY_FILE).map_err(|why| {
        Error::InvalidArgument(format!(
            "MC_TE_AUTH_KEY_FILE: key file {} cannot be read: {why}",
            path.display()
        ))
    })?;
    if file.mode & 0o077 != 0 {
        warn!(
            "key file {} may be read by other users (mode {:o}); chmod 600 it",
            path.display(),
            file.mode & 0o777
        );
    }
    Ok(file.bytes)
}

/// How a key was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Hex digits.
    Hex,
    /// Padded standard base64.
    Base64,
    /// The bytes as they are.
    Raw,
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Encoding::Hex => "read as hex",
            Encoding::Base64 => "read as base64",
            Encoding::Raw => "read as raw bytes",
        })
    }
}

/// The key written in `text`: hex, else base64, else the raw bytes.
pub fn decode(text: &[u8]) -> (Vec<u8>, Encoding) {
    let t = text.trim_ascii();
    if !t.is_empty() && t.len() % 2 == 0 && t.iter().all(u8::is_ascii_hexdigit) {
        let hex = |b: u8| match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => b - b'A' + 10,
        };
        let bytes = t.chunks(2).map(|p| hex(p[0]) << 4 | hex(p[1])).collect();
        return (bytes, Encoding::Hex);
    }
    if !t.is_empty() && t.len() % 4 == 0 {
        if let Ok(bytes) = B64.decode(t) {
            return (bytes, Encoding::Base64);
        }
    }
    (text.to_vec(), Encoding::Raw)
}

/// The loaded keys, first the one in use, then the one being retired.
/// Each is kept as its keyed HMAC state; `Debug` shows only how many.
#[derive(Clone)]
pub struct Keys {
    keys: Vec<HmacSha256>,
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Keys({} key(s))", self.keys.len())
    }
}

impl Keys {
    /// Keys from their secrets (one or two, each at least
    /// [`MIN_KEY_LEN`] bytes: see [`AuthConfig::load`]).
    pub fn new(secrets: &[Vec<u8>]) -> Keys {
        Keys {
            keys: secrets
                .iter()
                .map(|s| {
                    <HmacSha256 as KeyInit>::new_from_slice(s)
                        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"))
                })
                .collect(),
        }
    }

    /// The keys, the one in use first.
    pub fn all(&self) -> &[HmacSha256] {
        &self.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::path::PathBuf;

    /// A file in the temporary directory, removed on drop.
    struct TempKey(PathBuf);

    impl TempKey {
        fn new(bytes: &[u8]) -> TempKey {
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!("te-auth-key-{}-{n}", std::process::id()));
            std::fs::File::create(&p)
                .and_then(|mut f| f.write_all(bytes))
                .expect("write key file");
            TempKey(p)
        }

        fn path(&self) -> &str {
            self.0.to_str().expect("utf-8 path")
        }
    }

    impl Drop for TempKey {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn encodings_are_tried_hex_then_base64_then_raw() {
        let key: Vec<u8> = (0u8..32).collect();
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            decode(format!("{hex}\n").as_bytes()),
            (key.clone(), Encoding::Hex)
        );
        assert_eq!(decode(hex.to_uppercase().as_bytes()).0, key);
        let b64 = B64.encode(&key);
        assert_eq!(
            decode(format!(" {b64}\n").as_bytes()),
            (key.clone(), Encoding::Base64)
        );
        let raw = b"a passphrase that is not base64!!";
        assert_eq!(decode(raw), (raw.to_vec(), Encoding::Raw));
        // Raw bytes are taken as they are, whitespace included.
        assert_eq!(decode(b"\x00\x01 \n").0, b"\x00\x01 \n");
    }

    #[test]
    fn short_unreadable_and_too_many_keys_are_errors() {
        let short = TempKey::new(b"00112233");
        let c = AuthConfig::from_files(short.path());
        let e = c.load().expect_err("short key");
        let msg = e.to_string();
        assert!(msg.contains("holds 4 bytes of key (read as hex)"), "{msg}");
        assert!(!msg.contains("00112233"), "the key leaked: {msg}");
        let missing = AuthConfig::from_files("/nonexistent/te-key");
        assert!(
            missing
                .load()
                .expect_err("missing")
                .to_string()
                .contains("cannot be read")
        );
        let good = TempKey::new(&[7u8; 32]);
        let p = good.path();
        let three = AuthConfig::from_files(&format!("{p},{p},{p}"));
        assert!(
            three
                .load()
                .expect_err("3")
                .to_string()
                .contains("at most 2")
        );
        let empty = AuthConfig::from_files(&format!("{p},"));
        assert!(
            empty
                .load()
                .expect_err("empty")
                .to_string()
                .contains("second entry is empty")
        );
        let two = AuthConfig::from_files(&format!("{p}, {p}"));
        assert_eq!(two.load().expect("two").expect("keys").all().len(), 2);
    }

    #[test]
    fn the_value_variable_warns_and_debug_hides_it() {
        let secret = "f".repeat(64);
        let (c, warnings) = AuthConfig::from_vars(None, Some(secret.clone()));
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("for tests only"));
        assert!(!format!("{c:?}").contains(&secret));
        let keys = c.load().expect("load").expect("keys");
        assert_eq!(format!("{keys:?}"), "Keys(1 key(s))");
        let (both, warnings) = AuthConfig::from_vars(Some("/x".into()), Some(secret));
        assert!(warnings[0].contains("ignored"));
        assert!(both.enabled());
        let (none, warnings) = AuthConfig::from_vars(None, None);
        assert!(!none.enabled() && warnings.is_empty());
        assert!(none.load().expect("none").is_none());
    }
}
