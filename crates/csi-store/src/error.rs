//! The store's errors. Record contents never appear in them: records may
//! hold volume parameters.

use std::io;
use std::path::PathBuf;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process (or another store in this one) holds the state
    /// directory's lock. A driver prints this and exits.
    #[error("state directory {} is in use by another process ({})", dir.display(), match pid {
        Some(pid) => format!("pid {pid}"),
        None => "pid unknown".to_owned(),
    })]
    Locked {
        /// The state directory.
        dir: PathBuf,
        /// The holder's pid, as it wrote it into the lock file.
        pid: Option<u32>,
    },
    /// The filesystem is full (ENOSPC or EDQUOT). Nothing was left behind;
    /// deletions still work. A driver answers RESOURCE_EXHAUSTED.
    #[error("no space left in {} to write record {table}/{key}", dir.display())]
    NoSpace {
        /// The table directory.
        dir: PathBuf,
        /// The table.
        table: String,
        /// The record's key (shortened).
        key: String,
    },
    /// A key that cannot name a record.
    #[error("invalid record key {key:?}: {reason}")]
    InvalidKey {
        /// The key (shortened).
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A table name that cannot name a table.
    #[error("invalid table name {name:?}: {reason}")]
    InvalidTable {
        /// The name (shortened).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The record could not be read back (garbage, truncated, wrong codec).
    /// It was moved to the quarantine directory when `moved_to` is set, so a
    /// second read finds no record.
    #[error("record {table}/{key} is unreadable ({reason}){}", match moved_to {
        Some(p) => format!("; moved to {}", p.display()),
        None => String::new(),
    })]
    Corrupt {
        /// The table.
        table: String,
        /// The record's key (shortened).
        key: String,
        /// What is wrong (no contents).
        reason: String,
        /// Where the record file went.
        moved_to: Option<PathBuf>,
    },
    /// The value could not be encoded by the table's codec.
    #[error("record {table}/{key} cannot be encoded: {reason}")]
    Encode {
        /// The table.
        table: String,
        /// The record's key (shortened).
        key: String,
        /// What the codec said.
        reason: String,
    },
    /// The encoded record is larger than [`crate::MAX_RECORD_LEN`].
    #[error("record {table}/{key} is {len} bytes, more than the {max} byte limit")]
    TooLarge {
        /// The table.
        table: String,
        /// The record's key (shortened).
        key: String,
        /// Its encoded length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Any other I/O failure.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done ("writing", "renaming", ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    /// Whether this is [`StoreError::NoSpace`].
    pub fn is_no_space(&self) -> bool {
        matches!(self, StoreError::NoSpace { .. })
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Whether an I/O error means the filesystem (or a quota) is full.
pub(crate) fn is_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

#[cfg(feature = "csi")]
impl From<StoreError> for csi_driver::CsiError {
    /// A full disk is RESOURCE_EXHAUSTED, a held lock UNAVAILABLE, the
    /// rest INTERNAL (keys come from ids csi-server has already validated).
    fn from(e: StoreError) -> Self {
        use csi_driver::CsiError;
        match e {
            StoreError::NoSpace { .. } | StoreError::TooLarge { .. } => {
                CsiError::ResourceExhausted(e.to_string())
            }
            StoreError::Locked { .. } => CsiError::Unavailable(e.to_string()),
            _ => CsiError::Internal(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locked_names_the_directory_and_pid() {
        let e = StoreError::Locked {
            dir: "/var/lib/drv".into(),
            pid: Some(42),
        };
        assert_eq!(
            e.to_string(),
            "state directory /var/lib/drv is in use by another process (pid 42)"
        );
        let e = StoreError::Locked {
            dir: "/x".into(),
            pid: None,
        };
        assert!(e.to_string().ends_with("(pid unknown)"), "{e}");
    }

    #[test]
    fn full_means_enospc_or_edquot() {
        assert!(is_full(&io::Error::from_raw_os_error(libc::ENOSPC)));
        assert!(is_full(&io::Error::from_raw_os_error(libc::EDQUOT)));
        assert!(!is_full(&io::Error::from_raw_os_error(libc::EIO)));
        assert!(!is_full(&io::Error::other("x")));
    }

    #[cfg(feature = "csi")]
    #[test]
    fn maps_to_the_spec_codes() {
        use csi_driver::CsiError;
        let full = StoreError::NoSpace {
            dir: "/d".into(),
            table: "volumes".into(),
            key: "vol-1".into(),
        };
        assert!(matches!(
            CsiError::from(full),
            CsiError::ResourceExhausted(m) if m.contains("volumes/vol-1")
        ));
        let locked = StoreError::Locked {
            dir: "/d".into(),
            pid: Some(1),
        };
        assert!(matches!(CsiError::from(locked), CsiError::Unavailable(_)));
        let io = StoreError::io("reading", "/d/x", io::Error::from_raw_os_error(libc::EIO));
        assert!(matches!(CsiError::from(io), CsiError::Internal(_)));
    }
}
