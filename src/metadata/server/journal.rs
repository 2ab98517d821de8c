//! What keeps the metadata server's data across restarts: a snapshot, the
//! data file itself (a JSON object of key to stored body, the format of
//! every version of the server), and a log of the changes made since it,
//! `<data file>.log`, one JSON record per line (`{"k":key,"v":body}` sets a
//! key, `{"k":key}` removes it).
//!
//! A change is appended to the log and fsynced before it is applied and
//! answered. When the log outgrows the snapshot, the snapshot is written
//! again from the map (temp file, fsync, rename, fsync of the directory)
//! and the log emptied. A crash between the two loses nothing: replaying
//! changes the snapshot already holds gives the same map. At load, a last
//! record cut short (no final newline: a crash in the middle of an append
//! that was never answered) is ignored; any other bad line stops the load.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The stored values by key.
pub(super) type Map = BTreeMap<String, Arc<str>>;

/// The log is compacted into the snapshot when it is larger than this and
/// than the snapshot.
const COMPACT_MIN: u64 = 1 << 20;

/// One change, as appended.
#[derive(serde::Serialize)]
struct Change<'a> {
    k: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    v: Option<&'a str>,
}

/// One change, as read back.
#[derive(serde::Deserialize)]
struct Record {
    k: String,
    v: Option<String>,
}

/// The snapshot and the open log.
pub(super) struct Journal {
    snapshot: PathBuf,
    log_path: PathBuf,
    log: File,
    log_len: u64,
    snapshot_len: u64,
    /// The log may end in part of a record that could not be removed
    /// after a failed append: the snapshot must be written before the
    /// next change.
    dirty: bool,
}

impl Journal {
    /// Loads the snapshot at `path` and the log beside it (both may be
    /// absent), writes them into one new snapshot when the log has records,
    /// and opens the log for the next changes.
    pub(super) fn open(path: PathBuf) -> io::Result<(Journal, Map)> {
        let (mut map, snapshot_len) = load_snapshot(&path)?;
        let mut log_name = path.clone().into_os_string();
        log_name.push(".log");
        let log_path = PathBuf::from(log_name);
        let replayed = replay(&log_path, &mut map)?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", log_path.display())))?;
        // The log's name must survive a crash as well as its records.
        sync_dir(&log_path);
        let mut journal = Journal {
            snapshot: path,
            log_path,
            log,
            log_len: replayed,
            snapshot_len,
            dirty: false,
        };
        if replayed > 0 {
            journal.compact(&encode(&map)?)?;
        }
        Ok((journal, map))
    }

    /// Appends a change (`Some` sets, `None` removes `key`) and fsyncs it.
    /// On error the log is cut back to its previous end.
    pub(super) fn append(&mut self, key: &str, value: Option<&str>) -> io::Result<()> {
        let mut line =
            serde_json::to_vec(&Change { k: key, v: value }).map_err(io::Error::other)?;
        line.push(b'\n');
        let written = self
            .log
            .write_all(&line)
            .and_then(|()| self.log.sync_data());
        match written {
            Ok(()) => {
                self.log_len += line.len() as u64;
                Ok(())
            }
            Err(e) => {
                if self.log.set_len(self.log_len).is_err() {
                    self.dirty = true;
                }
                Err(io::Error::new(
                    e.kind(),
                    format!("{}: {e}", self.log_path.display()),
                ))
            }
        }
    }

    /// Whether the snapshot should be written again before the next change:
    /// the log has outgrown it, or may end in a partial record.
    pub(super) fn wants_compaction(&self) -> bool {
        self.dirty || (self.log_len > COMPACT_MIN && self.log_len > self.snapshot_len)
    }

    /// Replaces the snapshot with `snapshot` (the whole map, from
    /// [`encode`]) and empties the log.
    pub(super) fn compact(&mut self, snapshot: &[u8]) -> io::Result<()> {
        write_atomically(&self.snapshot, snapshot)?;
        self.snapshot_len = snapshot.len() as u64;
        if let Err(e) = self.log.set_len(0).and_then(|()| self.log.sync_all()) {
            // The records left are in the snapshot: replaying them is
            // harmless, but the log must be emptied before it grows on.
            self.dirty = true;
            return Err(io::Error::new(
                e.kind(),
                format!("{}: {e}", self.log_path.display()),
            ));
        }
        self.log_len = 0;
        self.dirty = false;
        Ok(())
    }
}

/// The snapshot's bytes for `map`.
pub(super) fn encode(map: &Map) -> io::Result<Vec<u8>> {
    let view: BTreeMap<&str, &str> = map.iter().map(|(k, v)| (k.as_str(), &**v)).collect();
    serde_json::to_vec(&view).map_err(io::Error::other)
}

/// The snapshot at `path` and its length; empty when there is none.
fn load_snapshot(path: &Path) -> io::Result<(Map, u64)> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Map::new(), 0)),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    let data: BTreeMap<String, String> = serde_json::from_slice(&bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: not a JSON object of strings ({e}); fix or move the file away",
                path.display()
            ),
        )
    })?;
    let map = data.into_iter().map(|(k, v)| (k, Arc::from(v))).collect();
    Ok((map, bytes.len() as u64))
}

/// Applies the records of the log at `path` to `map`; returns the log's
/// length (0 when there is none).
fn replay(path: &Path, map: &mut Map) -> io::Result<u64> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    let mut lines = bytes.split_inclusive(|b| *b == b'\n').enumerate();
    for (n, line) in &mut lines {
        let Some(record) = line.strip_suffix(b"\n") else {
            tracing::warn!(
                "{}: ignored the last record, cut short ({} bytes): a change that was never \
                 answered",
                path.display(),
                line.len()
            );
            break;
        };
        let r: Record = serde_json::from_slice(record).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: line {} is not a change record ({e}); fix or move the file away",
                    path.display(),
                    n + 1
                ),
            )
        })?;
        match r.v {
            Some(v) => map.insert(r.k, Arc::from(v)),
            None => map.remove(&r.k),
        };
    }
    Ok(bytes.len() as u64)
}

/// Writes `bytes` to `path` atomically: temp file in the same directory,
/// fsync, rename, fsync of the directory.
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let file_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "data file has no name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        // Best effort: the temp file is garbage either way.
        let _ = fs::remove_file(&tmp);
        return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display())));
    }
    sync_dir(path);
    Ok(())
}

/// Fsyncs the directory of `path`, so that a file created or renamed there
/// survives a crash. A failure only weakens crash safety, so it is
/// reported, not returned.
fn sync_dir(path: &Path) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        crate::log_limit::warn_limited!("cannot fsync the data directory {}: {e}", dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("te-journal-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn value(map: &Map, k: &str) -> Option<String> {
        map.get(k).map(|v| v.to_string())
    }

    #[test]
    fn changes_survive_a_reopen_and_the_log_is_folded_into_the_snapshot() {
        let d = dir("reopen");
        let file = d.join("data.json");
        let (mut j, map) = Journal::open(file.clone()).unwrap();
        assert!(map.is_empty());
        j.append("a", Some("{\"x\":1}")).unwrap();
        j.append("b", Some("line\nbreak \"quoted\"")).unwrap();
        j.append("b", None).unwrap();
        j.append("c", Some("3")).unwrap();
        drop(j);
        let (j, map) = Journal::open(file.clone()).unwrap();
        assert_eq!(value(&map, "a").as_deref(), Some("{\"x\":1}"));
        assert_eq!(value(&map, "b"), None);
        assert_eq!(value(&map, "c").as_deref(), Some("3"));
        // Folded: the snapshot alone holds the data, in the old format.
        assert_eq!(fs::metadata(d.join("data.json.log")).unwrap().len(), 0);
        let old: BTreeMap<String, String> =
            serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        assert_eq!(old.len(), 2);
        drop(j);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_torn_last_record_is_ignored_and_a_bad_line_stops_the_load() {
        let d = dir("torn");
        let file = d.join("data.json");
        // A data file of an earlier version, and a log whose last append
        // was cut short.
        fs::write(&file, br#"{"old":"1","gone":"2"}"#).unwrap();
        fs::write(
            d.join("data.json.log"),
            b"{\"k\":\"new\",\"v\":\"3\"}\n{\"k\":\"gone\"}\n{\"k\":\"torn\",\"v\":\"4",
        )
        .unwrap();
        let (mut j, map) = Journal::open(file.clone()).unwrap();
        assert_eq!(value(&map, "old").as_deref(), Some("1"));
        assert_eq!(value(&map, "new").as_deref(), Some("3"));
        assert_eq!(value(&map, "gone"), None);
        assert_eq!(value(&map, "torn"), None);
        // Appends after the torn record start on a clean line.
        j.append("after", Some("5")).unwrap();
        drop(j);
        let (_, map) = Journal::open(file.clone()).unwrap();
        assert_eq!(value(&map, "after").as_deref(), Some("5"));
        assert_eq!(map.len(), 3);
        fs::write(d.join("data.json.log"), b"{\"k\":\"a\"}\nnot json\n").unwrap();
        let err = Journal::open(file).err().expect("a bad line in the middle");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_log_is_compacted_once_it_outgrows_the_snapshot() {
        let d = dir("compact");
        let (mut j, mut map) = Journal::open(d.join("data.json")).unwrap();
        let big = "x".repeat(64 << 10);
        let mut compactions = 0;
        for i in 0..64 {
            let k = format!("k{}", i % 4);
            j.append(&k, Some(&big)).unwrap();
            map.insert(k, Arc::from(big.as_str()));
            if j.wants_compaction() {
                j.compact(&encode(&map).unwrap()).unwrap();
                compactions += 1;
            }
        }
        // 4 MiB of changes to 256 KiB of data: a few compactions, each
        // leaving an empty log.
        assert!(compactions >= 1, "{compactions}");
        assert!(j.log_len <= COMPACT_MIN.max(j.snapshot_len) + (65 << 10));
        fs::remove_dir_all(&d).unwrap();
    }
}
