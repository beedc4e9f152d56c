//! cloud-block's `main` moves the driver's code onto huge pages
//! (`csi_server::flags::move_code_to_huge_pages`). This test binary is
//! linked as the driver is (build.rs) and moves its own code, on this
//! machine's kernel.

use csi_server::flags::{CodePages, move_code_to_huge_pages};

/// The anonymous executable mappings of this process, with their sizes and
/// huge-page bytes, from /proc/self/smaps.
fn anonymous_code() -> Vec<(u64, u64)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut found = Vec::new();
    let mut current: Option<u64> = None;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 5 && fields[0].contains('-') && fields[1].len() == 4 {
            let (start, end) = fields[0].split_once('-').unwrap();
            let size =
                u64::from_str_radix(end, 16).unwrap() - u64::from_str_radix(start, 16).unwrap();
            // No path: neither a file nor [vdso].
            current =
                (fields[1] == "r-xp" && fields[4] == "0" && fields.len() == 5).then_some(size);
        } else if let (Some(size), Some(kb)) = (current, line.strip_prefix("AnonHugePages:")) {
            let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap();
            found.push((size, kb * 1024));
        }
    }
    found
}

#[test]
fn the_code_moves_onto_huge_pages_and_runs_on() {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
    let thp = thp.unwrap_or_default();
    assert!(
        thp.contains("[always]") || thp.contains("[madvise]"),
        "transparent huge pages are off on this machine ({thp:?}): nothing to move"
    );
    assert!(anonymous_code().is_empty(), "{:?}", anonymous_code());
    let placed = move_code_to_huge_pages();
    let CodePages::Huge { bytes } = placed else {
        panic!("the code did not move: {placed:?}");
    };
    // The moved code runs: this test's own, the standard library's (the
    // sum), the allocator's.
    let squares: Vec<u64> = (1..=1000).map(|n| n * n).collect();
    assert_eq!(squares.iter().sum::<u64>(), 333_833_500);
    let moved = anonymous_code();
    assert_eq!(
        moved,
        vec![(bytes as u64, bytes as u64)],
        "all of it on huge pages"
    );
    // Once moved there is no file-backed code left to move.
    let again = move_code_to_huge_pages();
    assert!(matches!(again, CodePages::Unchanged(_)), "{again:?}");
}
