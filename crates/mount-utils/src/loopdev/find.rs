//! Finding the devices a backing file is attached to, through sysfs.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use super::LoopError;
use super::attach::device_path;

/// Loop devices whose backing file is `file` (compared after resolving
/// symlinks), from `/sys/block/loopN/loop/backing_file`.
pub fn find_by_backing_file(file: impl AsRef<Path>) -> Result<Vec<PathBuf>, LoopError> {
    let file = file.as_ref();
    let wanted = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    let mut found = Vec::new();
    for number in loop_numbers()? {
        if backing_file_of(number)?.is_some_and(|b| b == wanted) {
            found.push(device_path(number));
        }
    }
    Ok(found)
}

/// The numbers N of every `/sys/block/loopN`, bound or not, in order.
pub(super) fn loop_numbers() -> Result<Vec<u32>, LoopError> {
    let sys = Path::new("/sys/block");
    let entries = std::fs::read_dir(sys).map_err(|e| LoopError::Sysfs {
        path: sys.to_path_buf(),
        errno: crate::error::io_errno(&e),
    })?;
    let mut numbers: Vec<u32> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            name.to_str()?.strip_prefix("loop")?.parse().ok()
        })
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

pub(super) fn backing_file_of(number: u32) -> Result<Option<PathBuf>, LoopError> {
    let p = PathBuf::from(format!("/sys/block/loop{number}/loop/backing_file"));
    match std::fs::read(&p) {
        Ok(mut bytes) => {
            while bytes.last() == Some(&b'\n') {
                bytes.pop();
            }
            Ok(Some(PathBuf::from(OsString::from_vec(bytes))))
        }
        // The loop/ directory only exists while bound; a device detached
        // while we read it (by another process) answers ENODEV.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ENODEV) =>
        {
            Ok(None)
        }
        Err(e) => Err(LoopError::Sysfs {
            path: p,
            errno: crate::error::io_errno(&e),
        }),
    }
}
