//! Filesystems mounted by type, source and options (NFS, SMB, CephFS, FUSE,
//! tmpfs). Such a mount has no identity before it exists, and its source
//! string is whatever anyone chose, so it is made where only this plugin
//! mounts (a directory per volume under its private directory), its mount
//! id saved, and then moved to the staging path (`MS_MOVE` keeps the id).
//! After a crash, what is in a volume's private directory is this
//! plugin's, and a mount elsewhere is the volume's only under its saved id.

use std::collections::HashMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use mount_utils::{FuseConnection, Sensitive, is_disconnected, is_fuse, resolve_servers};

use super::{NodeVolumes, Part, Undo, View};
use crate::error::NodeError;
use crate::observe::{Identities, PathKind, bind_within};
use crate::record::{FilesystemSource, NodeVolumeRecord, PublishState, StageRecord, VolumeSource};

/// What staging a filesystem volume works from besides its record: the
/// call's view of the mounts, the capability's mount options and the
/// NodeStage secrets (`None` when restoring: the CO passes none then).
#[derive(Clone, Copy)]
pub(super) struct FilesystemStage<'a> {
    pub(super) view: &'a View<'a>,
    pub(super) options: &'a [String],
    pub(super) secrets: Option<&'a HashMap<String, String>>,
}

/// How long a restore waits for a FUSE daemon to answer whether it is
/// still there; one that takes longer is left serving.
const DISCONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The longest name a directory entry may have.
const NAME_MAX: usize = 255;

impl NodeVolumes {
    /// The directory where `volume`'s filesystem is mounted before it is
    /// moved to its staging path: one component per volume id, escaped.
    pub(super) fn private_path(&self, volume: &str) -> Result<PathBuf, NodeError> {
        let root = self.inner.private_dir.as_ref().ok_or_else(|| {
            NodeError::failed_precondition(
                "this node plugin has no private mount directory for filesystem volumes",
            )
        })?;
        let mut name = String::with_capacity(volume.len());
        for (i, b) in volume.bytes().enumerate() {
            match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => name.push(b as char),
                b'.' if i > 0 => name.push('.'),
                _ => name.push_str(&format!("%{b:02x}")),
            }
        }
        if name.is_empty() || name.len() > NAME_MAX {
            return Err(NodeError::invalid(
                "volume_id",
                "too long to name a mount directory",
            ));
        }
        Ok(root.join(name))
    }

    /// What identifies `volume`'s filesystem mounts: everything in its
    /// private directory, and the mount with the saved id at its staging
    /// path (with the binds of it, for its publications).
    pub(super) fn filesystem_identities(
        &self,
        volume: &str,
        stage: Option<&StageRecord>,
        fs: &FilesystemSource,
        view: &View<'_>,
        out: &mut Identities,
    ) -> Result<(), NodeError> {
        let private = self.private_path(volume)?;
        let mut places = vec![private.clone()];
        let saved = stage.and_then(|s| s.mount_id);
        places.extend(stage.map(|s| s.path.clone()));
        for place in places {
            for m in view.at(&place)? {
                let made_here = place == private;
                let saved_one = saved == Some(m.mount_id) && m.fs_type == fs.fs_type;
                if made_here || saved_one {
                    out.mount_ids.push(m.mount_id);
                    out.ids.extend(bind_within(&m, &m.mount_point));
                }
            }
        }
        Ok(())
    }

    /// Stages a filesystem volume not mounted yet: mounts it in its
    /// private directory (or takes the mount a crash left there), saves the
    /// mount's id, moves it to the staging path. Secret options come from
    /// `how.secrets` and reach only the mount call.
    pub(super) fn stage_filesystem(
        &self,
        rec: &mut NodeVolumeRecord,
        fs: &FilesystemSource,
        how: &FilesystemStage<'_>,
        undo: &mut Undo,
    ) -> Result<(), NodeError> {
        let Some(s) = rec.stage.clone() else {
            return Ok(());
        };
        let view = how.view;
        let private = self.private_path(&rec.volume_id)?;
        let mut left = view.at(&private)?;
        if is_fuse(&fs.fs_type) && !left.is_empty() {
            // A FUSE mount a crash left: no daemon can be handed its
            // connection again, so it is made anew.
            let cleared = self.inner.mounter.unmount_all(&private);
            cleared.map_err(|e| NodeError::mount("clearing", &private, &e))?;
            left.clear();
        }
        let id = match left.last() {
            // A crash after the mount and before its id was saved.
            Some(m) => m.mount_id,
            None => self.mount_private(&rec.volume_id, fs, how, &private, &s.path)?,
        };
        if let Some(st) = rec.stage.as_mut() {
            st.mount_id = Some(id);
        }
        if let Err(e) = self.save(rec, Part::Stage) {
            self.clear_private(&rec.volume_id);
            return Err(e);
        }
        if PathKind::of(&s.path) == PathKind::Absent {
            std::fs::create_dir(&s.path).map_err(|e| NodeError::io("creating", &s.path, &e))?;
            undo.created = Some(s.path.clone());
        }
        if let Err(e) = self.inner.mounter.move_mount(&private, &s.path) {
            self.clear_private(&rec.volume_id);
            return Err(NodeError::mount("moving the mount to", &s.path, &e));
        }
        undo.mounted = true;
        self.clear_private(&rec.volume_id);
        self.verify(&rec.volume_id, rec, view, &s.path, s.readonly)
    }

    /// Mounts `fs` in `volume`'s private directory `private` and returns
    /// the new mount's id. Servers named by host are looked up first; a
    /// FUSE filesystem is mounted through a new connection that the driver
    /// then serves ([`VolumeLocator::serve_fuse`](crate::VolumeLocator::serve_fuse)).
    fn mount_private(
        &self,
        volume: &str,
        fs: &FilesystemSource,
        how: &FilesystemStage<'_>,
        private: &Path,
        staging: &Path,
    ) -> Result<u32, NodeError> {
        let sensitive = secret_options(fs, how.secrets)?;
        let mut opts: Vec<&str> = how.options.iter().map(String::as_str).collect();
        opts.extend(fs.options.iter().map(String::as_str));
        // Looked up before any effect; the record keeps the source as
        // given, so a restore looks the servers up again.
        let resolver = self.inner.resolver.as_ref();
        let server = resolve_servers(&fs.fs_type, &fs.source, &opts, resolver)?;
        opts.extend(server.options.iter().map(String::as_str));
        let device = &self.inner.fuse_device;
        let fuse = match is_fuse(&fs.fs_type) {
            true => Some(
                FuseConnection::open(device).map_err(|e| NodeError::io("opening", device, &e))?,
            ),
            false => None,
        };
        let fuse_options = fuse.as_ref().map(|c| c.mount_options(&opts));
        opts.extend(fuse_options.iter().flatten().map(String::as_str));
        self.make_private_dir(private)?;
        let mounter = &self.inner.mounter;
        let result =
            mounter.mount_sensitive(&server.source, private, &fs.fs_type, &opts, &sensitive);
        result.map_err(|e| NodeError::mount("mounting", staging, &e))?;
        if let Some(connection) = fuse
            && let Err(e) = self.inner.locator.serve_fuse(volume, fs, connection)
        {
            self.clear_private(volume);
            return Err(e);
        }
        let made = View::Paths(mounter.as_ref()).at(private)?;
        match made.last() {
            Some(m) => Ok(m.mount_id),
            None => Err(NodeError::failed_precondition(format!(
                "the {} mount of volume {volume} is not there after mounting",
                fs.fs_type
            ))),
        }
    }

    /// After a restart: a FUSE volume whose daemon is gone (its staging
    /// path answers `ENOTCONN`) has its mounts, the stage and the binds of
    /// it at its publications, taken down, topmost first and only while
    /// they are this volume's, so the restore mounts it anew through a
    /// connection the driver serves and binds the publications again.
    pub(super) fn clear_disconnected_fuse(
        &self,
        rec: &NodeVolumeRecord,
        s: &StageRecord,
        view: &View<'_>,
    ) -> Result<(), NodeError> {
        let VolumeSource::Filesystem(fs) = &s.source else {
            return Ok(());
        };
        if !is_fuse(&fs.fs_type) || !is_disconnected(&s.path, DISCONNECT_WAIT) {
            return Ok(());
        }
        let ids = self.identities(&rec.volume_id, Some(rec), view)?;
        let published = rec
            .publications
            .iter()
            .filter(|p| p.state == PublishState::Published);
        let paths: Vec<&Path> = published.map(|p| p.target.as_path()).collect();
        for path in paths.into_iter().chain([s.path.as_path()]) {
            self.changing(view, path);
            for m in view.at(path)?.iter().rev() {
                if !ids.owns(m) {
                    break;
                }
                let mounter = &self.inner.mounter;
                let gone = mounter.unmount(path, false);
                gone.map_err(|e| NodeError::mount("unmounting the disconnected", path, &e))?;
            }
        }
        tracing::warn!(volume = %rec.volume_id, "its FUSE daemon is gone: mounting it anew");
        Ok(())
    }

    /// Creates `private` (mode 0700) under the private root, which is made
    /// a private mount of itself first: `MS_MOVE` refuses a mount whose
    /// parent mount is shared, as `/` is on most hosts.
    fn make_private_dir(&self, private: &Path) -> Result<(), NodeError> {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true).mode(0o700);
        builder
            .create(private)
            .map_err(|e| NodeError::io("creating", private, &e))?;
        let Some(root) = self.inner.private_dir.as_deref() else {
            return Ok(());
        };
        let mounter = &self.inner.mounter;
        let mounted = mounter.is_mount_point(root);
        if !mounted.map_err(|e| NodeError::mount("inspecting", root, &e))? {
            let source = root.to_string_lossy();
            let made = mounter.mount(&source, root, "", &["bind", "private"]);
            made.map_err(|e| NodeError::mount("making a private mount of", root, &e))?;
        }
        Ok(())
    }

    /// Unmounts whatever is in `volume`'s private directory (only this
    /// plugin mounts there) and removes it; logs what it cannot do, for a
    /// later call to finish.
    pub(super) fn clear_private(&self, volume: &str) {
        let Ok(private) = self.private_path(volume) else {
            return;
        };
        let mounter = &self.inner.mounter;
        let result = mounter
            .unmount_all(&private)
            .and_then(|_| mounter.cleanup_mount_point(&private));
        if let Err(e) = result {
            let e = NodeError::mount("cleaning up", &private, &e);
            tracing::warn!(volume, error = %e, "private mount directory left for a later call");
        }
    }
}

/// The secret options of `fs`, from the NodeStage secrets; a missing one is
/// INVALID_ARGUMENT naming its key, never a value.
fn secret_options(
    fs: &FilesystemSource,
    secrets: Option<&HashMap<String, String>>,
) -> Result<Vec<Sensitive>, NodeError> {
    fs.secret_options
        .iter()
        .map(|name| match secrets.and_then(|s| s.get(name)) {
            Some(value) => Ok(Sensitive::new(format!("{name}={value}"))),
            None if secrets.is_none() => Err(NodeError::failed_precondition(format!(
                "mounting it needs the NodeStage secret {name}; the next NodeStage mounts it"
            ))),
            None => Err(NodeError::invalid(
                format!("secrets[{name}]"),
                "required to mount this volume",
            )),
        })
        .collect()
}
