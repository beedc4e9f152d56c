//! Feeds arbitrary bytes to the mountinfo parser and the option splitter:
//! they must never panic, and a parsed entry must survive a second parse of
//! the same line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mount_utils::{MountInfo, MountOptions, decode_octal_escapes, parse_mountinfo};

fuzz_target!(|data: &[u8]| {
    if let Ok(mounts) = parse_mountinfo(data) {
        for m in &mounts {
            let _ = (m.root_is_deleted(), m.mount_point_is_deleted(), m.shared_peer_group());
        }
        let lines = data.split(|&b| b == b'\n').filter(|l| !l.is_empty());
        for (line, m) in lines.zip(&mounts) {
            assert_eq!(MountInfo::parse_line(line).as_ref(), Ok(m));
        }
    }
    let _ = decode_octal_escapes(data);
    let _ = MountOptions::parse(&[String::from_utf8_lossy(data)]);
});
