//! The driver's code on transparent huge pages.
//!
//! A node plugin or controller is called once in a while, after its caches
//! and TLB entries have gone to other work. In a VM each TLB miss is a
//! two-level page walk, and a call walks hundreds of 4 KiB code pages; on
//! 2 MiB pages it walks a few. What that was worth to cloud-block, and when,
//! is in docs/benchmarks.md ("Session 21").
//! The kernel maps an executable's code from the page cache in 4 KiB pages,
//! so at start the code is copied to anonymous memory that asks for huge
//! pages and moved over the original mapping with one `mremap(2)`: the
//! bytes at every code address stay the same, so the code that moves itself
//! (and any other thread) runs on.
//!
//! The 2 MiB region around the code must hold nothing else: the binary is
//! linked with its segments 2 MiB apart (`-z max-page-size=0x200000`, as
//! cloud-block's `build.rs` does). Otherwise, with transparent huge pages
//! off, or when the kernel has no huge page free, nothing moves.
//!
//! The moved region stays resident as anonymous memory, whole, where only
//! the file's code pages in use were, so the move is the driver's choice,
//! made in its `main`.

use std::os::unix::fs::MetadataExt;

/// `madvise(2)`'s MADV_COLLAPSE (Linux 6.1), not in every libc's headers.
const MADV_COLLAPSE: libc::c_int = 25;

/// Turns the move off when set to `off`, e.g. to profile with a tool that
/// finds the executable's symbols through `/proc/PID/maps` (the moved code
/// is anonymous memory there).
pub const HUGE_CODE_ENV: &str = "CSI_KIT_HUGE_CODE";

/// Where [`move_code_to_huge_pages`] left the executable's code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodePages {
    /// On huge pages: the region moved, code and the padding around it.
    Huge {
        /// Bytes moved.
        bytes: usize,
    },
    /// Where the loader put it, and why it stayed.
    Unchanged(String),
}

/// Moves the executable's code onto transparent huge pages; call it once
/// from `main`, before the runtime starts (cloud-block's does). See the
/// module's documentation.
pub fn move_code_to_huge_pages() -> CodePages {
    match try_move() {
        Ok(bytes) => CodePages::Huge { bytes },
        Err(why) => CodePages::Unchanged(why),
    }
}

fn try_move() -> Result<usize, String> {
    if std::env::var(HUGE_CODE_ENV).as_deref() == Ok("off") {
        return Err(format!("{HUGE_CODE_ENV}=off"));
    }
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map_err(|e| format!("no transparent huge pages: {e}"))?;
    if thp.contains("[never]") {
        return Err("transparent huge pages are off".into());
    }
    let huge = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|size| size.is_power_of_two())
        .unwrap_or(2 << 20);
    let exe = std::fs::metadata("/proc/self/exe").map_err(|e| format!("/proc/self/exe: {e}"))?;
    let device = format!(
        "{:02x}:{:02x}",
        libc::major(exe.dev()),
        libc::minor(exe.dev())
    );
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| format!("maps: {e}"))?;
    let region = code_region(&maps, &device, exe.ino(), huge)?;
    // SAFETY: `region` covers the executable's only code mapping and no
    // other mapping (code_region checks both); the copy is made whole,
    // read-only and executable before mremap swaps it in atomically, so
    // every code address holds the same bytes before, during and after.
    unsafe { remap(region, huge) }?;
    Ok(region.end - region.start)
}

/// The executable's code mapping and the huge-page-aligned region around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CodeRegion {
    code_start: usize,
    code_end: usize,
    start: usize,
    end: usize,
}

/// Finds, in `/proc/self/maps` text, the one executable mapping of the file
/// `device`/`inode` and the `huge`-aligned region covering it, which must
/// hold no other mapping.
fn code_region(maps: &str, device: &str, inode: u64, huge: usize) -> Result<CodeRegion, String> {
    let range = |line: &str| -> Option<(usize, usize)> {
        let (start, end) = line.split_whitespace().next()?.split_once('-')?;
        Some((
            usize::from_str_radix(start, 16).ok()?,
            usize::from_str_radix(end, 16).ok()?,
        ))
    };
    let inode = inode.to_string();
    let mut code = maps.lines().filter(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() >= 5 && fields[1] == "r-xp" && fields[3] == device && fields[4] == inode
    });
    let (Some(line), None) = (code.next(), code.next()) else {
        return Err("the executable has no single code mapping".into());
    };
    let (code_start, code_end) = range(line).ok_or("unreadable maps line")?;
    let start = code_start & !(huge - 1);
    let end = code_end.div_ceil(huge) * huge;
    let shared = maps
        .lines()
        .filter(|other| *other != line)
        .filter_map(range)
        .any(|(s, e)| s < end && e > start);
    if shared {
        return Err(format!(
            "the {} KiB region around the code holds other mappings (link with -z max-page-size={huge:#x})",
            (end - start) / 1024
        ));
    }
    Ok(CodeRegion {
        code_start,
        code_end,
        start,
        end,
    })
}

/// Copies the code into huge pages and moves them over `region`.
///
/// # Safety
/// `region` must be a [`code_region`] of this process's current maps.
unsafe fn remap(region: CodeRegion, huge: usize) -> Result<(), String> {
    let len = region.end - region.start;
    let errno = || std::io::Error::last_os_error().to_string();
    // SAFETY: a new private anonymous mapping; nothing else refers to it.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len + huge,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(format!("mmap: {}", errno()));
    }
    let raw = raw as usize;
    let copy = raw.next_multiple_of(huge);
    let unmap = |from: usize, to: usize| {
        if to > from {
            // SAFETY: part of `raw`, which only this function uses.
            unsafe { libc::munmap(from as *mut libc::c_void, to - from) };
        }
    };
    let offset = region.code_start - region.start;
    // SAFETY (all three): inside `raw`; the code mapping is readable, and
    // the copy lies at the same offset from a huge-page boundary. Asked
    // for before the copy touches them, the pages are huge from their
    // first fault; MADV_COLLAPSE says whether they are. Huge pages, or
    // nothing: 4 KiB anonymous code is no faster than the file's and would
    // only stay resident.
    let made = unsafe {
        libc::madvise(copy as *mut libc::c_void, len, libc::MADV_HUGEPAGE) == 0 && {
            std::ptr::copy_nonoverlapping(
                region.code_start as *const u8,
                (copy + offset) as *mut u8,
                region.code_end - region.code_start,
            );
            libc::madvise(copy as *mut libc::c_void, len, MADV_COLLAPSE) == 0
        }
    };
    if !made {
        let why = errno();
        unmap(raw, raw + len + huge);
        return Err(format!("no huge pages for the code: {why}"));
    }
    // SAFETY: inside `raw`; then the copy replaces the region whole.
    let moved = unsafe {
        libc::mprotect(
            copy as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_EXEC,
        ) == 0
            && libc::mremap(
                copy as *mut libc::c_void,
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                region.start as *mut libc::c_void,
            ) as usize
                == region.start
    };
    if !moved {
        let why = errno();
        unmap(raw, raw + len + huge);
        return Err(format!("moving the code: {why}"));
    }
    // What is left of `raw` before and after the moved pages.
    unmap(raw, copy);
    unmap(copy + len, raw + len + huge);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d000000000-55d00012d000 r--p 00000000 fe:00 42 /usr/bin/driver
55d00032c000-55d0005d5000 r-xp 0012c000 fe:00 42 /usr/bin/driver
55d0007d3000-55d0007f9000 r--p 003d3000 fe:00 42 /usr/bin/driver
55d0007f9000-55d0007fe000 rw-p 003f8000 fe:00 42 /usr/bin/driver
7f0000026000-7f000017c000 r-xp 00026000 fe:00 7 /usr/lib/libc.so.6
";

    #[test]
    fn the_region_is_the_huge_pages_around_the_code_alone() {
        let region = code_region(MAPS, "fe:00", 42, 2 << 20).unwrap();
        assert_eq!(
            region,
            CodeRegion {
                code_start: 0x55d00032c000,
                code_end: 0x55d0005d5000,
                start: 0x55d000200000,
                end: 0x55d000600000,
            }
        );
    }

    #[test]
    fn code_sharing_its_region_or_not_found_stays() {
        // Linked with 4 KiB segment alignment: data right after the code.
        let packed = "\
55d000000000-55d00012d000 r--p 00000000 fe:00 42 /usr/bin/driver
55d00012d000-55d0003d5000 r-xp 0012d000 fe:00 42 /usr/bin/driver
55d0003d5000-55d0003fb000 r--p 003d5000 fe:00 42 /usr/bin/driver
";
        let e = code_region(packed, "fe:00", 42, 2 << 20).unwrap_err();
        assert!(e.contains("max-page-size"), "{e}");
        for (device, inode) in [("fe:01", 42), ("fe:00", 43)] {
            assert!(code_region(MAPS, device, inode, 2 << 20).is_err());
        }
        let twice =
            format!("{MAPS}55d000900000-55d000a00000 r-xp 00500000 fe:00 42 /usr/bin/driver\n");
        assert!(code_region(&twice, "fe:00", 42, 2 << 20).is_err());
    }
}
