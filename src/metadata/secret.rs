//! Secrets of the metadata stores and of the metadata server (passwords,
//! bearer tokens): never shown by `Debug`, compared in constant time, and
//! bearer tokens read from files.

use ring::digest::{SHA256, digest};
use std::fmt;
use std::path::Path;
use subtle::ConstantTimeEq;

use crate::settings::{Parse, Reader, Text};

/// Fewest characters of a bearer token.
pub const MIN_TOKEN_LEN: usize = 16;
/// Most characters of a bearer token (it travels in a request head).
pub const MAX_TOKEN_LEN: usize = 4096;
/// Largest token file read (the token and white space around it).
const MAX_TOKEN_FILE: u64 = 2 * MAX_TOKEN_LEN as u64;

/// A secret text. `Debug` shows `<redacted>`; equality is constant-time.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    /// Wraps `text`.
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this secret, in a time that depends on
    /// neither where they differ nor their lengths (both are hashed first).
    pub fn matches(&self, presented: &[u8]) -> bool {
        let a = digest(&SHA256, self.0.as_bytes());
        let b = digest(&SHA256, presented);
        a.as_ref().ct_eq(b.as_ref()).into()
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        self.matches(other.0.as_bytes())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Reads the bearer token in the file at `path`, which `what` names in
/// messages (e.g. `--auth-token-file`). Leading and trailing white space
/// (a final newline) is dropped; the rest must be 16 to 4096 visible ASCII
/// characters. Only a regular file of at most 8 KiB is read, opened
/// without blocking (`/dev/zero` or a FIFO fail at once). A file others
/// may read is accepted with a warning. The messages never quote the
/// token.
pub fn read_token_file(path: &Path, what: &str) -> Result<Secret, String> {
    let shown = path.display();
    let file = crate::small_file::read(path, MAX_TOKEN_FILE)
        .map_err(|why| format!("{what}={shown}: cannot read it: {why}"))?;
    let token = file.bytes.trim_ascii();
    if token.is_empty() {
        return Err(format!(
            "{what}={shown}: the file is empty; put the token in it"
        ));
    }
    if let Some(i) = token.iter().position(|b| !(0x21..=0x7e).contains(b)) {
        return Err(format!(
            "{what}={shown}: the token has a byte that is not visible ASCII at offset {i} \
             (no spaces, control characters or UTF-8 in a bearer token)"
        ));
    }
    if !(MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&token.len()) {
        return Err(format!(
            "{what}={shown}: the token has {} characters; use {MIN_TOKEN_LEN} to \
             {MAX_TOKEN_LEN} (e.g. the 64 of `openssl rand -hex 32`)",
            token.len()
        ));
    }
    let mode = file.mode & 0o777;
    if mode & 0o077 != 0 {
        tracing::warn!(
            "{what}={shown}: the file's mode is {mode:o}, so other users may read the token; \
             chmod 600 it"
        );
    }
    let text = String::from_utf8_lossy(token).into_owned();
    Ok(Secret(text))
}

// The parsers of the configuration rows that hold secrets.

/// A password; empty is the same as unset.
pub(crate) struct Password;

impl Parse<Option<Secret>> for Password {
    fn parse(&self, raw: &str) -> Option<Option<Secret>> {
        Some((!raw.is_empty()).then(|| Secret::new(raw.to_string())))
    }
    fn allowed(&self) -> String {
        "text".to_string()
    }
    fn show(&self, v: &Option<Secret>) -> String {
        if v.is_some() { "<set>" } else { "unset" }.to_string()
    }
}

/// A user name and password (the row's two variables, in that order):
/// one without the other warns and authenticates not.
pub(crate) struct Credentials;

impl Parse<Option<(String, Secret)>> for Credentials {
    fn parse(&self, _raw: &str) -> Option<Option<(String, Secret)>> {
        None
    }
    fn allowed(&self) -> String {
        "text (both or neither)".to_string()
    }
    fn show(&self, v: &Option<(String, Secret)>) -> String {
        v.as_ref()
            .map_or("unset".to_string(), |(user, _)| format!("{user}:<set>"))
    }
    fn read(
        &self,
        r: &Reader<'_>,
        vars: &[&'static str],
        _default: Option<(String, Secret)>,
    ) -> Option<(String, Secret)> {
        let text = |v: &str| Text.parse(&r.raw(v)?).flatten();
        let [user_var, pass_var] = vars else {
            unreachable!("a credentials row names its USERNAME and PASSWORD variables")
        };
        match (text(user_var), text(pass_var)) {
            (Some(user), Some(pass)) => Some((user, Secret::new(pass))),
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                r.warn(format!(
                    "only one of {user_var} and {pass_var} is set; not authenticating \
                     (set both)"
                ));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_secret_and_equality_compares_it() {
        let s = Secret::new("hunter2-hunter2-hunter2");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some(<redacted>)");
        assert!(s.matches(b"hunter2-hunter2-hunter2"));
        assert!(!s.matches(b"hunter2-hunter2-hunter3"));
        assert!(!s.matches(b"hunter2"));
        assert!(!s.matches(b""));
        assert_eq!(s, Secret::new("hunter2-hunter2-hunter2"));
        assert_ne!(s, Secret::new("other"));
    }

    #[test]
    fn token_files() {
        let dir = std::env::temp_dir().join(format!("te-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        let read = |bytes: &[u8]| {
            std::fs::write(&file, bytes).unwrap();
            read_token_file(&file, "--auth-token-file")
        };
        let t = read(b"  0123456789abcdef0123\n").unwrap();
        assert!(t.matches(b"0123456789abcdef0123"));
        for (bad, says) in [
            (&b"\n"[..], "empty"),
            (b"short", "5 characters"),
            (b"0123456789 abcdef0123", "not visible ASCII"),
            ("0123456789abcdef\u{e9}".as_bytes(), "not visible ASCII"),
        ] {
            let e = read(bad).unwrap_err();
            assert!(e.contains(says), "{e}");
            assert!(
                !e.contains("0123456789"),
                "the message quotes the token: {e}"
            );
        }
        let e = read_token_file(&dir.join("absent"), "X").unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
        // Only a small regular file is read, and nothing waits.
        let paths = crate::small_file::tests::Paths::new("token-paths", b"", 8193);
        for (path, why) in paths.bad() {
            let e = read_token_file(&path, "--auth-token-file").unwrap_err();
            assert!(e.contains(why), "{e}");
            assert!(
                e.starts_with(&format!("--auth-token-file={}", path.display())),
                "{e}"
            );
        }
    }
}
