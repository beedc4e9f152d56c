//! [`VolumeNotes`]: what the service needs to know of a volume that a
//! provider does not keep, written into a free-text field the provider
//! stores with the volume.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::access::{Access, ContentSource};
use crate::records::VolumeRecord;

/// What [`ControllerService`](crate::ControllerService) compares a repeated
/// CreateVolume against and answers with, beyond a provider's own fields
/// (id, name, size, the snapshot a volume was made from): the access type,
/// the CreateVolume parameters (the volume context) and the volume it was
/// cloned from. A backend whose provider is the source of truth keeps no
/// records, so it stores these with the volume in a field the provider
/// keeps as given (a description, a label, a tag): [`to_text`](Self::to_text)
/// when creating, [`from_text`](Self::from_text) and
/// [`record`](Self::record) when reading the volume back.
///
/// ```
/// use csi_controller::{Access, ContentSource, VolumeNotes, VolumeRecord};
///
/// # let mut asked = VolumeNotes { block: true, ..Default::default() }.record("".into(), "pvc-1".into(), 1 << 30, None);
/// # asked.source = Some(ContentSource::Volume("vol-0".into()));
/// // CreateVolume: the provider keeps the description it is given.
/// let description = VolumeNotes::of(&asked).to_text();
/// // Reading the volume back (it got its id from the provider).
/// let read = VolumeNotes::from_text(&description).record("vol-9".into(), "pvc-1".into(), 1 << 30, None);
/// assert_eq!((read.access, read.source), (Access::Block, Some(ContentSource::Volume("vol-0".into()))));
/// // A volume something else made reads as a mount volume with no parameters.
/// assert_eq!(VolumeNotes::from_text("made by hand"), VolumeNotes::default());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct VolumeNotes {
    /// Made for raw block access (otherwise mount access).
    pub block: bool,
    /// The CreateVolume parameters.
    pub parameters: BTreeMap<String, String>,
    /// The volume it was cloned from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clone_of: Option<String>,
}

impl VolumeNotes {
    /// The notes of `volume` (CreateVolume's record, before the provider
    /// makes it).
    pub fn of(volume: &VolumeRecord) -> Self {
        let clone_of = match &volume.source {
            Some(ContentSource::Volume(id)) => Some(id.clone()),
            _ => None,
        };
        VolumeNotes {
            block: volume.access == Access::Block,
            parameters: volume.parameters.clone(),
            clone_of,
        }
    }

    /// As the provider keeps them: one line of JSON.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).expect("notes are strings and a bool")
    }

    /// From the provider's field. Text that is not notes (a volume made by
    /// something else) reads as a mount volume with no parameters.
    pub fn from_text(text: &str) -> Self {
        serde_json::from_str(text).unwrap_or_default()
    }

    /// The record of the provider's volume `id`, named `name`, of
    /// `capacity_bytes`, made from `snapshot` if any, with these notes.
    /// Its topology is the caller's to set.
    pub fn record(
        self,
        id: String,
        name: String,
        capacity_bytes: i64,
        snapshot: Option<String>,
    ) -> VolumeRecord {
        let source =
            (snapshot.map(ContentSource::Snapshot)).or(self.clone_of.map(ContentSource::Volume));
        VolumeRecord {
            id,
            name,
            capacity_bytes,
            access: if self.block {
                Access::Block
            } else {
                Access::Mount
            },
            source,
            parameters: self.parameters,
            mutable_parameters: BTreeMap::new(),
            topology: BTreeMap::new(),
            request: Vec::new(),
            ephemeral: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Providers hold notes written by earlier versions: the text must not
    /// change.
    #[test]
    fn the_text_is_stable_and_round_trips() {
        let notes = VolumeNotes {
            block: true,
            parameters: BTreeMap::from([("tags".into(), "a,b".into())]),
            clone_of: None,
        };
        assert_eq!(
            notes.to_text(),
            r#"{"block":true,"parameters":{"tags":"a,b"}}"#
        );
        assert_eq!(VolumeNotes::from_text(&notes.to_text()), notes);
        let clone = VolumeNotes {
            clone_of: Some("v0".into()),
            ..notes
        };
        let text = clone.to_text();
        assert_eq!(
            text,
            r#"{"block":true,"parameters":{"tags":"a,b"},"clone_of":"v0"}"#
        );
        assert_eq!(VolumeNotes::from_text(&text), clone);
    }

    #[test]
    fn notes_make_the_record_csi_controller_compares_repeats_against() {
        let mut asked = VolumeNotes::default().record("".into(), "pvc".into(), 1, None);
        asked.parameters.insert("tags".into(), "x".into());
        asked.source = Some(ContentSource::Snapshot("s1".into()));
        let notes = VolumeNotes::of(&asked);
        assert_eq!(
            notes.clone_of, None,
            "a snapshot is the provider's own field"
        );
        let read = notes.record("v1".into(), "pvc".into(), 1, Some("s1".into()));
        assert_eq!(read.source, asked.source);
        assert_eq!(
            (read.access, &read.parameters),
            (Access::Mount, &asked.parameters)
        );
        for foreign in ["", "a description", "[1]", "{\"block\": 3}"] {
            assert_eq!(
                VolumeNotes::from_text(foreign),
                VolumeNotes::default(),
                "{foreign:?}"
            );
        }
    }
}
