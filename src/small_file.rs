//! The small files a configuration names (key files, token files, TLS
//! certificates and keys, a topology matrix), read without blocking and
//! within a bound.
//!
//! A path may name anything: `/dev/zero` (endless), a FIFO with no writer
//! (a plain open waits for one forever), a directory, a file of gigabytes.
//! The file is opened with `O_NONBLOCK` (a FIFO opens at once), must be a
//! regular file no larger than the bound by `fstat` of what was opened,
//! and is read up to the bound, so a wrong path fails at once with a
//! message that says why.

use std::fs::{File, FileType, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// A file read by [`read`].
pub(crate) struct SmallFile {
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Its permission bits (`st_mode & 0o7777`).
    pub mode: u32,
}

/// Reads the regular file at `path`, of at most `max` bytes. The error
/// says why it cannot be used ("it is a FIFO, not a regular file", "it
/// holds 65536 bytes; at most 4096 are accepted", the OS error of the
/// open); callers put the variable and the path before it.
pub(crate) fn read(path: &Path, max: u64) -> Result<SmallFile, String> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot open it: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat it: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "it is {}, not a regular file",
            kind(meta.file_type())
        ));
    }
    let too_big = |n: u64| format!("it holds {n} bytes; at most {max} are accepted");
    if meta.len() > max {
        return Err(too_big(meta.len()));
    }
    let bytes = read_up_to(file, max).map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > max {
        // It grew while it was read.
        return Err(too_big(bytes.len() as u64));
    }
    Ok(SmallFile {
        bytes,
        mode: meta.permissions().mode() & 0o7777,
    })
}

/// The first `max + 1` bytes of `file` at most.
fn read_up_to(file: File, max: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// What a file that is not a regular file is, for messages.
fn kind(t: FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a plain file"
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    /// A directory of its own in the temporary directory, removed on drop,
    /// holding the paths every reader must refuse or accept.
    pub(crate) struct Paths(PathBuf);

    impl Paths {
        /// `dir/good` holds `good`, `dir/big` is `big` bytes, `dir/fifo` is
        /// a FIFO no one writes, `dir/sub` a directory.
        pub(crate) fn new(tag: &str, good: &[u8], big: usize) -> Paths {
            let dir = std::env::temp_dir().join(format!("te-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("sub")).expect("temporary directory");
            std::fs::write(dir.join("good"), good).expect("good file");
            std::fs::write(dir.join("big"), vec![b'a'; big]).expect("big file");
            let fifo =
                std::ffi::CString::new(dir.join("fifo").to_str().expect("utf-8")).expect("no NUL");
            // SAFETY: mkfifo reads a NUL-terminated path we own.
            assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
            Paths(dir)
        }

        pub(crate) fn get(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }

        /// Each bad path with the words its error must hold.
        pub(crate) fn bad(&self) -> Vec<(PathBuf, &'static str)> {
            vec![
                (
                    PathBuf::from("/dev/zero"),
                    "a character device, not a regular file",
                ),
                (self.get("fifo"), "a FIFO, not a regular file"),
                (self.get("sub"), "a directory, not a regular file"),
                (self.get("big"), "bytes; at most"),
                (self.get("missing"), "cannot open it: No such file"),
            ]
        }
    }

    impl Drop for Paths {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn only_small_regular_files_are_read_and_the_rest_fail_at_once() {
        let paths = Paths::new("small-file", b"0123456789", 4097);
        let start = Instant::now();
        for (path, why) in paths.bad() {
            let e = read(&path, 4096)
                .err()
                .unwrap_or_else(|| panic!("{path:?} read"));
            assert!(e.contains(why), "{}: {e}", path.display());
        }
        // No open or read waited (the FIFO has no writer).
        assert!(start.elapsed() < Duration::from_secs(2));
        let good = read(&paths.get("good"), 4096).expect("good file");
        assert_eq!(good.bytes, b"0123456789");
        assert_eq!(
            read(&paths.get("big"), 4097)
                .expect("at the bound")
                .bytes
                .len(),
            4097
        );
        std::fs::set_permissions(paths.get("good"), std::fs::Permissions::from_mode(0o640))
            .expect("chmod");
        assert_eq!(read(&paths.get("good"), 10).expect("good").mode, 0o640);
        assert!(
            read(&paths.get("good"), 9).is_err(),
            "one byte over the bound"
        );
    }
}
