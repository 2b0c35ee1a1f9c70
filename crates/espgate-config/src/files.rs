//! Reading the configuration file and the secret files it names: bounded
//! in size, into buffers wiped on drop, with their permission bits.

use std::io::Read;
use std::path::Path;
use zeroize::Zeroizing;

/// Largest configuration file read.
pub(crate) const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// Largest key file read.
pub(crate) const MAX_KEY_FILE_BYTES: u64 = 64 << 10;
/// Largest certificate file read.
pub(crate) const MAX_CERT_FILE_BYTES: u64 = 1 << 20;

/// Reads at most `max` bytes of a file into a buffer that is wiped on drop,
/// without reallocating it.
pub(crate) fn read_secret_text(path: &Path, max: u64) -> std::io::Result<Zeroizing<String>> {
    let f = std::fs::File::open(path)?;
    let len = f.metadata().map_or(0, |m| m.len()).min(max) as usize;
    let mut s = Zeroizing::new(String::with_capacity(len + 1));
    f.take(max + 1).read_to_string(&mut s)?;
    if s.len() as u64 > max {
        return Err(std::io::Error::other(format!(
            "larger than {max} bytes; is this the right file?"
        )));
    }
    Ok(s)
}

/// Reads at most `max` bytes of a file into a buffer that is wiped on drop
/// (sized from the file's length, so it is not reallocated), with the
/// permission bits of the file opened.
pub(crate) fn read_secret_bytes(
    path: &Path,
    max: u64,
) -> std::io::Result<(Zeroizing<Vec<u8>>, u32)> {
    let f = std::fs::File::open(path)?;
    let meta = f.metadata()?;
    if meta.is_dir() {
        return Err(std::io::Error::other("is a directory"));
    }
    #[cfg(unix)]
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
    #[cfg(not(unix))]
    let mode = 0;
    let len = meta.len().min(max) as usize;
    let mut buf = Zeroizing::new(Vec::with_capacity(len + 1));
    f.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(std::io::Error::other(format!(
            "larger than {max} bytes; is this the right file?"
        )));
    }
    Ok((buf, mode))
}

/// The file's mode when group or others may read it.
#[cfg(unix)]
pub(crate) fn group_other_readable(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o7777;
    (mode & 0o044 != 0).then_some(mode)
}

/// The file's mode when group or others may read it.
#[cfg(not(unix))]
pub(crate) fn group_other_readable(_: &Path) -> Option<u32> {
    None
}
