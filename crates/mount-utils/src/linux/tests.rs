use super::*;
use crate::mountinfo::MountInfo;
use crate::options::Sensitive;

#[test]
fn refs_match_device_and_root() {
    let lines = [
        "1 0 8:1 / / rw - ext4 /dev/sda1 rw",
        "2 1 8:16 / /staging rw - ext4 /dev/sdb rw",
        "3 1 8:16 / /pod/a rw - ext4 /dev/sdb rw",
        "4 1 8:16 /sub /pod/b rw - ext4 /dev/sdb rw",
        "5 1 8:16 / /pod/c ro - ext4 /dev/sdb rw",
    ];
    let mounts: Vec<MountInfo> = lines
        .iter()
        .map(|l| MountInfo::parse_line(l.as_bytes()).unwrap())
        .collect();
    assert_eq!(
        refs_in(&mounts, Path::new("/staging")),
        vec![PathBuf::from("/pod/a"), PathBuf::from("/pod/c")]
    );
    assert!(refs_in(&mounts, Path::new("/nothing")).is_empty());
}

#[test]
fn bind_source_inside_a_mount() {
    let m = MountInfo::parse_line(b"2 1 8:16 /vol /staging rw - ext4 /dev/sdb rw").unwrap();
    let dev = DeviceNumber::new(8, 16);
    assert_eq!(
        bind_source_in(&m, Path::new("/staging")),
        MountSource::Bind {
            device: dev,
            root: "/vol".into()
        }
    );
    assert_eq!(
        bind_source_in(&m, Path::new("/staging/a/b")),
        MountSource::Bind {
            device: dev,
            root: "/vol/a/b".into()
        }
    );
}

#[test]
fn remount_keeps_unmentioned_flags() {
    let cur = MountInfo::parse_line(b"2 1 0:5 / /t ro,nosuid,noexec - tmpfs t rw").unwrap();
    let f = remount_flags(&MountOptions::parse(&["bind", "exec"]), &cur);
    assert_eq!(
        f,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID
    );
    let f = remount_flags(&MountOptions::parse(&["rw"]), &cur);
    assert_eq!(
        f,
        MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC
    );
}

#[test]
fn new_api_attributes() {
    let a = newapi::attr_for(MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_SYNCHRONOUS);
    assert_eq!((a.attr_set, a.attr_clr), (0x01 | 0x02, 0));
    let a = newapi::attr_for(MsFlags::MS_NOATIME);
    assert_eq!((a.attr_set, a.attr_clr), (0x10, 0x70));
    let a = newapi::attr_for(MsFlags::empty());
    assert_eq!((a.attr_set, a.attr_clr), (0, 0));
}

#[test]
fn secret_buf_joins_plain_and_sensitive() {
    let b = SecretBuf::build(&["a=1".into()], &[Sensitive::new("k=v")]).unwrap();
    assert_eq!(b.as_cstr().unwrap().to_bytes(), b"a=1,k=v");
    assert!(SecretBuf::build(&[], &[]).unwrap().as_cstr().is_none());
    assert!(SecretBuf::build(&["a\0b".into()], &[]).is_err());
}

#[test]
fn the_filtered_table_is_the_table_filtered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mountinfo");
    let text = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n\
        2 1 8:16 / /staging rw - ext4 /dev/sdb rw\n\
        3 1 0:40 / /t rw - tmpfs t rw\n\
        4 1 8:16 /sub /pod/b rw - ext4 /dev/sdb rw\n";
    std::fs::write(&path, text).unwrap();
    let mounter = LinuxMounter::with_mountinfo_path(&path);
    let sdb = DeviceNumber::new(8, 16);
    let keep = |id: u32, dev: DeviceNumber| dev == sdb || id == 3;
    let kept = mounter.mount_points_where(&keep).unwrap();
    let mut all = mounter.mount_points().unwrap();
    all.retain(|m| keep(m.mount_id, m.device()));
    assert_eq!(kept, all);
    assert_eq!(
        kept.iter().map(|m| m.mount_id).collect::<Vec<_>>(),
        [2, 3, 4]
    );
}
