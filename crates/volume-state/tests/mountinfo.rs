//! Mount identity with real mounts (root; skipped otherwise): a journal
//! records what stage and publish mounted, read back from mountinfo; after
//! a "reboot" another filesystem at the same paths is not taken for the
//! volume (kubernetes#117513, #120853). Runs in a private mount namespace,
//! so every mount vanishes with the test thread.
#![cfg(feature = "mountinfo")]

use std::path::Path;
use std::sync::Arc;

use mount_utils::testing::in_private_mount_ns_in_tempdir;
use mount_utils::{LinuxMounter, Mounter};
use volume_state::VolumeSpec;
use volume_state::journal::{FakeJournalStore, Journal, PublishIntent};
use volume_state::mounts::{MountEvidence, MountTable, MounterTable};
use volume_state::node::{ActualNodeState, DeviceState, DiscoveredMount, PodMountState};

fn tmpfs(mounter: &LinuxMounter, at: &Path) {
    std::fs::create_dir_all(at).unwrap();
    mounter.mount("tmpfs", at, "tmpfs", &["size=1m"]).unwrap();
}

#[test]
fn a_different_filesystem_at_the_same_paths_is_not_the_volume() {
    mount_utils::require_root!("a_different_filesystem_at_the_same_paths_is_not_the_volume");
    in_private_mount_ns_in_tempdir("vs-mountinfo", |dir| {
        let staging = dir.path().join("staging");
        let target = dir.path().join("pods/a/vol");
        let mounter = LinuxMounter::new();
        let table = MounterTable::new();

        // "Stage" and "publish" as a driver would.
        tmpfs(&mounter, &staging);
        std::fs::create_dir_all(&target).unwrap();
        mounter.bind_mount(&staging, &target, false).unwrap();
        let staged = table.source_at(&staging).unwrap().unwrap();
        let published = table.source_at(&target).unwrap().unwrap();
        assert_eq!(staged.fs_type, "tmpfs");
        assert_eq!(staged, published, "a bind shows the same source");

        let store = Arc::new(FakeJournalStore::<String, String>::new());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let journal = Journal::open(store.clone()).unwrap();
        runtime
            .block_on(journal.update(&"vol".to_string(), |r| {
                r.staging_path = Some(staging.clone());
                r.staged = Some(staged.clone());
                r.pods.insert(
                    "a".to_string(),
                    PublishIntent {
                        target_path: target.clone(),
                        source: Some(published.clone()),
                    },
                );
            }))
            .unwrap();
        let spec = VolumeSpec {
            staging_path: Some(staging.clone()),
            ..VolumeSpec::default()
        };
        let scan = || {
            vec![
                DiscoveredMount::new("vol".to_string(), "a".to_string(), &target)
                    .with_staging_path(&staging)
                    .checked(&table),
            ]
        };

        // A process restart: the same mounts are found and trusted.
        let actual = ActualNodeState::<String, String>::new();
        let report =
            actual.reconstruct_with_journal(scan(), &journal.records(), |_| Some(spec.clone()));
        assert_eq!(report.verified, 1);
        let snapshot = actual.snapshot();
        let volume = snapshot.get(&"vol".to_string()).unwrap();
        assert!(matches!(volume.device, DeviceState::Mounted { .. }));
        assert_eq!(volume.pods["a"].state, PodMountState::Mounted);

        // A "reboot": the mounts are gone and another tmpfs sits at both
        // paths. It looks the same in mountinfo (the kernel reuses the
        // anonymous device number), but the boot id differs.
        mounter.unmount(&target, false).unwrap();
        mounter.unmount(&staging, false).unwrap();
        tmpfs(&mounter, &staging);
        mounter.bind_mount(&staging, &target, false).unwrap();
        let table = MounterTable::new().with_boot_id("after the reboot");
        let found = vec![
            DiscoveredMount::new("vol".to_string(), "a".to_string(), &target)
                .with_staging_path(&staging)
                .checked(&table),
        ];
        assert!(matches!(&found[0].target, MountEvidence::Mounted(s) if *s != published));
        let actual = ActualNodeState::<String, String>::new();
        let report =
            actual.reconstruct_with_journal(found, &journal.records(), |_| Some(spec.clone()));
        assert_eq!((report.verified, report.mismatched), (0, 2));
        let snapshot = actual.snapshot();
        let volume = snapshot.get(&"vol".to_string()).unwrap();
        assert_eq!(volume.device, DeviceState::Uncertain);
        assert_eq!(volume.pods["a"].state, PodMountState::Uncertain);

        // Nothing mounted at all (only directories left): not mounted.
        mounter.unmount(&target, false).unwrap();
        mounter.unmount(&staging, false).unwrap();
        assert_eq!(scan()[0].target, MountEvidence::NotMounted);
        assert_eq!(scan()[0].staging, MountEvidence::NotMounted);
    });
}
