//! Durable state for CSI drivers: the records a driver keeps (volumes,
//! snapshots, attachments, staged and published volumes) stored one
//! crash-safe file per record, in a state directory that one process at a
//! time owns.
//!
//! - [`FileStore`] writes each record with temp file and rename, and on a
//!   disk appends the change to a write-ahead journal whose `fdatasync` is
//!   shared by concurrent writers (group commit): one flush per batch of
//!   writes, and replay at open after a crash. A put or delete touches only its own record, so its cost does
//!   not grow with the number of records; a delete is a rename or unlink,
//!   which works on a full filesystem. A few spare files per table are
//!   written over instead of creating and freeing a file per write (on
//!   ext4 under churn, inode allocation was most of a write's cost); they
//!   are removed when the store closes. Opening it takes an exclusive lock on the
//!   directory ([`StoreError::Locked`] for a second instance) and removes
//!   temporary files of interrupted writes.
//! - Every file operation goes through [`FileSystem`] ([`RealFs`] unless
//!   [`FileStore::open_on`] is given another); feature `testing` adds
//!   `testing::SimFs`, which models what a crash keeps.
//! - `FakeStore` (feature `testing`) is the in-memory fake beside it, with
//!   injectable faults, for drivers' unit tests; both implement [`RecordStore`], the seam.
//! - [`Table`] gives typed records: [`Json`] (serde) or [`Prost`]
//!   (protobuf, for CSI messages). Keys are any string up to 4 KiB and are
//!   encoded into safe file names, so an id can never name another path.
//! - A record that cannot be read (garbage, truncated, another codec) is
//!   moved to `quarantine/` and reported, never fatal to a scan.
//! - [`CachedTable`] loads a table at startup and writes through, for
//!   drivers that answer reads from memory.
//!
//! The calls block; async drivers run them in `spawn_blocking`.
//!
//! ```
//! use csi_store::{FileStore, Prost, StoreError, Table};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! struct VolumeRecord {
//!     name: String,
//!     capacity_bytes: i64,
//! }
//!
//! /// A CSI message kept as protobuf (here a stand-in with one field).
//! #[derive(Clone, PartialEq, prost::Message)]
//! struct PublishRequest {
//!     #[prost(string, tag = "1")]
//!     volume_id: String,
//! }
//!
//! # fn main() -> Result<(), StoreError> {
//! # let tmp = tempfile::tempdir().unwrap();
//! # let state_dir = tmp.path().join("state");
//! let store = FileStore::open(&state_dir)?; // a second instance gets StoreError::Locked
//! let volumes: Table<VolumeRecord> = Table::new(&store, "volumes")?;
//! let published: Table<PublishRequest, Prost> = Table::new(&store, "published")?;
//!
//! let vol = VolumeRecord { name: "pvc-1".into(), capacity_bytes: 1 << 30 };
//! volumes.put("vol-1", &vol)?;
//! // Keys may be paths: they are encoded, never joined as paths.
//! let target = "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pvc-1/mount";
//! published.put(target, &PublishRequest { volume_id: "vol-1".into() })?;
//!
//! // At startup: everything, plus whatever had to be set aside.
//! let scan = volumes.scan()?;
//! assert_eq!(scan.records, vec![("vol-1".to_string(), vol)]);
//! for q in &scan.quarantined {
//!     eprintln!("record {:?} of {} set aside: {}", q.key, q.table, q.reason);
//! }
//!
//! assert!(volumes.delete("vol-1")?);
//! assert_eq!(volumes.get("vol-1")?, None);
//! # Ok(())
//! # }
//! ```
mod cached;
mod codec;
mod error;
#[cfg(feature = "testing")]
mod fake;
mod file;
mod format;
mod fs;
mod group;
mod journal;
mod key;
mod lock;
#[cfg(feature = "testing")]
mod sim_fs;
mod store;
mod table;

pub use cached::CachedTable;
pub use codec::{Codec, CodecId, Json, Prost};
pub use error::StoreError;
#[cfg(feature = "testing")]
pub use fake::FakeStore;
pub use file::{FileStore, Stats};
pub use fs::{DirEntry, FileMeta, FileSystem, FsFile, OpenMode, Opened, RealFs};
pub use key::{MAX_KEY_LEN, MAX_TABLE_LEN, check_key, check_table};
pub use lock::{DirLock, LOCK_FILE};
pub use store::{MAX_RECORD_LEN, Quarantined, RawRecord, RawScan, RecordStore};
pub use table::{Scan, Table};

/// Test support (feature `testing`): [`testing::SimFs`], a simulated
/// filesystem under [`FileStore::open_on`] that fails or crashes at any
/// effect and keeps what a real crash keeps.
#[cfg(feature = "testing")]
pub mod testing {
    pub use crate::sim_fs::{CrashKeep, FsEffect, FsHook, SimFs};
}
