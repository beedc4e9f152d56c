//! Redaction of secret and sensitive fields in `Debug` output.
//!
//! `build.rs` reads the `csi_secret` option from the compiled descriptor and
//! generates `Debug` impls for every message that holds such a field, so a
//! request can be logged with `{:?}` without leaking credentials. The spec
//! also calls `MountVolume.mount_flags` sensitive; it is masked the same way.

use std::fmt;
use std::marker::PhantomData;

pub use crate::v1::{SECRET_FIELDS, SENSITIVE_FIELDS};

/// Stands in for a hidden map or list in `Debug` output: shows only how many
/// entries there are.
pub struct Redacted(pub usize);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("[]"),
            n => write!(f, "<{n} redacted>"),
        }
    }
}

/// Prints an `i32` enum field by its variant name, as prost's derive does.
pub struct EnumValue<E> {
    value: i32,
    _enum: PhantomData<E>,
}

impl<E> EnumValue<E> {
    /// Wraps a raw enum field value.
    pub fn new(value: i32) -> Self {
        Self {
            value,
            _enum: PhantomData,
        }
    }
}

impl<E: TryFrom<i32> + fmt::Debug> fmt::Debug for EnumValue<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match E::try_from(self.value) {
            Ok(e) => e.fmt(f),
            Err(_) => self.value.fmt(f),
        }
    }
}

/// Whether `field` of the message with full name `message` (e.g.
/// `"csi.v1.CreateVolumeRequest"`) is marked `csi_secret`.
pub fn is_secret_field(message: &str, field: &str) -> bool {
    SECRET_FIELDS
        .iter()
        .any(|(m, f)| *m == message && *f == field)
}
