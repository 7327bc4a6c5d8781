//! Files replaced whole so that a crash at any instant leaves the old or the new content,
//! never a torn one: the state directory's records and the local runtime's process records.

use std::fs;
use std::io::Write as _;
use std::path::Path;

/// Replaces `path` with `bytes`: write a temporary file beside it, fsync, rename, fsync the
/// directory (the rename itself is durable only once the directory is synced).
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut temporary = tempfile::NamedTempFile::new_in(dir)?;
    temporary.write_all(bytes)?;
    temporary.as_file().sync_all()?;
    temporary.persist(path).map_err(|e| e.error)?;
    fs::File::open(dir).and_then(|d| d.sync_all())
}
